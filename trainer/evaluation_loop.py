"""The evaluation loop: validation (also inside fit), test and predict."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from .data import batch_size, loader_length
from .metrics import MetricSink, set_sink

if TYPE_CHECKING:
    from .trainer import Trainer

_STEP = {"validation": "validation_step", "test": "test_step", "predict": "predict_step"}


def evaluation_loop(trainer: Trainer, phase: str, loader: Any, limit: int | float | None) -> list[Any] | None:
    """Run ``phase`` ("validation", "test" or "predict") over ``loader``; predict's outputs, else None.

    The order of events::

        every rank takes rank 0's buffers (BatchNorm statistics); model.eval(), torch.no_grad()
        on_{phase}_start, on_{phase}_epoch_start
        for each batch (up to the limit):
            on_{phase}_batch_start
            output = strategy.run_step("{phase}_step")
            on_{phase}_batch_end
        on_{phase}_epoch_end                       # the model's hook may self.log epoch values
        epoch means of self.log values -> logged_metrics, callback_metrics
        on_{phase}_end
        every module's train/eval mode restored

    The training counters (``global_step``, ``current_epoch``) are read, never changed.
    """
    model, hooks, strategy = trainer.module, trainer._hooks, trainer.strategy
    step_name = _STEP[phase]
    n = limited(loader_length(loader), limit)
    # A rank whose shard is empty (fewer samples than ranks) still joins the metric reduction.
    if n == 0 and (limit == 0 or strategy.world_size == 1):
        return [] if phase == "predict" else None
    strategy.broadcast_buffers()
    modes = [m.training for m in model.modules()]
    model.eval()
    sink = MetricSink()
    previous_sink = set_sink(sink)
    outputs: list[Any] = []
    try:
        hooks.call(f"on_{phase}_start", trainer, model)
        hooks.call(f"on_{phase}_epoch_start", trainer, model)
        batch_start, batch_end = getattr(hooks, f"on_{phase}_batch_start"), getattr(hooks, f"on_{phase}_batch_end")
        with torch.no_grad():
            for batch_idx, batch in enumerate(loader):
                if batch_idx >= n:
                    break
                sink.batch_size = batch_size(batch)
                for fn in batch_start:
                    fn(trainer, model, batch, batch_idx)
                out = strategy.run_step(step_name, batch, batch_idx)
                if phase == "predict":
                    outputs.append(out)
                for fn in batch_end:
                    fn(trainer, model, out, batch, batch_idx)
        sink.batch_size = 1  # a value logged in an epoch-end hook is one value per process
        hooks.call(f"on_{phase}_epoch_end", trainer, model)
        trainer.logged_metrics = sink.epoch_means(strategy.reduce_metrics)
        trainer.callback_metrics.update(trainer.logged_metrics)
        trainer.prog_bar_names |= sink.prog_bar
        hooks.call(f"on_{phase}_end", trainer, model)
    finally:
        set_sink(previous_sink)
        for m, mode in zip(model.modules(), modes):
            m.training = mode
    return outputs if phase == "predict" else None


def limited(n: int | None, limit: int | float | None) -> int | float:
    """How many batches to run: the loader's length (inf if unsized) cut by a count or fraction limit."""
    total = math.inf if n is None else n
    if limit is None:
        return total
    if isinstance(limit, float):
        return total if total == math.inf else max(1, int(total * limit))
    return min(total, limit)


def validation_every(interval: int | float | None, num_batches: int | float) -> int:
    """Batches between mid-epoch validations (0: none), from ``val_check_interval``."""
    if interval is None:
        return 0
    if isinstance(interval, float):
        return 0 if num_batches == math.inf else max(1, int(num_batches * interval))
    return interval
