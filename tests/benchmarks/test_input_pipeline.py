"""benchmarks/input_pipeline.py: CI has no GPU, so its logic is checked on the CPU with a tiny model."""

from __future__ import annotations

import subprocess
import sys


def test_the_input_pipeline_benchmark_runs_on_a_cpu_and_every_side_reaches_the_raw_loops_weights(repo_root, script_env):
    out = subprocess.run(
        [sys.executable, "benchmarks/input_pipeline.py", "--device", "cpu", "--quick"],
        cwd=repo_root, env=script_env, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith("  ") and "steps/s" not in line]
    assert [" ".join(r[:-3]) for r in rows] == ["raw", "raw, pinned", "trainer", "trainer, on device"]
    # On the CPU every side computes the same sums in the same order, across an epoch boundary too.
    assert all(r[-1] == "0.00e+00" for r in rows), out.stdout
