"""benchmarks/checkpoint_stall.py runs small and prints each saver's loss per save and the worst ratio."""

from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARK = os.path.join(ROOT, "benchmarks", "checkpoint_stall.py")


def test_the_stall_benchmark_prints_every_saver_against_the_floor_and_ends_with_the_worst_ratio(
    script_env, tmp_path_factory
):
    args = ["--mb", "2", "--reps", "1", "--every", "2", "--saves", "1"]
    # DCP's staging process shares tensors through a Unix socket made under TMPDIR, whose path may not pass
    # 107 characters: the test's own folder is too deep for it, so a short one of pytest's
    env = {**script_env, "TMPDIR": str(tmp_path_factory.mktemp("t"))}
    done = subprocess.run(
        [sys.executable, BENCHMARK, *args], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"{os.cpu_count()} cores") and "load avg" in lines[0]
    assert "DCP async_save with process staging" in lines[1]  # torch 2.13 has AsyncCheckpointerType.PROCESS
    assert any(line.startswith("checkpoint 2.0 MiB, step ") for line in lines)
    table = [line for line in lines if line.startswith("  ") and not line.startswith("  saver")]
    rows = {line[2:36].strip(): line[36:].split() for line in table}
    assert set(rows) == {"floor: clone()", "ours: ModelCheckpoint", "DCP async_save", "Lightning 2.6.6 ModelCheckpoint"}
    assert all(len(figures) == 3 for figures in rows.values()), rows
    floor_ms, floor_ratio, _ = rows["floor: clone()"]
    assert float(floor_ms) > 0 and float(floor_ratio) == 1.0  # the floor is never below its clone's own time
    assert re.fullmatch(r"worst stall ratio ours/floor: -?\d+\.\d\d", lines[-1]), lines[-1]
    assert float(lines[-1].split(": ")[1]) == float(rows["ours: ModelCheckpoint"][1])
