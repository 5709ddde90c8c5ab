"""The Trainer's options: Lightning's names and spellings, checked once, when it is built.

``configure`` turns ``Trainer(...)``'s arguments into :class:`TrainerOptions`, which the loops read
through the Trainer's attributes of the same names. The arguments of Lightning's Trainer that
this one does not take are answered in ``init_arguments.py``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, NamedTuple

import torch

from callbacks import Callback, ModelCheckpoint, ModelSummary, ProgressBar, RichModelSummary, RichProgressBar, Timer
from callbacks.progress import rich_available
from loggers import DummyLogger, Logger
from loggers.logger_argument import make_loggers
from strategies import Strategy, select_strategy
from strategies.precision import Precision, normalize_precision

from trainer.core.exceptions import PossibleUserWarning, misconfigured
from trainer.core.distributed import rank_zero_info, rank_zero_warn
from trainer.core.checks import (
    check_barebones, compile_options, fast_dev_run_batches, flag, interval, limit, one_of, positive_int,
    positive_number,
)
from trainer.loops.hooks import check_callbacks, lightning_order
from trainer.profilers import PassThroughProfiler, Profiler
from trainer.profilers.named import profiler_of

if TYPE_CHECKING:
    from trainer.trainer import Trainer


class _DefaultDir(str):
    """``log_dir``'s default, told apart from a ``log_dir="."`` that the user wrote."""


# The working directory when the Trainer is built, as Lightning's default_root_dir.
WORKING_DIR = _DefaultDir(".")

def root_dir(default_root_dir: Any, log_dir: Any) -> str | None:
    """Where runs go: Lightning's ``default_root_dir`` or its alias ``log_dir`` (``log_dir=None``:
    no logs, no run folder). ``default_root_dir=None`` is Lightning's "the default": the working
    directory when the Trainer is built, as an absolute path."""
    if default_root_dir is not None and log_dir is not WORKING_DIR:
        raise ValueError(
            f"default_root_dir={default_root_dir!r} and log_dir={log_dir!r} name the same folder: give only one "
            "(default_root_dir is Lightning's name; log_dir is its alias here)."
        )
    name, value = ("default_root_dir", default_root_dir) if default_root_dir is not None else ("log_dir", log_dir)
    if value is not None and not isinstance(value, (str, os.PathLike)):
        none = "turn logging off" if name == "log_dir" else "use the working directory"
        raise TypeError(f"{name}={value!r} must be a path (str or os.PathLike), or None to {none}.")
    if value is None:
        return None
    # Lightning's: "~" expanded, the path normalised ("runs/" is "runs")
    return os.getcwd() if isinstance(value, _DefaultDir) else os.path.normpath(os.path.expanduser(os.fspath(value)))


def loop_limits(max_epochs: Any, min_epochs: Any, max_steps: Any, min_steps: Any) -> tuple[Any, ...]:
    """(max_epochs, min_epochs, max_steps, min_steps, endless), with Lightning's values: max_steps=-1
    (its default; None too) is no step limit; max_epochs=-1 trains until something else (max_time,
    EarlyStopping, should_stop) ends it, and None is decided when fit starts (:func:`default_max_epochs`)."""
    endless = max_epochs == -1 and not isinstance(max_epochs, bool)
    max_epochs = -1 if endless else positive_int(
        "max_epochs", max_epochs, allow_none=True,
        lightning=f"`max_epochs` must be a non-negative integer or -1. You passed in {max_epochs}.",
    )
    max_steps = -1 if max_steps is None or max_steps == -1 and not isinstance(max_steps, bool) else positive_int(
        "max_steps", max_steps,
        lightning=f"`max_steps` must be a non-negative integer or -1 (infinite steps). You passed in {max_steps}.",
    )
    min_epochs = positive_int("min_epochs", min_epochs, allow_none=True, minimum=0)
    min_steps = positive_int("min_steps", min_steps, allow_none=True, minimum=0)
    for low, high, what in ((min_epochs, max_epochs, "epochs"), (min_steps, max_steps, "steps")):
        if low is not None and high not in (None, -1) and low > high:
            raise ValueError(f"min_{what}={low} is more than max_{what}={high}: training cannot do both.")
    return max_epochs, min_epochs, max_steps, min_steps, endless


def max_time_seconds(max_time: Any) -> float | None:
    """``max_time``: None, "DD:HH:MM:SS", a ``timedelta``, a dict of ``timedelta``'s arguments, or seconds."""
    if max_time is None:
        return None
    try:
        return Timer(max_time).duration
    except ValueError:
        raise ValueError(
            f"max_time={max_time!r} must be a 'DD:HH:MM:SS' string such as '00:12:00:00' (12 hours), a "
            "datetime.timedelta, a dict such as dict(hours=12), or seconds."
        ) from None


# Lightning's signature gives these None, meaning its default: a config that writes every
# argument out (``precision: null``) means the same here.
_NONE_IS_DEFAULT = {
    "precision": "32-true", "num_sanity_val_steps": 2, "log_every_n_steps": 50, "enable_checkpointing": True,
    "enable_progress_bar": True, "enable_model_summary": True,
    "overfit_batches": 0, "reload_dataloaders_every_n_epochs": 0, "accumulate_grad_batches": 1,
}


@dataclass
class TrainerOptions:
    """``Trainer(...)``'s arguments, checked: what the loops read. The Trainer's attribute of each
    name reads and sets this object's (``trainer.max_epochs`` is ``options.max_epochs``)."""

    max_epochs: int | None = None
    min_epochs: int | None = None
    max_steps: int | None = None
    min_steps: int | None = None
    _endless: bool = False  # max_epochs=-1: until something else ends it
    precision: str = "32-true"
    accumulate_grad_batches: int = 1
    gradient_clip_val: float | None = None
    gradient_clip_algorithm: str | None = None  # Lightning's: None clips by norm, and clip_gradients may choose
    check_val_every_n_epoch: int | None = 1
    val_check_interval: int | float | None = None
    log_every_n_steps: int = 50
    default_root_dir: str | None = None
    name: str = "lightning_logs"
    enable_progress_bar: bool = True
    enable_checkpointing: bool = True
    limit_train_batches: int | float | None = None
    limit_val_batches: int | float | None = None
    limit_test_batches: int | float | None = None
    limit_predict_batches: int | float | None = None
    seed: int | None = None
    deterministic: bool | str = False
    _optimizer_factory: Callable[..., Any] | None = None  # Trainer(optimizer=...)
    num_sanity_val_steps: int = 2
    enable_model_summary: bool = True
    batched_fetching: bool = True
    data_on_device: bool = False
    compile: dict[str, Any] | None = None
    benchmark: bool | None = None
    detect_anomaly: bool = False
    inference_mode: bool = True
    reload_dataloaders_every_n_epochs: int = 0
    overfit_batches: int | float = 0
    fast_dev_run: int = 0
    num_nodes: int = 1
    sync_batchnorm: bool = False
    use_distributed_sampler: bool = True
    callbacks: list[Callback] = field(default_factory=list)  # the given ones, then the built-in ones
    profiler: Profiler = field(default_factory=PassThroughProfiler)  # PassThroughProfiler: nothing recorded


class Configured(NamedTuple):
    """What ``configure`` builds: the options, and the strategy and loggers they name."""

    options: TrainerOptions
    strategy: Strategy
    loggers: list[Logger]


def configure(o: dict[str, Any]) -> Configured:
    """Check ``Trainer(...)``'s arguments ``o``; build the callbacks, profiler, strategy and loggers."""
    t = TrainerOptions()
    if flag("barebones", o["barebones"]):
        check_barebones(o)
    o = {k: _NONE_IS_DEFAULT[k] if v is None and k in _NONE_IS_DEFAULT else v for k, v in o.items()}
    t.max_epochs, t.min_epochs, t.max_steps, t.min_steps, t._endless = loop_limits(
        o["max_epochs"], o["min_epochs"], o["max_steps"], o["min_steps"]
    )
    t.precision = normalize_precision(o["precision"])
    t.accumulate_grad_batches = positive_int("accumulate_grad_batches", o["accumulate_grad_batches"])
    clip_val = o["gradient_clip_val"]
    if clip_val is not None and (isinstance(clip_val, bool) or not isinstance(clip_val, (int, float))):
        raise TypeError(f"`gradient_clip_val` should be an int or a float. Got {clip_val}. "
                        f"gradient_clip_val={clip_val!r}: pass a positive number, e.g. 1.0, or None for no clipping.")
    # 0 is Lightning's "no clipping" too (its precision plugins skip a value <= 0)
    t.gradient_clip_val = clip_val if clip_val == 0 else positive_number("gradient_clip_val", clip_val)
    algorithm = o["gradient_clip_algorithm"]
    t.gradient_clip_algorithm = None if algorithm is None else one_of(
        "gradient_clip_algorithm", algorithm, ("norm", "value"),
        lightning=f"`gradient_clip_algorithm` {algorithm} is invalid. Allowed algorithms: ['value', 'norm'].",
    )
    every = o["check_val_every_n_epoch"]
    t.check_val_every_n_epoch = positive_int(
        "check_val_every_n_epoch", every, allow_none=True,
        lightning="" if isinstance(every, int) else f"`check_val_every_n_epoch` should be an integer, found {every!r}.",
    )
    if isinstance(o["val_check_interval"], (str, dict)) or hasattr(o["val_check_interval"], "total_seconds"):
        raise ValueError(
            f"val_check_interval={o['val_check_interval']!r}: a time-based interval is not supported. Give a fraction "
            "of the epoch (0.25) or a number of batches (1000); callbacks.Timer bounds the whole run's time."
        )
    t.val_check_interval = interval("val_check_interval", o["val_check_interval"])
    if t.check_val_every_n_epoch is None and isinstance(t.val_check_interval, float):
        raise misconfigured(
            f"val_check_interval={t.val_check_interval!r} is a fraction of an epoch, and check_val_every_n_epoch=None "
            "validates across epochs: pass a number of batches (val_check_interval=1000).",
            "`val_check_interval` should be an integer or a time-based duration "
            "(str 'DD:HH:MM:SS', datetime.timedelta, or dict kwargs for timedelta) "
            "when `check_val_every_n_epoch=None`.",
        )
    t.log_every_n_steps = positive_int("log_every_n_steps", o["log_every_n_steps"])
    t.default_root_dir = root_dir(o["default_root_dir"], o["log_dir"])
    name = o["name"]
    if not isinstance(name, str) or not name or os.sep in name or name in (".", ".."):
        raise (ValueError if isinstance(name, str) else TypeError)(
            f"name={name!r} names the run folder: a non-empty string without {os.sep!r}, and not '.' or '..'."
        )
    t.name = name
    t.enable_progress_bar = flag("enable_progress_bar", o["enable_progress_bar"])
    t.enable_checkpointing = flag("enable_checkpointing", o["enable_checkpointing"])
    t.limit_train_batches = limit("limit_train_batches", o["limit_train_batches"])
    t.limit_val_batches = limit("limit_val_batches", o["limit_val_batches"])
    t.limit_test_batches = limit("limit_test_batches", o["limit_test_batches"])
    t.limit_predict_batches = limit("limit_predict_batches", o["limit_predict_batches"])
    seed = o["seed"]
    if seed is not None and positive_int("seed", seed, minimum=0) >= 2**32:
        raise ValueError(f"seed={seed!r} must be < 2**32 (the range numpy's and torch's generators accept).")
    t.seed = seed
    det = o["deterministic"]  # Lightning's True, False, None (False) or "warn" (warn_only)
    t.deterministic = det if det == "warn" else False if det is None else flag("deterministic", det)
    optimizer = o["optimizer"]
    if optimizer is not None and not callable(optimizer):
        raise TypeError(
            f"optimizer={optimizer!r} must be a callable that takes the parameters, "
            "e.g. optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3)."
        )
    t._optimizer_factory = optimizer
    t.num_sanity_val_steps = positive_int("num_sanity_val_steps", o["num_sanity_val_steps"], minimum=-1)
    t.enable_model_summary = flag("enable_model_summary", o["enable_model_summary"])
    t.batched_fetching = flag("batched_fetching", o["batched_fetching"])  # trainer/data/fetch.py says when it applies
    t.data_on_device = flag("data_on_device", o["data_on_device"])
    if t.data_on_device and not t.batched_fetching:
        raise ValueError(
            "data_on_device=True indexes each TensorDataset on the device, one call per batch, which is "
            "batched fetching; it needs batched_fetching=True (the default)."
        )
    t.compile = compile_options(o["compile"])  # None, or torch.compile's keyword arguments
    if o["benchmark"] is not None:
        flag("benchmark", o["benchmark"])
    t.benchmark = o["benchmark"]
    t.detect_anomaly = flag("detect_anomaly", o["detect_anomaly"])
    t.inference_mode = flag("inference_mode", o["inference_mode"])
    reload = o["reload_dataloaders_every_n_epochs"]
    t.reload_dataloaders_every_n_epochs = positive_int(
        "reload_dataloaders_every_n_epochs", reload, minimum=0,
        lightning=f"`reload_dataloaders_every_n_epochs` should be an int >= 0, got {reload}.",
    )
    t.profiler = profiler_of(o["profiler"])
    max_time = max_time_seconds(o["max_time"])
    t.overfit_batches = limit("overfit_batches", o["overfit_batches"])
    for name in ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches",
                 "overfit_batches", "val_check_interval"):
        tell_whole(name, o[name])
    if t.overfit_batches:  # train and validate on the same first batches, in order
        t.limit_train_batches = t.limit_val_batches = t.overfit_batches
    if o["barebones"]:  # Lightning's: everything that costs time per run, off
        t.default_root_dir, t.enable_checkpointing = None, False
        t.enable_progress_bar, t.enable_model_summary = False, False
        t.num_sanity_val_steps = 0
    n = fast_dev_run_batches(o["fast_dev_run"])
    t.fast_dev_run = True if n == 1 else n  # Lightning's: 1 reads back as True
    if n:  # n batches of each loader, one epoch, nothing written
        t.max_epochs, t.max_steps, t.num_sanity_val_steps, max_time = 1, -1, 0, None
        t.limit_train_batches = t.limit_val_batches = t.limit_test_batches = t.limit_predict_batches = n
        t.check_val_every_n_epoch, t.val_check_interval = 1, None
        t.default_root_dir, t.enable_checkpointing = None, False  # the bar and the summary stay, as in Lightning
    strategy = select_strategy(o["strategy"], o["devices"], o["accelerator"], o["num_nodes"], Precision(t.precision))
    # accelerator=None is auto: the CPU when CUDA is not there
    on_cpu = strategy.accelerator == "cpu" or strategy.accelerator is None and not torch.cuda.is_available()
    if t.precision == "16-mixed" and on_cpu:  # Lightning's: the CPU runs bf16 AMP instead
        rank_zero_warn("You passed `Trainer(accelerator='cpu', precision='16-mixed')` "
                       "but AMP with fp16 is not supported on CPU. Using `precision='bf16-mixed'` instead.")
        t.precision = "bf16-mixed"
        strategy.precision = Precision(t.precision)
    t.num_nodes = o["num_nodes"]
    t.sync_batchnorm = flag("sync_batchnorm", o["sync_batchnorm"])
    strategy.sync_batchnorm = t.sync_batchnorm or strategy.sync_batchnorm
    t.use_distributed_sampler = flag("use_distributed_sampler", o["use_distributed_sampler"])
    strategy.use_distributed_sampler = t.use_distributed_sampler
    callbacks, legacy = split_loggers(o["callbacks"])  # a TensorBoardLogger passed as a callback, as before loggers/
    given_logger = o["logger"]
    if t.fast_dev_run:  # Lightning's: a stand-in that writes nothing, where a logger was asked for
        empty = given_logger is False or isinstance(given_logger, (list, tuple)) and not given_logger
        loggers: list[Logger] = [] if empty else [DummyLogger()]
    else:
        loggers = make_loggers(given_logger, legacy, t.default_root_dir, t.name)
    given = check_callbacks(callbacks)
    check_bars(given, o["enable_progress_bar"])
    if o["enable_checkpointing"] is False and any(isinstance(cb, ModelCheckpoint) for cb in given):
        raise misconfigured(
            "Drop the ModelCheckpoint from callbacks, or leave enable_checkpointing at True.",
            "Trainer was configured with `enable_checkpointing=False` but found `ModelCheckpoint` in callbacks list.",
        )
    t.callbacks = lightning_order(given + default_callbacks(t, given, max_time))
    return Configured(t, strategy, loggers)



def check_bars(given: list[Callback], enabled: Any) -> None:
    """Lightning's: one progress bar at most, and none when ``enable_progress_bar=False``."""
    bars = [cb for cb in given if isinstance(cb, ProgressBar)]
    if len(bars) > 1:
        raise misconfigured(
            f"callbacks holds {len(bars)} progress bars ({', '.join(type(b).__name__ for b in bars)}): keep one.",
            "You added multiple progress bar callbacks to the Trainer, "
            "but currently only one progress bar is supported.",
        )
    if bars and enabled is False:
        raise misconfigured(
            "Drop the bar from callbacks, or enable_progress_bar=False.",
            f"Trainer was configured with `enable_progress_bar=False` "
            f"but found `{type(bars[0]).__name__}` in callbacks list.",
        )


def default_callbacks(t: TrainerOptions, given: list[Callback], max_time: float | None) -> list[Callback]:
    """The built-ins, except those the user passed configured (e.g. ``ProgressBar(refresh_s=1)``):
    two bars would both draw, and two checkpointers would write the same files. A
    Timer given in ``callbacks`` wins over ``max_time``, as in Lightning."""

    def wanted(kind: type) -> bool:
        return not any(isinstance(cb, kind) for cb in given)

    extra: list[Callback] = []
    if max_time is not None and wanted(Timer):
        extra.append(Timer(max_time))
    elif max_time is not None:
        rank_zero_info("Ignoring `Trainer(max_time=...)`, callbacks list already contains a Timer.")
    rich = (t.enable_progress_bar or t.enable_model_summary) and rich_available()  # Lightning's: rich's, when installed
    if t.enable_progress_bar and wanted(ProgressBar):
        extra.append(RichProgressBar() if rich else ProgressBar())
    if t.enable_checkpointing and wanted(ModelCheckpoint):
        extra.append(ModelCheckpoint())
    if t.enable_model_summary and wanted(ModelSummary):
        extra.append(RichModelSummary() if rich else ModelSummary())
    return extra


def tell_whole(name: str, value: Any) -> None:
    """Lightning's line for a limit of ``1`` (one batch) or ``1.0`` (all of them), which read alike."""
    if isinstance(value, bool) or value not in (1, 1.0):
        return
    train, val_check = name == "limit_train_batches", name == "val_check_interval"
    if isinstance(value, int):
        said = ("1 batch per epoch will be used." if train else "validation will run after every batch."
                if val_check else "1 batch will be used.")
    else:
        said = ("100% of the batches per epoch will be used." if train
                else "validation will run at the end of the training epoch." if val_check
                else "100% of the batches will be used.")
    rank_zero_info(f"`Trainer({name}={value})` was configured so {said}")


def default_max_epochs(t: Trainer) -> None:
    """Lightning's: a fit with neither ``max_epochs`` nor ``max_steps`` (nor a Timer or ``max_time``)
    trains 1000 epochs, and says so; with one of those, ``max_epochs`` unset reads -1 (endless:
    they end it), as in Lightning."""
    timed = any(isinstance(cb, Timer) for cb in t.callbacks)
    if t.max_epochs is None and (t.max_steps not in (None, -1) or timed):
        t.max_epochs = -1
    if t.max_epochs is None and not t._endless:
        rank_zero_warn(
            "`max_epochs` was not set. Setting it to 1000 epochs. "
            "To train without an epoch limit, set `max_epochs=-1`.",
            PossibleUserWarning, stacklevel=5,  # the caller of fit
        )
        t.max_epochs = 1000


def check_weights_only(weights_only: Any) -> None:
    """Lightning's ``weights_only=`` of fit/validate/test/predict. This trainer's checkpoints hold
    only tensors and plain data, so they are always loaded with ``torch.load(weights_only=True)``
    and no pickled code runs; the argument is accepted and changes nothing."""
    if weights_only is not None and not isinstance(weights_only, bool):
        raise TypeError(f"weights_only={weights_only!r} must be True, False or None.")


def split_loggers(callbacks: Any) -> tuple[Any, list[Logger]]:
    """Loggers passed in ``callbacks`` (``callbacks.TensorBoardLogger(flush_secs=...)`` was a
    callback before the loggers package) are taken out: they replace the default logger."""
    if callbacks is None or isinstance(callbacks, (Callback, str, bytes)) or not hasattr(callbacks, "__iter__"):
        return callbacks, []
    callbacks = list(callbacks)
    return [cb for cb in callbacks if not isinstance(cb, Logger)], [cb for cb in callbacks if isinstance(cb, Logger)]
