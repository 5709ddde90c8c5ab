"""Calling callback hooks: which callbacks override which hook is worked out once per run."""

from __future__ import annotations

from typing import Any, Callable

from callbacks.base import HOOKS, Callback


class Hooks:
    """``hooks.on_train_batch_end`` is the list of overriding callbacks' bound methods.

    A hook that no callback overrides is an empty list, so the loop's ``for fn in ...``
    costs one attribute lookup per step.
    """

    def __init__(self, callbacks: list[Callback]) -> None:
        self.callbacks = callbacks
        for name in HOOKS:
            base = getattr(Callback, name)
            fns = [getattr(cb, name) for cb in callbacks if getattr(type(cb), name, base) is not base]
            setattr(self, name, fns)

    def call(self, name: str, *args: Any) -> None:
        fns: list[Callable[..., Any]] = getattr(self, name)
        for fn in fns:
            fn(*args)
