"""What ``self.log`` writes into: latest per-step values and batch-size-weighted epoch means.

The hot path (``log``) only appends detached tensors to lists; nothing is synced with
the device until a value is read (at the logging cadence or at the end of an epoch).
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable

import torch

_local = threading.local()  # the active sink; DataParallel replica threads set their own


def current_sink() -> "MetricSink | None":
    return getattr(_local, "sink", None)


def set_sink(sink: "MetricSink | None") -> "MetricSink | None":
    previous = getattr(_local, "sink", None)
    _local.sink = sink
    return previous


# A reducer takes {name: (weighted_sum, weight)} of this process and returns the
# same for all processes together (a strategy's all-reduce; identity on one process).
Reducer = Callable[[dict[str, tuple[torch.Tensor, torch.Tensor]]], dict[str, tuple[torch.Tensor, torch.Tensor]]]

_COLLAPSE_AT = 256  # bound memory on long epochs: fold the pending values every so often


class _Series:
    __slots__ = ("values", "weights", "total", "weight", "prog_bar")

    def __init__(self, prog_bar: bool) -> None:
        self.values: list[torch.Tensor] = []
        self.weights: list[float] = []
        self.total: torch.Tensor | None = None
        self.weight = 0.0
        self.prog_bar = prog_bar

    def collapse(self) -> None:
        if not self.values:
            return
        dtype = self.values[0].dtype
        if all(v.dtype == dtype for v in self.values):
            # One stack, then one cast: the same float64 values, at a tenth of the cost.
            values = torch.stack(self.values).to(torch.float64)
        else:  # stack would promote, e.g. int64 with float32 to float32, and lose digits
            values = torch.stack([v.to(torch.float64) for v in self.values])
        weights = torch.tensor(self.weights, dtype=torch.float64, device=values.device)
        part = (values * weights).sum()
        self.total = part if self.total is None else self.total + part.to(self.total.device)
        self.weight += sum(self.weights)
        self.values.clear()
        self.weights.clear()


class MetricSink:
    """Collects the values logged during one phase (a training epoch, a validation run)."""

    def __init__(self) -> None:
        self.latest: dict[str, torch.Tensor | float] = {}
        self.prog_bar: set[str] = set()
        self._series: dict[str, _Series] = {}
        self.batch_size: int = 1  # set by the loop for each batch

    def log(self, name: str, value: Any, prog_bar: bool = False, batch_size: int | None = None) -> None:
        series = self._series.get(name)
        if series is None:
            series = self._new_series(name, value, prog_bar)
        if isinstance(value, torch.Tensor):
            value = value.detach()
        else:
            value = torch.tensor(float(value), dtype=torch.float64)
        self.latest[name] = value
        series.values.append(value)
        series.weights.append(self.batch_size if batch_size is None else batch_size)
        if len(series.values) >= _COLLAPSE_AT:
            series.collapse()

    def _new_series(self, name: str, value: Any, prog_bar: bool) -> _Series:
        # Checked once per name, so the per-step path stays a dict lookup and an append.
        if not isinstance(name, str) or not name:
            raise TypeError(f"self.log(name={name!r}): name must be a non-empty string.")
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(
                    f"self.log({name!r}, value): value must be a scalar, got a tensor of shape "
                    f"{tuple(value.shape)}. Reduce it first, e.g. value.mean()."
                )
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(
                f"self.log({name!r}, value={value!r}): value must be a number or a scalar tensor."
            )
        series = self._series[name] = _Series(prog_bar)
        if prog_bar:
            self.prog_bar.add(name)
        return series

    def merge_weighted(self, parts: list[tuple["MetricSink", int]]) -> None:
        """Fold several sinks (one per DataParallel replica) into this one, weighted by chunk size."""
        names = [n for n in parts[0][0].latest]
        total = sum(w for _, w in parts)
        for name in names:
            value = sum(s.latest[name].to(parts[0][0].latest[name].device) * (w / total) for s, w in parts)
            prog = any(name in s.prog_bar for s, _ in parts)
            self.log(name, value, prog_bar=prog, batch_size=total)

    def state_dict(self) -> dict[str, Any]:
        """The values logged so far, as CPU tensors: a mid-epoch checkpoint carries them so that
        the resumed epoch's means (and whatever monitors them) come out as if never stopped."""
        series = {
            name: {
                "values": torch.stack([v.detach().to("cpu", torch.float64).reshape(()) for v in s.values])
                if s.values else torch.zeros(0, dtype=torch.float64),
                "weights": list(s.weights),
                "total": None if s.total is None else s.total.detach().cpu(),
                "weight": s.weight,
                "prog_bar": s.prog_bar,
            }
            for name, s in self._series.items()
        }
        latest = {name: torch.as_tensor(v).detach().to("cpu", torch.float64) for name, v in self.latest.items()}
        return {"series": series, "latest": latest}

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        for name, saved in state["series"].items():
            series = self._series[name] = _Series(saved["prog_bar"])
            # float64 holds every float32 exactly, and collapse() computes in float64 anyway.
            series.values = list(saved["values"].to(device).unbind())
            series.weights = list(saved["weights"])
            series.total = None if saved["total"] is None else saved["total"].to(device)
            series.weight = saved["weight"]
            if saved["prog_bar"]:
                self.prog_bar.add(name)
        self.latest.update(state["latest"])

    def latest_floats(self) -> dict[str, float]:
        """The most recent value of each name, as floats (syncs with the device once)."""
        if not self.latest:
            return {}
        if all(not isinstance(v, torch.Tensor) or v.is_cpu for v in self.latest.values()):
            # Nothing to sync with a device: reading each value is cheaper than stacking them.
            return {n: float(v) for n, v in self.latest.items()}
        names = list(self.latest)
        values = torch.stack([torch.as_tensor(self.latest[n]).to(torch.float64).cpu().reshape(()) for n in names])
        return dict(zip(names, values.tolist()))

    def epoch_means(self, reduce: Reducer | None = None) -> dict[str, float]:
        """Batch-size-weighted means of everything logged, reduced across processes."""
        parts: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for name, series in self._series.items():
            series.collapse()
            if series.total is None:
                continue
            parts[name] = (series.total.reshape(()), torch.tensor(series.weight, dtype=torch.float64))
        if reduce is not None:
            parts = reduce(parts)
        means = {}
        for name, (total, weight) in sorted(parts.items()):
            w = float(weight)
            means[name] = float(total) / w if w > 0 else math.nan
        return means
