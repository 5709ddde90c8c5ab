"""TensorBoardLogger: what ``tensorboard --logdir runs`` shows for a run, with no configuration."""

from __future__ import annotations

import logging
import math
import sys
import time
from typing import TYPE_CHECKING, Any, Callable

from trainer.core.checks import positive_number

from .base import Callback

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

    from trainer import Trainer, TrainModule


# Training scalars wait this long before going to the writer. Each hand-off wakes the writer's
# thread, which then takes the GIL from the loop: milliseconds on a busy machine, every
# log_every_n_steps otherwise. Anything else written, a flush or an error hands them off first.
_HAND_OFF_S = 10.0
_FLUSH_GAP_S = 1.0  # the least time between flushes at epoch ends and validations

log = logging.getLogger("trainer")


class TensorBoardLogger(Callback):
    """Writes to the run's folder, ``<log_dir>/<name>/version_<n>`` (global rank 0 only).

    Tags, all against ``global_step``:

    - every value logged in ``training_step``, under its own name, at the first optimizer step,
      every ``log_every_n_steps`` steps and each epoch's last step (so that even a run shorter
      than the interval has its curves, first step to last), and its epoch mean as
      ``<name>_epoch`` at each epoch's end;
    - values logged in ``validation_step``/``test_step``: their means, under their own names;
    - ``lr`` (``lr/group<i>`` when the optimizer has several param groups);
    - ``throughput/samples_per_sec`` and ``throughput/steps_per_sec`` (training only:
      validation time is left out; samples are counted over all processes);
    - ``epoch``; ``grad_norm`` (before clipping) when ``gradient_clip_val`` is set;
    - the Trainer's options (``trainer/<option>``) and the model's ``save_hyperparameters``
      arguments in the HParams tab, whose metric columns are the run's scalars (so the
      validation metrics show their final values).

    Events reach the disk every ``flush_secs`` seconds, at each epoch's end and validation
    (at most once a second), on an error, and when fit, validate or test ends. ``predict``
    writes nothing.
    """

    def __init__(self, flush_secs: float = 30.0) -> None:
        self.flush_secs = positive_number("TensorBoardLogger(flush_secs)", flush_secs, allow_none=False)
        self.writer: SummaryWriter | None = None
        self._clock: tuple[float, int, int] | None = None  # (time, step, samples) at the last write
        self._paused_at: float | None = None
        # Events not yet given to the writer: (step, wall time, what builds the scalars, its arguments).
        self._pending: list[tuple[int, float, Callable[..., Any], tuple[Any, ...]]] = []
        self._handed_off = 0.0  # perf_counter at the last hand-off
        self._flushed = 0.0  # perf_counter at the last flush of epoch or validation values

    # --- opening and closing -----------------------------------------------------------
    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        # fit opens its writer in on_fit_start, once a resumed checkpoint has set global_step.
        if stage in ("validate", "test"):
            self._open(trainer, purge_step=None)

    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        # A resumed run appends to its own folder; points the crashed run wrote after the
        # checkpoint are dropped (purge_step) so that the curves continue without a fork.
        self._open(trainer, purge_step=trainer.global_step + 1 if trainer.global_step else None)
        if self.writer is not None:
            self.writer.file_writer.add_summary(_session_start(_hparams(trainer, module)), trainer.global_step)
            self.writer.flush()  # the run shows up in TensorBoard at once

    def _open(self, trainer: Trainer, purge_step: int | None) -> None:
        if trainer.is_global_zero and trainer.run_dir is not None and self.writer is None:
            self.writer = _summary_writer()(trainer.run_dir, purge_step=purge_step, flush_secs=self.flush_secs)

    def on_fit_end(self, trainer: Trainer, module: TrainModule) -> None:
        self._hand_off()
        if self.writer is not None:
            # Only a finished fit is marked: a resumed run's folder then ends up "success".
            self.writer.file_writer.add_summary(_session_end_success(), trainer.global_step)
            self.writer.flush()

    def on_exception(self, trainer: Trainer, module: TrainModule, exception: BaseException) -> None:
        self._hand_off()
        if self.writer is not None:
            self.writer.flush()

    def teardown(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        self._hand_off()
        if self.writer is not None:
            self.writer.close()
            self.writer = None

    # --- training ----------------------------------------------------------------------
    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
        steps, every = trainer.estimated_stepping_batches, trainer.log_every_n_steps
        if self.writer is not None and trainer.global_step == 0 and 2 <= steps < every:
            log.info(
                "This fit makes %d optimizer steps, fewer than log_every_n_steps=%d: its per-step curves get "
                "the first step and each epoch's last. Trainer(log_every_n_steps=%d) gives about 10 points.",
                steps, every, max(1, math.ceil(steps / 10)),
            )
        self._clock = (time.perf_counter(), trainer.global_step, trainer.samples_seen)
        self._handed_off = self._clock[0]
        if getattr(trainer, "compile", None) is not None:  # the first steps compile: throughput starts at the first log step
            self._clock = None

    def on_train_log(self, trainer: Trainer, module: TrainModule, metrics: dict[str, float]) -> None:
        if self.writer is None:
            return
        step, samples, now = trainer.state.global_step, trainer.samples_seen, time.perf_counter()
        rates = None
        if self._clock is not None and now > self._clock[0]:
            t0, s0, n0 = self._clock
            rates = ((step - s0) / (now - t0), (samples - n0) * trainer.world_size / (now - t0))
        self._clock = (now, step, samples)
        # float(): schedulers update tensors in place. One list per optimizer.
        lrs = [[float(g["lr"]) for g in opt.param_groups] for opt in trainer.optimizers]
        grad_norm = None if trainer.grad_norm is None else float(trainer.grad_norm)
        # The scalars list is built at the hand-off, off the training steps.
        self._pending.append((step, time.time(), self._scalars, (metrics, lrs, grad_norm, trainer.state.current_epoch, rates)))
        if now - self._handed_off >= _HAND_OFF_S:
            self._hand_off()

    @staticmethod
    def _scalars(metrics: dict[str, float], lrs: list[list[float]], grad_norm: float | None, epoch: int,
                 rates: tuple[float, float] | None) -> list[tuple[str, float]]:
        """One logged step's scalars: the values, lr, grad_norm, epoch and throughput."""
        scalars = list(metrics.items())
        for i, groups in enumerate(lrs):  # lr, lr/group1, lr/optimizer1, lr/optimizer1/group1
            prefix = "lr" if len(lrs) == 1 else f"lr/optimizer{i}"
            scalars += [(prefix if len(groups) == 1 else f"{prefix}/group{j}", lr) for j, lr in enumerate(groups)]
        if grad_norm is not None:
            scalars.append(("grad_norm", grad_norm))
        scalars.append(("epoch", epoch))
        if rates is not None:
            scalars += [("throughput/steps_per_sec", rates[0]), ("throughput/samples_per_sec", rates[1])]
        return scalars

    def _hand_off(self) -> None:
        """Give the pending events to the writer: one per logged step, epoch end or evaluation."""
        self._handed_off = time.perf_counter()
        if self.writer is not None and self._pending:
            from tensorboard.compat.proto.summary_pb2 import Summary

            for step, walltime, build, args in self._pending:
                values = [Summary.Value(tag=tag, simple_value=float(value)) for tag, value in build(*args)]
                if values:
                    self.writer.file_writer.add_summary(Summary(value=values), step, walltime)
        self._pending.clear()

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        if self.writer is None:
            return
        self._add({f"{name}_epoch": value for name, value in trainer.train_epoch_metrics.items()}, trainer.global_step)
        self._flush_if_due()

    def _add(self, scalars: dict[str, float], step: int) -> None:
        """One event with ``scalars``, pending (SummaryWriter.add_scalar would build one per
        value, at about 100 us each, which short epochs pay at every epoch's end)."""
        self._pending.append((step, time.time(), tuple, (tuple(scalars.items()),)))

    def _flush_if_due(self) -> None:
        """Hand off and flush at most once a second: an epoch end or a validation shows in
        TensorBoard at once, and epochs of a few milliseconds neither each wake the writer's
        thread (which takes the GIL from training) nor each pay for a flush. What waits goes
        at the next due one, at the next training hand-off, or when the stage ends."""
        now = time.perf_counter()
        if now - self._flushed >= _FLUSH_GAP_S:
            self._flushed = now
            self._hand_off()
            self.writer.flush()

    # --- validation and test -----------------------------------------------------------
    def on_validation_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._paused_at = time.perf_counter()

    def on_validation_end(self, trainer: Trainer, module: TrainModule) -> None:
        if self._paused_at is not None and self._clock is not None and trainer.state.stage == "fit":
            # Throughput measures training: move the clock's start past the validation.
            t0, s0, n0 = self._clock
            self._clock = (t0 + time.perf_counter() - self._paused_at, s0, n0)
        self._paused_at = None
        self._write_eval(trainer)

    def on_test_end(self, trainer: Trainer, module: TrainModule) -> None:
        self._write_eval(trainer)

    def _write_eval(self, trainer: Trainer) -> None:
        if self.writer is None:
            return
        # After fit, global_step is where training ended: a later validate/test lands at the
        # end of the curves, where the weights it evaluated belong.
        self._add(trainer.logged_metrics, trainer.global_step)
        self._flush_if_due()


    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["writer"] = None  # never pickled into DDP workers
        state["_pending"] = []
        return state


def _summary_writer() -> type[SummaryWriter]:
    """torch's SummaryWriter, imported without boto3.

    tensorboard imports boto3 whenever it is installed, for ``s3://`` log dirs, which the run
    folder never is: about 10 MiB of memory and 0.3 s of start-up for nothing. A boto3 that
    is already imported is left alone. tensorboard decides once, at import, whether S3 works:
    code that uses tensorboard with ``s3://`` paths in the same process imports boto3 first.
    """
    missing = object()
    saved = {name: sys.modules.get(name, missing) for name in ("boto3", "botocore")}
    if saved["boto3"] is missing:
        sys.modules.update(dict.fromkeys(saved))  # None in sys.modules: `import boto3` raises ImportError
    try:
        from torch.utils.tensorboard import SummaryWriter
    finally:
        for name, module in saved.items():
            if module is missing:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return SummaryWriter


def _hparams(trainer: Trainer, module: TrainModule) -> dict[str, bool | int | float | str]:
    """The Trainer's options and the model's hparams, as values the HParams tab can show.

    Options left at None are left out, so that a column keeps one type (a number or a
    string) across runs and stays sortable and filterable.
    """
    params = {**{f"trainer/{k}": v for k, v in trainer.hparams().items()}, **getattr(module, "hparams", {})}
    return {str(k): v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in params.items() if v is not None}


# The HParams tab reads one "session start" (the values) per run and builds its columns from
# all runs; its metric columns are the runs' scalars. We write no "experiment" summary:
# TensorBoard would take the first run's as the whole experiment's, hiding the columns
# that other runs add. (tensorboard's own summary helpers need TensorFlow: built here.)
def _session_start(hparams: dict[str, bool | int | float | str]) -> Any:
    from tensorboard.plugins.hparams import plugin_data_pb2

    info = plugin_data_pb2.SessionStartInfo(start_time_secs=time.time())
    for name, value in hparams.items():
        if isinstance(value, bool):  # before int: True is an int too
            info.hparams[name].bool_value = value
        elif isinstance(value, (int, float)):
            info.hparams[name].number_value = value
        else:
            info.hparams[name].string_value = value
    return _hparams_summary("session_start_info", plugin_data_pb2.HParamsPluginData(session_start_info=info))


def _session_end_success() -> Any:
    from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2

    info = plugin_data_pb2.SessionEndInfo(status=api_pb2.STATUS_SUCCESS, end_time_secs=time.time())
    return _hparams_summary("session_end_info", plugin_data_pb2.HParamsPluginData(session_end_info=info))


def _hparams_summary(kind: str, data: Any) -> Any:
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import metadata

    tag = {"session_start_info": metadata.SESSION_START_INFO_TAG, "session_end_info": metadata.SESSION_END_INFO_TAG}[kind]
    return Summary(value=[Summary.Value(tag=tag, metadata=metadata.create_summary_metadata(data), tensor=metadata.NULL_TENSOR)])
