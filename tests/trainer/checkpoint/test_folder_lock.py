"""Two runs never write one checkpoint folder: real processes started in one folder, as two
relaunches of a preempted job (``ckpt_path="last"``) or two runs with ``logger=False`` are. The
second stops before training with a sentence naming the folder and the live run's pid; once that
run is killed with ``kill -9`` the OS has dropped its lock, and the next run resumes its work."""

from __future__ import annotations

import glob
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

SCRIPT = str(Path(__file__).with_name("_lock_script.py"))


def _start(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, SCRIPT, *args], cwd=cwd, env={**env, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, SCRIPT, *args], cwd=cwd, env={**env, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
    )


def _wait_training(proc: subprocess.Popen, cwd: Path, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not (cwd / f"training-{proc.pid}").exists():
        if proc.poll() is not None:
            pytest.fail(f"the first run exited ({proc.returncode}) before training:\n{proc.stdout.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("the first run did not start training in time")
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.parametrize("logger", [True, False], ids=["version-folder", "logger-false"])
def test_a_second_run_in_a_folder_being_written_stops_with_a_sentence_and_kill_9_leaves_no_lock(logger, tmp_path, script_env):
    common = [] if logger else ["--no-logger"]
    if logger:  # a first run, preempted: the relaunches resume its version folder
        assert _run([*common, "--max-epochs", "1"], tmp_path, script_env).returncode == 0
    # 160 steps of 0.5 s: still training when the second run has started, however busy the machine
    first = _start([*common, "--last", "--max-epochs", "40", "--slow", "0.5"], tmp_path, script_env)
    try:
        _wait_training(first, tmp_path)
        second = _run([*common, "--last", "--max-epochs", "40"], tmp_path, script_env)
        assert first.poll() is None  # still training
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    assert second.returncode != 0
    assert re.search(
        rf"RuntimeError: The checkpoint folder '\S*checkpoints' is being written by a run that is still going: "
        rf"another process \(pid {first.pid}\) holds its lock\..* this one stops before training", second.stdout,
    ), second.stdout
    assert "finished at step" not in second.stdout

    folders = glob.glob(str(tmp_path / "**" / "checkpoints"), recursive=True)
    assert len(folders) == 1  # no second run folder either: the second run stopped before making one
    last = torch.load(os.path.join(folders[0], "last.ckpt"), weights_only=True)["global_step"]
    assert 0 < last < 160

    # kill -9 left no stale lock: the next relaunch resumes the killed run's newest checkpoint.
    third = _run([*common, "--last", "--max-epochs", "40"], tmp_path, script_env)
    assert third.returncode == 0, third.stdout
    assert re.search(r"Resumed from \S+\.ckpt at epoch \d+, step (\d+)", third.stdout), third.stdout  # the newest intact file
    assert "finished at step 160" in third.stdout
