"""EarlyStopping on one process. Identical decisions under DDP(2): tests/callbacks/test_ddp.py."""

from __future__ import annotations

import math

import pytest
import torch

from callbacks import EarlyStopping
from tests._models import Classifier, loader, quiet
from trainer import Trainer


class Scripted(Classifier):
    """Logs ``score`` = ``script[epoch]`` in validation (and ``train_score`` in training)."""

    def __init__(self, script: list[float]) -> None:
        super().__init__()
        self.script = script

    def training_step(self, batch, batch_idx):
        self.log("train_score", self.script[self.trainer.current_epoch])
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        self.log("score", self.script[self.trainer.current_epoch])


def _fit(stopper: EarlyStopping, script: list[float], val: bool = True, **options) -> Trainer:
    trainer = Trainer(**quiet(callbacks=[stopper], max_epochs=len(script), **options))
    trainer.fit(Scripted(script), loader(16, batch_size=8), loader(8, batch_size=8) if val else None)
    return trainer


def test_stops_after_patience_checks_without_improvement():
    stopper = EarlyStopping("score", patience=2)
    # Best at epoch 1; epochs 2 and 3 do not beat it: stop in epoch 3.
    trainer = _fit(stopper, [1.0, 0.8, 0.9, 0.85, 0.1, 0.1])
    assert trainer.current_epoch == 4 and trainer.global_step == 8  # 4 epochs of 2 batches
    assert trainer.state.stop_reason == "early_stopping"
    assert (stopper.stopped_epoch, stopper.best_score, stopper.wait_count) == (3, 0.8, 2)


def test_mode_max_and_min_delta_decide_what_counts_as_better():
    # Each epoch gains 0.05: better in max mode, but not by more than min_delta=0.1.
    script = [0.5, 0.55, 0.6, 0.65, 0.7, 0.75]
    assert _fit(EarlyStopping("score", mode="max", patience=2), script).current_epoch == 6
    stopper = EarlyStopping("score", mode="max", patience=2, min_delta=0.1)
    assert _fit(stopper, script).current_epoch == 3
    assert stopper.best_score == 0.5


def test_a_nan_metric_stops_at_once_unless_check_finite_is_off():
    script = [1.0, math.nan, 0.5, 0.4]
    assert _fit(EarlyStopping("score", patience=3), script).current_epoch == 2
    assert _fit(EarlyStopping("score", patience=3, check_finite=False), script).current_epoch == 4


def test_without_validation_it_checks_at_each_training_epoch_end():
    stopper = EarlyStopping("train_score", patience=1)
    trainer = _fit(stopper, [1.0, 2.0, 0.1], val=False)
    assert trainer.current_epoch == 2 and stopper.stopped_epoch == 1


def test_validation_every_other_epoch_counts_only_validated_epochs():
    # Validation runs after epochs 1, 3, 5 and 7 and sees 0.9, 0.8, 0.95, 0.9.
    stopper = EarlyStopping("score", patience=2)
    trainer = _fit(stopper, [5, 0.9, 5, 0.8, 5, 0.95, 5, 0.9, 5, 5], check_val_every_n_epoch=2)
    assert trainer.current_epoch == 8 and stopper.best_score == 0.8


@pytest.mark.parametrize("options", [dict(check_val_every_n_epoch=None), dict(limit_val_batches=0)])
def test_a_validation_loader_that_never_runs_counts_as_no_validation(options):
    # Otherwise no check would ever happen, and the stopper would do nothing, silently.
    stopper = EarlyStopping("train_score", patience=1)
    trainer = _fit(stopper, [1.0, 2.0, 0.1], **options)
    assert trainer.current_epoch == 2 and stopper.stopped_epoch == 1


def test_a_missing_metric_is_an_error_that_lists_the_logged_ones():
    with pytest.raises(ValueError) as info:
        _fit(EarlyStopping("val_los"), [1.0, 1.0])
    message = str(info.value)
    assert "EarlyStopping(monitor='val_los')" in message
    assert "['score', 'train_loss', 'train_score', 'val_acc', 'val_loss']" in message
    assert "Did you mean 'val_loss'?" in message


def test_bad_arguments_are_refused_when_built():
    with pytest.raises(ValueError, match=r"Unknown EarlyStopping\(mode\)='minimum'"):
        EarlyStopping("val_loss", mode="minimum")
    with pytest.raises(ValueError, match=r"min_delta=-0.1"):
        EarlyStopping("val_loss", min_delta=-0.1)
    with pytest.raises(TypeError, match=r"patience\)=1.5"):
        EarlyStopping("val_loss", patience=1.5)
    with pytest.raises(TypeError, match=r"monitor=None"):
        EarlyStopping(None)


def test_its_state_rides_in_checkpoints_and_a_resumed_run_keeps_its_patience():
    script = [1.0, 0.8, 0.9, 0.85, 0.1, 0.1]
    first = Trainer(**quiet(callbacks=[EarlyStopping("score", patience=2)], max_epochs=3, enable_checkpointing=True))
    first.fit(Scripted(script), loader(16, batch_size=8), loader(8, batch_size=8))
    ckpt = torch.load(first.checkpoint_callback.best_model_path, weights_only=True)
    state = ckpt["callbacks"]["EarlyStopping{'monitor': 'score', 'mode': 'min'}"]  # Lightning's key and shape
    assert state == {"wait_count": 1, "best_score": pytest.approx(0.8), "stopped_epoch": 0, "patience": 2, "stopping_reason": 0, "stopping_reason_message": None}
    assert isinstance(state["best_score"], torch.Tensor)  # Lightning's EarlyStopping compares it as one
    # Resumed at epoch 3 with one check of patience used: epoch 3 exhausts it.
    stopper = EarlyStopping("score", patience=2)
    resumed = Trainer(**quiet(callbacks=[stopper], max_epochs=6, enable_checkpointing=True))
    resumed.fit(Scripted(script), loader(16, batch_size=8), loader(16, batch_size=8), ckpt_path="last")
    assert resumed.current_epoch == 4 and stopper.stopped_epoch == 3


def test_a_second_fit_starts_with_fresh_patience():
    stopper = EarlyStopping("score", patience=1)
    trainer = _fit(stopper, [1.0, 2.0, 3.0])
    assert trainer.current_epoch == 2
    trainer.fit(Scripted([1.0, 0.5, 0.25]), loader(16, batch_size=8), loader(8, batch_size=8))
    assert trainer.current_epoch == 3 and stopper.stopped_epoch == 0 and stopper.best_score == 0.25  # Lightning's 0: not stopped


def test_validate_alone_does_not_count_as_a_check():
    stopper = EarlyStopping("score", patience=1)
    trainer = Trainer(**quiet(callbacks=[stopper]))
    model = Scripted([1.0])
    for _ in range(3):
        trainer.validate(model, loader(8, batch_size=8))
    assert stopper.wait_count == 0 and not trainer.should_stop


# --- Lightning's other options --------------------------------------------------------------
def test_stopping_threshold_stops_once_the_value_is_good_enough(trainer_log):
    trainer = _fit(EarlyStopping("score", patience=100, stopping_threshold=0.5), [1.0, 0.7, 0.4, 0.3, 0.2])
    assert trainer.current_epoch == 3  # stopped in epoch 2, the first at 0.4 < 0.5
    message = trainer.early_stopping_callback.stopping_reason_message
    assert message == "Stopping threshold reached: score = 0.4 < 0.5."
    assert any(message in line for line in trainer_log)


def test_divergence_threshold_stops_once_the_value_is_hopeless():
    trainer = _fit(EarlyStopping("score", mode="max", patience=100, divergence_threshold=0.1), [0.5, 0.6, 0.05, 0.7])
    assert trainer.current_epoch == 3
    assert trainer.early_stopping_callback.stopping_reason_message == "Divergence threshold reached: score = 0.05 < 0.1."


def test_not_finite_comes_before_the_thresholds_and_patience_has_lightnings_wording():
    stopper = EarlyStopping("score", stopping_threshold=10.0)
    _fit(stopper, [math.inf, 0.1])
    assert stopper.stopping_reason_message.startswith("Monitored metric score = inf is not finite.")
    stopper = EarlyStopping("score", patience=1)
    _fit(stopper, [1.0, 2.0, 0.1])
    assert stopper.stopping_reason_message == "Monitored metric score did not improve by more than 0.0 in the last 1 check(s). Best score: 1."


def test_strict_false_skips_checks_without_the_metric():
    stopper = EarlyStopping("missing", strict=False)
    trainer = _fit(stopper, [1.0, 1.0, 1.0, 1.0, 1.0])
    assert trainer.current_epoch == 5 and stopper.stopping_reason_message is None


def test_check_on_train_epoch_end_chooses_where_the_check_happens():
    flat = [1.0] * 6  # never improves: with patience=1 the second check stops
    # At every training epoch's end, although fit validates (every other epoch).
    trainer = _fit(EarlyStopping("train_score", patience=1, check_on_train_epoch_end=True), flat, check_val_every_n_epoch=2)
    assert trainer.current_epoch == 2
    # After validations only (epochs 1 and 3).
    trainer = _fit(EarlyStopping("train_score", patience=1, check_on_train_epoch_end=False), flat, check_val_every_n_epoch=2)
    assert trainer.current_epoch == 4


def test_verbose_logs_each_improvement(trainer_log):
    _fit(EarlyStopping("score", verbose=True), [1.0, 0.5])
    improved = [line for line in trainer_log if "improved" in line]
    assert len(improved) == 2 and "New best score: 0.5" in improved[1] and "by 0.5 >= min_delta = 0.0" in improved[1]


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(patience=-1), ValueError, r"EarlyStopping\(patience\)=-1"),
    (dict(stopping_threshold="low"), TypeError, r"EarlyStopping\(stopping_threshold='low'\) must be a number"),
    (dict(check_on_train_epoch_end="yes"), TypeError, r"check_on_train_epoch_end\)='yes' must be True or False"),
    (dict(strict=1), TypeError, r"EarlyStopping\(strict\)=1"),
])
def test_lightnings_options_are_checked(kwargs, error, message):
    with pytest.raises(error, match=message):
        EarlyStopping("score", **kwargs)


def test_two_stoppers_are_told_apart_by_state_key_in_checkpoints():
    script = [1.0, 0.8, 0.9, 0.85]
    by_score, by_train = EarlyStopping("score", patience=5), EarlyStopping("train_score", mode="max", patience=5)
    assert by_score.state_key != by_train.state_key
    first = Trainer(**quiet(callbacks=[by_score, by_train], max_epochs=3, enable_checkpointing=True))
    first.fit(Scripted(script), loader(16, batch_size=8), loader(8, batch_size=8))
    again = EarlyStopping("score", patience=5), EarlyStopping("train_score", mode="max", patience=5)
    resumed = Trainer(**quiet(callbacks=list(again), max_epochs=3, enable_checkpointing=True))
    resumed.fit(Scripted(script), loader(16, batch_size=8), loader(8, batch_size=8), ckpt_path=first.checkpoint_callback.best_model_path)
    assert again[0].state_dict() == by_score.state_dict() == {"wait_count": 1, "best_score": pytest.approx(0.8), "stopped_epoch": 0, "patience": 5, "stopping_reason": 0, "stopping_reason_message": None}
    assert again[1].state_dict() == by_train.state_dict() == {"wait_count": 2, "best_score": 1.0, "stopped_epoch": 0, "patience": 5, "stopping_reason": 0, "stopping_reason_message": None}
    assert again[0].stopped_epoch == 0  # not stopped


@pytest.mark.parametrize(
    "options, scores, reason, words",
    [
        (dict(patience=2), [1.0, 1.0, 1.0, 1.0], "PATIENCE_EXHAUSTED", "did not improve"),
        (dict(stopping_threshold=0.5), [1.0, 0.4, 0.3, 0.2], "STOPPING_THRESHOLD", "Stopping threshold reached"),
        (dict(divergence_threshold=5.0), [1.0, 6.0, 7.0, 8.0], "DIVERGENCE_THRESHOLD", "Divergence threshold reached"),
        (dict(), [1.0, float("nan"), 1.0, 1.0], "NON_FINITE_METRIC", "is not finite"),
        (dict(patience=5), [1.0, 0.9, 0.8, 0.7], "NOT_STOPPED", None),
    ],
)
def test_stopping_reason_says_why_as_lightnings_enum_and_rides_in_the_state(options, scores, reason, words):
    from callbacks import EarlyStoppingReason

    stopper = EarlyStopping("score", **options)
    _fit(stopper, scores, num_sanity_val_steps=0)
    assert stopper.stopping_reason is EarlyStoppingReason[reason]
    assert (stopper.stopping_reason_message is None) if words is None else (words in stopper.stopping_reason_message)
    assert (stopper.stopped_epoch > 0) == (words is not None)
    restored = EarlyStopping("score", **options)
    restored.load_state_dict(stopper.state_dict())
    assert (restored.stopping_reason, restored.stopping_reason_message) == (stopper.stopping_reason, stopper.stopping_reason_message)
