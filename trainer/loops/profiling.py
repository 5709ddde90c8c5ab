"""``Trainer(profiler=...)``: what the loops time, with Lightning's action names.

The loops never ask whether profiling is on inside their per-batch body. When a stage starts,
:meth:`Profiling.of` decides once whether the profiler records anything (a
``PassThroughProfiler``, the default, does not): if it does, the run holds a ``Profiling``, and
the pieces that the body calls are swapped, once per stage or epoch, for timed versions of
themselves: the hooks (``[Callback]<state_key>.<hook>``, ``[LightningModule]<class>.<hook>``:
hooks.py), the steps (``[Strategy]<class>.training_step``, ``.validation_step``, ...),
backward (``[Strategy]<class>.backward``), each ``optimizer.step()`` (``optimizer_step``,
through torch's step hooks), the batch iterators (``[_TrainingEpochLoop].train_dataloader_next``,
``[_EvaluationLoop].val_next``, ...), each training batch (``run_training_batch``, from the last
``on_train_batch_start`` function to the first ``on_train_batch_end`` one) and each training
epoch's batches (``run_training_epoch``). If it records nothing, ``run.profiling`` is None,
nothing is swapped, and the run costs what it costs without a profiler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator

if TYPE_CHECKING:
    from trainer.profilers import Profiler
    from trainer.trainer import Trainer


class Profiling:
    """A recording profiler's timers for one stage (``run.profiling``)."""

    def __init__(self, profiler: Profiler) -> None:
        self.profiler = profiler
        self._handles: list[Any] = []  # torch's step hooks on the optimizers, removed when the stage ends
        self._batch_open = False

    @staticmethod
    def of(profiler: Profiler) -> Profiling | None:
        """A ``Profiling`` if ``profiler`` records anything; None if its start and stop are PassThroughProfiler's."""
        from trainer.profilers.base import PassThroughProfiler

        cls = type(profiler)
        passing = cls.start is PassThroughProfiler.start and cls.stop is PassThroughProfiler.stop
        return None if passing else Profiling(profiler)

    # --- the stage ---------------------------------------------------------------------
    def begin_stage(self, trainer: Trainer, stage: str, module: Any) -> None:
        """Lightning's: the profiler set up (the rank under several processes, trainer.log_dir), given the module."""
        local_rank = trainer.local_rank if trainer.world_size > 1 else None
        self.profiler.setup(stage=stage, local_rank=local_rank, log_dir=trainer.log_dir)
        self.profiler.setup_module(module)

    def end_stage(self) -> None:
        """After the ``teardown`` hooks, on every rank: the report written, the optimizers' hooks gone."""
        self._close_batch()
        for handle in self._handles:
            handle.remove()
        self._handles = []
        try:
            self.profiler.describe()
        finally:
            self.profiler.setup_module(None)

    # --- timed versions ----------------------------------------------------------------
    def timed(self, action: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, each call recorded as ``action``."""
        start, stop = self.profiler.start, self.profiler.stop

        def run(*args: Any, **kwargs: Any) -> Any:
            start(action)
            try:
                return fn(*args, **kwargs)
            finally:
                stop(action)

        return run

    def strategy_call(self, strategy: Any, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, the strategy's ``name`` (``training_step``, ``backward``, ...), as ``[Strategy]<class>.<name>``."""
        return self.timed(f"[Strategy]{type(strategy).__name__}.{name}", fn)

    def timed_iter(self, action: str, batches: Iterable[Any]) -> Iterator[Any]:
        """``batches``, each ``next`` recorded as ``action`` (the last one, which finds the end, too)."""
        start, stop, it = self.profiler.start, self.profiler.stop, iter(batches)
        while True:
            start(action)
            try:
                batch = next(it)
            except StopIteration:
                return
            finally:
                stop(action)
            yield batch

    def time_optimizers(self, optimizers: Iterable[Any]) -> None:
        """Record each ``optimizer.step()`` as ``optimizer_step``, until the stage ends."""
        start, stop = self.profiler.start, self.profiler.stop

        def before(optimizer: Any, args: Any, kwargs: Any) -> None:
            start("optimizer_step")

        def after(optimizer: Any, args: Any, kwargs: Any) -> None:
            stop("optimizer_step")

        for optimizer in optimizers:
            self._handles += [optimizer.register_step_pre_hook(before), optimizer.register_step_post_hook(after)]

    def epoch(self, train_epoch: Callable[..., bool]) -> Callable[..., bool]:
        """``train_epoch`` (a training epoch's batches), each call recorded as ``run_training_epoch``."""

        def run(*args: Any) -> bool:
            self.profiler.start("run_training_epoch")
            try:
                return train_epoch(*args)
            finally:
                self._close_batch()  # a batch whose on_train_batch_start ended the epoch (-1) never reached its end
                self.profiler.stop("run_training_epoch")

        return run

    def batch_start(self, *args: Any) -> None:
        """The last ``on_train_batch_start`` function: ``run_training_batch`` starts."""
        self._close_batch()
        self.profiler.start("run_training_batch")
        self._batch_open = True

    def batch_end(self, *args: Any) -> None:
        """The first ``on_train_batch_end`` function: ``run_training_batch`` stops."""
        self._close_batch()

    def _close_batch(self) -> None:
        if self._batch_open:
            self._batch_open = False
            self.profiler.stop("run_training_batch")
