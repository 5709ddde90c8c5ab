"""Turning what ``configure_optimizers`` returns into optimizers and a scheduler plan.

The shapes are Lightning's: an optimizer; ``(optimizer, scheduler)``; a dict
``dict(optimizer=..., lr_scheduler=..., interval=..., monitor=...)``; a list of optimizers;
``([optimizers], [schedulers])``; or a list of such dicts. A scheduler may itself be a dict
``{"scheduler": s, "interval": "epoch" | "step", "monitor": name}``.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.optim import Optimizer

from trainer.core.exceptions import MisconfigurationException, misconfigured
from trainer.core.module import overridden
from trainer.loops.hooks import refusing_logs
from trainer.utilities.types import LRSchedulerConfig

_INTERVALS = ("epoch", "step")
_SHAPES = (
    "an optimizer, (optimizer, scheduler), dict(optimizer=..., lr_scheduler=..., interval='epoch'|'step', "
    "monitor=...), a list of optimizers, ([optimizers], [schedulers]), or a list of such dicts"
)


def _step_one(
    config: LRSchedulerConfig, metrics: dict[str, float], own_step: Callable[[Any, Any], None] | None = None
) -> None:
    """Step ``config``'s scheduler; ``own_step`` is the model's ``lr_scheduler_step(scheduler, metric)``."""
    if not config.reduce_on_plateau and (own_step is None or config.monitor is None):
        if own_step is None:
            config.scheduler.step()
        else:
            own_step(config.scheduler, None)
        return
    if config.monitor not in metrics:
        if not config.strict:
            warnings.warn(
                f"ReduceLROnPlateau conditioned on metric {config.monitor} which is not available but strict is set "
                "to `False`. Skipping learning rate update.", RuntimeWarning, stacklevel=3,
            )
            return
        raise misconfigured(
            f"lr_scheduler monitor={config.monitor!r} was not logged. Logged metrics: {sorted(metrics) or 'none'}. "
            f"Log it with self.log({config.monitor!r}, value), "
            "or give the scheduler dict 'strict': False to skip the step.",
            f"ReduceLROnPlateau conditioned on metric {config.monitor} which is not available. "
            f"Available metrics are: {list(metrics)}. "
            "Condition can be set using `monitor` key in lr scheduler dict.",
        )
    if own_step is None:
        config.scheduler.step(metrics[config.monitor])
    else:
        own_step(config.scheduler, metrics[config.monitor])


@dataclass
class OptimizerSetup:
    """The optimizers in the order given, and their schedulers. Under automatic optimization the
    Trainer steps each scheduler at its interval; under manual optimization the module does."""

    optimizers: list[Optimizer]
    schedulers: list[LRSchedulerConfig] = field(default_factory=list)
    automatic: bool = True
    # The model's overrides of Lightning's optimization hooks (optimizer_step, optimizer_zero_grad,
    # lr_scheduler_step, configure_gradient_clipping): name -> bound method; empty for most models.
    own: dict[str, Callable[..., Any]] = field(default_factory=dict)

    @property
    def optimizer(self) -> Optimizer:
        return self.optimizers[0]

    @property
    def scheduler(self) -> Any:
        return self.schedulers[0].scheduler if self.schedulers else None

    def steps_at(self, interval: str) -> bool:
        """Whether the Trainer steps a scheduler at every ``interval`` ('step' or 'epoch')."""
        return self.automatic and any(s.interval == interval for s in self.schedulers)

    def needs_metric_at(self, interval: str) -> bool:
        return any(s.interval == interval and s.reduce_on_plateau for s in self.schedulers)

    def step_schedulers(
        self, interval: str, metrics: dict[str, float], index: int, plateau: bool | None = None
    ) -> None:
        """Step the ``interval`` schedulers due at ``index``: the batch in the epoch ("step", from 1)
        or the epoch ("epoch", from 1), a multiple of each one's ``frequency``, as Lightning's.
        ``plateau``: only the ReduceLROnPlateau ones (True), only the others (False), or all (None)."""
        if not self.automatic:
            return
        own_step = self.own.get("lr_scheduler_step")
        for config in self.schedulers:
            if config.interval == interval and index % config.frequency == 0 and plateau in (
                None, config.reduce_on_plateau
            ):
                if own_step is None:
                    _step_one(config, metrics)
                    continue
                with refusing_logs():  # Lightning's: self.log raises in lr_scheduler_step
                    _step_one(config, metrics, own_step)


def resolve_optimizers(module: torch.nn.Module, factory: Callable[..., Optimizer] | None) -> OptimizerSetup:
    """The optimizers from ``module.configure_optimizers()``, else from ``Trainer(optimizer=...)``."""
    configure = getattr(module, "configure_optimizers", None)
    result = configure() if callable(configure) else None
    own_configure = callable(configure) and (
        overridden(module, "configure_optimizers") or "configure_optimizers" in vars(module))
    if result is None and factory is None and own_configure:  # Lightning's: a fit that steps nothing
        warnings.warn(
            f"`LightningModule.configure_optimizers` returned `None`, this fit will run with no optimizer "
            f"({type(module).__name__}.configure_optimizers(): training_step and backward run, no weight changes).",
            UserWarning, stacklevel=2,
        )
        result = NoOptimizer()
    if result is None:
        if factory is None:
            raise misconfigured(
                f"No optimizer: {type(module).__name__}.configure_optimizers() returned None and "
                "Trainer(optimizer=...) was not given. Define configure_optimizers() or pass "
                "Trainer(optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3)).",
                "No `configure_optimizers()` method defined. "
                "Lightning `Trainer` expects as minimum a `training_step()`, `train_dataloader()` "
                "and `configure_optimizers()` to be defined."
                if not own_configure else "",
            )
        try:
            result = factory(module.parameters())
        except TypeError as err:  # e.g. a factory that takes no argument
            raise TypeError(
                f"Trainer(optimizer={factory!r}) failed when called with the model's parameters: {err}. "
                "It must take them as its one argument, "
                "e.g. optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3)."
            ) from err
        where = f"Trainer(optimizer=...) returned {result!r:.200}"
    else:
        where = f"{type(module).__name__}.configure_optimizers() returned {result!r:.200}"
    setup = _parse(result, where)
    setup.automatic = getattr(module, "automatic_optimization", True)
    if not setup.automatic:
        _warn_ignored_keys(result)
    # The Trainer steps a ReduceLROnPlateau on its monitor; under manual optimization the module steps it.
    if setup.automatic and any(c.reduce_on_plateau and c.monitor is None for c in setup.schedulers):
        raise MisconfigurationException(
            "`configure_optimizers` must include a monitor when a `ReduceLROnPlateau` scheduler is used. For example: "
            '{"optimizer": optimizer, "lr_scheduler": scheduler, "monitor": "metric_to_track"}. '
            f"{where}: ReduceLROnPlateau needs monitor='<logged metric name>'."
        )
    # Lightning's is_overridden also counts a hook set on the instance (model.lr_scheduler_step = fn)
    setup.own = {name: getattr(module, name) for name in _OWN if overridden(module, name) or name in vars(module)}
    _check_scheduler_api(setup, type(module).__name__)
    return setup


def _check_scheduler_api(setup: OptimizerSetup, name: str) -> None:
    """Lightning's checks at the start of fit: a scheduler is saved in checkpoints, so it needs
    ``state_dict``/``load_state_dict``; one from outside ``torch.optim`` has a ``step`` the Trainer
    cannot know how to call, so the model steps it in ``lr_scheduler_step`` (automatic optimization)."""
    torch_types = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    for config in setup.schedulers:
        kind = type(config.scheduler).__name__
        if not all(callable(getattr(config.scheduler, m, None)) for m in ("state_dict", "load_state_dict")):
            raise TypeError(
                f"The provided lr scheduler `{kind}` is invalid. It should have `state_dict` and `load_state_dict` "
                "methods defined. Checkpoints save and restore a scheduler through them."
            )
        if setup.automatic and not isinstance(config.scheduler, torch_types) and "lr_scheduler_step" not in setup.own:
            raise MisconfigurationException(
                f"The provided lr scheduler `{kind}` doesn't follow PyTorch's LRScheduler API. You should override "
                f"the `LightningModule.lr_scheduler_step` hook with your own logic if you are using a custom LR "
                f"scheduler. Define {name}.lr_scheduler_step(self, scheduler, metric) and call its step there, "
                "e.g. scheduler.step(epoch=self.current_epoch)."
            )


_OWN = ("optimizer_step", "optimizer_zero_grad", "lr_scheduler_step", "configure_gradient_clipping")
_TRAINER_STEPPING_KEYS = ("reduce_on_plateau", "monitor", "strict")  # what only the Trainer's own stepping reads


def _warn_ignored_keys(result: Any) -> None:
    """Lightning's warning: under manual optimization the module steps its schedulers, so a
    scheduler dict's ``monitor`` (``strict``, ``reduce_on_plateau``) is read by nobody."""
    items = [result] if isinstance(result, dict) else list(result) if isinstance(result, (list, tuple)) else []
    configs = []
    for item in items:
        if isinstance(item, dict) and "lr_scheduler" in item:  # {"optimizer", "lr_scheduler", "monitor"}
            inner = item["lr_scheduler"]
            configs.append(
                {**(inner if isinstance(inner, dict) else {}), **({"monitor": 0} if "monitor" in item else {})}
            )
        elif isinstance(item, (list, tuple)):  # ([optimizers], [schedulers or scheduler dicts])
            configs += [c for c in item if isinstance(c, dict)]
    for config in configs:
        keys = [k for k in config if k in _TRAINER_STEPPING_KEYS]
        if keys:
            warnings.warn(
                f"The lr scheduler dict contains the key(s) {keys}, but the keys will be ignored. You need to call "
                "`lr_scheduler.step()` manually in manual optimization.", RuntimeWarning, stacklevel=2,
            )


def _parse(result: Any, where: str) -> OptimizerSetup:
    if isinstance(result, Optimizer):
        return OptimizerSetup([result])
    if isinstance(result, dict):
        return _from_dicts([result], where)
    if isinstance(result, (tuple, list)) and result:
        if all(isinstance(x, Optimizer) for x in result):
            return _checked(OptimizerSetup(list(result)), where)
        if all(isinstance(x, dict) for x in result):
            return _from_dicts(list(result), where)
        if len(result) == 2 and isinstance(result[0], Optimizer):  # (optimizer, scheduler)
            return _checked(OptimizerSetup([result[0]], [_scheduler(result[1], "epoch", None, where)]), where)
        if len(result) == 2 and all(isinstance(x, (list, tuple)) for x in result):  # ([opts], [scheds])
            opts, scheds = result
            if opts and all(isinstance(x, Optimizer) for x in opts):
                configs = [_scheduler(s, "epoch", None, where) for s in scheds]
                return _checked(OptimizerSetup(list(opts), configs), where)
    raise misconfigured(f"{where}, which is not usable. Return {_SHAPES}.", _UNKNOWN, type_error=True)


_UNKNOWN = "Unknown configuration for model optimizers."  # Lightning's sentence


def _from_dicts(items: list[dict[str, Any]], where: str) -> OptimizerSetup:
    setup = OptimizerSetup([])
    for item in items:
        if not isinstance(item.get("optimizer"), Optimizer):
            raise misconfigured(f"{where}: a dict without an 'optimizer'. Return {_SHAPES}.", _UNKNOWN, type_error=True)
        unknown = set(item) - {"optimizer", "lr_scheduler", "interval", "monitor"}
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}. Expected {_SHAPES}.")
        setup.optimizers.append(item["optimizer"])
        if item.get("lr_scheduler") is not None:
            setup.schedulers.append(
                _scheduler(item["lr_scheduler"], item.get("interval", "epoch"), item.get("monitor"), where)
            )
    return _checked(setup, where)


def _scheduler(sched: Any, interval: str, monitor: str | None, where: str) -> LRSchedulerConfig:
    if isinstance(sched, dict):  # Lightning's nested form: {"scheduler": s, "interval": ...}
        unsupported = sched.keys() - {
            "scheduler", "name", "interval", "frequency", "reduce_on_plateau", "monitor", "strict"
        }
        if unsupported:
            warnings.warn(f"Found unsupported keys in the lr scheduler dict: {unsupported}. HINT: remove them from the "
                          "output of `configure_optimizers`.", RuntimeWarning, stacklevel=2)
        interval, monitor, name = sched.get("interval", interval), sched.get("monitor", monitor), sched.get("name")
        frequency, strict = sched.get("frequency", 1), sched.get("strict", True)
        plateau = sched.get("reduce_on_plateau")
        if isinstance(frequency, bool) or not isinstance(frequency, int) or frequency < 1:
            raise ValueError(
                f"{where}: frequency={frequency!r} must be an int >= 1 (step the scheduler every n {interval}s)."
            )
        if "scheduler" not in sched:
            raise misconfigured(
                f"{where}: the dict has no 'scheduler'.",
                'The lr scheduler dict must have the key "scheduler" with its item being an lr scheduler.',
            )
        sched = sched.get("scheduler")
    else:
        name, frequency, strict, plateau = None, 1, True, None
    if interval not in _INTERVALS:
        raise misconfigured(f"{where}: interval={interval!r} must be 'epoch' or 'step'.",
                            f'The "interval" key in lr scheduler dict must be "step" or "epoch" but is "{interval}".')
    if isinstance(sched, Optimizer):  # an optimizer has step() too, and would pass for a scheduler
        raise TypeError(
            f"{where}: an optimizer where a scheduler belongs. For several optimizers return a list of them, "
            "or ([optimizers], [schedulers])."
        )
    if not callable(getattr(sched, "step", None)):
        raise TypeError(f"{where}: the scheduler {sched!r} has no step() method.")
    if plateau is None:  # Lightning's default: a ReduceLROnPlateau steps on its monitor
        plateau = isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau)
    return LRSchedulerConfig(
        scheduler=sched, name=name, interval=interval, frequency=frequency, reduce_on_plateau=bool(plateau),
        monitor=monitor, strict=bool(strict),
    )


def _checked(setup: OptimizerSetup, where: str) -> OptimizerSetup:
    """Several optimizers may share a parameter, as in Lightning: under manual optimization the
    module steps each (``toggle_optimizer`` keeps the others' gradients off); automatic
    optimization takes one optimizer (``check_manual`` says so). A scheduler must drive one
    of the optimizers returned: one built on another would step an optimizer nobody uses."""
    for config in setup.schedulers:
        optimizer = getattr(config.scheduler, "optimizer", None)
        if isinstance(optimizer, Optimizer) and all(optimizer is not o for o in setup.optimizers):
            raise misconfigured(
                f"{where}: the scheduler {type(config.scheduler).__name__} steps an optimizer that is not among those "
                "returned. Build it on one of them, e.g. StepLR(optimizer, ...) with the optimizer you return.",
                "Some schedulers are attached with an optimizer that wasn't returned from `configure_optimizers`.",
            )
    return setup


class NoOptimizer(Optimizer):
    """Lightning's stand-in when ``configure_optimizers`` returns None: it steps nothing (a
    closure it is given still runs), keeps no state, and has no learning rate."""

    def __init__(self) -> None:
        super().__init__([torch.zeros(1)], {})

    def add_param_group(self, param_group: dict[Any, Any]) -> None:
        pass

    def load_state_dict(self, state_dict: dict[Any, Any]) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def step(self, closure: Callable[[], Any] | None = None) -> None:  # type: ignore[override]
        if closure is not None:
            closure()

    def zero_grad(self, set_to_none: bool = True) -> None:
        pass

    def __repr__(self) -> str:
        return "No Optimizer"


def clip(params: list[torch.nn.Parameter], value: float, algorithm: str) -> torch.Tensor:
    """Clip the gradients by their global norm ('norm') or elementwise ('value'); returns the
    global norm before clipping. Sharded (DTensor) gradients give their norm over all shards."""
    dtensor = sys.modules.get("torch.distributed.tensor")  # only fsdp loads it (0.4 s): no DTensor without it
    sharded = dtensor is not None and any(isinstance(p, dtensor.DTensor) for p in params)
    if algorithm == "norm" and not sharded:  # torch's own call, as Lightning's precision plugins make it
        return torch.nn.utils.clip_grad_norm_(params, value)
    norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    if sharded and isinstance(norm, dtensor.DTensor):
        norm = norm.full_tensor()
    if algorithm == "norm":
        torch.nn.utils.clip_grads_with_norm_(params, value, norm)
    else:
        torch.nn.utils.clip_grad_value_(params, value)
    return norm
