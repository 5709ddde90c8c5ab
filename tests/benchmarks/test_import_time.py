"""benchmarks/import_time.py runs and prints both figures, with the goal's verdict."""

from __future__ import annotations

import os
import subprocess
import sys

BENCHMARK = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks", "import_time.py")


def test_the_import_benchmark_prints_torch_and_the_extra(script_env):
    done = subprocess.run([sys.executable, BENCHMARK, "--reps", "1"], env=script_env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].startswith("import torch") and lines[1].endswith(" s")
    assert lines[2].startswith("+ trainer, callbacks, strategies, loggers, Trainer") and "goal <= 0.15 s" in lines[2]
