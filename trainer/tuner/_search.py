"""What both searches share: a throwaway copy of the Trainer that writes nothing, the state put
back afterwards (weights, RNG, loaders' generators), and the attribute a search updates."""

from __future__ import annotations

import contextlib
import copy
import gc
import logging
from typing import TYPE_CHECKING, Any, Iterator

import torch

from trainer.profilers import PassThroughProfiler
from trainer.data.rng import generator_states, rng_state, set_generator_states, set_rng_state

if TYPE_CHECKING:
    from trainer.trainer import Trainer


def search_trainer(
    trainer: Trainer, callbacks: list[Any], steps: int, method: str = "fit", limit_train: bool = False,
) -> Trainer:
    """A copy of ``trainer`` that runs ``steps`` optimizer steps of fit (``limit_train``: of as
    many batches), or ``steps`` batches of another ``method``, with only ``callbacks``: no bar,
    logger, checkpoints, summary or profiler, no sanity check, no validation. ``copy.copy`` gives
    it its own options and no run (fresh counters and metrics), so its options are set through
    the Trainer's public names; the user's Trainer, its callbacks and its counters are not touched."""
    search = copy.copy(trainer)
    search.callbacks, search.loggers = list(callbacks), []
    search.profiler = PassThroughProfiler()  # a search records nothing
    search.default_root_dir, search.enable_checkpointing, search.enable_progress_bar = None, False, False
    search.enable_model_summary, search.num_sanity_val_steps, search.fast_dev_run = False, 0, 0
    search.limit_val_batches, search.val_check_interval = 0, None
    if method == "fit":
        search.max_epochs, search.max_steps = None, steps
        if limit_train:
            search.limit_train_batches = steps
    elif method == "validate":
        search.limit_val_batches = steps
    elif method == "test":
        search.limit_test_batches = steps
    else:
        search.limit_predict_batches = steps
    return search


@contextlib.contextmanager
def quiet_fit() -> Iterator[None]:
    """The search's own fits say nothing (each would log its strategy line); the search logs its steps."""
    logger = logging.getLogger("trainer")
    level = logger.level
    logger.setLevel(max(level, logging.WARNING))
    try:
        yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def leaves_no_trace(model: torch.nn.Module, *loaders: Any, attach: Trainer | None = None) -> Iterator[None]:
    """Everything a search changes is put back on the way out, error or not: the model's
    weights and buffers (copied on their device), each module's train/eval mode, the model's
    trainer, every RNG, and the generators of the loaders given. ``attach``: the model leaves
    attached to that Trainer (the user's), as after Lightning's tuner, whose search runs on it:
    ``model.logger`` is then the Trainer's logger."""
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    modes = [m.training for m in model.modules()]
    owner = getattr(model, "_trainer", None)
    rng = rng_state()
    generators = [generator_states(loader) for loader in loaders]
    try:
        yield
    finally:
        with torch.no_grad():
            model.load_state_dict(weights)
        for m, mode in zip(model.modules(), modes):
            m.training = mode
        if attach is not None and hasattr(type(model), "trainer"):
            model.trainer = attach  # the module's public setter: its TrainModule children too
        else:
            model._trainer = owner
        set_rng_state(rng)
        for loader, states in zip(loaders, generators):
            set_generator_states(loader, states)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def holders(model: Any, datamodule: Any, name: str) -> list[tuple[Any, str]]:
    """Where attribute ``name`` lives: ``(obj, "attr")`` for the model or DataModule attribute,
    ``(dict, "key")`` for their ``hparams``; every place that has it (they must agree)."""
    found: list[tuple[Any, str]] = []
    for owner in (model, datamodule):
        if owner is None:
            continue
        hparams = getattr(owner, "hparams", None)
        if name in vars(owner) or isinstance(getattr(type(owner), name, None), property):
            found.append((owner, "attr"))
        if isinstance(hparams, dict) and name in hparams:
            found.append((hparams, "key"))
    return found


def set_value(places: list[tuple[Any, str]], name: str, value: Any) -> None:
    for owner, kind in places:
        if kind == "key":
            owner[name] = value
        else:
            setattr(owner, name, value)


def get_value(places: list[tuple[Any, str]], name: str) -> Any:
    owner, kind = places[0]
    return owner[name] if kind == "key" else getattr(owner, name)


def is_out_of_memory(err: BaseException) -> bool:
    """torch's out-of-memory error (CUDA, MPS, XPU), or a RuntimeError that says it ran out."""
    if isinstance(err, torch.OutOfMemoryError):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and ("out of memory" in text or "CUBLAS_STATUS_ALLOC_FAILED" in text)
