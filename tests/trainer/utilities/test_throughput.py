"""Throughput and measure_flops: rates over the window from given totals, FLOPs counted by torch."""

from __future__ import annotations

import pytest
import torch

from callbacks import Throughput, measure_flops
from tests.conftest import requires_cuda


def test_rates_over_the_window_from_given_totals():
    throughput = Throughput(available_flops=100, window_size=4, separator="|", using_sparse_model=False)
    for i in range(1, 6):  # a batch of 3 samples of 2 items each, 10 FLOPs, every second after 1.5 s
        throughput.update(time=0.5 + i, batches=i, samples=3 * i, lengths=6 * i, flops=10)
    assert throughput.compute() == {
        "time": 5.5,
        "batches": 5,
        "samples": 15,
        "lengths": 30,
        "device|batches_per_sec": 1.0,
        "device|samples_per_sec": 3.0,
        "device|items_per_sec": 6.0,
        "device|flops_per_sec": 10.0,
        "device|mfu": 0.1,
    }


def test_several_processes_add_the_global_rates():
    throughput = Throughput(world_size=2, window_size=2)
    throughput.update(time=1.0, batches=1, samples=4)
    throughput.update(time=2.0, batches=2, samples=8, flops=5)
    assert throughput.compute() == {
        "time": 2.0,
        "batches": 2,
        "samples": 8,
        "device/batches_per_sec": 1.0,
        "device/samples_per_sec": 4.0,
        "batches_per_sec": 2.0,
        "samples_per_sec": 8.0,
    }


def test_totals_must_increase():
    throughput = Throughput()
    throughput.update(time=1.0, batches=1, samples=1)
    with pytest.raises(ValueError, match="Expected the value to increase, last: 1.0, current: 1.0"):
        throughput.update(time=1.0, batches=2, samples=2)
    with pytest.raises(ValueError, match=r"Expected samples \(1\) to be greater or equal than batches \(2\)"):
        Throughput().update(time=1.0, batches=2, samples=1)


def test_measure_flops_of_a_linear_layer_on_the_meta_device():
    with torch.device("meta"):
        model = torch.nn.Linear(32, 2, bias=False)
        x = torch.randn(4, 32)
    forward = measure_flops(model, lambda: model(x))
    assert forward == 2 * 4 * 32 * 2  # a multiply and an add per weight and sample
    assert (
        measure_flops(model, lambda: model(x), torch.Tensor.sum) == 2 * forward
    )  # and the weight gradient (x needs none)


@requires_cuda(1)
def test_a_known_gpu_has_its_peak_flops():
    from trainer.utilities.throughput import get_available_flops

    name = torch.cuda.get_device_name(0).lower()
    if not any(chip in name for chip in ("h100", "h200", "a100", "l4", "t4", "v100")):
        pytest.skip(f"{name!r} is not in the table")
    assert get_available_flops(torch.device("cuda", 0), torch.bfloat16) > 1e13
