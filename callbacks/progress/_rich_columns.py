"""The columns of RichProgressBar's rows; imported when a rich bar first draws, so that importing the
callbacks never imports rich."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn
from rich.style import Style
from rich.text import Text

if TYPE_CHECKING:
    from .rich_progress import RichProgressBar, RichProgressBarTheme

__all__ = [
    "BarColumn",
    "BatchesProcessedColumn",
    "CustomTimeColumn",
    "MetricsTextColumn",
    "ProcessingSpeedColumn",
    "Progress",
    "TextColumn",
]


class BatchesProcessedColumn(ProgressColumn):
    """``3/10``; ``3/--`` for a loader of unknown length."""

    def __init__(self, style: str | Style) -> None:
        self.style = style
        super().__init__()

    def render(self, task: Task) -> Text:
        total = "--" if task.total is None else int(task.total)
        return Text(f"{int(task.completed)}/{total}", style=self.style)


class CustomTimeColumn(ProgressColumn):
    """``0:00:12 • 0:01:40``: elapsed, then left (``-:--:--`` while unknown)."""

    max_refresh = 0.5  # rendered twice a second at most: the seconds would flicker otherwise

    def __init__(self, style: str | Style) -> None:
        self.style = style
        super().__init__()

    def render(self, task: Task) -> Text:
        elapsed = task.finished_time if task.finished else task.elapsed
        left = task.time_remaining
        shown = ["-:--:--" if s is None else str(timedelta(seconds=int(s))) for s in (elapsed, left)]
        return Text(" • ".join(shown), style=self.style)


class ProcessingSpeedColumn(ProgressColumn):
    """``12.30it/s``: batches a second, over rich's recent window."""

    def __init__(self, style: str | Style) -> None:
        self.style = style
        super().__init__()

    def render(self, task: Task) -> Text:
        return Text(f"{task.speed or 0:.2f}it/s", style=self.style)


class MetricsTextColumn(ProgressColumn):
    """``loss: 0.123 v_num: 0``: the bar's ``get_metrics`` as of the last batch, epoch or validation
    end, on fit's training row only (empty on every other row, and during the sanity check)."""

    def __init__(self, bar: RichProgressBar, theme: RichProgressBarTheme) -> None:
        self._bar = bar
        self._style = theme.metrics
        self._delimiter = theme.metrics_text_delimiter
        self._format = theme.metrics_format
        self.metrics: dict[str, Any] = {}  # set by the bar in the training thread; read here when drawing
        super().__init__()

    def render(self, task: Task) -> Text:
        trainer = self._bar.trainer
        if trainer.state.fn != "fit" or trainer.sanity_checking or task.id != self._bar.train_progress_bar_id:
            return Text()
        return Text(self._delimiter.join(self._texts()), justify="left", style=self._style)

    def _texts(self) -> list[str]:
        texts = []
        for name, value in self.metrics.items():
            if not isinstance(value, str):
                try:
                    value = f"{value:{self._format}}"
                except (TypeError, ValueError):  # not a number (a dict, a version string...)
                    value = str(value)
            texts.append(f"{name}: {value}")
        return texts
