"""The Trainer's side of callbacks: checking the list, and working out once per run which
callbacks override which hook."""

from __future__ import annotations

import warnings
from typing import Any, Callable

from callbacks.base import HOOKS, Callback

from trainer.core.module import TrainModule


class Hooks:
    """``hooks.on_train_batch_end`` is the list of the functions to call for that hook.

    The model's own hook (a ``TrainModule`` method of the same name, without the ``(trainer,
    module)`` arguments) comes first, then the callbacks' in the order they were given. A hook
    that nothing overrides is an empty list, so the loop's ``for fn in ...`` costs one
    attribute lookup per step.
    """

    def __init__(self, callbacks: list[Callback], module: Any = None) -> None:
        self.callbacks = callbacks
        self.module_hooks: dict[str, Callable[..., Any]] = {}  # name -> the model's own hook, adapted
        for name in HOOKS:
            fns = [getattr(cb, name) for cb in callbacks if overrides(cb, name) and cb.wants(name)]
            own = _module_hook(module, name)
            if own is not None:
                self.module_hooks[name] = own
                fns.insert(0, own)
            setattr(self, name, fns)

    def call(self, name: str, *args: Any) -> None:
        fns: list[Callable[..., Any]] = getattr(self, name)
        for fn in fns:
            fn(*args)


def _module_hook(module: Any, name: str) -> Callable[..., Any] | None:
    """The model's override of hook ``name``, called as a callback's is (the trainer and
    module arguments dropped); None if it does not override it."""
    base = getattr(TrainModule, name, None)
    if base is None or not isinstance(module, TrainModule) or getattr(type(module), name) is base:
        return None
    own = getattr(module, name)

    def call(trainer: Any, module: Any, *args: Any) -> Any:
        return own(*args)

    return call


def overrides(callback: Callback, name: str) -> bool:
    """True if ``callback`` defines hook ``name`` itself: in its class, or as an instance
    attribute (how ``LambdaCallback`` attaches plain functions)."""
    if name in getattr(callback, "__dict__", ()):
        return True
    base = getattr(Callback, name)
    return getattr(type(callback), name, base) is not base


def check_callbacks(callbacks: Any) -> list[Callback]:
    if callbacks is None:
        return []
    if isinstance(callbacks, Callback):
        callbacks = [callbacks]
    if isinstance(callbacks, (str, bytes)) or not hasattr(callbacks, "__iter__"):
        raise TypeError(f"callbacks={callbacks!r:.80} must be a list of callbacks.Callback instances (or None).")
    callbacks = list(callbacks)
    for cb in callbacks:
        if isinstance(cb, type) and issubclass(cb, Callback):
            raise TypeError(f"callbacks contains the class {cb.__name__}, not an instance: pass {cb.__name__}().")
        if not isinstance(cb, Callback):
            raise TypeError(f"callbacks contains {cb!r:.80}, which is not a callbacks.Callback.")
    keys = [cb.state_key for cb in callbacks if overrides_state(cb)]
    for key in sorted({k for k in keys if keys.count(k) > 1}):
        warnings.warn(
            f"Two callbacks keep state under state_key {key!r}: a checkpoint holds only one of them, and a resumed "
            "run gives it to both. Give them different arguments (e.g. another monitor), or a state_key of their own.",
            stacklevel=3,
        )
    return callbacks


def overrides_state(callback: Callback) -> bool:
    return type(callback).state_dict is not Callback.state_dict
