"""LearningRateMonitor: each optimizer's learning rate (and momentum, weight decay) under Lightning's names."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from trainer.core.checks import flag
from trainer.core.exceptions import misconfigured

from .base import Callback

if TYPE_CHECKING:
    import torch

    from trainer import Trainer, TrainModule


class LearningRateMonitor(Callback):
    """Logs ``lr-<Optimizer>`` to every logger: ``lr-Adam``, ``lr-Adam/pg1`` and ``lr-Adam/pg2``
    with several param groups (or ``lr-Adam/<name>`` for a group with a ``"name"``),
    ``lr-Adam-1`` for a second Adam; ``-momentum`` (SGD's ``momentum`` or Adam's first
    beta) and ``-weight_decay`` after the name with ``log_momentum``/``log_weight_decay``.

    ``logging_interval="step"`` logs every ``log_every_n_steps`` optimizer steps,
    ``"epoch"`` at each epoch's start, and ``None`` follows each scheduler's ``interval``
    (an optimizer without a scheduler at both). The values also go to
    ``trainer.callback_metrics``. A Trainer without a logger is an error, as in Lightning.
    (The Trainer logs no learning rate of its own: this callback is how a run gets one, as in Lightning.)
    """

    def __init__(
        self, logging_interval: str | None = None, log_momentum: bool = False, log_weight_decay: bool = False
    ) -> None:
        if logging_interval not in (None, "step", "epoch"):
            raise misconfigured(
                f"LearningRateMonitor(logging_interval={logging_interval!r}) must be 'step', 'epoch' or None "
                "(each scheduler's own interval).", "logging_interval should be `step` or `epoch` or `None`.",
            )
        self.logging_interval = logging_interval
        self.log_momentum = flag("LearningRateMonitor(log_momentum)", log_momentum)
        self.log_weight_decay = flag("LearningRateMonitor(log_weight_decay)", log_weight_decay)
        self.lrs: dict[str, list[float]] = {}
        # Lightning's: the last value logged of each group's momentum and weight decay (None: not logged)
        self.last_momentum_values: dict[str, float | None] = {}
        self.last_weight_decay_values: dict[str, float | None] = {}

    def on_train_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if not trainer.loggers:
            raise misconfigured(
                "LearningRateMonitor needs a logger to write to, and this Trainer has none (logger=False or "
                "log_dir=None). Pass Trainer(logger=True) or a logger, or drop the callback.",
                "Cannot use `LearningRateMonitor` callback with `Trainer` that has no logger.",
            )
        if self.log_momentum and any(
            "momentum" not in o.defaults and "betas" not in o.defaults for o in trainer.optimizers
        ):
            import warnings

            warnings.warn("You have set log_momentum=True, but some optimizers do not have momentum. "
                          "This will log a value 0 for the momentum.", RuntimeWarning, stacklevel=2)
        names = self._names(trainer)[0]
        self.lrs = {name: [] for name in names}
        self.last_momentum_values = {f"{name}-momentum": None for name in names}
        self.last_weight_decay_values = {f"{name}-weight_decay": None for name in names}

    def wants_hook(self, hook: str) -> bool:
        """The Trainer's question (see ``Callback``): the per-batch or per-epoch hook only for its interval."""
        if hook == "on_train_batch_start":
            return self.logging_interval != "epoch"
        if hook == "on_train_epoch_start":
            return self.logging_interval != "step"
        return True

    def on_train_batch_start(self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int) -> None:
        # Lightning's: before a step whose row the loggers get, the rates that step uses, at that row's step
        step = trainer.state.log_step
        if (step + 1) % trainer.log_every_n_steps == 0 or trainer.should_stop:
            self._log(trainer, "step" if self.logging_interval is None else "any", step)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._log(trainer, "epoch" if self.logging_interval is None else "any", trainer.state.log_step)

    def _log(self, trainer: Trainer, interval: str, step: int) -> None:
        names, optimizers, intervals = self._names(trainer)
        for name in names:  # Lightning's remap when an optimizer gains groups: "lr-SGD"'s values go on as "lr-SGD/pg1"
            if name not in self.lrs:
                self.lrs[name] = self.lrs.pop(name[:-4]) if name.endswith("/pg1") and name[:-4] in self.lrs else []
        stats: dict[str, float] = {}
        i = 0
        for opt, when in zip(optimizers, intervals):
            groups = opt.param_groups
            for group in groups:
                name = names[i]
                i += 1
                if interval != "any" and when not in (interval, None):
                    continue
                stats[name] = float(group["lr"])
                self.lrs[name].append(stats[name])
                if self.log_momentum:
                    key = f"{name}-momentum"
                    stats[key] = self.last_momentum_values[key] = float(
                        group["betas"][0] if "betas" in opt.defaults else group.get("momentum", 0)
                    )
                if self.log_weight_decay:
                    key = f"{name}-weight_decay"
                    stats[key] = self.last_weight_decay_values[key] = float(group.get("weight_decay", 0))
        if stats:
            trainer.callback_metrics.update(stats)
            for logger in trainer.loggers:
                logger.log_metrics(stats, step)

    @staticmethod
    def _names(trainer: Trainer) -> tuple[list[str], list[torch.optim.Optimizer], list[str | None]]:
        """One name per param group: optimizers with a scheduler first, as Lightning orders them."""
        configs = list(trainer.lr_scheduler_configs)
        ordered: list[tuple[Any, str | None, str | None]] = []  # (optimizer, scheduler's name, interval)
        for config in configs:
            ordered.append((config.scheduler.optimizer, getattr(config, "name", None), config.interval))
        seen = [o for o, _, _ in ordered]
        ordered += [(o, None, None) for o in trainer.optimizers if o not in seen]
        counts: defaultdict[type, int] = defaultdict(int)
        names: list[str] = []
        for opt, given, _ in ordered:
            counts[type(opt)] += 1
            base = given or f"lr-{type(opt).__name__}"
            if given is None and counts[type(opt)] > 1:
                base += f"-{counts[type(opt)] - 1}"
            groups = opt.param_groups
            given_names = [g["name"] for g in groups if g.get("name")]
            if len(set(given_names)) < len(given_names):
                duplicates = sorted({n for n in given_names if given_names.count(n) > 1})
                raise misconfigured(
                    "Give each param group of an optimizer its own 'name'.",
                    "A single `Optimizer` cannot have multiple parameter groups with identical "
                    f"`name` values. {base} has duplicated parameter group names {duplicates}",
                )
            for j, group in enumerate(groups):
                if len(groups) > 1:
                    names.append(f"{base}/{group.get('name', f'pg{j + 1}')}")
                else:
                    names.append(f"{base}/{group['name']}" if group.get("name") else base)
        return names, [o for o, _, _ in ordered], [w for _, _, w in ordered]
