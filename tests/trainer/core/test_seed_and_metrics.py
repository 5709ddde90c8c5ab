"""seed_everything, and the self.log sink's arithmetic."""

from __future__ import annotations

import os
import random

import pytest
import torch

from trainer import seed_everything
from trainer.core.metrics import MetricSink


def test_seed_everything_makes_every_generator_repeat():
    seed_everything(7)
    first = (random.random(), torch.rand(3))
    seed_everything(7)
    assert random.random() == first[0] and torch.equal(torch.rand(3), first[1])
    assert os.environ["TRAINER_GLOBAL_SEED"] == "7"


@pytest.mark.parametrize("bad, error", [("7", TypeError), (True, TypeError), (-1, ValueError), (2**32, ValueError)])
def test_seed_everything_rejects_bad_seeds(bad, error):
    with pytest.raises(error, match="seed"):
        seed_everything(bad)


def test_sink_means_are_weighted_by_batch_size_and_reduced():
    sink = MetricSink()
    for value, size in ((1.0, 10), (4.0, 30)):
        sink.batch_size = size
        sink.log("loss", torch.tensor(value))
    sink.log("acc", 0.5, batch_size=2)
    assert sink.epoch_means() == {"acc": 0.5, "loss": pytest.approx((10 + 120) / 40)}
    # A reducer sees (weighted sum, weight) pairs, as an all-reduce across ranks would.
    doubled = sink.epoch_means(lambda parts: {k: (s * 2, w * 2) for k, (s, w) in parts.items()})
    assert doubled["loss"] == pytest.approx(130 / 40)
    assert sink.latest_floats() == {"loss": 4.0, "acc": 0.5}


def test_sink_bounds_memory_on_long_epochs():
    sink = MetricSink()
    for i in range(1000):
        sink.log("x", torch.tensor(float(i)))
    assert len(sink._series["x"].values) < 256
    assert sink.epoch_means()["x"] == pytest.approx(499.5)


def test_sink_rejects_non_scalars_and_non_numbers():
    sink = MetricSink()
    with pytest.raises(ValueError, match="shape"):
        sink.log("v", torch.ones(2))
    with pytest.raises(TypeError, match="number"):
        sink.log("s", "high")
