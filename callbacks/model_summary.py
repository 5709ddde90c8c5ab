"""ModelSummary and RichModelSummary: what the model holds, printed once when fit starts (logged, or drawn by rich)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from trainer.core.checks import positive_int
from trainer.core.summary import ModelSummary as Summary
from trainer.core.summary import format_summary_table, get_human_readable_count

from .base import Callback
from .progress.rich_progress import import_rich, require_rich

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
        strategy = trainer.strategy
        forward = not strategy.shards_parameters
        summary = Summary(pl_module, self._max_depth, forward=forward, precision=strategy.precision)
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


class RichModelSummary(ModelSummary):
    """:class:`ModelSummary`'s table drawn by rich on its console (``rich.get_console()``): the
    same rows, then the same totals in bold. The Trainer's default summary when rich is installed,
    as in Lightning. ``header_style`` (a summarize kwarg, default ``"bold magenta"``) styles the header.
    """

    def __init__(self, max_depth: int = 1, **summarize_kwargs: Any) -> None:
        require_rich("RichModelSummary", "`RichModelSummary` requires `rich` to be installed.")
        super().__init__(max_depth, **summarize_kwargs)

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]], total_parameters: int, trainable_parameters: int, model_size: float,
        total_training_modes: dict[str, int], total_flops: int, **summarize_kwargs: Any,
    ) -> None:
        """Print the table and the totals on rich's console."""
        import_rich()
        import rich
        from rich.table import Table

        right = {"Params", "Params per Device", "FLOPs", "In sizes", "Out sizes"}  # numbers and shapes
        table = Table(header_style=summarize_kwargs.get("header_style", "bold magenta"))
        for header, _ in summary_data:
            style = "dim" if header == " " else "white" if header in ("In sizes", "Out sizes") else None
            justify = "right" if header in right else "left"
            table.add_column(header, justify=justify, style=style, no_wrap=header == "Name")
        for row in zip(*(cells for _, cells in summary_data)):
            table.add_row(*row)
        console = rich.get_console()
        console.print(table)

        totals = Table.grid(expand=True)
        totals.add_column()
        for label, value in [
            ("Trainable params", get_human_readable_count(trainable_parameters)),
            ("Non-trainable params", get_human_readable_count(total_parameters - trainable_parameters)),
            ("Total params", get_human_readable_count(total_parameters)),
            ("Total estimated model params size (MB)", f"{model_size:,.3f}"),
            ("Modules in train mode", total_training_modes["train"]),
            ("Modules in eval mode", total_training_modes["eval"]),
            ("Total FLOPs", get_human_readable_count(total_flops)),
        ]:
            totals.add_row(f"[bold]{label}[/]: {value!s:<10}")
        console.print(totals)
