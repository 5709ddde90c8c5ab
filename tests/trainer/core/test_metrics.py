"""MetricSink: what self.log keeps, and the epoch means it reports."""

from __future__ import annotations

import pytest
import torch

from trainer.core.metrics import _COLLAPSE_AT, MetricSink


def test_epoch_mean_keeps_every_digit_when_a_name_mixes_dtypes():
    # float32 and int64 in one series: casting each to float64 keeps 2**40 + 1 exact, where
    # stacking them first would promote to float32 and round it to 2**40.
    sink = MetricSink()
    sink.log("n", torch.tensor(2**40 + 1))
    sink.log("n", torch.tensor(0.5))
    assert sink.epoch_means() == {"n": (2**40 + 1 + 0.5) / 2}


def test_epoch_mean_over_many_steps_is_the_batch_weighted_mean():
    sink = MetricSink()
    values = [0.25 * (i % 7) for i in range(2 * _COLLAPSE_AT + 3)]  # folds twice on the way
    for i, v in enumerate(values):
        sink.batch_size = 1 + i % 3
        sink.log("loss", torch.tensor(v, dtype=torch.float32))
    weights = [1 + i % 3 for i in range(len(values))]
    expected = sum(v * w for v, w in zip(values, weights)) / sum(weights)  # exact: quarters
    assert sink.epoch_means() == {"loss": expected}


def test_latest_floats_are_the_logged_values():
    sink = MetricSink()
    sink.log("a", torch.tensor(0.1, dtype=torch.float32))
    sink.log("b", torch.tensor([3], dtype=torch.int64))
    sink.log("c", 2.5)
    assert sink.latest_floats() == {"a": float(torch.tensor(0.1, dtype=torch.float32)), "b": 3.0, "c": 2.5}



def test_a_later_value_of_another_shape_is_refused_like_the_first():
    sink = MetricSink()
    sink.log("loss", torch.tensor(0.5))
    sink.log("loss", torch.tensor([0.25]))  # one element: fine
    with pytest.raises(ValueError, match=r"self.log\('loss', value\): value must be a scalar, got a tensor of shape \(3,\)"):
        sink.log("loss", torch.ones(3))
    sink.log("n", torch.tensor(3))  # an int tensor comes out as a float
    assert sink.latest_floats() == {"loss": 0.25, "n": 3.0} and type(sink.latest_floats()["n"]) is float
