"""A full log disk: the fit ends with a sentence naming the log file and its folder, leaves no
temporary file, and the epoch's checkpoint (on another disk) is written first.

Real full disks: each run mounts a small tmpfs for the logs in a mount namespace of its own
(``unshare``), fills it, and trains with its checkpoints on the test's own disk."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "_full_disk_script.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _can_mount() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--mount", "--map-root-user", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


pytestmark = [pytest.mark.slow, pytest.mark.skipif(not _can_mount(), reason="needs unshare and a tmpfs mount")]


def _fit_on_full_disk(tmp_path, room: int, kind: str) -> dict:
    logs, ckpts = tmp_path / "logs", tmp_path / "ckpts"
    logs.mkdir()
    script = f"mount -t tmpfs -o size=256k tmpfs {logs} && exec {sys.executable} {SCRIPT} {logs} {ckpts} {tmp_path} {room} {kind}"
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run(["unshare", "--mount", "--map-root-user", "sh", "-c", script], env=env, capture_output=True,
                          text=True, timeout=300)
    assert (tmp_path / "outcome.json").exists(), done.stderr[-3000:]
    return json.loads((tmp_path / "outcome.json").read_text())


@pytest.mark.parametrize("kind", ["csv", "tensorboard"])
def test_a_full_log_disk_names_the_file_and_the_folder_and_leaves_no_temporary_file(tmp_path, kind):
    outcome = _fit_on_full_disk(tmp_path, 0, kind)
    name = "hparams.yaml" if kind == "csv" else "events.out.tfevents"
    assert re.match(rf"OSError: \[Errno 28\] Could not write the log file '{name}[^']*' in the folder '{tmp_path}/logs/run/version_0': "
                    "No space left on device", outcome["error"]), outcome["error"]
    assert not [f for f in outcome["log_files"] if ".tmp" in f]


@pytest.mark.parametrize("kind, room", [("csv", 20000), ("tensorboard", 20000), ("tensorboard", 12000)])
def test_the_disk_filling_up_mid_fit_keeps_every_checkpoint_that_was_due(tmp_path, kind, room):
    outcome = _fit_on_full_disk(tmp_path, room, kind)
    assert outcome["error"].startswith("OSError: [Errno 28] Could not write the log file"), outcome["error"]
    assert not [f for f in outcome["log_files"] if ".tmp" in f]
    epochs = sorted(int(re.match(r"epoch=(\d+)", f).group(1)) for f in outcome["checkpoints"])
    assert epochs == list(range(outcome["validated"] + 1))  # the epoch whose validation ended is saved too
