"""Timer: a wall-clock budget that stops fit, per step or per epoch, and survives a resume."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch

from callbacks import Timer
from trainer import MisconfigurationException
from tests._models import Classifier, loader, quiet
from trainer import Trainer


class Slow(Classifier):
    def training_step(self, batch, batch_idx):
        time.sleep(0.02)
        return super().training_step(batch, batch_idx)


def test_the_budget_stops_fit_at_a_step_boundary():
    timer = Timer(0.3)
    trainer = Trainer(**quiet(callbacks=[timer], max_epochs=1000))
    started = time.monotonic()
    trainer.fit(Slow(), loader(64, batch_size=8))
    assert time.monotonic() - started < 30  # generous: the point is that it stopped at all
    assert trainer.state.stop_reason == "timer"
    assert 0 < trainer.global_step < 1000 * 8
    assert timer.time_elapsed() >= 0.3 and timer.time_remaining() <= 0.0  # Lightning's: negative once past it
    # The clock stopped with fit.
    elapsed = timer.time_elapsed()
    time.sleep(0.05)
    assert timer.time_elapsed() == elapsed


def test_interval_epoch_finishes_the_epoch_it_runs_out_in():
    trainer = Trainer(**quiet(callbacks=[Timer(0.1, interval="epoch")], max_epochs=1000))
    trainer.fit(Slow(), loader(64, batch_size=8))  # 8 batches of >= 20 ms: past the budget in epoch 0
    assert trainer.current_epoch == 1 and trainer.global_step == 8


def test_a_generous_budget_does_not_stop_fit():
    trainer = Trainer(**quiet(callbacks=[Timer("01:00:00:00")], max_epochs=2))
    trainer.fit(Classifier(), loader(32, batch_size=8))
    assert trainer.current_epoch == 2 and trainer.state.stop_reason is None


def test_a_resumed_run_spends_what_is_left_of_the_budget():
    first = Trainer(**quiet(callbacks=[Timer(3600)], max_epochs=2, enable_checkpointing=True))
    first.fit(Slow(), loader(32, batch_size=8))
    used = torch.load(first.checkpoint_callback.best_model_path, weights_only=True)["callbacks"]["Timer"]["time_elapsed"]["train"]
    assert used >= 8 * 0.02
    # A budget that the first run already used up: the resumed run trains no more (Lightning checks at fit's start).
    timer = Timer(used * 0.9)
    resumed = Trainer(**quiet(callbacks=[timer], max_epochs=10, enable_checkpointing=True))
    resumed.fit(Slow(), loader(32, batch_size=8), ckpt_path="last")
    assert resumed.global_step == 8 and resumed.state.stop_reason == "timer"
    assert timer.time_elapsed() >= used
    # A budget with some left: it goes on, and stops at a step boundary once spent.
    timer = Timer(used + 0.05)
    resumed = Trainer(**quiet(callbacks=[timer], max_epochs=10, enable_checkpointing=True))
    resumed.fit(Slow(), loader(32, batch_size=8), ckpt_path="last")
    assert 8 < resumed.global_step < 80 and resumed.state.stop_reason == "timer" and timer.time_elapsed() > used


@pytest.mark.parametrize(
    ("duration", "seconds"),
    [(90, 90.0), (1.5, 1.5), (timedelta(minutes=2), 120.0), ("00:01:30:00", 5400.0), ("1:00:00:05", 86405.0)],
)
def test_duration_forms(duration, seconds):
    assert Timer(duration).duration == seconds


@pytest.mark.parametrize("duration", ["1h", "00:01:30", -5, True, float("inf")])
def test_bad_durations_are_refused_with_the_accepted_forms(duration):
    with pytest.raises(MisconfigurationException, match=r"Timer\(duration="):
        Timer(duration)


def test_without_a_duration_it_measures_each_stage_and_a_zero_budget_trains_nothing():
    timer = Timer()
    assert timer.duration is None and timer.time_remaining() is None and timer.start_time() is None
    trainer = Trainer(**quiet(callbacks=[timer], max_steps=4, limit_val_batches=1))
    trainer.fit(Classifier(), loader(32, batch_size=8), loader(16, batch_size=8))
    trainer.test(Classifier(), loader(16, batch_size=8), verbose=False)
    assert trainer.global_step == 4 and timer.time_elapsed("train") >= timer.time_elapsed("validate") > 0
    assert timer.time_elapsed("test") > 0 and timer.end_time("test") >= timer.start_time("test")
    for interval in ("step", "epoch"):  # Lightning's: checked at fit's start too, so a spent budget trains nothing
        stopped = Trainer(**quiet(callbacks=[Timer(timedelta(0), interval=interval)], max_epochs=5))
        stopped.fit(Classifier(), loader(32, batch_size=8))
        assert stopped.global_step == 0 and stopped.current_epoch == 0 and stopped.state.stop_reason == "timer"
    held = Trainer(**quiet(callbacks=[Timer(timedelta(0))], max_epochs=5, min_steps=3))
    held.fit(Classifier(), loader(32, batch_size=8))
    assert held.global_step == 3  # min_steps holds the stop back


def test_the_stop_is_logged_in_lightnings_words(caplog):
    with caplog.at_level("INFO", logger="trainer"):
        Trainer(**quiet(callbacks=[Timer(timedelta(0))], max_epochs=5)).fit(Classifier(), loader(32, batch_size=8))
    assert "Time limit reached. Elapsed time is 0:00:00. Signaling Trainer to stop." in caplog.text


def test_bad_interval_is_refused():
    with pytest.raises(ValueError, match=r"Unknown Timer\(interval\)='batch'. Valid: 'step', 'epoch'"):
        Timer(10, interval="batch")
