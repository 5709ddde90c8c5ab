"""benchmarks/overhead.py runs, and its comparison is fair: both sides reach the same weights."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks")


@pytest.fixture
def overhead(monkeypatch):
    monkeypatch.syspath_prepend(BENCHMARKS)
    import overhead

    return overhead


def test_peers_that_are_not_installed_are_skipped(overhead):
    import importlib.util

    found, missing = overhead.installed_peers()
    for name in ("lightning", "accelerate", "ignite"):
        assert (name in missing) == (importlib.util.find_spec(name) is None)
    assert len(found) + len(missing) == 3


def test_the_script_runs_and_both_sides_train_to_identical_weights(overhead, repo_root, script_env):
    out = subprocess.run(
        [sys.executable, "benchmarks/overhead.py", "--quick", "--reps", "1", "--workloads", "tiny", "--no-rss", "--no-ckpt", "--peers"],
        cwd=repo_root, env=script_env, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    rows = {line.split()[6]: line for line in lines if line.startswith("tiny MLP")}  # by side
    found, _ = overhead.installed_peers()
    assert set(rows) == {"floor", "trainer", *(name.split()[0] for name in found)}  # an installed peer gets a row
    assert "identical" in rows["floor"] and "identical" in rows["trainer"]
    floor = next(line for line in lines if "trainer / floor = " in line)
    assert float(floor.split("trainer / floor = ")[1].split()[0]) > 0
    last = lines[-1]
    assert last.startswith("worst ratio") and "cores, torch" in last
