"""SpikeDetection: stop training with TrainingSpikeException when the loss jumps away from its running mean."""

from __future__ import annotations

import json
import math
import os
from collections import deque
from typing import TYPE_CHECKING, Any, Mapping

import torch

from trainer.core.checks import one_of, positive_int
from trainer.core.exceptions import misconfigured

from ..base import Callback

if TYPE_CHECKING:
    from trainer import Trainer, TrainModule


class TrainingSpikeException(RuntimeError):
    """Raised by ``SpikeDetection`` when a training batch's loss spiked."""

    def __init__(self, batch_idx: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(f"Training spike detected in batch {batch_idx}", *args, **kwargs)
        self.batch_idx = batch_idx


class SpikeDetection(Callback):
    """Compares each training batch's loss with the mean of the last ``window`` losses (from
    batch ``warmup`` of each epoch on) and raises ``TrainingSpikeException`` on a spike: a loss
    that is no improvement on the previous one (lower is better with ``mode="min"``, higher
    with ``"max"``) and differs from the mean by at least ``atol`` and by at least ``rtol``
    times the mean (None: that test passes). With ``finite_only=True`` (the default) a NaN or
    infinite loss is a spike too; with False it is not, and stays out of the mean.

    Before raising, the batch indices to skip when training again (the spiking batch and the
    one before it, which may have corrupted the weights) are written as a JSON list to
    ``exclude_batches_path`` (a ``.json`` file, or a folder that gets ``skip_batches.json``;
    default: the Trainer's ``default_root_dir``). Under DDP each process checks its own loss
    and all stop when any spikes.
    """

    def __init__(
        self,
        mode: str = "min",
        window: int = 10,
        warmup: int = 1,
        atol: float | None = None,
        rtol: float | None = 2.0,
        exclude_batches_path: str | os.PathLike | None = None,
        finite_only: bool = True,
    ) -> None:
        self.mode = one_of("SpikeDetection(mode)", mode, ("min", "max"))
        self.window = positive_int("SpikeDetection(window)", window)
        self.warmup = positive_int("SpikeDetection(warmup)", warmup, minimum=0)
        for name, value in (("atol", atol), ("rtol", rtol)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise misconfigured(f"SpikeDetection({name}={value!r}) must be a number or None.", type_error=True)
        self.atol, self.rtol = atol, rtol
        self.exclude_batches_path = exclude_batches_path
        self.finite_only = finite_only
        self.last_val: float = 0.0
        self.bad_batches: list[int] = []
        self._recent: deque[float] = deque(maxlen=self.window)

    @property
    def running_mean(self) -> float:
        """The mean of the last ``window`` finite losses (NaN before any)."""
        return sum(self._recent) / len(self._recent) if self._recent else math.nan

    @torch.no_grad()
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if isinstance(outputs, torch.Tensor):
            loss = outputs.detach()
        elif isinstance(outputs, Mapping):
            loss = outputs["loss"].detach()
        else:
            raise TypeError(f"outputs have to be of type torch.Tensor or Mapping, got {type(outputs).__qualname__}")
        if self.exclude_batches_path is None:
            self.exclude_batches_path = trainer.default_root_dir
        if not str(self.exclude_batches_path).endswith(".json"):
            self.exclude_batches_path = os.path.join(self.exclude_batches_path, "skip_batches.json")
        value = float(loss.float().mean())
        spiked = batch_idx >= self.warmup and self._is_spike(value)
        strategy = trainer.strategy
        if strategy.any_rank(spiked):  # one process's spike stops them all
            self._handle_spike(trainer, batch_idx)
        if self.finite_only or not strategy.any_rank(not math.isfinite(value)):
            self._recent.append(value)
            self.last_val = value

    def _is_spike(self, value: float) -> bool:
        if self.finite_only and not math.isfinite(value):
            return True
        change = value - self.last_val
        if change <= 0 if self.mode == "min" else change >= 0:  # an improvement is never a spike
            return False
        mean, gap = self.running_mean, abs(value - self.running_mean)
        atol_ok = self.atol is None or gap >= abs(self.atol)
        rtol_ok = self.rtol is None or gap >= abs(self.rtol * mean)
        return atol_ok and rtol_ok

    def _handle_spike(self, trainer: Trainer, batch_idx: int) -> None:
        self.bad_batches.extend([batch_idx - 1, batch_idx])
        if trainer.is_global_zero:
            path = str(self.exclude_batches_path)
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "w") as f:
                json.dump(self.bad_batches, f, indent=4)
        raise TrainingSpikeException(batch_idx=batch_idx)

    def state_dict(self) -> dict[str, Any]:
        return {
            "last_val": self.last_val,
            "mode": self.mode,
            "warmup": self.warmup,
            "atol": self.atol,
            "rtol": self.rtol,
            "bad_batches": list(self.bad_batches),
            "bad_batches_path": self.exclude_batches_path,
            "recent": list(self._recent),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_val = state_dict["last_val"]
        self.mode, self.warmup = state_dict["mode"], state_dict["warmup"]
        self.atol, self.rtol = state_dict["atol"], state_dict["rtol"]
        self.bad_batches = list(state_dict["bad_batches"])
        self.exclude_batches_path = state_dict["bad_batches_path"]
        self._recent = deque(state_dict.get("recent", []), maxlen=self.window)
