"""benchmarks/gpu.py: CI has no GPU, so its logic is checked on the CPU with a tiny model."""

from __future__ import annotations

import subprocess
import sys


def test_the_speed_part_runs_on_a_cpu_and_both_sides_reach_the_same_weights(repo_root, script_env):
    out = subprocess.run(
        [sys.executable, "benchmarks/gpu.py", "--device", "cpu", "--quick"],
        cwd=repo_root, env=script_env, capture_output=True, text=True, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("GPU check, ") and "CPU" in lines[0]
    assert any(line.strip().startswith("hand-written loop") for line in lines)
    assert any(line.strip().startswith("Trainer ") for line in lines)
    # On the CPU both sides compute the same sums in the same order: equal weights, not close ones.
    assert "Trainer vs raw loop 0.00e+00" in out.stdout


def test_without_a_gpu_the_default_run_says_how_to_check_the_script(repo_root, script_env):
    env = {**script_env, "CUDA_VISIBLE_DEVICES": ""}
    out = subprocess.run([sys.executable, "benchmarks/gpu.py"], cwd=repo_root, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "no CUDA device is visible; use --device cpu" in out.stderr
