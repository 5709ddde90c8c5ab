"""The Trainer's side of callbacks: checking the list, and working out once per run which
callbacks override which hook."""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import TYPE_CHECKING, Any, Callable, Iterator

from callbacks.base import HOOKS, Callback
from callbacks.early_stopping import EarlyStopping
from callbacks.finders import BatchSizeFinder, LearningRateFinder
from callbacks.model_checkpoint import ModelCheckpoint
from trainer.core.checks import instances_of

from trainer.core.datamodule import DataModule
from trainer.core.metrics import set_sink
from trainer.core.module import TrainModule, overridden

if TYPE_CHECKING:
    from trainer.loops.profiling import Profiling


class Hooks:
    """``hooks.on_train_batch_end`` is the list of the functions to call for that hook.

    Lightning's order, for every hook: the callbacks in the order they were given, then the
    model's own hook (a ``TrainModule`` method of the same name, without the ``(trainer,
    module)`` arguments), then ``tail`` (the Trainer's log writer, which writes what all of them
    logged). One exception, Lightning's too: at ``on_train_epoch_end`` the monitoring callbacks
    (``ModelCheckpoint``, ``EarlyStopping``) come after the model, so that they can judge a value
    the model logs there; ``epoch_end_monitors`` is where they start in that list. And
    ``on_train_end`` starts by waiting for the checkpoints being written in the background,
    since Lightning's are on disk when its loop ends. A hook that
    nothing overrides is an empty list, so the loop's ``for fn in ...`` costs one attribute
    lookup per step.
    """

    def __init__(
        self, callbacks: list[Callback], module: Any = None, tail: list[Callback] | None = None,
        profiling: Profiling | None = None,
    ) -> None:
        """``profiling``: a recording profiler's timers (profiling.py): then every callback's and the
        module's hook, overridden or not, is a timed call, as Lightning times them, and each
        training batch is timed from the last ``on_train_batch_start`` function to the first
        ``on_train_batch_end`` one."""
        tail = list(tail or [])
        self.callbacks = callbacks + tail
        self.module_hooks: dict[str, Callable[..., Any]] = {}  # name -> the model's own hook, adapted
        monitoring = [cb for cb in callbacks if isinstance(cb, MONITORING)]
        ordinary = [cb for cb in callbacks if not isinstance(cb, MONITORING)]
        self.epoch_end_monitors = 0
        if not self.callbacks and module is None and profiling is None:  # a run's placeholder, before any stage
            for name in HOOKS:
                setattr(self, name, [])
            return
        # Which hooks each callback overrides and wants, asked once per callback (not once per hook).
        wanted = {} if profiling is not None else {id(cb): _hooks_of(cb) for cb in self.callbacks}
        for name in HOOKS:
            before, after = (ordinary, monitoring + tail) if name == "on_train_epoch_end" else (callbacks, tail)
            if profiling is None:
                fns = _overriding(before, name, wanted)
            else:
                fns = profiled_callbacks(profiling, before, name)
            own = _module_hook(module, name) if profiling is None else profiled_module_hook(profiling, module, name)
            if own is not None:
                self.module_hooks[name] = own
                fns.append(own)
            if name == "on_train_epoch_end":
                self.epoch_end_monitors = len(fns)
            if name == "on_train_end":  # background saves are on disk before any callback's hook reads them
                fns = [_waiting_for_saves(cb) for cb in callbacks if getattr(type(cb), "wait_for_saves", None)] + fns
            if profiling is None:
                fns += _overriding(after, name, wanted)
            else:
                fns += profiled_callbacks(profiling, after, name, tail)
            setattr(self, name, fns)
        if profiling is not None:
            self.on_train_batch_start.append(profiling.batch_start)
            self.on_train_batch_end.insert(0, profiling.batch_end)

    def call(self, name: str, *args: Any, **kwargs: Any) -> None:
        fns: list[Callable[..., Any]] = getattr(self, name)
        for fn in fns:
            fn(*args, **kwargs)


@contextlib.contextmanager
def refusing_logs() -> Iterator[None]:
    """Around hooks where Lightning refuses ``self.log`` (its ``_FxValidator``: ``on_validation_end``,
    ``on_save_checkpoint``, the ``*_model_eval`` hooks, ...): no sink, so ``self.log`` raises
    Lightning's "You can't `self.log()` inside ..." error instead of recording a value."""
    previous = set_sink(None)
    try:
        yield
    finally:
        set_sink(previous)


# Lightning's "monitoring callbacks": at on_train_epoch_end they run after the model's hook.
MONITORING = (EarlyStopping, ModelCheckpoint)


def _overriding(callbacks: list[Callback], name: str, wanted: dict[int, frozenset[str]]) -> list[Callable[..., Any]]:
    return [getattr(cb, name) for cb in callbacks if name in wanted[id(cb)]]


_HOOK_NAMES = frozenset(HOOKS)


def _hooks_of(callback: Callback) -> frozenset[str]:
    """The hooks ``callback`` overrides (``overrides``) and wants this run (``wants_hook``). Only
    the names its instance or its classes below ``Callback`` define can override one: one walk
    of those, instead of a look in every class for every hook, at each stage's start."""
    kind = type(callback)
    if issubclass(kind, Callback):
        found = set(_HOOK_NAMES.intersection(getattr(callback, "__dict__", ())))
        for klass in kind.__mro__:
            if klass is Callback:
                break
            found.update(_HOOK_NAMES.intersection(vars(klass)))
    else:
        found = _HOOK_NAMES
    return frozenset([n for n in HOOKS if n in found and overrides(callback, n) and wants_hook(callback, n)])


def _waiting_for_saves(cb: Callback) -> Callable[..., Any]:
    """``cb.wait_for_saves`` called as an ``on_train_end`` hook is; a partial, not a lambda, so that
    the Trainer still pickles (Lightning's tests pickle a bar that holds it)."""
    return functools.partial(_wait_for_saves, cb)


def _wait_for_saves(cb: Callback, trainer: Any, module: Any) -> None:
    cb.wait_for_saves(trainer)


def _module_hook(module: Any, name: str) -> Callable[..., Any] | None:
    """The model's override of hook ``name``, called as a callback's is (the trainer and
    module arguments dropped); None if it does not override it."""
    base = getattr(TrainModule, name, None)
    if base is None or not isinstance(module, TrainModule) or getattr(type(module), name) is base:
        return None
    own = getattr(module, name)

    def call(trainer: Any, module: Any, *args: Any, **kwargs: Any) -> Any:
        return own(*args, **kwargs)

    return call


def profiled_callbacks(
    profiling: Profiling, callbacks: list[Callback], name: str, tail: list[Callback] | tuple[()] = (),
) -> list[Callable[..., Any]]:
    """Under a profiler, Lightning's record of hook ``name``: each callback's call, timed as
    ``[Callback]<state_key>.<name>``, a callback that does not override it included (a no-op, as
    Lightning calls it); the Trainer's own ``tail`` only where it overrides it."""
    fns = []
    for cb in callbacks:
        own = overrides(cb, name) and wants_hook(cb, name)
        if any(cb is t for t in tail) or (not own and name in _OURS):
            fns += [profiling.timed(f"[{type(cb).__name__}].{name}", getattr(cb, name))] if own else []
        else:
            fns.append(profiling.timed(f"[Callback]{cb.state_key}.{name}", getattr(cb, name) if own else _nothing))
    return fns


def profiled_module_hook(profiling: Profiling, module: Any, name: str) -> Callable[..., Any] | None:
    """Under a profiler, the module's hook ``name`` timed as ``[LightningModule]<class>.<name>``,
    also where it does not override it (a no-op, as Lightning calls it)."""
    if not isinstance(module, TrainModule) or getattr(TrainModule, name, None) is None or name in _OURS:
        return _module_hook(module, name)
    return profiling.timed(f"[LightningModule]{type(module).__name__}.{name}", _module_hook(module, name) or _nothing)


_OURS = ("on_train_log",)  # hooks Lightning does not have: recorded only where overridden


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def overrides(callback: Callback, name: str) -> bool:
    """True if ``callback`` defines hook ``name`` itself: in its class, or as an instance
    attribute (how ``LambdaCallback`` attaches plain functions)."""
    if name in getattr(callback, "__dict__", ()):
        return True
    if not issubclass(type(callback), Callback):  # a Mock(spec=Callback): each hook it has
        return hasattr(callback, name)
    base = getattr(Callback, name, None)  # None: a hook of ours, which the base class lacks
    return getattr(type(callback), name, base) is not base


def wants_hook(callback: Callback, name: str) -> bool:
    """Whether this run should call hook ``name``, one ``callback`` overrides; asked once at the
    start of each stage. A callback says False from its ``wants_hook(hook)`` (``wants`` in 0.1.0)
    for a per-batch hook with nothing to do this run, and the hook costs nothing on every batch."""
    ask = getattr(type(callback), "wants_hook", None) or getattr(type(callback), "wants", None)
    return True if ask is None else bool(ask(callback, name))


def check_callbacks(callbacks: Any) -> list[Callback]:
    if callbacks is None:
        return []
    if isinstance(callbacks, Callback):
        callbacks = [callbacks]
    if isinstance(callbacks, (str, bytes)) or not hasattr(callbacks, "__iter__"):
        raise TypeError(f"callbacks={callbacks!r:.80} must be a list of callbacks.Callback instances (or None).")
    callbacks = list(callbacks)
    instances_of("callbacks", callbacks, Callback, "callbacks.Callback", hint=_callback_fix(callbacks))
    seen: set[str] = set()
    for cb in (cb for cb in callbacks if overrides_state(cb)):
        if cb.state_key in seen:  # a checkpoint would hold the state of one of them only: Lightning's words first
            name = type(cb).__name__
            raise RuntimeError(
                f"Found more than one stateful callback of type `{name}`. In the current configuration, this callback "
                "does not support being saved alongside other instances of the same type. Please consult the "
                f"documentation of `{name}` regarding valid settings for the callback state to be checkpointable. "
                "HINT: The `callback.state_key` must be unique among all callbacks in the Trainer. "
                f"Two callbacks keep state under state_key {cb.state_key!r}: give them different arguments "
                "(e.g. another monitor), or a state_key of their own."
            )
        seen.add(cb.state_key)
    return callbacks


def _callback_fix(callbacks: list[Any]) -> str:
    """How to turn the first entry that is not a Callback into one, for the error."""
    bad = next((cb for cb in callbacks if not isinstance(cb, (Callback, type))), None)
    if bad is not None and type(bad).__module__.split(".")[0] in ("lightning", "pytorch_lightning"):
        name = type(bad).__name__
        return f" but Lightning's {name}: import ours instead, from callbacks import {name}"
    return (
        ". Subclass callbacks.Callback and override the hooks you need, then pass an instance: "
        "class MyCallback(Callback): def on_train_epoch_end(self, trainer, pl_module): ...; "
        "Trainer(callbacks=[MyCallback()])"
    )


_STEPS = ("training_step", "validation_step", "test_step", "predict_step")


def adapt_steps(model: Any) -> list[str]:
    """Let a ``*_step`` defined without ``batch_idx`` (``def training_step(self, batch)``, as
    Lightning allows) be called as the loops call every step, ``(batch, batch_idx)``: such a
    step gets an adapter on the instance, worked out once per stage (none for the usual
    signature, which costs nothing). Returns the names adapted; :func:`restore_steps` removes them.
    (``strategy="dp"`` replicas would share the adapter: that strategy needs ``batch_idx``.)"""
    adapted = []
    for name in _STEPS:
        fn = getattr(model, name, None)
        if fn is None or name in vars(model):
            continue
        try:
            params = list(inspect.signature(fn).parameters.values())
        except (TypeError, ValueError):
            continue
        if any(p.kind is p.VAR_POSITIONAL for p in params):
            continue
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(positional) >= 2:
            continue
        if not positional:
            raise TypeError(
                f"{type(model).__name__}.{name}{inspect.signature(fn)} takes no batch: define "
                f"{name}(self, batch) or {name}(self, batch, batch_idx)."
            )
        vars(model)[name] = _without_batch_idx(fn)
        adapted.append(name)
    return adapted


def _without_batch_idx(fn: Callable[[Any], Any]) -> Callable[[Any, int], Any]:
    def step(batch: Any, batch_idx: int) -> Any:
        return fn(batch)

    return step


def restore_steps(model: Any, names: list[str]) -> None:
    for name in names:
        vars(model).pop(name, None)


def overrides_state(callback: Callback) -> bool:
    return getattr(type(callback), "state_dict", None) is not Callback.state_dict


def lightning_order(callbacks: list[Callback]) -> list[Callback]:
    """Lightning's order for ``trainer.callbacks``, in which every hook runs: the tuner's
    callbacks first, the ModelCheckpoints last (they save what the others did), each group in
    the order given."""

    def group(cb: Callback) -> int:
        if isinstance(cb, (BatchSizeFinder, LearningRateFinder)):
            return 0
        return 2 if isinstance(cb, ModelCheckpoint) else 1

    return sorted(callbacks, key=group)  # a stable sort: each group keeps its order
