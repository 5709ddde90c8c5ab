"""The events around an optimizer step, written once.

Every path runs them from here: the fit loop's automatic optimization (fit.py), an optimizer
that evaluates a closure such as LBFGS (closure.py), and manual optimization's
``manual_backward`` and ``opt.step()`` (manual.py). Changing their order is an edit of
:class:`StepSequence` alone.
"""

from __future__ import annotations

import collections.abc
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch.optim import Optimizer

from trainer.loops.optimization.optim import clip

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.loops.run import Run
    from trainer.trainer import Trainer


class StepSequence:
    """One fit's optimizer steps. The order, for every path::

        loss = training_step(batch, batch_idx)       (the loop; inside the closure for LBFGS)
        backward(loss):
            zero_grad, at an accumulation group's first batch (Lightning's closure):
                on_before_zero_grad(optimizer), zero_grad (or the model's optimizer_zero_grad)
            on_before_backward(loss)
            backward(loss / accumulation group size), scaled under "16-mixed"
            on_after_backward
        step(optimizer), when the accumulation group is complete:
            before_step: unscale, on_before_optimizer_step(optimizer), clip (or the model's
                         configure_gradient_clipping)
            optimizer step (or the model's optimizer_step, with a closure that returns the
            loss), or none after skip_optimizer_step()
            count_step: global_step += 1, the per-step schedulers

    What each path takes of it:

    - automatic optimization: all of it. When nothing surrounds backward and the step (no
      hooks, scaler, clipping, skip or per-step scheduler), the loop calls backward and the
      optimizer itself, in this order: fit.py's per-batch body calls no function of its own.
    - an optimizer that evaluates a closure (LBFGS, :meth:`step_with_closure`): each
      evaluation is the training step, zero_grad, ``backward`` and ``before_step`` (the
      Trainer's clipping only); the step, with no hooks around the step and no skip.
    - manual optimization: ``manual_backward`` is ``backward`` (its backward outside
      autocast); ``opt.step()`` is :meth:`manual_step`: ``before_step`` without clipping (the
      module clips) and the step or skip; zero_grad is the module's.
    """

    def __init__(self, trainer: Trainer, run: Run, model: TrainModule, backward: Callable[[torch.Tensor], Any]) -> None:
        self.trainer, self.run, self.model = trainer, run, model
        self.backward_fn = backward  # the strategy's backward, or Tensor.backward (timed with a profiler)

    # --- around backward ------------------------------------------------------------------
    def backward(
        self, loss: torch.Tensor, group: int = 1, zero: Optimizer | None = None, backward: Callable[[torch.Tensor], Any] | None = None,
    ) -> None:
        """zero_grad(``zero``) when given (an accumulation group's first batch), on_before_backward(loss),
        backward of ``loss / group`` (scaled), on_after_backward."""
        trainer, model, run = self.trainer, self.model, self.run
        if zero is not None:
            self.zero_grad(zero)
        for fn in run.hooks.on_before_backward:
            fn(trainer, model, loss)
        scaler = run.precision.scaler
        scaled = loss / group if group > 1 else loss
        (backward or self.backward_fn)(scaled if scaler is None else scaler.scale(scaled))
        for fn in run.hooks.on_after_backward:
            fn(trainer, model)

    # --- around the optimizer step --------------------------------------------------------
    def step(self, optimizer: Optimizer, loss: torch.Tensor | None) -> None:
        """Automatic optimization's step, after the group's backward passes."""
        self.run.last_loss = loss  # what the closure given to the model's optimizer_step returns
        self.before_step(optimizer)
        self._step_or_skip(optimizer)
        self.count_step()

    def count_step(self) -> None:
        """One more optimizer step: ``global_step``, then the schedulers stepped per step (under
        automatic optimization), whose monitor must be this step's value."""
        self.trainer.state.global_step += 1
        opt = self.run.opt
        if opt.steps_at("step"):
            if opt.needs_metric_at("step"):
                self.run.publish_step_metrics()
            opt.step_schedulers("step", self.run.callback_metrics, self.trainer.state.batch_in_epoch)

    def before_step(self, optimizer: Optimizer, unscale: bool = True, clipping: str | None = "model") -> None:
        """Unscale (hooks and clipping see the true gradients), on_before_optimizer_step, clip:
        ``clipping="model"`` lets the model's configure_gradient_clipping decide, ``"trainer"``
        applies ``gradient_clip_val`` only, None clips nothing."""
        trainer, model, run = self.trainer, self.model, self.run
        if unscale:
            run.precision.unscale(optimizer)  # a no-op without a scaler
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
            stepping = _Stepping(optimizer, run.precision)
            run.opt.own["optimizer_step"](state.current_epoch, state.batch_in_epoch - 1, stepping, _closure(run))
        else:
            run.precision.step(optimizer)

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


class _Stepping:
    """The optimizer ``optimizer_step`` gets: ``step(closure=...)`` goes through the precision
    (the gradient scaler under 16-mixed); everything else is the optimizer's."""

    def __init__(self, optimizer: Optimizer, precision: Any) -> None:
        self.optimizer, self._precision = optimizer, precision

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = closure() if closure is not None else None
        self._precision.step(self.optimizer)
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)


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
