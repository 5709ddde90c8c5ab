"""What ``self.log`` writes into: latest per-step values and batch-size-weighted epoch means.

``log`` runs on every step, so it does little. A value on an accelerator is kept as a detached tensor, and nothing waits
for the device until it is read (at the logging cadence or at the end of an epoch). A value on the CPU, or a plain
number, is read at once and added to a running float64 sum: there is nothing to wait for, and nothing needs to be kept.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Callable

import torch

from trainer.core.log_options import (
    LogOptions, Reduced, first_kind, logged_twice, no_batch_size, not_a_number, not_scalar, options_for, outside,
)

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
    """One name's batch-size-weighted sum. CPU values are added to ``total`` as they come;
    device tensors wait in ``values`` (with their ``weights``) and are folded in every
    ``_COLLAPSE_AT`` values, or when read."""

    __slots__ = ("values", "weights", "total", "weight", "prog_bar")

    def __init__(self, prog_bar: bool) -> None:
        self.values: list[torch.Tensor] = []
        self.weights: list[float] = []
        self.total: float | torch.Tensor = 0.0  # a device tensor once device values were folded in
        self.weight = 0.0
        self.prog_bar = prog_bar

    def collapse(self) -> None:
        values, weights = self.values, self.weights
        if not values:
            return
        device = values[0].device
        if all(v.dtype == values[0].dtype and v.device == device for v in values):
            # One stack, then one cast: the same float64 values, at a tenth of the cost.
            stacked = torch.stack(values).to(torch.float64)
        else:  # stack would promote, e.g. int64 with float32 to float32, and lose digits
            stacked = torch.stack([v.to(device, torch.float64) for v in values])
        self.total = self.total + (stacked * torch.tensor(weights, dtype=torch.float64, device=device)).sum()
        self.weight += sum(weights)
        values.clear()
        weights.clear()


class MetricSink:
    """Collects the values logged during one phase (a training epoch, a validation run)."""

    def __init__(self, training: bool = False) -> None:
        self.latest: dict[str, float | torch.Tensor] = {}
        self.prog_bar: set[str] = set()
        self._series: dict[str, _Series] = {}
        self.batch_size: int | None = 1  # set by the loop for each batch (None: unknown, a dataloader_iter step's)
        self.on_device = False  # whether a value was logged on an accelerator (kept as a tensor)
        self.training = training  # Lightning's defaults: training_step's (step values) or evaluation's
        self.epoch_end = False  # on_train_epoch_end runs: Lightning's defaults there are evaluation's (epoch values)
        # self.log's keywords, for the names logged with other than the defaults (trainer/core/log_options.py)
        self.options: dict[str, LogOptions] = {}
        self._reduced: dict[str, Reduced] = {}  # reduce_fx sum/max/min and torchmetrics Metrics
        self.hidden: set[str] = set()  # published names logged with logger=False
        self.no_suffix: set[str] = set()  # published names logged with add_dataloader_idx=False
        self.aliases: dict[str, str] = {}  # name_step/name_epoch -> name, for callback_metrics

    def log(self, name: str, value: Any, prog_bar: bool = False, batch_size: int | None = None, **options: Any) -> None:
        """Record ``value`` in this sink (``log_metric`` records into the current one)."""
        previous = set_sink(self)
        try:
            log_metric(name, value, prog_bar=prog_bar, batch_size=batch_size, **options)
        finally:
            set_sink(previous)

    def first_log(
        self, name: str, value: Any, prog_bar: bool, logger: bool | None, on_step: bool | None, on_epoch: bool | None,
        reduce_fx: Any, add_dataloader_idx: bool, rank_zero_only: bool, metric_attribute: str | None = None,
    ) -> "_Series | None":
        """A name's first value in this sink, or any value of a name that is not a plain running
        mean: its options are read (once), and the series to add to is returned, or None when
        the value was taken here (``reduce_fx`` sum/max/min, a Metric)."""
        reduced = self._reduced.get(name)
        if reduced is not None:
            reduced.add(name, value)
            return None
        kind = first_kind(name, value, add_dataloader_idx, reduce_fx, metric_attribute, logger)
        logger = logger is not False  # None: Lightning's default, True unless given
        steps = self.training and not self.epoch_end  # Lightning's defaults: a step value, else an epoch value
        opts = options_for(name, steps, logger, on_step, on_epoch, add_dataloader_idx, rank_zero_only)
        if opts is None and (kind != "mean" or self.epoch_end):  # published under its own name, as the hook's
            # default: in training_step a step value only (Lightning's on_step=True, on_epoch=False, whatever
            # reduce_fx), elsewhere an epoch value
            step_name, epoch_name = (name, None) if steps else (None, name)
            opts = LogOptions(step_name, epoch_name, logger, rank_zero_only, add_dataloader_idx)
        if opts is not None:
            opts.kind = kind
            self._register(name, opts)
        if kind != "mean":
            reduced = self._reduced[name] = Reduced(kind, prog_bar)
            if prog_bar:
                self.prog_bar.update(n for n in (opts.step_name, opts.epoch_name) if n is not None)
            reduced.add(name, value)
            return None
        series = self._new_series(name, value, prog_bar)
        if prog_bar and opts is not None:
            self.prog_bar.discard(name)
            self.prog_bar.update(n for n in (opts.step_name, opts.epoch_name) if n is not None)
        return series

    def _register(self, name: str, opts: LogOptions) -> None:
        self.options[name] = opts
        published = [n for n in (opts.step_name, opts.epoch_name) if n is not None]
        if not opts.logger:
            self.hidden.update(published)
        if not opts.suffix:
            self.no_suffix.update(published)
        if opts.alias:
            self.aliases.update((n, name) for n in published)

    def open_epoch_end(self) -> "MetricSink":
        """Before ``on_train_epoch_end``: what the hooks log are epoch values (Lightning's defaults
        there), each batch counting once. A name logged there that training_step logged as a step
        value only starts afresh, as Lightning keeps each hook's values apart: its epoch-end value
        is the one published under its name (the step's stays in the step's row)."""
        self.batch_size, self.epoch_end = 1, True
        if self.training:
            step_only = [n for n in self._series if self.options.get(n) is None or self.options[n].epoch_name is None]
            for name in step_only:
                del self._series[name]
        return self

    def reset_metrics(self) -> None:
        """After the phase's end hooks: the torchmetrics Metrics logged in it are reset (Lightning's)."""
        for reduced in self._reduced.values():
            reduced.reset()

    def version(self) -> tuple[Any, ...]:
        """Changes whenever a value is logged: epoch-end hooks are asked whether they logged."""
        series = tuple((name, len(s.values), s.weight, id(self.latest.get(name))) for name, s in self._series.items())
        return series + tuple((name, id(r.last), r.total, id(r.metric)) for name, r in self._reduced.items())

    def _new_series(self, name: str, value: Any, prog_bar: bool) -> _Series:
        # Checked once per name, so the per-step path stays a dict lookup and an append.
        if not isinstance(name, str) or not name:
            raise TypeError(f"self.log(name={name!r}): name must be a non-empty string.")
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise _not_scalar(name, value)
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise not_a_number(name, value)
        series = self._series[name] = _Series(prog_bar)
        if prog_bar:
            self.prog_bar.add(name)
        return series

    def merge_replicas(self, sinks: list["MetricSink"]) -> None:
        """Fold the sinks of one step's DataParallel replicas into this one: each name any
        replica logged, as the mean of what the replicas that logged it logged, weighted by
        the batch sizes they logged with (their chunk's size unless ``self.log(batch_size=)``)."""
        names = dict.fromkeys(name for sink in sinks for name in sink.latest)  # every replica's, in order
        for name in names:
            series = [sink._series[name] for sink in sinks if name in sink._series]
            for s in series:
                s.collapse()
            weight = sum(s.weight for s in series)
            device = next((s.total.device for s in series if isinstance(s.total, torch.Tensor)), None)
            total = sum(s.total.to(device) if isinstance(s.total, torch.Tensor) else s.total for s in series)
            if weight:
                value = total / weight
            else:  # logged with batch_size=0 everywhere: the plain mean of the values
                latest = [torch.as_tensor(sink.latest[name]) for sink in sinks if name in sink.latest]
                value = sum(v.to(latest[0].device) for v in latest) / len(latest)
            self.log(name, value, prog_bar=any(s.prog_bar for s in series), batch_size=weight)

    def state_dict(self) -> dict[str, Any]:
        """The values logged so far, as CPU tensors: a mid-epoch checkpoint carries them so that
        the resumed epoch's means (and whatever monitors them) come out as if never stopped.
        Device values not yet folded in stay separate, so saving changes no rounding."""
        series = {
            name: {
                "total": torch.as_tensor(s.total, dtype=torch.float64).detach().cpu(),
                "weight": s.weight,
                "values": torch.stack([v.detach().to("cpu", torch.float64).reshape(()) for v in s.values])
                if s.values else torch.zeros(0, dtype=torch.float64),
                "weights": list(s.weights),
                "prog_bar": s.prog_bar,
            }
            for name, s in self._series.items()
        }
        latest = {name: torch.as_tensor(v).detach().to("cpu", torch.float64) for name, v in self.latest.items()}
        # self.log's keywords of the names that have a series (sum/max/min and Metrics start the epoch's rest afresh)
        options = {name: vars(opts).copy() for name, opts in self.options.items() if name in self._series}
        return {"series": series, "latest": latest, "options": options}

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        """Put back ``state_dict()``: as floats on the CPU, as float64 tensors on ``device`` elsewhere."""
        on_cpu = device.type == "cpu"
        for name, saved in state["series"].items():
            series = self._series[name] = _Series(saved["prog_bar"])
            series.weight = saved["weight"]
            if on_cpu:
                series.total = float(saved["total"])
                for value, weight in zip(saved["values"].tolist(), saved["weights"]):
                    series.total += value * weight
                    series.weight += weight
            else:
                series.total = saved["total"].to(device)
                series.values = list(saved["values"].to(device).unbind())
                series.weights = list(saved["weights"])
            if saved["prog_bar"]:
                self.prog_bar.add(name)
        self.latest.update({n: float(v) if on_cpu else v.to(device) for n, v in state["latest"].items()})
        for name, saved in state.get("options", {}).items():
            self._register(name, LogOptions(**saved))
        self.on_device = self.on_device or not on_cpu

    def latest_floats(self) -> dict[str, float]:
        """The most recent value of each name, as floats (syncs with the device once), under the
        names ``self.log``'s options publish them (``<name>_step`` with on_step and on_epoch)."""
        latest = dict(self.latest)
        if self.on_device:
            on_device = [n for n, v in latest.items() if isinstance(v, torch.Tensor)]
            if on_device:
                values = torch.stack([latest[n].to(torch.float64).reshape(()).cpu() for n in on_device]).tolist()
                latest.update(zip(on_device, values))
            latest = {n: float(v) for n, v in latest.items()}
        if self.options:
            for name, opts in self.options.items():
                value = latest.pop(name, None)
                if name in self._reduced:
                    value = self._reduced[name].step_value()
                if opts.step_name is not None and value is not None:
                    latest[opts.step_name] = value
        return latest

    def epoch_means(self, reduce: Reducer | None = None) -> dict[str, float]:
        """Batch-size-weighted means of everything logged, reduced across processes."""
        parts: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        local: dict[str, float] = {}  # rank_zero_only, max, min, Metrics (which sync themselves): not reduced here
        sums: set[str] = set()
        options = self.options
        for name, series in self._series.items():
            opts = options.get(name) if options else None
            if opts is None and self.training or opts is not None and opts.epoch_name is None:
                continue  # training_step's defaults have no epoch value (Lightning's on_epoch=False)
            series.collapse()
            total = torch.as_tensor(series.total, dtype=torch.float64).reshape(())
            weight = torch.tensor(series.weight, dtype=torch.float64)
            if opts is None:
                parts[name] = (total, weight)
            elif opts.local:
                local[opts.epoch_name] = float(total) / float(weight) if float(weight) > 0 else math.nan
            else:
                parts[opts.epoch_name] = (total, weight)
        for name, reduced in self._reduced.items():
            opts = options[name]
            if opts.epoch_name is None:
                continue
            value = reduced.epoch_value()
            if reduced.kind == "sum" and not opts.local:  # summed over the processes too
                parts[opts.epoch_name] = (torch.tensor(value, dtype=torch.float64), torch.ones((), dtype=torch.float64))
                sums.add(opts.epoch_name)
            elif value is not None:
                local[opts.epoch_name] = value
        if reduce is not None:
            parts = reduce(parts)
        means = {}
        for name, (total, weight) in sorted(parts.items()):
            w = float(weight)
            means[name] = float(total) if name in sums else float(total) / w if w > 0 else math.nan
        means.update(local)
        return means

    def for_callbacks(self, values: dict[str, float]) -> dict[str, float]:
        """``values`` plus, for a name logged with both on_step and on_epoch, the plain name."""
        if not self.aliases:
            return values
        return {**values, **{self.aliases[n]: v for n, v in values.items() if n in self.aliases}}

    def for_logger(self, values: dict[str, float]) -> dict[str, float]:
        """``values`` without those logged with ``logger=False``."""
        hidden = self.hidden
        return {n: v for n, v in values.items() if n not in hidden} if hidden else values


def log_metric(
    name: str, value: Any, prog_bar: bool = False, logger: bool | None = None, on_step: bool | None = None,
    on_epoch: bool | None = None, reduce_fx: Any = "mean", enable_graph: bool = False, sync_dist: bool = False,
    sync_dist_group: Any = None, add_dataloader_idx: bool = True, batch_size: int | None = None,
    metric_attribute: str | None = None, rank_zero_only: bool = False,
) -> None:
    """Record a scalar in the current step's sink: what ``TrainModule.log`` is.

    One function, not a method calling the sink's: it runs for every value on every step, where each call can cost up to
    a microsecond (benchmarks/overhead.py). Lightning's keywords are read at a name's first value in a phase
    (``MetricSink.first_log``), not on each call. Values are always detached (``enable_graph`` has nothing to keep) and
    always reduced over the processes (``sync_dist`` is always on; ``sync_dist_group`` is the world).
    """
    sink = getattr(_local, "sink", None)
    if sink is None:
        error = outside(name)
        if error is None:  # no Trainer has the module (a step called on its own): warned, nothing recorded
            return
        raise error
    series = sink._series.get(name)
    if series is None:
        series = sink.first_log(
            name, value, prog_bar, logger, on_step, on_epoch, reduce_fx, add_dataloader_idx, rank_zero_only,
            metric_attribute)
        if series is None:  # taken there (reduce_fx sum/max/min, a Metric)
            return
    elif prog_bar != series.prog_bar and not sink.epoch_end:  # Lightning's: one name, one set of keywords
        raise logged_twice(name)
    weight = sink.batch_size if batch_size is None else batch_size
    if weight is None:  # training with a dataloader_iter step: the loop never sees its batches
        raise no_batch_size(name)
    if type(value) is _TENSOR and value.is_cpu:  # the usual case first, with the fewest checks
        number = value.tolist()  # a number, like item(), at a quarter of detach().item()'s cost
        if type(number) is not float:
            number = _one_float(name, value, number)
    elif isinstance(value, torch.Tensor):
        if value.is_cpu:  # a Tensor subclass
            number = _one_float(name, value, value.tolist())
        else:  # kept as a tensor: reading it would wait for the device
            if value.numel() != 1:
                raise _not_scalar(name, value)
            sink.on_device = True
            sink.latest[name] = value = value.detach()
            series.values.append(value)
            series.weights.append(weight)
            if len(series.values) >= _COLLAPSE_AT:
                series.collapse()
            return
    else:
        number = float(value)
    sink.latest[name] = number
    series.total += number * weight
    series.weight += weight


_TENSOR = torch.Tensor  # a module global: one lookup, where torch.Tensor is two


def _one_float(name: str, tensor: torch.Tensor, listed: Any) -> float:
    """``tensor.tolist()`` as a float: an int or bool tensor's value, or the one element of a
    tensor of shape (1,) or (1, 1). Anything with more (or fewer) elements is refused."""
    while type(listed) is list:
        if len(listed) != 1:
            raise _not_scalar(name, tensor)
        listed = listed[0]
    return float(listed)


_not_scalar = not_scalar


def grad_norm(
    module: torch.nn.Module, norm_type: float | int | str, group_separator: str = "/"
) -> dict[str, torch.Tensor]:
    """The ``norm_type`` norm of each parameter's gradient, and of all of them together, under
    Lightning's keys: ``grad_2.0_norm/<parameter>`` and ``grad_2.0_norm_total``. Parameters
    without a gradient are left out. For ``self.log_dict`` in ``on_before_optimizer_step``."""
    try:
        p = float(norm_type)
    except (TypeError, ValueError):
        p = -1.0
    if not p > 0:
        raise ValueError(f"`norm_type` must be a positive number or 'inf' (infinity norm). Got {norm_type}. "
                         f"grad_norm(norm_type={norm_type!r}): e.g. 2 for the L2 norm.")
    norms = {
        f"grad_{p}_norm{group_separator}{name}": param.grad.detach().norm(p)
        for name, param in module.named_parameters()
        if param.grad is not None
    }
    if norms:
        norms[f"grad_{p}_norm_total"] = torch.stack([n.float() for n in norms.values()]).norm(p)
    return norms
