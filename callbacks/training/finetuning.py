"""BaseFinetuning and BackboneFinetuning: freeze parts of the model, then unfreeze them on a schedule."""

from __future__ import annotations

import logging
import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterable

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from trainer.core.checks import flag, positive_int

from ..base import Callback

if TYPE_CHECKING:
    from trainer import Trainer, TrainModule

log = logging.getLogger("trainer")


class BaseFinetuning(Callback):
    """Subclass it: ``freeze_before_training(module)`` freezes what must not train at first
    (called at setup, before ``configure_optimizers``, which should then take only
    ``filter(lambda p: p.requires_grad, self.parameters())``), and
    ``finetune_function(module, epoch, optimizer)``, called at each epoch's start for each
    optimizer, unfreezes with ``unfreeze_and_add_param_group``. The param groups it added
    ride in checkpoints and come back on resume, before the optimizer's state is loaded.
    Under ``ddp`` pass ``DDPStrategy(find_unused_parameters=True)``: the model is wrapped
    before ``freeze_before_training``, and frozen parameters get no gradient to reduce.
    """

    def __init__(self) -> None:
        self._internal_optimizer_metadata: dict[int, list[dict[str, Any]]] = {}

    # --- the helpers, as Lightning names them -------------------------------------------
    @staticmethod
    def flatten_modules(modules: nn.Module | Iterable[nn.Module]) -> list[nn.Module]:
        """The leaf modules (and modules with parameters of their own) under ``modules``."""
        if isinstance(modules, nn.ModuleDict):
            modules = modules.values()
        if isinstance(modules, nn.Module):
            found = list(modules.modules())
        else:  # an iterable of modules, or of iterables of them (Lightning's)
            found = [m for item in modules for m in BaseFinetuning.flatten_modules(item)]
        return [m for m in found if not list(m.children()) or m._parameters]

    @staticmethod
    def filter_params(modules: Any, train_bn: bool = True, requires_grad: bool = True) -> list[nn.Parameter]:
        found = []
        for mod in BaseFinetuning.flatten_modules(modules):
            if isinstance(mod, _BatchNorm) and not train_bn:
                continue
            found += [p for p in mod.parameters(recurse=False) if p.requires_grad == requires_grad]
        return found

    @staticmethod
    def make_trainable(modules: Any) -> None:
        for mod in BaseFinetuning.flatten_modules(modules):
            if isinstance(mod, _BatchNorm):
                mod.track_running_stats = True
            for p in mod.parameters(recurse=False):
                p.requires_grad = True

    @staticmethod
    def freeze_module(module: nn.Module) -> None:
        if isinstance(module, _BatchNorm):
            module.track_running_stats = False
        for p in module.parameters(recurse=False):
            p.requires_grad = False

    @staticmethod
    def freeze(modules: Any, train_bn: bool = True) -> None:
        """Freeze ``modules``; BatchNorm layers keep training with ``train_bn``."""
        for mod in BaseFinetuning.flatten_modules(modules):
            if isinstance(mod, _BatchNorm) and train_bn:
                BaseFinetuning.make_trainable(mod)
            else:
                BaseFinetuning.freeze_module(mod)

    @staticmethod
    def filter_on_optimizer(optimizer: torch.optim.Optimizer, params: Iterable[nn.Parameter]) -> list[nn.Parameter]:
        """``params`` that ``optimizer`` does not hold yet (with Lightning's warning for the others)."""
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        params = list(params)
        kept = [p for p in params if id(p) not in held]
        if len(kept) < len(params):
            warnings.warn(
                "The provided params to be frozen already exist within another group of this optimizer. "
                "Those parameters will be skipped.\n"
                "HINT: Did you init your optimizer in `configure_optimizer` as such:\n "
                f"{type(optimizer)}(filter(lambda p: p.requires_grad, self.parameters()), ...) ",
                UserWarning, stacklevel=2,
            )
        return kept

    @staticmethod
    def unfreeze_and_add_param_group(
        modules: Any, optimizer: torch.optim.Optimizer, lr: float | None = None, initial_denom_lr: float = 10.0,
        train_bn: bool = True,
    ) -> None:
        """Make ``modules`` trainable and give their parameters to ``optimizer`` as a new group,
        at ``lr`` (default: the first group's lr / ``initial_denom_lr``)."""
        BaseFinetuning.make_trainable(modules)
        params_lr = optimizer.param_groups[0]["lr"] / initial_denom_lr if lr is None else float(lr)
        params = BaseFinetuning.filter_on_optimizer(optimizer, BaseFinetuning.filter_params(modules, train_bn, True))
        if params:
            optimizer.add_param_group({"params": params, "lr": params_lr})

    # --- what a subclass writes ---------------------------------------------------------
    def freeze_before_training(self, pl_module: TrainModule) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define freeze_before_training(self, pl_module).")

    def finetune_function(self, pl_module: TrainModule, epoch: int, optimizer: torch.optim.Optimizer) -> None:
        raise NotImplementedError(
            f"{type(self).__name__} must define finetune_function(self, pl_module, epoch, optimizer)."
        )

    # --- hooks -------------------------------------------------------------------------
    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if stage == "fit":
            self.freeze_before_training(pl_module)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        names = {id(p): n for n, p in pl_module.named_parameters()}
        for i, optimizer in enumerate(trainer.optimizers):
            self.finetune_function(pl_module, trainer.current_epoch, optimizer)
            self._internal_optimizer_metadata[i] = [
                {**{k: v for k, v in g.items() if k != "params"},
                 "params": [names[id(p)] for p in g["params"] if id(p) in names]}
                for g in optimizer.param_groups
            ]

    # --- state -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"internal_optimizer_metadata": self._internal_optimizer_metadata}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._internal_optimizer_metadata = dict(state_dict.get("internal_optimizer_metadata", {}))

    def restore_param_groups(self, trainer: Trainer) -> None:
        """On resume, before the optimizers' states load: the groups the saved run had added."""
        params = dict(trainer.module.named_parameters())
        for i, optimizer in enumerate(trainer.optimizers):
            saved = self._internal_optimizer_metadata.get(i, [])
            for group in saved[len(optimizer.param_groups):]:
                found = [params[n] for n in group["params"] if n in params]
                for p in found:
                    p.requires_grad = True
                optimizer.add_param_group({**{k: v for k, v in group.items() if k != "params"}, "params": found})


def multiplicative(epoch: int) -> float:
    """BackboneFinetuning's default ``lambda_func``: the backbone's lr doubles each epoch, as in Lightning."""
    return 2.0


class BackboneFinetuning(BaseFinetuning):
    """The model's ``backbone`` module is frozen until epoch ``unfreeze_backbone_at_epoch``,
    then trains as a new param group at ``backbone_initial_lr`` (default: the first group's lr
    x ``backbone_initial_ratio_lr``), its lr multiplied by ``lambda_func(epoch + 1)`` at each
    later epoch, never above the first group's with ``should_align``.
    """

    def __init__(
        self,
        unfreeze_backbone_at_epoch: int = 10,
        lambda_func: Callable[[int], float] = multiplicative,
        backbone_initial_ratio_lr: float = 10e-2,
        backbone_initial_lr: float | None = None,
        should_align: bool = True,
        initial_denom_lr: float = 10.0,
        train_bn: bool = True,
        verbose: bool = False,
        rounding: int = 12,
    ) -> None:
        super().__init__()
        self.unfreeze_backbone_at_epoch = positive_int(
            "BackboneFinetuning(unfreeze_backbone_at_epoch)", unfreeze_backbone_at_epoch, minimum=0
        )
        if not callable(lambda_func):
            raise TypeError(f"BackboneFinetuning(lambda_func={lambda_func!r}) must be a function of the epoch "
                            "returning a factor.")
        self.lambda_func = lambda_func
        ratios = (("backbone_initial_ratio_lr", backbone_initial_ratio_lr), ("initial_denom_lr", initial_denom_lr))
        for name, value in ratios:
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"BackboneFinetuning({name}={value!r}) must be a positive number.")
        self.backbone_initial_ratio_lr = backbone_initial_ratio_lr
        self.backbone_initial_lr = backbone_initial_lr
        self.should_align = flag("BackboneFinetuning(should_align)", should_align)
        self.initial_denom_lr = initial_denom_lr
        self.train_bn = flag("BackboneFinetuning(train_bn)", train_bn)
        self.verbose = flag("BackboneFinetuning(verbose)", verbose)
        self.rounding = rounding
        self.previous_backbone_lr: float | None = None

    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if stage == "fit" and not isinstance(getattr(pl_module, "backbone", None), nn.Module):
            raise ValueError(f"BackboneFinetuning needs {type(pl_module).__name__}.backbone, an nn.Module "
                             "(the part to freeze at first).")
        super().setup(trainer, pl_module, stage)

    def freeze_before_training(self, pl_module: TrainModule) -> None:
        self.freeze(pl_module.backbone, train_bn=self.train_bn)

    def finetune_function(self, pl_module: TrainModule, epoch: int, optimizer: torch.optim.Optimizer) -> None:
        current_lr = optimizer.param_groups[0]["lr"]
        if epoch == self.unfreeze_backbone_at_epoch:
            initial = self.backbone_initial_lr
            if initial is None:
                initial = current_lr * self.backbone_initial_ratio_lr
            self.previous_backbone_lr = initial
            self.unfreeze_and_add_param_group(
                pl_module.backbone, optimizer, initial, self.initial_denom_lr, self.train_bn
            )
            if self.verbose:
                log.info("BackboneFinetuning: epoch %d, backbone unfrozen at lr %s.",
                         epoch, round(initial, self.rounding))
        elif epoch > self.unfreeze_backbone_at_epoch and self.previous_backbone_lr is not None:
            next_lr = self.lambda_func(epoch + 1) * self.previous_backbone_lr
            next_lr = current_lr if self.should_align and next_lr > current_lr else next_lr
            optimizer.param_groups[-1]["lr"] = next_lr
            self.previous_backbone_lr = next_lr
            if self.verbose:
                log.info("BackboneFinetuning: epoch %d, backbone lr %s.", epoch, round(next_lr, self.rounding))

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "previous_backbone_lr": self.previous_backbone_lr}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.previous_backbone_lr = state_dict.get("previous_backbone_lr")
