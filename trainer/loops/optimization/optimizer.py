"""The user's optimizer as the module hands it out (Lightning's ``LightningOptimizer``).

``self.optimizers()`` returns each optimizer from ``configure_optimizers`` behind a thin
wrapper, and a model's ``optimizer_step`` hook gets it too. It is an instance of the
optimizer's own class (``isinstance(opt, torch.optim.Adam)`` holds), ``.optimizer`` is the
optimizer itself, and ``state``, ``param_groups``, ``defaults``, ``state_dict()``,
``load_state_dict()`` and ``zero_grad()`` are the optimizer's, shared both ways. Only
``step()`` differs: it runs through the Trainer's precision (the float16 gradient scaler),
and under manual optimization (manual.py) through the rest of the step's events too.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Callable

import torch

if TYPE_CHECKING:
    from trainer.loops.run import Run


@functools.cache
def _wrapper_class(wrapper: type, optimizer: type) -> type:
    # isinstance checks against the optimizer's class hold, as for Lightning's wrapper: one class per pair
    return type("Lightning" + optimizer.__name__, (wrapper, optimizer), {"__module__": wrapper.__module__})


def _rebuilt(wrapper: type, optimizer: type, state: dict[str, Any]) -> Any:
    rebuilt = object.__new__(_wrapper_class(wrapper, optimizer))
    rebuilt.__dict__.update(state)
    return rebuilt


class LightningOptimizer:
    """``optimizer`` as ``self.optimizers()`` hands it out; ``step(closure=None, **kwargs)`` calls
    ``step_fn`` (the Trainer's step while a fit runs), or, without one, the optimizer's own ``step``."""

    def __init__(self, optimizer: torch.optim.Optimizer, step_fn: Callable[..., Any] | None = None) -> None:
        if isinstance(optimizer, LightningOptimizer):  # a wrapper returned from configure_optimizers
            optimizer = optimizer.optimizer
        self._optimizer = optimizer
        self._step_fn = step_fn
        self.__class__ = _wrapper_class(type(self), type(optimizer))

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        return self._optimizer

    def __getattr__(self, name: str) -> Any:  # what the wrapper does not hold is the optimizer's
        if name in ("_optimizer", "_step_fn"):  # not set yet (copy, unpickle): no recursion
            raise AttributeError(name)
        return getattr(self._optimizer, name)

    def __repr__(self) -> str:
        return f"Lightning{self._optimizer!r}"

    def __reduce__(self) -> tuple[Any, ...]:  # pickle, deepcopy: the joined class has no importable name
        return _rebuilt, (type(self).__bases__[0], type(self._optimizer), self.__dict__)

    # Assigned through the wrapper, these stay the optimizer's own.
    state = property(lambda self: self._optimizer.state, lambda self, v: setattr(self._optimizer, "state", v))
    param_groups = property(
        lambda self: self._optimizer.param_groups, lambda self, v: setattr(self._optimizer, "param_groups", v)
    )
    defaults = property(lambda self: self._optimizer.defaults, lambda self, v: setattr(self._optimizer, "defaults", v))

    def step(self, closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        """One optimizer step: ``closure`` (which computes the loss, e.g. ``optimizer_step``'s
        ``optimizer_closure``) runs first; returns what the step returned."""
        if closure is not None and not callable(closure):
            raise TypeError(
                f"optimizer.step(closure={closure!r}): When `optimizer.step(closure)` is called, the closure should be "
                "callable. Pass a function that returns the loss, or no closure."
            )
        if self._step_fn is None:
            return self._optimizer.step(**kwargs) if closure is None else self._optimizer.step(closure, **kwargs)
        return self._step_fn(closure, **kwargs)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return self._optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._optimizer.load_state_dict(state_dict)

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self._optimizer.add_param_group(param_group)


def handed_out(run: Run) -> list[LightningOptimizer]:
    """Under automatic optimization, the run's optimizers as ``self.optimizers()`` and the
    ``optimizer_step`` hook see them: wrapped once, again only if the optimizers change."""
    wrapped = run.handed_out
    if [w.optimizer for w in wrapped] != run.optimizers:
        run.handed_out = wrapped = [LightningOptimizer(o, functools.partial(_precision_step, run, o))
                                    for o in run.optimizers]
    return wrapped


def _precision_step(
    run: Run, optimizer: torch.optim.Optimizer, closure: Callable[[], Any] | None, **kwargs: Any
) -> Any:
    """The closure (training_step and backward ran already: it returns their loss), then the step
    through the precision: the gradient scaler steps and updates under float16."""
    loss = closure() if closure is not None else None
    precision = run.precision
    if kwargs:
        precision.step_only(optimizer, **kwargs)
        precision.update()
    else:
        precision.optimizer_step(optimizer)
    return loss
