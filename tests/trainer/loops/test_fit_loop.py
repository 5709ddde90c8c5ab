"""trainer/loops/fit.py: the order of an optimizer step, unsized loaders, and fit run twice."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset

from callbacks import Callback
from strategies.precision import Precision
from tests._models import Classifier, TinyGAN, dataset, gan_loader, loader, quiet
from tests.conftest import requires_cuda
from trainer import Trainer


class Batches(IterableDataset):
    """An unsized dataset: 10 batches of 16, the same ones every epoch."""

    def __init__(self) -> None:
        x, y = dataset(160).tensors
        self.batches = list(zip(x.split(16), y.split(16)))

    def __iter__(self):
        return iter(self.batches)


def test_an_unsized_loader_steps_its_last_short_accumulation_group_at_the_epochs_end():
    torch.manual_seed(0)
    model, by_hand = Classifier(), Classifier()
    by_hand.load_state_dict(model.state_dict())
    Trainer(max_epochs=2, accumulate_grad_batches=3, **quiet()).fit(model, DataLoader(Batches(), batch_size=None))

    opt = by_hand.configure_optimizers()
    for _ in range(2):  # groups of 3, 3, 3, then 1, which steps at the epoch's end: nothing leaks on
        for i, (x, y) in enumerate(Batches()):
            (nn.functional.cross_entropy(by_hand(x), y) / 3).backward()
            if (i + 1) % 3 == 0:
                opt.step()
                opt.zero_grad()
        opt.step()
        opt.zero_grad()
    for a, b in zip(model.state_dict().values(), by_hand.state_dict().values()):
        assert torch.equal(a, b)


class GradNorms(Callback):
    """The gradients' total norm as ``on_before_optimizer_step`` sees it, into ``seen``."""

    def __init__(self, seen: list[float]) -> None:
        self.seen = seen

    def on_before_optimizer_step(self, trainer, module, optimizer):
        grads = [p.grad for g in optimizer.param_groups for p in g["params"]]
        self.seen.append(torch.nn.utils.get_total_norm(grads).item())


def test_on_before_optimizer_step_sees_the_gradients_before_clipping():
    seen = []

    class Clipped(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            seen.append(trainer.grad_norm.item())

    trainer = Trainer(max_steps=1, gradient_clip_val=1e-3, callbacks=[GradNorms(seen), Clipped()], **quiet())
    trainer.fit(Classifier(), loader())
    hook, before_clipping = seen
    assert hook == pytest.approx(before_clipping, rel=1e-6) and hook > 1e-3


def test_a_second_fit_starts_with_no_metrics_from_the_first():
    trainer = Trainer(max_epochs=1, **quiet())
    model = Classifier()
    trainer.fit(model, loader(), loader(32))
    assert "val_loss" in trainer.callback_metrics and trainer.global_step == 8
    weights = [p.detach().clone() for p in model.parameters()]
    trainer.fit(model, loader(64))  # max_epochs reached already: Lightning's second fit trains nothing
    assert trainer.global_step == 8 and trainer.current_epoch == 1
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))
    trainer.max_epochs = 2  # one more epoch, as Lightning's fit_loop.max_epochs
    trainer.fit(model, loader(64))
    assert "val_loss" not in trainer.callback_metrics  # no validation ran in this fit
    assert set(trainer.callback_metrics) == {"train_loss"}
    assert trainer.global_step == 12 and trainer.current_epoch == 2


# --- under DDP, the step values that monitors read agree across ranks ----------------------
class PlateauPerStep(Classifier):
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.5)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)
        return {"optimizer": opt, "lr_scheduler": plateau, "interval": "step", "monitor": "train_loss"}


class Records(Callback):
    """Each rank writes what its monitors saw, and its learning rate, into the run's folder."""

    def on_train_end(self, trainer, module):
        torch.save(
            {"train_loss": trainer.callback_metrics["train_loss"], "lr": trainer.optimizer.param_groups[0]["lr"]},
            f"rank{trainer.strategy.global_rank}.pt",
        )


@pytest.mark.slow
@pytest.mark.usefixtures("ranks_from_the_fork_server")  # ranks fork from a warm server: see tests/conftest.py
def test_ddp_step_values_in_callback_metrics_are_the_same_on_every_rank():
    trainer = Trainer(strategy="ddp", devices=2, max_epochs=2, log_every_n_steps=1, callbacks=[Records()], **quiet())
    trainer.fit(PlateauPerStep(), loader(n=128, batch_size=8, shuffle=True))
    ranks = [torch.load(f"rank{r}.pt", weights_only=True) for r in (0, 1)]
    assert ranks[0]["train_loss"] == ranks[1]["train_loss"]
    assert ranks[0]["lr"] == ranks[1]["lr"] < 0.5  # the plateau scheduler acted, alike on both


@requires_cuda(1)
def test_with_16_mixed_on_before_optimizer_step_sees_unscaled_gradients():
    seen = []

    model = Classifier()
    reference = Classifier()
    reference.load_state_dict(model.state_dict())
    Trainer(max_steps=1, precision="16-mixed", devices=[0], callbacks=[GradNorms(seen)], **quiet()).fit(model, loader())
    x, y = next(iter(loader()))
    nn.functional.cross_entropy(reference(x), y).backward()
    expected = torch.nn.utils.get_total_norm([p.grad for p in reference.parameters()]).item()
    assert seen[0] == pytest.approx(expected, rel=1e-2)  # not multiplied by the scale (65536)


class OverflowsAtBatch1(Classifier):
    """Batch 1's loss is finite, but 10^4 times larger: scaled by 65536, its float16
    gradients overflow to inf, as a real overflow does."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * 1e4 if batch_idx == 1 else loss


class WeightsAfterEachStep(Callback):
    def on_train_start(self, trainer, module):
        self.weights = [[p.detach().clone() for p in module.parameters()]]
        self.scales: list[float] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.weights.append([p.detach().clone() for p in module.parameters()])
        self.scales.append(trainer.scaler.get_scale())


def _assert_batch_1_skipped_and_the_scale_halved(record: WeightsAfterEachStep) -> list[torch.Tensor]:
    """The overflowing step (batch 1) changed no weight, the others did, and the scale halved once;
    returns the weights after the last step."""
    def same(a, b):
        return all(torch.equal(x, y) for x, y in zip(a, b))

    before, after0, after1, after2 = record.weights
    assert not same(before, after0)
    assert same(after0, after1)  # the overflowing step changed nothing
    assert not same(after1, after2)  # and training went on
    assert record.scales == [65536.0, 32768.0, 32768.0]
    return after2


@requires_cuda(1)
def test_16_mixed_skips_the_step_whose_gradients_overflow_and_halves_the_scale():
    record = WeightsAfterEachStep()
    trainer = Trainer(max_epochs=1, limit_train_batches=3, precision="16-mixed", devices=[0], callbacks=[record], **quiet())
    trainer.fit(OverflowsAtBatch1(), loader())

    after2 = _assert_batch_1_skipped_and_the_scale_halved(record)
    assert all(torch.isfinite(p).all() for p in after2)
    assert trainer.global_step == 3  # a skipped step still counts, as in Lightning


class AutocastDtype(Classifier):
    def training_step(self, batch, batch_idx):
        self.dtypes = getattr(self, "dtypes", []) + [self(batch[0]).dtype]
        return super().training_step(batch, batch_idx)


@requires_cuda(1)
def test_bf16_mixed_on_cuda_runs_the_step_in_bfloat16_and_keeps_float32_weights():
    model = AutocastDtype()
    trainer = Trainer(max_steps=2, precision="bf16-mixed", devices=[0], **quiet())
    trainer.fit(model, loader())
    assert model.dtypes == [torch.bfloat16, torch.bfloat16]
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert trainer.scaler is None  # bfloat16 has float32's range: no scaling


@pytest.mark.parametrize(
    "interval, frequency, expected",
    [
        ("step", 3, [1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.25]),  # Lightning's: every 3rd batch of each epoch
        ("epoch", 2, [1.0] * 8),  # after the 2nd epoch only
    ],
)
def test_a_schedulers_frequency_steps_it_every_nth_batch_of_the_epoch_or_epoch(interval, frequency, expected):
    seen = []

    class Every(Classifier):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=1.0)
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
            return [opt], [{"scheduler": sched, "interval": interval, "frequency": frequency}]

        def on_train_batch_start(self, batch, batch_idx):
            seen.append(self.trainer.optimizers[0].param_groups[0]["lr"])

    trainer = Trainer(**quiet(max_epochs=2))
    trainer.fit(Every(), loader(64))  # 4 batches an epoch
    assert seen == expected
    assert trainer.optimizers[0].param_groups[0]["lr"] == (0.5 if interval == "epoch" else 0.25)


class NoOptimizers(Classifier):
    def __init__(self):
        super().__init__()
        self.steps = 0

    def configure_optimizers(self):
        return None

    def training_step(self, batch, batch_idx):
        self.steps += 1
        return super().training_step(batch, batch_idx)


def test_configure_optimizers_returning_none_trains_nothing_and_says_so_as_lightning_does():
    model = NoOptimizers()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = Trainer(**quiet(max_epochs=2))
    with pytest.warns(UserWarning, match=r"`LightningModule.configure_optimizers` returned `None`, this fit will run with no optimizer"):
        trainer.fit(model, loader())
    assert model.steps == 2 * len(loader()) and trainer.global_step == 2 * len(loader())  # the steps ran (and counted)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # nothing stepped
    assert repr(trainer.optimizers[0]) == "No Optimizer" and trainer.optimizers[0].state_dict() == {}
    assert "train_loss" in trainer.callback_metrics


@pytest.mark.parametrize(
    ("returned", "error", "lightning"),
    [
        (lambda opt: [{"optimizer": opt}, opt], TypeError, "Unknown configuration for model optimizers"),
        (lambda opt: "adam", TypeError, "Unknown configuration for model optimizers"),
        (lambda opt: {"optimizer": opt, "lr_scheduler": {"interval": "step"}}, ValueError,
         'The lr scheduler dict must have the key "scheduler" with its item being an lr scheduler'),
        (lambda opt: {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1), "interval": "batch"}},
         ValueError, 'The "interval" key in lr scheduler dict must be "step" or "epoch" but is "batch"'),
    ],
)
def test_an_unusable_configure_optimizers_is_lightnings_misconfiguration_with_its_sentence_first(returned, error, lightning):
    from trainer import MisconfigurationException

    class Bad(Classifier):
        def configure_optimizers(self):
            return returned(torch.optim.SGD(self.parameters(), lr=0.1))

    with pytest.raises(MisconfigurationException) as raised:
        Trainer(**quiet(max_epochs=1)).fit(Bad(), loader())
    assert isinstance(raised.value, error) and str(raised.value).startswith(lightning)


class CpuScaling(Precision):
    """float16's gradient scaler on the CPU ("16-mixed" needs CUDA): full-precision steps whose
    losses are scaled, so that the loops' scaled path (through the precision) runs here."""

    def setup(self, device: torch.device) -> None:
        super().setup(device)
        self.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)


class OverflowsInFloat32AtBatch1(Classifier):
    """Batch 1's loss is finite, but scaled by 65536 its float32 gradients overflow to inf."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * 1e35 if batch_idx == 1 else loss


def test_a_scaled_fit_skips_the_step_whose_gradients_overflow_and_halves_the_scale():
    record = WeightsAfterEachStep()
    trainer = Trainer(max_epochs=1, limit_train_batches=3, callbacks=[record], **quiet())
    trainer.strategy.precision = CpuScaling()
    trainer.fit(OverflowsInFloat32AtBatch1(), loader())

    _assert_batch_1_skipped_and_the_scale_halved(record)
    assert trainer.global_step == 3  # a skipped step still counts, as in Lightning


@pytest.mark.parametrize("accumulate", [1, 2])
def test_a_scaled_fit_ends_with_the_weights_of_an_unscaled_one(accumulate):
    # Scaling by a power of two and unscaling are exact in float32: the steps must be the same.
    torch.manual_seed(0)
    scaled, plain = Classifier(), Classifier()
    plain.load_state_dict(scaled.state_dict())
    trainer = Trainer(max_epochs=2, accumulate_grad_batches=accumulate, gradient_clip_val=0.5, **quiet())
    trainer.strategy.precision = CpuScaling()
    trainer.fit(scaled, loader())
    Trainer(max_epochs=2, accumulate_grad_batches=accumulate, gradient_clip_val=0.5, **quiet()).fit(plain, loader())
    assert trainer.grad_norm is not None  # clipped, after the unscale
    for a, b in zip(scaled.state_dict().values(), plain.state_dict().values()):
        assert torch.equal(a, b)


def test_a_scaled_manual_optimization_ends_with_the_weights_of_an_unscaled_one():
    torch.manual_seed(0)
    scaled, plain = TinyGAN(clip=0.05), TinyGAN(clip=0.05)
    plain.load_state_dict(scaled.state_dict())
    trainer = Trainer(max_epochs=2, **quiet())
    trainer.strategy.precision = CpuScaling()
    trainer.fit(scaled, gan_loader())
    Trainer(max_epochs=2, **quiet()).fit(plain, gan_loader())
    assert trainer.scaler.get_scale() == 2.0**16  # no overflow, and growth waits 2000 steps
    for a, b in zip(scaled.state_dict().values(), plain.state_dict().values()):
        assert torch.equal(a, b)


def test_a_submodule_left_in_eval_mode_is_warned_about_and_stays_in_eval_mode():
    model = Classifier()
    model.net[2].eval()  # the Dropout, frozen on purpose or by mistake
    seen = []

    class Modes(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen.append(pl_module.net[2].training)

    from trainer.core.exceptions import PossibleUserWarning
    with pytest.warns(PossibleUserWarning, match=r"Found 1 module\(s\) in eval mode at the start of training.*net\.2"):
        Trainer(max_epochs=1, limit_train_batches=2, callbacks=[Modes()], **quiet()).fit(model, loader(32))
    assert seen == [False, False]


def test_a_model_whose_modules_all_train_gets_no_eval_mode_warning(recwarn):
    Trainer(max_epochs=1, limit_train_batches=2, **quiet()).fit(Classifier(), loader(32))
    assert not [w for w in recwarn if "eval mode" in str(w.message)]


class StepLRModel(Classifier):
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=1.0)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)]


def test_epoch_schedulers_step_at_the_last_batch_so_a_checkpoint_there_holds_them_and_resumes_exactly(tmp_path):
    from callbacks import ModelCheckpoint

    torch.manual_seed(0)
    whole = StepLRModel()
    start = {k: v.clone() for k, v in whole.state_dict().items()}
    Trainer(max_epochs=3, **quiet()).fit(whole, loader(64))  # 4 batches an epoch

    torch.manual_seed(0)
    first = StepLRModel()
    first.load_state_dict(start)
    saves = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=4, save_top_k=-1, save_on_train_epoch_end=False)
    Trainer(max_epochs=1, **quiet(callbacks=[saves])).fit(first, loader(64))
    ckpt = torch.load(tmp_path / "epoch=0-step=4.ckpt", weights_only=False)  # saved in on_train_batch_end
    assert ckpt["lr_schedulers"][0]["_last_lr"] == [0.5]  # stepped before it, as in Lightning

    resumed = StepLRModel()
    trainer = Trainer(max_epochs=3, **quiet())
    trainer.fit(resumed, loader(64), ckpt_path=tmp_path / "epoch=0-step=4.ckpt")
    assert trainer.lr_scheduler_configs[0].scheduler.get_last_lr() == [0.125]  # stepped once per epoch, not twice
    for key, value in whole.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key]), key


def test_a_plateau_scheduler_per_step_steps_after_the_validation_that_follows_the_step(tmp_path):
    seen = []

    class Plateau(Classifier):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt)
            return [opt], [{"scheduler": sched, "interval": "step", "monitor": "train_loss"}]

        def on_validation_end(self):
            seen.append(self.trainer.lr_scheduler_configs[0].scheduler.last_epoch)

    Trainer(max_epochs=1, val_check_interval=2, **quiet()).fit(Plateau(), loader(64), loader(16))
    assert seen == [0, 1, 3]  # the sanity check, then the validations after steps 2 and 4: the steps before
