"""benchmarks/checkpoint_verify_cost.py runs and prints each check beside what it sits next to."""

from __future__ import annotations

import os
import subprocess
import sys

BENCHMARK = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks", "checkpoint_verify_cost.py")


def test_the_checkpoint_checks_benchmark_prints_both_checks_and_their_ratios(script_env):
    done = subprocess.run([sys.executable, BENCHMARK, "--mb", "2", "--reps", "1"], env=script_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("checkpoint 2.0 MiB")
    rows = {line[:20].strip(): line[20:] for line in lines[1:]}
    assert set(rows) == {"read the file", "CRC check", "torch.load", "finite check", "the save's copy"}
    assert "x the read" in rows["CRC check"] and "x torch.load" in rows["CRC check"]
    assert "x the save's copy" in rows["finite check"]
