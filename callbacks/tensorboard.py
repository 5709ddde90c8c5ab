"""TensorBoardLogger: what ``tensorboard --logdir runs`` shows for a run, with no configuration."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .base import Callback

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

    from trainer import Trainer, TrainModule


class TensorBoardLogger(Callback):
    """Writes to the run's folder, ``<log_dir>/<name>/version_<n>`` (global rank 0 only).

    Tags: every ``self.log`` value per step (every ``log_every_n_steps``) under its own name
    and its epoch mean as ``<name>_epoch``; validation values under their names;
    ``lr`` (``lr/group<i>`` with several param groups); ``throughput/samples_per_sec`` and
    ``throughput/steps_per_sec``; ``epoch``; ``grad_norm`` when clipping is on; and the
    hyperparameters with the final metrics in the HParams tab.
    """

    def __init__(self) -> None:
        self.writer: SummaryWriter | None = None
        self._last_step = -1
        self._clock: tuple[float, int, int] | None = None  # (time, step, samples) at the last write

    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        if trainer.is_global_zero and trainer.run_dir is not None and self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(trainer.run_dir)

    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._clock = (time.perf_counter(), trainer.global_step, trainer.samples_seen)

    def on_train_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if self.writer is None or step % trainer.log_every_n_steps or step == self._last_step:
            return
        self._last_step = step
        w = self.writer
        for name, value in trainer.step_metrics().items():
            w.add_scalar(name, value, step)
        groups = trainer.optimizer.param_groups
        for i, group in enumerate(groups):
            w.add_scalar("lr" if len(groups) == 1 else f"lr/group{i}", group["lr"], step)
        if trainer.grad_norm is not None:
            w.add_scalar("grad_norm", float(trainer.grad_norm), step)
        w.add_scalar("epoch", trainer.current_epoch, step)
        now, samples = time.perf_counter(), trainer.samples_seen
        if self._clock is not None and now > self._clock[0]:
            t0, s0, n0 = self._clock
            w.add_scalar("throughput/steps_per_sec", (step - s0) / (now - t0), step)
            w.add_scalar("throughput/samples_per_sec", (samples - n0) * trainer.world_size / (now - t0), step)
        self._clock = (now, step, samples)

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        if self.writer is None:
            return
        for name, value in trainer.train_epoch_metrics.items():
            self.writer.add_scalar(f"{name}_epoch", value, trainer.global_step)
        self.writer.flush()

    def on_validation_end(self, trainer: Trainer, module: TrainModule) -> None:
        self._write_eval(trainer)

    def on_test_end(self, trainer: Trainer, module: TrainModule) -> None:
        self._write_eval(trainer)

    def _write_eval(self, trainer: Trainer) -> None:
        if self.writer is None:
            return
        for name, value in trainer.logged_metrics.items():
            self.writer.add_scalar(name, value, trainer.global_step)
        self.writer.flush()

    def on_fit_end(self, trainer: Trainer, module: TrainModule) -> None:
        if self.writer is None:
            return
        from torch.utils.tensorboard.summary import hparams

        params = {**{f"trainer/{k}": v for k, v in trainer.hparams().items()}, **getattr(module, "hparams", {})}
        params = {k: v if isinstance(v, (int, float, str, bool)) else str(v) for k, v in params.items()}
        metrics = {f"hparams/{k}": v for k, v in trainer.callback_metrics.items()}
        for summary in hparams(params, metrics):
            self.writer.file_writer.add_summary(summary)
        for name, value in metrics.items():
            self.writer.add_scalar(name, value, trainer.global_step)

    def on_exception(self, trainer: Trainer, module: TrainModule, exception: BaseException) -> None:
        if self.writer is not None:
            self.writer.flush()

    def teardown(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["writer"] = None  # never pickled into DDP workers
        return state
