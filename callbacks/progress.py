"""ProgressBar: a tqdm bar on rank 0 that costs nothing measurable per step."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING, Any

import torch

from .base import Callback

if TYPE_CHECKING:
    from tqdm import tqdm

    from trainer import Trainer, TrainModule


class ProgressBar(Callback):
    """One bar per training epoch (step, loss, ``prog_bar=True`` values) and a short-lived
    one for validation. Refreshed at most every ``refresh_s`` seconds: between refreshes a
    step costs a counter increment and a clock read. Without a terminal (CI logs) it prints
    a plain line every ``line_every_s`` seconds instead of carriage-return updates.
    """

    def __init__(self, refresh_s: float = 0.2, line_every_s: float = 30.0) -> None:
        self.refresh_s = refresh_s
        self.line_every_s = line_every_s
        self._bar: tqdm | None = None
        self._val_bar: tqdm | None = None
        self._active = False
        self._tty = False
        self._pending = 0
        self._next = 0.0
        self._epoch_t0 = 0.0

    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        self._active = trainer.is_global_zero
        self._tty = sys.stderr.isatty()

    def on_train_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        if not self._active:
            return
        total = trainer.num_training_batches
        self._epoch_t0 = time.perf_counter()
        self._next = self._epoch_t0 + (self.refresh_s if self._tty else self.line_every_s)
        self._pending = 0
        if self._tty:
            from tqdm import tqdm

            self._bar = tqdm(
                total=None if total == float("inf") else int(total), initial=trainer.state.batch_in_epoch,
                desc=f"Epoch {trainer.current_epoch}", dynamic_ncols=True, leave=True, mininterval=self.refresh_s,
            )

    def on_train_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if not self._active:
            return
        self._pending += 1
        now = time.perf_counter()
        if now < self._next:
            return
        self._next = now + (self.refresh_s if self._tty else self.line_every_s)
        self._show(trainer, outputs, batch_idx)

    def _show(self, trainer: Trainer, outputs: Any, batch_idx: int) -> None:
        values = self._values(trainer, outputs)
        if self._bar is not None:
            self._bar.update(self._pending)
            self._bar.set_postfix(values, refresh=True)
        else:
            total = trainer.num_training_batches
            of = "" if total == float("inf") else f"/{int(total)}"
            rate = (batch_idx + 1 - 0) / max(time.perf_counter() - self._epoch_t0, 1e-9)
            shown = " ".join(f"{k}={v}" for k, v in values.items())
            print(f"epoch {trainer.current_epoch} batch {batch_idx + 1}{of} step {trainer.global_step} {shown} ({rate:.1f} it/s)", file=sys.stderr, flush=True)
        self._pending = 0

    def _values(self, trainer: Trainer, outputs: Any) -> dict[str, str]:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        values = {}
        if isinstance(loss, torch.Tensor):
            values["loss"] = f"{float(loss.detach()):.4g}"
        for name, value in trainer.step_metrics(prog_bar_only=True).items():
            values[name] = f"{value:.4g}"
        return values

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        if not self._active:
            return
        shown = {k: f"{v:.4g}" for k, v in trainer.callback_metrics.items() if k in trainer.prog_bar_names}
        if self._bar is not None:
            self._bar.update(self._pending)
            self._bar.set_postfix(shown, refresh=True)
            self._bar.close()
            self._bar = None
        else:
            took = time.perf_counter() - self._epoch_t0
            print(f"epoch {trainer.current_epoch} done in {took:.1f}s, step {trainer.global_step} "
                  + " ".join(f"{k}={v}" for k, v in shown.items()), file=sys.stderr, flush=True)
        self._pending = 0

    def on_validation_start(self, trainer: Trainer, module: TrainModule) -> None:
        if self._active and self._tty and trainer.state.stage == "fit":
            from tqdm import tqdm

            self._val_bar = tqdm(desc="Validation", leave=False, dynamic_ncols=True, mininterval=self.refresh_s)

    def on_validation_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._val_bar is not None:
            self._val_bar.update(1)

    def on_validation_end(self, trainer: Trainer, module: TrainModule) -> None:
        if self._val_bar is not None:
            self._val_bar.close()
            self._val_bar = None

    def teardown(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        for bar in (self._bar, self._val_bar):
            if bar is not None:
                bar.close()
        self._bar = self._val_bar = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_bar"] = state["_val_bar"] = None
        return state
