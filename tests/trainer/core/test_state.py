"""trainer.state as Lightning's: fn (the entry point), status (running, finished, interrupted) and
stage (what runs inside the entry point), with the enums comparing equal to their strings."""

from __future__ import annotations

import pytest

from callbacks import Callback
from tests._models import Classifier, loader, quiet
from trainer import RunningStage, Trainer, TrainerFn, TrainerState, TrainerStatus


def test_a_new_trainer_is_initializing_with_no_fn_or_stage():
    trainer = Trainer(max_epochs=1, **quiet())
    assert trainer.state == TrainerState(status=TrainerStatus.INITIALIZING, fn=None, stage=None)
    assert not trainer.state.finished and not trainer.state.stopped and not trainer.interrupted


def test_the_enums_equal_their_values_in_any_case_and_hash_alike():
    assert TrainerFn.FITTING == "fit" and TrainerFn.FITTING == "FIT" and TrainerFn.FITTING != "test"
    assert RunningStage.VALIDATING == "validate" and RunningStage.SANITY_CHECKING.evaluating
    assert not RunningStage.TRAINING.evaluating and RunningStage.SANITY_CHECKING.dataloader_prefix == "val"
    assert RunningStage.TESTING.dataloader_prefix == "test" and str(TrainerFn.PREDICTING) == "predict"
    assert {TrainerFn.FITTING: 1}["fit"] == 1 and TrainerStatus.FINISHED.stopped


class SeesState(Callback):
    def __init__(self) -> None:
        self.seen: list[tuple] = []

    def _note(self, hook: str, trainer) -> None:
        s = trainer.state
        flags = (trainer.training, trainer.sanity_checking, trainer.validating, trainer.testing, trainer.predicting)
        self.seen.append((hook, s.fn, s.status, s.stage, flags))

    def setup(self, trainer, module, stage):
        self._note("setup", trainer)

    def on_sanity_check_start(self, trainer, module):
        self._note("sanity", trainer)

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self._note("train_batch", trainer)

    def on_validation_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0):
        self._note("val_batch", trainer)

    def on_test_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0):
        self._note("test_batch", trainer)

    def on_predict_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0):
        self._note("predict_batch", trainer)


def test_fn_status_and_stage_during_and_after_each_entry_point():
    seen = SeesState()
    trainer = Trainer(max_steps=1, limit_val_batches=1, num_sanity_val_steps=1, callbacks=[seen], **quiet())
    model = Classifier()
    trainer.fit(model, loader(n=16), loader(n=16))
    assert trainer.state.finished and trainer.state.fn == TrainerFn.FITTING and trainer.state.stage is None
    running = TrainerStatus.RUNNING
    assert seen.seen[:4] == [
        ("setup", "fit", running, RunningStage.TRAINING, (True, False, False, False, False)),
        ("sanity", "fit", running, RunningStage.SANITY_CHECKING, (False, True, False, False, False)),
        # the sanity check's batch: the validation hooks run, with sanity_checking True (Lightning's)
        ("val_batch", "fit", running, RunningStage.SANITY_CHECKING, (False, True, False, False, False)),
        ("train_batch", "fit", running, RunningStage.TRAINING, (True, False, False, False, False)),
    ]
    assert seen.seen[4] == ("val_batch", "fit", running, RunningStage.VALIDATING, (False, False, True, False, False))
    for entry, hook, flags in (
        (trainer.validate, "val_batch", (False, False, True, False, False)),
        (trainer.test, "test_batch", (False, False, False, True, False)),
        (trainer.predict, "predict_batch", (False, False, False, False, True)),
    ):
        seen.seen.clear()
        entry(model, loader(n=16), verbose=False) if entry != trainer.predict else entry(model, loader(n=16))
        fn = TrainerFn(entry.__name__)
        assert seen.seen[-1] == (hook, fn, running, RunningStage(fn.value), flags)
        assert trainer.state.fn is fn and trainer.state.finished and trainer.state.stage is None


def test_an_exception_leaves_the_state_interrupted_before_on_exception_runs():
    statuses = []

    class Fails(Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            raise RuntimeError("boom")

        def on_exception(self, trainer, module, err):
            statuses.append(trainer.state.status)

    trainer = Trainer(max_steps=2, callbacks=[Fails()], **quiet())
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Classifier(), loader(n=16))
    assert statuses == [TrainerStatus.INTERRUPTED]
    assert trainer.interrupted and trainer.state.stopped and not trainer.state.finished and trainer.state.stage is None


def test_the_stage_setters_are_lightnings():
    trainer = Trainer(max_epochs=1, **quiet())
    trainer.training = True
    assert trainer.state.stage is RunningStage.TRAINING and trainer.training
    trainer.validating = False  # clears only its own stage
    assert trainer.training
    trainer.training = False
    assert trainer.state.stage is None
    trainer.sanity_checking = True
    assert trainer.evaluating and trainer.sanity_checking and not trainer.validating


def test_a_keyboard_interrupt_runs_on_exception_and_exits_1_as_lightnings_does(trainer_log):
    seen = []

    class CtrlC(Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            raise KeyboardInterrupt

        def on_exception(self, trainer, module, err):
            seen.append(type(err))

    trainer = Trainer(max_steps=2, callbacks=[CtrlC()], **quiet())
    with pytest.raises(SystemExit) as stop:
        trainer.fit(Classifier(), loader(n=16))
    assert stop.value.code == 1 and seen == [KeyboardInterrupt] and trainer.interrupted
    assert "Detected KeyboardInterrupt, attempting graceful shutdown ..." in trainer_log
