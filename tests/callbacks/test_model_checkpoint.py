"""ModelCheckpoint: which files exist after a run, what they are called, and what they hold."""

from __future__ import annotations

import inspect
import io
import json
import math
import os
import threading
import time
import warnings

import pytest
import torch

from callbacks import Callback, ModelCheckpoint
from tests._models import Classifier, loader, quiet
from trainer import Trainer
from trainer.checkpoint import background_save
from trainer.checkpoint import files as checkpoint

# 32 samples in batches of 16: 2 optimizer steps per epoch.
STEPS_PER_EPOCH = 2


class Scored(Classifier):
    """Logs ``val_metric = scores[epoch]`` in validation, so the top-k order is known in advance."""

    def __init__(self, scores: list[float]) -> None:
        super().__init__()
        self.scores = scores

    def validation_step(self, batch, batch_idx):
        self.log("val_metric", float(self.scores[self.trainer.current_epoch]))


def fit(model, *, epochs: int, ckpt_path=None, val: bool = True, **trainer_kw) -> Trainer:
    options = quiet(enable_checkpointing=True, max_epochs=epochs)
    options.update(trainer_kw)
    trainer = Trainer(**options)
    trainer.fit(model, loader(32), loader(16) if val else None, ckpt_path=ckpt_path)
    return trainer


def files(folder: str = "checkpoints") -> list[str]:
    return sorted(os.listdir(folder))


def step_of(path: str) -> int:
    return torch.load(path, weights_only=True)["global_step"]


# --- top-k -----------------------------------------------------------------------------------
SCORES = [3.0, 1.0, 2.0, 0.5, 4.0]


@pytest.mark.parametrize(
    "mode, kept_epochs, best_epoch",
    [("min", [1, 3], 3), ("max", [0, 4], 4)],
)
def test_top_k_keeps_the_best_files_by_the_monitored_metric(mode, kept_epochs, best_epoch):
    cb = ModelCheckpoint(monitor="val_metric", mode=mode, save_top_k=2, save_last=True)
    fit(Scored(SCORES), epochs=5, callbacks=[cb])

    def name(epoch: int) -> str:
        return f"epoch={epoch}-step={(epoch + 1) * STEPS_PER_EPOCH}.ckpt"

    assert files() == sorted([name(e) for e in kept_epochs] + ["last.ckpt"])
    assert cb.best_model_path == os.path.join(os.getcwd(), "checkpoints", name(best_epoch))
    assert cb.best_model_score == SCORES[best_epoch]
    assert step_of("checkpoints/last.ckpt") == 5 * STEPS_PER_EPOCH  # always the newest, kept or not


def test_save_top_k_minus_one_keeps_every_file_and_zero_keeps_only_last(tmp_path):
    fit(Classifier(), epochs=3, callbacks=[ModelCheckpoint(dirpath="all", save_top_k=-1, save_last=True)])
    fit(Classifier(), epochs=3, callbacks=[ModelCheckpoint(dirpath="none", save_top_k=0, save_last=True)])

    assert files("all") == ["epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt", "epoch=2-step=6.ckpt", "last.ckpt"]
    assert files("none") == ["last.ckpt"]
    assert step_of("none/last.ckpt") == 6


def test_last_ckpt_is_a_hard_link_to_the_newest_file():
    fit(Classifier(), epochs=2, callbacks=[ModelCheckpoint(every_n_train_steps=1, save_top_k=1, save_last=True)])

    assert files() == ["epoch=1-step=4.ckpt", "last.ckpt"]
    assert os.path.samefile("checkpoints/last.ckpt", "checkpoints/epoch=1-step=4.ckpt")


def test_last_ckpt_is_copied_where_hard_links_are_not_supported(monkeypatch):
    def no_links(src, dst):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)  # e.g. some network and FUSE filesystems
    fit(Classifier(), epochs=2, callbacks=[ModelCheckpoint(save_last=True)])

    assert not os.path.samefile("checkpoints/last.ckpt", "checkpoints/epoch=1-step=4.ckpt")
    with open("checkpoints/last.ckpt", "rb") as a, open("checkpoints/epoch=1-step=4.ckpt", "rb") as b:
        assert a.read() == b.read()


def test_file_names_say_what_the_numbers_are():
    cb = ModelCheckpoint(monitor="val_metric", filename="{epoch}-{val_metric:.2f}", save_top_k=-1)
    fit(Scored(SCORES), epochs=2, callbacks=[cb], log_dir="logs", name="exp")

    folder = os.path.join("logs", "exp", "version_0", "checkpoints")  # dirpath defaults into the run folder
    assert files(folder) == ["epoch=0-val_metric=3.00.ckpt", "epoch=1-val_metric=1.00.ckpt"]


def test_a_resumed_run_deletes_the_files_it_no_longer_keeps_but_the_one_it_resumed_from():
    fit(Classifier(), epochs=2, callbacks=[ModelCheckpoint(save_top_k=1)])
    assert files() == ["epoch=1-step=4.ckpt"]

    fit(Classifier(), epochs=4, callbacks=[ModelCheckpoint(save_top_k=1)], ckpt_path="last")

    # The file it resumed from is kept, as Lightning keeps it; the resumed run's own are rotated.
    assert files() == ["epoch=1-step=4.ckpt", "epoch=3-step=8.ckpt"]


# --- monitor ---------------------------------------------------------------------------------
def test_a_monitor_that_is_never_logged_is_an_error_listing_the_logged_metrics():
    cb = ModelCheckpoint(monitor="val_los")
    with pytest.raises(ValueError) as err:
        fit(Classifier(), epochs=2, callbacks=[cb])

    message = str(err.value)
    assert "ModelCheckpoint(monitor='val_los') was never logged" in message
    assert "'train_loss'" in message and "'val_acc'" in message and "'val_loss'" in message


def test_step_checkpoints_whose_monitor_is_not_logged_yet_wait_for_the_next_validation():
    cb = ModelCheckpoint(monitor="val_loss", every_n_train_steps=1, save_top_k=-1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        trainer = fit(Classifier(), epochs=2, callbacks=[cb])

    # Step 1 came before any validation, and step 2 right before epoch 0's: both wait for it,
    # which saves step 2 with the value it measured. Step 4 likewise waits for epoch 1's.
    assert files() == ["epoch=0-step=2.ckpt", "epoch=1-step=3.ckpt", "epoch=1-step=4.ckpt"]
    assert cb.best_k_models[os.path.abspath(f"checkpoints/{files()[2]}")] == trainer.callback_metrics["val_loss"]


def test_a_validation_metric_is_monitored_from_the_first_validation_on():
    # Validation runs after epochs 1 and 3 only: epoch saves follow the validations.
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit(Scored(SCORES), epochs=1, callbacks=[ModelCheckpoint(dirpath="one", monitor="val_metric", save_last=True)], check_val_every_n_epoch=2)
    assert files("one") == ["last.ckpt"]  # nothing ranked without a validation; last.ckpt: where fit ended
    assert step_of("one/last.ckpt") == 2

    cb = ModelCheckpoint(dirpath="four", monitor="val_metric", save_last=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit(Scored(SCORES), epochs=4, callbacks=[cb], check_val_every_n_epoch=2)
    assert files("four") == ["epoch=3-step=8.ckpt", "last.ckpt"]
    assert cb.best_model_score == 0.5 and step_of("four/last.ckpt") == 8


def test_a_typo_in_the_monitor_is_an_error_after_the_first_validation():
    cb = ModelCheckpoint(monitor="val_metrc")
    with pytest.raises(ValueError, match=r"monitor='val_metrc'\) was never logged") as err:
        fit(Scored(SCORES), epochs=4, callbacks=[cb], check_val_every_n_epoch=2)  # raises at epoch 1's validation
    assert "'val_metric'" in str(err.value) and "'train_loss'" in str(err.value)
    assert files() == []  # no save came before it


def test_without_any_validation_the_monitor_is_due_at_the_first_epoch_end():
    # A validation loader that never runs (no schedule) must not hide a typo forever.
    with pytest.raises(ValueError, match=r"monitor='val_metric'\) was never logged"):
        fit(Scored(SCORES), epochs=2, callbacks=[ModelCheckpoint(monitor="val_metric")], check_val_every_n_epoch=None)


# --- when checkpoints are taken ----------------------------------------------------------------
def test_step_checkpoints_are_only_taken_at_optimizer_step_boundaries():
    cb = ModelCheckpoint(every_n_train_steps=1, every_n_epochs=None, save_top_k=-1)
    fit(Classifier(), epochs=1, callbacks=[cb], accumulate_grad_batches=2, val=False)  # 2 batches per step

    names = [f for f in files() if f != "last.ckpt"]
    assert names == ["epoch=0-step=1.ckpt"]  # global_step is 0 after batch 0, but nothing is complete then
    assert torch.load("checkpoints/epoch=0-step=1.ckpt", weights_only=True)["steadytrainer"]["loop"]["batch_in_epoch"] == 2


def test_a_default_model_checkpoint_is_added_unless_one_is_given():
    assert isinstance(Trainer(**quiet(enable_checkpointing=True)).checkpoint_callback, ModelCheckpoint)
    mine = ModelCheckpoint(dirpath="mine")
    trainer = Trainer(**quiet(enable_checkpointing=True, callbacks=[mine]))
    assert [cb for cb in trainer.callbacks if isinstance(cb, ModelCheckpoint)] == [mine]
    assert Trainer(**quiet(enable_checkpointing=False)).checkpoint_callback is None


def test_temp_files_of_a_killed_save_are_removed_at_the_next_fit():
    os.makedirs("checkpoints")
    with open("checkpoints/.tmp-epoch=0-step=2.ckpt-abc123", "wb") as f:
        f.write(b"half a checkpoint")

    fit(Classifier(), epochs=1, callbacks=[ModelCheckpoint()])

    assert files() == ["epoch=0-step=2.ckpt"]


def test_checkpoint_state_survives_a_resume():
    cb = ModelCheckpoint(monitor="val_metric", save_top_k=2)
    fit(Scored(SCORES), epochs=3, callbacks=[cb])
    resumed = ModelCheckpoint(monitor="val_metric", save_top_k=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit(Scored(SCORES), epochs=5, callbacks=[resumed], ckpt_path="last")

    assert resumed.best_model_score == 0.5
    assert len(resumed.best_k_models) == 2 and sorted(resumed.best_k_models.values()) == [0.5, 1.0]
    assert len(files()) == 3  # the two best files, and the one fit resumed from (kept, as Lightning keeps it)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(mode="mni"), "mode"),
        (dict(save_top_k=-2), "save_top_k"),
        (dict(every_n_train_steps=-1), "every_n_train_steps"),
        (dict(monitor=""), "monitor"),
    ],
)
def test_bad_arguments_are_refused_when_built(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        ModelCheckpoint(**kwargs)


def test_only_a_checkpoint_that_saves_by_steps_is_called_on_every_batch(tmp_path):
    from trainer.loops.hooks import Hooks

    class Counting(ModelCheckpoint):  # a subclass's own batch hook always runs
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            super().on_train_batch_end(trainer, module, outputs, batch, batch_idx)

    by_epoch, by_step = ModelCheckpoint(dirpath=tmp_path), ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2)
    later, sub = ModelCheckpoint(dirpath=tmp_path), Counting(dirpath=tmp_path)
    later.every_n_train_steps = 3  # set after construction: still honoured
    hooks = Hooks([by_epoch, by_step, later, sub])
    assert [fn.__self__ for fn in hooks.on_train_batch_end] == [by_step, later, sub]
    assert [fn.__self__ for fn in hooks.on_train_epoch_end] == [by_epoch, by_step, later, sub]


class WeightsAt(Callback):
    """Copies the weights at one step, and lets the (held) checkpoint write go two steps later."""

    def __init__(self, step: int, release: threading.Event) -> None:
        self.step, self.release, self.weights = step, release, None

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            self.weights = {k: v.clone() for k, v in module.state_dict().items()}
        if trainer.global_step == self.step + 2:
            self.release.set()


def test_a_step_checkpoint_is_written_while_training_goes_on_and_holds_the_weights_of_its_step(tmp_path, monkeypatch):
    release, started = threading.Event(), []
    real_save_atomic = checkpoint.save_atomic

    def slow_disk(obj, path):  # the write cannot finish until training has moved two steps on
        # A small checkpoint comes serialized when it was taken.
        state = torch.load(io.BytesIO(obj.data), weights_only=True) if isinstance(obj, checkpoint.Encoded) else obj
        started.append(state["global_step"])
        assert release.wait(timeout=30), "the loop waited for the write"
        real_save_atomic(obj, path)

    monkeypatch.setattr(checkpoint, "save_atomic", slow_disk)
    watcher = WeightsAt(step=3, release=release)
    ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3, every_n_epochs=None, save_top_k=-1)
    trainer = Trainer(**quiet(enable_checkpointing=True, max_steps=6, callbacks=[watcher, ckpt]))
    trainer.fit(Classifier(), loader(64, 4))
    assert started == [3, 6]
    saved = checkpoint.load(tmp_path / "epoch=0-step=3.ckpt")["state_dict"]
    assert all(torch.equal(saved[k], watcher.weights[k]) for k in saved)  # not the later steps' weights
    assert checkpoint.load(tmp_path / "epoch=0-step=6.ckpt")["global_step"] == 6  # fit waited for the last write


def test_a_snapshot_is_a_copy_that_keeps_tied_tensors_tied():
    weight = torch.randn(4, 3)
    state = {"model": {"embed": weight, "head": weight, "bias": weight[0]}, "step": 3}
    copy = background_save.snapshot(state)
    weight.add_(1.0)  # training goes on
    assert not torch.equal(copy["model"]["embed"], weight) and copy["step"] == 3
    assert copy["model"]["embed"].untyped_storage().data_ptr() == copy["model"]["head"].untyped_storage().data_ptr()
    assert torch.equal(copy["model"]["bias"], copy["model"]["embed"][0])
    assert copy["model"]["bias"].untyped_storage().data_ptr() == copy["model"]["embed"].untyped_storage().data_ptr()


def test_a_small_checkpoint_is_serialized_when_taken_and_a_large_or_unusual_one_is_copied(monkeypatch):
    weight = torch.randn(4, 3)
    before, state = weight.clone(), {"model": {"w": weight}, "loop": {"global_step": 3}}
    frozen = background_save.freeze(state)
    weight.add_(1.0)  # training goes on
    assert isinstance(frozen, checkpoint.Encoded)  # the bytes are the copy
    loaded = torch.load(io.BytesIO(frozen.data), weights_only=True)
    assert torch.equal(loaded["model"]["w"], before) and loaded["loop"] == {"global_step": 3}
    # Not plainly loadable (save_atomic loads such a file back to check it), or too large to hold as bytes too:
    for odd in ({"model": {"w": weight}, "extra": {1, 2}}, state):
        if odd is state:
            monkeypatch.setattr(background_save, "SERIALIZE_INLINE_MAX", weight.nbytes - 1)
        copy = background_save.freeze(odd)
        assert type(copy) is dict and torch.equal(copy["model"]["w"], weight)
        assert copy["model"]["w"].data_ptr() != weight.data_ptr()


class AddsLiveTensor(Callback):
    """Puts a live tensor into each checkpoint, as an EMA callback would, then changes it."""

    def __init__(self) -> None:
        self.shadow = torch.zeros(3)

    def on_save_checkpoint(self, trainer, module, checkpoint):
        checkpoint["ema"] = self.shadow

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.shadow.fill_(float(trainer.global_step))


def test_what_on_save_checkpoint_adds_is_copied_when_the_state_is_taken(tmp_path, monkeypatch):
    release = threading.Event()
    real_save_atomic = checkpoint.save_atomic

    def slow_disk(obj, path):
        assert release.wait(timeout=30)
        real_save_atomic(obj, path)

    monkeypatch.setattr(checkpoint, "save_atomic", slow_disk)
    ema = AddsLiveTensor()
    ckpt = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, every_n_epochs=None, save_top_k=-1)
    releaser = WeightsAt(step=2, release=release)
    Trainer(**quiet(enable_checkpointing=True, max_steps=4, callbacks=[ema, releaser, ckpt])).fit(Classifier(), loader(64, 4))
    # Taken at step 2, after on_train_batch_end filled it with 2.0; written after step 4's fill.
    assert torch.equal(checkpoint.load(tmp_path / "epoch=0-step=2.ckpt")["ema"], torch.full((3,), 2.0))


class LoadsTheBestAtTheEnd(Callback):
    """Listed before the ModelCheckpoint, as a user's callbacks are: it runs first at on_train_end."""

    def on_train_end(self, trainer, module):
        self.loaded = checkpoint.load(trainer.checkpoint_callback.best_model_path)["global_step"]


def test_a_callbacks_on_train_end_finds_the_last_saved_file_whole_on_a_slow_disk(monkeypatch):
    real_save_atomic = checkpoint.save_atomic

    def slow_disk(obj, path):
        time.sleep(0.3)  # the write is still going when training ends
        real_save_atomic(obj, path)

    monkeypatch.setattr(checkpoint, "save_atomic", slow_disk)
    reader = LoadsTheBestAtTheEnd()
    fit(Classifier(), epochs=2, callbacks=[reader, ModelCheckpoint(dirpath="ck", save_top_k=1)])
    assert reader.loaded == 2 * STEPS_PER_EPOCH  # Lightning's loop has written it before on_train_end


@pytest.mark.parametrize("disk", ["fast", "slow"])
def test_two_checkpoints_sharing_a_folder_get_last_and_last_v1_as_in_lightning(disk, monkeypatch):
    # Lightning writes in the loop: the first callback's last.ckpt is there when the second
    # names its own, which becomes last-v1.ckpt. Here the first may still be on the writer
    # thread (a slow disk): the name is the same. One writer thread serves both callbacks.
    writers = []
    real_link, real_save_atomic = os.link, checkpoint.save_atomic

    def link(src, dst):
        writers.append(threading.current_thread().name)
        return real_link(src, dst)

    def slow_disk(obj, path):
        time.sleep(0.2)
        real_save_atomic(obj, path)

    monkeypatch.setattr(os, "link", link)
    if disk == "slow":
        monkeypatch.setattr(checkpoint, "save_atomic", slow_disk)
    by_loss = ModelCheckpoint(dirpath="shared", monitor="val_loss", filename="loss-{epoch}", save_top_k=-1, save_last=True)
    by_step = ModelCheckpoint(dirpath="shared", filename="step-{epoch}", save_top_k=-1, save_last=True)
    fit(Classifier(), epochs=1, callbacks=[by_loss, by_step])

    assert files("shared") == ["last-v1.ckpt", "last.ckpt", "loss-epoch=0.ckpt", "step-epoch=0.ckpt"]
    for name in files("shared"):
        saved = checkpoint.load(os.path.join("shared", name))
        assert saved["global_step"] == STEPS_PER_EPOCH
    # Each file holds the state its own callback saved (by_loss saved first, before by_step ranked its file).
    keys = checkpoint.load("shared/loss-epoch=0.ckpt")["callbacks"]
    loss_file = keys["ModelCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 0, 'every_n_epochs': 1, 'train_time_interval': None}"]
    assert loss_file["best_k_models"] == {}
    assert os.path.samefile("shared/last.ckpt", "shared/loss-epoch=0.ckpt")
    assert os.path.samefile("shared/last-v1.ckpt", "shared/step-epoch=0.ckpt")
    assert (os.path.basename(by_loss.last_model_path), os.path.basename(by_step.last_model_path)) == ("last.ckpt", "last-v1.ckpt")
    assert len(writers) == 2 and len(set(writers)) == 1 and writers[0].startswith("checkpoint-writer"), writers


def test_a_second_fit_saves_its_own_checkpoints_and_best_path():
    checkpoint = ModelCheckpoint(dirpath="ck", monitor="val_loss", save_top_k=1)
    trainer = Trainer(max_epochs=1, callbacks=[checkpoint], **quiet(enable_checkpointing=True))
    trainer.fit(Classifier(), loader(), loader(32))
    first = checkpoint.best_model_path
    trainer.max_epochs = 2  # a second fit goes on from where the first ended (Lightning's)
    trainer.fit(Classifier(lr=0.01), loader(), loader(32))
    assert checkpoint.best_model_path != first and os.path.exists(checkpoint.best_model_path)
    assert torch.load(checkpoint.best_model_path, weights_only=True)["global_step"] == 16


def test_fits_in_one_process_share_one_writer_thread_and_return_with_their_files_whole():
    def writer_threads():
        return {t.ident for t in threading.enumerate() if t.name.startswith("checkpoint-writer")}

    seen = []
    for run in range(3):  # a new Trainer and ModelCheckpoint each time, as a sweep makes them
        fit(Classifier(), epochs=2, callbacks=[ModelCheckpoint(dirpath=f"run{run}", save_top_k=-1)])
        assert files(f"run{run}") == ["epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt"]
        assert checkpoint.load(f"run{run}/epoch=1-step=4.ckpt")["global_step"] == 4  # whole when fit returned
        seen.append(writer_threads())
    assert len(seen[0]) == 1 and seen[0] == seen[1] == seen[2]  # started once, not once per fit


def test_a_second_run_to_the_same_step_in_one_folder_gets_lightnings_version_counter():
    for lr in (0.1, 0.01):  # two Trainers, each from step 0: both end at step 8
        checkpoint = ModelCheckpoint(dirpath="ck", monitor="val_loss", save_top_k=1)
        Trainer(max_epochs=1, callbacks=[checkpoint], **quiet(enable_checkpointing=True)).fit(Classifier(lr=lr), loader(), loader(32))
    assert files("ck") == ["epoch=0-step=8-v1.ckpt", "epoch=0-step=8.ckpt"]  # the first run's file is kept
    assert os.path.basename(checkpoint.best_model_path) == "epoch=0-step=8-v1.ckpt"


# --- the files Lightning writes, and a stop's resume point -----------------------------------------
def test_it_writes_the_files_lightning_writes_and_no_last_ckpt_unless_asked():
    fit(Classifier(), epochs=2, callbacks=[ModelCheckpoint(dirpath="named", save_top_k=-1)])
    fit(Classifier(), epochs=2, log_dir="runs")  # the default ModelCheckpoint, in the run folder

    assert files("named") == ["epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt"]
    assert files("runs/lightning_logs/version_0/checkpoints") == ["epoch=1-step=4.ckpt"]


class StopAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        trainer.should_stop = trainer.global_step == self.step


def test_a_stop_mid_epoch_puts_its_resume_point_in_the_run_folder_and_never_in_a_named_one():
    # 2 steps an epoch; the stop comes 1 step into epoch 1. Without save_last, the named folder
    # holds the epoch files only; the state at the stop goes to the run's own checkpoints folder.
    named = ModelCheckpoint(dirpath="named", save_top_k=-1)
    stopped = fit(Classifier(), epochs=3, callbacks=[named, StopAt(3)], log_dir="runs")
    assert stopped.global_step == 3 and files("named") == ["epoch=0-step=2.ckpt"]
    assert files("runs/lightning_logs/version_0/checkpoints") == ["last.ckpt"] and named.last_model_path == ""
    assert step_of("runs/lightning_logs/version_0/checkpoints/last.ckpt") == 3

    again = ModelCheckpoint(dirpath="named", save_top_k=-1)
    resumed = fit(Classifier(), epochs=3, callbacks=[again], log_dir="runs", ckpt_path="last")
    assert resumed.ckpt_path == os.path.abspath("runs/lightning_logs/version_0/checkpoints/last.ckpt")  # the newest of both
    assert files("named") == ["epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt", "epoch=2-step=6.ckpt"]

    # With save_last, the resume point is that folder's last.ckpt, as the user asked.
    asked = ModelCheckpoint(dirpath="asked", save_top_k=-1, save_last=True)
    fit(Classifier(), epochs=3, callbacks=[asked, StopAt(3)])
    assert files("asked") == ["epoch=0-step=2.ckpt", "last.ckpt"] and step_of("asked/last.ckpt") == 3


# --- what Lightning's ModelCheckpoint exposes -------------------------------------------------------
def test_current_score_kth_value_and_to_yaml_as_in_lightning():
    cb = ModelCheckpoint(monitor="val_metric", save_top_k=2)
    fit(Scored(SCORES), epochs=5, callbacks=[cb])
    assert cb.current_score == SCORES[4] and cb.kth_value == 1.0  # the last save's value; the worse of the two kept
    state = torch.load(cb.best_model_path, weights_only=True)["callbacks"][cb.state_key]
    assert {"current_score", "kth_value"} <= set(state)
    cb.to_yaml("best.yaml")
    assert json.load(open("best.yaml")) == cb.best_k_models  # YAML too: JSON is YAML
    plain = ModelCheckpoint(dirpath="plain")
    fit(Classifier(), epochs=1, callbacks=[plain])
    assert plain.best_model_score is None and plain.current_score is None  # no monitor: no score, as in Lightning


class NaNScore(Classifier):
    def validation_step(self, batch, batch_idx):
        self.log("val_metric", float("nan"))


@pytest.mark.parametrize("mode, worst", [("min", math.inf), ("max", -math.inf)])
def test_a_nan_monitor_ranks_last_as_the_worst_value(mode, worst):
    cb = ModelCheckpoint(monitor="val_metric", mode=mode)
    fit(NaNScore(), epochs=1, callbacks=[cb])
    assert cb.best_model_score == worst and cb.current_score == worst and len(files()) == 1


def test_epoch_and_step_are_monitored_without_being_logged():
    cb = ModelCheckpoint(monitor="step", mode="max", save_top_k=2, every_n_train_steps=1)
    fit(Classifier(), epochs=2, callbacks=[cb], val=False)
    assert files() == ["epoch=1-step=3.ckpt", "epoch=1-step=4.ckpt"] and cb.best_model_score == 4


def test_a_fixed_name_is_reused_by_the_save_that_pushes_its_file_out_and_never_taken_from_a_file_kept():
    cb = ModelCheckpoint(filename="model", save_top_k=1)
    fit(Classifier(), epochs=3, callbacks=[cb])
    assert files() == ["model.ckpt"] and step_of("checkpoints/model.ckpt") == 6  # replaced in place, as in Lightning
    every = ModelCheckpoint(dirpath="all", filename="model", save_top_k=-1)
    fit(Classifier(), epochs=3, callbacks=[every])
    assert files("all") == ["model-v1.ckpt", "model-v2.ckpt", "model.ckpt"]  # all kept: none overwritten


@pytest.mark.parametrize(("given", "parsed"), [("yes", True), ("true", True), ("False", False), ("link", "link")])
def test_save_last_has_lightnings_type_so_argument_parsers_read_it(given, parsed):
    import jsonargparse  # the cli extra, which the dev extra installs
    annotation = inspect.signature(ModelCheckpoint).parameters["save_last"].annotation
    parser = jsonargparse.ArgumentParser()
    parser.add_argument("--save_last", type=annotation)
    assert parser.parse_args(["--save_last", given]).save_last == parsed
    with pytest.raises(SystemExit):  # not a bool, not "link"
        parser.parse_args(["--save_last", "sometimes"])
