"""TrainerCLI (also ``LightningCLI``): parse the command line or YAML configs, build the model, the
DataModule and the Trainer, and run a subcommand, with Lightning's ``LightningCLI`` API.

    python main.py fit --config exp.yaml --trainer.max_epochs=20
    python main.py fit --model=pkg.mod.Net --optimizer=AdamW --optimizer.lr=0.01
    python main.py fit --print_config > exp.yaml
    python main.py test --ckpt_path=lightning_logs/version_0/checkpoints/last.ckpt
"""

from __future__ import annotations

import functools
import inspect
import os
import random
import sys
import types
import warnings
from pathlib import Path
from typing import Any, Callable

from torch.optim import Optimizer

from callbacks.base import Callback
from trainer._version import __version__
from trainer.checkpoint.files import CheckpointError, load
from trainer.cli.parser import (
    LightningArgumentParser, LRSchedulerTypeTuple, ReduceLROnPlateau, instantiate_class, need_jsonargparse,
    with_class_path,
)
from trainer.cli.instantiator import RecordsConfig, module_type
from trainer.cli.save_config import SaveConfigCallback
from trainer.core.datamodule import DataModule
from trainer.core.exceptions import MisconfigurationException
from trainer.core.module import TrainModule, overridden
from trainer.core.seed import SEED_ENV, seed_everything

__all__ = ["LightningCLI", "TrainerCLI"]


class TrainerCLI:
    """Parse the command line (or ``args``: a list of strings, or a dict), build the model,
    DataModule and Trainer from it, and run the subcommand (``fit``, ``validate``, ``test``,
    ``predict``), as Lightning's ``LightningCLI``, whose arguments and methods it has.

    ``model_class``/``datamodule_class``: the classes (or functions that build one) to
    configure; None (or ``subclass_mode_*=True``) takes any subclass by import path
    (``--model=pkg.mod.Net``, or ``class_path``/``init_args`` in YAML). ``run=False``: no
    subcommand, the objects are built and the rest is yours. ``trainer_defaults``: the
    Trainer's defaults (its ``callbacks`` always join those configured). ``parser_kwargs``:
    jsonargparse's ``ArgumentParser`` options, for all parsers or per subcommand
    (``{"fit": {"default_env": True}}``: ``PL_FIT__TRAINER__MAX_EPOCHS`` environment
    variables). Override ``add_arguments_to_parser(parser)`` (``parser.link_arguments``,
    ``parser.add_optimizer_args``), ``before_<subcommand>``/``after_<subcommand>`` or a
    ``<subcommand>`` method itself, ``subcommands()`` and ``configure_optimizers`` to extend it.
    """

    def __init__(
        self, model_class: type | Callable[..., Any] | None = None,
        datamodule_class: type | Callable[..., Any] | None = None,
        save_config_callback: type[SaveConfigCallback] | None = SaveConfigCallback,
        save_config_kwargs: dict[str, Any] | None = None,
        trainer_class: type | Callable[..., Any] | None = None, trainer_defaults: dict[str, Any] | None = None,
        seed_everything_default: bool | int = True, parser_kwargs: dict[str, Any] | None = None,
        parser_class: type[LightningArgumentParser] = LightningArgumentParser, subclass_mode_model: bool = False,
        subclass_mode_data: bool = False, args: Any = None, run: bool = True, auto_configure_optimizers: bool = True,
        load_from_checkpoint_support: bool = True,
    ) -> None:
        need_jsonargparse()
        from trainer.trainer import Trainer  # the room above this one: imported when a CLI is built

        self.save_config_callback, self.save_config_kwargs = save_config_callback, dict(save_config_kwargs or {})
        self.trainer_class = trainer_class or Trainer
        self.trainer_defaults = dict(trainer_defaults or {})
        self.seed_everything_default = seed_everything_default
        self.parser_kwargs = dict(parser_kwargs or {})
        self.parser_class = parser_class
        self.auto_configure_optimizers = auto_configure_optimizers
        self.model_class, self._model_class = model_class, model_class or TrainModule
        self.subclass_mode_model = model_class is None or subclass_mode_model
        self.datamodule_class, self._datamodule_class = datamodule_class, datamodule_class or DataModule
        self.subclass_mode_data = datamodule_class is None or subclass_mode_data
        main_kwargs = {k: v for k, v in self.parser_kwargs.items() if k not in self.subcommands()}
        sub_kwargs = {k: v for k, v in self.parser_kwargs.items() if k in self.subcommands()}
        self.setup_parser(run, main_kwargs, sub_kwargs)
        self.parse_arguments(self.parser, args)
        self._parse_ckpt_path()
        self.subcommand = self.config["subcommand"] if run else None
        self._set_seed()
        self.config_dump: dict[str, Any] | None = None
        self._instantiators = [  # save_hyperparameters() records the config: load_from_checkpoint rebuilds from it
            (RecordsConfig(self, "model"), module_type(self._model_class), self.subclass_mode_model),
            (RecordsConfig(self, "data"), module_type(self._datamodule_class), self.subclass_mode_data),
        ] if load_from_checkpoint_support else []
        self.before_instantiate_classes()
        self.instantiate_classes()
        self.after_instantiate_classes()
        if self.subcommand is not None:
            self._run_subcommand(self.subcommand)

    # --- the parser ------------------------------------------------------------------------
    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        kwargs.setdefault("dump_header", [f"trainer=={__version__}"])
        parser = self.parser_class(**kwargs)
        parser.add_argument(
            "-c", "--config", action=_config_action(), help="Path to a configuration file in json or yaml format."
        )
        return parser

    def setup_parser(
        self, add_subcommands: bool, main_kwargs: dict[str, Any], subparser_kwargs: dict[str, Any]
    ) -> None:
        self.parser = self.init_parser(**main_kwargs)
        if add_subcommands:
            self._subcommand_method_arguments: dict[str, list[str]] = {}
            self._add_subcommands(self.parser, **subparser_kwargs)
        else:
            self._add_arguments(self.parser)

    def add_default_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument(
            "--seed_everything", type=bool | int, default=self.seed_everything_default,
            help="Set to an int to run seed_everything with this value before classes instantiation. "
            "Set to True to use a random seed.",
        )

    def add_core_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_lightning_class_args(self.trainer_class, "trainer")
        parser.set_defaults({f"trainer.{k}": v for k, v in self.trainer_defaults.items() if k != "callbacks"})
        parser.add_lightning_class_args(self._model_class, "model", subclass_mode=self.subclass_mode_model)
        parser.add_lightning_class_args(
            self._datamodule_class, "data", subclass_mode=self.subclass_mode_data,
            required=self.datamodule_class is not None,
        )

    def _add_arguments(self, parser: LightningArgumentParser) -> None:
        self.add_default_arguments_to_parser(parser)
        self.add_core_arguments_to_parser(parser)
        self.add_arguments_to_parser(parser)
        if self.auto_configure_optimizers:
            if not parser._optimizers:  # the user's add_arguments_to_parser may have added them
                parser.add_optimizer_args((Optimizer,))
            if not parser._lr_schedulers:
                parser.add_lr_scheduler_args(LRSchedulerTypeTuple)
        self.link_optimizers_and_lr_schedulers(parser)

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """Add arguments or links (``parser.link_arguments("data.num_classes", "model.num_classes",
        apply_on="instantiate")``) to each subcommand's parser."""

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """The subcommands, each with the Trainer method's arguments that the CLI fills itself."""
        return {
            "fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"},
            "validate": {"model", "dataloaders", "datamodule"},
            "test": {"model", "dataloaders", "datamodule"},
            "predict": {"model", "dataloaders", "datamodule"},
        }

    def _add_subcommands(self, parser: LightningArgumentParser, **kwargs: Any) -> None:
        from jsonargparse import class_from_function

        self._subcommand_parsers: dict[str, LightningArgumentParser] = {}
        commands = parser.add_subcommands()
        klass = self.trainer_class if isinstance(self.trainer_class, type) else class_from_function(self.trainer_class)
        for subcommand in self.subcommands():
            description = _short_description(getattr(klass, subcommand))
            sub_kwargs = dict(kwargs.get(subcommand, {}))
            sub_kwargs.setdefault("description", description)
            sub = self.init_parser(**sub_kwargs)
            self._add_arguments(sub)
            skip = set(self.subcommands()[subcommand])
            self._subcommand_method_arguments[subcommand] = sub.add_method_arguments(klass, subcommand, skip=skip)
            self._subcommand_parsers[subcommand] = sub
            commands.add_subcommand(subcommand, sub, help=description)

    @staticmethod
    def link_optimizers_and_lr_schedulers(parser: LightningArgumentParser) -> None:
        """Links for the optimizer and scheduler groups added with a ``link_to`` other than AUTOMATIC."""
        for key, (class_type, link_to) in {**parser._optimizers, **parser._lr_schedulers}.items():
            if link_to == "AUTOMATIC":
                continue
            if isinstance(class_type, tuple):
                parser.link_arguments(key, link_to)
            else:
                parser.link_arguments(key, link_to, compute_fn=functools.partial(with_class_path, class_type))

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        if args is not None and len(sys.argv) > 1:
            warnings.warn(
                "LightningCLI's args parameter is intended to run from within Python like if it were from the command "
                "line. To prevent mistakes it is not recommended to provide both args and command line arguments, got: "
                f"sys.argv[1:]={sys.argv[1:]}, args={args}.", UserWarning, stacklevel=3,
            )
        if isinstance(args, dict) or (args is not None and type(args).__name__ == "Namespace"):
            self.config = parser.parse_object(args)
        else:
            self.config = parser.parse_args(args)

    def _parse_ckpt_path(self) -> None:
        """``--ckpt_path`` of a checkpoint with hyperparameters: the model's arguments come from it
        (flags and configs given after still win), so that the model built fits its weights."""
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if not ckpt_path or not Path(ckpt_path).is_file():  # "last", "best", a URL: the Trainer resolves them
            return
        try:  # the Trainer's reader: CRCs checked, weights_only, a sentence for each bad file
            checkpoint = load(ckpt_path, map_location="cpu")
        except CheckpointError as err:  # a bad file exits 2 with its sentence, as a bad key does
            self.parser.error(f"--ckpt_path: {err}")
        hparams = dict(checkpoint.get("hyper_parameters") or checkpoint.get("hparams") or {})
        hparams.pop("_instantiator", None)
        if not hparams:
            return
        if "_class_path" in hparams:
            hparams = {"class_path": hparams.pop("_class_path"), "dict_kwargs": hparams}
        try:
            self.config = self.parser.parse_object({subcommand: {"model": hparams}}, self.config)
        except SystemExit:
            sys.stderr.write("Parsing of ckpt_path hyperparameters failed!\n")
            raise

    def _set_seed(self) -> None:
        seed = self._get(self.config, "seed_everything")
        if seed is False or seed is None:
            return
        if seed is True:  # as Lightning's: the process's seed if one was set (PL_GLOBAL_SEED), else a random one,
            env = os.environ.get(SEED_ENV) or os.environ.get("PL_GLOBAL_SEED")  # kept in the config to repeat the run
            seed = int(env) if env is not None and env.isdigit() else random.randint(0, 2**32 - 1)
        seed = seed_everything(int(seed), workers=True)
        (self.config[self.subcommand] if self.subcommand else self.config)["seed_everything"] = seed

    # --- building and running --------------------------------------------------------------
    def before_instantiate_classes(self) -> None: ...
    def after_instantiate_classes(self) -> None: ...

    def instantiate_classes(self) -> None:
        """Builds the DataModule, the model (with ``configure_optimizers`` from ``--optimizer``) and the Trainer."""
        parser = self._parser(self.subcommand)
        try:
            if hasattr(self.parser, "instantiate"):  # 4.49 on
                self.config_init = self.parser.instantiate(self.config, instantiators=self._instantiators)
            else:
                for instantiator in self._instantiators:
                    self.parser.add_instantiator(*instantiator)
                self.config_init = self.parser.instantiate_classes(self.config)
        except (ValueError, TypeError) as err:  # the classes' own checks: a bad value still exits 2, with its sentence
            parser.error(str(err))
        self.datamodule = self._get(self.config_init, "data")
        self.model = self._get(self.config_init, "model")
        self._add_configure_optimizers_method_to_model(self.subcommand)
        self.trainer = self.instantiate_trainer()

    def instantiate_trainer(self, **kwargs: Any) -> Any:
        """The Trainer from its config, with ``kwargs`` on top; the callbacks of the callback
        groups and of ``trainer_defaults`` join those configured, and the config saver last."""
        extra = [self._get(self.config_init, key) for key in self._parser(self.subcommand).callback_keys]
        config = {**_trainer_kwargs(self._get(self.config_init, "trainer", default={}), self.trainer_class), **kwargs}
        return self._instantiate_trainer(config, extra)

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Any:
        if "callbacks" in inspect.signature(self.trainer_class).parameters:
            given = config.get("callbacks")
            given = [] if given is None else list(given) if isinstance(given, (list, tuple)) else [given]
            config["callbacks"] = given + callbacks
            default = self.trainer_defaults.get("callbacks")
            if default is not None:  # always there, and not configurable; a {"class_path": ...} is built here
                for cb in list(default) if isinstance(default, (list, tuple)) else [default]:
                    config["callbacks"].append(instantiate_class((), cb) if isinstance(cb, dict) else cb)
            if self.save_config_callback is not None and not config.get("fast_dev_run", False):
                subcommand = self.subcommand
                config["callbacks"].append(self.save_config_callback(
                    self._parser(subcommand), self.config.get(str(subcommand), self.config), **self.save_config_kwargs
                ))
        else:
            name = getattr(self.trainer_class, "__qualname__", self.trainer_class)
            warnings.warn(f"The `{name}` class does not expose the "
                          "`callbacks` argument so they will not be included.", UserWarning, stacklevel=2)
        try:
            return self.trainer_class(**config)
        except (ValueError, TypeError) as err:  # the Trainer's own checks: a bad value exits 2, with its sentence
            self._parser(self.subcommand).error(str(err))

    def _parser(self, subcommand: str | None) -> LightningArgumentParser:
        return self.parser if subcommand is None else self._subcommand_parsers[subcommand]

    @staticmethod
    def configure_optimizers(lightning_module: Any, optimizer: Optimizer, lr_scheduler: Any = None) -> Any:
        """What the model's ``configure_optimizers`` returns for ``--optimizer``/``--lr_scheduler``;
        override it to return something else."""
        if lr_scheduler is None:
            return optimizer
        if isinstance(lr_scheduler, ReduceLROnPlateau):
            scheduler = {"scheduler": lr_scheduler, "monitor": lr_scheduler.monitor}
            return {"optimizer": optimizer, "lr_scheduler": scheduler}
        return [optimizer], [lr_scheduler]

    def _add_configure_optimizers_method_to_model(self, subcommand: str | None) -> None:
        """``--optimizer`` (and ``--lr_scheduler``) given: the model's ``configure_optimizers`` builds them."""
        if not self.auto_configure_optimizers:
            return
        parser = self._parser(subcommand)
        optimizers = _automatic(Optimizer, parser._optimizers)
        schedulers = _automatic(LRSchedulerTypeTuple, parser._lr_schedulers)
        if not optimizers:
            return
        if len(optimizers) > 1 or len(schedulers) > 1:
            raise MisconfigurationException(
                f"`{type(self).__name__}.add_configure_optimizers_method_to_model` expects at most one optimizer "
                f"and one lr_scheduler to be 'AUTOMATIC', but found {optimizers + schedulers}. "
                "In this case the user is expected to link the argument groups and implement `configure_optimizers`."
            )
        optimizer_init = self._init(parser._optimizers, optimizers[0])
        if not optimizer_init:  # the groups are there, and no optimizer was given
            return
        scheduler_init = self._init(parser._lr_schedulers, schedulers[0]) if schedulers else None
        if overridden(self.model, "configure_optimizers"):
            cli = "LightningCLI" if type(self) is TrainerCLI else type(self).__name__  # the name Lightning users read
            warnings.warn(f"`{type(self.model).__name__}.configure_optimizers` will be overridden by "
                          f"`{cli}.configure_optimizers`.", UserWarning, stacklevel=2)
        optimizer = instantiate_class(self.model.parameters(), optimizer_init)
        scheduler = instantiate_class(optimizer, scheduler_init) if scheduler_init else None
        fn = functools.partial(self.configure_optimizers, optimizer=optimizer, lr_scheduler=scheduler)
        functools.update_wrapper(fn, self.configure_optimizers)
        self.model.configure_optimizers = types.MethodType(fn, self.model)

    def _init(self, register: dict[str, tuple[Any, str]], key: str) -> Any:
        cls, init = register[key][0], self._get(self.config_init, key)
        if not isinstance(cls, tuple):
            init = with_class_path(cls, init)
        return init.as_dict() if hasattr(init, "as_dict") else init

    def _get(self, config: Any, key: str, default: Any = None) -> Any:
        """A config value, inside the subcommand's part when one runs."""
        return config.get(str(self.subcommand), config).get(key, default)

    def _run_subcommand(self, subcommand: str) -> None:
        before = getattr(self, f"before_{subcommand}", None)
        if callable(before):
            before()
        fn = getattr(self, subcommand, getattr(self.trainer, subcommand))
        accepted = self._subcommand_method_arguments[subcommand]
        kwargs = {k: v for k, v in self.config_init[subcommand].items() if k in accepted}
        kwargs["model"] = self.model
        if self.datamodule is not None:
            kwargs["datamodule"] = self.datamodule
        fn(**kwargs)
        after = getattr(self, f"after_{subcommand}", None)
        if callable(after):
            after()


LightningCLI = TrainerCLI  # the name Lightning's imports use: from trainer.cli import LightningCLI


def _automatic(base: Any, register: dict[str, tuple[Any, str]]) -> list[str]:
    bases = base if isinstance(base, tuple) else (base,)
    found = []
    for key, (cls, link_to) in register.items():
        classes = cls if isinstance(cls, tuple) else (cls,)
        if link_to == "AUTOMATIC" and any(issubclass(c, bases) for c in classes):
            found.append(key)
    return found


def _trainer_kwargs(init: Any, trainer_class: Any) -> dict[str, Any]:
    """The Trainer's arguments from the config, as the Trainer reads them."""
    from trainer.options import WORKING_DIR

    kwargs = dict(vars(init)) if hasattr(init, "__dict__") else dict(init or {})
    kwargs.pop("__path__", None)
    if isinstance(kwargs.get("devices"), str) and kwargs["devices"].isdigit():
        kwargs["devices"] = int(kwargs["devices"])  # "--trainer.devices=2" is a count
    if kwargs.get("log_dir") == WORKING_DIR:  # the default, written out by --print_config or config.yaml,
        kwargs["log_dir"] = WORKING_DIR  # is still the default: default_root_dir may then be given alone
    try:
        params = inspect.signature(trainer_class).parameters
    except (TypeError, ValueError):
        params = {}
    for key, value in kwargs.items():  # jsonargparse reads null as 'None' for `str | PathLike | None`
        if value in ("None", "null") and key in params and "None" in str(params[key].annotation):
            kwargs[key] = None
    return kwargs


def _short_description(fn: Any) -> str | None:
    doc = inspect.getdoc(fn)
    return doc.strip().split("\n\n")[0].replace("\n", " ") if doc else None


def _config_action() -> Any:
    from jsonargparse import ActionConfigFile

    return ActionConfigFile

