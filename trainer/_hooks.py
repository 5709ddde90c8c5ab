"""The Trainer's side of callbacks: checking the list, and working out once per run which
callbacks override which hook."""

from __future__ import annotations

from typing import Any, Callable

from callbacks.base import HOOKS, Callback


class Hooks:
    """``hooks.on_train_batch_end`` is the list of overriding callbacks' bound methods.

    A hook that no callback overrides is an empty list, so the loop's ``for fn in ...``
    costs one attribute lookup per step. Callbacks keep the order they were given in.
    """

    def __init__(self, callbacks: list[Callback]) -> None:
        self.callbacks = callbacks
        for name in HOOKS:
            setattr(self, name, [getattr(cb, name) for cb in callbacks if overrides(cb, name) and cb.wants(name)])

    def call(self, name: str, *args: Any) -> None:
        fns: list[Callable[..., Any]] = getattr(self, name)
        for fn in fns:
            fn(*args)


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
    return callbacks
