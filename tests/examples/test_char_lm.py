"""examples/char_lm.py: the README's first command, run small."""

from __future__ import annotations

import os

import pytest
import torch

from tests.conftest import requires_cuda
from tests.examples._run import load_example, only_run_dir, run_example, scalar_tags


pytestmark = pytest.mark.slow  # each test runs the example in a fresh Python (and DDP workers)

TINY = (
    "--corpus-mb", "0.05", "--batch-size", "4", "--block-size", "16", "--d-model", "16", "--n-layers", "1",
    "--n-heads", "2", "--sample-chars", "60",
)

# Under ddp/fsdp: 7 batches a rank an epoch, so that validation (every quarter epoch) comes within
# --max-steps 2, inside fit; after a fit that never validated, the example launches its ranks again
# for trainer.validate.
VALIDATES_IN_FIT = ("--corpus-mb", "0.02", "--batch-size", "128")


def test_trains_logs_checkpoints_and_prints_a_sample(script_env):
    # 2 epochs of 15 steps (128 windows of 16 characters from 0.02 MB), like the default run's 2 of 443
    args = ("--corpus-mb", "0.02", "--batch-size", "128", "--max-epochs", "2", "--log-dir", "tb")
    output = run_example("char_lm", *TINY, *args, env=script_env, timeout=240)

    sample = output.split("--- sample from the checkpoint (temperature 0.8) ---\n", 1)
    assert len(sample) == 2, output
    assert sample[1].startswith("def ") and len(sample[1].rstrip("\n")) >= 4 + 60 - 1
    assert "val_bpc" in output

    char_lm = load_example("char_lm")
    steps = len(char_lm.CharChunks(char_lm.stdlib_corpus(0.02)[0], 16)) // 128  # training batches per epoch
    every = steps // 4  # val_check_interval=0.25
    run_dir = only_run_dir("tb")
    scalars = scalar_tags(run_dir)
    assert [step for step, _ in scalars["train_loss"]] == list(range(2 * steps))  # every step, step n at n - 1
    assert "lr-AdamW" in scalars and "lr" not in scalars  # the example's LearningRateMonitor's, as in Lightning
    # Validation 4 times per epoch, and at its end: TensorBoard draws no curve of only 2 points
    # (one per epoch) while "Ignore outliers in chart scaling" is on, its default.
    expected = [e * steps + k * every for e in range(2) for k in range(1, 5) if k * every < steps] + [steps, 2 * steps]
    for tag in ("val_bpc", "val_loss"):
        assert [step for step, _ in scalars[tag]] == sorted(s - 1 for s in expected), tag  # at the step before
    assert len(scalars["val_bpc"]) >= 8
    bpc = [value for _, value in scalars["val_bpc"]]
    assert all(0 < v < 8 for v in bpc) and bpc[-1] < bpc[0]  # bits per character, falling

    # The checkpoint contract: "hyper_parameters" rebuild the bare model, and "state_dict" loads into it.
    ckpt = torch.load(os.path.join(run_dir, "checkpoints", "last.ckpt"), weights_only=True)
    model = char_lm.CharLM(**ckpt["hyper_parameters"])
    model.load_state_dict(ckpt["state_dict"])
    assert ckpt["hyper_parameters"]["d_model"] == 16 and ckpt["global_step"] == 2 * steps


def test_ddp_on_two_processes(script_env):
    output = run_example("char_lm", *TINY, *VALIDATES_IN_FIT, "--strategy", "ddp", "--devices", "2", "--max-steps", "2", "--log-dir", "tb", env=script_env)
    assert "world size 2" in output
    assert "--- sample from the checkpoint" in output
    assert torch.load(os.path.join(only_run_dir("tb"), "checkpoints", "last.ckpt"), weights_only=True)["steadytrainer"]["loop"]["world_size"] == 2


@requires_cuda(1)
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_on_a_gpu_in_mixed_precision(precision, script_env):
    output = run_example("char_lm", *TINY, "--precision", precision, "--max-steps", "20", "--log-dir", "tb", env=script_env)
    assert "Training with single on cuda:0" in output
    assert "--- sample from the checkpoint" in output
    ckpt = torch.load(os.path.join(only_run_dir("tb"), "checkpoints", "last.ckpt"), weights_only=True)
    assert ckpt["global_step"] == 20
    assert all(v.device.type == "cpu" and v.dtype != torch.float16 for v in ckpt["state_dict"].values())  # portable


def test_fsdp_on_two_processes(script_env):
    output = run_example("char_lm", *TINY, *VALIDATES_IN_FIT, "--n-layers", "2", "--strategy", "fsdp", "--devices", "2", "--max-steps", "2", "--log-dir", "tb", env=script_env)
    assert "Training with fsdp (gloo) on cpu" in output and "world size 2" in output
    assert "--- sample from the checkpoint" in output  # the checkpoint loads into the bare model
    ckpt = torch.load(os.path.join(only_run_dir("tb"), "checkpoints", "last.ckpt"), weights_only=True)
    assert ckpt["steadytrainer"]["loop"]["world_size"] == 2 and ckpt["steadytrainer"]["strategy"] == "fsdp"
