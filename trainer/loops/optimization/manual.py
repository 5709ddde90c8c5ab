"""Manual optimization: ``automatic_optimization = False`` and the steps a ``training_step`` takes.

The Trainer then runs no backward, optimizer step or ``zero_grad`` of its own. The module calls
``self.manual_backward(loss)`` and the ``step()`` of the optimizers ``self.optimizers()`` hands
out. Those are the user's optimizers behind a thin wrapper whose ``step()`` also does what
the loop does around an automatic step:

- the gradients of that optimizer's parameters are averaged over the processes (``ddp``), once,
  right before they are first needed (``clip_gradients`` or ``step``), so a backward may reach
  any subset of the parameters, as many times as the step needs;
- the float16 gradient scaler unscales, checks for inf/nan and updates, once per batch;
- ``on_before_optimizer_step`` hooks run (in the order of ``StepSequence.manual_step``, step.py).

Every ``step()`` advances ``global_step`` by one, as in Lightning: a GAN's discriminator and
generator steps on one batch are two steps, so ``max_steps=1000`` ends it after 500 batches, and
``ModelCheckpoint(every_n_train_steps=...)`` counts the same steps. The loggers' step and
``log_every_n_steps`` count training batches instead (``TrainerState.batches_stepped``,
Lightning's ``_batches_that_stepped``), so a GAN's curves have one point per batch.
"""

from __future__ import annotations

import contextlib
import enum
import inspect
from typing import TYPE_CHECKING, Any

import torch

from trainer.core.exceptions import MisconfigurationException, misconfigured
from trainer.core.module import overridden
from trainer.loops.optimization.optim import clip
from trainer.loops.optimization.optimizer import LightningOptimizer, handed_out

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.loops.optimization.step import StepSequence
    from trainer.loops.run import Run
    from trainer.trainer import Trainer


class ManualOptimizer(LightningOptimizer):
    """What ``self.optimizers()`` returns under manual optimization: the optimizer (optimizer.py),
    with a ``step()`` that syncs gradients, runs the scaler and hooks, and counts for ``global_step``.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, manual: ManualOptimization) -> None:
        super().__init__(optimizer)
        self._manual = manual
        self._prepared = False  # gradients synced and unscaled for the step about to happen

    def prepare(self) -> None:
        """Sync (``ddp``) and unscale (float16) this optimizer's gradients, once per step."""
        if self._prepared:
            return
        manual = self._manual
        manual.trainer.strategy.sync_gradients(self.params())
        manual.before_unscale(self._optimizer)
        manual.run.precision.unscale_gradients(self._optimizer)
        self._prepared = True

    def params(self) -> list[torch.nn.Parameter]:
        return [p for group in self._optimizer.param_groups for p in group["params"]]

    def step(self, closure: Any = None, **kwargs: Any) -> Any:
        """Lightning's ``LightningOptimizer.step``: ``kwargs`` go to the optimizer's ``step``; returns its output."""
        manual = self._manual
        if closure is not None:  # e.g. LBFGS: the closure recomputes the loss, and its backward needs the sync
            if manual.run.precision.scaling:
                raise ValueError(
                    "optimizer.step(closure) with precision='16-mixed': the gradient scaler cannot step with "
                    "a closure. Use precision='bf16-mixed' or '32', or step without a closure."
                )
            result = self._optimizer.step(closure=lambda: self._closure(closure), **kwargs)
            manual.trainer.state.global_step += 1
            return result
        result = manual.sequence.manual_step(self._optimizer, self.prepare, **kwargs)
        self._prepared = False
        manual.trainer.state.global_step += 1
        return result

    def _closure(self, closure: Any) -> Any:
        def prepare() -> None:  # each evaluation's backward: synced and unscaled again
            self._prepared = False
            self.prepare()

        loss = self._manual.sequence.manual_closure(self._optimizer, prepare, closure)
        self._prepared = False
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._optimizer.zero_grad(set_to_none=set_to_none)
        self._prepared = False


class ManualOptimization:
    """The per-fit state of manual optimization, kept on the run while fit runs."""

    def __init__(
        self, trainer: Trainer, run: Run, module: TrainModule, optimizers: list[torch.optim.Optimizer],
        sequence: StepSequence,
    ) -> None:
        self.trainer, self.run, self.module, self.sequence = trainer, run, module, sequence
        self.optimizers = [ManualOptimizer(opt, self) for opt in optimizers]
        self._unscaled: set[int] = set()  # optimizers unscaled since the scaler's last update

    def before_unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """The scaler unscales (and steps) each optimizer once between updates: an optimizer that
        steps again in the same batch (a critic's five steps) first closes the previous round."""
        if id(optimizer) in self._unscaled:
            self.run.precision.update()
            self._unscaled.clear()
        self._unscaled.add(id(optimizer))

    def end_batch(self, output: Any) -> tuple[torch.Tensor | None, bool]:
        """After ``training_step``: the loss it returned (for the NaN check and the bar; None if
        it returned none), and True: every batch counts for the loggers' step, stepped or not
        (Lightning's), and ends where the loop checks ``max_steps`` and stop requests."""
        state = self.trainer.state
        state.batches_stepped = (state.batches_stepped or 0) + 1
        if self._unscaled:
            self.run.precision.update()
            self._unscaled.clear()
        for opt in self.optimizers:
            opt._prepared = False
        if isinstance(output, torch.Tensor):
            return output, True
        if isinstance(output, dict) and isinstance(output.get("loss"), torch.Tensor):
            return output["loss"], True
        return None, True


class ModuleOptimization:
    """What a module's ``optimizers()``, ``manual_backward`` and ``clip_gradients`` call: the
    call's run, handed to the module when the call starts (run.py), so that none reaches for it."""

    def __init__(self, trainer: Trainer, run: Run) -> None:
        self.trainer, self.run = trainer, run

    def optimizers(self, use_pl_optimizer: bool = True) -> list[Any]:
        """The wrapped optimizers (optimizer.py; under manual optimization their ``step()`` also syncs
        and counts), or with ``use_pl_optimizer=False`` the Trainer's own."""
        if not use_pl_optimizer:
            return self.trainer.optimizers
        manual = self.run.manual
        return handed_out(self.run) if manual is None else manual.optimizers

    def backward(self, module: TrainModule, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        manual_backward(module, self.run, loss, *args, **kwargs)

    def clip_gradients(self, module: TrainModule, optimizer: Any, value: float | None, algorithm: str | None) -> Any:
        return clip_gradients(module, self.run, optimizer, value, algorithm)


def manual_backward(module: TrainModule, run: Run, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
    """``loss.backward()`` with the float16 scaler applied, outside autocast (torch runs backward
    ops in the precision their forward used), between the backward hooks."""
    trainer = module.trainer
    if run.manual is None:
        raise RuntimeError(
            f"{type(module).__name__}.manual_backward() is for manual optimization, inside training_step: "
            "set `self.automatic_optimization = False` in __init__, or return the loss from training_step "
            "and let the Trainer run backward."
        )
    precision, own = run.precision, overridden(module, "backward")

    def backward(scaled: torch.Tensor) -> None:
        no_autocast = (
            contextlib.nullcontext() if precision.dtype is None
            else torch.autocast(precision.device_type, enabled=False)
        )
        with no_autocast:
            if own:  # the module's backward, as Lightning's strategy calls it
                module.backward(scaled, *args, **kwargs)
            elif args or kwargs:
                scaled.backward(*args, **kwargs)
            else:
                trainer.strategy.backward(scaled)

    run.manual.sequence.backward(loss, backward=backward)  # the hooks around it, and the scaler


def clip_gradients(
    module: TrainModule, run: Run, optimizer: Any, gradient_clip_val: float | None = None,
    gradient_clip_algorithm: str | None = None,
) -> torch.Tensor | None:
    """Clip ``optimizer``'s gradients by their global norm (default) or by value; returns the
    norm before clipping, also kept as ``trainer.grad_norm`` (logged only if you log it).
    Lightning's: a value or algorithm left out is the Trainer's; one given that differs from the
    Trainer's is an error (the Trainer's setting would silently lose)."""
    trainer = module.trainer
    given = trainer.gradient_clip_val
    if gradient_clip_val is None:
        gradient_clip_val = given or 0.0
    elif given is not None and given != gradient_clip_val:
        raise MisconfigurationException(
            f"You have set `Trainer(gradient_clip_val={given!r})` and have passed "
            f"`clip_gradients(gradient_clip_val={gradient_clip_val!r})`. Please use only one of them."
        )
    algorithm = trainer.gradient_clip_algorithm or "norm"
    if gradient_clip_algorithm is not None:
        given, algorithm = trainer.gradient_clip_algorithm, str(gradient_clip_algorithm.value if isinstance(
            gradient_clip_algorithm, enum.Enum) else gradient_clip_algorithm).lower()
        if given is not None and given != algorithm:
            raise MisconfigurationException(
                f"You have set `Trainer(gradient_clip_algorithm={given!r})` and have passed "
                f"`clip_gradients(gradient_clip_algorithm={algorithm!r}) Please use only one of them."
            )
    if isinstance(gradient_clip_val, bool) or not isinstance(gradient_clip_val, (int, float)):
        raise TypeError(f"`gradient_clip_val` should be an int or a float. Got {gradient_clip_val}.")
    if algorithm not in ("norm", "value"):
        raise misconfigured(
            f"clip_gradients(gradient_clip_algorithm={algorithm!r}): use 'norm' or 'value'.",
            f"`gradient_clip_algorithm` {algorithm} is invalid. Allowed algorithms: ['value', 'norm'].",
        )
    if gradient_clip_val <= 0:  # Lightning's: nothing to clip
        return None
    if isinstance(optimizer, ManualOptimizer):
        optimizer.prepare()  # the norm is of the synced, unscaled gradients
        params = optimizer.params()
    else:  # automatic optimization: the loop unscaled them already, in on_before_optimizer_step
        params = [p for group in optimizer.param_groups for p in group["params"]]
    run.grad_norm = norm = clip(params, gradient_clip_val, algorithm)
    return norm


class SeveralOptimizersError(RuntimeError, ValueError):
    """Several optimizers where Lightning takes one: its ``RuntimeError`` (a ``ValueError`` as before)."""


def check_manual(trainer: Trainer, module: TrainModule, count: int) -> None:
    """Fit's options that assume the Trainer steps the optimizer, refused under manual optimization;
    several optimizers refused under automatic optimization."""
    name = type(module).__name__
    if "optimizer_idx" in inspect.signature(module.training_step).parameters:  # Lightning 1.x's multi-optimizer step
        raise SeveralOptimizersError(
            "Training with multiple optimizers is only supported with manual optimization. Remove the `optimizer_idx` "
            "argument from `training_step`, set `self.automatic_optimization = False` and access your optimizers in "
            f"`training_step` with `opt1, opt2, ... = self.optimizers()`. ({name}.training_step takes optimizer_idx.)"
        )
    if getattr(module, "automatic_optimization", True):
        if count > 1:
            raise SeveralOptimizersError(
                "Training with multiple optimizers is only supported with manual optimization. Set "
                "`self.automatic_optimization = False`, then access your optimizers in `training_step` with "
                "`opt1, opt2, ... = self.optimizers()`. "
                f"{name}.configure_optimizers() returned {count} optimizers, and automatic optimization steps "
                "one. Set `self.automatic_optimization = False` in __init__ and step them in training_step "
                "(self.optimizers(), self.manual_backward(loss), opt.step(), opt.zero_grad()); or put every "
                "parameter in one optimizer, with param groups for different learning rates."
            )
        return
    if trainer.gradient_clip_val is not None:
        raise misconfigured(
            f"Trainer(gradient_clip_val={trainer.gradient_clip_val!r}) with manual optimization "
            f"({name}.automatic_optimization = False): the Trainer takes no optimizer step, so it cannot clip. "
            f"Call self.clip_gradients(opt, gradient_clip_val={trainer.gradient_clip_val!r}) before opt.step() "
            "in training_step, and drop Trainer(gradient_clip_val).",
            "Automatic gradient clipping is not supported for manual optimization. Remove "
            f"`Trainer(gradient_clip_val={trainer.gradient_clip_val})` or switch to automatic optimization.",
        )
    if trainer.accumulate_grad_batches != 1:
        raise misconfigured(
            f"Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches!r}) with manual optimization "
            f"({name}.automatic_optimization = False): the Trainer takes no optimizer step, so it cannot "
            "accumulate. Step every N batches in training_step (batch_idx % N == N - 1), and drop "
            "Trainer(accumulate_grad_batches).",
            "Automatic gradient accumulation is not supported for manual optimization. Remove "
            f"`Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches})` "
            "or switch to automatic optimization.",
        )
