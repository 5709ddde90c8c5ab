"""What a module or DataModule that the command line builds records as its hyperparameters: the
config it was built from, so that ``load_from_checkpoint`` rebuilds it, injected objects included
(Lightning's ``load_from_checkpoint_support``)."""

from __future__ import annotations

import inspect
import warnings
from typing import Any, Callable

from trainer.checkpoint.from_checkpoint import INSTANTIATOR, instantiate_module
from trainer.core.hparams import given_hyperparameters

__all__ = ["RecordsConfig", "instantiate_module", "module_type"]


class RecordsConfig:
    """jsonargparse's instantiator for the ``key`` ("model" or "data") group: builds the class as
    usual, while its ``save_hyperparameters()`` records the group's config (``_class_path`` for a
    class chosen by path) and the values links applied on instantiation."""

    def __init__(self, cli: Any, key: str) -> None:
        self.cli, self.key = cli, key

    def __call__(
        self, class_type: type, *args: Any, applied_instantiation_links: dict | None = None, **kwargs: Any
    ) -> Any:
        hparams = dict(config_dump(self.cli).get(self.key) or {})
        if "class_path" in hparams:  # the arguments at the top, as without subclass mode, and the class apart
            hparams = {"_class_path": hparams["class_path"], **(hparams.get("init_args") or {}),
                       **(hparams.get("dict_kwargs") or {})}
        for target, value in (applied_instantiation_links or {}).items():
            if target.startswith(f"{self.key}."):
                _set_nested(hparams, target[len(self.key) + 1:].removeprefix("init_args."), value)
        with given_hyperparameters(class_type, hparams, INSTANTIATOR):
            return class_type(*args, **kwargs)


def config_dump(cli: Any) -> dict[str, Any]:
    """The parsed config as plain data (the subcommand's part), dumped once per CLI."""
    if getattr(cli, "config_dump", None) is None:
        import yaml

        with warnings.catch_warnings():  # skip_none: deprecated in newer jsonargparse, needed in older
            warnings.simplefilter("ignore")
            dump = yaml.safe_load(cli.parser.dump(cli.config, skip_link_targets=False, skip_none=False, format="yaml"))
        cli.config_dump = dump.get(cli.config["subcommand"], dump) if "subcommand" in cli.config else dump
    return cli.config_dump


def module_type(value: type | Callable[..., Any]) -> type:
    """The class a group builds: the class itself, or what a function that builds one returns."""
    if callable(value) and not isinstance(value, type):
        return inspect.signature(value).return_annotation
    return value


def _set_nested(data: dict[str, Any], key: str, value: Any) -> None:
    *parents, last = key.split(".")
    for part in parents:  # the link's target is in the config: dump wrote every key
        data = data.setdefault(part, {})
    data[last] = value
