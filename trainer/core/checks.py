"""Argument checks that turn bad input into one clear sentence."""

from __future__ import annotations

import math
import os
import sys
import warnings
from typing import Any, Iterable

import torch
from torch import nn

from trainer.core.exceptions import PossibleUserWarning, misconfigured
from trainer.core.module import TrainModule, overridden


# The folders of trainer, strategies and callbacks: a warning about an option points past them.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_PACKAGES = tuple(
    os.path.join(_ROOT, name) + os.sep
    for name in ("trainer", "strategies", "callbacks")
)


def user_stacklevel() -> int:
    """``warnings.warn(..., stacklevel=user_stacklevel())`` points at the first line outside
    these packages, e.g. the user's ``Trainer(...)``, however deep the call that warns."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGES):
        frame, level = frame.f_back, level + 1
    return level


def suggest(value: str, choices: Iterable[str]) -> str:
    """' Did you mean 'x'?' for the closest choice (typo distance), or ''."""
    value = str(value).lower()
    scored = sorted(
        (score, abs(len(c) - len(value)), c)
        for c in choices
        if (score := _score(value, c.lower())) <= max(1, min(len(value), len(c)) // 2)
    )
    return f" Did you mean {scored[0][2]!r}?" if scored else ""


def _score(value: str, choice: str) -> int:
    # A typo of the whole name, or of a prefix ('bf16' for 'bf16-mixed', 'ddp_spawn' for 'ddp').
    n = min(len(value), len(choice))
    return min(_distance(value, choice), _distance(value[:n], choice[:n]) + 1)


def _distance(a: str, b: str) -> int:
    """Edit distance counting a swap of neighbours as one edit ('dpp' -> 'ddp' is 1)."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[-1]


# Each check raises a MisconfigurationException (a ValueError; for a wrong type also a TypeError),
# with ``lightning``, Lightning's own sentence for that setting, first when it has one.
def positive_int(
    name: str, value: Any, *, allow_none: bool = False, minimum: int = 1, lightning: str = ""
) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        ending = " or None." if allow_none else "."
        raise misconfigured(f"{name}={value!r} must be an int >= {minimum}" + ending, lightning, True)
    if value < minimum:
        ending = " (or None)." if allow_none else "."
        raise misconfigured(f"{name}={value!r} must be >= {minimum}" + ending, lightning)
    return value


def positive_number(name: str, value: Any, *, allow_none: bool = True, lightning: str = "") -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        ending = " or None." if allow_none else "."
        raise misconfigured(f"{name}={value!r} must be a positive number" + ending, lightning, True)
    if not value > 0 or value != value or value == float("inf"):
        ending = " (or None)." if allow_none else "."
        raise misconfigured(f"{name}={value!r} must be a finite number > 0" + ending, lightning)
    return value


def one_of(name: str, value: Any, choices: tuple[str, ...], lightning: str = "") -> str:
    if value not in choices:
        valid = ", ".join(repr(c) for c in choices)
        raise misconfigured(f"Unknown {name}={value!r}. Valid: {valid}.{suggest(str(value), choices)}", lightning)
    return value


def flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise misconfigured(f"{name}={value!r} must be True or False.", type_error=True)
    return value


def instances_of(name: str, values: list[Any], kind: type, kind_name: str, example: str = "", hint: str = "") -> None:
    """Each of ``values`` is a ``kind`` instance: a class passed in its place, or anything else,
    is a TypeError naming the argument (``callbacks=[...]``, ``logger=[...]``)."""
    for v in values:
        if isinstance(v, type) and issubclass(v, kind):
            raise TypeError(f"{name} contains the class {v.__name__}, not an instance: pass {v.__name__}({example}).")
        if not isinstance(v, kind):
            raise TypeError(f"{name} contains {v!r:.80}, which is not a {kind_name}{hint}.")


def loss_of(output: Any, none_skips: bool = False) -> torch.Tensor | None:
    """The loss in a training step's non-tensor output. ``None`` with ``none_skips`` (automatic
    optimization): Lightning's skipped step, with its warning; the caller runs no backward."""
    if isinstance(output, dict) and isinstance(output.get("loss"), torch.Tensor):
        return output["loss"]
    if output is None and none_skips:
        warnings.warn("`training_step` returned `None`. If this was on purpose, ignore this warning...", stacklevel=3)
        return None
    raise TypeError(
        f"training_step returned {type(output).__name__} {output!r:.80}; it must return the loss as a "
        "scalar tensor, or a dict with a 'loss' tensor."
    )


def none_batch(loader: str, batch_idx: int, step: str, err: BaseException) -> TypeError:
    """The error for a step that failed on a batch of None: which loader, which batch, what the
    step received, and the step's own error (asked only once the step has failed)."""
    return TypeError(
        f"{loader} yielded None as batch {batch_idx}, so {step} received batch=None (batch_idx={batch_idx}) "
        f"and raised {type(err).__name__}: {err}. The Dataset's __getitem__ or the DataLoader's collate_fn "
        "returned None: make it return the sample, or drop the bad samples in a collate_fn."
    )


def bad_loss(loss: torch.Tensor) -> ValueError | None:
    """Why backward() refused ``loss``, in the user's terms; None if the loss was not the problem.

    Asked only after backward() failed, so that a good loss costs no checks on every step.
    """
    if loss.ndim and loss.numel() != 1:
        return ValueError(
            f"training_step returned a loss of shape {tuple(loss.shape)}; it must be a scalar. "
            "Reduce it, e.g. loss.mean()."
        )
    if not loss.requires_grad:
        return ValueError(
            "training_step returned a loss that does not require grad, so backward() cannot train "
            "anything. Compute it from the model's outputs, and don't call .detach(), .item() or "
            "torch.no_grad() on the way."
        )
    return None


def non_finite_loss(step: int, epoch: int) -> FloatingPointError:
    return FloatingPointError(
        f"The training loss is not finite (nan or inf) at step {step} (epoch {epoch}). Lower the learning "
        "rate, clip gradients (gradient_clip_val=...), or add callbacks.NaNGuard(action='skip') to skip such steps."
    )


def _fraction_or_count(name: str, value: Any, of: str, minimum: int) -> int | float | None:
    """None, a float fraction in (0, 1] ([0, 1] when a count may be 0: 0.0 is none), or an int count >= ``minimum``."""
    if value is None:
        return None
    lightning = f"You have passed invalid value {value} for {name}, it has to be in [0.0, 1.0] or an int."
    if isinstance(value, float):
        low = 0.0 if minimum == 0 else math.ulp(0.0)
        if not low <= value <= 1.0:
            span = "[0, 1]" if minimum == 0 else "(0, 1]"
            raise misconfigured(
                f"{name}={value!r}: a float is a fraction of the {of} in {span}; an int is a count.", lightning
            )
        return value
    negative = isinstance(value, int) and value < 0
    return positive_int(name, value, minimum=minimum, lightning=lightning if negative else "")


def interval(name: str, value: Any) -> int | float | None:
    return _fraction_or_count(name, value, "epoch", minimum=1)


def limit(name: str, value: Any, allow_zero: bool = True) -> int | float | None:
    return _fraction_or_count(name, value, "batches", minimum=0 if allow_zero else 1)


def fast_dev_run_batches(value: Any) -> int:
    """``fast_dev_run``: False -> 0, True -> 1, or a count of batches."""
    if value is True or value is False:
        return int(value)
    if isinstance(value, int) and value >= 0:
        return value
    raise misconfigured(
        f"fast_dev_run={value!r} must be True (one batch of each loader), False, or a number of batches >= 1.",
        f"fast_dev_run={value!r} is not a valid configuration. It should be >= 0." if isinstance(value, int) else "",
        type_error=not isinstance(value, int),
    )


def compile_options(value: Any) -> dict[str, Any] | None:
    """``Trainer(compile=...)``: False, True, or ``torch.compile``'s keyword arguments as a dict."""
    if value is False or value is None:
        return None
    if value is True:
        return {}
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        unknown = set(value) - {"fullgraph", "dynamic", "backend", "mode", "options", "disable"}
        if unknown:
            raise ValueError(
                f"compile={value!r}: unknown keys {sorted(unknown)}. torch.compile takes fullgraph, dynamic, "
                "backend, mode, options and disable."
            )
        _check_compile_values(value)
        return dict(value)
    raise TypeError(
        f"compile={value!r} must be True, False, or torch.compile's keyword arguments as a dict, "
        "e.g. compile=dict(mode='max-autotune')."
    )


def _check_compile_values(value: dict[str, Any]) -> None:
    """What torch.compile checks only when the first batch runs (a RuntimeError or a bare
    AttributeError minutes in), checked when the Trainer is built: the CLI then exits 2."""
    kinds = {"fullgraph": (bool,), "disable": (bool,), "dynamic": (bool, type(None)), "mode": (str, type(None)),
             "options": (dict, type(None))}
    for key, types in kinds.items():
        if key in value and not isinstance(value[key], types):
            allowed = " or ".join("None" if t is type(None) else t.__name__ for t in types)
            raise TypeError(f"compile={value!r}: {key!r} must be {allowed}, got {value[key]!r}.")
    backend = value.get("backend", "inductor")
    if not (isinstance(backend, str) or callable(backend)):
        raise TypeError(f"compile={value!r}: 'backend' must be a backend's name or a callable, got {backend!r}.")
    if value.get("mode") is not None and value.get("options") is not None:
        raise ValueError(f"compile={value!r}: torch.compile takes 'mode' or 'options', not both.")
    if isinstance(backend, str) and backend != "inductor":
        import torch._dynamo  # where used: a second or more to import

        names = torch._dynamo.list_backends(exclude_tags=())
        if backend not in names:
            raise ValueError(f"compile={value!r}: unknown backend {backend!r}. Valid: {names}.")
    if backend == "inductor" and (value.get("mode") is not None or value.get("options")):
        import torch._inductor

        modes = list(torch._inductor.list_mode_options())
        if value.get("mode") is not None and value["mode"] not in modes:
            raise ValueError(f"compile={value!r}: unknown mode {value['mode']!r}. Valid: {modes}.")
        unknown = sorted(set(value.get("options") or {}) - set(torch._inductor.list_options()))
        if unknown:
            raise ValueError(
                f"compile={value!r}: unknown options {unknown}; torch._inductor.list_options() lists the valid ones."
            )


def check_model(model: Any, needs_training_step: bool = True) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (subclass trainer.TrainModule); got {type(model).__name__}.")
    lightning = (  # Lightning's sentences first, as its tests match them
        f"`model` must be a `LightningModule` or `torch._dynamo.OptimizedModule`, got `{type(model).__name__}`."
        if not isinstance(model, TrainModule) else "No `training_step()` method defined. Lightning `Trainer` expects "
        "as minimum a `training_step()`, `train_dataloader()` and `configure_optimizers()` to be defined."
    )
    if needs_training_step and not callable(getattr(model, "training_step", None)):
        raise misconfigured(
            f"{type(model).__name__} has no training_step. Subclass trainer.TrainModule and define "
            "training_step(self, batch, batch_idx).", lightning, type_error=True,
        )
    if (needs_training_step and isinstance(model, TrainModule)
            and type(model).training_step is TrainModule.training_step):
        message = f"{type(model).__name__} does not define training_step(self, batch, batch_idx)."
        raise misconfigured(message, lightning, type_error=True)


def check_eval_model(model: Any, stage: str) -> None:
    """``validate``, ``test`` and ``predict`` need the model's step (``predict_step`` defaults to
    ``forward``): Lightning's sentence first, then ours."""
    step = {"validate": "validation_step", "test": "test_step", "predict": "predict_step"}[stage]
    name = type(model).__name__
    ours = f"trainer.{stage}() needs {name}.{step}(self, batch, batch_idx)."
    if not isinstance(model, TrainModule):
        lightning = f"`model` must be a `LightningModule` or `torch._dynamo.OptimizedModule`, got `{name}`."
    elif stage == "predict":
        lightning = "`predict_step` cannot be None to run `Trainer.predict`"
        no_forward = not callable(getattr(model, "forward", None)) or type(model).forward is nn.Module.forward
        if callable(getattr(model, step, None)) and not overridden(model, step) and no_forward:
            raise misconfigured(
                f"{ours} Its default calls forward, which {name} lacks.",
                "`Trainer.predict` requires `forward` method to run.", True,
            )
    else:
        lightning = f"No `{step}()` method defined to run `Trainer.{stage}`."
    if not callable(getattr(model, step, None)):
        raise misconfigured(ours, lightning, type_error=True)


# Lightning's: what barebones=True turns off, or refuses to turn on, and why (each a ValueError when asked for).
_BAREBONES_OFF = {
    "enable_checkpointing": "Checkpointing", "logger": "Logging", "enable_progress_bar": "The progress bar",
    "log_every_n_steps": "Logging", "enable_model_summary": "Model summary", "num_sanity_val_steps": "Sanity checking",
    "fast_dev_run": "", "detect_anomaly": "Anomaly detection", "profiler": "Profiling",
}


def check_barebones(o: dict[str, Any]) -> None:
    """``Trainer(barebones=True)`` with an option it turns off (given as anything but off or None) is
    Lightning's ``ValueError``, in its words."""
    for name, what in _BAREBONES_OFF.items():
        value = o[name]
        if value is None or value is False or (name != "logger" and isinstance(value, (int, float)) and value == 0):
            continue
        why = (f"{what} can impact raw speed so it is disabled in barebones mode." if what else
               "Development run is not meant for raw speed evaluation so it is disabled in barebones mode.")
        raise ValueError(f"`Trainer(barebones=True, {name}={value!r})` was passed. {why} Drop one of the two.")


def warn_eval_modules(model: nn.Module) -> None:
    """Lightning's warning at the start of training: submodules left in eval mode (a frozen
    BatchNorm, say) stay so while the rest trains, which is often, not always, a mistake."""
    frozen = [name for name, module in model.named_modules() if not module.training]
    if frozen:
        warnings.warn(
            f"Found {len(frozen)} module(s) in eval mode at the start of training. This may lead to unexpected "
            f"behavior during training. If this is intentional, you can ignore this warning. ({', '.join(frozen[:5])}"
            f"{', ...' if len(frozen) > 5 else ''})", PossibleUserWarning, stacklevel=user_stacklevel(),
        )
