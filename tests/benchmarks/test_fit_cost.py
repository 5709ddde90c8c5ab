"""benchmarks/fit_cost.py runs, both sides reach the same weights, and it prints each figure."""

from __future__ import annotations

import os
import subprocess
import sys

BENCHMARK = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks", "fit_cost.py")


def test_the_whole_fit_benchmark_prints_the_ratio_the_first_step_and_the_phases(script_env):
    done = subprocess.run([sys.executable, BENCHMARK, "--reps", "2"], env=script_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "weights identical" in out
    assert "goal <= 1.03" in out and "time to the first step: raw" in out
    for phase in ("build the model and Trainer", "fit -> on_fit_start", "-> on_train_start", "-> first training_step", "last epoch -> fit returns"):
        assert phase in out


def test_the_breakdown_turns_each_default_off_on_its_own(script_env):
    done = subprocess.run([sys.executable, BENCHMARK, "--breakdown", "--quick"], env=script_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = {line[2:30].strip(): float(line[30:].split()[0]) for line in done.stdout.splitlines() if line.startswith("  ")}
    assert set(rows) == {"every default on", "without the checkpoint", "without the progress bar", "without TensorBoard",
                         "without the summary", "all four off"}
    assert all(0.3 < ratio < 3 for ratio in rows.values()), rows
