"""TensorBoardLogger: what ``tensorboard --logdir runs`` shows for a run, with no configuration."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from .base import Callback

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

    from trainer import Trainer, TrainModule


# Training scalars wait this long before going to the writer. Each hand-off wakes the writer's
# thread, which then takes the GIL from the loop: milliseconds on a busy machine, every
# log_every_n_steps otherwise. The writer itself only flushes to disk every 120 s.
_HAND_OFF_S = 10.0


class TensorBoardLogger(Callback):
    """Writes to the run's folder, ``<log_dir>/<name>/version_<n>`` (global rank 0 only).

    Tags: every ``self.log`` value per step (every ``log_every_n_steps``) under its own name
    and its epoch mean as ``<name>_epoch``; validation values under their names;
    ``lr`` (``lr/group<i>`` with several param groups); ``throughput/samples_per_sec`` and
    ``throughput/steps_per_sec``; ``epoch``; ``grad_norm`` when clipping is on; and the
    hyperparameters with the final metrics in the HParams tab.

    Per-step scalars reach the writer in batches, every ``_HAND_OFF_S`` seconds and before
    anything else is written or flushed, so that logging costs the loop almost nothing.
    """

    def __init__(self) -> None:
        self.writer: SummaryWriter | None = None
        self._last_step = -1
        self._clock: tuple[float, int, int] | None = None  # (time, step, samples) at the last write
        self._pending: list[tuple[int, float, list[tuple[str, float]]]] = []  # (step, wall time, scalars)
        self._handed_off = 0.0  # perf_counter at the last hand-off

    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        if trainer.is_global_zero and trainer.run_dir is not None and self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(trainer.run_dir)

    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._clock = (time.perf_counter(), trainer.global_step, trainer.samples_seen)
        self._handed_off = self._clock[0]

    def on_train_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.state.global_step
        if self.writer is None or step % trainer.log_every_n_steps or step == self._last_step:
            return
        self._last_step = step
        scalars = list(trainer.step_metrics().items())
        groups = trainer.optimizer.param_groups
        for i, group in enumerate(groups):
            # float() now: a tensor lr is updated in place by schedulers, so read it at this step.
            scalars.append(("lr" if len(groups) == 1 else f"lr/group{i}", float(group["lr"])))
        if trainer.grad_norm is not None:
            scalars.append(("grad_norm", float(trainer.grad_norm)))
        scalars.append(("epoch", trainer.current_epoch))
        now, samples = time.perf_counter(), trainer.samples_seen
        if self._clock is not None and now > self._clock[0]:
            t0, s0, n0 = self._clock
            scalars.append(("throughput/steps_per_sec", (step - s0) / (now - t0)))
            scalars.append(("throughput/samples_per_sec", (samples - n0) * trainer.world_size / (now - t0)))
        self._clock = (now, step, samples)
        self._pending.append((step, time.time(), scalars))
        if now - self._handed_off >= _HAND_OFF_S:
            self._hand_off()

    def _hand_off(self) -> None:
        """Give the pending training scalars to the writer: one event per step."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._handed_off = time.perf_counter()
        if self.writer is None:
            self._pending.clear()
            return
        for step, walltime, scalars in self._pending:
            values = [Summary.Value(tag=tag, simple_value=float(value)) for tag, value in scalars]
            self.writer.file_writer.add_summary(Summary(value=values), step, walltime)
        self._pending.clear()

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        if self.writer is None:
            return
        self._hand_off()
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
        self._hand_off()
        for name, value in trainer.logged_metrics.items():
            self.writer.add_scalar(name, value, trainer.global_step)
        self.writer.flush()

    def on_fit_end(self, trainer: Trainer, module: TrainModule) -> None:
        if self.writer is None:
            return
        self._hand_off()
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
            self._hand_off()
            self.writer.flush()

    def teardown(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        if self.writer is not None:
            self._hand_off()
            self.writer.close()
            self.writer = None

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["writer"] = None  # never pickled into DDP workers
        state["_pending"] = []
        return state
