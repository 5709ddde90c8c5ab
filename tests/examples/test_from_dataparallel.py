"""examples/from_dataparallel.py: strategy="dp" (one device here), and the checkpoint contract."""

from __future__ import annotations

import os

import pytest
import torch

from tests.examples._run import load_example, only_run_dir, run_example, scalar_tags


pytestmark = pytest.mark.slow  # each test runs the example in a fresh Python (and DDP workers)


def test_dp_run_writes_logs_and_a_checkpoint_the_bare_net_loads(script_env):
    output = run_example(
        "from_dataparallel", "--n-train", "96", "--batch-size", "32", "--max-steps", "3", "--log-dir", "tb", env=script_env
    )
    if not torch.cuda.device_count() >= 2:
        assert "strategy='dp' needs 2 or more GPUs" in output  # the fallback says so
    assert "loaded into a bare Net(): val accuracy" in output

    run_dir = only_run_dir("tb")
    scalars = scalar_tags(run_dir)
    # 3 batches per epoch, per-step values every 4 steps: none yet; training_step's defaults have no epoch value.
    assert "train_loss" not in scalars and "train_loss_epoch" not in scalars
    # val_check_interval=0.25 of 3 batches: after batches 1 and 2, and at the epoch's end (at the step before)
    assert [step for step, _ in scalars["val_acc"]] == [0, 1, 2]

    state = torch.load(os.path.join(run_dir, "checkpoints", "last.ckpt"), weights_only=True)["state_dict"]
    assert not any(key.startswith("module.") for key in state)
    net = load_example("from_dataparallel").Net()
    net.load_state_dict(state)  # strict: every key of the bare model, and nothing else
    images = torch.randn(2, 3, 48, 40)  # any image size: the head sees pooled features
    assert net(images).shape == (2, 4)
