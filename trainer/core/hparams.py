"""Hyperparameters: ``self.save_hyperparameters()`` and ``self.hparams``, for the module and the
DataModule, as Lightning has them; and what of them a checkpoint can keep.

A checkpoint is loaded with ``weights_only=True`` (no code in the file runs), so it keeps only
plain data: numbers, strings, None, and lists, tuples and dicts of them. Anything else (an
``nn.Module``, a ``functools.partial`` of an optimizer, a class) stays in ``self.hparams`` in
memory and is left out of the file's hyperparameters, named once in a warning; ``load_from_checkpoint``
then says which arguments to pass. Those that pickle are also kept as bytes (inert to such a load), which
``load_from_checkpoint(path, weights_only=False)`` unpickles, as Lightning rebuilds them.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import inspect
import io
import pickle
import sys
import types
import warnings
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from typing import Any, Callable, Iterable, Iterator

import torch
from torch import nn


# What ``load_from_checkpoint`` of the module and the DataModule call to read a file: the checkpoint
# room's reader (trainer/checkpoint/from_checkpoint.py), which puts itself here when that room is
# imported (``import trainer`` imports it), so that this bottom room imports nothing above it.
CHECKPOINT_READER: list[Callable[..., Any]] = []


class AttributeDict(dict):
    """A dict whose keys are also attributes: ``hparams.lr`` is ``hparams["lr"]``."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(
                f"hparams has no {key!r}; it holds {sorted(self) or 'nothing'}. Pass it to __init__ and call "
                "self.save_hyperparameters(), or set self.hparams.<name> = value."
            ) from None

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value

    def __delattr__(self, key: str) -> None:
        del self[key]

    def __repr__(self) -> str:
        if not self:
            return ""
        width = max(len(str(k)) for k in self)
        return "\n".join(f"{str(k)!r:>{width + 2}}: {v!r}" for k, v in sorted(self.items(), key=lambda kv: str(kv[0])))

    def __deepcopy__(self, memo: dict[int, Any]) -> "AttributeDict":
        # a module or an optimizer's partial would be copied whole: keep the very objects
        return AttributeDict({k: v if _keep_shared(v) else copy.deepcopy(v, memo) for k, v in self.items()})


def _keep_shared(value: Any) -> bool:
    return not is_plain(value)


# (class being built, the hyperparameters its save_hyperparameters records): set by given_hyperparameters
_GIVEN: ContextVar[tuple[type, dict[str, Any]] | None] = ContextVar("given_hyperparameters", default=None)


@contextlib.contextmanager
def given_hyperparameters(cls: type, hparams: dict[str, Any], instantiator: str) -> Iterator[None]:
    """While ``cls`` is built in this block, its ``save_hyperparameters()`` records ``hparams``
    and ``_instantiator`` (the name of the function ``load_from_checkpoint`` rebuilds it with)
    instead of the arguments ``__init__`` received: the command line's config, plain data with
    class paths where it injected objects, so that a checkpoint keeps all of it. Other classes
    built meanwhile (its submodules) record their own arguments."""
    token = _GIVEN.set((cls, {**hparams, "_instantiator": instantiator}))
    try:
        yield
    finally:
        _GIVEN.reset(token)


class HyperparametersMixin:
    """``save_hyperparameters``, ``hparams`` and ``hparams_initial`` (the module and the DataModule)."""

    def save_hyperparameters(
        self, *args: Any, ignore: str | Iterable[str] | None = None, frame: types.FrameType | None = None,
        logger: bool = True,
    ) -> None:
        """Record hyperparameters in ``self.hparams`` (checkpoints and the logger get them too).

        With no ``args``: every argument of ``__init__`` (of each ``__init__`` in the class
        chain, the subclass's winning), ``*args`` and ``**kwargs`` included. With names
        (``save_hyperparameters("lr", "hidden")``): those arguments only. With one dict or
        ``argparse.Namespace``: its items. ``ignore`` leaves names out; ``logger=False`` keeps
        them from the logger's HParams (checkpoints still record them).
        """
        self._log_hyperparams = bool(logger)
        if frame is None:
            current = inspect.currentframe()
            frame = current.f_back if current is not None else None
        ignored = {ignore} if isinstance(ignore, str) else set(ignore or ())
        given_by = _GIVEN.get()
        if given_by is not None and type(self) is given_by[0]:  # built by the command line: its config
            init_args = dict(given_by[1])
        elif dataclasses.is_dataclass(self):  # called from __post_init__: the fields __init__ takes
            init_args = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init}
        else:
            init_args = _init_args(self, frame)
        # Lightning's hparams_name, which load_from_checkpoint reads: "kwargs" for arguments by name,
        # else the name of the argument that held the dict given.
        self._hparams_name = "kwargs"
        if len(args) == 1 and is_dict_config(args[0]):  # Lightning's: an OmegaConf config stays one
            given = args[0]
            self._hparams_name = next((k for k, v in init_args.items() if v is args[0]), None)
        elif len(args) == 1 and isinstance(args[0], (Mapping, argparse.Namespace)):
            given = vars(args[0]) if isinstance(args[0], argparse.Namespace) else _plain_mapping(args[0])
            self._hparams_name = next((k for k, v in init_args.items() if v is args[0]), None)
        elif args:
            others = [a for a in args if not isinstance(a, str)]
            if len(others) == 1 and isinstance(others[0], (bool, int, float)):  # Lightning's words first
                raise ValueError(
                    f"Primitives {(bool, int, float, str)} are not allowed. save_hyperparameters"
                    f"({', '.join(map(repr, args))}) takes argument names as strings, "
                    "or one dict or argparse.Namespace."
                )
            unknown = [a for a in args if not isinstance(a, str) or a not in init_args]
            if unknown:
                raise ValueError(
                    f"save_hyperparameters({', '.join(map(repr, args))}): {', '.join(map(repr, unknown))} "
                    f"{'is' if len(unknown) == 1 else 'are'} not an argument of {type(self).__name__}.__init__ "
                    f"(its arguments: {sorted(init_args) or 'none'}). Pass argument names as strings, or one dict "
                    "or argparse.Namespace."
                )
            given = {name: init_args[name] for name in args}
        else:
            given = init_args
        if is_dict_config(given):
            if ignored & set(given):  # the caller's config stays as it is
                given = copy.deepcopy(given)
                for name in ignored & set(given):
                    del given[name]
        else:
            given = {k: v for k, v in given.items() if k not in ignored}
        if not args and not given:
            self._hparams_name = None
        modules = [k for k, v in given.items() if isinstance(v, nn.Module)]
        for name in modules:  # Lightning's words first, one warning a module
            warnings.warn(
                f"Attribute {name!r} is an instance of `nn.Module` and is already saved during checkpointing "
                f"(in {type(self).__name__}.save_hyperparameters()): its weights are in the checkpoint, and it is left "
                f"out of the checkpoint's hyperparameters. Say so with self.save_hyperparameters(ignore=[{name!r}]), "
                "and pass it again to load_from_checkpoint.",
                UserWarning, stacklevel=2,
            )
        self._warned_hparams = set(modules)  # already named: the checkpoint does not name them again
        # As in Lightning, each call replaces what an earlier one recorded (a base class's call
        # included): a subclass's ignore= drops what the base recorded, and a dict is the hparams.
        self.hparams = given
        self._hparams_initial = copy.deepcopy(self.hparams)

    @property
    def hparams(self) -> AttributeDict:
        """The hyperparameters: ``self.hparams.lr`` or ``self.hparams["lr"]``; changeable."""
        try:
            return self.__dict__["_hparams"]
        except KeyError:
            value = self.__dict__["_hparams"] = AttributeDict()
            return value

    @hparams.setter
    def hparams(self, value: Any) -> None:
        if isinstance(value, argparse.Namespace):
            value = vars(value)
        if is_dict_config(value):  # kept as it is, as in Lightning
            self.__dict__["_hparams"] = value
            return
        if not isinstance(value, dict):
            raise TypeError(f"hparams = {value!r:.80} must be a dict, argparse.Namespace or DictConfig.")
        self.__dict__["_hparams"] = AttributeDict(value)

    @property
    def hparams_initial(self) -> AttributeDict:
        """A copy of the hyperparameters as ``save_hyperparameters`` recorded them."""
        return copy.deepcopy(self.__dict__.get("_hparams_initial", AttributeDict()))


def _init_args(obj: Any, frame: types.FrameType | None) -> dict[str, Any]:
    """The arguments of the ``__init__`` calls of ``obj`` on the stack from ``frame`` up, the outer
    ones winning (a subclass's value over what it passed its base), as Lightning collects them. Like
    Lightning's, the walk goes on through the ``__init__`` of another module or DataModule that is
    building this one (``self.child = Child(...)`` in a parent's ``__init__``, which calls ``super()``):
    the parent's arguments join the child's."""
    chain = []
    while frame is not None and frame.f_code.co_name == "__init__" and _builds(frame.f_locals.get("self"), obj, frame):
        chain.append(frame)
        frame = frame.f_back
    out: dict[str, Any] = {}
    for f in chain:
        info = inspect.getargvalues(f)
        for name in info.args[1:]:
            out[name] = info.locals[name]
        if info.varargs and info.locals.get(info.varargs):
            out[info.varargs] = info.locals[info.varargs]
        if info.keywords:
            out.update(info.locals.get(info.keywords, {}))
    for k in ("__class__", "frame"):
        out.pop(k, None)
    return out


def _plain_mapping(mapping: Mapping) -> dict[str, Any]:
    """A mapping's items as a dict, nested mappings and sequences too (an OmegaConf config as its plain items)."""

    def plain(value: Any) -> Any:
        if isinstance(value, Mapping) and type(value) is not dict:
            return _plain_mapping(value)
        if isinstance(value, Sequence) and not isinstance(value, (str, bytes, list, tuple)):
            return [plain(v) for v in value]
        return value

    return {k: plain(v) for k, v in mapping.items()}


def is_dict_config(value: Any) -> bool:
    """Whether ``value`` is an OmegaConf ``DictConfig`` (omegaconf is not imported here: a config
    exists only where its user imported it)."""
    omegaconf = sys.modules.get("omegaconf")
    return omegaconf is not None and isinstance(value, omegaconf.DictConfig)


def plain_hparams(hparams: Any) -> dict[str, Any]:
    """``hparams`` as a dict: an OmegaConf config as its plain, resolved items (what a checkpoint and
    the loggers keep); any other mapping as its items."""
    if is_dict_config(hparams):
        return sys.modules["omegaconf"].OmegaConf.to_container(hparams, resolve=True)
    return dict(hparams)


def hparams_type(owner: Any) -> str | None:
    """What a checkpoint records of the type of ``owner.hparams``, for ``load_from_checkpoint``
    to give the same back: ``"DictConfig"`` for an OmegaConf config, else None (a dict)."""
    return "DictConfig" if is_dict_config(getattr(owner, "__dict__", {}).get("_hparams")) else None


def as_hparams_type(hparams: dict[str, Any], recorded: str | None) -> Any:
    """The hyperparameters a checkpoint kept as plain data, as the type it ``recorded``
    (:func:`hparams_type`): an OmegaConf config built from plain data runs nothing from the file."""
    if recorded != "DictConfig":
        return hparams
    try:
        from omegaconf import OmegaConf
    except ImportError:
        warnings.warn(
            "The checkpoint's hyperparameters were an OmegaConf DictConfig, and omegaconf is not installed: "
            "they are given as a dict. pip install omegaconf", UserWarning, stacklevel=3,
        )
        return hparams
    return OmegaConf.create(hparams)


def _builds(owner: Any, obj: Any, frame: types.FrameType) -> bool:
    return owner is obj or (isinstance(owner, HyperparametersMixin) and "__class__" in frame.f_locals)


def is_plain(value: Any) -> bool:
    """Whether ``torch.load(weights_only=True)`` reads ``value`` back as it is (a numpy number
    as the Python number it is saved as)."""
    if value is None or isinstance(value, (bool, int, float, str)) or _numpy_number(value):
        return True
    if isinstance(value, (list, tuple)):
        return all(is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, (str, int)) and is_plain(v) for k, v in value.items())
    return False


def checkpoint_hparams(owner: Any) -> tuple[dict[str, Any], list[str]]:
    """What of ``owner.hparams`` a checkpoint keeps (as a plain dict) and the names it leaves
    out. The first time something is left out it is named in one warning."""
    hparams = owner.__dict__.get("_hparams") if hasattr(owner, "__dict__") else None
    if not hparams:
        return {}, []
    hparams = plain_hparams(hparams)
    kept, left_out = {}, []
    for k, v in hparams.items():
        if is_plain(v):
            kept[str(k)] = _as_plain(v)
        else:
            left_out.append(str(k))
    warned = owner.__dict__.setdefault("_warned_hparams", set())
    new = [k for k in left_out if k not in warned]
    if new:
        warned.update(new)
        kinds = ", ".join(f"{k!r} ({type(hparams[k]).__name__})" for k in new)
        warnings.warn(
            f"{type(owner).__name__}.hparams: {kinds} {'is' if len(new) == 1 else 'are'} not plain data, which a "
            "checkpoint loaded with weights_only=True cannot hold: left out of the checkpoint (it stays in "
            f"self.hparams in memory). Pass {'it' if len(new) == 1 else 'them'} again to "
            f"{type(owner).__name__}.load_from_checkpoint(path, {', '.join(f'{k}=...' for k in new)}).",
            UserWarning, stacklevel=2,
        )
    return kept, left_out


def pickled_hparams(owner: Any, names: list[str]) -> dict[str, bytes]:
    """The left-out hyperparameters ``names`` (a network passed to ``__init__``), each pickled by ``torch.save``
    into bytes, for ``load_from_checkpoint(path, weights_only=False)``, which rebuilds them as Lightning does. As
    bytes they are inert data to a ``weights_only=True`` load (the default); one that cannot be pickled (a
    lambda, a local class) is left out, and ``load_from_checkpoint`` asks for it."""
    hparams = owner.__dict__.get("_hparams") or {}
    blobs = {}
    for name in names:
        buffer = io.BytesIO()
        try:
            torch.save(hparams[name], buffer)
        except (pickle.PicklingError, AttributeError, TypeError):
            continue
        blobs[name] = buffer.getvalue()
    return blobs


def _numpy_number(value: Any) -> bool:
    return type(value).__module__ == "numpy" and getattr(value, "ndim", None) == 0 and hasattr(value, "item")


def _as_plain(value: Any) -> Any:
    if _numpy_number(value):
        return value.item()
    if isinstance(value, dict):
        return {k: _as_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if type(value) in (list, tuple):
            return type(value)(_as_plain(v) for v in value)
        return [_as_plain(v) for v in value]
    return value
