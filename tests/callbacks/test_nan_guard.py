"""NaNGuard on one process. Under DDP(2), with the NaN on one rank only: tests/callbacks/test_ddp.py."""

from __future__ import annotations

import pytest
import torch

from callbacks import LambdaCallback, NaNGuard
from tests._models import Classifier, loader, quiet
from trainer import Trainer


class NaNAtBatch(Classifier):
    """Returns a NaN loss for the given batch indices of epoch 0."""

    def __init__(self, batches: set[int]) -> None:
        super().__init__()
        self.bad_batches = batches

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if self.trainer.current_epoch == 0 and batch_idx in self.bad_batches:
            loss = loss * float("nan")
        return loss


def _weights(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten().clone() for p in model.parameters()])


def _fit_recording(model: Classifier, guard: NaNGuard, **options) -> dict[int, torch.Tensor]:
    """Fit; return the weights after each optimizer step, by step."""
    after: dict[int, torch.Tensor] = {}
    record = LambdaCallback(on_train_batch_end=lambda trainer, module, *args: after.__setitem__(trainer.global_step, _weights(module)))
    trainer = Trainer(**quiet(callbacks=[guard, record], max_epochs=1, **options))
    trainer.fit(model, loader(64, batch_size=8))
    return after


def test_raise_names_the_step_and_leaves_the_weights_as_the_last_good_step_left_them():
    model = NaNAtBatch({2})
    after = {}
    record = LambdaCallback(on_train_batch_end=lambda trainer, module, *args: after.__setitem__(trainer.global_step, _weights(module)))
    trainer = Trainer(**quiet(callbacks=[NaNGuard(), record], max_epochs=1))
    with pytest.raises(FloatingPointError, match=r"not finite \(nan or inf\) at step 3 \(epoch 0\)\. .*NaNGuard\(action='skip'\)"):
        trainer.fit(model, loader(64, batch_size=8))
    assert trainer.global_step == 2
    assert torch.equal(_weights(model), after[2])


def test_skip_drops_only_the_bad_step_and_training_goes_on():
    guard = NaNGuard(action="skip")
    model = NaNAtBatch({2})
    # log_every_n_steps=1: the Trainer's own check reads the loss at step 3 too, and must not raise.
    after = _fit_recording(model, guard, log_every_n_steps=1)
    assert guard.skipped_steps == [3]
    assert sorted(after) == list(range(1, 9))  # the skipped step still counts as a step
    assert torch.equal(after[3], after[2])  # no update at step 3
    assert not torch.equal(after[4], after[3])  # but at the next one
    assert torch.isfinite(_weights(model)).all()


def test_with_accumulation_one_bad_micro_batch_skips_its_whole_step():
    guard = NaNGuard(action="skip")
    model = NaNAtBatch({2})  # batches 2 and 3 make step 2
    after = _fit_recording(model, guard, accumulate_grad_batches=2)
    assert guard.skipped_steps == [2]
    assert torch.equal(after[2], after[1]) and not torch.equal(after[3], after[2])
    assert torch.isfinite(_weights(model)).all()


def test_an_inf_loss_counts_too():
    class InfAt0(Classifier):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            return loss * float("inf") if batch_idx == 0 else loss

    with pytest.raises(FloatingPointError, match="at step 1 "):
        Trainer(**quiet(callbacks=[NaNGuard()], max_epochs=1)).fit(InfAt0(), loader(64, batch_size=8))


def test_a_second_fit_starts_a_fresh_record_of_skipped_steps():
    guard = NaNGuard(action="skip")
    trainer = Trainer(**quiet(callbacks=[guard], max_epochs=1))
    trainer.fit(NaNAtBatch({0, 5}), loader(64, batch_size=8))
    assert guard.skipped_steps == [1, 6]
    trainer = Trainer(**quiet(callbacks=[guard], max_epochs=1))  # the first one is done: it would train no more
    trainer.fit(NaNAtBatch({4}), loader(64, batch_size=8))
    assert guard.skipped_steps == [5]


def test_an_unknown_action_is_refused():
    with pytest.raises(ValueError, match=r"Unknown NaNGuard\(action\)='ignore'. Valid: 'raise', 'skip'"):
        NaNGuard(action="ignore")
