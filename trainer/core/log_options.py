"""``self.log``'s Lightning keywords, kept off the per-step path.

A name logged with the defaults is a plain series (trainer/core/metrics.py): its step value
and its batch-size-weighted epoch mean. The keywords that change that are read once, at the
name's first ``self.log`` of a phase, into :class:`LogOptions`; they act when the values are read
(``latest_floats``, ``epoch_means``), once per logging step or epoch, not per call. Two kinds
of value cannot be a plain running mean, and take the slower :class:`Reduced` path on every
call: ``reduce_fx`` "sum", "max" or "min", and a torchmetrics ``Metric`` (updated by the user's
call, computed and reset at the epoch's end). Read back, the values are Lightning's tensors
(:class:`MetricsView`).
"""

from __future__ import annotations

import inspect
import sys
import warnings
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

import torch

from trainer.core.exceptions import MisconfigurationException, misconfigured

# reduce_fx: its names, and the functions Lightning accepts for them (torch's and Python's built-ins)
_REDUCE = {"mean": "mean", "avg": "mean", "sum": "sum", "max": "max", "min": "min"}
_REDUCE_FN = {
    torch.mean: "mean", torch.sum: "sum", torch.max: "max", torch.amax: "max", torch.min: "min", torch.amin: "min",
    sum: "sum", max: "max", min: "min",
}


@dataclass
class LogOptions:
    """What to publish of one logged name (the names it is published under included)."""

    step_name: str | None  # the step value's name; None: no step value
    epoch_name: str | None  # the epoch value's name; None: no epoch value
    logger: bool = True  # False: callback_metrics only, never the logger
    local: bool = False  # rank_zero_only: not reduced across processes
    suffix: bool = True  # add_dataloader_idx: "/dataloader_idx_N" with several loaders
    alias: bool = False  # both step and epoch: callback_metrics also gets the plain name
    kind: str = "mean"  # how its values combine: "mean", "sum", "max", "min" (reduce_fx) or "metric"


def reduce_name(name: str, reduce_fx: Any) -> str:
    kind = _REDUCE.get(reduce_fx.lower()) if isinstance(reduce_fx, str) else _REDUCE_FN.get(reduce_fx)
    if kind is None:
        raise misconfigured(
            f"self.log({name!r}, ..., reduce_fx={reduce_fx!r}): reduce_fx must be 'mean', 'sum', 'max' or 'min' "
            "(or torch.mean, torch.sum, torch.max, torch.min, or Python's sum, max, min).",
            "Only `self.log(..., reduce_fx={min,max,mean,sum})` are supported.",
        )
    return kind


def check_name(name: str, add_dataloader_idx: bool) -> None:
    """Not a non-empty string, or a name that already says its loader where the loop adds the
    suffix itself (Lightning's error)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"self.log(name={name!r}): name must be a non-empty string.")
    if add_dataloader_idx and "/dataloader_idx_" in name:
        raise misconfigured(
            f"self.log({name!r}, ...): with several loaders the loop appends '/dataloader_idx_<n>' itself; log "
            f"{name.split('/dataloader_idx_')[0]!r}, or pass add_dataloader_idx=False to keep your own name.",
            f"You called `self.log` with the key `{name}` but it should not contain information about "
            "`dataloader_idx` when `add_dataloader_idx=True`.",
        )


def is_metric(value: Any) -> bool:
    """A torchmetrics ``Metric`` (told by its methods: torchmetrics is not imported here)."""
    return (isinstance(value, torch.nn.Module) and callable(getattr(value, "compute", None))
            and callable(getattr(value, "reset", None)))


def first_kind(
    name: str, value: Any, add_dataloader_idx: bool, reduce_fx: Any, metric_attribute: str | None, logger: bool | None,
) -> str:
    """At a name's first value in a phase: the name and options checked, and how its values are kept:
    "metric" (a torchmetrics Metric), else ``reduce_fx``'s "mean", "sum", "max" or "min"."""
    check_name(name, add_dataloader_idx)
    if logger:  # given: Lightning warns when there is no logger to send it to
        trainer = getattr(_calling_module(), "_trainer", None)
        if trainer is not None and trainer.logger is None:
            warnings.warn(
                f"You called `self.log({name!r}, ..., logger=True)` but have no logger configured. You can enable one "
                "by doing `Trainer(logger=ALogger(...))`", UserWarning, stacklevel=5,
            )
    if not is_metric(value):
        return reduce_name(name, reduce_fx)
    if not metric_attribute:
        check_metric_attribute(name, value)
    return "metric"


def check_metric_attribute(name: str, metric: Any) -> None:
    """Lightning's rule for a torchmetrics Metric logged without ``metric_attribute``: it must be one
    of the module's attributes (its state is the module's, reset and saved with it). The module is
    the caller's ``self`` (read from the stack)."""
    module = _calling_module()
    if module is None:
        return
    names = {id(m): n for n, m in module.named_modules() if is_metric(m)}
    lightnings = "Could not find the `LightningModule` attribute for the `torchmetrics.Metric` logged."
    if not names:
        raise misconfigured(
            f"self.log({name!r}, metric): make the metric an attribute in __init__ (self.{name} = Accuracy(...)) "
            "and log that one.",
            f"{lightnings} You can fix this by setting an attribute for the metric in your `LightningModule`.",
        )
    if id(metric) not in names:
        raise misconfigured(
            f"self.log({name!r}, metric) got a metric that is none of the module's attributes: log one of them.",
            f"{lightnings} You can fix this by calling `self.log({name}, ..., metric_attribute=name)` where `name` "
            f"is one of {list(names.values())}",
        )


def _calling_module() -> torch.nn.Module | None:
    """The module whose code called ``self.log``: the first ``self`` up the stack that is a module
    (and not a Metric). Read only at a name's first value, where a check needs it."""
    frame = sys._getframe(2)
    for _ in range(8):
        if frame is None:
            return None
        own = frame.f_locals.get("self")
        if isinstance(own, torch.nn.Module) and not is_metric(own):
            return own
        frame = frame.f_back
    return None


def options_for(
    name: str, training: bool, logger: bool, on_step: bool | None, on_epoch: bool | None,
    add_dataloader_idx: bool, rank_zero_only: bool,
) -> LogOptions | None:
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
    return LogOptions(
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
                raise TypeError(
                    f"self.log({name!r}, value={value!r:.80}): {name!r} was logged with a Metric; "
                    "log the same Metric object each time."
                )
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
                    f"{tuple(out.shape)}; log a Metric that computes a scalar (e.g. average='micro'), "
                    "or log_dict its parts."
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
    lightnings = f"`self.log({name}, {tensor})` was called, but the tensor must have a single element."
    return ValueError(
        f"{lightnings} self.log({name!r}, value): value must be a scalar, got a tensor of shape {tuple(tensor.shape)}. "
        "Reduce it first, e.g. value.mean(), or log each element under its own name with self.log_dict."
    )


def no_batch_size(name: str) -> MisconfigurationException:
    """``self.log`` without ``batch_size`` while a ``training_step(self, dataloader_iter)`` trains."""
    return misconfigured(
        f"Pass the size of the batch the value stands for: self.log({name!r}, value, batch_size=len(batch)).",
        "With `def training_step(self, dataloader_iter)`, `self.log(..., batch_size=...)` should be provided.",
    )


def logged_twice(name: str) -> MisconfigurationException:
    """``self.log(name, ...)`` again in the same epoch with another ``prog_bar``: Lightning's error, naming the hook."""
    hook = next((f.function for f in inspect.stack(0)[2:8] if f.function.endswith("_step")
                 or f.function.startswith("on_") or f.function in _OTHER_HOOKS), "this hook")
    return misconfigured(
        f"self.log({name!r}, ...) got another prog_bar than at its first call this epoch: log a name with the "
        "same keywords each time, or log under another name.",
        f"You called `self.log({name}, ...)` twice in `{hook}` with different arguments. This is not allowed.",
    )


class UnloggableValue(TypeError, ValueError):
    """A value ``self.log`` cannot record: Lightning raises ValueError, and this project raised
    TypeError; it is both, so either ``except`` keeps working."""


def not_a_number(name: str, value: Any) -> UnloggableValue:
    hint = ""
    if isinstance(value, str):
        hint = " Strings are not logged: put text in the logger's own API, e.g. print or a file."
    lightnings = f"`self.log({name}, {value})` was called, but `{type(value).__name__}` values cannot be logged."
    return UnloggableValue(
        f"{lightnings} self.log({name!r}, value={value!r:.80}): value must be a number, a scalar tensor "
        f"or a torchmetrics Metric.{hint}"
    )


# The hooks not named on_*, for "You can't `self.log()` inside `setup`".
_OTHER_HOOKS = frozenset((
    "setup", "teardown", "prepare_data", "configure_model", "configure_optimizers", "configure_callbacks",
    "train_dataloader", "val_dataloader", "test_dataloader", "predict_dataloader", "transfer_batch_to_device",
    "lr_scheduler_step",
    "optimizer_step", "optimizer_zero_grad", "configure_gradient_clipping", "backward", "state_dict", "load_state_dict",
))


class LogOutsideError(MisconfigurationException, RuntimeError):
    """``self.log`` where Lightning refuses it (Lightning's ``MisconfigurationException``; a
    ``RuntimeError`` as this project raised before)."""


def outside(name: Any) -> LogOutsideError | None:
    """``self.log`` with no phase to log into. None when no Trainer has the module (Lightning's
    case of a step called on its own, as in a unit test: a warning, nothing recorded); else the
    error to raise, naming the hook."""
    from trainer.core.module import TrainModule  # (the module's file imports this one)

    module, where, hook = None, None, None
    for frame_info in inspect.stack()[2:10]:
        frame, function = frame_info.frame, frame_info.function
        own = frame.f_locals.get("self")
        if function in ("log", "log_dict", "log_metric"):
            continue
        # a module's or a callback's hook
        if where is None and (isinstance(own, torch.nn.Module) or hasattr(type(own), "state_key")):
            where = f"{type(own).__name__}.{function}"
        if hook is None and (function.startswith("on_") or function in _OTHER_HOOKS):
            hook = function
        if hook is None and function == "call" and isinstance(frame.f_locals.get("name"), str):  # the loops' hook call
            hook = frame.f_locals["name"]
        if module is None:
            module = own if isinstance(own, TrainModule) else next(
                (v for v in frame.f_locals.values() if isinstance(v, TrainModule)), None)
        if module is not None and hook is not None:
            break
    trainer = getattr(module, "_trainer", None)
    if trainer is None:
        warnings.warn(
            "You are trying to `self.log()` but the `self.trainer` reference is not registered on the model yet. "
            "This is most likely because the model hasn't been passed to the `Trainer`. "
            f"(self.log({name!r}, ...) recorded nothing.)",
            UserWarning, stacklevel=3,
        )
        return None
    running = trainer.state.status in ("running", "interrupted")
    lightnings = (f"You can't `self.log()` inside `{hook or 'this hook'}`." if running else
                  "You are trying to `self.log()` but it is not managed by the `Trainer` control flow.")
    if running and trainer.state.fn == "predict":
        lightnings = ("You are trying to `self.log()` but the loop's result collection is not registered yet. "
                      "This is most likely because you are trying to log in a `predict` hook, but it doesn't "
                      "support logging.")
    called = f" was called from {where}, where nothing is logged" if where else " was called outside a step"
    return LogOutsideError(
        f"{lightnings} self.log({name!r}, ...){called}. Call it from training_step, validation_step, test_step, "
        "or an on_*_batch_end/on_*_epoch_end hook (or on_train_start, ...), while the Trainer runs them."
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
