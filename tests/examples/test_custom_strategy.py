"""examples/custom_strategy.py: a user's DDPStrategy subclass with a bf16 all-reduce hook, 2 gloo processes."""

from __future__ import annotations

import os
import re

import pytest
import torch

from tests.examples._run import load_example, only_run_dir, run_example, scalar_tags


@pytest.mark.slow
def test_bf16_ddp_runs_on_two_processes_and_halves_the_bytes(script_env):
    output = run_example("custom_strategy", "--devices", "2", "--max-steps", "4", "--n-train", "512", "--log-dir", "tb", env=script_env)

    assert "gradients all-reduced in bfloat16" in output and "world size 2" in output
    report = re.search(r"\[rank 0 of 2\] bf16 all-reduce: (\d+) bucket all-reduces sent ([\d.]+) MB instead of ([\d.]+) MB", output)
    assert report, output
    calls, sent, full = int(report[1]), float(report[2]), float(report[3])
    assert calls >= 4 and sent > 0 and abs(full / sent - 2.0) < 0.02

    run_dir = only_run_dir("tb")
    # 4 batches per process: validation at the epoch's half (val_check_interval=0.5) and end, at the step before
    assert [step for step, _ in scalar_tags(run_dir)["val_loss"]] == [1, 3]
    ckpt = torch.load(os.path.join(run_dir, "checkpoints", "last.ckpt"), weights_only=True)
    assert ckpt["steadytrainer"]["strategy"] == "ddp_bf16" and ckpt["steadytrainer"]["loop"]["world_size"] == 2 and ckpt["global_step"] == 4
    load_example("custom_strategy").Student(**ckpt["hyper_parameters"]).load_state_dict(ckpt["state_dict"])
