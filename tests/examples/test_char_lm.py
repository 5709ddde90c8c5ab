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


def test_trains_logs_checkpoints_and_prints_a_sample(script_env):
    output = run_example("char_lm", *TINY, "--max-steps", "3", "--log-dir", "tb", env=script_env)

    sample = output.split("--- sample from the checkpoint (temperature 0.8) ---\n", 1)
    assert len(sample) == 2, output
    assert sample[1].startswith("def ") and len(sample[1].rstrip("\n")) >= 4 + 60 - 1
    assert "val_bpc" in output

    run_dir = only_run_dir("tb")
    scalars = scalar_tags(run_dir)
    assert [step for step, _ in scalars["train_loss"]] == [1, 2, 3]  # every step
    assert len(scalars["val_bpc"]) == 1 and 0 < scalars["val_bpc"][0][1] < 8  # once, at the (cut) epoch's end

    # The checkpoint contract: hparams rebuild the bare model, and "model" loads into it.
    ckpt = torch.load(os.path.join(run_dir, "checkpoints", "last.ckpt"), weights_only=True)
    char_lm = load_example("char_lm")
    model = char_lm.CharLM(**ckpt["hparams"])
    model.load_state_dict(ckpt["model"])
    assert ckpt["hparams"]["d_model"] == 16 and ckpt["loop"]["global_step"] == 3


def test_ddp_on_two_processes(script_env):
    output = run_example("char_lm", *TINY, "--strategy", "ddp", "--devices", "2", "--max-steps", "2", "--log-dir", "tb", env=script_env)
    assert "world size 2" in output
    assert "--- sample from the checkpoint" in output
    assert torch.load(os.path.join(only_run_dir("tb"), "checkpoints", "last.ckpt"), weights_only=True)["loop"]["world_size"] == 2


@requires_cuda(1)
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_on_a_gpu_in_mixed_precision(precision, script_env):
    output = run_example("char_lm", *TINY, "--precision", precision, "--max-steps", "20", "--log-dir", "tb", env=script_env)
    assert "Training with single on cuda:0" in output
    assert "--- sample from the checkpoint" in output
    ckpt = torch.load(os.path.join(only_run_dir("tb"), "checkpoints", "last.ckpt"), weights_only=True)
    assert ckpt["loop"]["global_step"] == 20
    assert all(v.device.type == "cpu" and v.dtype != torch.float16 for v in ckpt["model"].values())  # portable


def test_fsdp_on_two_processes(script_env):
    output = run_example("char_lm", *TINY, "--n-layers", "2", "--strategy", "fsdp", "--devices", "2", "--max-steps", "2", "--log-dir", "tb", env=script_env)
    assert "Training with fsdp (gloo) on cpu" in output and "world size 2" in output
    assert "--- sample from the checkpoint" in output  # the checkpoint loads into the bare model
    ckpt = torch.load(os.path.join(only_run_dir("tb"), "checkpoints", "last.ckpt"), weights_only=True)
    assert ckpt["loop"]["world_size"] == 2 and ckpt["strategy"] == "fsdp"
