"""The command line's parser: jsonargparse's ``ArgumentParser`` with the Trainer's, the module's, the
DataModule's, an optimizer's and a scheduler's arguments, as Lightning's ``LightningArgumentParser``."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Iterable, Union

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from callbacks.base import Callback
from trainer.checkpoint.from_checkpoint import JSONARGPARSE_INSTALL, safe_jsonargparse
from trainer.core.datamodule import DataModule
from trainer.core.exceptions import MisconfigurationException
from trainer.core.module import TrainModule

INSTALL = JSONARGPARSE_INSTALL

try:  # an optional extra: without it, this module imports and building a parser says what to install
    from jsonargparse import ActionConfigFile, ArgumentParser, Namespace, class_from_function

    import yaml  # jsonargparse's own dependency

    # A config naming os.system, subprocess.*, pickle.loads... (jsonargparse's import block list) is an
    # error, not a warning; the same settings rebuild a module from a checkpoint (trainer.checkpoint.from_checkpoint).
    safe_jsonargparse()
    JSONARGPARSE = True
except ImportError:
    ArgumentParser = Namespace = object  # type: ignore[assignment,misc]
    ActionConfigFile = class_from_function = None  # type: ignore[assignment]
    JSONARGPARSE = False

__all__ = [
    "ArgsType", "LRSchedulerCallable", "LRSchedulerTypeTuple", "LightningArgumentParser", "OptimizerCallable",
    "ReduceLROnPlateau", "instantiate_class", "need_jsonargparse",
]


def _yaml_writes_the_default_root() -> None:
    """``log_dir``'s default is a str subclass (told apart from a ``log_dir="."`` the user wrote):
    YAML writes it as ".". At import, so that a spawned worker's config saver writes it too."""
    from trainer.options import WORKING_DIR  # the room above: options import strategies and callbacks

    yaml.SafeDumper.add_representer(type(WORKING_DIR), yaml.SafeDumper.represent_str)


if JSONARGPARSE:
    _yaml_writes_the_default_root()


def need_jsonargparse() -> None:
    if not JSONARGPARSE:
        raise ModuleNotFoundError(
            f"TrainerCLI parses its command line and YAML files with jsonargparse, which is not installed: {INSTALL}."
        )


class ReduceLROnPlateau(torch.optim.lr_scheduler.ReduceLROnPlateau):
    """``ReduceLROnPlateau`` with the ``monitor`` it steps on, so that a config can name it
    (``--lr_scheduler=ReduceLROnPlateau --lr_scheduler.monitor=val_loss``), as Lightning's."""

    def __init__(self, optimizer: Optimizer, monitor: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(optimizer, *args, **kwargs)
        self.monitor = monitor


# The schedulers the command line takes: torch's, and the ReduceLROnPlateau above (which knows its monitor).
LRSchedulerTypeTuple = (LRScheduler, ReduceLROnPlateau)
ArgsType = Union[list, dict, Namespace, None]  # what ``args=`` takes
OptimizerCallable = Callable[[Iterable], Optimizer]  # a type for a module's argument: ``optimizer: OptimizerCallable``
LRSchedulerCallable = Callable[[Optimizer], Union[LRScheduler, ReduceLROnPlateau]]


class LightningArgumentParser(ArgumentParser):  # type: ignore[misc,valid-type]
    """jsonargparse's parser, with the arguments of the Trainer, modules, DataModules and callbacks
    (``add_lightning_class_args``), optimizers and schedulers. ``env_prefix="PL"``: with
    ``default_env=True``, ``PL_TRAINER__MAX_EPOCHS`` sets ``--trainer.max_epochs``, as in Lightning."""

    def __init__(self, *args: Any, description: str = "Lightning Trainer command line tool", env_prefix: str = "PL",
                 default_env: bool = False, **kwargs: Any) -> None:
        need_jsonargparse()
        super().__init__(*args, description=description, env_prefix=env_prefix, default_env=default_env, **kwargs)
        self.callback_keys: list[str] = []  # the nested keys that hold a callback, added to the Trainer's
        self._optimizers: dict[str, tuple[Any, str]] = {}  # nested key -> (class or classes, link_to)
        self._lr_schedulers: dict[str, tuple[Any, str]] = {}

    def add_lightning_class_args(self, lightning_class: Any, nested_key: str, subclass_mode: bool = False,
                                 required: bool = True) -> list[str]:
        """The arguments of a Trainer, module, DataModule or callback class (or a function that
        returns one) under ``nested_key``; ``subclass_mode``: any subclass, by class path."""
        from trainer.trainer import Trainer  # the room above: the Trainer is only needed once a parser is built

        if callable(lightning_class) and not isinstance(lightning_class, type):
            lightning_class = class_from_function(lightning_class)
        known = (Trainer, TrainModule, DataModule, Callback)
        if isinstance(lightning_class, type) and issubclass(lightning_class, known):
            if issubclass(lightning_class, Callback):
                self.callback_keys.append(nested_key)
            if subclass_mode:
                return self.add_subclass_arguments(lightning_class, nested_key, fail_untyped=False, required=required)
            return self.add_class_arguments(
                lightning_class, nested_key, fail_untyped=False, instantiate=not issubclass(lightning_class, Trainer),
                sub_configs=True,
            )
        raise MisconfigurationException(
            f"Cannot add arguments from: {lightning_class}. You should provide either a callable or a subclass of: "
            "Trainer, LightningModule, LightningDataModule, or Callback (here: trainer.Trainer, trainer.TrainModule, "
            "trainer.DataModule or callbacks.Callback)."
        )

    def add_optimizer_args(self, optimizer_class: Any = (Optimizer,), nested_key: str = "optimizer",
                           link_to: str = "AUTOMATIC") -> None:
        """An optimizer's arguments (a tuple of classes: any subclass, by class path). ``link_to``
        "AUTOMATIC": the CLI builds it for the module's ``configure_optimizers``; else the
        dotted key of a module argument that receives it."""
        classes = optimizer_class if isinstance(optimizer_class, tuple) else (optimizer_class,)
        if not all(isinstance(c, type) and issubclass(c, Optimizer) for c in classes):
            raise TypeError(
                f"add_optimizer_args(optimizer_class={optimizer_class!r}) needs torch.optim.Optimizer subclasses."
            )
        self._add_group(optimizer_class, nested_key, {"params"})
        self._optimizers[nested_key] = (optimizer_class, link_to)

    def add_lr_scheduler_args(self, lr_scheduler_class: Any = LRSchedulerTypeTuple, nested_key: str = "lr_scheduler",
                              link_to: str = "AUTOMATIC") -> None:
        """A learning-rate scheduler's arguments, as :meth:`add_optimizer_args`."""
        classes = lr_scheduler_class if isinstance(lr_scheduler_class, tuple) else (lr_scheduler_class,)
        if not all(isinstance(c, type) and issubclass(c, LRSchedulerTypeTuple) for c in classes):
            raise TypeError(
                f"add_lr_scheduler_args(lr_scheduler_class={lr_scheduler_class!r}) needs LRScheduler subclasses."
            )
        self._add_group(lr_scheduler_class, nested_key, {"optimizer"})
        self._lr_schedulers[nested_key] = (lr_scheduler_class, link_to)

    def _add_group(self, cls: Any, nested_key: str, skip: set[str]) -> None:
        kwargs: dict[str, Any] = {"instantiate": False, "fail_untyped": False, "skip": skip}
        if isinstance(cls, tuple):
            self.add_subclass_arguments(cls, nested_key, **kwargs)
        else:
            self.add_class_arguments(cls, nested_key, sub_configs=True, **kwargs)


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__name__}"


def with_class_path(cls: type, init_args: Any = None) -> dict[str, Any]:
    """``{"class_path": ..., "init_args": ...}`` for a group added with one class (no class path given)."""
    if hasattr(init_args, "as_dict"):
        init_args = init_args.as_dict()
    return {"class_path": class_path(cls), "init_args": dict(init_args or {})}


def instantiate_class(args: Any, init: dict[str, Any]) -> Any:
    """``init`` is ``{"class_path": ..., "init_args": {...}}``; ``args`` the positional argument(s)."""
    args = args if isinstance(args, tuple) else (args,)
    module, _, name = init["class_path"].rpartition(".")
    return getattr(importlib.import_module(module), name)(*args, **init.get("init_args", {}))
