"""Several optimizers and steps taken by hand (``automatic_optimization = False``)."""

from __future__ import annotations

import csv

import pytest
import torch
from torch import nn

from callbacks import ModelCheckpoint
from tests._models import Classifier, TinyGAN, gan_loader, loader, quiet
from trainer import Trainer, TrainModule


def _gan_by_hand(model: TinyGAN, batches, clip: float | None = None) -> None:
    """TinyGAN.training_step as a hand-written loop would run it."""
    opt_g, opt_d = model.configure_optimizers()
    for real, z in batches:
        fake = model.generator(z)
        d_loss = (nn.functional.softplus(-model.discriminator(real)).mean()
                  + nn.functional.softplus(model.discriminator(fake.detach())).mean())
        opt_d.zero_grad()
        d_loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(list(model.discriminator.parameters()), clip)
        opt_d.step()
        g_loss = nn.functional.softplus(-model.discriminator(model.generator(z))).mean()
        opt_g.zero_grad()
        g_loss.backward()
        opt_g.step()


def _assert_same_weights(a: nn.Module, b: nn.Module) -> None:
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(x, y), name


@pytest.mark.parametrize("clip", [None, 0.05])
def test_a_gan_stepped_by_hand_matches_a_hand_written_loop(clip):
    torch.manual_seed(0)
    model, by_hand = TinyGAN(clip=clip), TinyGAN()
    by_hand.load_state_dict(model.state_dict())
    trainer = Trainer(max_epochs=2, **quiet())
    trainer.fit(model, gan_loader())
    _gan_by_hand(by_hand, [b for _ in range(2) for b in gan_loader()], clip=clip)
    _assert_same_weights(model, by_hand)
    # Lightning's count: every optimizer.step(), two a batch here.
    assert trainer.global_step == 2 * 2 * len(gan_loader())
    assert set(trainer.callback_metrics) >= {"d_loss", "g_loss"}
    if clip is not None:
        assert trainer.grad_norm is not None and trainer.grad_norm > 0  # the norm before clipping


def test_global_step_counts_every_optimizer_step_and_max_steps_and_checkpoints_follow_it(tmp_path):
    model = TinyGAN(step_every=2)  # both optimizers step on even batches only
    trainer = Trainer(
        max_steps=5, log_dir=tmp_path, enable_progress_bar=False,
        callbacks=[ModelCheckpoint(every_n_train_steps=2, save_top_k=-1)],
    )
    trainer.fit(model, gan_loader(n=64, batch_size=8))  # 8 batches: 2 steps at 0, 2, 4 -> 6 >= 5 after batch 4
    assert trainer.global_step == 6
    assert trainer.state.batch_in_epoch == 5
    assert trainer.state.batches_stepped == 5  # the loggers' step: every batch (Lightning's _batches_that_stepped)
    saved = sorted(p.name for p in tmp_path.rglob("epoch=*.ckpt"))
    assert saved == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt", "epoch=0-step=6.ckpt"]


def test_under_manual_optimization_the_loggers_step_counts_batches_not_optimizer_steps(tmp_path):
    from loggers import CSVLogger

    logger = CSVLogger(tmp_path)
    trainer = Trainer(max_epochs=1, logger=logger, log_every_n_steps=2, enable_progress_bar=False, enable_checkpointing=False)
    trainer.fit(TinyGAN(), gan_loader(n=64, batch_size=8))  # 8 batches, 16 optimizer steps
    assert trainer.global_step == 16
    with open(tmp_path / "lightning_logs" / "version_0" / "metrics.csv", newline="") as f:
        rows = [row for row in csv.DictReader(f) if row.get("g_loss")]
    steps = [int(row["step"]) for row in rows]
    assert steps == sorted(set(steps)) and max(steps) <= 7  # one point per logged batch, not per optimizer step
    assert steps[-1] == 7  # the 8th batch's, at 7


def test_a_manual_checkpoint_keeps_both_counters_for_the_resume_and_for_lightning(tmp_path):
    trainer = Trainer(max_steps=6, log_dir=tmp_path, enable_progress_bar=False)
    trainer.fit(TinyGAN(), gan_loader(n=64, batch_size=8))  # 3 batches, 6 steps: stopped mid-epoch
    path = next(tmp_path.rglob("last.ckpt"))
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["global_step"] == 6
    fit_loop = ckpt["loops"]["fit_loop"]
    assert fit_loop["epoch_loop.manual_optimization.optim_step_progress"]["total"]["completed"] == 6
    assert fit_loop["epoch_loop.state_dict"]["_batches_that_stepped"] == 2  # Lightning adds the saving batch back
    resumed = Trainer(max_steps=10, log_dir=tmp_path, enable_progress_bar=False)
    resumed.fit(TinyGAN(), gan_loader(n=64, batch_size=8), ckpt_path=path)
    assert (resumed.global_step, resumed.state.batches_stepped) == (10, 5)


class _Recorder(TrainModule):
    """Two optimizers with schedulers in Lightning's (optimizers, schedulers) shape; records what
    ``self.optimizers()`` and ``self.lr_schedulers()`` return and steps its schedulers itself."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.a, self.b = nn.Linear(2, 1), nn.Linear(2, 1)
        self.seen = None

    def training_step(self, batch, batch_idx):
        x, _ = batch
        opts, scheds = self.optimizers(), self.lr_schedulers()
        self.seen = ([o.optimizer for o in opts], list(scheds))
        for opt, net in zip(opts, (self.a, self.b)):
            opt.zero_grad()
            self.manual_backward(net(x[:, :2]).pow(2).mean())
            opt.step()
        if batch_idx == self.trainer.num_training_batches - 1:
            scheds[0].step()  # the Trainer steps no scheduler under manual optimization

    def configure_optimizers(self):
        self.opt_a = torch.optim.SGD(self.a.parameters(), lr=0.1)
        self.opt_b = torch.optim.SGD(self.b.parameters(), lr=0.2)
        self.sched_a = torch.optim.lr_scheduler.StepLR(self.opt_a, 1, gamma=0.5)
        self.sched_b = torch.optim.lr_scheduler.StepLR(self.opt_b, 1, gamma=0.5)
        return [self.opt_a, self.opt_b], [self.sched_a, {"scheduler": self.sched_b, "interval": "step"}]


def test_optimizers_and_schedulers_come_back_in_the_order_given_and_only_the_user_steps_them(tmp_path):
    model = _Recorder()
    trainer = Trainer(max_epochs=2, log_dir=tmp_path, enable_progress_bar=False)
    trainer.fit(model, loader(n=32, batch_size=8))
    assert model.seen == ([model.opt_a, model.opt_b], [model.sched_a, model.sched_b])
    assert trainer.optimizers == [model.opt_a, model.opt_b]
    assert model.opt_a.param_groups[0]["lr"] == pytest.approx(0.025)  # stepped by the user at each epoch's end
    assert model.opt_b.param_groups[0]["lr"] == pytest.approx(0.2)  # never stepped: interval='step' is not ours to act on
    # Every optimizer and scheduler is in the checkpoint.
    ckpt = torch.load(next(tmp_path.rglob("*.ckpt")), weights_only=True)
    assert len(ckpt["optimizer_states"]) == 2 and len(ckpt["lr_schedulers"]) == 2
    assert [s["param_groups"][0]["lr"] for s in ckpt["optimizer_states"]] == pytest.approx([0.025, 0.2])
    assert ckpt["lr_schedulers"][0]["last_epoch"] == 2


def test_resuming_a_gan_restores_both_optimizers_and_is_bit_exact(tmp_path):
    torch.manual_seed(0)
    straight, stopped = TinyGAN(), TinyGAN()
    stopped.load_state_dict(straight.state_dict())
    Trainer(max_epochs=3, **quiet()).fit(straight, gan_loader())
    Trainer(max_epochs=1, log_dir=tmp_path, enable_progress_bar=False).fit(stopped, gan_loader())
    resumed = TinyGAN()  # a new process would start from fresh weights and optimizers
    trainer = Trainer(max_epochs=3, log_dir=tmp_path, enable_progress_bar=False)
    trainer.fit(resumed, gan_loader(), ckpt_path="last")
    _assert_same_weights(resumed, straight)
    assert trainer.global_step == 2 * 3 * len(gan_loader())


def test_several_optimizers_with_automatic_optimization_say_how_to_step_them():
    class TwoOpts(Classifier):
        def configure_optimizers(self):
            return [torch.optim.SGD(self.net[0].parameters(), lr=0.1), torch.optim.SGD(self.net[3].parameters(), lr=0.1)]

    with pytest.raises(ValueError, match=r"returned 2 optimizers.*self.automatic_optimization = False"):
        Trainer(max_epochs=1, **quiet()).fit(TwoOpts(), loader())


@pytest.mark.parametrize(
    "option, message",
    [
        (dict(gradient_clip_val=1.0), r"gradient_clip_val=1.0\) with manual optimization.*self.clip_gradients"),
        (dict(accumulate_grad_batches=2), r"accumulate_grad_batches=2\) with manual optimization"),
    ],
)
def test_options_that_assume_the_trainer_steps_are_refused_under_manual_optimization(option, message):
    with pytest.raises(ValueError, match=message):
        Trainer(max_epochs=1, **quiet(**option)).fit(TinyGAN(), gan_loader())


def test_manual_backward_under_automatic_optimization_says_what_to_do():
    class Confused(Classifier):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.manual_backward(loss)
            return loss

    with pytest.raises(RuntimeError, match=r"manual_backward\(\) is for manual optimization.*automatic_optimization = False"):
        Trainer(max_epochs=1, **quiet()).fit(Confused(), loader())


@pytest.mark.parametrize(
    "shape",
    ["list", "tuple of lists", "list of dicts"],
)
def test_lightnings_shapes_for_one_optimizer_still_train_automatically(shape):
    class Shaped(Classifier):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
            return {"list": [opt], "tuple of lists": ([opt], [sched]),
                    "list of dicts": [{"optimizer": opt, "lr_scheduler": sched}]}[shape]

    model = Shaped()
    Trainer(max_epochs=2, **quiet()).fit(model, loader())
    lr = model.trainer.optimizer.param_groups[0]["lr"]
    assert lr == pytest.approx(0.1 if shape == "list" else 0.025)


def test_toggle_optimizer_keeps_the_other_networks_gradients_out():
    class Toggled(TinyGAN):
        def training_step(self, batch, batch_idx):
            real, z = batch
            opt_g, opt_d = self.optimizers()
            self.toggle_optimizer(opt_g)
            g_loss = nn.functional.softplus(-self.discriminator(self.generator(z))).mean()
            opt_g.zero_grad()
            self.manual_backward(g_loss)
            self.seen = [p.grad for p in self.discriminator.parameters()]
            opt_g.step()
            self.untoggle_optimizer(opt_g)
            return g_loss

    model = Toggled()
    Trainer(max_epochs=1, **quiet()).fit(model, gan_loader())
    assert model.seen == [None] * 4
    assert all(p.requires_grad for p in model.parameters())


def test_toggle_optimizer_leaves_a_parameter_of_no_optimizer_as_lightning_does():
    class WithAFrozenHead(TinyGAN):  # `scale` is in no optimizer: it must keep its gradient
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(()))

        def training_step(self, batch, batch_idx):
            real, z = batch
            opt_g, opt_d = self.optimizers()
            self.toggle_optimizer(opt_d)
            self.during = (self.scale.requires_grad, [p.requires_grad for p in self.generator.parameters()])
            d_loss = nn.functional.softplus(self.scale * self.discriminator(real)).mean()
            opt_d.zero_grad()
            self.manual_backward(d_loss)
            opt_d.step()
            self.untoggle_optimizer(opt_d)
            self.scale_grad = self.scale.grad
            return d_loss

    model = WithAFrozenHead()
    Trainer(max_steps=1, **quiet()).fit(model, gan_loader())
    assert model.during[0] is True and model.during[1] and not any(model.during[1])
    assert model.scale_grad is not None
    assert all(p.requires_grad for p in model.parameters())


@pytest.mark.slow
@pytest.mark.parametrize("clip", [None, 0.05])
@pytest.mark.usefixtures("ranks_from_the_fork_server")  # ranks fork from a warm server: see tests/conftest.py
def test_a_gan_under_ddp_matches_one_device_with_the_doubled_batch(clip):
    torch.manual_seed(0)
    spread, single = TinyGAN(clip=clip), TinyGAN(clip=clip)
    single.load_state_dict(spread.state_dict())
    trainer = Trainer(strategy="ddp", devices=2, max_epochs=2, **quiet())
    trainer.fit(spread, gan_loader(batch_size=8))  # each rank: 8 of every 16 samples
    Trainer(max_epochs=2, **quiet()).fit(single, gan_loader(batch_size=16))
    for (name, a), b in zip(spread.state_dict().items(), single.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    assert trainer.global_step == 2 * 2 * len(gan_loader(batch_size=16))


class _WithLBFGS(TrainModule):
    """An optimizer that needs a closure: LBFGS re-evaluates the loss inside step()."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.net = nn.Linear(8, 2)

    def loss(self, batch):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()

        def closure():
            opt.zero_grad()
            loss = self.loss(batch)
            self.manual_backward(loss)
            return loss

        return opt.step(closure)

    def configure_optimizers(self):
        return torch.optim.LBFGS(self.parameters(), lr=0.5, max_iter=4)


def test_an_optimizer_that_steps_with_a_closure_matches_a_hand_written_loop():
    torch.manual_seed(0)
    model, by_hand = _WithLBFGS(), _WithLBFGS()
    by_hand.load_state_dict(model.state_dict())
    trainer = Trainer(max_epochs=1, **quiet())
    trainer.fit(model, loader(n=64, batch_size=16))
    opt = by_hand.configure_optimizers()
    for batch in loader(n=64, batch_size=16):
        def closure(batch=batch):
            opt.zero_grad()
            loss = by_hand.loss(batch)
            loss.backward()
            return loss
        opt.step(closure)
    _assert_same_weights(model, by_hand)
    assert trainer.global_step == 4


class PlateauByHand(Classifier):
    """Manual optimization with a ReduceLROnPlateau returned without a monitor: the module steps it."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt, sched = self.optimizers(), self.lr_schedulers()
        loss = nn.functional.cross_entropy(self(batch[0]), batch[1])
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step()
        sched.step(10.0)  # a metric that never improves: the rate halves after each patience

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return [opt], [torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)]


def test_a_plateau_scheduler_without_monitor_is_the_modules_to_step_under_manual_optimization():
    model = PlateauByHand()
    trainer = Trainer(max_steps=3, **quiet())
    trainer.fit(model, loader(64, 16))
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**2)  # 3 steps of 10.0: 2 reductions
    from trainer import MisconfigurationException

    class Automatic(Classifier):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            return opt, torch.optim.lr_scheduler.ReduceLROnPlateau(opt)

    with pytest.raises(MisconfigurationException, match="`configure_optimizers` must include a monitor when a `ReduceLROnPlateau`"):
        Trainer(max_steps=1, **quiet()).fit(Automatic(), loader(16))


class SharedParameters(Classifier):
    """Two optimizers over the same parameters, stepped by hand (Lightning allows it)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        for opt in self.optimizers():
            loss = nn.functional.cross_entropy(self(batch[0]), batch[1])
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()

    def configure_optimizers(self):
        return [torch.optim.SGD(self.parameters(), lr=0.1), torch.optim.SGD(self.net[0].parameters(), lr=0.01)]


def test_optimizers_may_share_parameters_under_manual_optimization():
    model = SharedParameters()
    before = model.net[0].weight.detach().clone()
    trainer = Trainer(max_steps=2, **quiet())
    trainer.fit(model, loader(32, 16))
    assert len(trainer.optimizers) == 2 and not torch.equal(before, model.net[0].weight)


class _PlateauWithMonitor(PlateauByHand):
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5)
        return [opt], [{"scheduler": plateau, "monitor": "train_loss", "interval": "step"}]


def test_a_monitor_given_under_manual_optimization_is_ignored_with_lightnings_warning():
    trainer = Trainer(max_steps=3, **quiet())
    with pytest.warns(RuntimeWarning, match=r"\['monitor'\], but the keys will be ignored"):
        trainer.fit(_PlateauWithMonitor(), loader(64, 16))
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**2)  # the module's steps only


class _StepKeywords(Classifier):
    """Lightning's LightningOptimizer.step(closure, **kwargs): the keywords reach the optimizer."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        loss = nn.functional.cross_entropy(self(batch[0]), batch[1])
        opt.zero_grad()
        self.manual_backward(loss)
        opt.step(scale=0.5)

    def configure_optimizers(self):
        class HalfStepSGD(torch.optim.SGD):
            def step(self, closure=None, scale=1.0):
                self.seen = scale
                return super().step(closure)

        return HalfStepSGD(self.parameters(), lr=0.1)


def test_keywords_given_to_a_manual_step_reach_the_optimizer():
    trainer = Trainer(max_steps=2, **quiet())
    trainer.fit(_StepKeywords(), loader(32, 16))
    assert trainer.optimizers[0].seen == 0.5 and trainer.global_step == 2


def test_several_optimizers_under_automatic_optimization_are_lightnings_runtime_error():
    class OptimizerIdx(Classifier):
        def training_step(self, batch, batch_idx, optimizer_idx):  # Lightning 1.x's form
            return super().training_step(batch, batch_idx)

    with pytest.raises(RuntimeError, match=r"^Training with multiple optimizers is only supported with manual optimization. "
                                           r"Remove the `optimizer_idx` argument from `training_step`"):
        Trainer(**quiet(max_steps=1)).fit(OptimizerIdx(), loader())

    class TwoAdams(Classifier):
        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters()), torch.optim.Adam(self.parameters())

    with pytest.raises(ValueError, match="multiple optimizers is only supported with manual optimization") as raised:
        Trainer(**quiet(max_steps=1)).fit(TwoAdams(), loader())
    assert isinstance(raised.value, RuntimeError)


def test_the_lr_finder_with_several_optimizers_refuses_instead_of_searching_forever():
    from trainer import MisconfigurationException, Tuner

    class TwoManual(Classifier):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            return None

        def configure_optimizers(self):
            return [torch.optim.SGD(self.parameters(), lr=0.01), torch.optim.Adam(self.parameters(), lr=0.01)]

    with pytest.raises(MisconfigurationException, match="returned 2, but learning rate finder only works with single optimizer"):
        Tuner(Trainer(**quiet(max_epochs=1))).lr_find(TwoManual(), loader(), attr_name="lr")


class _StepReturns(Classifier):
    """opt.step() hands back what the optimizer's step returned, as Lightning's LightningOptimizer.step does."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.returned: list = []

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        self.printed = repr(opt)
        opt.zero_grad()
        self.manual_backward(nn.functional.cross_entropy(self(batch[0]), batch[1]))
        self.returned.append(opt.step())

    def configure_optimizers(self):
        class CountingSGD(torch.optim.SGD):
            def step(self, closure=None):
                super().step(closure)
                self.count = getattr(self, "count", 0) + 1
                return f"step {self.count}"

        return CountingSGD(self.parameters(), lr=0.1)


def test_a_manual_step_returns_the_optimizers_output_and_prints_as_lightnings_wrapper():
    model = _StepReturns()
    trainer = Trainer(max_steps=2, **quiet())
    trainer.fit(model, loader(32, 16))
    assert model.returned == ["step 1", "step 2"]
    assert model.printed == "Lightning" + repr(trainer.optimizers[0])
