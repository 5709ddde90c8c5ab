"""Turning what ``configure_optimizers`` returns into an optimizer and a scheduler plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.optim import Optimizer

_INTERVALS = ("epoch", "step")
_SHAPES = (
    "an optimizer, (optimizer, scheduler), or "
    "dict(optimizer=..., lr_scheduler=..., interval='epoch'|'step', monitor=...)"
)


@dataclass
class OptimizerSetup:
    optimizer: Optimizer
    scheduler: Any = None
    interval: str = "epoch"
    monitor: str | None = None

    @property
    def scheduler_needs_metric(self) -> bool:
        return isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)

    def step_scheduler(self, metrics: dict[str, float]) -> None:
        if self.scheduler is None:
            return
        if not self.scheduler_needs_metric:
            self.scheduler.step()
            return
        if self.monitor not in metrics:
            raise ValueError(
                f"lr_scheduler monitor={self.monitor!r} was not logged. Logged metrics: "
                f"{sorted(metrics) or 'none'}. Log it with self.log({self.monitor!r}, value)."
            )
        self.scheduler.step(metrics[self.monitor])


def resolve_optimizers(module: torch.nn.Module, factory: Callable[..., Optimizer] | None) -> OptimizerSetup:
    """The optimizer from ``module.configure_optimizers()``, else from ``Trainer(optimizer=...)``."""
    result = module.configure_optimizers() if hasattr(module, "configure_optimizers") else None
    if result is None:
        if factory is None:
            raise ValueError(
                f"No optimizer: {type(module).__name__}.configure_optimizers() returned None and "
                "Trainer(optimizer=...) was not given. Define configure_optimizers() or pass "
                "Trainer(optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3))."
            )
        try:
            result = factory(module.parameters())
        except TypeError as err:  # e.g. a factory that takes no argument
            raise TypeError(
                f"Trainer(optimizer={factory!r}) failed when called with the model's parameters: {err}. "
                "It must take them as its one argument, e.g. optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3)."
            ) from err
        return _parse(result, f"Trainer(optimizer=...) returned {result!r}")
    return _parse(result, f"{type(module).__name__}.configure_optimizers() returned {result!r}")


def _parse(result: Any, where: str) -> OptimizerSetup:
    if isinstance(result, Optimizer):
        return OptimizerSetup(result)
    if isinstance(result, (tuple, list)) and len(result) == 2 and isinstance(result[0], Optimizer):
        return _with_scheduler(result[0], result[1], "epoch", None, where)
    if isinstance(result, dict) and isinstance(result.get("optimizer"), Optimizer):
        unknown = set(result) - {"optimizer", "lr_scheduler", "interval", "monitor"}
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}. Expected {_SHAPES}.")
        sched = result.get("lr_scheduler")
        interval, monitor = result.get("interval", "epoch"), result.get("monitor")
        if isinstance(sched, dict):  # Lightning's nested form: {"scheduler": s, "interval": ...}
            interval, monitor = sched.get("interval", interval), sched.get("monitor", monitor)
            sched = sched.get("scheduler")
        return _with_scheduler(result["optimizer"], sched, interval, monitor, where)
    raise TypeError(f"{where}, which is not usable. Return {_SHAPES}.")


def _with_scheduler(opt: Optimizer, sched: Any, interval: str, monitor: str | None, where: str) -> OptimizerSetup:
    if interval not in _INTERVALS:
        raise ValueError(f"{where}: interval={interval!r} must be 'epoch' or 'step'.")
    if isinstance(sched, Optimizer):  # an optimizer has step() too, and would pass for a scheduler
        raise TypeError(
            f"{where}: the second item is another optimizer. One optimizer per model is supported: "
            "put every parameter in it (use param groups for different learning rates)."
        )
    if sched is not None and not callable(getattr(sched, "step", None)):
        raise TypeError(f"{where}: the scheduler {sched!r} has no step() method.")
    setup = OptimizerSetup(opt, sched, interval, monitor)
    if setup.scheduler_needs_metric and monitor is None:
        raise ValueError(f"{where}: ReduceLROnPlateau needs monitor='<logged metric name>'.")
    return setup
