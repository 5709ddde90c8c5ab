"""Bit-exact resume whatever the optimizer keeps, under every strategy and checkpoint format.

The matrix (issue 27): SGD without momentum (no state at all); an Adam killed before its
first update; a stateful optimizer killed in the middle of an accumulation group; two param
groups with a scheduler. Strategies: single, ddp, fsdp with a full checkpoint, fsdp with a
sharded one (``FSDPStrategy(checkpoint="sharded")``).

- ``adam-groups`` is the last three cases in one run: Adam over two param groups with a
  per-step scheduler, accumulating 2 batches, its first 3 updates dropped (as
  ``NaNGuard(action="skip")`` drops bad ones), so the step-3 checkpoint holds an Adam that has
  never stepped. Under ddp and fsdp the job is killed with SIGKILL twice: in the middle of
  group 4 (resumed from step 3, before Adam's first update), then in the middle of group 7
  (resumed from step 6, Adam's state in play).
- ``sgd`` (SGD without momentum) changes only what the optimizer state holds, not what a
  kill leaves on disk: each strategy runs it in one process, which throws the crashed run
  away and restarts it from its checkpoint (``_resume_script.py --crashes``). Single device
  does the same for ``adam-groups``: real kills of single-device jobs are in test_resume.py.

Workers are forked (``--fork``), not spawned: the same training, a quarter of the start-up.
"""

from __future__ import annotations

import glob
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from tests.trainer.checkpoint.test_resume import (  # noqa: F401 - reference is a fixture
    SCRIPT, assert_same_training, killed_at, reference, resumed_from, run,
)

TWO = ["--devices", "2", "--max-epochs", "4", "--fork"]  # 4 batches a rank an epoch, 8 steps of 2 batches
STRATEGIES = {
    "single": ["--strategy", "single"],  # 8 batches an epoch: 12 steps of 2 batches in 3 epochs
    "ddp": ["--strategy", "ddp", *TWO],
    "fsdp": ["--strategy", "fsdp", *TWO],
    "fsdp-sharded": ["--strategy", "fsdp", *TWO, "--sharded"],
}
ADAM = ["--optimizer", "adam-groups", "--accumulate", "2", "--skip-first", "3", "--every", "3"]
SGD = ["--optimizer", "sgd", "--every", "3"]


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def assert_same_weights(folder: Path, ref: Path) -> None:
    final, expected = _weights(folder / "final.pt"), _weights(ref / "final.pt")
    assert final.keys() == expected.keys()
    for k in expected:
        assert torch.equal(final[k], expected[k]), f"final weights differ at {k}"


def adam_state_at_step_3(folder: Path) -> dict:
    """The per-parameter state of the step-3 checkpoint's optimizer (file or sharded folder)."""
    (path,) = glob.glob(str(folder / "runs/lightning_logs/version_*/checkpoints/*step=3.ckpt"))
    if Path(path).is_dir():
        keys = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
        return {k: None for k in keys if k.startswith("optimizer_states.0.state.")}
    return torch.load(path, weights_only=True)["optimizer_states"][0]["state"]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "fsdp-sharded"])
def test_kill9_before_adams_first_update_and_mid_accumulation_then_restart_is_bit_exact(
    strategy, tmp_path, script_env, reference
):
    args = [*STRATEGIES[strategy], *ADAM]
    sharded = strategy == "fsdp-sharded"
    # Checkpoints change nothing in the training: the sharded run lands on the full one's weights.
    ref = reference([a for a in args if a != "--sharded"])

    killed_at(args, "batch_end:3:2", tmp_path, script_env)  # group 4's first batch: Adam never stepped
    job = killed_at(args, "batch_end:6:2", tmp_path, script_env)  # group 7's first batch
    assert resumed_from(job)[2] == 3, job.log
    job = run(args, tmp_path, script_env)
    assert resumed_from(job)[2] == 6, job.log

    assert_same_weights(tmp_path, ref)
    if not sharded:
        assert_same_training(tmp_path, ref)  # and every checkpoint on the way, optimizer and scheduler too
    # A checkpoint holds the optimizer as it is: taking it must not create Adam's state (torch's
    # get_optimizer_state_dict does so with an update of zero gradients, which counts as a step).
    assert adam_state_at_step_3(tmp_path) == {}


def crash_and_resume(strategy: str, case: list[str], crashes: str, cwd: Path, env: dict[str, str]) -> list[int]:
    """Run ``--crashes`` in one process; the steps the restarts resumed from."""
    done = subprocess.run(
        [sys.executable, SCRIPT, *STRATEGIES[strategy], *case, "--crashes", crashes],
        cwd=cwd, env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=300,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log
    return [int(step) for step in re.findall(r"Resumed from \S+ at epoch \d+, step (\d+)", log)]


def assert_same_run(strategy: str, cwd: Path) -> None:
    if strategy == "fsdp-sharded":  # checkpoints are folders: the final weights say it
        assert_same_weights(cwd / "crashed", cwd / "straight")
    else:
        assert_same_training(cwd / "crashed", cwd / "straight")  # every checkpoint too


@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_sgd_without_momentum_resumes_bit_exact(strategy, tmp_path, script_env):
    # No optimizer state at all: fsdp's full checkpoint failed to load it ("Expected device to be set").
    assert crash_and_resume(strategy, SGD, "7:1", tmp_path, script_env) == [6]
    assert_same_run(strategy, tmp_path)
    if strategy != "fsdp-sharded":
        (path,) = glob.glob(str(tmp_path / "straight/runs/lightning_logs/version_0/checkpoints/*step=3.ckpt"))
        saved = torch.load(path, weights_only=True)["optimizer_states"][0]
        assert saved["state"] == {} and saved["param_groups"][0]["momentum"] == 0


@pytest.mark.slow
def test_single_device_adam_before_its_first_update_and_mid_accumulation_resumes_bit_exact(tmp_path, script_env):
    assert crash_and_resume("single", ADAM, "3:2,6:2", tmp_path, script_env) == [3, 6]
    assert_same_run("single", tmp_path)
    assert adam_state_at_step_3(tmp_path / "straight") == {}
