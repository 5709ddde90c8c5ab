"""The training loop: results a user can check against a loop written by hand."""

from __future__ import annotations

import math
import os

import pytest
import torch
from torch import nn

from tests._models import Classifier, loader, quiet
from trainer import Trainer


def test_accumulation_with_a_short_last_group_matches_a_hand_written_loop():
    torch.manual_seed(0)
    model = Classifier()
    by_hand = Classifier()
    by_hand.load_state_dict(model.state_dict())
    Trainer(max_epochs=1, accumulate_grad_batches=3, **quiet()).fit(model, loader(n=160, batch_size=16))
    opt = by_hand.configure_optimizers()
    batches = list(loader(n=160, batch_size=16))  # 10 batches: groups of 3, 3, 3, then 1
    for start in range(0, len(batches), 3):
        group = batches[start:start + 3]
        for x, y in group:
            (nn.functional.cross_entropy(by_hand(x), y) / len(group)).backward()  # x / 1 is exact
        opt.step()
        opt.zero_grad()
    for a, b in zip(model.state_dict().values(), by_hand.state_dict().values()):
        assert torch.equal(a, b)


class _NaNAtStep(Classifier):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * math.nan if self.trainer.global_step >= 3 else loss


def test_a_nan_loss_stops_fit_at_the_logging_cadence():
    trainer = Trainer(max_epochs=2, log_every_n_steps=2, **quiet())
    with pytest.raises(FloatingPointError, match="at step 4"):
        trainer.fit(_NaNAtStep(), loader(n=128, batch_size=16))


# --- evaluation after fit keeps the training counters --------------------------------------
def _counters(trainer: Trainer) -> tuple[int, int]:
    return trainer.global_step, trainer.current_epoch


@pytest.mark.parametrize("strategy", ["single", pytest.param("ddp", marks=pytest.mark.slow)])
@pytest.mark.usefixtures("ranks_from_the_fork_server")  # ranks fork from a warm server: see tests/conftest.py
def test_validate_test_and_predict_after_fit_keep_global_step_and_current_epoch(strategy):
    devices = 2 if strategy == "ddp" else 1
    trainer = Trainer(strategy=strategy, devices=devices, max_epochs=2, **quiet())
    model = Classifier()
    trainer.fit(model, loader(n=64, batch_size=16))
    after_fit = _counters(trainer)
    assert after_fit == (8 // devices, 2)  # 2 epochs of 4 batches, each rank taking half under ddp
    trainer.validate(model, loader(n=32))  # test() takes validate()'s path: one spawn fewer under ddp
    assert _counters(trainer) == after_fit
    trainer.predict(model, loader(n=32))
    assert _counters(trainer) == after_fit
    assert trainer.state.stage is None and trainer.state.fn == "predict" and trainer.state.finished


def test_the_step_a_callback_sees_during_validate_after_fit_is_the_last_training_step():
    from callbacks import Callback

    seen = []

    class Sees(Callback):
        def on_validation_end(self, trainer, module):
            if not trainer.sanity_checking:  # the sanity check's runs at step 0 (Lightning's)
                seen.append((trainer.state.fn, trainer.global_step))

    trainer = Trainer(max_epochs=2, callbacks=[Sees()], **quiet())
    model = Classifier()
    trainer.fit(model, loader(n=64, batch_size=16), loader(n=32))
    trainer.validate(model, loader(n=32))
    assert seen == [("fit", 4), ("fit", 8), ("validate", 8)]


def test_deterministic_is_switched_back_off_after_fit():
    assert not torch.are_deterministic_algorithms_enabled()
    Trainer(max_steps=2, deterministic=True, **quiet()).fit(Classifier(), loader())
    assert not torch.are_deterministic_algorithms_enabled()


def test_deterministic_leaves_a_callers_own_setting_as_it_was():
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        Trainer(max_steps=2, deterministic=True, **quiet()).fit(Classifier(), loader())
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


def test_deterministic_is_on_while_the_model_trains():
    class Checks(Classifier):
        def training_step(self, batch, batch_idx):
            self.saw = torch.are_deterministic_algorithms_enabled()
            return super().training_step(batch, batch_idx)

    model = Checks()
    Trainer(max_steps=1, deterministic=True, **quiet()).fit(model, loader())
    assert model.saw is True


# --- save_checkpoint where no fit's state is at hand --------------------------------------
@pytest.mark.slow
@pytest.mark.usefixtures("ranks_from_the_fork_server")  # ranks fork from a warm server: see tests/conftest.py
def test_save_checkpoint_after_a_spawned_ddp_fit_says_where_the_state_went():
    trainer = Trainer(strategy="ddp", devices=2, max_steps=2, **quiet())
    trainer.fit(Classifier(), loader())
    with pytest.raises(RuntimeError, match=r"stayed in the worker processes .* torch.save\(model.state_dict\(\), path\)"):
        trainer.save_checkpoint("after.ckpt")
    assert not os.path.exists("after.ckpt")


def test_save_checkpoint_before_any_fit_says_to_fit_first():
    # Lightning's AttributeError and sentence first; still the RuntimeError it was here.
    with pytest.raises(AttributeError, match=r"^Saving a checkpoint is only possible if a model is attached to the Trainer\. Did "
                       r"you call `Trainer\.save_checkpoint\(\)` before calling `Trainer\.\{fit,validate,test,predict\}`\? .*"
                       r"no fit has run in this process") as raised:
        Trainer(**quiet()).save_checkpoint("early.ckpt")
    assert isinstance(raised.value, RuntimeError)
    assert not os.path.exists("early.ckpt")


# --- estimated_stepping_batches ----------------------------------------------------------------
class ReadsItsLength(Classifier):
    def configure_optimizers(self):
        self.estimate = self.trainer.estimated_stepping_batches
        torch.save(self.estimate, f"estimate{self.trainer.strategy.global_rank}.pt")  # DDP workers' too
        return super().configure_optimizers()


@pytest.mark.parametrize(
    "options, expected",
    [
        (dict(max_epochs=2), 14),  # 7 batches of 16 out of 100 samples
        (dict(max_epochs=2, accumulate_grad_batches=3), 6),  # groups of 3, 3, 1: 3 steps an epoch
        (dict(max_epochs=2, accumulate_grad_batches=3, max_steps=4), 4),
        (dict(max_epochs=3, accumulate_grad_batches=3, limit_train_batches=5), 6),  # groups of 3, 2
        (dict(max_epochs=2, accumulate_grad_batches=3, strategy="ddp", devices=2), 4),  # 4 batches a rank
    ],
)
def test_estimated_stepping_batches_is_the_number_of_steps_fit_makes(options, expected):
    model = ReadsItsLength()
    trainer = Trainer(**quiet(**options))
    trainer.fit(model, loader(n=100))
    assert trainer.global_step == expected
    assert [torch.load(f"estimate{r}.pt") for r in range(trainer.world_size)] == [expected] * trainer.world_size


def test_estimated_stepping_batches_is_inf_for_an_unsized_loader_without_max_steps():
    class Endless(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(loader(n=32).dataset)

    model = ReadsItsLength()
    Trainer(max_epochs=1, **quiet()).fit(model, torch.utils.data.DataLoader(Endless(), batch_size=8))
    assert model.estimate == math.inf


def test_estimated_stepping_batches_before_fit_says_when_it_is_known():
    with pytest.raises(RuntimeError, match="configure_optimizers"):
        Trainer(max_epochs=1).estimated_stepping_batches
