"""Checkpoints both ways with the real Lightning: a file Lightning wrote opens and resumes here,
and a file written here opens and resumes in Lightning, at the same epoch and step, with the
optimizer's and the scheduler's state, the callbacks', the DataModule's and what the model's
``on_save_checkpoint`` added.

The same script (``_checkpoint_script.py``) runs on both sides, each in its own process: only
the writer's or the reader's imports differ. Lightning is a test-only extra; without it these
tests skip with the command that installs it. This project never imports it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_checkpoint_script.py")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("lightning") is None,
        reason='needs the real Lightning for the round trip: pip install -e ".[compat]"',
    ),
]

# 8 steps an epoch, 2 epochs; a file every 3 steps and at each epoch's end, then end.ckpt.
# file -> (epoch and step fit resumes at, the first batch it trains)
POSITIONS = {
    "epoch=0-step=3.ckpt": (0, 3, 3), "epoch=0-step=6.ckpt": (0, 6, 6), "epoch=1-step=9.ckpt": (1, 9, 1),
    "epoch=0-end.ckpt": (1, 8, 0), "epoch=1-end.ckpt": (2, 16, 0), "end.ckpt": (2, 16, 0),
}


def _run(side: str, *args: str, env: dict[str, str], cwd) -> None:
    done = subprocess.run([sys.executable, SCRIPT, side, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{side} {args[0]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"


def _round_trip(writer: str, reader: str, tmp_path, script_env) -> dict[str, tuple[dict, dict]]:
    folder = tmp_path / writer
    _run(writer, "write", str(folder), env=script_env, cwd=tmp_path)
    assert {n for n in os.listdir(folder) if n.endswith(".ckpt")} >= set(POSITIONS)
    out = tmp_path / "read"
    out.mkdir()
    _run(reader, "read", str(out), *(str(folder / name) for name in POSITIONS), env=script_env, cwd=tmp_path)
    return {
        name: (torch.load(folder / name, weights_only=True), json.loads((out / f"{name}.json").read_text()))
        for name in POSITIONS
    }


def _check(seen: dict[str, tuple[dict, dict]]) -> None:
    for name, (file, got) in seen.items():
        epoch, step, first_batch = POSITIONS[name]
        weights = [t.flatten().tolist() for t in file["state_dict"].values()]
        # load_from_checkpoint: the hyperparameters, the weights, the model's own hook
        assert got["hparams"] == {"lr": 0.02, "hidden": 6}, name
        assert got["weights"] == weights, name  # exactly: the file's tensors, copied
        assert got["extra"] == ["a", "b"] and got["fit_extra"] == ["a", "b"], name
        # the DataModule's load_from_checkpoint: its hyperparameters and state_dict
        assert got["data_hparams"] == {"batch_size": 8} and got["data_served"] == file["Data"]["served"] >= 100, name
        # test(ckpt_path=...) evaluates the file's weights; trainer.ckpt_path says which
        assert got["test"]["test_loss"] > 0 and got["test_ckpt_path"].endswith(name), name
        # fit(ckpt_path=...) carries on where the file stopped
        start = got["start"]
        assert (start["epoch"], start["step"], start["first_batch"]) == (epoch, step, first_batch), name
        assert got["end"] == [3, 24] and got["fit_ckpt_path"].endswith(name), name
        assert start["weights"] == weights, name
        optimizer, scheduler = file["optimizer_states"][0], file["lr_schedulers"][0]
        assert start["lr"] == pytest.approx(optimizer["param_groups"][0]["lr"]), name
        assert start["momentum"] == [s["momentum_buffer"].flatten().tolist() for s in optimizer["state"].values()], name
        assert start["scheduler_epoch"] == scheduler["last_epoch"] == epoch, name
        # the callbacks: on_load_checkpoint for every one, then load_state_dict, with their states
        assert got["calls"] == ["on_load_checkpoint", "load_state_dict"], name
        assert got["count_at_start"] == file["callbacks"]["Counter"]["count"] == step, name
        stopper = next(v for k, v in file["callbacks"].items() if k.startswith("EarlyStopping"))
        assert got["stopper_best"] <= float(stopper["best_score"]), name


def test_a_checkpoint_lightning_wrote_loads_evaluates_and_resumes_here(tmp_path, script_env):
    _check(_round_trip("lightning", "ours", tmp_path, script_env))


def test_a_checkpoint_written_here_loads_evaluates_and_resumes_in_lightning(tmp_path, script_env):
    seen = _round_trip("ours", "lightning", tmp_path, script_env)
    _check(seen)
    file = seen["epoch=1-step=9.ckpt"][0]
    assert file["pytorch-lightning_version"] == "2.6.5" and file["hparams_name"] == "kwargs"
    assert file["steadytrainer"]["loop"] == {"epoch": 1, "batch_in_epoch": 1, "global_step": 9, "world_size": 1}
