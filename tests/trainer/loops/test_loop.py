"""Exact counts: epochs, steps, limits, validation cadence, accumulation, clipping, modes."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from callbacks import Callback
from tests._models import Classifier, dataset, loader, quiet
from strategies import SingleDeviceStrategy
from trainer import Trainer, TrainModule
from trainer.core.metrics import MetricSink, set_sink
from strategies.precision import Precision


class Count(Callback):
    def __init__(self) -> None:
        self.train_batches = 0
        self.val_runs = 0
        self.val_batches = 0
        self.steps_at_val: list[int] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.train_batches += 1

    def on_validation_start(self, trainer, module):
        if not trainer.sanity_checking:  # the sanity check runs these hooks too (Lightning's)
            self.val_runs += 1
            self.steps_at_val.append(trainer.global_step)

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.val_batches += 0 if trainer.sanity_checking else 1


def fit(model=None, train=None, val=None, **options) -> tuple[Trainer, Count]:
    count = Count()
    trainer = Trainer(callbacks=[count], **quiet(**options))
    trainer.fit(model or Classifier(), train or loader(128, 16), val)
    return trainer, count


@pytest.mark.parametrize(
    "options, steps, epochs",
    [
        (dict(max_epochs=2), 16, 2),
        (dict(max_steps=5), 5, 0),  # stops mid-epoch 0: no epoch completed
        (dict(max_epochs=3, max_steps=20), 20, 2),  # whichever ends first: steps
        (dict(max_epochs=1, max_steps=100), 8, 1),  # whichever ends first: epochs
        (dict(max_epochs=2, limit_train_batches=3), 6, 2),
        (dict(max_epochs=2, limit_train_batches=0.5), 8, 2),
    ],
)
def test_epoch_and_step_counts(options, steps, epochs):
    trainer, count = fit(**options)
    assert trainer.global_step == steps
    assert count.train_batches == steps
    assert trainer.current_epoch == epochs  # completed epochs


def test_max_steps_mid_epoch_stops_after_exactly_that_step():
    trainer, count = fit(max_steps=5)
    assert (trainer.global_step, count.train_batches) == (5, 5)


def test_validation_cadence_per_epoch_and_within_epoch():
    _, count = fit(max_epochs=4, check_val_every_n_epoch=2, val=loader(40, 16))
    assert count.steps_at_val == [16, 32]  # after epochs 1 and 3 (8 steps each)
    assert count.val_batches == 2 * 3
    _, count = fit(max_epochs=1, val_check_interval=3, val=loader(40, 16))
    assert count.steps_at_val == [3, 6]  # every 3 batches; the epoch's end (8) is no multiple (Lightning's)
    _, count = fit(max_epochs=1, val_check_interval=0.5, val=loader(40, 16), limit_val_batches=1)
    assert count.steps_at_val == [4, 8] and count.val_batches == 2
    _, count = fit(max_epochs=2, check_val_every_n_epoch=None, val=loader(40, 16))
    assert count.val_runs == 0
    _, count = fit(max_epochs=1, val=loader(40, 16), limit_val_batches=0)
    assert count.val_runs == 0


def test_accumulation_matches_one_big_batch():
    torch.manual_seed(0)
    base = Classifier()
    small, big = copy.deepcopy(base), copy.deepcopy(base)
    fit(small, train=loader(64, 8), max_epochs=1, accumulate_grad_batches=4)  # 8 micro-batches -> 2 steps
    trainer, _ = fit(big, train=loader(64, 32), max_epochs=1)
    assert trainer.global_step == 2
    for a, b in zip(small.parameters(), big.parameters()):
        assert torch.allclose(a, b, atol=1e-6)


def test_last_partial_accumulation_group_still_steps_as_its_own_mean():
    torch.manual_seed(0)
    base = Classifier()
    acc, ref = copy.deepcopy(base), copy.deepcopy(base)
    # 5 batches of 8 with k=2: groups of 2, 2 and a last group of 1.
    trainer, _ = fit(acc, train=loader(40, 8), max_epochs=1, accumulate_grad_batches=2)
    assert trainer.global_step == 3
    opt = ref.configure_optimizers()
    for batch_size in (16, 16, 8):  # the same samples in order, as single batches
        pass
    x, y = dataset(40).tensors
    for start, stop in ((0, 16), (16, 32), (32, 40)):
        loss = nn.functional.cross_entropy(ref(x[start:stop]), y[start:stop])
        opt.zero_grad()
        loss.backward()
        opt.step()
    for a, b in zip(acc.parameters(), ref.parameters()):
        assert torch.allclose(a, b, atol=1e-6)


@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_gradient_clipping_equals_manual_clipping(algorithm):
    torch.manual_seed(0)
    base = Classifier(lr=0.5)
    clipped, ref = copy.deepcopy(base), copy.deepcopy(base)
    trainer, _ = fit(clipped, train=loader(32, 16), max_epochs=1, gradient_clip_val=0.05, gradient_clip_algorithm=algorithm)
    opt = ref.configure_optimizers()
    for x, y in loader(32, 16):
        loss = nn.functional.cross_entropy(ref(x), y)
        opt.zero_grad()
        loss.backward()
        if algorithm == "norm":
            torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
        else:
            torch.nn.utils.clip_grad_value_(ref.parameters(), 0.05)
        opt.step()
    for a, b in zip(clipped.parameters(), ref.parameters()):
        assert torch.equal(a, b)
    assert trainer.grad_norm is not None and float(trainer.grad_norm) > 0


def test_a_gradient_clip_val_of_zero_clips_nothing_as_in_lightning():
    torch.manual_seed(0)
    base = Classifier(lr=0.5)
    zero, plain = copy.deepcopy(base), copy.deepcopy(base)
    trainer, _ = fit(zero, train=loader(32, 16), max_epochs=1, gradient_clip_val=0)
    fit(plain, train=loader(32, 16), max_epochs=1)
    assert trainer.gradient_clip_val == 0
    for a, b in zip(zero.parameters(), plain.parameters()):
        assert torch.equal(a, b)


def test_clipping_by_norm_calls_torchs_clip_grad_norm_once_fsdp_has_loaded_dtensor(monkeypatch):
    """Lightning clips with torch.nn.utils.clip_grad_norm_, which a user may wrap (to log, or to
    patch it in a test); loading DTensor (any fsdp import) must not move plain runs off it."""
    import torch.distributed.tensor  # noqa: F401  (what importing strategies.fsdp loads)

    calls: list[float] = []
    original = torch.nn.utils.clip_grad_norm_

    def recording(params, max_norm, *args, **kwargs):
        calls.append(max_norm)
        return original(params, max_norm, *args, **kwargs)

    monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", recording)
    fit(Classifier(lr=0.5), train=loader(32, 16), max_epochs=1, gradient_clip_val=10)
    assert calls == [10] * 2  # one per step: 32 samples in batches of 16


class ModeProbe(Classifier):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[bool, bool]] = []

    def validation_step(self, batch, batch_idx):
        self.seen.append((self.training, torch.is_grad_enabled()))
        return super().validation_step(batch, batch_idx)


def test_validation_runs_in_eval_mode_without_grad_and_restores_modes():
    model = ModeProbe()
    model.net[0].eval()  # a submodule the user froze in eval mode must stay so
    trainer = Trainer(**quiet(max_epochs=1))
    trainer.fit(model, loader(32, 16), loader(16, 16))
    assert model.seen == [(False, False)] * 2  # the sanity check's batch, then the epoch's validation
    assert model.training and not model.net[0].training and model.net[3].training
    model.eval()
    trainer.validate(model, loader(16, 16))
    assert not model.training


class Autocast(Classifier):
    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self(x)
        self.dtypes = getattr(self, "dtypes", set()) | {logits.dtype}
        return nn.functional.cross_entropy(logits.float(), y)


def test_bf16_mixed_runs_under_autocast_on_cpu():
    model = Autocast()
    Trainer(**quiet(max_steps=2, precision="bf16-mixed")).fit(model, loader(32, 16))
    assert model.dtypes == {torch.bfloat16}
    assert model.net[0].weight.dtype == torch.float32  # master weights stay float32


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_16_mixed_without_cuda_trains_in_bf16_mixed_as_lightning():
    with pytest.warns(UserWarning, match=r"Using `precision='bf16-mixed'` instead"):
        trainer = Trainer(**quiet(max_steps=1, precision="16-mixed", strategy="single", devices=1))
    trainer.fit(Classifier(), loader())
    assert trainer.precision == "bf16-mixed" and trainer.global_step == 1


class Schedules(Classifier):
    def __init__(self, form: str) -> None:
        super().__init__()
        self.form = form

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=1.0)
        if self.form == "tuple":
            return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        if self.form == "step":
            return dict(optimizer=opt, lr_scheduler=torch.optim.lr_scheduler.StepLR(opt, 1, 0.5), interval="step")
        return dict(optimizer=opt, lr_scheduler=torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5), monitor="val_loss")


@pytest.mark.parametrize("form, expected", [("tuple", 0.25), ("step", 0.5**8)])
def test_scheduler_steps_per_interval(form, expected):
    trainer, _ = fit(Schedules(form), train=loader(64, 16), max_epochs=2)
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(expected)


def test_plateau_scheduler_reads_the_monitored_metric():
    trainer, _ = fit(Schedules("plateau"), train=loader(64, 16), val=loader(32, 16), max_epochs=3)
    assert trainer.optimizer.param_groups[0]["lr"] <= 1.0
    assert "val_loss" in trainer.callback_metrics


class NoOptimizer(Classifier):
    def configure_optimizers(self):
        return None


def test_optimizer_factory_is_used_when_the_model_has_none():
    trainer = Trainer(**quiet(max_steps=1), optimizer=lambda params: torch.optim.Adam(params, lr=1e-3))
    trainer.fit(NoOptimizer(), loader())
    assert isinstance(trainer.optimizer, torch.optim.Adam)


def test_dict_output_with_loss_and_self_trainer():
    class DictStep(Classifier):
        def training_step(self, batch, batch_idx):
            assert self.trainer.global_step == batch_idx
            return {"loss": super().training_step(batch, batch_idx), "extra": 1}

    trainer, _ = fit(DictStep(), max_steps=3)
    assert trainer.global_step == 3


def test_epoch_means_are_weighted_by_batch_size():
    model = Classifier()
    [metrics] = Trainer(**quiet()).validate(model, DataLoader(dataset(50), batch_size=16))  # 16,16,16,2
    x, y = dataset(50).tensors
    with torch.no_grad():
        expected = nn.functional.cross_entropy(model(x), y).item()
    assert metrics["val_loss"] == pytest.approx(expected, rel=1e-6)
    assert set(metrics) == {"val_loss", "val_acc"}


def test_test_and_predict_outputs():
    model = Classifier()
    trainer = Trainer(**quiet())
    assert [set(r) for r in trainer.test(model, loader(20, 8))] == [{"test_loss"}]
    preds = trainer.predict(model, DataLoader(dataset(20).tensors[0], batch_size=8))
    assert [p.shape[0] for p in preds] == [8, 8, 4]
    with torch.no_grad():
        assert torch.equal(torch.cat(preds), model(dataset(20).tensors[0]).argmax(-1))


def test_training_metrics_and_counters_are_readable_after_fit():
    trainer, _ = fit(max_epochs=2, val=loader(32, 16), log_every_n_steps=4)
    assert {"train_loss", "val_loss", "val_acc"} <= set(trainer.callback_metrics)
    assert all(isinstance(v, torch.Tensor) and v.ndim == 0 for v in trainer.callback_metrics.values())  # Lightning's
    assert trainer.callback_metrics["val_loss"].item() == pytest.approx(trainer.callback_metrics.numbers()["val_loss"])
    assert trainer.is_global_zero and trainer.state.stage is None


class LogsEverything(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))

    def training_step(self, batch, batch_idx):
        x = batch[0]
        self.log("n", float(x.shape[0]), on_epoch=True)  # plain numbers work too; n_step and n_epoch
        return (self.w * x).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def test_training_epoch_mean_is_weighted_by_batch_size():
    trainer, _ = fit(LogsEverything(), train=DataLoader(dataset(40), batch_size=16), max_epochs=1)
    # batches of 16, 16 and 8: weighted mean of the batch sizes = (16*16+16*16+8*8)/40
    assert trainer.train_epoch_metrics["n_epoch"] == pytest.approx((256 + 256 + 64) / 40)


@pytest.mark.parametrize("source", ["list", "generator loader", "drop_last"])
def test_training_epoch_mean_weights_batches_of_any_loader_by_their_sizes(source):
    data = dataset(40)
    if source == "list":  # not a DataLoader: each batch is measured
        train = [tuple(t[i : i + 16] for t in data.tensors) for i in range(0, 40, 16)]
        sizes = [16, 16, 8]
    elif source == "generator loader":  # a batch sampler of its own: measured too
        train = DataLoader(data, batch_sampler=[list(range(0, 10)), list(range(10, 40))])
        sizes = [10, 30]
    else:
        train = DataLoader(data, batch_size=16, drop_last=True)
        sizes = [16, 16]
    trainer, _ = fit(LogsEverything(), train=train, max_epochs=1)
    assert trainer.train_epoch_metrics["n_epoch"] == pytest.approx(sum(n * n for n in sizes) / sum(sizes))


class RecordsSync(SingleDeviceStrategy):
    """Records which training batches ran inside no_backward_sync()."""

    def __init__(self) -> None:
        super().__init__("cpu")
        self.unsynced: list[int] = []  # training batches run inside no_backward_sync()
        self.unsynced_other: list[int] = []  # validation batches run inside it
        self.inside = False

    @contextlib.contextmanager
    def no_backward_sync(self):
        assert not self.inside, "entered twice"
        self.inside = True
        try:
            yield
        finally:
            self.inside = False

    def run_step(self, step_name, batch, batch_idx):
        if self.inside:
            (self.unsynced if step_name == "training_step" else self.unsynced_other).append(batch_idx)
        return super().run_step(step_name, batch, batch_idx)


def test_accumulation_skips_the_gradient_sync_on_all_micro_batches_but_each_groups_last():
    strategy = RecordsSync()
    fit(train=loader(56, batch_size=8), max_epochs=1, accumulate_grad_batches=3, strategy=strategy)
    # 7 batches: groups [0, 1, 2], [3, 4, 5] and the short [6], which syncs at once.
    assert strategy.unsynced == [0, 1, 3, 4]
    assert not strategy.inside  # left when the group's last micro-batch starts


def test_the_cpu_step_is_the_models_own_method_and_other_cases_go_through_run_step():
    model = Classifier()
    batch = next(iter(loader(8, batch_size=4)))
    plain = SingleDeviceStrategy("cpu")
    plain.precision, plain.module = Precision("32", plain.root_device), model
    assert plain.step_runner("training_step", batch) == model.training_step
    bf16 = SingleDeviceStrategy("cpu")
    bf16.precision, bf16.module = Precision("bf16-mixed", bf16.root_device), model
    runner = bf16.step_runner("training_step", batch)
    previous = set_sink(MetricSink())  # training_step logs
    try:
        assert runner != model.training_step and runner(batch, 0).dtype == torch.float32
    finally:
        set_sink(previous)
    custom = RecordsSync()
    custom.precision, custom.module = Precision("32", custom.root_device), model
    assert custom.step_runner("training_step", batch).func == custom.run_step  # its override is kept


class ReturnsShape1(Classifier):
    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx).reshape(1)


def test_a_loss_of_shape_1_trains_like_a_scalar_one():
    torch.manual_seed(0)
    scalar = Classifier()
    shaped = ReturnsShape1()
    shaped.load_state_dict(scalar.state_dict())
    fit(scalar, train=loader(32, 8), max_steps=3)
    fit(shaped, train=loader(32, 8), max_steps=3)
    assert all(torch.equal(a, b) for a, b in zip(scalar.state_dict().values(), shaped.state_dict().values()))


class BreaksBackward(Classifier):
    def training_step(self, batch, batch_idx):
        x, _ = batch
        probs = torch.sigmoid(self.net(x))  # sigmoid's backward needs its output
        loss = probs.mean()
        probs.mul_(2)  # in place on what the graph saved: backward() fails, and not because of the loss
        return loss


def test_a_backward_failure_that_is_not_about_the_loss_comes_through_unchanged():
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        fit(BreaksBackward(), train=loader(32, 8), max_steps=1)


def test_validation_in_the_middle_of_an_accumulation_group_runs_inside_it_and_syncs_after():
    strategy = RecordsSync()
    trainer, count = fit(
        train=loader(64, batch_size=8), val=loader(16, batch_size=8), max_epochs=1,
        accumulate_grad_batches=2, val_check_interval=3, limit_val_batches=1, strategy=strategy,
    )
    # Validation after batches 3 and 6 (1-based): the first inside group [2, 3], before its last micro-batch.
    assert count.val_runs == 2 and trainer.global_step == 4  # after batches 3 and 6 only (Lightning's)
    assert strategy.unsynced == [0, 2, 4, 6]
    assert strategy.unsynced_other == [0]  # the validation after batch 3 ran inside group [2, 3]
