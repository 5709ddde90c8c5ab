"""RichProgressBar: Lightning's progress bar drawn with rich, its theme, and whether rich is here."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import random
import sys
import time
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import torch

from trainer.core.checks import flag, positive_int

from ..base import Callback
from .tqdm_progress import ProgressBar

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, Task, TaskID
    from rich.style import Style

    from trainer import Trainer, TrainModule

RICH_REQUIREMENT = "rich>=13.0"  # the oldest rich these classes are tested against; pyproject's extra says the same


def rich_available() -> bool:
    """Whether rich (13 or later) can be imported here, without importing it: Lightning's condition
    for making its rich bar and summary the Trainer's defaults."""
    if importlib.util.find_spec("rich") is None:  # None too when sys.modules["rich"] is None (hidden)
        return False
    return _installed_major() >= 13


@lru_cache(maxsize=1)  # reading the installed packages' metadata takes milliseconds: once per process
def _installed_major() -> int:
    try:
        major = importlib.metadata.version("rich").split(".")[0]
    except importlib.metadata.PackageNotFoundError:  # importable without metadata (a vendored copy): take it
        return 13
    return int(major) if major.isdigit() else 0


def import_rich() -> None:
    """Import rich with Python's global ``random`` generator left where it was. ``rich.style`` draws
    its first style id from it (``random.getrandbits``) when imported, which would shift every later
    number a run draws, and a resumed run imports rich at another point: no bit-exact resume."""
    if "rich.style" in sys.modules:
        return
    state = random.getstate()
    try:
        import rich.style  # noqa: F401
    finally:
        random.setstate(state)


def __getattr__(name: str) -> Any:
    if name == "Progress":  # rich's, which Lightning's module imports: a renamed test patches Progress.update here
        import_rich()
        from rich.progress import Progress

        return Progress
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def require_rich(name: str, lightning_words: str) -> None:
    """Lightning's ModuleNotFoundError for a rich class built where rich is missing or too old."""
    if not rich_available():
        raise ModuleNotFoundError(
            f"{lightning_words} Install it by running `pip install -U rich` (or `pip install 'steadytrainer[rich]'`): "
            f"{name} needs {RICH_REQUIREMENT!r}. Without rich, TQDMProgressBar and ModelSummary do the same job."
        )


@dataclass
class RichProgressBarTheme:
    """The styles of the bar's parts, as rich style strings or ``rich.style.Style``
    (https://rich.readthedocs.io/en/stable/style.html): ``description`` ("Epoch 0/2", "Validation"),
    ``progress_bar`` while it fills, ``progress_bar_finished``, ``progress_bar_pulse`` (a loader of
    unknown length), ``batch_progress`` ("3/10"), ``time`` (elapsed and left), ``processing_speed``
    ("12.30it/s") and ``metrics``; the metrics are joined by ``metrics_text_delimiter`` and numbers
    shown with ``metrics_format``. Lightning's defaults."""

    description: str | Style = ""
    progress_bar: str | Style = "#6206E0"
    progress_bar_finished: str | Style = "#6206E0"
    progress_bar_pulse: str | Style = "#6206E0"
    batch_progress: str | Style = ""
    time: str | Style = "dim"
    processing_speed: str | Style = "dim underline"
    metrics: str | Style = "italic"
    metrics_text_delimiter: str = " "
    metrics_format: str = ".3f"


class RichProgressBar(ProgressBar):
    """Lightning's rich progress bar: during fit one bar per training epoch ("Epoch 1/4") with the
    batches done, elapsed and remaining time, speed and the metrics (``get_metrics``: the logger's
    ``v_num`` and the ``prog_bar=True`` values), one per validation run and one for the sanity
    check, which are hidden when they end; one bar per loader for validate, test and predict.

    ``refresh_rate``: redraws per second at most (redrawn on the batch ends, no thread), 0 turns the bar
    off. ``leave=True`` keeps each epoch's bar on screen; by default one bar is reused. ``theme``: a
    :class:`RichProgressBarTheme`. ``console_kwargs``: arguments for rich's ``Console`` (the global
    one, reconfigured when a stage starts, as Lightning does), such as ``{"file": f, "record": True}``.
    Without a terminal, rich prints each stage's bars once, when the stage ends. Global rank 0 only.

    The Trainer's default bar when rich is installed (else the tqdm one), as in Lightning. A
    ProgressBar subclass, so that Lightning's ``isinstance(cb, ProgressBar)`` finds it; it overrides
    every hook the tqdm bar draws in.
    """

    def __init__(
        self, refresh_rate: int = 100, leave: bool = False, theme: RichProgressBarTheme | None = None,
        console_kwargs: dict[str, Any] | None = None,
    ) -> None:
        require_rich("RichProgressBar", "`RichProgressBar` requires `rich` >= 13.0.")
        super().__init__()
        self._refresh_rate = positive_int("RichProgressBar(refresh_rate)", refresh_rate, minimum=0)
        self._leave = flag("RichProgressBar(leave)", leave)
        if theme is not None and not isinstance(theme, RichProgressBarTheme):
            raise TypeError(f"RichProgressBar(theme={theme!r}) must be a RichProgressBarTheme (or None: the default).")
        if console_kwargs is not None and not isinstance(console_kwargs, dict):
            raise TypeError(f"RichProgressBar(console_kwargs={console_kwargs!r}) must be a dict of Console arguments.")
        self.theme = theme if theme is not None else RichProgressBarTheme()
        self._console_kwargs = dict(console_kwargs or {})
        self._console: Console | None = None
        self.progress: Progress | None = None
        self._progress_stopped = False
        self._metrics_column: Any = None
        self._next_draw = 0.0  # perf_counter time after which a batch end redraws
        self._reset_progress_bar_ids()

    @property
    def refresh_rate(self) -> int:
        return self._refresh_rate

    @property
    def is_enabled(self) -> bool:
        return self._enabled and self._refresh_rate > 0

    @property
    def is_disabled(self) -> bool:
        return not self.is_enabled

    def _task(self, task_id: TaskID | None, what: str) -> Task:
        if self.progress is None or task_id is None:
            raise TypeError(f"`{type(self).__name__}` has no {what} yet: it is made when the stage runs, if enabled.")
        return self.progress.tasks[task_id]

    train_progress_bar = property(lambda self: self._task(self.train_progress_bar_id, "training bar"))
    val_sanity_check_bar = property(lambda self: self._task(self.val_sanity_progress_bar_id, "sanity check bar"))
    val_progress_bar = property(lambda self: self._task(self.val_progress_bar_id, "validation bar"))
    test_progress_bar = property(lambda self: self._task(self.test_progress_bar_id, "test bar"))
    predict_progress_bar = property(lambda self: self._task(self.predict_progress_bar_id, "predict bar"))

    def print(self, *args: Any, sep: str = " ", **kwargs: Any) -> None:
        """Lightning's: a plain ``print`` (on a terminal, rich shows it above the live bars)."""
        print(*args, sep=sep, **kwargs)

    def get_metrics(self, trainer: Trainer, pl_module: TrainModule) -> dict[str, Any]:
        """The base bar's values, with tensors as Python numbers (what the metrics column formats)."""
        items = super().get_metrics(trainer, pl_module)
        return {k: v.item() if isinstance(v, torch.Tensor) and v.numel() == 1 else v for k, v in items.items()}

    def configure_columns(self, trainer: Trainer) -> list:
        """The columns before the metrics: description, bar, batches, time, speed (Lightning's
        override point for a bar of other columns)."""
        import_rich()
        from . import _rich_columns as c

        return [
            c.TextColumn("[progress.description]{task.description}"),
            c.BarColumn(complete_style=self.theme.progress_bar, finished_style=self.theme.progress_bar_finished,
                        pulse_style=self.theme.progress_bar_pulse),
            c.BatchesProcessedColumn(style=self.theme.batch_progress),
            c.CustomTimeColumn(style=self.theme.time),
            c.ProcessingSpeedColumn(style=self.theme.processing_speed),
        ]

    # --- the rich Progress: one per stage (and per epoch with leave=True) -------------------
    def _init_progress(self, trainer: Trainer) -> None:
        if not self.is_enabled or (self.progress is not None and not self._progress_stopped):
            return
        import_rich()
        import rich

        from . import _rich_columns as c

        self._reset_progress_bar_ids()
        rich.reconfigure(**self._console_kwargs)  # a fresh global console: no live display left from a failed run
        self._console = rich.get_console()
        self._metrics_column = c.MetricsTextColumn(self, self.theme)
        self.progress = c.Progress(*self.configure_columns(trainer), self._metrics_column, auto_refresh=False,
                                   console=self._console)
        self.progress.start()
        self._progress_stopped = False
        self._next_draw = 0.0

    def _stop_progress(self) -> None:
        if self.progress is not None and not self._progress_stopped:
            self.progress.stop()  # draws the final frame (once, without a terminal)
            self._progress_stopped = True

    def _reset_progress_bar_ids(self) -> None:
        self.train_progress_bar_id: TaskID | None = None
        self.val_sanity_progress_bar_id: TaskID | None = None
        self.val_progress_bar_id: TaskID | None = None
        self.test_progress_bar_id: TaskID | None = None
        self.predict_progress_bar_id: TaskID | None = None

    def refresh(self, hard: bool = False) -> None:
        """Redraw, at most ``refresh_rate`` times a second unless ``hard``."""
        if self.progress is None or self._progress_stopped:
            return
        now = time.perf_counter()
        if hard or now >= self._next_draw:
            self._next_draw = now + 1 / max(self._refresh_rate, 1)
            self.progress.refresh()

    def _styled(self, description: str) -> str:
        style = self.theme.description
        return f"[{style}]{description}" if style else description

    def _add_task(self, total: int | float, description: str, visible: bool = True) -> TaskID:
        if self.progress is None:
            raise TypeError(f"`{type(self).__name__}` adds a bar only while a stage runs.")
        total_or_none = None if total == float("inf") else total  # rich's total for a loader of unknown length
        return self.progress.add_task(self._styled(description), total=total_or_none, visible=visible)

    def _update(self, task_id: TaskID | None, current: int, visible: bool = True) -> None:
        if self.progress is not None and self.is_enabled and task_id is not None:
            self.progress.update(task_id, completed=current, visible=visible)
            self.refresh()

    def _hide(self, task_id: TaskID | None) -> None:
        if self.progress is not None and task_id is not None:
            self.progress.update(task_id, advance=0, visible=False)

    def _update_metrics(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self.is_enabled and self._metrics_column is not None:
            self._metrics_column.metrics = self.get_metrics(trainer, pl_module)

    def _get_train_description(self, current_epoch: int) -> str:
        text = f"Epoch {current_epoch}"
        max_epochs = self.trainer.max_epochs
        if isinstance(max_epochs, int) and max_epochs > 0:
            text += f"/{max_epochs - 1}"
        return text.ljust(len(self.validation_description))  # the same width as "Validation": no flicker

    # --- hooks: each of ProgressBar's is overridden, so that nothing of the tqdm bar runs --------
    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        self._trainer = trainer
        if not trainer.is_global_zero:
            self.disable()

    def on_sanity_check_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._init_progress(trainer)

    on_train_start = on_validation_start = on_test_start = on_predict_start = on_sanity_check_start

    def on_sanity_check_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._hide(self.val_sanity_progress_bar_id)
        self.refresh(hard=True)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self.is_disabled:
            return
        total, description = self.total_train_batches, self._get_train_description(trainer.current_epoch)
        if self.train_progress_bar_id is not None and self._leave:  # the last epoch's bar stays, a new Progress below
            self._stop_progress()
            self._init_progress(trainer)
        if self.progress is None:
            return
        if self.train_progress_bar_id is None:
            self.train_progress_bar_id = self._add_task(total, description)
        else:
            # (styled again: Lightning's reset drops the theme's description style after the first epoch)
            self.progress.reset(self.train_progress_bar_id, total=None if total == float("inf") else total,
                                description=self._styled(description), visible=True)
        self.refresh(hard=True)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.is_enabled and self.train_progress_bar_id is None and self.progress is not None:  # resumed mid-epoch
            description = self._get_train_description(trainer.current_epoch)
            self.train_progress_bar_id = self._add_task(self.total_train_batches, description)
        self._update(self.train_progress_bar_id, batch_idx + 1)
        self._update_metrics(trainer, pl_module)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._update_metrics(trainer, pl_module)  # the epoch means, and the validation values
        self.refresh(hard=True)

    on_train_end = Callback.on_train_end  # nothing to do (the tqdm bar's line is not drawn here)

    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self.is_disabled or self.progress is None or not self.has_dataloader_changed(dataloader_idx):
            return
        total = self.total_val_batches_current_dataloader
        if trainer.sanity_checking:
            self._hide(self.val_sanity_progress_bar_id)
            self.val_sanity_progress_bar_id = self._add_task(total, self.sanity_check_description, visible=False)
        else:  # each validation run (and loader) gets a bar of its own; the last one is hidden
            self._hide(self.val_progress_bar_id)
            self.val_progress_bar_id = self._add_task(total, self.validation_description, visible=False)
        self.refresh()

    def on_validation_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self.is_enabled:
            bar = self.val_sanity_progress_bar_id if trainer.sanity_checking else self.val_progress_bar_id
            self._update(bar, batch_idx + 1)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self.is_enabled and self.val_progress_bar_id is not None and trainer.state.fn == "fit":
            self._hide(self.val_progress_bar_id)
            self.refresh()

    def on_validation_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if trainer.state.fn == "fit":
            self._update_metrics(trainer, pl_module)
        self.reset_dataloader_idx_tracker()

    def on_test_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self.reset_dataloader_idx_tracker()

    on_predict_end = on_test_end

    def on_test_batch_start(
        self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self.is_disabled or self.progress is None or not self.has_dataloader_changed(dataloader_idx):
            return
        self._hide(self.test_progress_bar_id)
        self.test_progress_bar_id = self._add_task(self.total_test_batches_current_dataloader, self.test_description)
        self.refresh()

    def on_test_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self.is_enabled:
            self._update(self.test_progress_bar_id, batch_idx + 1)

    def on_predict_batch_start(
        self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        if self.is_disabled or self.progress is None or not self.has_dataloader_changed(dataloader_idx):
            return
        self._hide(self.predict_progress_bar_id)
        total = self.total_predict_batches_current_dataloader
        self.predict_progress_bar_id = self._add_task(total, self.predict_description)
        self.refresh()

    def on_predict_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self.is_enabled:
            self._update(self.predict_progress_bar_id, batch_idx + 1)

    def teardown(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        self._stop_progress()

    def on_exception(self, trainer: Trainer, pl_module: TrainModule, exception: BaseException) -> None:
        self._stop_progress()

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["progress"] = state["_console"] = state["_metrics_column"] = None  # locks and a live display
        return state
