"""What the repository holds: source, never the output of a run (checkpoints, TensorBoard runs)."""

from __future__ import annotations

import os
import subprocess

import pytest

_RUN_OUTPUT = (".ckpt", ".pt", ".pth", ".safetensors")
_RUN_FOLDERS = ("checkpoints", "runs", "lightning_logs", ".scratch")


def _git(repo_root: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=repo_root, capture_output=True, text=True)


@pytest.fixture
def git_root(repo_root: str) -> str:
    if not os.path.exists(os.path.join(repo_root, ".git")) or _git(repo_root, "rev-parse").returncode != 0:
        pytest.skip("not a git checkout")
    return repo_root


def test_no_checkpoint_or_run_folder_is_committed(git_root):
    files = _git(git_root, "ls-files").stdout.splitlines()
    assert files  # the listing worked
    committed = [f for f in files if f.endswith(_RUN_OUTPUT) or set(f.split("/")[:-1]) & set(_RUN_FOLDERS)]
    assert committed == [], "run output is committed: git rm it (and let .gitignore keep it out)"


@pytest.mark.parametrize(
    "path",
    [
        "checkpoints/last.ckpt",  # a Trainer(log_dir=None) run in the checkout's root
        "benchmarks/checkpoints/epoch=9-step=100.ckpt",  # ... or started from benchmarks/
        "examples/runs/default/version_0/events.out.tfevents.1",
        "examples/lightning_logs/version_0/checkpoints/last.ckpt",  # the default run folder, as Lightning's
        "benchmarks/.scratch/tmpabc/save-0.ckpt",
        "model.ckpt",
    ],
)
def test_what_runs_write_is_ignored_wherever_they_run(git_root, path):
    assert _git(git_root, "check-ignore", "--no-index", "-q", path).returncode == 0, f"{path} is not ignored"
