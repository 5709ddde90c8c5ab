"""examples/gan.py: two optimizers stepped by hand, under single and ddp, run small."""

from __future__ import annotations

import os

import pytest
import torch

from tests.examples._run import load_example, only_run_dir, run_example, scalar_tags

pytestmark = pytest.mark.slow  # each test runs the example in a fresh Python (and DDP workers)

TINY = ("--samples", "256", "--batch-size", "32", "--hidden", "16", "--max-steps", "20", "--log-dir", "tb")


@pytest.mark.parametrize("strategy", ["single", "ddp"])
def test_trains_both_networks_and_reports_its_coverage(strategy, script_env):
    devices = "2" if strategy == "ddp" else "1"
    output = run_example("gan", *TINY, "--strategy", strategy, "--devices", devices, env=script_env)
    # max_steps counts every optimizer.step(), as in Lightning: 20 steps are 10 batches, an epoch and 2
    assert "after 20 optimizer steps (10 batches, each a discriminator and a generator step): the generator covers" in output, output

    run_dir = only_run_dir("tb")
    ckpt = torch.load(os.path.join(run_dir, "checkpoints", "last.ckpt"), weights_only=True)
    assert ckpt["global_step"] == 20 and ckpt["steadytrainer"]["loop"]["world_size"] == int(devices)
    assert len(ckpt["optimizer_states"]) == 2  # the generator's and the discriminator's Adam
    assert all(len(state["state"]) == 6 for state in ckpt["optimizer_states"])  # 3 layers x (weight, bias) each
    gan = load_example("gan")
    model = gan.RingGAN(**ckpt["hyper_parameters"])
    model.load_state_dict(ckpt["state_dict"])  # the bare model's keys: no wrapper prefix
    scalars = scalar_tags(run_dir)
    assert {"d_loss", "g_loss", "val_mode_dist"} <= set(scalars) and not {t for t in scalars if t.startswith("lr")}


def test_the_generator_learns_the_ring():
    """About a thousand steps in-process cover most of the ring: the example's claim, on a budget."""
    gan = load_example("gan")
    torch.manual_seed(0)
    from torch.utils.data import DataLoader

    from trainer import Trainer

    model = gan.RingGAN()
    before = gan.coverage(model)
    loader = DataLoader(gan.ring_data(8192, 8, seed=0), batch_size=128, shuffle=True)
    Trainer(max_epochs=20, enable_progress_bar=False, log_dir=None, enable_checkpointing=False).fit(model, loader)
    modes, median = gan.coverage(model)  # 1280 batches (2560 steps); untrained: no mode, about 37 spreads away
    assert modes >= 7 and median < 8, (before, (modes, median))
