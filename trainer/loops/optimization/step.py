"""The events around an optimizer step, written once.

Every path runs them from here: the fit loop's automatic optimization (fit.py), an optimizer
that evaluates a closure such as LBFGS (closure.py), and manual optimization's
``manual_backward`` and ``opt.step()`` (manual.py). Changing their order is an edit of
:class:`StepSequence` alone. The gradient scaler is the precision's (strategies/precision.py):
this module asks it to scale, unscale and step, and never calls the scaler itself.
"""

from __future__ import annotations

import collections.abc
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch.optim import Optimizer

from strategies.base import Strategy

from trainer.core.module import overridden
from trainer.loops.optimization.closure import ClosureStep, closure_step
from trainer.loops.optimization.manual import ManualOptimization
from trainer.loops.optimization.optim import clip
from trainer.loops.optimization.optimizer import handed_out

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.loops.run import Run
    from trainer.trainer import Trainer


def _backward_of(trainer: Trainer, run: Run, model: TrainModule) -> Callable[[torch.Tensor], Any]:
    """The backward that fit calls: the model's own if it overrides ``backward`` (as Lightning's
    strategy calls it), else the strategy's own, else ``Tensor.backward``; timed with a profiler."""
    strategy = trainer.strategy
    own_backward = type(strategy).backward is not Strategy.backward or "backward" in vars(strategy)
    backward = strategy.backward if own_backward else torch.Tensor.backward
    if overridden(model, "backward"):
        backward = model.backward
    if run.profiling is not None:
        backward = run.profiling.strategy_call(strategy, "backward", backward)
    return backward


class StepSequence:
    """One fit's optimizer steps. The order, for every path::

        loss = training_step(batch, batch_idx)       (the loop; inside the closure for LBFGS)
        backward(loss):
            zero_grad, at an accumulation group's first batch (Lightning's closure):
                on_before_zero_grad(optimizer), zero_grad (or the model's optimizer_zero_grad)
            on_before_backward(loss)
            backward(loss / accumulation group size), scaled by the precision under "16-mixed"
            on_after_backward
        step(optimizer), when the accumulation group is complete:
            before_step: unscale, on_before_optimizer_step(optimizer), clip (or the model's
                         configure_gradient_clipping)
            optimizer step through the precision (or the model's optimizer_step, with a
            closure that returns the loss), or none after skip_optimizer_step()
            count_step: global_step += 1, the per-step schedulers (ReduceLROnPlateau: after validation)

    What each path takes of it:

    - automatic optimization: all of it, through :attr:`backward_batch` and
      :attr:`step_batch`, which the loop calls once per batch. They are picked once per fit:
      when nothing surrounds backward (no hooks, scaler or own ``optimizer_zero_grad``) or the
      step (no hooks, scaler, clipping or per-step scheduler, no own ``optimizer_step``), the
      plain implementations run the same events with nothing to skip over, so the loop pays
      for no hook lists it does not have.
    - an optimizer that evaluates a closure (LBFGS, :meth:`step_with_closure`): each
      evaluation is the training step, zero_grad, ``backward`` and ``before_step`` (the
      Trainer's clipping only); the step, with no hooks around the step and no skip.
    - manual optimization: ``manual_backward`` is ``backward`` (its backward outside
      autocast); ``opt.step()`` is :meth:`manual_step`: ``before_step`` without clipping (the
      module clips) and the step or skip; zero_grad is the module's.

    The two last take the batch's step themselves: :attr:`stepper` is the object that does
    (:attr:`manual`, or a :class:`ClosureStep`), None when the loop calls the two above.
    """

    def __init__(self, trainer: Trainer, run: Run, model: TrainModule) -> None:
        self.trainer, self.run, self.model = trainer, run, model
        self.backward_fn = _backward_of(trainer, run, model)
        opt = run.opt
        self.manual = None if opt.automatic else ManualOptimization(trainer, run, model, opt.optimizers, self)
        self.stepper: ManualOptimization | ClosureStep | None = self.manual or closure_step(trainer, run, self)
        hooks, own, precision = run.hooks, opt.own, run.precision
        plain_backward = not (
            hooks.on_before_backward or hooks.on_after_backward or hooks.on_before_zero_grad
            or precision.scaling or "optimizer_zero_grad" in own
        )
        plain_step = not (
            hooks.on_before_optimizer_step or precision.scaling or trainer.gradient_clip_val is not None
            or opt.steps_at("step") or "optimizer_step" in own or "configure_gradient_clipping" in own
        )
        #: what the loop calls for a batch's loss, and when its group is complete: chosen here, once
        self.backward_batch = self._plain_backward if plain_backward else self.backward
        self.step_batch = self._plain_step if plain_step else self.step
        #: whether this epoch's schedulers other than ReduceLROnPlateau have stepped (at its last batch)
        self.epoch_stepped = False

    # --- around backward ------------------------------------------------------------------
    def backward(
        self, loss: torch.Tensor, group: int = 1, zero: Optimizer | None = None,
        backward: Callable[[torch.Tensor], Any] | None = None,
    ) -> None:
        """zero_grad(``zero``) when given (an accumulation group's first batch), on_before_backward(loss),
        backward of ``loss / group`` (scaled), on_after_backward."""
        trainer, model, run = self.trainer, self.model, self.run
        if zero is not None:
            self.zero_grad(zero)
        for fn in run.hooks.on_before_backward:
            fn(trainer, model, loss)
        (backward or self.backward_fn)(run.precision.pre_backward(loss / group if group > 1 else loss))
        for fn in run.hooks.on_after_backward:
            fn(trainer, model)

    def _plain_backward(self, loss: torch.Tensor, group: int = 1, zero: Optimizer | None = None) -> None:
        """:meth:`backward` with no hooks, no scaler and the optimizer's own zero_grad: nothing around it."""
        if zero is not None:
            zero.zero_grad()
        self.backward_fn(loss / group if group > 1 else loss)

    # --- around the optimizer step --------------------------------------------------------
    def step(self, optimizer: Optimizer, loss: torch.Tensor | None) -> None:
        """Automatic optimization's step, after the group's backward passes."""
        self.run.last_loss = loss  # what the closure given to the model's optimizer_step returns
        self.before_step(optimizer)
        self._step_or_skip(optimizer)
        self.count_step()

    def _plain_step(self, optimizer: Optimizer, loss: torch.Tensor | None) -> None:
        """:meth:`step` with nothing around it: no scaler, hooks, clipping, own step or per-step scheduler."""
        optimizer.step()
        self.trainer.state.global_step += 1

    def count_step(self) -> None:
        """One more optimizer step: ``global_step``, then the schedulers stepped per step (under
        automatic optimization) but the ReduceLROnPlateau ones (:meth:`step_plateau_schedulers`)."""
        self.trainer.state.global_step += 1
        opt = self.run.opt
        if opt.steps_at("step"):
            opt.step_schedulers("step", self.run.callback_metrics, self.trainer.state.batch_in_epoch, plateau=False)

    def step_plateau_schedulers(self) -> None:
        """The ReduceLROnPlateau schedulers stepped per step, after the step's validation, on the
        step's values (Lightning's order: a checkpoint saved in that validation holds them unstepped)."""
        opt = self.run.opt
        if opt.automatic and opt.needs_metric_at("step"):
            self.run.publish_step_metrics()
            opt.step_schedulers("step", self.run.callback_metrics, self.trainer.state.batch_in_epoch, plateau=True)

    def step_epoch_schedulers(self, plateau: bool) -> None:
        """The schedulers stepped per epoch, in Lightning's order: the others once, at the epoch's
        last batch before on_train_batch_end (so a checkpoint saved there holds them stepped), or at
        the epoch's end if no last batch was seen (an unsized loader, on_train_batch_start's -1);
        the ReduceLROnPlateau ones after every on_train_epoch_end hook, on the epoch's values."""
        if not plateau:
            if self.epoch_stepped:
                return
            self.epoch_stepped = True
        epoch = self.trainer.state.current_epoch + 1
        self.run.opt.step_schedulers("epoch", self.run.callback_metrics, epoch, plateau=plateau)

    def before_step(self, optimizer: Optimizer, unscale: bool = True, clipping: str | None = "model") -> None:
        """Unscale (hooks and clipping see the true gradients), on_before_optimizer_step, clip:
        ``clipping="model"`` lets the model's configure_gradient_clipping decide, ``"trainer"``
        applies ``gradient_clip_val`` only, None clips nothing."""
        trainer, model, run = self.trainer, self.model, self.run
        if unscale:
            run.precision.unscale_gradients(optimizer)  # a no-op without a scaler
        for fn in run.hooks.on_before_optimizer_step:
            fn(trainer, model, optimizer)
        own = run.opt.own
        if clipping == "model" and "configure_gradient_clipping" in own:  # the model clips (self.clip_gradients) or not
            own["configure_gradient_clipping"](optimizer, trainer.gradient_clip_val, trainer.gradient_clip_algorithm)
        elif clipping is not None and trainer.gradient_clip_val:  # None or 0: no clipping
            params = [p for g in optimizer.param_groups for p in g["params"]]
            run.grad_norm = clip(params, trainer.gradient_clip_val, trainer.gradient_clip_algorithm or "norm")

    def _step_or_skip(self, optimizer: Optimizer) -> None:
        run = self.run
        run.step_skipped, run.skip_step = run.skip_step, False
        if run.step_skipped:  # skip_optimizer_step() (NaNGuard) drops this update
            run.precision.skip()
        elif "optimizer_step" in run.opt.own:  # e.g. a learning-rate warm-up around optimizer.step(closure=...)
            state = self.trainer.state
            stepping = next(w for w in handed_out(run) if w.optimizer is optimizer)  # steps through the precision
            run.opt.own["optimizer_step"](state.current_epoch, state.batch_in_epoch - 1, stepping, _closure(run))
        else:
            run.precision.optimizer_step(optimizer)

    def zero_grad(self, optimizer: Optimizer) -> None:
        """on_before_zero_grad(optimizer), then zero_grad (the model's optimizer_zero_grad if it has one)."""
        trainer, run = self.trainer, self.run
        for fn in run.hooks.on_before_zero_grad:
            fn(trainer, self.model, optimizer)
        own = run.opt.own.get("optimizer_zero_grad")
        if own is None:
            optimizer.zero_grad()
        else:
            own(trainer.state.current_epoch, trainer.state.batch_in_epoch, optimizer)  # the batch's, not yet counted

    # --- the other paths --------------------------------------------------------------------
    def step_with_closure(self, optimizer: Optimizer, forward: Callable[[], torch.Tensor]) -> None:
        """An optimizer that evaluates the loss itself (LBFGS), as often as it asks: each
        evaluation is zero_grad, ``forward`` (the training step's loss), ``backward`` and
        ``before_step``, as Lightning's closure does."""

        def closure() -> torch.Tensor:
            with torch.enable_grad():
                loss = forward()
                self.zero_grad(optimizer)
                self.backward(loss, backward=self.trainer.strategy.backward)
            self.before_step(optimizer, clipping="trainer")
            return loss

        self.run.step_skipped, self.run.skip_step = False, False
        optimizer.step(closure)

    def manual_step(self, optimizer: Optimizer, prepare: Callable[[], None], **kwargs: Any) -> Any:
        """Manual optimization's ``opt.step()``: ``prepare`` (sync the gradients under ddp,
        unscale: once per step), on_before_optimizer_step, then the step, or none after
        skip_optimizer_step(). The scale is updated once per batch (manual.py). Returns the step's output."""
        run = self.run
        prepare()
        self.before_step(optimizer, unscale=False, clipping=None)
        run.step_skipped, run.skip_step = run.skip_step, False
        return None if run.step_skipped else run.precision.step_only(optimizer, **kwargs)

    def manual_closure(self, optimizer: Optimizer, prepare: Callable[[], None], closure: Callable[[], Any]) -> Any:
        """``opt.step(closure)`` under manual optimization (e.g. LBFGS): the user's closure runs
        the step's backward; then ``prepare`` and on_before_optimizer_step, for each evaluation."""
        loss = closure()
        prepare()
        self.before_step(optimizer, unscale=False, clipping=None)
        return loss


def _closure(run: Run) -> Callable[[], Any]:
    """``optimizer_closure``: training_step and backward ran already (the loop runs them before
    the step, so hooks and accumulation see the gradients); calling it returns that loss."""

    def closure() -> Any:
        return run.last_loss

    return closure


def step_outputs(output: Any, accumulate: int = 1) -> dict[str, Any]:
    """What ``on_train_batch_end`` gets as ``outputs``, Lightning's: ``{"loss": loss}`` detached
    (under automatic optimization divided by ``accumulate_grad_batches``, as backward saw it),
    with a returned dict's other keys; ``{}`` for a step that returned nothing. A detached loss
    keeps no step's graph alive in a callback that stores it."""
    if output is None:
        return {}
    outputs = dict(output) if isinstance(output, collections.abc.Mapping) else {"loss": output}
    loss = outputs.get("loss")
    if isinstance(loss, torch.Tensor):
        outputs["loss"] = (loss / accumulate if accumulate > 1 else loss).detach()
    return outputs
