"""trainer/checkpoint/layout.py: the file is Lightning's layout; Lightning's own files and ours
from 0.1 read back into it, and resume."""

from __future__ import annotations

import copy
import re

import pytest
import torch

from callbacks import Callback, EarlyStopping, ModelCheckpoint
from tests._models import Classifier, loader, quiet
from trainer import Trainer
from trainer.checkpoint import layout

LIGHTNING_KEYS = {
    "epoch", "global_step", "pytorch-lightning_version", "state_dict", "loops", "callbacks", "optimizer_states",
    "lr_schedulers", "hparams_name", "hyper_parameters",
}


class Start(Callback):
    def on_train_start(self, trainer, module):
        self.at = (trainer.current_epoch, trainer.global_step)
        self.weights = copy.deepcopy(module.state_dict())
        self.optimizer = copy.deepcopy(trainer.optimizer.state_dict())


def fit(epochs: int, ckpt_path=None, **kw) -> tuple[Trainer, Start]:
    start = Start()
    callbacks = [ModelCheckpoint(dirpath="ck", every_n_train_steps=3, save_top_k=-1), EarlyStopping("val_loss", patience=9), start]
    trainer = Trainer(**quiet(max_epochs=epochs, callbacks=callbacks, **kw))
    trainer.fit(Classifier(dropout=0.2, optimizer="adam"), loader(64, shuffle=True), loader(16), ckpt_path=ckpt_path)
    return trainer, start


def test_the_file_has_lightnings_keys_and_ours_under_one_key_of_our_own():
    fit(epochs=1)
    file = torch.load("ck/epoch=0-step=3.ckpt", weights_only=True)
    assert LIGHTNING_KEYS <= set(file) and set(file) - LIGHTNING_KEYS == {"steadytrainer"}
    assert set(file["loops"]) == {"fit_loop", "validate_loop", "test_loop", "predict_loop"}
    assert {"ModelCheckpoint", "EarlyStopping"} == {k.split("{")[0] for k in file["callbacks"]}
    assert file["steadytrainer"]["loop"] == {"epoch": 0, "batch_in_epoch": 3, "global_step": 3, "world_size": 1}


# --- Lightning's loop progress, both ways ---------------------------------------------------------
@pytest.mark.parametrize("epoch, batch, step", [(0, 0, 0), (0, 3, 3), (1, 1, 9), (2, 0, 16), (1, 8, 16)])
def test_the_loops_written_read_back_as_the_same_position(epoch, batch, step):
    loops = layout.lightning_loops(epoch, batch, step, batches=8, automatic=True)
    assert layout.loop_position(loops, epoch=-1) == (epoch, batch)
    optim = loops["fit_loop"]["epoch_loop.automatic_optimization.optim_progress"]["optimizer"]["step"]["total"]
    assert optim["completed"] == step  # Lightning's global_step
    manual = layout.lightning_loops(epoch, batch, step, batches=8, automatic=False)["fit_loop"]
    assert manual["epoch_loop.manual_optimization.optim_step_progress"]["total"]["completed"] == step


@pytest.mark.parametrize("epoch, batch, stepped", [(0, 3, 3), (1, 1, 9), (2, 0, 16)])
def test_a_manual_files_batches_that_stepped_read_back_as_the_loggers_step(epoch, batch, stepped):
    # Two optimizers: twice as many optimizer steps as batches; the loggers' step counts batches.
    loops = layout.lightning_loops(epoch, batch, 2 * stepped, batches=8, automatic=False, stepped=stepped)
    assert layout.batches_stepped(loops) == stepped
    file = layout.read({"global_step": 2 * stepped, "epoch": epoch, "loops": loops, "state_dict": {}})
    assert file["steadytrainer"]["loop"]["batches_stepped"] == stepped
    assert layout.batches_stepped(layout.lightning_loops(epoch, batch, stepped, batches=8, automatic=True)) is None


def _progress(ready, started, processed, completed):
    return {"ready": ready, "started": started, "processed": processed, "completed": completed}


def test_lightnings_own_loops_read_as_the_position_lightning_resumes_at():
    def fit_loop(epochs, batches):
        return {"fit_loop": {"epoch_progress": {"current": epochs}, "epoch_loop.batch_progress": {"current": batches}}}

    # What Lightning 2.6 writes (8 batches an epoch): a save at step 9's batch end (epoch 1, its first batch)
    assert layout.loop_position(fit_loop(_progress(2, 2, 1, 1), _progress(1, 1, 1, 0)), 1) == (1, 1)
    # ... at epoch 0's on_train_epoch_end, and after fit (trainer.save_checkpoint)
    assert layout.loop_position(fit_loop(_progress(1, 1, 1, 0), _progress(8, 8, 8, 8)), 0) == (1, 0)
    assert layout.loop_position(fit_loop(_progress(2, 2, 2, 2), _progress(8, 8, 8, 8)), 2) == (2, 0)
    assert layout.loop_position(None, 4) == (4, 0)  # Lightning before 1.6 wrote no loops


# --- a file with Lightning's keys only --------------------------------------------------------------
def test_a_file_with_only_lightnings_keys_resumes_at_its_epoch_and_step_with_its_states():
    fit(epochs=2)
    ours = torch.load("ck/epoch=1-step=6.ckpt", weights_only=True)
    lightnings = {k: v for k, v in ours.items() if k != "steadytrainer"}
    torch.save(lightnings, "lightning.ckpt")

    _, start = fit(epochs=3, ckpt_path="lightning.ckpt")
    assert start.at == (1, 6)
    assert all(torch.equal(start.weights[k], v) for k, v in ours["state_dict"].items())
    assert torch.equal(start.optimizer["state"][0]["exp_avg"], ours["optimizer_states"][0]["state"][0]["exp_avg"])
    assert Classifier.load_from_checkpoint("lightning.ckpt").net[0].out_features == 16


# --- our files from 0.1 -----------------------------------------------------------------------------
def _as_version_0_1(file: dict) -> dict:
    """The dict the 0.1 trainer wrote for the same state: "model", "hparams", "loop" at the top."""
    ours = file["steadytrainer"]
    return {
        "format": "steadytrainer/1", "version": "0.1.0", "model": file["state_dict"],
        "optimizer_states": file["optimizer_states"], "lr_schedulers": file["lr_schedulers"], "precision": {},
        "callbacks": {  # 0.1's keys: EarlyStopping's own, ModelCheckpoint's Lightning's
            (f"EarlyStopping[monitor=val_loss,mode=min]" if k.startswith("EarlyStopping") else k): v
            for k, v in file["callbacks"].items()
        },
        "loop": ours["loop"], "metrics": ours["metrics"], "rng": ours["rng"], "epoch_start": ours["epoch_start"],
        "train_metrics": ours["train_metrics"], "strategy": ours["strategy"], "hparams": file["hyper_parameters"],
        "hparams_left_out": ours["hparams_left_out"], "trainer": ours["trainer"],
    }


def test_a_file_of_the_0_1_layout_still_loads_evaluates_and_resumes_bit_exact():
    fit(epochs=2)
    new = torch.load("ck/epoch=1-step=6.ckpt", weights_only=True)
    torch.save(_as_version_0_1(new), "old.ckpt")
    torch.save(new, "new.ckpt")

    trainer, from_new = fit(epochs=3, ckpt_path="new.ckpt")
    expected = copy.deepcopy(trainer.lightning_module.state_dict())
    stopper = trainer.early_stopping_callback.state_dict()
    trainer, from_old = fit(epochs=3, ckpt_path="old.ckpt")
    assert from_old.at == from_new.at == (1, 6)
    assert all(torch.equal(v, expected[k]) for k, v in trainer.lightning_module.state_dict().items())  # bit-exact
    assert trainer.early_stopping_callback.state_dict()["wait_count"] == stopper["wait_count"]

    model = Classifier.load_from_checkpoint("old.ckpt")
    assert all(torch.equal(v, new["state_dict"][k]) for k, v in model.state_dict().items())
    tester = Trainer(**quiet(enable_checkpointing=True))
    assert tester.test(Classifier(), loader(16), ckpt_path="old.ckpt", verbose=False) and tester.ckpt_path == "old.ckpt"


def test_a_weights_only_file_of_the_0_1_layout_evaluates_and_is_refused_by_fit():
    fit(epochs=1)
    new = torch.load("ck/epoch=0-step=3.ckpt", weights_only=True)
    torch.save({"format": "steadytrainer/1", "model": new["state_dict"], "hparams": new["hyper_parameters"]}, "weights.ckpt")
    assert Classifier.load_from_checkpoint("weights.ckpt").net[0].in_features == 8
    with pytest.raises(ValueError, match="holds the model's weights only"):
        fit(epochs=2, ckpt_path="weights.ckpt")


def test_python_numbers_leaves_the_tensors_alone_and_converts_numpys():
    import numpy as np
    weight = torch.ones(2)
    file = {
        "state_dict": {"w": weight}, "optimizer_states": [{"state": {0: {"step": torch.tensor(1.0)}},
                                                           "param_groups": [{"lr": np.float32(0.5), "params": [0]}]}],
        "lr_schedulers": [{"base_lrs": [np.float64(0.1)]}], "extra": (np.int64(3), "a"),
    }
    plain = layout.python_numbers(file)
    assert plain["state_dict"]["w"] is weight
    assert type(plain["optimizer_states"][0]["param_groups"][0]["lr"]) is float
    assert plain["lr_schedulers"][0]["base_lrs"] == [0.1] and plain["extra"] == (3, "a") and type(plain["extra"][0]) is int



def test_python_numbers_converts_numpys_among_plain_values_and_copies_the_containers():
    import numpy as np
    state = {"a": [1, np.bool_(True), (2.0, np.float32(1.5), None)], "b": {"c": "s", "d": np.int64(7)}}
    plain = layout.python_numbers({"loops": state})["loops"]
    assert plain == {"a": [1, True, (2.0, 1.5, None)], "b": {"c": "s", "d": 7}}
    assert [type(v) for v in (plain["a"][1], plain["a"][2][1], plain["b"]["d"])] == [bool, float, int]
    assert plain is not state and plain["a"] is not state["a"] and plain["b"] is not state["b"]

def test_callbacks_holds_only_states_that_say_something_and_a_resume_without_one_of_them_says_which():
    stop = EarlyStopping("val_loss", patience=5)
    saver = ModelCheckpoint(dirpath="ck", save_last=True)
    Trainer(**quiet(max_epochs=1, callbacks=[saver, stop], enable_progress_bar=True)).fit(Classifier(), loader(32), loader(16))
    states = torch.load("ck/last.ckpt", weights_only=True)["callbacks"]
    assert set(states) == {saver.state_key, stop.state_key}  # the bar's and the summary's empty states are left out
    with pytest.warns(UserWarning, match=re.escape(f"Please add the following callbacks: [{stop.state_key!r}].")):
        Trainer(**quiet(max_epochs=2, callbacks=[ModelCheckpoint(dirpath="ck", save_last=True)])).fit(
            Classifier(), loader(32), loader(16), ckpt_path="ck/last.ckpt")


def test_resuming_a_checkpoint_past_max_epochs_is_lightnings_error():
    from trainer import MisconfigurationException

    Trainer(**quiet(max_epochs=3, callbacks=[ModelCheckpoint(dirpath="ck", save_last=True)])).fit(Classifier(), loader(32))
    again = Trainer(**quiet(max_epochs=1, callbacks=[ModelCheckpoint(dirpath="ck", save_last=True)]))
    with pytest.raises(MisconfigurationException, match=r"^You restored a checkpoint with current_epoch=3, but you have set Trainer\(max_epochs=1\)\."):
        again.fit(Classifier(), loader(32), ckpt_path="ck/last.ckpt")
    done = Trainer(**quiet(max_epochs=3, callbacks=[ModelCheckpoint(dirpath="ck", save_last=True)]))
    done.fit(Classifier(), loader(32), ckpt_path="ck/last.ckpt")  # at max_epochs: nothing left to train, no error
    assert done.global_step == 6
