"""ProgressBar: a tqdm bar on rank 0 that costs nothing measurable per step."""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Any, Callable

import torch

from trainer.core.checks import flag, positive_int, positive_number

from ..base import Callback
from ._lines import _duration, _line, _stop_reason, _time_left

# Without a terminal, the fit's first progress line comes this soon (unless line_every_s is
# sooner), with the epoch's expected length: a log should not stay silent for 30 s first.
_FIRST_LINE_S = 5.0

if TYPE_CHECKING:
    from tqdm import tqdm

    from trainer import Trainer, TrainModule


class ProgressBar(Callback):
    """One bar per training epoch (batches, step, loss, ``prog_bar=True`` values) and a
    short-lived one for each validation, test or predict run. Global rank 0 only.

    Values are labelled with their TensorBoard tags: ``train_loss`` is the last batch's value
    (at the epoch's end too, as Lightning's bar), a ``<name>_epoch`` the epoch's mean. An epoch
    that ends fit says why (``max_steps=60``, or the ``trainer.state.stop_reason`` a
    callback gave, such as ``early_stopping``) and, if cut short, at which batch.

    Refreshed at most every ``refresh_s`` seconds: between refreshes a step costs a clock
    read (the loss is read off the device only at a refresh). Without
    a terminal (CI logs, files) it prints a plain line every ``line_every_s`` seconds and one
    per epoch instead of carriage-return updates; each line estimates the epoch's length and
    the time left (tqdm's bar shows its own), and the fit's first line comes after at most
    5 s, so that a log tells early how long to wait.
    """

    def __init__(self, refresh_s: float = 0.2, line_every_s: float = 30.0) -> None:
        self.refresh_s = positive_number("ProgressBar(refresh_s)", refresh_s, allow_none=False)
        self.line_every_s = positive_number("ProgressBar(line_every_s)", line_every_s, allow_none=False)
        self._bar: tqdm | None = None
        self._eval_bar: tqdm | None = None
        self._active = False
        self._tty = False
        self._next = 0.0  # perf_counter time of the next refresh
        self._epoch_t0 = 0.0
        self._first_batch = 0  # a resumed epoch starts past the batches it already ran
        self._early_line = False  # whether the next epoch's first line comes after _FIRST_LINE_S
        self._epoch_open = False  # an epoch started and its line not yet written
        self._compiling = False  # Trainer(compile=...): until the first training batch ends
        self._leave = True  # an epoch's bar stays on screen after it ends
        self._enabled = True  # Lightning's enable()/disable()
        self._trainer: Trainer | None = None
        # each stage's last total, for Lightning's train_progress_bar, val_progress_bar, ... (read after fit too)
        self._totals: dict[str, int | float | None] = {}
        self._eval_stage = "val"
        self._eval_loader: int | None = None  # the evaluation loader the bar counts (Lightning's dataloader tracker)

    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        self._trainer = trainer
        if not trainer.is_global_zero:  # Lightning's: the bar is rank 0's
            self.disable()
        self._active = self._enabled
        self._tty = sys.stderr.isatty()
        self._early_line = not self._tty
        self._compiling = stage == "fit" and getattr(trainer, "compile", None) is not None  # until the first batch ends

    # --- training ----------------------------------------------------------------------
    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        total = self._totals["train"] = self.total_train_batches
        if not self._active:
            self._next = float("inf")  # never due: other ranks only pay the comparison
            return
        self._epoch_t0 = time.perf_counter()
        pace = self.refresh_s if self._tty else self.line_every_s
        if self._early_line:
            pace, self._early_line = min(pace, _FIRST_LINE_S), False
        self._next = self._epoch_t0 + pace
        self._first_batch = trainer.state.batch_in_epoch
        self._epoch_open = True
        if self._compiling:
            self._next = 0.0  # the first batch end is due: it ends the compile
            if not self._tty:
                _line("compiling the model (torch.compile): the first steps take longer")
        if self._tty:
            bar = self._bar = self.init_train_tqdm()
            bar.reset(total=None if total == float("inf") else int(total))
            bar.initial = bar.n = bar.last_print_n = self._first_batch  # a resumed epoch's rate counts from here
            bar.set_description(f"Epoch {trainer.current_epoch}" + (" (compiling)" if self._compiling else ""))

    def on_train_batch_end(self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        now = time.perf_counter()
        if now < self._next:  # all that most steps do here
            return
        self._next = now + (self.refresh_s if self._tty else self.line_every_s)
        if self._compiling:
            self._compiling = False
            if self._bar is not None:
                self._bar.set_description(f"Epoch {trainer.current_epoch}", refresh=False)
            self._epoch_t0, self._first_batch = now, batch_idx + 1  # the rate leaves the compile out
        values = self._values(trainer, outputs)
        if self._bar is not None:
            self._bar.update(batch_idx + 1 - self._bar.n)
            self._bar.set_postfix(values, refresh=True)
        else:
            total = trainer.num_training_batches
            of = "" if total == float("inf") else f"/{int(total)}"
            rate = (batch_idx + 1 - self._first_batch) / max(now - self._epoch_t0, 1e-9)
            shown = "".join(f" {k}={v}" for k, v in values.items())
            eta = _time_left(trainer, batch_idx + 1, rate)
            _line(f"epoch {trainer.current_epoch} batch {batch_idx + 1}{of}{shown} ({rate:.1f} batches/s{eta})")

    def _values(self, trainer: Trainer, outputs: Any) -> dict[str, str]:
        values = {"step": str(trainer.global_step)}
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            values["loss"] = f"{float(loss.detach()):.4g}"
        for name, value in self.get_metrics(trainer, trainer.lightning_module).items():
            values[name] = _shown(value)
        return values

    # --- Lightning's ProgressBar API: what a Lightning bar subclass overrides, and Lightning code reads
    @property
    def trainer(self) -> Trainer:
        if self._trainer is None:
            raise TypeError(f"The `{type(self).__name__}._trainer` reference has not been set yet.")
        return self._trainer

    def get_metrics(self, trainer: Trainer, pl_module: TrainModule) -> dict[str, Any]:
        """What the bar shows besides the step and the loss: the logger's version as ``v_num``
        and ``trainer.progress_bar_metrics`` (Lightning's). Override it to change what is shown."""
        version = next((lg.version for lg in trainer.loggers if lg.version not in ("", None)), None)
        standard = {} if version is None else {"v_num": version[-4:] if isinstance(version, str) else version}
        return {**standard, **trainer.progress_bar_metrics}

    def enable(self) -> None:
        self._enabled = True

    def disable(self) -> None:
        self._enabled = self._active = False

    is_enabled = property(lambda self: self._enabled)
    is_disabled = property(lambda self: not self.is_enabled)

    def print(self, *args: Any, sep: str = " ", **kwargs: Any) -> None:
        """``print`` under the bar (``TrainModule.print`` comes here): ``tqdm.write`` while a stage runs."""
        if not self._active:
            return print(*args, sep=sep, **kwargs)
        tqdm_class().write(sep.join(map(str, args)), **kwargs)

    @property
    def total_train_batches(self) -> int | float:
        """An epoch's training batches (with ``max_steps`` and no epoch limit, at most the steps left)."""
        t = self.trainer
        if t.max_epochs in (None, -1) and t.max_steps is not None and t.max_steps > 0:
            return min(t.num_training_batches, t.max_steps - t.global_step)
        return t.num_training_batches

    @property
    def total_val_batches(self) -> int | float:
        """All validation loaders' batches in this epoch's validation (0 when the epoch has none)."""
        every = self.trainer.check_val_every_n_epoch
        due = every is None or (self.trainer.current_epoch + 1) % every == 0
        return sum(self.trainer.num_val_batches) if due else 0

    def has_dataloader_changed(self, dataloader_idx: int) -> bool:
        """Lightning's: whether ``dataloader_idx`` is another loader than the last one asked about (remembered)."""
        changed, self._eval_loader = dataloader_idx != self._eval_loader, dataloader_idx
        return changed

    def reset_dataloader_idx_tracker(self) -> None:
        self._eval_loader = None

    def _current(self, batches: list[int | float]) -> int | float:
        return batches[self._eval_loader or 0] if batches else 0

    total_val_batches_current_dataloader = property(lambda self: self._current(
        self.trainer.num_sanity_val_batches if self.trainer.sanity_checking else self.trainer.num_val_batches))
    total_test_batches_current_dataloader = property(lambda self: self._current(self.trainer.num_test_batches))
    total_predict_batches_current_dataloader = property(lambda self: self._current(self.trainer.num_predict_batches))

    def _record(self, stage: str) -> Any:
        """``<stage>_progress_bar``: the bar on screen, else a tqdm that draws nothing, with the last total."""
        bar = self._bar if stage == "train" else self._eval_bar if stage == self._eval_stage else None
        if bar is not None:
            return bar
        if stage not in self._totals:
            raise TypeError(f"The `{type(self).__name__}._{stage}_progress_bar` reference has not been set yet.")
        total = self._totals[stage]
        return tqdm_class()(total=None if total in (None, float("inf")) else int(total), disable=True)

    train_progress_bar = property(lambda self: self._record("train"))
    val_progress_bar = property(lambda self: self._record("val"))
    test_progress_bar = property(lambda self: self._record("test"))
    predict_progress_bar = property(lambda self: self._record("predict"))

    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if not self._active:
            return
        # The epoch means of prog_bar values, with the validation ones that just ran, under the
        # tags TensorBoard gives them: a training mean is <name>_epoch (<name> is one batch's value).
        shown = {"step": str(trainer.global_step)}
        names, train = trainer.prog_bar_names, trainer.train_epoch_metrics
        shown.update((k, f"{v:.4g}") for k, v in train.items()
                     if k in names or k.endswith("_epoch") and k[:-6] in names)
        shown.update((k, f"{v:.4g}") for k, v in trainer.callback_metrics.numbers().items()
                     if k in names and k not in train and f"{k}_epoch" not in train)
        self._end_epoch(trainer, shown)

    def on_train_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        # An epoch cut short (max_steps, a stop request) has no epoch end: its line comes here,
        # with its last batch's values, since it has no epoch means.
        if self._active and self._epoch_open:
            shown = {"step": str(trainer.global_step)}
            shown.update((k, f"{v:.4g}") for k, v in trainer.step_metrics(prog_bar_only=True).items())
            self._end_epoch(trainer, shown)

    def _end_epoch(self, trainer: Trainer, shown: dict[str, str]) -> None:
        self._epoch_open = False
        reason, epoch = _stop_reason(trainer), trainer.current_epoch
        done, total = trainer.state.batch_in_epoch, trainer.num_training_batches
        if self._bar is not None:
            if reason is not None:
                self._bar.set_description(f"Epoch {epoch} (stopped: {reason})", refresh=False)
            self._bar.leave = self._leave or reason is not None  # fit's last bar stays
            self._bar.n = done  # (not update(), which may draw: close draws the final line, once)
            self._bar.set_postfix(shown, refresh=False)
            self._bar.close()
            self._bar = None
            return
        took = _duration(time.perf_counter() - self._epoch_t0)
        if reason is None:
            head = f"epoch {epoch} done in {took}"
        elif done < total:  # cut short: say where, so that it does not read as a finished epoch
            of = "" if total == float("inf") else f"/{int(total)}"
            head = f"epoch {epoch} stopped at batch {done}{of} ({reason}) after {took}"
        else:
            head = f"epoch {epoch} done in {took}, then stopped ({reason})"
        _line(head + "".join(f" {k}={v}" for k, v in shown.items()))

    # --- Lightning's tqdm factories: override one to style that bar (made where a terminal shows it) ----
    def _tqdm(self, description: str, leave: bool) -> Any:
        return tqdm_class()(desc=description, leave=leave, dynamic_ncols=True, mininterval=self.refresh_s)

    def init_train_tqdm(self) -> Any:
        """An epoch's bar; its total and its description ("Epoch 3") are set when the epoch starts."""
        return self._tqdm(self.train_description, leave=True)

    def init_sanity_tqdm(self) -> Any:
        return self._tqdm(self.sanity_check_description, leave=False)

    def init_validation_tqdm(self) -> Any:
        return self._tqdm(self.validation_description, leave=self.trainer.state.fn == "validate")  # in fit: goes

    def init_test_tqdm(self) -> Any:
        return self._tqdm(self.test_description, leave=True)

    def init_predict_tqdm(self) -> Any:
        return self._tqdm(self.predict_description, leave=True)

    sanity_check_description = property(lambda self: "Sanity Checking")
    train_description = property(lambda self: "Training")
    validation_description = property(lambda self: "Validation")
    test_description = property(lambda self: "Testing")
    predict_description = property(lambda self: "Predicting")

    # --- validation, test, predict: a bar while they run, on a terminal ----------------
    def _eval_start(self, make: Callable[[], Any], stage: str) -> None:
        self._eval_stage, self._eval_loader = stage, 0
        self._totals[stage] = getattr(self, f"total_{stage}_batches_current_dataloader")
        if self._active and self._tty:
            self._eval_bar = make()

    def _eval_batch(self, dataloader_idx: int = 0) -> None:
        if dataloader_idx != self._eval_loader:  # the next loader: its total
            self._eval_loader = dataloader_idx
            stage = self._eval_stage
            self._totals[stage] = getattr(self, f"total_{stage}_batches_current_dataloader")
        if self._eval_bar is not None:
            self._eval_bar.update(1)  # tqdm itself redraws at most every mininterval

    def _eval_end(self) -> None:
        if self._eval_bar is not None:
            self._eval_bar.close()
            self._eval_bar = None

    def on_validation_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._eval_start(self.init_sanity_tqdm if trainer.sanity_checking else self.init_validation_tqdm, "val")

    def on_validation_batch_end(self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any,
                                batch_idx: int, dataloader_idx: int = 0) -> None:
        self._eval_batch(dataloader_idx)

    on_test_batch_end = on_predict_batch_end = on_validation_batch_end

    def on_validation_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._eval_end()

    on_test_end = on_predict_end = on_validation_end

    def on_test_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._eval_start(self.init_test_tqdm, "test")

    def on_predict_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._eval_start(self.init_predict_tqdm, "predict")

    def teardown(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        for bar in (self._bar, self._eval_bar):
            if bar is not None:
                bar.close()
        self._bar = self._eval_bar = None
        self._active = False

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_bar"] = state["_eval_bar"] = None
        return state


class TQDMProgressBar(ProgressBar):
    """Lightning's name and arguments for :class:`ProgressBar`.

    ``refresh_rate`` is an upper bound: the bar redraws at most every ``refresh_rate``
    batches, and at most every ``refresh_s`` seconds as ProgressBar does (0 turns it off).
    ``leave=False`` clears each epoch's bar when the epoch ends, except the last one of fit;
    ``leave=True`` keeps one per epoch.
    """

    def __init__(self, refresh_rate: int = 1, leave: bool = False, refresh_s: float = 0.2,
                 line_every_s: float = 30.0) -> None:
        super().__init__(refresh_s=refresh_s, line_every_s=line_every_s)
        self.refresh_rate = positive_int("TQDMProgressBar(refresh_rate)", refresh_rate, minimum=0)
        if "TQDM_MINITERS" in os.environ:  # tqdm's own setting, a lower bound (Lightning's)
            self.refresh_rate = max(int(os.environ["TQDM_MINITERS"]), self.refresh_rate)
        self._leave = flag("TQDMProgressBar(leave)", leave)
        self._drawn_at = 0  # the batch of the last redraw

    @property
    def leave(self) -> bool:
        return self._leave

    @property
    def is_enabled(self) -> bool:
        return self._enabled and self.refresh_rate > 0

    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._active = self._active and self.refresh_rate > 0

    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        self._drawn_at = trainer.state.batch_in_epoch

    def on_train_batch_end(self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        if time.perf_counter() < self._next or batch_idx + 1 - self._drawn_at < self.refresh_rate:
            return
        self._drawn_at = batch_idx + 1
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value.item() if isinstance(value, torch.Tensor) else value)


_TQDM: list[type] = []  # made on first use: importing tqdm is not free


def tqdm_class() -> type:
    """Lightning's ``Tqdm``: a tqdm whose ``format_num`` pads floats (and numeric strings) with
    zeros to 5 characters, so that a bar's numbers keep their width ("1.000", "0.100")."""
    if not _TQDM:
        from tqdm import tqdm

        def format_num(n: int | float | str) -> str:
            text = n if isinstance(n, str) else tqdm.format_num(n)
            if isinstance(n, int) or "e" in text:
                return text
            if "." not in text and len(text) < 5:
                try:
                    float(text)
                except ValueError:
                    return text
                text += "."
            return text + "0" * (5 - len(text))

        _TQDM.append(type("Tqdm", (tqdm,), {"format_num": staticmethod(format_num), "__module__": __name__}))
    return _TQDM[0]

