"""When ModelCheckpoint saves: after every validation wherever it runs (mid-epoch, endless
streams), by step, by time, by epoch, and the options of what it writes."""

from __future__ import annotations

import datetime
import os

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from callbacks import Callback, ModelCheckpoint
from callbacks import model_checkpoint as model_checkpoint_module
from tests._models import Classifier, loader, quiet
from trainer import Trainer
from trainer.checkpoint import files as checkpoint

# loader(64, 16): 4 batches, 4 optimizer steps an epoch.


class ScoredByStep(Classifier):
    """Logs ``val_metric = scores[global_step]`` in validation: the top-k order is known in advance."""

    def __init__(self, scores: dict[int, float], **kw) -> None:
        super().__init__(**kw)
        self.scores, self.validated_at = scores, []

    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        self.log("val_metric", self.scores.get(self.trainer.global_step, 9.0))

    def on_validation_end(self):
        if not self.trainer.sanity_checking:
            self.validated_at.append(self.trainer.global_step)


def fit(model, callbacks, train=None, **kw) -> Trainer:
    options = quiet(max_epochs=2, callbacks=callbacks, num_sanity_val_steps=0)
    options.update(kw)
    trainer = Trainer(**options)
    trainer.fit(model, loader(64) if train is None else train, loader(32))
    return trainer


def names(folder: str = "ck") -> list[str]:
    return sorted(os.listdir(folder))


def step_of(path: str) -> int:
    return checkpoint.load(path)["global_step"]


SCORES = {2: 3.0, 4: 1.0, 6: 2.0, 8: 0.5}


def file(step: int) -> str:
    return f"epoch={(step - 1) // 4}-step={step}.ckpt"


# --- after every validation ------------------------------------------------------------------
@pytest.mark.parametrize("interval", [0.5, 2], ids=["fraction", "batches"])
def test_a_monitored_checkpoint_saves_after_every_mid_epoch_validation(interval):
    cb = ModelCheckpoint(dirpath="ck", monitor="val_metric", save_top_k=-1)
    model = ScoredByStep(SCORES)
    fit(model, [cb], val_check_interval=interval)

    assert model.validated_at == [2, 4, 6, 8]
    assert names() == sorted([file(s) for s in (2, 4, 6, 8)])
    for step in (2, 4, 6, 8):  # each file holds the state its validation measured
        assert step_of(f"ck/{file(step)}") == step
    assert cb.best_model_path == os.path.abspath(f"ck/{file(8)}") and cb.best_model_score == 0.5


def test_top_k_with_several_validations_an_epoch_keeps_the_best_files_and_their_steps():
    cb = ModelCheckpoint(dirpath="ck", monitor="val_metric", save_top_k=2, save_last=True)
    fit(ScoredByStep(SCORES), [cb], val_check_interval=2)

    assert names() == sorted([file(4), file(8), "last.ckpt"])  # scores 1.0 and 0.5; 3.0 and 2.0 left
    assert cb.best_k_models == {os.path.abspath(f"ck/{file(4)}"): 1.0, os.path.abspath(f"ck/{file(8)}"): 0.5}
    assert cb.kth_best_model_path == os.path.abspath(f"ck/{file(4)}")  # the next to go
    assert cb.last_model_path == os.path.abspath("ck/last.ckpt") and step_of("ck/last.ckpt") == 8


def test_a_fixed_filename_never_overwrites_a_kept_file_of_the_same_epoch():
    cb = ModelCheckpoint(dirpath="ck", filename="{epoch}", monitor="val_metric", save_top_k=-1)
    fit(ScoredByStep(SCORES), [cb], val_check_interval=2, max_epochs=1)

    assert names() == ["epoch=0-v1.ckpt", "epoch=0.ckpt"]
    assert (step_of("ck/epoch=0.ckpt"), step_of("ck/epoch=0-v1.ckpt")) == (2, 4)


class Endless(IterableDataset):
    """A stream that never ends (no __len__)."""

    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        while True:
            yield torch.randn(8, generator=g), torch.randint(0, 2, (), generator=g)


def test_an_endless_stream_keeps_the_best_two_and_tests_the_best(trainer_log):
    scores = {20: 3.0, 40: 1.0, 60: 2.0}
    cb = ModelCheckpoint(dirpath="ck", monitor="val_metric", save_top_k=2)
    model = ScoredByStep(scores)
    trainer = Trainer(**quiet(enable_checkpointing=True, 
        max_steps=60, val_check_interval=20, check_val_every_n_epoch=None, callbacks=[cb], num_sanity_val_steps=0,
    ))
    trainer.fit(model, DataLoader(Endless(), batch_size=16), loader(32))

    assert model.validated_at == [20, 40, 60]  # once at step 60, not again when max_steps stops the run
    assert names() == ["epoch=0-step=40.ckpt", "epoch=0-step=60.ckpt"]
    best = os.path.abspath("ck/epoch=0-step=40.ckpt")
    assert cb.best_model_path == best and cb.best_model_score == 1.0

    evaluated = ScoredByStep(scores)
    trainer.test(evaluated, loader(32), ckpt_path="best")
    assert f"Evaluating {best} (step 40, epoch 0)." in trainer_log
    saved = checkpoint.load(best)["state_dict"]
    assert all(torch.equal(v, saved[k]) for k, v in evaluated.state_dict().items())


def test_without_an_epoch_end_validation_the_last_batch_validates_and_saves():
    cb = ModelCheckpoint(dirpath="ck", monitor="val_metric", save_top_k=-1)
    model = ScoredByStep(SCORES)
    fit(model, [cb], val_check_interval=2, check_val_every_n_epoch=None)  # a sized loader, counted in batches

    assert model.validated_at == [2, 4, 6, 8]
    assert names() == sorted([file(s) for s in (2, 4, 6, 8)])


# --- triggers --------------------------------------------------------------------------------
def test_every_n_epochs_saves_after_the_validation_of_every_nth_epoch():
    cb = ModelCheckpoint(dirpath="ck", every_n_epochs=2, save_top_k=-1, save_last=False)
    fit(Classifier(), [cb], max_epochs=4, val_check_interval=2)  # validations at steps 2, 4, 6, ... 16

    assert names() == ["epoch=1-step=6.ckpt", "epoch=1-step=8.ckpt", "epoch=3-step=14.ckpt", "epoch=3-step=16.ckpt"]


def test_every_n_train_steps_alone_saves_no_epoch_files():
    fit(Classifier(), [ModelCheckpoint(dirpath="ck", every_n_train_steps=3, save_top_k=-1, save_last=False)])
    assert names() == ["epoch=0-step=3.ckpt", "epoch=1-step=6.ckpt"]  # not steps 4 and 8, the epoch ends


class Clock:
    """A monotonic clock that reads 7 s per optimizer step, set by the batch-end hook below."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


class Ticks(Callback):
    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.clock.now = 7.0 * trainer.global_step


def test_train_time_interval_saves_at_the_first_step_after_it_passed(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(model_checkpoint_module, "time", clock)
    cb = ModelCheckpoint(dirpath="ck", train_time_interval=datetime.timedelta(seconds=20), save_top_k=-1, save_last=False)
    fit(Classifier(), [Ticks(clock), cb], max_epochs=3)  # 12 steps, 84 s

    # 21 s after the start (step 3), then 21 s after each save.
    assert names() == ["epoch=0-step=3.ckpt", "epoch=1-step=6.ckpt", "epoch=2-step=12.ckpt", "epoch=2-step=9.ckpt"]


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(every_n_train_steps=5, every_n_epochs=1), ["every_n_train_steps=5", "every_n_epochs=1", "at most one"]),
        (dict(every_n_epochs=2, train_time_interval=datetime.timedelta(hours=1)), ["train_time_interval", "at most one"]),
    ],
)
def test_two_triggers_are_an_error_that_says_so(kwargs, words):
    with pytest.raises(ValueError) as err:
        ModelCheckpoint(**kwargs)
    assert all(w in str(err.value) for w in words)


def test_a_zero_trigger_is_off_as_in_lightning():
    cb = ModelCheckpoint(every_n_train_steps=0, every_n_epochs=2)
    assert (cb.every_n_train_steps, cb.every_n_epochs) == (None, 2)
    with pytest.raises(TypeError, match="train_time_interval=30"):
        ModelCheckpoint(train_time_interval=30)


def test_save_on_train_epoch_end_true_saves_at_epoch_ends_only():
    cb = ModelCheckpoint(dirpath="ck", monitor="val_metric", save_top_k=-1, save_on_train_epoch_end=True)
    fit(ScoredByStep(SCORES), [cb], val_check_interval=2)
    assert names() == sorted([file(4), file(8)])


def test_save_on_train_epoch_end_false_saves_only_after_validations():
    cb = ModelCheckpoint(dirpath="ck", save_top_k=-1, save_on_train_epoch_end=False)
    trainer = Trainer(**quiet(enable_checkpointing=True, max_epochs=2, callbacks=[cb]))
    trainer.fit(Classifier(), loader(64))  # no validation loader: no validation, no ranked file
    assert names() == []


# --- what is written -------------------------------------------------------------------------
def test_save_weights_only_files_evaluate_but_do_not_resume():
    cb = ModelCheckpoint(dirpath="ck", monitor="val_metric", save_weights_only=True)
    model = ScoredByStep(SCORES)
    trainer = fit(model, [cb], val_check_interval=2)

    saved = checkpoint.load(cb.best_model_path)
    ours = saved["steadytrainer"]
    assert "optimizer_states" not in saved and "callbacks" not in saved and "rng" not in ours and ours["weights_only"] is True
    assert saved["global_step"] == 8 and saved["state_dict"].keys() == model.state_dict().keys()
    trainer.test(ScoredByStep(SCORES), loader(32), ckpt_path="best")
    with pytest.raises(ValueError, match="holds the model's weights only"):
        Trainer(**quiet(enable_checkpointing=True, max_epochs=3)).fit(ScoredByStep(SCORES), loader(64), ckpt_path=cb.best_model_path)


def test_filename_with_any_logged_key_and_without_inserted_names():
    named = ModelCheckpoint(dirpath="a", monitor="val_metric", filename="{epoch}-{step}-{val_metric:.3f}", save_last=False)
    bare = ModelCheckpoint(dirpath="b", monitor="val_metric", filename="run_{epoch:02d}_{val_metric:.2f}",
                           auto_insert_metric_name=False, save_last=False)
    for cb in (named, bare):  # one fit each: one state_key for two is Lightning's RuntimeError
        fit(ScoredByStep(SCORES), [cb], val_check_interval=2)

    assert names("a") == ["epoch=1-step=8-val_metric=0.500.ckpt"]
    assert names("b") == ["run_01_0.50.ckpt"]


def test_save_last_link_is_a_symbolic_link_to_the_newest_kept_file():
    cb = ModelCheckpoint(dirpath="ck", monitor="val_metric", save_top_k=2, save_last="link")
    fit(ScoredByStep(SCORES), [cb], val_check_interval=2)

    assert os.path.islink("ck/last.ckpt") and os.readlink("ck/last.ckpt") == file(8)
    assert names() == sorted([file(4), file(8), "last.ckpt"])


def test_save_last_link_writes_the_state_when_the_newest_save_is_not_kept():
    cb = ModelCheckpoint(dirpath="ck", monitor="val_metric", save_top_k=1, save_last="link")
    fit(ScoredByStep({2: 1.0, 4: 2.0, 6: 3.0, 8: 4.0}), [cb], val_check_interval=2)

    assert not os.path.islink("ck/last.ckpt") and step_of("ck/last.ckpt") == 8  # the newest state, a file
    assert names() == ["epoch=0-step=2.ckpt", "last.ckpt"]


# --- bad input -------------------------------------------------------------------------------
def test_a_val_check_interval_longer_than_the_epoch_is_refused_naming_both_numbers():
    with pytest.raises(ValueError) as err:
        fit(Classifier(), [], val_check_interval=10)
    message = str(err.value)
    assert "val_check_interval=10" in message and "(4 training batches" in message
    assert "check_val_every_n_epoch=None" in message


def test_a_fraction_of_an_endless_epoch_is_refused_asking_for_batches():
    trainer = Trainer(**quiet(max_steps=10, val_check_interval=0.25))
    with pytest.raises(ValueError) as err:
        trainer.fit(Classifier(), DataLoader(Endless(), batch_size=16), loader(32))
    assert "val_check_interval=0.25" in str(err.value) and "Pass a number of batches" in str(err.value)


def test_a_monitor_never_logged_fails_at_the_first_mid_epoch_validation_listing_the_logged_keys():
    trainer = Trainer(**quiet(enable_checkpointing=True, max_epochs=2, val_check_interval=2, callbacks=[ModelCheckpoint(dirpath="ck", monitor="val_los")]))
    with pytest.raises(ValueError) as err:
        trainer.fit(Classifier(), loader(64), loader(32))
    assert trainer.global_step == 2  # the first validation
    assert "monitor='val_los') was never logged" in str(err.value)
    assert "'val_acc'" in str(err.value) and "'val_loss'" in str(err.value)
    assert names() == []


class FailsAt(Classifier):
    def __init__(self, step: int) -> None:
        super().__init__()
        self.fail_at = step

    def training_step(self, batch, batch_idx):
        if self.trainer.global_step == self.fail_at:
            raise RuntimeError("Trouble!")
        return super().training_step(batch, batch_idx)


def test_save_on_exception_saves_the_state_fit_failed_in_as_lightning_does(trainer_log):
    cb = ModelCheckpoint(dirpath="ck", filename="exception", save_on_exception=True, every_n_epochs=7)
    trainer = Trainer(max_epochs=4, callbacks=[cb], **quiet(enable_checkpointing=True))
    with pytest.raises(RuntimeError, match="Trouble!"):
        trainer.fit(FailsAt(5), loader(64))
    saved = torch.load(os.path.join("ck", "exception.ckpt"), weights_only=True)
    assert saved["global_step"] == 5 and sorted(os.listdir("ck")) == ["exception.ckpt"]  # no last.ckpt: save_last unset
    assert cb.last_model_path == ""
    assert any(line.startswith("An RuntimeError was raised with message: Trouble!, saved checkpoint to") for line in trainer_log)
    # Nothing for a failure before the first step, or during the sanity check
    with pytest.raises(RuntimeError, match="Trouble!"):
        Trainer(max_epochs=1, callbacks=[ModelCheckpoint(dirpath="ck0", save_on_exception=True)], **quiet(enable_checkpointing=True)).fit(FailsAt(0), loader(64))
    assert not os.path.exists("ck0") or os.listdir("ck0") == []


def test_verbose_says_what_each_kept_file_scored(trainer_log):
    cb = ModelCheckpoint(dirpath="ck", monitor="val_metric", save_top_k=1, verbose=True)
    fit(ScoredByStep(SCORES), [cb], val_check_interval=2, max_epochs=1)
    kept = [line for line in trainer_log if line.startswith("Step ")]
    assert kept == [
        f"Step 2: val_metric=3.0, saving {os.path.abspath('ck/' + file(2))} (best 3.0).",
        f"Step 4: val_metric=1.0, saving {os.path.abspath('ck/' + file(4))} (best 1.0).",
    ]


def test_max_steps_mid_stream_validates_only_on_the_schedule():
    cb = ModelCheckpoint(dirpath="ck", monitor="val_metric", save_top_k=-1)
    model = ScoredByStep({20: 3.0, 40: 2.0, 50: 1.0})
    trainer = Trainer(**quiet(enable_checkpointing=True, 
        max_steps=50, val_check_interval=20, check_val_every_n_epoch=None, callbacks=[cb], num_sanity_val_steps=0,
    ))
    trainer.fit(model, DataLoader(Endless(), batch_size=16), loader(32))

    assert model.validated_at == [20, 40]  # Lightning's: max_steps adds no validation of its own
    assert names() == [f"epoch=0-step={s}.ckpt" for s in (20, 40)]
    # The stop's resume point, in the run's own folder: "ck" was named without save_last
    assert cb.best_model_score == 2.0 and step_of("checkpoints/last.ckpt") == 50


def test_a_save_inside_an_accumulation_group_warns_that_it_does_not_resume_exactly():
    cb = ModelCheckpoint(dirpath="ck", monitor="val_metric", save_top_k=-1)
    with pytest.warns(UserWarning, match=r"after batch 3, inside an accumulation group of accumulate_grad_batches=2"):
        fit(ScoredByStep(SCORES), [cb], val_check_interval=3, accumulate_grad_batches=2, max_epochs=1)


class Counts(Classifier):
    def __init__(self):
        super().__init__()
        self.count = 0.0

    def training_step(self, batch, batch_idx):
        self.count += 1.0
        self.log("score", self.count, on_step=True, on_epoch=False)
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("log_every_n_steps", [1, 50])
def test_a_step_checkpoint_ranks_the_value_logged_in_that_very_step(log_every_n_steps):
    ckpt = ModelCheckpoint(monitor="score", mode="max", every_n_train_steps=1, save_on_train_epoch_end=False)
    trainer = Trainer(**quiet(callbacks=[ckpt], max_epochs=2, limit_val_batches=0, log_every_n_steps=log_every_n_steps))
    trainer.fit(Counts(), loader(32, batch_size=16))  # 2 steps an epoch, 4 in all
    assert ckpt.best_model_score == 4.0 and ckpt.best_model_path.endswith("epoch=1-step=4.ckpt")
