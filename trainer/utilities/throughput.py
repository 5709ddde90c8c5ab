"""Throughput (batches, samples, items and FLOPs per second over a window), measure_flops, and a GPU's peak FLOPs."""

from __future__ import annotations

import warnings
from collections import deque
from typing import Any, Callable

import torch

from trainer.core.checks import positive_int
from trainer.core.exceptions import misconfigured


class Throughput:
    """Computes throughput from running totals, as Lightning's ``Throughput`` (Fabric's utility).

    Feed it with ``update(time=, batches=, samples=, lengths=, flops=)`` (totals so far, each
    increasing; ``flops`` is this process's FLOPs of one batch) and read ``compute()``:
    ``time``, ``batches``, ``samples`` (and ``lengths``) always; once ``window_size`` updates
    are in, ``device/batches_per_sec``, ``device/samples_per_sec``, ``device/items_per_sec``
    (with lengths), ``device/flops_per_sec`` and ``device/mfu`` (FLOPs over
    ``available_flops``), each over the window; with ``world_size`` > 1 also the totals over
    all processes without the ``device/`` prefix. ``separator`` replaces the ``/``.
    """

    def __init__(
        self,
        available_flops: float | None = None,
        world_size: int = 1,
        window_size: int = 100,
        separator: str = "/",
        using_sparse_model: bool | None = None,
        sparse_cuda_acceleration_factor: float = 2.0,
    ) -> None:
        if not sparse_cuda_acceleration_factor >= 1.0:
            raise misconfigured(
                f"Throughput(sparse_cuda_acceleration_factor={sparse_cuda_acceleration_factor!r}) must be >= 1: "
                "sparse acceleration factor cannot reduce peak FLOPs."
            )
        if using_sparse_model is None and available_flops is not None:
            warnings.warn(
                "MFU assumes dense model FLOPs (no sparsity acceleration)."
                " Set 'using_sparse_model=True' for MFU to use sparse FLOPs.",
                UserWarning,
                stacklevel=2,
            )
        if using_sparse_model and available_flops is not None:
            available_flops *= sparse_cuda_acceleration_factor
        self.available_flops = available_flops
        self.separator = separator
        self.world_size = positive_int("Throughput(world_size)", world_size)
        # two values at least: a rate is the difference between the window's first and last
        window_size = positive_int("Throughput(window_size)", window_size, minimum=2)
        self._time: _Increasing = _Increasing(window_size, "time")
        self._batches: _Increasing = _Increasing(window_size, "batches")
        self._samples: _Increasing = _Increasing(window_size, "samples")
        self._lengths: _Increasing = _Increasing(window_size, "lengths")
        self._flops: deque[float] = deque(maxlen=window_size)

    def update(
        self, *, time: float, batches: int, samples: int, lengths: int | None = None, flops: int | None = None
    ) -> None:
        """Adds one measurement: the totals so far (``time`` in seconds), and ``flops``, this
        process's FLOPs since the last update (``measure_flops`` times the batches)."""
        self._time.append(time)
        if samples < batches:
            raise ValueError(f"Expected samples ({samples}) to be greater or equal than batches ({batches})")
        self._batches.append(batches)
        self._samples.append(samples)
        if lengths is not None:
            if lengths < samples:
                raise ValueError(f"Expected lengths ({lengths}) to be greater or equal than samples ({samples})")
            self._lengths.append(lengths)
            if len(self._samples) != len(self._lengths):
                raise RuntimeError(
                    f"If lengths are passed ({len(self._lengths)}), there needs to be the same number of samples"
                    f" ({len(self._samples)})"
                )
        if flops is not None:
            self._flops.append(flops * self.world_size)  # over all processes

    def compute(self) -> dict[str, int | float]:
        """The totals, and the rates once the window is full."""
        sep, everywhere = self.separator, self.world_size > 1
        metrics: dict[str, int | float] = {
            "time": self._time[-1],
            "batches": self._batches[-1],
            "samples": self._samples[-1],
        }
        if self._lengths:
            metrics["lengths"] = self._lengths[-1]
        elapsed = self._time[-1] - self._time[0] if self._time else 0.0
        if self._time.full:
            batches_per_sec = (self._batches[-1] - self._batches[0]) / elapsed
            samples_per_sec = (self._samples[-1] - self._samples[0]) / elapsed
            metrics[f"device{sep}batches_per_sec"] = batches_per_sec
            metrics[f"device{sep}samples_per_sec"] = samples_per_sec
            if everywhere:
                metrics["batches_per_sec"] = batches_per_sec * self.world_size
                metrics["samples_per_sec"] = samples_per_sec * self.world_size
            if self._lengths.full:
                items_per_sec = (self._lengths[-1] - self._lengths[0]) / elapsed
                metrics[f"device{sep}items_per_sec"] = items_per_sec
                if everywhere:
                    metrics["items_per_sec"] = items_per_sec * self.world_size
        if len(self._flops) == self._flops.maxlen:
            flops_per_sec = (
                sum(self._flops) - self._flops[0]
            ) / elapsed  # the first update's FLOPs came before the window
            if everywhere:
                metrics["flops_per_sec"] = flops_per_sec
            metrics[f"device{sep}flops_per_sec"] = flops_per_sec / self.world_size
            if self.available_flops:
                metrics[f"device{sep}mfu"] = flops_per_sec / self.world_size / self.available_flops
        return metrics

    @property
    def last_time(self) -> float:
        """The last ``time`` given to ``update`` (0.0 before any)."""
        return self._time[-1] if self._time else 0.0

    def reset(self) -> None:
        for window in (self._time, self._batches, self._samples, self._lengths, self._flops):
            window.clear()


class _Increasing(list):
    """The last ``maxlen`` values of a total, which must increase with each one (a timer or a
    counter that went wrong fails here, not as a rate divided by zero)."""

    def __init__(self, maxlen: int, name: str) -> None:
        super().__init__()
        self.maxlen, self.name = maxlen, name

    @property
    def full(self) -> bool:
        return len(self) == self.maxlen

    def append(self, value: Any) -> None:
        if self and self[-1] >= value:
            raise ValueError(
                f"Expected the value to increase, last: {self[-1]}, current: {value} (Throughput's {self.name})"
            )
        super().append(value)
        if len(self) > self.maxlen:
            del self[0]


def measure_flops(
    model: torch.nn.Module,
    forward_fn: Callable[[], torch.Tensor],
    loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> int:
    """The FLOPs of ``forward_fn()`` (a forward pass of ``model``), and of ``loss_fn``'s loss and
    its backward pass when given, counted by ``torch.utils.flop_counter``. A model built under
    ``torch.device("meta")`` costs no memory and no time::

        with torch.device("meta"):
            model = MyModel()
            x = torch.randn(2, 32)
        flops_per_batch = measure_flops(model, lambda: model(x), loss_fn=torch.Tensor.sum)
    """
    from torch.utils.flop_counter import FlopCounterMode  # on first use: it is not free to import

    counter = FlopCounterMode(display=False)
    with counter:
        if loss_fn is None:
            forward_fn()
        else:
            loss_fn(forward_fn()).backward()
    return counter.get_total_flops()


# Peak dense FLOPs per second from NVIDIA's datasheets, per chip and dtype ("tf32": float32 matmuls on tensor cores).
_GPU_PEAK = {
    "h200": {
        torch.float64: 3.4e13,
        torch.float32: 6.7e13,
        "tf32": 4.945e14,
        torch.bfloat16: 9.895e14,
        torch.float16: 9.895e14,
        torch.int8: 1.979e15,
    },
    "h100 sxm": {
        torch.float64: 3.4e13,
        torch.float32: 6.7e13,
        "tf32": 4.945e14,
        torch.bfloat16: 9.895e14,
        torch.float16: 9.895e14,
        torch.int8: 1.979e15,
    },
    "h100 pcie": {
        torch.float64: 2.56e13,
        torch.float32: 5.12e13,
        "tf32": 3.78e14,
        torch.bfloat16: 7.56e14,
        torch.float16: 7.56e14,
        torch.int8: 1.513e15,
    },
    "a100": {
        torch.float64: 9.7e12,
        torch.float32: 1.95e13,
        "tf32": 1.56e14,
        torch.bfloat16: 3.12e14,
        torch.float16: 3.12e14,
        torch.int8: 6.24e14,
    },
    "a10g": {
        torch.float32: 3.12e13,
        "tf32": 6.25e13,
        torch.bfloat16: 1.25e14,
        torch.float16: 1.25e14,
        torch.int8: 2.5e14,
    },
    "l4": {
        torch.float32: 3.03e13,
        "tf32": 6.0e13,
        torch.bfloat16: 1.21e14,
        torch.float16: 1.21e14,
        torch.int8: 2.42e14,
    },
    "l40": {
        torch.float32: 9.05e13,
        "tf32": 9.05e13,
        torch.bfloat16: 1.81e14,
        torch.float16: 1.81e14,
        torch.int8: 3.62e14,
    },
    "t4": {torch.float32: 8.1e12, torch.float16: 6.5e13, torch.int8: 1.3e14},
    "v100": {torch.float64: 7.8e12, torch.float32: 1.57e13, torch.float16: 1.25e14},
    "rtx 4090": {
        torch.float32: 8.26e13,
        "tf32": 8.26e13,
        torch.bfloat16: 8.26e13,
        torch.float16: 8.26e13,
        torch.int8: 6.606e14,
    },
    "rtx 3090": {
        torch.float32: 3.56e13,
        "tf32": 3.56e13,
        torch.bfloat16: 3.56e13,
        torch.float16: 3.56e13,
        torch.int8: 2.84e14,
    },
}


def _chip(name: str) -> str | None:
    name = name.lower()
    if "h100" in name:
        return "h100 pcie" if "pcie" in name or "hbm2e" in name else "h100 sxm"
    if "l40" in name or ("l4" in name and "tesla" in name):
        return "l40"
    for chip in ("h200", "a100", "a10g", "l4", "t4", "v100", "rtx 4090", "rtx 3090"):
        if chip in name:
            return chip
    return None


def get_available_flops(device: torch.device, dtype: torch.dtype | str) -> int | None:
    """The device's peak FLOPs per second for ``dtype`` (an optimistic bound that only large
    matmuls approach), or None, with a warning, for a GPU not in the table; None on a CPU."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    chip = _chip(name)
    if chip is None:
        warnings.warn(f"FLOPs not found for {name!r}", UserWarning, stacklevel=2)
        return None
    if dtype is torch.float32 and torch.cuda.get_device_capability(device) >= (8, 0):
        if torch.get_float32_matmul_precision() != "highest":
            dtype = "tf32"
    peak = _GPU_PEAK[chip].get(dtype)
    if peak is None:
        warnings.warn(f"{name!r} does not support {dtype}", UserWarning, stacklevel=2)
        return None
    return int(peak)


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype the matmuls run in under ``Trainer(precision=...)``."""
    precision = str(precision)
    if precision.startswith("bf16"):
        return torch.bfloat16
    if precision.startswith("16"):
        return torch.float16
    if precision.startswith("64"):
        return torch.float64
    if "transformer-engine" in precision:
        return torch.int8
    return torch.float32
