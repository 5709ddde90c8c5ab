"""LambdaCallback: plain functions as hooks, without writing a class."""

from __future__ import annotations

from typing import Any, Callable

from trainer.core.checks import suggest

from .base import HOOKS, Callback


class LambdaCallback(Callback):
    """Each keyword names a hook; its function gets the hook's arguments.

    Example: ``LambdaCallback(on_train_epoch_end=lambda trainer, module: print(trainer.current_epoch))``.
    Only the hooks given are ever called. Under ``strategy="ddp"`` (spawned workers) the
    functions are pickled, so give module-level functions rather than lambdas there.
    """

    def __init__(self, **hooks: Callable[..., Any]) -> None:
        for name, fn in hooks.items():
            if name not in HOOKS:
                raise TypeError(
                    f"LambdaCallback got an unknown hook {name!r}.{suggest(name, HOOKS)} "
                    f"Valid hooks: {', '.join(HOOKS)}."
                )
            if not callable(fn):
                raise TypeError(
                    f"LambdaCallback({name}={fn!r}): the value must be a function that takes the hook's "
                    f"arguments, e.g. {name}=lambda trainer, module, *args: ..."
                )
            # An instance attribute: the Trainer's hook table counts it as an override.
            setattr(self, name, fn)
