"""ModelCheckpoint where Lightning's behaviour is the spec: what code around it sees (the
trainer.save_checkpoint calls, the attributes, the state), the version counter, and the
callbacks' order."""

from __future__ import annotations

import copy
import os
import pickle
from unittest import mock

import pytest
import torch

from callbacks import EarlyStopping, ModelCheckpoint, RichProgressBar
from tests._models import Classifier, loader, quiet
from trainer import MisconfigurationException, Trainer


def fit(callbacks: list, epochs: int = 2, **kw) -> Trainer:
    trainer = Trainer(**quiet(callbacks=callbacks, max_epochs=epochs, num_sanity_val_steps=0, **kw))
    trainer.fit(Classifier(), loader(32, 16), loader(16))
    return trainer


def names(folder: str) -> set[str]:
    return set(os.listdir(folder))


# --- saves go through trainer.save_checkpoint --------------------------------------------------
def test_each_save_is_a_call_of_trainer_save_checkpoint_with_the_path_and_weights_only():
    trainer = Trainer(**quiet(callbacks=[ModelCheckpoint(dirpath="ck", save_top_k=-1)], max_epochs=2))
    with mock.patch.object(trainer, "save_checkpoint", wraps=trainer.save_checkpoint) as save:
        trainer.fit(Classifier(), loader(32, 16))
    assert save.call_args_list == [
        mock.call(os.path.abspath("ck/epoch=0-step=2.ckpt"), False), mock.call(os.path.abspath("ck/epoch=1-step=4.ckpt"), False),
    ]
    assert names("ck") == {"epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt"}  # written, in the background, by fit's end


def test_a_replaced_save_checkpoint_is_called_and_writes_nothing_itself():
    trainer = Trainer(**quiet(callbacks=[ModelCheckpoint(dirpath="ck", save_top_k=-1, save_last=True)], max_epochs=3))
    trainer.save_checkpoint = mock.Mock()
    trainer.fit(Classifier(), loader(32, 16))
    assert trainer.save_checkpoint.call_count == 3
    assert not [n for n in names("ck") if n.endswith(".ckpt")]  # and no last.ckpt pointing at a file never written


def test_a_trainer_subclass_that_overrides_save_checkpoint_finds_the_file_written_when_super_returns():
    seen = []

    class Uploading(Trainer):
        def save_checkpoint(self, path, weights_only=False, storage_options=None):
            super().save_checkpoint(path, weights_only)
            seen.append(torch.load(path, weights_only=True)["global_step"])  # e.g. an upload of the file

    Uploading(**quiet(callbacks=[ModelCheckpoint(dirpath="ck", save_top_k=-1, save_last=True)], max_epochs=2)).fit(
        Classifier(), loader(32, 16))
    assert seen == [2, 4]
    assert os.path.samefile("ck/last.ckpt", "ck/epoch=1-step=4.ckpt")  # the rest of the save's job followed


# --- without a monitor ---------------------------------------------------------------------------
def test_without_a_monitor_a_top_k_above_one_is_lightnings_error():
    with pytest.raises(MisconfigurationException, match=r"^ModelCheckpoint\(save_top_k=3, monitor=None\) is not a valid"):
        ModelCheckpoint(save_top_k=3)
    for k in (-1, 0, 1):
        ModelCheckpoint(save_top_k=k)


def test_without_a_monitor_no_scores_are_kept_and_the_newest_file_is_the_best():
    cb = ModelCheckpoint(dirpath="ck", save_top_k=-1, save_last=True)
    fit([cb])
    assert cb.best_k_models == {} and cb.best_model_score is None and cb.kth_best_model_path == ""
    assert cb.best_model_path == os.path.abspath("ck/epoch=1-step=4.ckpt")
    assert names("ck") == {"epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt", "last.ckpt"}
    one = ModelCheckpoint(dirpath="one", filename="model")
    fit([one], epochs=3)
    assert names("one") == {"model.ckpt"} and one.best_model_path == os.path.abspath("one/model.ckpt")


# --- the version counter ---------------------------------------------------------------------------
def test_a_second_run_into_the_folder_versions_last_ckpt_and_overwrites_with_the_counter_off():
    for _ in range(2):
        fit([ModelCheckpoint(dirpath="ck", save_top_k=0, save_last=True)])
    assert names("ck") == {"last.ckpt", "last-v1.ckpt"}
    assert not any(os.path.islink(os.path.join("ck", n)) for n in names("ck"))
    for _ in range(2):
        cb = ModelCheckpoint(dirpath="off", filename="{epoch}", monitor="epoch", save_top_k=-1, save_last=True,
                             enable_version_counter=False)
        fit([cb])
        assert {os.path.basename(p) for p in cb.best_k_models} == {"epoch=0.ckpt", "epoch=1.ckpt"}
    assert names("off") == {"epoch=0.ckpt", "epoch=1.ckpt", "last.ckpt"}


def test_a_fit_that_saved_writes_no_extra_last_ckpt_at_its_end():
    cb = ModelCheckpoint(dirpath="ck", monitor="val_loss", save_last=True)
    trainer = Trainer(**quiet(callbacks=[cb], max_epochs=1, val_check_interval=3, num_sanity_val_steps=0))
    trainer.fit(Classifier(), loader(128, 16), loader(16))  # 8 batches: validation after 3 and 6, none at the end
    assert trainer.global_step == 8
    assert torch.load("ck/last.ckpt", weights_only=True)["global_step"] == 6  # Lightning's: the last save's


# --- attributes and state -------------------------------------------------------------------------
def test_the_book_keeping_attributes_can_be_set_and_are_what_state_dict_holds():
    cb = ModelCheckpoint(dirpath="ck", save_top_k=-1)
    values = {"best_model_path": "a.ckpt", "best_model_score": 2.5, "best_k_models": {"a.ckpt": 2.5},
              "kth_best_model_path": "a.ckpt", "kth_value": 2.5, "last_model_path": "last.ckpt"}
    for key, value in values.items():
        setattr(cb, key, value)
    assert {k: cb.state_dict()[k] for k in values} == values


def test_a_state_from_another_folder_brings_back_only_best_model_path_and_says_so():
    saved = ModelCheckpoint(dirpath="old", monitor="val_loss", save_top_k=2)
    fit([saved])
    state = saved.state_dict()
    moved = ModelCheckpoint(dirpath="new", monitor="val_loss", save_top_k=2)
    with pytest.warns(UserWarning, match="^The dirpath has changed from"):
        moved.load_state_dict(state)
    assert moved.best_model_path == saved.best_model_path
    assert moved.best_k_models == {} and moved.best_model_score is None and moved.last_model_path == ""
    same = ModelCheckpoint(dirpath="old", monitor="val_loss", save_top_k=2)
    same.load_state_dict(state)
    assert (same.best_k_models, same.best_model_score, same.kth_best_model_path) == (
        saved.best_k_models, saved.best_model_score, saved.kth_best_model_path)


def test_a_callback_pickles_and_copies_to_an_equal_one_also_after_a_fit():
    cb = ModelCheckpoint(dirpath="ck")
    assert vars(pickle.loads(pickle.dumps(cb))) == vars(cb)
    fit([cb])
    assert vars(copy.deepcopy(cb)) == vars(cb)


# --- the Trainer's list of callbacks -------------------------------------------------------------
def test_model_checkpoints_come_last_in_trainer_callbacks_and_need_checkpointing_on():
    saver, stop = ModelCheckpoint(monitor="val_loss"), EarlyStopping("val_loss")
    trainer = Trainer(callbacks=[saver, stop], enable_progress_bar=True, enable_model_summary=False, logger=False)
    assert [type(cb) for cb in trainer.callbacks] == [EarlyStopping, RichProgressBar, ModelCheckpoint]  # rich: in dev
    assert trainer.checkpoint_callback is saver
    with pytest.raises(MisconfigurationException, match="^Trainer was configured with `enable_checkpointing=False` but found"):
        Trainer(enable_checkpointing=False, callbacks=[saver])


def test_a_callback_hook_takes_lightnings_keyword_names():
    cb = ModelCheckpoint(dirpath="ck")
    trainer = Trainer(**quiet(callbacks=[cb]))
    cb.setup(trainer, pl_module=Classifier(), stage="fit")
    assert cb.dirpath == os.path.abspath("ck")


def test_a_remote_dirpath_is_refused_at_setup_with_lightnings_sentence_for_a_link():
    trainer = Trainer(**quiet())
    with pytest.raises(ValueError, match=r"^`ModelCheckpoint\(save_last='link'\)` is only supported for local file paths"):
        ModelCheckpoint(dirpath="memory://bucket/run", save_last="link").setup(trainer, Classifier(), "fit")
    with pytest.raises(ValueError, match=r"^ModelCheckpoint\(dirpath='s3://bucket/run'\): checkpoints are written to local folders"):
        ModelCheckpoint(dirpath="s3://bucket/run").setup(trainer, Classifier(), "fit")
    assert not os.path.exists("memory:") and not os.path.exists("s3:")
