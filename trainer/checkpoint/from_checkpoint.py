"""``load_from_checkpoint`` for the module and the DataModule, as Lightning's ``core/saving.py``:
the object built from the hyperparameters a checkpoint recorded, then given its state."""

from __future__ import annotations

import ast
import csv
import inspect
import io
import os
import warnings
from typing import Any

import torch

from trainer.checkpoint import files, layout
from trainer.checkpoint.paths import local_file
from trainer.checkpoint.state_dicts import load_plain_state_dict, load_sharded_model, plain_state_dict
from trainer.core.hparams import CHECKPOINT_READER, as_hparams_type
from trainer.core.module import overridden


def load_from_checkpoint(
    cls: type, checkpoint_path: str | os.PathLike, map_location: Any = None, hparams_file: Any = None,
    strict: bool | None = None, weights_only: bool | None = None, **kwargs: Any,
) -> Any:
    """``cls`` built from the checkpoint's hyperparameters (``kwargs`` replace or add some),
    then, for a module, its ``on_load_checkpoint`` and weights; for a DataModule, its
    ``load_state_dict`` with what the file keeps under its class's name."""
    path = os.fspath(checkpoint_path)
    ckpt = files.load(local_file(path), map_location=map_location, weights_only=weights_only is not False)
    recorded: dict[str, Any] = {}
    if hparams_file is not None:  # they replace the checkpoint's, as in Lightning
        recorded = read_hparams_file(hparams_file)
    else:
        if cls.CHECKPOINT_HYPER_PARAMS_KEY == "hyper_parameters":  # a module (not a DataModule)
            for past in ("hparams", "module_arguments"):  # where Lightning before 1.0 kept them
                recorded.update(ckpt.get(past) if isinstance(ckpt.get(past), dict) else {})
        recorded.update(ckpt.get(cls.CHECKPOINT_HYPER_PARAMS_KEY) or {})
        if weights_only is False and cls.CHECKPOINT_HYPER_PARAMS_KEY == "hyper_parameters":  # asked for: unpickle
            for name, blob in (layout.ours(ckpt).get("hparams_pickled") or {}).items():
                recorded.setdefault(name, torch.load(io.BytesIO(blob), map_location=map_location, weights_only=False))
    saved = as_hparams_type({**recorded, **kwargs}, layout.ours(ckpt).get(cls.CHECKPOINT_HYPER_PARAMS_TYPE))
    ckpt[cls.CHECKPOINT_HYPER_PARAMS_KEY] = saved  # what on_load_checkpoint sees, as in Lightning
    obj = _build(cls, path, ckpt, saved, kwargs, bool(recorded))
    if not isinstance(obj, torch.nn.Module):  # a DataModule
        if type(obj).__qualname__ in ckpt:
            obj.load_state_dict(ckpt[type(obj).__qualname__])
        return obj
    if obj.__dict__.get("_strict_loading") is not None and strict is not None and strict != obj.strict_loading:
        raise ValueError(
            f"You set `.load_from_checkpoint(..., strict={strict!r})` which is in conflict with "
            f"`{cls.__name__}.strict_loading={obj.strict_loading!r}. Please set the same value for both of them."
        )
    strict = obj.strict_loading if strict is None else strict
    if overridden(obj, "configure_model"):  # its lazily built layers take the weights
        obj.configure_model()
    obj.on_load_checkpoint(ckpt)
    sharded = layout.ours(ckpt).get("sharded")
    if sharded is not None:  # a folder of shards (fsdp): read whole into this one process
        ckpt["state_dict"] = load_sharded_model(sharded, plain_state_dict(obj.state_dict()))
    state = ckpt["state_dict"]
    if not state:
        warnings.warn(f"The state dict in {path!r} contains no parameters.", UserWarning, stacklevel=3)
        return obj.eval()
    keys = load_plain_state_dict(obj, state, strict=strict)  # into compiled submodules too
    if not strict and keys is not None:
        if getattr(keys, "missing_keys", None):
            warnings.warn(
                f"Found keys that are in the model state dict but not in the checkpoint: {keys.missing_keys}",
                stacklevel=3,
            )
        if getattr(keys, "unexpected_keys", None):
            warnings.warn(
                f"Found keys that are not in the model state dict but in the checkpoint: {keys.unexpected_keys}",
                stacklevel=3,
            )
    device = next((t.device for t in state.values() if isinstance(t, torch.Tensor)), None)
    return (obj if device is None else obj.to(device)).eval()


def read_hparams_file(hparams_file: str | os.PathLike) -> dict[str, Any]:
    """``load_from_checkpoint(hparams_file=...)``: the hyperparameters of a logger's
    ``hparams.yaml`` (read with ``yaml.safe_load``: plain data only, never objects the file names)
    or of a Lightning ``tags.csv`` (key,value rows, values read as Python literals where they are
    one). A missing file gives Lightning's warning and no hyperparameters."""
    path = os.fspath(hparams_file)
    extension = path.rsplit(".", 1)[-1].lower()
    if extension not in ("csv", "yml", "yaml"):
        raise ValueError(f".csv, .yml or .yaml is required for `hparams_file` (got hparams_file={path!r}).")
    if not os.path.isfile(path):
        warnings.warn(f"Missing Tags: {path}.", RuntimeWarning, stacklevel=4)
        return {}
    with open(path, newline="" if extension == "csv" else None, encoding="utf-8") as f:
        if extension == "csv":
            return {row[0]: _literal(row[1]) for row in list(csv.reader(f))[1:] if len(row) >= 2}
        try:
            import yaml
        except ImportError:
            raise ModuleNotFoundError(
                f"Reading hparams_file={path!r} needs PyYAML, which is not installed: pip install pyyaml"
            ) from None
        try:
            loaded = yaml.safe_load(f)
        except yaml.YAMLError as err:  # e.g. a !!python/object tag: we never build objects a file names
            raise ValueError(f"hparams_file={path!r} is not plain YAML data: {err}") from None
    return dict(loaded or {})


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _build(
    cls: type, path: str, ckpt: dict[str, Any], saved: dict[str, Any], kwargs: dict[str, Any], recorded: bool
) -> Any:
    """``cls(**hyperparameters)``: the ones ``__init__`` takes (all of them if it takes
    ``**kwargs``); a dict given to ``save_hyperparameters`` goes back to its argument. A module
    the command line built (``_instantiator``) is rebuilt from its config by :func:`instantiate_module`."""
    params = inspect.signature(cls.__init__).parameters
    names = [n for i, (n, p) in enumerate(params.items()) if i and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    name = ckpt.get(cls.CHECKPOINT_HYPER_PARAMS_NAME)
    loaded = {name: saved} if name and name in names else dict(saved)
    arguments = {**loaded, **kwargs}
    instantiator = arguments.pop("_instantiator", None)
    if instantiator is not None and instantiator not in INSTANTIATORS:
        raise ValueError(
            f"The instantiator {instantiator!r} from the checkpoint is not in the allowlist of trusted instantiators "
            "and was blocked to prevent arbitrary code execution. Only the command line's is taken "
            f"({', '.join(sorted(INSTANTIATORS))}): build the model yourself and load its weights with "
            "model.load_state_dict(trainer.checkpoint.load(path)['state_dict'])."
        )
    if not takes_any and not (instantiator and "_class_path" in arguments):  # else the subclass named takes them
        arguments = {k: v for k, v in arguments.items() if k in names}
    try:
        return instantiate_module(cls, arguments) if instantiator else cls(**arguments)
    except TypeError as err:
        missing = [k for k in layout.ours(ckpt).get("hparams_left_out", []) if k not in kwargs]
        if missing:
            raise TypeError(
                f"{cls.__name__}.load_from_checkpoint({path!r}): the checkpoint left out "
                f"{', '.join(map(repr, missing))} (not plain data, so not saved; {err}). Pass "
                f"{'it' if len(missing) == 1 else 'them'}: {cls.__name__}.load_from_checkpoint(path, "
                f"{', '.join(f'{k}=...' for k in missing)})."
            ) from None
        if recorded:
            raise
        raise TypeError(
            f"{cls.__name__}.load_from_checkpoint({path!r}): the checkpoint holds no "
            f"hyperparameters, and {cls.__name__}() could not be built without them ({err}). Call "
            "self.save_hyperparameters() in __init__ so that checkpoints record them, or pass them "
            f"here: {cls.__name__}.load_from_checkpoint(path, <argument>=...)."
        ) from None


# What the command line writes as ``_instantiator`` into the hyperparameters of a module it built, and the
# names a checkpoint may give (Lightning's CLI's too): each means instantiate_module below. Any other name
# is refused: a checkpoint never names code that runs.
INSTANTIATOR = "trainer.cli.instantiate_module"
INSTANTIATORS = frozenset(
    {INSTANTIATOR, "lightning.pytorch.cli.instantiate_module", "pytorch_lightning.cli.instantiate_module"}
)
JSONARGPARSE_INSTALL = 'pip install "jsonargparse[signatures]>=4.27" (or the extra: pip install ".[cli]")'


def safe_jsonargparse() -> Any:
    """jsonargparse, set up as the command line uses it: a class path naming os.system,
    subprocess.*, pickle.loads... (its import block list) is an error, not a warning
    (enforcement is off by default until jsonargparse 5, and giving a list turns it on)."""
    import jsonargparse

    jsonargparse.register_unresolvable_import_paths(torch)  # torch's classes report import paths that do not import
    if "import_path_denylist" in inspect.signature(jsonargparse.set_parsing_settings).parameters:
        jsonargparse.set_parsing_settings(import_path_denylist=[])
    return jsonargparse


def instantiate_module(class_type: type, config: dict[str, Any]) -> Any:
    """``class_type`` (or the subclass of it that ``config["_class_path"]`` names) built from the
    command line's config that a checkpoint recorded, as the command line built it: the objects it
    injected rebuilt from their class paths, under jsonargparse's import block list."""
    try:
        jsonargparse = safe_jsonargparse()
    except ImportError:
        raise ModuleNotFoundError(
            f"{class_type.__name__} was configured by the command line, and rebuilding it from its checkpoint "
            f"needs jsonargparse, which is not installed: {JSONARGPARSE_INSTALL}."
        ) from None
    parser = jsonargparse.ArgumentParser(exit_on_error=False)
    if "_class_path" in config:
        parser.add_subclass_arguments(class_type, "module", fail_untyped=False)
        config = {
            "class_path": config["_class_path"], "dict_kwargs": {k: v for k, v in config.items() if k != "_class_path"}
        }
    else:
        parser.add_class_arguments(class_type, "module", fail_untyped=False)
    parsed = parser.parse_object({"module": config})
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes  # renamed in 4.49
    return instantiate(parsed).module


CHECKPOINT_READER.append(load_from_checkpoint)  # TrainModule's and DataModule's load_from_checkpoint call it
