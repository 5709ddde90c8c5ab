"""The module's Lightning surface in the loops: step signatures, a validation loader without
validation_step, on_train_batch_start returning -1, the optimization overrides, the batch
transfer hooks, configure_callbacks, configure_model, properties, print and all_gather."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from callbacks import Callback, EarlyStopping
from tests._models import Classifier, loader, quiet
from trainer import Trainer, TrainModule


class NoBatchIdx(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 2)
        self.seen = []

    def training_step(self, batch):
        x, y = batch
        self.seen.append(("train", len(x)))
        return nn.functional.cross_entropy(self.layer(x), y)

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        self.seen.append(("val", batch_idx, dataloader_idx))

    def test_step(self, batch):
        self.log("n", float(len(batch[0])))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_steps_without_batch_idx_and_with_dataloader_idx():
    model = NoBatchIdx()
    trainer = Trainer(max_epochs=1, num_sanity_val_steps=0, **quiet())
    trainer.fit(model, loader(32), [loader(16), loader(16)])
    assert model.seen[:2] == [("train", 16), ("train", 16)]
    assert model.seen[2:] == [("val", 0, 0), ("val", 0, 1)]
    assert trainer.test(model, loader(16)) == [{"n": 16.0}]
    assert "training_step" not in vars(model)  # the adapter goes with the stage


class NoValidationStep(Classifier):
    validation_step = None  # as if it were never defined


def test_a_validation_loader_without_validation_step_warns_once_and_trains_on():
    model = NoValidationStep()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = Trainer(max_epochs=2, **quiet())
        trainer.fit(model, loader(32), loader(16))
    said = [w for w in caught if "but have no `validation_step`" in str(w.message)]
    assert len(said) == 1 and str(said[0].message).startswith("You passed in a `val_dataloader` but have no `validation_step`. Skipping val loop.")
    assert trainer.global_step == 4 and "val_loss" not in trainer.callback_metrics
    with pytest.warns(UserWarning, match=r"^You defined a `validation_step` but have no `val_dataloader`\. Skipping val loop\."):
        Trainer(max_steps=1, **quiet()).fit(Classifier(), loader(32))  # Lightning's other warning


class EndsEarly(Classifier):
    def on_train_batch_start(self, batch, batch_idx):
        return -1 if batch_idx == 2 else None


def test_on_train_batch_start_returning_minus_one_ends_the_epoch():
    trainer = Trainer(max_epochs=2, **quiet())
    trainer.fit(EndsEarly(), loader(128))  # 8 batches an epoch
    assert trainer.global_step == 4 and trainer.current_epoch == 2


class WarmUp(Classifier):
    """Lightning's documented learning-rate warm-up, and the other optimization overrides."""

    def __init__(self) -> None:
        super().__init__(lr=0.5)
        self.calls: list[tuple] = []

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
        loss = optimizer.step(closure=optimizer_closure)
        self.calls.append(("step", epoch, batch_idx, isinstance(loss, torch.Tensor) and loss.dim() == 0))  # the closure gave the loss
        if self.trainer.global_step < 3:
            lr_scale = min(1.0, float(self.trainer.global_step + 1) / 4.0)
            for pg in optimizer.param_groups:
                pg["lr"] = lr_scale * 0.5

    def on_before_zero_grad(self, optimizer):
        self.calls.append(("before_zero_grad",))

    def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
        self.calls.append(("zero_grad", batch_idx))
        optimizer.zero_grad(set_to_none=True)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        self.calls.append(("clip", gradient_clip_val, gradient_clip_algorithm))
        self.clip_gradients(optimizer)  # Lightning's: the Trainer's value and algorithm

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.5)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1), "interval": "step"}

    def lr_scheduler_step(self, scheduler, metric):
        self.calls.append(("sched", metric))


def test_optimizer_step_warm_up_zero_grad_clipping_and_scheduler_overrides():
    model = WarmUp()
    trainer = Trainer(max_steps=4, gradient_clip_val=0.01, **quiet())
    trainer.fit(model, loader(64))
    first = model.calls[:5]
    # Lightning's closure: zero_grad after training_step and before backward, then clip, step
    assert first == [("before_zero_grad",), ("zero_grad", 0), ("clip", 0.01, None), ("step", 0, 0, True), ("sched", None)]
    assert [c[2] for c in model.calls if c[0] == "step"] == [0, 1, 2, 3]
    # warmed up at steps 0, 1, 2 to 3/4 of 0.5; the scheduler override never stepped the StepLR
    assert trainer.optimizer.param_groups[0]["lr"] == 0.375
    assert float(trainer.grad_norm) > 0.01  # the override clipped (to the Trainer's 0.01) with self.clip_gradients


class ClipsItself(Classifier):
    def __init__(self, **clip) -> None:
        super().__init__()
        self.clip = clip

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        self.clip_gradients(optimizer, **self.clip)
        self.clipped = [p.grad.clone() for p in self.parameters()]


@pytest.mark.parametrize("trainer_clip, model_clip, message", [
    (dict(gradient_clip_val=1e-4), dict(gradient_clip_val=1e-2),
     r"^You have set `Trainer\(gradient_clip_val=0.0001\)` and have passed `clip_gradients\(gradient_clip_val=0.01\)`\. "
     "Please use only one of them"),
    (dict(gradient_clip_algorithm="norm"), dict(gradient_clip_val=0.5, gradient_clip_algorithm="value"),
     r"^You have set `Trainer\(gradient_clip_algorithm='norm'\)` and have passed `clip_gradients\(gradient_clip_algorithm='value'\)"),
])
def test_clip_gradients_with_a_value_other_than_the_trainers_is_lightnings_error(trainer_clip, model_clip, message):
    from trainer.core.exceptions import MisconfigurationException

    trainer = Trainer(max_steps=1, **trainer_clip, **quiet())
    with pytest.raises(MisconfigurationException, match=message):
        trainer.fit(ClipsItself(**model_clip), loader(16))
    assert trainer.global_step == 0


def test_clip_gradients_takes_what_it_is_not_given_from_the_trainer():
    model = ClipsItself(gradient_clip_algorithm="value")  # the Trainer's value, the module's algorithm
    trainer = Trainer(max_steps=1, gradient_clip_val=1e-3, **quiet())
    trainer.fit(model, loader(16))
    assert max(float(g.abs().max()) for g in model.clipped) == pytest.approx(1e-3)
    assert trainer.gradient_clip_algorithm is None  # Lightning's: not given, clipping is by norm


class Transfers(Classifier):
    def __init__(self) -> None:
        super().__init__()
        self.order = []

    def on_before_batch_transfer(self, batch, dataloader_idx):
        self.order.append(("before", dataloader_idx))
        return [batch[0] * 0 + 1, batch[1]]

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        self.order.append(("transfer", str(device)))
        return [t.to(device) for t in batch]

    def on_after_batch_transfer(self, batch, dataloader_idx):
        self.order.append(("after",))
        return batch

    def validation_step(self, batch, batch_idx):
        self.log("ones", batch[0].mean())


def test_batch_transfer_hooks_run_in_order_in_training_and_validation():
    model = Transfers()
    trainer = Trainer(max_steps=1, num_sanity_val_steps=0, limit_val_batches=1, **quiet())
    trainer.fit(model, loader(16), loader(16))
    assert model.order == [("before", 0), ("transfer", "cpu"), ("after",)] * 2
    assert trainer.callback_metrics["ones"] == 1.0


class Own(Callback):
    def __init__(self, tag: str) -> None:
        self.tag = tag


class WithCallbacks(Classifier):
    def __init__(self) -> None:
        super().__init__()
        self.built = 0
        self.head = None

    def configure_callbacks(self):
        return [EarlyStopping(monitor="val_loss", patience=7), Own("model")]

    def configure_model(self):
        self.built += 1
        if self.head is None:
            self.head = nn.Linear(2, 2)


def test_configure_callbacks_joins_and_replaces_and_configure_model_runs_before_wrapping():
    model = WithCallbacks()
    given = EarlyStopping(monitor="val_loss", patience=1)
    trainer = Trainer(max_epochs=1, callbacks=[given, Own("trainer")], **quiet())
    trainer.fit(model, loader(32), loader(16))
    stoppers = [cb for cb in trainer.callbacks if isinstance(cb, EarlyStopping)]
    assert len(stoppers) == 1 and stoppers[0].patience == 7
    assert [cb.tag for cb in trainer.callbacks if isinstance(cb, Own)] == ["model"]
    assert model.built == 1 and isinstance(model.head, nn.Linear)
    # built before configure_optimizers, so the optimizer holds its parameters
    assert any(p is model.head.weight for p in trainer.optimizer.param_groups[0]["params"])


class Reads(Classifier):
    def __init__(self) -> None:
        super().__init__()
        self.read = []
        self.example_input_array = torch.zeros(2, 8)

    def training_step(self, batch, batch_idx):
        self.read.append((self.current_epoch, self.global_step, self.global_rank, self.local_rank, self.dtype))
        self.print("step", self.global_step)
        gathered = self.all_gather({"x": torch.ones(3)})
        assert torch.equal(gathered["x"], torch.ones(3))  # one process: as it was
        return super().training_step(batch, batch_idx)


def test_properties_print_all_gather_freeze(capsys):
    model = Reads()
    assert (model.current_epoch, model.global_step, model.global_rank) == (0, 0, 0)  # no trainer yet
    assert model.example_input_array.shape == (2, 8)
    Trainer(max_epochs=2, **quiet()).fit(model, loader(32))
    assert model.read == [(0, 0, 0, 0, torch.float32), (0, 1, 0, 0, torch.float32), (1, 2, 0, 0, torch.float32), (1, 3, 0, 0, torch.float32)]
    assert "step 0\nstep 1\nstep 2\nstep 3\n" in capsys.readouterr().out
    model.freeze()
    assert not model.training and not any(p.requires_grad for p in model.parameters())
    model.unfreeze()
    assert model.training and all(p.requires_grad for p in model.parameters())
    model.dtype = torch.float64
    assert model.dtype == torch.float64 and model.net[0].weight.dtype == torch.float64


class Gathers(Classifier):
    def validation_step(self, batch, batch_idx):
        ranks = self.all_gather(torch.tensor(float(self.global_rank)))
        both = self.all_gather({"x": torch.full((2,), float(self.global_rank + 1)), "n": 3})
        self.log("rank_sum", ranks.sum())
        self.log("shape0", float(ranks.shape[0]))
        self.log("x_sum", both["x"].sum())
        self.log("n_sum", both["n"].sum().float())


@pytest.mark.slow
@pytest.mark.usefixtures("ranks_from_the_fork_server")  # ranks fork from a warm server: see tests/conftest.py
def test_all_gather_under_ddp_with_two_processes():
    trainer = Trainer(strategy="ddp", devices=2, max_epochs=1, num_sanity_val_steps=0, **quiet())
    trainer.fit(Gathers(), loader(32), loader(16))
    cm = trainer.callback_metrics
    assert (cm["rank_sum"], cm["shape0"], cm["x_sum"], cm["n_sum"]) == (1.0, 2.0, 6.0, 6.0)


def test_the_summary_shows_shapes_from_example_input_array():
    from trainer.core.summary import summarize

    model = Classifier(dropout=0.5)
    assert "In sizes" not in str(summarize(model))
    model.example_input_array = torch.zeros(4, 8)
    rng = torch.get_rng_state()
    lines = str(summarize(model, max_depth=2)).splitlines()
    assert [c.strip() for c in lines[0].split("|")[-2:]] == ["In sizes", "Out sizes"]
    assert [[c.strip() for c in line.split("|")[-2:]] for line in lines[2:4]] == [["[4, 8]", "[4, 2]"], ["[4, 8]", "[4, 16]"]]
    assert torch.equal(torch.get_rng_state(), rng) and model.training  # nothing a run would notice
