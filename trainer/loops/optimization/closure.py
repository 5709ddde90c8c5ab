"""Automatic optimization with an optimizer whose ``step()`` needs a closure (``torch.optim.LBFGS``).

Such an optimizer re-evaluates the loss itself, as many times as it asks. The loop then runs
no forward or backward of its own for the batch: it calls ``optimizer.step(closure)`` once,
where each call of the closure is ``zero_grad``, ``training_step``, the backward hooks and
backward, ``on_before_optimizer_step`` and clipping, as Lightning's closure does (the order is
``StepSequence.step_with_closure``'s, in step.py). One ``optimizer.step`` is one ``global_step``.
Optimizers that take no closure never see this module: the loop's per-step path is unchanged for them.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Callable

import torch

from trainer.core.checks import loss_of

if TYPE_CHECKING:
    from trainer.loops.optimization.step import StepSequence
    from trainer.loops.run import Run
    from trainer.trainer import Trainer


def needs_closure(optimizer: torch.optim.Optimizer) -> bool:
    """LBFGS, or any optimizer whose ``step`` has a required ``closure`` argument."""
    if isinstance(optimizer, torch.optim.LBFGS):
        return True
    try:
        param = inspect.signature(optimizer.step).parameters.get("closure")
    except (TypeError, ValueError):
        return False
    return param is not None and param.default is inspect.Parameter.empty


class ClosureStep:
    """Stands where the loop's manual-optimization object does: ``wrap`` the training step,
    then ``end_batch`` counts the step and steps the per-step schedulers."""

    def __init__(self, trainer: Trainer, run: Run, steps: StepSequence) -> None:
        name = type(run.optimizer).__name__
        if run.precision.scaling:
            raise ValueError(
                f"{name} steps with a closure, which precision='16-mixed''s gradient scaler cannot do. "
                "Use precision='bf16-mixed' or '32'."
            )
        if trainer.accumulate_grad_batches != 1:
            raise ValueError(
                f"Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches!r}) with {name}, which re-evaluates "
                "the loss inside step(): there is no group of batches to accumulate. Drop accumulate_grad_batches."
            )
        self.optimizer, self.steps = run.optimizer, steps
        self.loss: torch.Tensor | None = None

    def wrap(self, runner: Callable[[Any, int], Any]) -> Callable[[Any, int], Any]:
        optimizer, steps = self.optimizer, self.steps

        def step(batch: Any, batch_idx: int) -> Any:
            outputs: list[Any] = []

            def forward() -> torch.Tensor:  # one evaluation's training step; the optimizer asks for several
                output = runner(batch, batch_idx)
                outputs.append(output)
                loss = output if isinstance(output, torch.Tensor) else loss_of(output)
                self.loss = loss.detach()
                return loss

            steps.step_with_closure(optimizer, forward)
            return outputs[-1] if outputs else None

        return step

    def end_batch(self, output: Any) -> tuple[torch.Tensor | None, bool]:
        self.steps.count_step()
        return self.loss, True


def closure_step(trainer: Trainer, run: Run, steps: StepSequence) -> ClosureStep | None:
    """A :class:`ClosureStep` if fit's one optimizer (automatic optimization) needs a closure, else None."""
    if not run.opt.automatic or run.optimizer is None or not needs_closure(run.optimizer):
        return None
    return ClosureStep(trainer, run, steps)
