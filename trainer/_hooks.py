"""Calling callback hooks: which callbacks override which hook is worked out once per run."""

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
