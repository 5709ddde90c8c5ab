"""ModelSummary: what the model holds, printed once at the start of fit."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from trainer.core.checks import positive_int
from trainer.core.summary import ModelSummary as Summary
from trainer.core.summary import format_summary_table

from .base import Callback

if TYPE_CHECKING:
    from trainer import Trainer, TrainModule

log = logging.getLogger("trainer")


class ModelSummary(Callback):
    """At ``on_fit_start``, global rank 0 logs Lightning's summary table (``trainer.core.summary``):
    each submodule down to ``max_depth`` (1: the top-level ones, -1: all; 0 prints nothing) with
    its type, parameters, mode and FLOPs, then the trainable, non-trainable and total counts,
    the size in MB and how many modules are in train and eval mode. With
    ``model.example_input_array`` set, one forward pass (in eval mode, without gradients) adds
    each row's input and output shapes. On by default; ``Trainer(enable_model_summary=False)``
    turns it off. Override :meth:`summarize` to show it elsewhere (it gets the table's columns
    and totals, as Lightning's does).
    """

    def __init__(self, max_depth: int = 1, **summarize_kwargs: Any) -> None:
        self._max_depth = positive_int("ModelSummary(max_depth)", max_depth, minimum=-1)
        self._summarize_kwargs = summarize_kwargs

    @property
    def max_depth(self) -> int:
        return self._max_depth

    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if not self._max_depth:
            return
        if not trainer.is_global_zero:
            return
        # No example forward pass when parameters are sharded (fsdp): rank 0 alone would wait for the other ranks.
        summary = Summary(pl_module, self._max_depth, forward=not trainer.strategy.shards_parameters)
        self.summarize(
            summary._get_summary_data(), summary.total_parameters, summary.trainable_parameters, summary.model_size,
            summary.total_training_modes, total_flops=summary.total_flops, **self._summarize_kwargs,
        )

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]], total_parameters: int, trainable_parameters: int, model_size: float,
        total_training_modes: dict[str, int], total_flops: int, **summarize_kwargs: Any,
    ) -> None:
        """Log the table (Lightning's hook for showing it another way)."""
        table = format_summary_table(
            total_parameters, trainable_parameters, model_size, total_training_modes, total_flops, *summary_data
        )
        log.info("\n%s", table)
