"""Lightning's ``utilities.parsing``: what can be pickled, a constructor's arguments, and the
attribute search the tuner uses (the model, its ``hparams``, then the DataModule and its ``hparams``)."""

from __future__ import annotations

import inspect
import pickle
import types
from collections.abc import MutableMapping
from typing import Any

from trainer.core.distributed import rank_zero_warn

_NOT_FOUND = "is neither stored in the model namespace nor the `hparams` namespace/dict, nor the datamodule."


def is_picklable(obj: object) -> bool:
    """Whether ``pickle.dumps(obj)`` succeeds."""
    try:
        pickle.dumps(obj)
        return True
    except (pickle.PickleError, AttributeError, RuntimeError, TypeError):
        return False


def clean_namespace(hparams: MutableMapping) -> None:
    """Remove, with a warning each, the entries of ``hparams`` that cannot be pickled."""
    for key in [k for k, v in hparams.items() if not is_picklable(v)]:
        rank_zero_warn(
            f"Attribute '{key}' removed from hparams because it cannot be pickled. You can suppress this warning by"
            f" setting `self.save_hyperparameters(ignore=['{key}'])`."
        )
        del hparams[key]


def parse_class_init_keys(cls: type) -> tuple[str, str | None, str | None]:
    """The names ``cls.__init__`` gives to ``self``, ``*args`` and ``**kwargs`` (None where it has none)."""
    params = list(inspect.signature(cls.__init__).parameters.values())  # type: ignore[misc]
    var_args = next((p.name for p in params if p.kind is inspect.Parameter.VAR_POSITIONAL), None)
    var_kwargs = next((p.name for p in params if p.kind is inspect.Parameter.VAR_KEYWORD), None)
    return params[0].name, var_args, var_kwargs


def _get_init_args(frame: types.FrameType) -> tuple[Any | None, dict[str, Any]]:
    """(self, arguments) of the ``__init__`` running in ``frame``, ``**kwargs`` spread out; (None, {})
    when ``frame`` is not a constructor of a class."""
    local_vars = frame.f_locals
    if "__class__" not in local_vars or frame.f_code.co_name != "__init__":
        return None, {}
    cls = local_vars["__class__"]
    self_name, args_name, kwargs_name = parse_class_init_keys(cls)
    args = {k: local_vars[k] for k in inspect.signature(cls.__init__).parameters if k in local_vars}
    if kwargs_name:
        args.update(args.get(kwargs_name, {}))
    left_out = {self_name, args_name, kwargs_name, "__class__", "frame", "frame_args"}
    return local_vars.get(self_name), {k: v for k, v in args.items() if k not in left_out}


def get_init_args(frame: types.FrameType) -> dict[str, Any]:
    """The arguments of the ``__init__`` running in ``frame``."""
    return _get_init_args(frame)[1]


def collect_init_args(
    frame: types.FrameType, path_args: list[dict[str, Any]], inside: bool = False, classes: tuple[type, ...] = ()
) -> list[dict[str, Any]]:
    """The arguments of each constructor in the chain of ``super().__init__`` calls that ``frame`` is in,
    outermost (the most specific class) last, appended to ``path_args``."""
    while isinstance(frame.f_back, types.FrameType):
        owner, args = _get_init_args(frame)
        if "__class__" in frame.f_locals and (not classes or isinstance(owner, classes)):
            path_args.append(args)
            inside = True
        elif inside:
            break
        frame = frame.f_back
    return path_args


def _attr_holders(model: Any, attribute: str) -> list[Any]:
    """Every place that holds ``attribute``: the model, its hparams, the DataModule and its hparams."""
    holders = [model] if hasattr(model, attribute) else []
    if attribute in (getattr(model, "hparams", None) or ()):
        holders.append(model.hparams)
    trainer = getattr(model, "_trainer", None)
    datamodule = getattr(trainer, "datamodule", None) if trainer is not None else None
    if datamodule is not None:
        if hasattr(datamodule, attribute):
            holders.append(datamodule)
        if attribute in (getattr(datamodule, "hparams", None) or ()):
            holders.append(datamodule.hparams)
    return holders


def lightning_hasattr(model: Any, attribute: str) -> bool:
    """Whether the model, its hparams or the DataModule (and its hparams) hold ``attribute``."""
    return bool(_attr_holders(model, attribute))


def lightning_getattr(model: Any, attribute: str) -> Any:
    """``attribute`` from the last of the model, its hparams, the DataModule and its hparams that holds it."""
    holders = _attr_holders(model, attribute)
    if not holders:
        raise AttributeError(f"{attribute} {_NOT_FOUND}")
    holder = holders[-1]
    return holder[attribute] if isinstance(holder, dict) else getattr(holder, attribute)


def lightning_setattr(model: Any, attribute: str, value: Any) -> None:
    """Set ``attribute`` in every one of the model, its hparams, the DataModule and its hparams that holds it."""
    holders = _attr_holders(model, attribute)
    if not holders:
        raise AttributeError(f"{attribute} {_NOT_FOUND}")
    for holder in holders:
        if isinstance(holder, dict):
            holder[attribute] = value
        else:
            setattr(holder, attribute, value)
