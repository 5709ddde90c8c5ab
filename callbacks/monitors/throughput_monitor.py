"""ThroughputMonitor: samples, batches, items and FLOPs per second of each stage, to the loggers at Lightning's keys."""

from __future__ import annotations

import time
import warnings
from typing import TYPE_CHECKING, Any, Callable

import torch

from ..base import Callback
from ._cadence import LogCadence
from trainer.utilities.throughput import Throughput, compute_dtype, get_available_flops

if TYPE_CHECKING:
    from trainer import Trainer, TrainModule

_STAGE_OF = {"fit": "train", "validate": "validate", "test": "test", "predict": "predict"}


class ThroughputMonitor(Callback):
    """Measures each stage's throughput with a :class:`Throughput` per stage and logs it on the
    logging steps (every ``log_every_n_steps``, as Lightning counts them; in training only
    after an optimizer step, so that a row covers whole accumulation groups):
    ``train/time``, ``train/batches``, ``train/samples``, ``train/lengths`` (with
    ``length_fn``), and once ``window_size`` batches are in ``train/device/batches_per_sec``,
    ``.../samples_per_sec``, ``.../items_per_sec``, ``.../flops_per_sec`` and ``.../mfu``
    (``validate/``, ``test/`` and ``predict/`` likewise). Training rows are at the training
    step with ``epoch``; an evaluation's at the count of that loop's batches. Validation time
    inside fit is not counted as training time.

    ``batch_size_fn(batch)`` gives a batch's samples, ``length_fn(batch)`` its items (tokens,
    say); the other keywords go to :class:`Throughput` (``window_size``, ``separator``, ...).
    FLOPs come from the model's ``flops_per_batch`` attribute (``measure_flops`` computes
    one); MFU needs a GPU whose peak FLOPs are known. Global rank 0 measures.
    """

    def __init__(
        self, batch_size_fn: Callable[[Any], int], length_fn: Callable[[Any], int] | None = None, **kwargs: Any
    ) -> None:
        if not callable(batch_size_fn):
            raise TypeError(
                f"ThroughputMonitor(batch_size_fn={batch_size_fn!r}) must be a function of the batch, "
                "e.g. lambda b: b[0].size(0)."
            )
        if length_fn is not None and not callable(length_fn):
            raise TypeError(f"ThroughputMonitor(length_fn={length_fn!r}) must be a function of the batch, or None.")
        self.kwargs = kwargs
        Throughput(**kwargs)  # its arguments checked now, not at fit
        self.batch_size_fn = batch_size_fn
        self.length_fn = length_fn
        self.available_flops: int | None = None
        self._throughputs: dict[str, Throughput] = {}
        self._t0s: dict[str, float] = {}
        self._lengths: dict[str, int] = {}
        self._samples: dict[str, int] = {}
        self._batches: dict[str, int] = {}
        self._module_has_flops: bool | None = None
        self._cadence = LogCadence()

    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        self.available_flops = get_available_flops(trainer.strategy.root_device, compute_dtype(trainer.precision))
        stages = ["train", "validate"] if stage == "fit" else [_STAGE_OF.get(str(stage), str(stage))]
        for name in stages:
            self._throughputs[name] = Throughput(
                available_flops=self.available_flops, world_size=trainer.world_size, **self.kwargs
            )

    def _stage(self, trainer: Trainer) -> str:
        return str(trainer.state.stage)

    def _start(self, trainer: Trainer) -> None:
        stage = self._stage(trainer)
        if stage not in self._throughputs:
            self._throughputs[stage] = Throughput(
                available_flops=self.available_flops, world_size=trainer.world_size, **self.kwargs
            )
        if trainer.state.fn == "fit" or stage not in self._samples:  # validate/test/predict count on across calls
            self._throughputs[stage].reset()
            self._lengths[stage] = self._samples[stage] = self._batches[stage] = 0
        self._t0s[stage] = time.perf_counter()

    def _update(self, trainer: Trainer, pl_module: TrainModule, batch: Any) -> None:
        stage = self._stage(trainer)
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()  # the clock must see the batch's kernels finished
        elapsed = time.perf_counter() - self._t0s[stage]
        with torch.inference_mode():  # batch_size_fn or length_fn may compute
            if self.length_fn is not None:
                self._lengths[stage] += self.length_fn(batch)
            self._samples[stage] += self.batch_size_fn(batch)
        self._batches[stage] += 1
        if self._module_has_flops is None:
            self._module_has_flops = hasattr(pl_module, "flops_per_batch")
            if not self._module_has_flops:
                warnings.warn(
                    "When using the `ThroughputMonitor`, you need to define a `flops_per_batch` attribute or property"
                    f" in {type(pl_module).__name__} to compute the FLOPs.",
                    UserWarning,
                    stacklevel=2,
                )
        self._throughputs[stage].update(
            time=elapsed,
            batches=self._batches[stage],
            samples=self._samples[stage],
            lengths=None if self.length_fn is None else self._lengths[stage],
            flops=pl_module.flops_per_batch if self._module_has_flops else None,
        )

    def _compute(self, trainer: Trainer, step: int | None = None) -> None:
        if not self._cadence.due(trainer):
            return
        stage = self._stage(trainer)
        throughput = self._throughputs[stage]
        metrics = {f"{stage}{throughput.separator}{k}": v for k, v in throughput.compute().items()}
        self._cadence.write(trainer, metrics, step)

    # --- training ------------------------------------------------------------------------
    def on_train_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if trainer.is_global_zero:
            self._start(trainer)

    def on_train_batch_start(self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int) -> None:
        self._cadence.train_batch_start(trainer)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not trainer.is_global_zero:
            return
        self._update(trainer, pl_module, batch)
        accumulate, limit = trainer.accumulate_grad_batches, trainer.num_training_batches
        if accumulate == 1 or (batch_idx + 1) % accumulate == 0 or batch_idx + 1 == limit:  # the optimizer stepped
            self._compute(trainer)

    # --- validation, test, predict -------------------------------------------------------
    def _eval_start(self, trainer: Trainer) -> None:
        self._cadence.eval_start()
        if trainer.is_global_zero and not trainer.sanity_checking:
            self._start(trainer)

    def _eval_batch_end(self, trainer: Trainer, pl_module: TrainModule, batch: Any) -> None:
        if trainer.is_global_zero and not trainer.sanity_checking:
            self._update(trainer, pl_module, batch)
            self._compute(trainer, self._cadence.totals[(str(trainer.state.fn), self._stage(trainer))])

    def on_validation_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._eval_start(trainer)

    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._cadence.eval_batch_start(trainer)

    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._eval_batch_end(trainer, pl_module, batch)

    def on_validation_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if not trainer.is_global_zero or trainer.sanity_checking or trainer.state.fn != "fit":
            return
        # move training's start past the validation, so that training's rates do not count it
        train_elapsed, val_elapsed = self._throughputs["train"].last_time, self._throughputs["validate"].last_time
        gap = self._t0s["validate"] - (self._t0s["train"] + train_elapsed)
        self._t0s["train"] += gap + val_elapsed

    def on_test_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._eval_start(trainer)

    def on_test_batch_start(
        self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._cadence.eval_batch_start(trainer)

    def on_test_batch_end(
        self,
        trainer: Trainer,
        pl_module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._eval_batch_end(trainer, pl_module, batch)

    def on_predict_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._eval_start(trainer)

    def on_predict_batch_start(
        self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._cadence.eval_batch_start(trainer)

    def on_predict_batch_end(
        self,
        trainer: Trainer,
        pl_module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._eval_batch_end(trainer, pl_module, batch)
