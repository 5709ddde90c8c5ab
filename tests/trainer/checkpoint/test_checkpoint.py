"""Checkpoint files: what they hold, that they load with no framework code, and that unsafe,
truncated or mismatched files are refused with a clear error (and a fallback for "last")."""

from __future__ import annotations

import copy
import fractions
import glob
import os
import pickle
import re
import signal
import subprocess
import sys
import time

import pytest
import torch

import trainer as trainer_pkg
from callbacks import Callback, ModelCheckpoint
from tests._models import Classifier, loader, quiet
from tests.conftest import requires_cuda
from trainer import CheckpointError, Trainer
from trainer.checkpoint import layout
from trainer.checkpoint.files import save_atomic
from strategies.precision import Precision


class Scheduled(Classifier):
    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=0.01)
        return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)


class StartStep(Callback):
    """Records where fit started: the step, and the weights as they were at that moment."""

    def on_train_start(self, trainer, module):
        self.step, self.epoch = trainer.global_step, trainer.current_epoch
        self.weights = {k: v.clone() for k, v in module.state_dict().items()}
        self.optimizer = copy.deepcopy(trainer.optimizer.state_dict())


def fit(model=None, *, epochs=2, ckpt_path=None, callbacks=(), **kw) -> Trainer:
    options = quiet(enable_checkpointing=True, max_epochs=epochs, callbacks=list(callbacks))
    options.update(kw)
    t = Trainer(**options)
    t.fit(model if model is not None else Classifier(dropout=0.2), loader(32, shuffle=True), loader(16), ckpt_path=ckpt_path)
    return t


# --- what a checkpoint holds --------------------------------------------------------------------
def test_checkpoint_holds_the_full_training_state():
    t = fit(Scheduled(dropout=0.2, hidden=12), epochs=2, callbacks=[ModelCheckpoint(every_n_train_steps=3, save_top_k=-1)])
    t.save_checkpoint("end.ckpt")
    epoch_end = torch.load("end.ckpt", weights_only=True)  # the state fit ended with
    mid_epoch = torch.load("checkpoints/epoch=1-step=3.ckpt", weights_only=True)

    # Lightning's layout, its keys holding what Lightning's hold
    assert epoch_end["state_dict"].keys() == t.module.state_dict().keys()
    assert epoch_end["optimizer_states"][0]["state"][0]["exp_avg"].shape == (12, 8)  # Adam's moments
    assert epoch_end["lr_schedulers"][0]["last_epoch"] == 2
    assert "MixedPrecision" not in epoch_end  # no GradScaler in 32-bit
    assert (epoch_end["epoch"], epoch_end["global_step"]) == (2, 4) and (mid_epoch["epoch"], mid_epoch["global_step"]) == (1, 3)
    assert epoch_end["pytorch-lightning_version"] == "2.6.5"
    assert epoch_end["hparams_name"] == "kwargs"
    assert epoch_end["hyper_parameters"] == {"features": 8, "hidden": 12, "classes": 2, "dropout": 0.2, "lr": 0.1, "optimizer": "sgd"}
    key = "ModelCheckpoint{'monitor': None, 'mode': 'min', 'every_n_train_steps': 3, 'every_n_epochs': 0, 'train_time_interval': None}"
    assert epoch_end["callbacks"][key]["best_model_path"].endswith("epoch=1-step=3.ckpt")  # Lightning's key; no scores without a monitor
    progress = mid_epoch["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]
    assert progress["processed"] == 1 and mid_epoch["loops"]["fit_loop"]["epoch_progress"]["current"]["processed"] == 1
    # Ours, under a key of our own: an epoch-end checkpoint resumes at the next epoch; a step checkpoint inside its epoch.
    ours, mid = epoch_end["steadytrainer"], mid_epoch["steadytrainer"]
    assert ours["loop"] == {"epoch": 2, "batch_in_epoch": 0, "global_step": 4, "world_size": 1}
    assert mid["loop"] == {"epoch": 1, "batch_in_epoch": 1, "global_step": 3, "world_size": 1}
    (rng,) = ours["rng"]  # one per rank
    assert set(rng) >= {"python", "torch", "loader"} and rng["torch"].dtype == torch.uint8
    (start,) = mid["epoch_start"]  # the RNG just before this epoch's iter(loader)
    assert start["torch"].dtype == torch.uint8 and not torch.equal(start["torch"], rng["torch"])
    assert ours["epoch_start"] == [None]  # the next epoch starts from "rng": nothing else to keep
    assert ours["version"] == trainer_pkg.__version__ and ours["format"] == "steadytrainer/2"
    assert ours["trainer"]["max_epochs"] == 2 and ours["trainer"]["strategy"] == "single"
    assert "val_loss" in ours["metrics"]


def test_the_state_dict_entry_loads_into_the_bare_model_with_plain_torch():
    t = fit(Classifier(hidden=12), epochs=1)

    bare = Classifier(hidden=12)
    bare.load_state_dict(torch.load("checkpoints/epoch=0-step=2.ckpt", weights_only=True)["state_dict"])  # strict
    for k, v in t.module.state_dict().items():
        assert torch.equal(bare.state_dict()[k], v)


def test_grad_scaler_state_is_saved_and_restored():
    # 16-mixed needs CUDA, so on CPU check the key logic with a CPU GradScaler.
    saving = Precision("32", torch.device("cpu"))
    assert saving.state_dict() == {}
    saving.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=7)
    file = layout.to_file({"model": {}, "loop": {}, "precision": saving.state_dict()})
    save_atomic(file, "scaler.ckpt")
    assert torch.load("scaler.ckpt", weights_only=True)["MixedPrecision"]["scale"] == 2.0**10  # where Lightning keeps it

    loading = Precision("32", torch.device("cpu"))
    loading.scaler = torch.amp.GradScaler("cpu")
    loading.load_state_dict(layout.scaler_state(torch.load("scaler.ckpt", weights_only=True)))
    assert loading.scaler.get_scale() == 2.0**10 and loading.scaler.get_growth_interval() == 7
    Precision("32", torch.device("cpu")).load_state_dict({"scaler": saving.scaler.state_dict()})  # no scaler: ignored


# --- refusing unsafe files ------------------------------------------------------------------
class RunsCode:
    """Unpickling this runs a shell command: the kind of file weights_only must refuse."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _crafted_checkpoint(path: str, marker: str) -> None:
    """A real checkpoint with one extra entry that runs code when unpickled."""
    good = torch.load(glob.glob("checkpoints/*.ckpt")[0], weights_only=True)
    good["extra"] = RunsCode(marker)
    torch.save(good, path)
    os.utime(path, (time.time() + 10, time.time() + 10))  # the newest file in the folder


def test_a_checkpoint_carrying_code_is_refused_and_the_code_never_runs():
    fit(epochs=1)
    _crafted_checkpoint("evil.ckpt", "pwned")

    with pytest.raises(CheckpointError, match=r"Refusing to load 'evil.ckpt'.*could run code.*GLOBAL posix.system"):
        fit(epochs=2, ckpt_path="evil.ckpt")
    assert not os.path.exists("pwned")

    torch.load("evil.ckpt", weights_only=False)  # the file is real: an unsafe load does run it
    assert os.path.exists("pwned")


def test_a_raw_pickle_carrying_code_is_refused_unread():
    fit(epochs=1)
    with open("evil.ckpt", "wb") as f:
        pickle.dump({"model": RunsCode("pwned")}, f, protocol=2)

    # torch.save writes a zip archive; a bare pickle is refused before anything is unpickled.
    with pytest.raises(CheckpointError, match=r"ckpt_path='evil.ckpt' is not a checkpoint"):
        fit(epochs=2, ckpt_path="evil.ckpt")
    assert not os.path.exists("pwned")


def test_last_skips_a_refused_file_with_a_warning_and_uses_the_previous_one(trainer_log):
    fit(epochs=1)
    _crafted_checkpoint("checkpoints/epoch=9-step=99.ckpt", "pwned")

    start = StartStep()
    with pytest.warns(UserWarning, match=r"skipping .*epoch=9-step=99.ckpt: Refusing to load"):
        fit(epochs=2, ckpt_path="last", callbacks=[start])

    assert not os.path.exists("pwned")
    assert (start.epoch, start.step) == (1, 2)
    assert any(line.startswith("Resumed from") and line.endswith("epoch=0-step=2.ckpt at epoch 1, step 2.") for line in trainer_log)


# --- truncated and corrupt files ------------------------------------------------------------
def test_a_truncated_last_ckpt_falls_back_to_the_previous_checkpoint():
    fit(epochs=2, callbacks=[ModelCheckpoint(every_n_train_steps=1, save_top_k=2, monitor="step", mode="max", save_last=True)])
    last = "checkpoints/last.ckpt"
    with open(last, "rb") as f:
        data = f.read()
    os.remove(last)  # last.ckpt is a hard link: truncating it in place would truncate its twin
    with open(last, "wb") as f:
        f.write(data[: len(data) // 2])
    os.remove("checkpoints/epoch=1-step=4.ckpt")  # ... so drop the twin: "previous" is step 3
    expected = torch.load("checkpoints/epoch=1-step=3.ckpt", weights_only=True)

    start = StartStep()
    with pytest.warns(UserWarning, match=r"skipping .*last.ckpt: .*is not a checkpoint.*cut off while being written"):
        fit(epochs=3, ckpt_path="last", callbacks=[start, ModelCheckpoint(every_n_train_steps=1, save_top_k=2, monitor="step", mode="max", save_last=True)])

    assert (start.epoch, start.step) == (1, 3)
    for k, v in expected["state_dict"].items():
        assert torch.equal(start.weights[k], v)


def test_a_truncated_file_passed_explicitly_is_an_error_naming_it():
    fit(epochs=1)
    with open("checkpoints/epoch=0-step=2.ckpt", "rb") as f:
        data = f.read()
    with open("broken.ckpt", "wb") as f:
        f.write(data[:100])

    with pytest.raises(CheckpointError, match=r"ckpt_path='broken.ckpt' is not a checkpoint.*cut off"):
        fit(epochs=2, ckpt_path="broken.ckpt")


def test_last_with_no_checkpoint_starts_fresh_and_says_where_it_looked():
    start = StartStep()
    with pytest.warns(UserWarning, match=r'^.fit\(ckpt_path="last"\) is set, but there is no last checkpoint available. '
                      r"No checkpoint will be loaded. .*no checkpoint in .*checkpoints.*; starting from scratch"):
        t = fit(epochs=1, ckpt_path="last", callbacks=[start])

    assert start.step == 0 and t.ckpt_path is None


def test_last_of_a_run_that_reached_max_epochs_trains_nothing_and_says_so_in_one_line(trainer_log):
    fit(epochs=2)  # 4 steps
    start = StartStep()
    again = fit(epochs=2, ckpt_path="last", callbacks=[start])

    assert (again.current_epoch, again.global_step) == (2, 4)  # as in Lightning: nothing trains,
    assert not hasattr(start, "step")  # and on_train_start is not called
    said = [line for line in trainer_log if "stopped" in line]
    assert len(said) == 1 and "\n" not in said[0]
    assert re.fullmatch(
        r"`Trainer.fit` stopped: `max_epochs=2` reached. The checkpoint \S+epoch=1-step=4.ckpt had already trained 2 epoch\(s\), "
        r"so this fit trains nothing. To train longer, raise the limit and resume from it: "
        r"Trainer\(max_epochs=4, ...\).fit\(model, ckpt_path=...\).", said[0],
    ), said[0]
    assert fit(epochs=4, ckpt_path="last").global_step == 8  # what the line says works


# --- files that do not fit -----------------------------------------------------------------
def test_a_model_whose_keys_do_not_match_gets_the_missing_and_unexpected_keys():
    fit(epochs=1)

    class Renamed(Classifier):
        def __init__(self):
            super().__init__()
            self.head = self.net  # the same layers under a second name

    with pytest.raises(CheckpointError) as err:
        fit(Renamed(), epochs=2, ckpt_path="checkpoints/epoch=0-step=2.ckpt")
    message = str(err.value)
    assert "missing keys ['head.0.bias', 'head.0.weight', 'head.3.bias', 'head.3.weight']" in message
    assert "unexpected keys none" in message


def test_a_model_with_other_shapes_is_an_error_naming_the_sizes():
    fit(epochs=1)
    with pytest.raises(CheckpointError, match=r"size mismatch for net.0.weight"):
        fit(Classifier(hidden=32), epochs=2, ckpt_path="checkpoints/epoch=0-step=2.ckpt")


def test_a_weights_only_file_cannot_resume_fit_and_says_how_to_load_it():
    fit(epochs=1)
    fitted = torch.load("checkpoints/epoch=0-step=2.ckpt", weights_only=True)
    torch.save({k: v for k, v in fitted.items() if k in ("state_dict", "epoch", "global_step")}, "weights.ckpt")
    with pytest.raises(CheckpointError, match=r"weights only.*fit cannot resume from it.*test\(ckpt_path=...\)"):
        fit(epochs=1, ckpt_path="weights.ckpt")
    with pytest.raises(CheckpointError, match=r"no 'state_dict' entry"):  # a bare state dict is no checkpoint
        torch.save(Classifier().state_dict(), "bare.ckpt")
        fit(epochs=1, ckpt_path="bare.ckpt")


# --- writing ---------------------------------------------------------------------------------
class FailsToPickle:
    def __reduce__(self):
        raise RuntimeError("disk full, say")


def test_a_failed_save_leaves_the_previous_file_intact_and_no_temp_files():
    save_atomic({"model": {"w": torch.ones(3)}}, "model.ckpt")
    with pytest.raises(RuntimeError, match="disk full"):
        save_atomic({"model": {"w": torch.zeros(3)}, "extra": FailsToPickle()}, "model.ckpt")

    assert torch.equal(torch.load("model.ckpt", weights_only=True)["model"]["w"], torch.ones(3))
    assert os.listdir(".") == ["model.ckpt"]


def test_numpy_numbers_are_saved_as_python_numbers():
    import numpy as np

    class NumpyLR(Classifier):
        def __init__(self):
            super().__init__()
            self.save_hyperparameters({"lr": np.float64(0.1), "hidden": np.int64(16)})

        def configure_optimizers(self):  # a schedule computed with numpy, as many are
            opt = torch.optim.SGD(self.parameters(), lr=np.float64(0.1))
            return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: np.float32(0.5) ** epoch)

    class KeepsANumpyFloat(Callback):
        def state_dict(self):
            return {"best": np.float64(0.25)}

    fit(NumpyLR(), epochs=2, callbacks=[KeepsANumpyFloat()])
    ckpt = torch.load("checkpoints/epoch=1-step=4.ckpt", weights_only=True)  # weights_only: no numpy inside
    assert type(ckpt["optimizer_states"][0]["param_groups"][0]["lr"]) is float
    assert type(ckpt["callbacks"]["KeepsANumpyFloat"]["best"]) is float and ckpt["callbacks"]["KeepsANumpyFloat"]["best"] == 0.25
    hparams = ckpt["hyper_parameters"]
    assert (hparams["lr"], hparams["hidden"]) == (0.1, 16) and (type(hparams["lr"]), type(hparams["hidden"])) == (float, int)
    fit(NumpyLR(), epochs=3, ckpt_path="last", callbacks=[KeepsANumpyFloat()])  # and it resumes


def test_a_checkpoint_that_could_not_be_loaded_back_is_refused_when_saved():
    class KeepsAFraction(Callback):
        def state_dict(self):
            return {"best": fractions.Fraction(1, 4)}

    where = r"checkpoint\['callbacks'\]\['KeepsAFraction'\]\['best'\] is a fractions.Fraction"
    with pytest.raises(CheckpointError, match=where):
        fit(epochs=1, callbacks=[KeepsAFraction()])
    assert os.listdir("checkpoints") == []  # nothing that a resume would choke on later


_SAVE_FOREVER = """
import torch
from trainer.checkpoint.files import save_atomic

state = {"model": {"w": torch.randn(4_000_000)}}  # 16 MB: each save takes a while
for step in range(10**6):
    state["step"] = step
    save_atomic(state, "last.ckpt")
    print(step, flush=True)
"""


@pytest.mark.slow
def test_kill9_in_the_middle_of_a_save_leaves_the_previous_file_whole(tmp_path, script_env):
    proc = subprocess.Popen(
        [sys.executable, "-c", _SAVE_FOREVER], cwd=tmp_path, env=script_env, stdout=subprocess.PIPE, text=True
    )
    in_a_save = lambda: glob.glob(str(tmp_path / ".tmp-*"))  # noqa: E731
    try:
        for _ in range(2):
            proc.stdout.readline()  # two saves are complete
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if in_a_save():
                os.kill(proc.pid, signal.SIGSTOP)  # freeze it, then make sure it froze inside the save
                if in_a_save():
                    break
                os.kill(proc.pid, signal.SIGCONT)
            time.sleep(0.001)
    finally:
        proc.kill()  # SIGKILL, in the middle of writing the next checkpoint
        proc.wait()

    assert in_a_save(), "the kill should have landed inside a save"
    assert torch.load(tmp_path / "last.ckpt", weights_only=True)["step"] >= 1  # whole: the previous save


# --- across strategies -------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.usefixtures("ranks_from_the_fork_server")  # ranks fork from a warm server: see tests/conftest.py
def test_a_ddp_checkpoint_loads_into_the_bare_model_and_resumes_on_one_device():
    t = Trainer(**quiet(enable_checkpointing=True, strategy="ddp", devices=2, max_epochs=1))
    t.fit(Classifier(optimizer="adam"), loader(64, shuffle=True))  # 2 ranks x 2 steps of 16
    ckpt = torch.load("checkpoints/epoch=0-step=2.ckpt", weights_only=True)

    assert not any(k.startswith("module.") for k in ckpt["state_dict"])
    bare = Classifier()
    bare.load_state_dict(ckpt["state_dict"])  # strict: every key fits
    ours = ckpt["steadytrainer"]
    assert len(ours["rng"]) == 2 and not torch.equal(ours["rng"][0]["torch"], ours["rng"][1]["torch"])
    assert [s["sampler"]["seed"] for s in ours["epoch_start"]] == [0, 0]  # DistributedSampler's

    start = StartStep()
    fit(Classifier(optimizer="adam"), epochs=2, ckpt_path="checkpoints/epoch=0-step=2.ckpt", callbacks=[start])
    assert (start.epoch, start.step) == (1, 2)
    for k, v in ckpt["state_dict"].items():
        assert torch.equal(start.weights[k], v)
    assert start.optimizer["state"][0]["step"] == 2 and torch.equal(
        start.optimizer["state"][0]["exp_avg"], ckpt["optimizer_states"][0]["state"][0]["exp_avg"]
    )


@requires_cuda(1)
def test_16_mixed_saves_the_grad_scaler_and_cuda_rng_and_resume_restores_them():
    class ScalerAtStart(Callback):
        def on_train_start(self, trainer, module):
            self.state = trainer.scaler.state_dict()

    fit(epochs=1, strategy="single", precision="16-mixed")
    ckpt = torch.load("checkpoints/epoch=0-step=2.ckpt", weights_only=True)
    saved = ckpt["MixedPrecision"]  # where Lightning's precision plugin keeps it
    fresh = torch.amp.GradScaler("cuda").state_dict()
    assert saved != fresh  # it moved (growth tracker or scale), so the comparison below means something
    assert "cuda" in ckpt["steadytrainer"]["rng"][0]

    start = ScalerAtStart()
    fit(epochs=2, strategy="single", precision="16-mixed", ckpt_path="last", callbacks=[start])
    assert start.state == saved  # a fresh scaler would have _growth_tracker 0


@requires_cuda(1)
def test_a_checkpoint_saved_on_a_gpu_holds_cpu_tensors_so_a_machine_without_one_loads_it():
    trainer = Trainer(max_steps=2, devices=[0], **quiet())
    trainer.fit(Classifier(optimizer="adam"), loader())
    trainer.save_checkpoint("gpu.ckpt")
    ckpt = torch.load("gpu.ckpt", weights_only=True)  # no map_location: tensors come back where they were saved
    tensors = [*ckpt["state_dict"].values(), *(v for s in ckpt["optimizer_states"][0]["state"].values() for v in s.values())]
    assert len(tensors) > 4 and all(t.device.type == "cpu" for t in tensors)
    assert next(trainer.module.parameters()).device.type == "cuda"  # the live model stayed on the GPU


def test_last_resumes_the_highest_step_when_saves_share_a_clock_tick(tmp_path, trainer_log):
    # A file's mtime has the kernel's tick (4 ms at HZ=250): fast steps' saves can tie; the name's step decides.
    first = Trainer(max_steps=4, log_dir=tmp_path, enable_progress_bar=False,
                    callbacks=[ModelCheckpoint(every_n_train_steps=1, save_top_k=-1)])
    first.fit(Classifier(), loader(64))
    files = sorted(glob.glob(os.path.join(first.run_dir, "checkpoints", "*.ckpt")))
    assert len(files) == 4
    tick = os.stat(files[0]).st_mtime_ns
    for path in files:
        os.utime(path, ns=(tick, tick))
    again = Trainer(max_steps=6, log_dir=tmp_path, enable_progress_bar=False)
    again.fit(Classifier(), loader(64), ckpt_path="last")
    assert any("epoch=0-step=4.ckpt at epoch 0, step 4." in line for line in trainer_log), trainer_log


def test_a_checkpoint_at_an_http_url_is_downloaded_once_into_the_hub_cache_and_loads(tmp_path, monkeypatch):
    import functools
    import http.server
    import threading

    trainer = Trainer(**quiet(max_epochs=1))
    model = Classifier()
    trainer.fit(model, loader(32, 16))
    served = tmp_path / "served"
    served.mkdir()
    trainer.save_checkpoint(served / "model.ckpt")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))
    url = f"http://127.0.0.1:{server.server_address[1]}/model.ckpt"
    try:
        loaded = Classifier.load_from_checkpoint(url)
        (served / "model.ckpt").unlink()  # the second read is the cached copy's
        assert Trainer(**quiet()).validate(Classifier(), loader(16), ckpt_path=url)
    finally:
        server.shutdown()
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))
    # one entry, named after the whole URL (tests/trainer/checkpoint/test_paths.py has two URLs of one file name)
    assert [n.endswith("-model.ckpt") for n in os.listdir(tmp_path / "torch_home" / "hub" / "checkpoints")] == [True]


def test_a_missing_checkpoint_says_lightnings_sentence_first():
    with pytest.raises(FileNotFoundError, match=r"^Checkpoint file not found: nowhere.ckpt\. ckpt_path='nowhere.ckpt' does not exist"):
        Trainer(**quiet(max_epochs=1)).fit(Classifier(), loader(32), ckpt_path="nowhere.ckpt")
