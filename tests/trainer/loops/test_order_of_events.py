"""Lightning's order of events, as a Lightning user's script observes it: who runs first at each
hook, what ``on_train_batch_end`` receives, when validation runs, and what a second fit does."""

from __future__ import annotations

import pytest
import torch

from callbacks import Callback, EarlyStopping, ModelCheckpoint
from tests._models import Classifier, loader, quiet
from trainer import Trainer


class Recording(Callback):
    def __init__(self, events: list[str], name: str) -> None:
        self.events, self.name = events, name

    def on_train_start(self, trainer, module):
        self.events.append(f"{self.name}.on_train_start")

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.events.append(f"{self.name}.on_train_batch_end")

    def on_train_epoch_end(self, trainer, module):
        self.events.append(f"{self.name}.on_train_epoch_end")


class RecordingCheckpoint(ModelCheckpoint):
    def __init__(self, events: list[str]) -> None:
        super().__init__(dirpath="ck", monitor="epoch_score", mode="max")
        self.events = events

    def on_train_epoch_end(self, trainer, module):
        self.events.append(f"checkpoint.on_train_epoch_end:{trainer.callback_metrics.get('epoch_score')}")
        super().on_train_epoch_end(trainer, module)


class RecordingStop(EarlyStopping):
    def on_train_epoch_end(self, trainer, module):
        self.events.append("early_stopping.on_train_epoch_end")
        super().on_train_epoch_end(trainer, module)


class Recorded(Classifier):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[str] = []

    def setup(self, stage):
        self.events.append("model.setup")

    def configure_model(self):
        self.events.append("model.configure_model")

    def on_train_start(self):
        self.events.append("model.on_train_start")

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.events.append("model.on_train_batch_end")

    def on_train_epoch_end(self):
        self.events.append("model.on_train_epoch_end")
        self.log("epoch_score", 1.0)  # the monitoring callbacks, after the model, can judge it


def test_callbacks_run_before_the_module_and_the_monitoring_ones_after_it_at_the_epoch_end():
    model = Recorded()
    events = model.events
    stop = RecordingStop(monitor="epoch_score", mode="max", patience=5)
    stop.events = events
    callbacks = [RecordingCheckpoint(events), stop, Recording(events, "mine")]
    trainer = Trainer(**quiet(callbacks=callbacks, max_epochs=1, limit_train_batches=2, enable_checkpointing=True))
    trainer.fit(model, loader(64))
    assert events == [
        "model.setup", "model.configure_model",  # configure_model after setup, as in Lightning
        "mine.on_train_start", "model.on_train_start",
        "mine.on_train_batch_end", "model.on_train_batch_end",
        "mine.on_train_batch_end", "model.on_train_batch_end",
        "mine.on_train_epoch_end", "model.on_train_epoch_end",
        "early_stopping.on_train_epoch_end", "checkpoint.on_train_epoch_end:1.0",  # ModelCheckpoints last, as Lightning orders them
    ]


def test_an_overridden_backward_is_the_one_called():
    class OwnBackward(Classifier):
        calls = 0

        def backward(self, loss, *args, **kwargs):
            type(self).calls += 1
            loss.backward(*args, **kwargs)

    model = OwnBackward()
    Trainer(**quiet(max_steps=3)).fit(model, loader(64))
    assert OwnBackward.calls == 3


def test_zero_grad_runs_after_training_step_and_before_backward():
    events: list[str] = []

    class Ordered(Classifier):
        def training_step(self, batch, batch_idx):
            events.append("training_step")
            return super().training_step(batch, batch_idx)

        def on_before_zero_grad(self, optimizer):
            events.append("on_before_zero_grad")

        def on_before_backward(self, loss):
            events.append("on_before_backward")

        def on_before_optimizer_step(self, optimizer):
            events.append("on_before_optimizer_step")

    Trainer(**quiet(max_steps=2)).fit(Ordered(), loader(64))
    assert events == ["training_step", "on_before_zero_grad", "on_before_backward", "on_before_optimizer_step"] * 2


def test_on_train_batch_end_gets_the_loss_detached_in_a_dict_with_the_other_keys():
    kept: list[dict] = []

    class WithExtra(Classifier):
        def training_step(self, batch, batch_idx):
            return {"loss": super().training_step(batch, batch_idx), "n": 3}

    class Keep(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            kept.append(outputs)  # a replay buffer: must not keep the step's graph alive

    Trainer(**quiet(max_steps=2, callbacks=[Keep()])).fit(WithExtra(), loader(64))
    assert [set(o) for o in kept] == [{"loss", "n"}] * 2
    assert all(o["loss"].grad_fn is None and not o["loss"].requires_grad and o["n"] == 3 for o in kept)


class ValidatedAt(Classifier):
    def __init__(self) -> None:
        super().__init__()
        self.at: list[int] = []

    def on_validation_start(self):
        if not self.trainer.sanity_checking:
            self.at.append(self.trainer.global_step)


def test_val_check_interval_validates_on_its_multiples_only():
    model = ValidatedAt()
    Trainer(**quiet(max_epochs=1, val_check_interval=3, num_sanity_val_steps=0)).fit(model, loader(128), loader(32))
    assert model.at == [3, 6]  # 8 batches: not again at the epoch's last one


def test_val_check_interval_counts_across_epochs_without_an_epoch_schedule():
    model = ValidatedAt()
    trainer = Trainer(**quiet(max_epochs=2, val_check_interval=5, check_val_every_n_epoch=None, num_sanity_val_steps=0))
    trainer.fit(model, loader(96), loader(32))  # 6 batches an epoch
    assert model.at == [5, 10]


def test_a_second_fit_of_a_finished_trainer_trains_nothing():
    model = Classifier()
    trainer = Trainer(**quiet(max_epochs=1))
    trainer.fit(model, loader(64))
    weights = [p.detach().clone() for p in model.parameters()]
    trainer.fit(model, loader(64))  # "you can keep calling trainer.fit(model)"
    assert trainer.global_step == 4 and trainer.current_epoch == 1
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))


def test_logged_metrics_after_fit_hold_the_last_validation_run_at_the_epochs_last_batch():
    trainer = Trainer(**quiet(max_epochs=1))
    trainer.fit(Classifier(), loader(64), loader(32))  # validates after the last batch, before the epoch's end
    assert "val_loss" in trainer.logged_metrics


def test_a_stops_own_validation_leaves_the_random_numbers_where_they_were():
    # should_stop validates (Lightning's), where an uninterrupted run would not: that validation
    # puts every generator back, so a resume from the stop draws what the uninterrupted run drew.
    # A validation on the schedule draws as a hand-written loop's does (tests/trainer/test_parity.py).
    class DrawsInValidation(Classifier):
        def validation_step(self, batch, batch_idx):
            torch.rand(3)  # e.g. a random crop
            return super().validation_step(batch, batch_idx)

    class StopAt3(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.global_step == 3:
                trainer.should_stop = True
                self.rng = torch.get_rng_state()

        def on_validation_end(self, trainer, module):
            self.validated_at = trainer.global_step

    stop = StopAt3()
    trainer = Trainer(max_epochs=2, num_sanity_val_steps=0, **quiet(callbacks=[stop]))
    trainer.fit(DrawsInValidation(), loader(64, batch_size=8), loader(16))
    assert stop.validated_at == 3 and trainer.global_step == 3  # it validated at the stop, mid-epoch
    assert torch.equal(stop.rng, torch.get_rng_state())


class LogsEveryKind(Classifier):
    """Lightning's test__training_step__log, small: each on_step/on_epoch combination."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("s", loss)  # the defaults: on_step=True, on_epoch=False
        self.log("e", loss, on_step=False, on_epoch=True)
        self.log("se", loss, on_step=True, on_epoch=True)
        return loss


def test_logged_metrics_after_fit_hold_every_name_the_loggers_were_given_under_lightnings_names():
    from loggers import CSVLogger

    trainer = Trainer(max_epochs=2, log_every_n_steps=1, logger=CSVLogger("logs"), enable_progress_bar=False,
                      enable_checkpointing=False)
    trainer.fit(LogsEveryKind(), loader(64))
    assert set(trainer.logged_metrics) == {"train_loss", "s", "e", "se_step", "se_epoch"}  # no s_epoch, no train_loss_epoch
    assert {"s", "e", "se", "se_step", "se_epoch"} <= set(trainer.callback_metrics)


def test_evaluation_calls_the_models_mode_hooks_and_puts_back_the_modes_unless_it_sets_them():
    calls = []

    class Modes(Classifier):
        def __init__(self):
            super().__init__()
            self.frozen = torch.nn.Dropout(0.5).eval()  # a user's frozen submodule stays frozen

        def on_validation_model_eval(self):
            calls.append(("eval", self.training))
            super().on_validation_model_eval()

        def on_validation_start(self):
            calls.append(("start", self.training))

        def on_test_model_train(self):
            calls.append(("test_train", self.training))
            self.train()

    model = Modes()
    trainer = Trainer(**quiet(max_epochs=1, num_sanity_val_steps=0))
    trainer.fit(model, loader(32, 16), loader(16))
    assert calls == [("eval", True), ("start", False)] and model.training and not model.frozen.training
    trainer.test(model, loader(16))
    assert calls[-1] == ("test_train", False) and model.frozen.training  # its own hook decided: all in train mode


def test_a_training_step_that_returns_none_skips_its_backward_and_still_counts_the_step():
    class Skips(Classifier):
        def training_step(self, batch, batch_idx):
            return None if batch_idx % 2 == 0 else super().training_step(batch, batch_idx)

    class Outputs(Callback):
        seen: list = []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.seen.append(sorted(outputs))

    torch.manual_seed(0)
    model = Skips(optimizer="sgd")
    expected = Classifier(optimizer="sgd")
    expected.load_state_dict(model.state_dict())
    trainer = Trainer(**quiet(max_epochs=1, callbacks=[Outputs()]))
    with pytest.warns(UserWarning, match=r"^`training_step` returned `None`. If this was on purpose"):
        trainer.fit(model, loader(64, 16))
    assert trainer.global_step == 4 and Outputs.seen == [[], ["loss"], [], ["loss"]]
    opt = torch.optim.SGD(expected.parameters(), lr=expected.lr)
    for i, (x, y) in enumerate(loader(64, 16)):  # by hand: only the odd batches train
        if i % 2:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(expected(x), y).backward()
            opt.step()
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), expected.state_dict().values()))
