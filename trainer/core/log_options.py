"""``self.log``'s Lightning keywords, kept off the per-step path.

A name logged with the defaults is a plain series (trainer/core/metrics.py): its step value
and its batch-size-weighted epoch mean. The keywords that change that are read once, at the
name's first ``self.log`` of a phase, into :class:`Options`; they act when the values are read
(``latest_floats``, ``epoch_means``), once per logging step or epoch, not per call. Two kinds
of value cannot be a plain running mean, and take the slower :class:`Reduced` path on every
call: ``reduce_fx`` "sum", "max" or "min", and a torchmetrics ``Metric`` (updated by the user's
call, computed and reset at the epoch's end). Read back, the values are Lightning's tensors
(:class:`MetricsView`).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

import torch

from trainer.core.exceptions import misconfigured

# reduce_fx: its names, and the functions Lightning accepts for them (torch's and Python's built-ins)
_REDUCE = {"mean": "mean", "avg": "mean", "sum": "sum", "max": "max", "min": "min"}
_REDUCE_FN = {
    torch.mean: "mean", torch.sum: "sum", torch.max: "max", torch.amax: "max", torch.min: "min", torch.amin: "min",
    sum: "sum", max: "max", min: "min",
}


@dataclass
class Options:
    """What to publish of one logged name (the names it is published under included)."""

    step_name: str | None  # the step value's name; None: no step value
    epoch_name: str | None  # the epoch value's name; None: no epoch value
    logger: bool = True  # False: callback_metrics only, never the logger
    local: bool = False  # rank_zero_only: not reduced across processes
    suffix: bool = True  # add_dataloader_idx: "/dataloader_idx_N" with several loaders
    alias: bool = False  # both step and epoch: callback_metrics also gets the plain name


def reduce_name(name: str, reduce_fx: Any) -> str:
    kind = _REDUCE.get(reduce_fx.lower()) if isinstance(reduce_fx, str) else _REDUCE_FN.get(reduce_fx)
    if kind is None:
        raise ValueError(
            f"self.log({name!r}, ..., reduce_fx={reduce_fx!r}): reduce_fx must be 'mean', 'sum', 'max' or 'min' "
            "(or torch.mean, torch.sum, torch.max, torch.min, or Python's sum, max, min)."
        )
    return kind


def is_metric(value: Any) -> bool:
    """A torchmetrics ``Metric`` (told by its methods: torchmetrics is not imported here)."""
    return isinstance(value, torch.nn.Module) and callable(getattr(value, "compute", None)) and callable(getattr(value, "reset", None))


def options_for(
    name: str, training: bool, logger: bool, on_step: bool | None, on_epoch: bool | None,
    add_dataloader_idx: bool, rank_zero_only: bool,
) -> Options | None:
    """The options for ``name``, or None for a plain series (a default ``self.log`` call).

    Lightning's defaults per hook: in ``training_step`` ``on_step=True, on_epoch=False``; in the
    evaluation steps and every epoch-end hook ``on_step=False, on_epoch=True``.
    """
    for flag, given in (("on_step", on_step), ("on_epoch", on_epoch)):
        if given is not None and not isinstance(given, bool):
            raise TypeError(f"self.log({name!r}, ..., {flag}={given!r}): {flag} must be True, False or None.")
    if training:
        plain = on_step in (None, True) and on_epoch is None
        step, epoch = on_step is not False, on_epoch if on_epoch is not None else on_step is False
    else:  # evaluation: one value per loader, the mean of its steps
        plain = on_step in (None, False) and on_epoch in (None, True)
        step, epoch = bool(on_step), on_epoch is not False
    if plain and logger and add_dataloader_idx and not rank_zero_only:
        return None
    if not step and not epoch:
        raise misconfigured(
            f"self.log({name!r}, ..., on_step=False, on_epoch=False) records nothing: set on_step=True "
            "(every step) or on_epoch=True (the epoch's mean), or both.",
            "`self.log(on_step=False, on_epoch=False)` is not useful.",
        )
    both = step and epoch  # in evaluation too: the step values are the loggers' rows per batch (Lightning's)
    return Options(
        f"{name}_step" if both else name if step else None,
        f"{name}_epoch" if both else name if epoch else None,
        logger, rank_zero_only, add_dataloader_idx, both,
    )


class Reduced:
    """A name logged with ``reduce_fx`` "sum", "max" or "min", or with a torchmetrics Metric."""

    __slots__ = ("kind", "metric", "total", "last", "computed", "prog_bar")

    def __init__(self, kind: str, prog_bar: bool) -> None:
        self.kind = kind  # "sum", "max", "min" or "metric"
        self.metric: Any = None
        self.total: float | None = None
        self.last: Any = None  # the step value
        self.computed: float | None = None
        self.prog_bar = prog_bar

    def add(self, name: str, value: Any) -> None:
        if self.kind == "metric":
            if not is_metric(value):
                raise TypeError(f"self.log({name!r}, value={value!r:.80}): {name!r} was logged with a Metric; log the same Metric object each time.")
            self.metric = value
            self.last = getattr(value, "_forward_cache", None)
            return
        number = scalar(name, value)
        self.last = number
        if self.total is None:
            self.total = number
        elif self.kind == "sum":
            self.total += number
        else:
            self.total = max(self.total, number) if self.kind == "max" else min(self.total, number)

    def step_value(self) -> float | None:
        last = self.last
        if isinstance(last, torch.Tensor):
            return float(last.detach().float().reshape(-1)[0]) if last.numel() == 1 else None
        return last

    def epoch_value(self) -> float | None:
        """The epoch's value: the sum, max or min; a Metric's ``compute()``. The Metric is reset by
        :meth:`reset`, after the epoch-end hooks (Lightning's order): their ``compute()`` sees the epoch."""
        if self.kind != "metric":
            return self.total
        if self.computed is None and self.metric is not None:
            out = self.metric.compute()
            if isinstance(out, torch.Tensor) and out.numel() != 1:
                raise ValueError(
                    f"self.log(..., {type(self.metric).__name__}): its compute() returned a tensor of shape "
                    f"{tuple(out.shape)}; log a Metric that computes a scalar (e.g. average='micro'), or log_dict its parts."
                )
            self.computed = float(out)
        return self.computed


    def reset(self) -> None:
        """The phase is over (its epoch-end hooks ran): a Metric starts the next one afresh."""
        if self.metric is not None:
            self.metric.reset()
        self.computed = None


def scalar(name: str, value: Any) -> float:
    """``value`` as a float, or a sentence naming the ``self.log`` call."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise not_scalar(name, value)
        return float(value.detach().reshape(()).item())
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise not_a_number(name, value)
    return float(value)


def not_scalar(name: str, tensor: torch.Tensor) -> ValueError:
    return ValueError(
        f"self.log({name!r}, value): value must be a scalar, got a tensor of shape {tuple(tensor.shape)}. "
        "Reduce it first, e.g. value.mean(), or log each element under its own name with self.log_dict."
    )


class UnloggableValue(TypeError, ValueError):
    """A value ``self.log`` cannot record: Lightning raises ValueError, and this project raised
    TypeError; it is both, so either ``except`` keeps working."""


def not_a_number(name: str, value: Any) -> UnloggableValue:
    hint = " Strings are not logged: put text in the logger's own API, e.g. print or a file." if isinstance(value, str) else ""
    lightnings = f"`self.log({name}, {value})` was called, but `{type(value).__name__}` values cannot be logged."
    return UnloggableValue(
        f"{lightnings} self.log({name!r}, value={value!r:.80}): value must be a number, a scalar tensor or a torchmetrics "
        f"Metric.{hint}"
    )


def outside(name: Any) -> RuntimeError:
    """``self.log`` with no phase to log into: say which hook called it."""
    where = None
    for frame_info in inspect.stack()[2:8]:
        own = frame_info.frame.f_locals.get("self")
        if frame_info.function not in ("log", "log_dict", "log_metric") and own is not None and isinstance(own, torch.nn.Module):
            where = f"{type(own).__name__}.{frame_info.function}"
            break
    called = f" was called from {where}, where nothing is logged" if where else " was called outside a step"
    return RuntimeError(
        f"self.log({name!r}, ...){called}. Call it from training_step, validation_step, test_step, "
        "predict_step, or an on_*_batch_end/on_*_epoch_end hook, while the Trainer runs them."
    )


class MetricsView(MutableMapping):
    """``trainer.callback_metrics`` and ``logged_metrics`` as Lightning gives them: each value a
    0-d tensor (``.item()`` works), over the run's dict of floats (what the loop and the built-in
    callbacks use). Writes go to that dict."""

    __slots__ = ("_values",)

    def __init__(self, values: dict[str, Any]) -> None:
        self._values = values

    def __getitem__(self, name: str) -> torch.Tensor:
        value = self._values[name]
        return value if isinstance(value, torch.Tensor) else torch.tensor(value, dtype=torch.get_default_dtype())

    def __setitem__(self, name: str, value: Any) -> None:
        self._values[name] = value

    def __delitem__(self, name: str) -> None:
        del self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def copy(self) -> dict[str, torch.Tensor]:
        return dict(self.items())

    def numbers(self) -> dict[str, Any]:
        """The values as the loop keeps them (Python floats, in float64): what the built-in
        callbacks compare, so that a decision never turns on a float32 rounding."""
        return self._values

    def __repr__(self) -> str:
        return repr(self.copy())
