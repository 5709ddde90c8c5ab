"""DeviceStatsMonitor: the device's memory statistics (and the CPU's load) to the loggers, at Lightning's keys."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

import torch

from trainer.core.exceptions import misconfigured

from ..base import Callback
from ._cadence import LogCadence

if TYPE_CHECKING:
    from trainer import Trainer, TrainModule

_INSTALL = 'pip install psutil (or pip install "steadytrainer[monitors]")'


def _psutil_available() -> bool:
    return importlib.util.find_spec("psutil") is not None


def get_cpu_stats() -> dict[str, float]:
    """The machine's memory and CPU use, in percent (``psutil``), under Lightning's keys."""
    try:
        import psutil
    except ImportError as err:
        raise ModuleNotFoundError(f"Fetching CPU device stats requires `psutil` to be installed: {_INSTALL}.") from err
    return {
        "cpu_vm_percent": psutil.virtual_memory().percent,
        "cpu_percent": psutil.cpu_percent(),
        "cpu_swap_percent": psutil.swap_memory().percent,
    }


def get_device_stats(device: torch.device) -> dict[str, Any]:
    """What Lightning's accelerator reports for ``device``: ``torch.cuda.memory_stats`` on a GPU
    (bytes and counts of the caching allocator), the machine's under ``M1_*`` names on Apple
    silicon, and ``get_cpu_stats()`` on the CPU."""
    if device.type == "cuda":
        return torch.cuda.memory_stats(device)
    if device.type == "mps":
        return {f"M1_{k[len('cpu_') :]}": v for k, v in get_cpu_stats().items()}
    return get_cpu_stats()


class DeviceStatsMonitor(Callback):
    """Logs the device's statistics at the start and end of every training, validation and
    test batch on a logging step (every ``log_every_n_steps`` steps, as Lightning counts them),
    as ``DeviceStatsMonitor.on_train_batch_end/<key>`` (the logger's ``group_separator``
    between): on a GPU, ``torch.cuda.memory_stats``' keys (``allocated_bytes.all.current``,
    ``reserved_bytes.all.peak``, ``num_ooms``, ...); on the CPU, ``cpu_percent``,
    ``cpu_vm_percent`` and ``cpu_swap_percent`` (through ``psutil``: ``pip install
    "steadytrainer[monitors]"``).

    ``cpu_stats=None`` logs the CPU's only when training on the CPU, ``True`` also beside a
    GPU's, ``False`` never. ``filter_keys`` keeps only those keys (named without the prefix);
    a key that the device does not report is warned about once, at setup. Fit needs a logger.
    """

    def __init__(self, cpu_stats: bool | None = None, filter_keys: set[str] | None = None) -> None:
        if cpu_stats not in (None, True, False):
            raise misconfigured(
                f"DeviceStatsMonitor(cpu_stats={cpu_stats!r}) must be None, True or False.", type_error=True
            )
        self._cpu_stats = cpu_stats
        self._filter_keys = None if filter_keys is None else set(filter_keys)
        self._cadence = LogCadence()

    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if stage != "fit":
            return
        if not trainer.loggers:
            raise misconfigured(
                "DeviceStatsMonitor writes to the loggers: pass Trainer(logger=True) or a logger, "
                "or drop the callback.",
                "Cannot use `DeviceStatsMonitor` callback with `Trainer(logger=False)`.",
            )
        device = trainer.strategy.root_device
        needs_psutil = self._cpu_stats or (self._cpu_stats is None and device.type in ("cpu", "mps"))
        if needs_psutil and not _psutil_available():
            raise ModuleNotFoundError(
                f"`DeviceStatsMonitor` cannot log CPU stats as `psutil` is not installed: {_INSTALL}."
            )
        if self._filter_keys is not None:
            unknown = self._filter_keys - self._stats(device).keys()
            if unknown:
                import warnings

                warnings.warn(
                    "`DeviceStatsMonitor` filter_keys contains keys not found in device stats and will be ignored:"
                    f" {unknown}",
                    UserWarning,
                    stacklevel=2,
                )

    def _stats(self, device: torch.device) -> dict[str, Any]:
        stats = dict(get_device_stats(device))
        if self._cpu_stats and device.type != "cpu":  # the CPU's beside the device's (once, on the CPU)
            stats.update(get_cpu_stats())
        return stats

    def _log(self, trainer: Trainer, hook: str, step: int) -> None:
        if not self._cadence.due(trainer):
            return
        device = trainer.strategy.root_device
        if self._cpu_stats is False and device.type == "cpu":
            return
        stats = self._stats(device)
        if self._filter_keys is not None:
            stats = {k: v for k, v in stats.items() if k in self._filter_keys}
        prefix = f"{type(self).__qualname__}.{hook}"
        for logger in trainer.loggers:
            separator = logger.group_separator
            logger.log_metrics({f"{prefix}{separator}{k}": v for k, v in stats.items()}, step=step)

    def on_train_batch_start(self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int) -> None:
        self._cadence.train_batch_start(trainer)
        self._log(trainer, "on_train_batch_start", self._cadence.stepped)

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._log(trainer, "on_train_batch_end", self._cadence.stepped)

    def on_validation_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._cadence.eval_start()

    def on_test_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._cadence.eval_start()

    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._cadence.eval_batch_start(trainer)
        self._log(trainer, "on_validation_batch_start", trainer.state.log_step)

    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._log(trainer, "on_validation_batch_end", trainer.state.log_step)

    def on_test_batch_start(
        self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._cadence.eval_batch_start(trainer)
        self._log(trainer, "on_test_batch_start", trainer.state.log_step)

    def on_test_batch_end(
        self,
        trainer: Trainer,
        pl_module: TrainModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._log(trainer, "on_test_batch_end", trainer.state.log_step)
