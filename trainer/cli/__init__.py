"""A command line with YAML configs for any model: ``TrainerCLI`` does Lightning's ``LightningCLI``'s
job (``LightningCLI`` is the same class, for imports renamed from ``lightning.pytorch.cli``).

It is built on jsonargparse, an optional extra: ``pip install "steadytrainer[cli]"`` (or
``pip install ".[cli]"`` in a checkout). ``import trainer`` never imports this module.

    python main.py fit --config exp.yaml --trainer.max_epochs=20
    python main.py fit --model=pkg.mod.Net --optimizer=AdamW --optimizer.lr=0.01
    python main.py fit --print_config > exp.yaml
    python main.py test --ckpt_path=lightning_logs/version_0/checkpoints/last.ckpt

Every subcommand (``fit``, ``validate``, ``test``, ``predict``) takes ``--config`` (repeatable,
merged in order; flags after it override it), ``--seed_everything``, ``--trainer.*`` (every
Trainer argument), ``--model.*``, ``--data.*``, ``--optimizer``/``--lr_scheduler`` and
``--ckpt_path``. A bad key, type or file exits with status 2 before anything is built.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import random
import sys
import warnings
from typing import Any, Callable

from callbacks.base import Callback

from trainer.core.datamodule import DataModule
from trainer.core.module import TrainModule
from trainer.core.seed import seed_everything

INSTALL = 'pip install "jsonargparse[signatures]>=4.27" (or the extra: pip install ".[cli]")'
SUBCOMMANDS = {
    "fit": "Train the model (and validate it, if it has validation data).",
    "validate": "Run the validation loop once.",
    "test": "Run the test loop once.",
    "predict": "Run predict_step over the predict data.",
}


def _jsonargparse() -> Any:
    try:
        import jsonargparse
    except ImportError:
        raise ModuleNotFoundError(f"TrainerCLI parses its command line and YAML files with jsonargparse, which is not installed: {INSTALL}.") from None
    import yaml  # jsonargparse's own dependency

    from trainer.options import WORKING_DIR  # beside the Trainer, whose options it knows: imported with it, lazily

    # log_dir's default is a str subclass (told apart from a log_dir="." the user wrote): YAML writes it as "."
    yaml.SafeDumper.add_representer(type(WORKING_DIR), yaml.SafeDumper.represent_str)
    return jsonargparse


def _import(class_path: str) -> Any:
    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def instantiate_class(args: Any, init: dict[str, Any]) -> Any:
    """``init`` is ``{"class_path": ..., "init_args": {...}}``; ``args`` the positional argument(s)."""
    args = args if isinstance(args, tuple) else (args,)
    return _import(init["class_path"])(*args, **init.get("init_args", {}))


def _configure_optimizers(model: Any, optimizer: dict[str, Any], lr_scheduler: dict[str, Any] | None) -> Any:
    """``configure_optimizers`` for a model given ``--optimizer`` (and ``--lr_scheduler``)."""
    opt = instantiate_class(model.parameters(), optimizer)
    if lr_scheduler is None:
        return opt
    init = dict(lr_scheduler)
    monitor = init.get("init_args", {}).get("monitor") if "ReduceLROnPlateau" in init["class_path"] else None
    if monitor is not None:
        init["init_args"] = {k: v for k, v in init["init_args"].items() if k != "monitor"}
    scheduler = instantiate_class(opt, init)
    config: dict[str, Any] = {"scheduler": scheduler}
    if monitor is not None:
        config["monitor"] = monitor
    return {"optimizer": opt, "lr_scheduler": config}


class SaveConfigCallback(Callback):
    """Writes the full config as ``config.yaml`` into the run folder when a stage sets up (fit's
    ``<log_dir>/<name>/version_<n>``, or the working directory when TensorBoard is off). It refuses
    to overwrite another run's file unless ``overwrite=True``."""

    def __init__(self, config_yaml: str, config_filename: str = "config.yaml", overwrite: bool = False) -> None:
        self.config_yaml, self.config_filename, self.overwrite = config_yaml, config_filename, overwrite
        self.already_saved = False

    def setup(self, trainer: Any, module: Any, stage: str) -> None:
        if self.already_saved:
            return
        folder = trainer.run_dir or (os.getcwd() if stage == "fit" else None)
        if folder is None:
            return
        path = os.path.join(folder, self.config_filename)
        strategy = trainer.strategy
        exists = strategy.broadcast_object(os.path.exists(path) if strategy.is_global_zero else None)
        if exists and not self.overwrite:
            raise RuntimeError(
                f"{path} exists: it is another run's config, and this run would overwrite it. Delete it, choose "
                "another --trainer.log_dir or --trainer.name, pass TrainerCLI(save_config_kwargs={'overwrite': True}), "
                "or TrainerCLI(save_config_callback=None) to save no config."
            )
        if strategy.is_global_zero:
            os.makedirs(folder, exist_ok=True)
            with open(path, "w", encoding="utf-8") as f:
                f.write(self.config_yaml)
        self.already_saved = True


class TrainerCLI:
    """Parse the command line (or ``args``), build the model, DataModule and Trainer, and run the
    subcommand, as ``LightningCLI`` does.

    ``model_class``/``datamodule_class``: the classes to configure; None (or
    ``subclass_mode_*=True``) takes any subclass by import path (``--model=pkg.mod.Net`` or
    ``class_path``/``init_args`` in YAML). ``run=False``: no subcommand; the objects are built
    and ``cli.trainer.fit(cli.model, datamodule=cli.datamodule)`` is yours to call. ``args``: a
    list of strings or a dict, in place of ``sys.argv``. ``parser_kwargs``: jsonargparse's
    ``ArgumentParser`` options (e.g. ``{"default_env": True}`` for ``TRAINER_FIT__TRAINER__MAX_EPOCHS``
    environment variables), for all parsers or per subcommand (``{"fit": {...}}``).
    Override ``add_arguments_to_parser(parser)`` (e.g. ``parser.link_arguments``) and the
    ``before_<subcommand>``/``after_<subcommand>`` methods to extend it.
    """

    def __init__(
        self, model_class: type | Callable[..., Any] | None = None, datamodule_class: type | Callable[..., Any] | None = None,
        save_config_callback: type[SaveConfigCallback] | None = SaveConfigCallback, save_config_kwargs: dict[str, Any] | None = None,
        trainer_class: type | None = None, trainer_defaults: dict[str, Any] | None = None,
        seed_everything_default: bool | int = True, parser_kwargs: dict[str, Any] | None = None,
        subclass_mode_model: bool = False, subclass_mode_data: bool = False, args: Any = None, run: bool = True,
        auto_configure_optimizers: bool = True,
    ) -> None:
        self._ja = _jsonargparse()
        from trainer.trainer import Trainer  # the room above this one: imported when a CLI is built

        self.model_class = model_class if model_class is not None else TrainModule
        self.subclass_mode_model = model_class is None or subclass_mode_model
        self.datamodule_class = datamodule_class
        self.subclass_mode_data = datamodule_class is None or subclass_mode_data
        self.trainer_class = trainer_class or Trainer
        self.trainer_defaults = dict(trainer_defaults or {})
        self.save_config_callback, self.save_config_kwargs = save_config_callback, dict(save_config_kwargs or {})
        self.seed_everything_default = seed_everything_default
        self.auto_configure_optimizers = auto_configure_optimizers
        self.parser_kwargs = dict(parser_kwargs or {})
        self.parser = self._setup_parser(run)
        self.config = self._parse(args)
        self.subcommand = self.config["subcommand"] if run else None
        self._config = self.config[self.subcommand] if run else self.config
        self._set_seed()
        self.before_instantiate_classes()
        self._instantiate()
        self.after_instantiate_classes()
        if self.subcommand is not None:
            self._run_subcommand(self.subcommand)

    # --- for subclasses ----------------------------------------------------------------
    def add_arguments_to_parser(self, parser: Any) -> None:
        """Add arguments or links (``parser.link_arguments("data.num_classes", "model.num_classes",
        apply_on="instantiate")``) to each subcommand's parser."""

    def before_instantiate_classes(self) -> None: ...
    def after_instantiate_classes(self) -> None: ...

    # --- the parser --------------------------------------------------------------------
    def _kwargs(self, subcommand: str | None) -> dict[str, Any]:
        own = any(k in SUBCOMMANDS for k in self.parser_kwargs)
        kwargs = dict(self.parser_kwargs.get(subcommand, {}) if own and subcommand else {} if own else self.parser_kwargs)
        kwargs.setdefault("env_prefix", "TRAINER")
        return kwargs

    def _setup_parser(self, run: bool) -> Any:
        ja = self._ja
        if not run:
            parser = ja.ArgumentParser(**self._kwargs(None))
            self._add_arguments(parser, None)
            return parser
        parser = ja.ArgumentParser(description="Train, validate, test or predict with a config.", **self._kwargs(None))
        parser.add_argument("-c", "--config", action=ja.ActionConfigFile, help="A YAML file with the subcommand's config.")
        commands = parser.add_subcommands(required=True, dest="subcommand")
        for name, help_text in SUBCOMMANDS.items():
            sub = ja.ArgumentParser(description=help_text, **self._kwargs(name))
            self._add_arguments(sub, name)
            commands.add_subcommand(name, sub, help=help_text)
        return parser

    def _add_arguments(self, parser: Any, subcommand: str | None) -> None:
        import torch

        parser.add_argument("-c", "--config", action=self._ja.ActionConfigFile, help="A YAML config; repeat to merge several, in order.")
        parser.add_argument(
            "--seed_everything", type=bool | int, default=self.seed_everything_default,
            help="Seed for python, numpy and torch before the model is built: an int, true (draw one and record it in the config) or false.",
        )
        parser.add_class_arguments(self.trainer_class, "trainer", fail_untyped=False, instantiate=False, sub_configs=True)
        if self.trainer_defaults:
            parser.set_defaults({f"trainer.{k}": v for k, v in self.trainer_defaults.items()})
        if self.subclass_mode_model:
            parser.add_subclass_arguments(self.model_class, "model", required=True, fail_untyped=False)
        else:
            parser.add_class_arguments(self.model_class, "model", fail_untyped=False, sub_configs=True)
        if self.datamodule_class is None:
            parser.add_subclass_arguments(DataModule, "data", required=False, fail_untyped=False)
        elif self.subclass_mode_data:
            parser.add_subclass_arguments(self.datamodule_class, "data", required=True, fail_untyped=False)
        else:
            parser.add_class_arguments(self.datamodule_class, "data", fail_untyped=False, sub_configs=True)
        if self.auto_configure_optimizers:
            parser.add_subclass_arguments(torch.optim.Optimizer, "optimizer", skip={"params"}, required=False, instantiate=False)
            schedulers = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
            parser.add_subclass_arguments(schedulers, "lr_scheduler", skip={"optimizer"}, required=False, instantiate=False)
        if subcommand is not None:
            parser.add_argument("--ckpt_path", type=str | None, default=None, help="A checkpoint: resume fit from it, or evaluate its weights ('best', 'last' or a path).")
        self.add_arguments_to_parser(parser)

    def _parse(self, args: Any) -> Any:
        if isinstance(args, dict):
            return self.parser.parse_object(args)
        return self.parser.parse_args(sys.argv[1:] if args is None else list(args))

    def _set_seed(self) -> None:
        seed = self._config.get("seed_everything")
        if seed is True:
            seed = random.randint(0, 2**32 - 1)
            self._config["seed_everything"] = seed  # the saved config reproduces the run
        if seed is not False and seed is not None:
            seed_everything(int(seed))

    # --- building and running ----------------------------------------------------------
    def _parser_for_run(self) -> Any:
        return self.parser._subcommands_action._name_parser_map[self.subcommand] if self.subcommand else self.parser

    def _instantiate(self) -> None:
        parser = self._parser_for_run()
        try:
            init = parser.instantiate(self._config) if hasattr(parser, "instantiate") else parser.instantiate_classes(self._config)
            self.config_init = init
            self.model = init["model"]
            self.datamodule = init.get("data")
            trainer_kwargs = dict(vars(init["trainer"])) if init.get("trainer") is not None else {}
            if isinstance(trainer_kwargs.get("devices"), str) and trainer_kwargs["devices"].isdigit():
                trainer_kwargs["devices"] = int(trainer_kwargs["devices"])  # "--trainer.devices=2" is a count
            params = inspect.signature(self.trainer_class).parameters
            from trainer.options import WORKING_DIR

            if trainer_kwargs.get("log_dir") == WORKING_DIR:  # the default, written out by --print_config or config.yaml
                trainer_kwargs["log_dir"] = WORKING_DIR  # is still the default: default_root_dir may then be given alone
            for key, value in trainer_kwargs.items():  # jsonargparse reads null as 'None' for `str | PathLike | None`
                if value in ("None", "null") and key in params and "None" in str(params[key].annotation):
                    trainer_kwargs[key] = None
            callbacks = list(trainer_kwargs.get("callbacks") or [])
            if self.save_config_callback is not None and self.subcommand is not None:
                with warnings.catch_warnings():  # skip_none: deprecated in newer jsonargparse, needed in older
                    warnings.simplefilter("ignore")
                    text = parser.dump(self._config, skip_none=False)
                callbacks.append(self.save_config_callback(text, **self.save_config_kwargs))
            trainer_kwargs["callbacks"] = callbacks
            self.trainer = self.trainer_class(**trainer_kwargs)
        except (ValueError, TypeError) as err:  # the classes' own checks: a bad value still exits 2, with its sentence
            parser.error(str(err))
        self._optimizers_from_config(init)

    def _optimizers_from_config(self, init: Any) -> None:
        optimizer, scheduler = init.get("optimizer"), init.get("lr_scheduler")
        if optimizer is None:
            if scheduler is not None:
                self._parser_for_run().error("--lr_scheduler needs --optimizer (e.g. --optimizer=AdamW): the scheduler steps an optimizer the CLI builds.")
            return
        if type(self.model).configure_optimizers is not TrainModule.configure_optimizers:
            warnings.warn(f"{type(self.model).__name__}.configure_optimizers is replaced by the --optimizer/--lr_scheduler given.", stacklevel=3)
        as_dict = (lambda ns: None if ns is None else ns.as_dict() if hasattr(ns, "as_dict") else dict(ns))
        self.model.configure_optimizers = functools.partial(_configure_optimizers, self.model, as_dict(optimizer), as_dict(scheduler))

    def _run_subcommand(self, subcommand: str) -> None:
        before = getattr(self, f"before_{subcommand}", None)
        if callable(before):
            before()
        kwargs: dict[str, Any] = {"model": self.model, "datamodule": self.datamodule}
        ckpt_path = self._config.get("ckpt_path")
        if ckpt_path is not None:
            kwargs["ckpt_path"] = ckpt_path
        getattr(self.trainer, subcommand)(**kwargs)
        after = getattr(self, f"after_{subcommand}", None)
        if callable(after):
            after()


LightningCLI = TrainerCLI  # the name Lightning's imports use: from trainer.cli import LightningCLI

__all__ = ["LightningCLI", "SaveConfigCallback", "TrainerCLI", "instantiate_class"]
