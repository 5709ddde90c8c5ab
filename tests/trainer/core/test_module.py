"""trainer/core/module.py: the model's own hooks, their order against the callbacks', and
self.log / self.log_dict inside them."""

from __future__ import annotations

import os

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from callbacks import Callback, ModelCheckpoint
from tests._models import Classifier, loader, quiet
from trainer import Trainer
from trainer.loops.hooks import Hooks


class Noted(Classifier):
    """Notes every hook it has, into a list shared with a callback."""

    def __init__(self, events: list) -> None:
        super().__init__()
        self.events = events

    def setup(self, stage):
        self.events.append(("model", "setup", stage))

    def on_fit_start(self):
        self.events.append(("model", "on_fit_start"))

    def on_train_epoch_start(self):
        self.events.append(("model", "on_train_epoch_start"))

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.events.append(("model", "on_train_batch_end", batch_idx))

    def on_before_optimizer_step(self, optimizer):
        self.events.append(("model", "on_before_optimizer_step"))

    def on_train_epoch_end(self):
        self.events.append(("model", "on_train_epoch_end"))

    def on_validation_epoch_end(self):
        self.events.append(("model", "on_validation_epoch_end"))

    def teardown(self, stage):
        self.events.append(("model", "teardown", stage))


class NotesToo(Callback):
    def __init__(self, events: list) -> None:
        self.events = events

    def setup(self, trainer, module, stage):
        self.events.append(("callback", "setup", stage))

    def on_fit_start(self, trainer, module):
        self.events.append(("callback", "on_fit_start"))

    def on_train_epoch_start(self, trainer, module):
        self.events.append(("callback", "on_train_epoch_start"))

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.events.append(("callback", "on_train_batch_end", batch_idx))

    def on_before_optimizer_step(self, trainer, module, optimizer):
        self.events.append(("callback", "on_before_optimizer_step"))

    def on_train_epoch_end(self, trainer, module):
        self.events.append(("callback", "on_train_epoch_end"))

    def on_validation_epoch_end(self, trainer, module):
        self.events.append(("callback", "on_validation_epoch_end"))

    def teardown(self, trainer, module, stage):
        self.events.append(("callback", "teardown", stage))


def test_the_callbacks_hooks_run_before_the_models_for_every_hook():
    events: list = []
    Trainer(max_steps=2, callbacks=[NotesToo(events)], **quiet()).fit(Noted(events), loader(n=32), loader(n=16))
    assert events == [  # Lightning's order (an ordinary callback: first at on_train_epoch_end too)
        ("callback", "setup", "fit"), ("model", "setup", "fit"),
        ("callback", "on_fit_start"), ("model", "on_fit_start"),
        ("callback", "on_validation_epoch_end"), ("model", "on_validation_epoch_end"),  # the sanity check's
        ("callback", "on_train_epoch_start"), ("model", "on_train_epoch_start"),
        ("callback", "on_before_optimizer_step"), ("model", "on_before_optimizer_step"),
        ("callback", "on_train_batch_end", 0), ("model", "on_train_batch_end", 0),
        ("callback", "on_before_optimizer_step"), ("model", "on_before_optimizer_step"),
        ("callback", "on_train_batch_end", 1), ("model", "on_train_batch_end", 1),
        ("callback", "on_validation_epoch_end"), ("model", "on_validation_epoch_end"),
        ("callback", "on_train_epoch_end"), ("model", "on_train_epoch_end"),
        ("callback", "teardown", "fit"), ("model", "teardown", "fit"),
    ]


def test_a_hook_the_model_does_not_override_is_never_called():
    hooks = Hooks([], Classifier())
    assert hooks.on_train_batch_end == [] and hooks.on_before_backward == [] and hooks.module_hooks == {}
    assert [fn.__qualname__ for fn in Hooks([], Noted([])).on_train_batch_end] == ["_module_hook.<locals>.call"]


class EpochAccuracy(Classifier):
    """Computes accuracy over the whole validation set at its end, as people port it from Lightning."""

    def on_validation_epoch_start(self):
        self.correct = self.seen = 0

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.correct += int((self(x).argmax(-1) == y).sum())
        self.seen += len(y)

    def on_validation_epoch_end(self):
        self.log("val_epoch_acc", self.correct / self.seen, prog_bar=True)

    def on_train_epoch_start(self):
        self.train_batches = 0

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.train_batches += 1

    def on_train_epoch_end(self):
        self.log_dict({"batches_seen": self.train_batches, "twice": 2 * self.train_batches})


def _scalars(run_dir: str) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(run_dir)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_values_logged_in_epoch_end_hooks_reach_callback_metrics_and_tensorboard_at_the_right_step():
    model = EpochAccuracy()
    trainer = Trainer(max_epochs=2, enable_progress_bar=False, enable_checkpointing=False)
    trainer.fit(model, loader(n=64), loader(n=32))
    x, y = loader(n=32).dataset.tensors
    with torch.no_grad():
        expected = (model(x).argmax(-1) == y).float().mean().item()
    assert trainer.callback_metrics["val_epoch_acc"] == pytest.approx(expected)
    assert trainer.callback_metrics["batches_seen"] == 4 and trainer.callback_metrics["twice"] == 8
    scalars = _scalars(trainer.run_dir)
    assert [s for s, _ in scalars["val_epoch_acc"]] == [3, 7]  # each epoch's last step's (Lightning's axis)
    assert scalars["batches_seen"] == [(3, 4.0), (7, 4.0)] and "batches_seen_epoch" not in scalars  # Lightning's name
    assert trainer.validate(model, loader(n=32)) == [{"val_epoch_acc": pytest.approx(expected)}]


class Remembers(Classifier):
    def on_save_checkpoint(self, checkpoint):
        checkpoint["vocabulary"] = ["a", "b"]

    def on_load_checkpoint(self, checkpoint):
        self.loaded = checkpoint["vocabulary"]


def test_on_save_checkpoint_adds_to_the_file_and_on_load_checkpoint_reads_it_on_resume():
    Trainer(max_epochs=1, callbacks=[ModelCheckpoint(dirpath="ck", save_last=True)], **quiet(enable_checkpointing=True)).fit(Remembers(), loader())
    path = os.path.join("ck", "last.ckpt")
    assert torch.load(path, weights_only=True)["vocabulary"] == ["a", "b"]
    model = Remembers()
    Trainer(max_epochs=2, **quiet(enable_checkpointing=True)).fit(model, loader(), ckpt_path=path)
    assert model.loaded == ["a", "b"]


class LogsRank(Classifier):
    def on_validation_epoch_end(self):
        self.log("rank_mean", float(self.trainer.strategy.global_rank))


@pytest.mark.slow
@pytest.mark.usefixtures("ranks_from_the_fork_server")  # ranks fork from a warm server: see tests/conftest.py
def test_ddp_values_logged_in_an_epoch_end_hook_are_reduced_across_ranks():
    trainer = Trainer(strategy="ddp", devices=2, max_epochs=1, **quiet())
    trainer.fit(LogsRank(), loader(n=32), loader(n=16))
    assert trainer.callback_metrics["rank_mean"] == pytest.approx(0.5)


# --- load_from_checkpoint --------------------------------------------------------------------
def test_load_from_checkpoint_rebuilds_the_model_from_its_hyperparameters_in_eval_mode():
    trained = Classifier(hidden=32, dropout=0.25)
    Trainer(max_epochs=1, callbacks=[ModelCheckpoint(dirpath="ck", save_last=True)], **quiet(enable_checkpointing=True)).fit(trained, loader())
    path = os.path.join("ck", "last.ckpt")

    model = Classifier.load_from_checkpoint(path)
    assert not model.training and model.net[0].out_features == 32 and model.net[2].p == 0.25
    for (name, a), b in zip(model.state_dict().items(), trained.state_dict().values()):
        assert torch.equal(a, b), name
    assert Classifier.load_from_checkpoint(path, dropout=0.5).net[2].p == 0.5  # an override wins
    with pytest.raises(RuntimeError, match="size mismatch"):
        Classifier.load_from_checkpoint(path, hidden=8)


class NoHyperparameters(Classifier):
    def __init__(self, hidden: int) -> None:
        super().__init__(hidden=hidden)
        self.hparams = {}  # as if save_hyperparameters() had never been called


def test_load_from_checkpoint_without_hyperparameters_says_how_to_record_or_pass_them():
    trainer = Trainer(max_steps=1, **quiet())
    trainer.fit(NoHyperparameters(hidden=4), loader())
    trainer.save_checkpoint("plain.ckpt")
    with pytest.raises(TypeError, match=r"holds no hyperparameters.*self\.save_hyperparameters\(\)"):
        NoHyperparameters.load_from_checkpoint("plain.ckpt")
    assert NoHyperparameters.load_from_checkpoint("plain.ckpt", hidden=4).net[0].out_features == 4


def test_the_trainer_is_settable_on_the_module_and_its_submodules_as_in_lightning():
    from trainer import Trainer

    class Inner(Classifier):
        pass

    outer = Classifier()
    outer.inner = Inner()
    with pytest.raises(RuntimeError, match=r"^Classifier is not attached to a `Trainer`\."):
        outer.trainer  # noqa: B018
    trainer = Trainer(max_epochs=1, enable_progress_bar=False, log_dir=None)
    outer.trainer = trainer
    assert outer.trainer is trainer and outer.inner.trainer is trainer
    outer.trainer = None
    assert outer._trainer is None and outer.inner._trainer is None


def test_the_modules_ranks_are_its_trainers_as_lightning_reads_them():
    class Ranks:  # a Trainer stand-in, as Lightning's tests attach one: only the Trainer's own properties
        global_rank, local_rank = 3, 1

    model = Classifier()
    assert (model.global_rank, model.local_rank) == (0, 0)
    model._trainer = Ranks()
    assert (model.global_rank, model.local_rank) == (3, 1)


def test_on_gpu_says_whether_the_parameters_are_on_a_cuda_device():
    model = Classifier()
    assert model.on_gpu is False
    if torch.cuda.is_available():
        assert model.cuda().on_gpu is True


def test_freeze_and_unfreeze_return_the_module_as_lightnings_do():
    model = Classifier()
    assert model.freeze() is model and not model.training and not any(p.requires_grad for p in model.parameters())
    assert model.unfreeze() is model and model.training and all(p.requires_grad for p in model.parameters())


class _Stages(Classifier):
    """Lightning's TrainerStagesModel: the strategy's wrapper (``trainer.model``) is in the stage's mode too."""

    def on_train_start(self):
        if not (self.trainer.model.training and self.training):
            raise AssertionError("trainer.model should train in fit")

    def on_validation_start(self):
        if self.trainer.model.training or self.training:
            raise AssertionError(f"{type(self.trainer.model).__name__} should be in eval mode in validation")


def test_the_evaluation_mode_hooks_put_the_strategys_wrapper_in_eval_mode_too():
    trainer = Trainer(strategy="ddp", devices=1, accelerator="cpu", max_steps=2, val_check_interval=1, **quiet())
    trainer.fit(_Stages(), loader(32), loader(32))  # a worker's AssertionError would fail the fit
    assert trainer.global_step == 2
