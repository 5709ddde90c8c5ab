"""The Tuner: lr_find and scale_batch_size, and their callbacks. A search leaves no trace."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from torch.utils.data import DataLoader

from callbacks import BatchSizeFinder, LearningRateFinder
from tests._models import Classifier, dataset, loader, quiet
from tests.conftest import requires_cuda
from trainer import DataModule, MisconfigurationException, Trainer, Tuner


class Tunable(Classifier):
    """Reads self.lr and self.batch_size; 'runs out of memory' on batches above ``oom_above``."""

    def __init__(self, lr: float = 0.1, batch_size: int = 4, oom_above: int | None = None, n: int = 64) -> None:
        super().__init__(lr=lr, dropout=0.2)
        self.batch_size, self.oom_above, self.n = batch_size, oom_above, n
        self.sizes: list[int] = []

    def train_dataloader(self):
        return DataLoader(dataset(self.n), batch_size=self.batch_size, shuffle=True)

    def training_step(self, batch, batch_idx):
        self.sizes.append(len(batch[0]))
        if self.oom_above is not None and len(batch[0]) > self.oom_above:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate a batch of {len(batch[0])}")
        return super().training_step(batch, batch_idx)


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def same(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_lr_find_records_the_range_and_sets_the_suggestion_on_the_model_and_hparams():
    model = Tunable()
    finder = Tuner(Trainer(max_epochs=1, **quiet())).lr_find(model, min_lr=1e-4, max_lr=1.0, num_training=30, early_stop_threshold=None)
    lrs, losses = finder.results["lr"], finder.results["loss"]
    assert len(lrs) == len(losses) == 30
    assert lrs[0] == pytest.approx(1e-4) and lrs[-1] == pytest.approx(1.0)
    assert all(b / a == pytest.approx(lrs[1] / lrs[0]) for a, b in zip(lrs, lrs[1:]))  # evenly spread on a log scale
    suggestion = finder.suggestion()
    assert 1e-4 <= suggestion <= 1.0
    assert model.lr == suggestion and model.hparams["lr"] == suggestion
    linear = Tuner(Trainer(max_epochs=1, **quiet())).lr_find(Tunable(), min_lr=0.01, max_lr=0.5, num_training=5, mode="linear", update_attr=False)
    assert linear.results["lr"] == pytest.approx([0.01, 0.1325, 0.255, 0.3775, 0.5])


def test_lr_find_records_nan_for_a_step_whose_training_step_returned_none_and_suggests_around_it():
    class SkipsSome(Tunable):
        def training_step(self, batch, batch_idx):
            return None if self.trainer.global_step in (5, 12, 17) else super().training_step(batch, batch_idx)

    model = SkipsSome(n=256)
    finder = Tuner(Trainer(max_epochs=1, **quiet())).lr_find(model, num_training=20, early_stop_threshold=None)
    losses = torch.tensor(finder.results["loss"])
    assert len(finder.results["lr"]) == len(losses) == 20 and torch.isnan(losses[[5, 12, 17]]).all()
    assert torch.isfinite(losses[[0, 6, 13, 19]]).all() and model.lr == finder.suggestion()


def test_the_lr_search_sets_each_steps_lr_itself_so_a_plateau_scheduler_on_a_validation_metric_waits():
    class Plateau(Tunable):
        def validation_step(self, batch, batch_idx):
            self.log("val_loss", super().training_step(batch, batch_idx))

        def configure_optimizers(self):
            optimizer = torch.optim.Adam(self.parameters(), lr=self.lr)
            scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, patience=2)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": "val_loss"}}

    finder = LearningRateFinder(num_training_steps=12, update_attr=False)
    trainer = Trainer(**quiet(max_epochs=2, callbacks=[finder], limit_val_batches=2))
    trainer.fit(Plateau(n=32), val_dataloaders=loader(32))  # 8 batches an epoch: the search crosses an epoch end, unvalidated
    assert len(finder.optimal_lr.results["lr"]) == 12 and "val_loss" in trainer.callback_metrics
    assert isinstance(trainer.lr_scheduler_configs[0].scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


def test_a_search_leaves_no_trace(tmp_path):
    model = Tunable(oom_above=16)
    trainer = Trainer(max_epochs=1, enable_progress_bar=False)  # TensorBoard and checkpoints on
    callbacks_before = list(trainer.callbacks)
    states_before = [cb.state_dict() for cb in trainer.callbacks]
    before, rng = weights(model), torch.get_rng_state()
    tuner = Tuner(trainer)
    tuner.lr_find(model, num_training=20)
    assert model.trainer is trainer
    model.trainer = None
    tuner.scale_batch_size(model, max_trials=4)
    assert same(weights(model), before) and torch.equal(torch.get_rng_state(), rng)
    # As after Lightning's tuner: attached to the user's Trainer (not the search's copy), so that
    # model.logger is the Trainer's logger; the copy's run left nothing on it.
    assert model.training and model.trainer is trainer and model.logger is trainer.logger is not None
    assert (trainer.global_step, trainer.current_epoch, trainer.optimizer, trainer.callback_metrics) == (0, 0, None, {})
    assert trainer.callbacks == callbacks_before and [cb.state_dict() for cb in trainer.callbacks] == states_before
    assert os.listdir(tmp_path) == []  # no TensorBoard run, no checkpoint


@pytest.mark.parametrize("search", ["lr", "batch_size"])
def test_a_fit_after_a_search_equals_a_fresh_run_with_the_value_set_by_hand(search):
    torch.manual_seed(0)
    tuned = Tunable(oom_above=8)
    if search == "lr":
        Tuner(Trainer(max_epochs=1, **quiet())).lr_find(tuned, num_training=20, min_lr=1e-3)
    else:
        assert Tuner(Trainer(max_epochs=1, **quiet())).scale_batch_size(tuned) == 8
    Trainer(max_epochs=2, **quiet()).fit(tuned)
    torch.manual_seed(0)
    by_hand = Tunable(oom_above=8)
    by_hand.lr, by_hand.batch_size = tuned.lr, tuned.batch_size
    Trainer(max_epochs=2, **quiet()).fit(by_hand)
    assert same(weights(tuned), weights(by_hand))
    steps = 2 * 64 // tuned.batch_size
    assert tuned.sizes[-steps:] == by_hand.sizes == [tuned.batch_size] * steps


def test_lr_find_stops_early_when_the_loss_diverges():
    finder = Tuner(Trainer(max_epochs=1, **quiet())).lr_find(Tunable(), min_lr=1e-2, max_lr=1e4, num_training=60, update_attr=False)
    assert 2 < len(finder.results["lr"]) < 60


def test_too_little_data_for_a_suggestion_is_none_with_a_warning():
    finder = Tuner(Trainer(max_epochs=1, **quiet())).lr_find(Tunable(), num_training=5, update_attr=False)
    with pytest.warns(UserWarning, match="too few for a suggestion"):
        assert finder.suggestion() is None
    assert finder.suggestion(skip_begin=0, skip_end=0) is not None


def test_plot_without_matplotlib_says_to_install_it(monkeypatch):
    finder = Tuner(Trainer(max_epochs=1, **quiet())).lr_find(Tunable(), num_training=5, update_attr=False)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(ModuleNotFoundError, match="pip install matplotlib"):
        finder.plot(suggest=True)


def test_plot_draws_a_figure_with_matplotlib():
    finder = Tuner(Trainer(max_epochs=1, **quiet())).lr_find(Tunable(), num_training=15, update_attr=False)
    fig = finder.plot(suggest=True)
    assert len(fig.axes[0].lines) == 2  # the curve and the suggestion


@pytest.mark.parametrize("mode, found, tried", [
    ("power", 16, [2, 4, 8, 16, 32]),
    ("binsearch", 22, [2, 4, 8, 16, 32, 24, 28, 26, 25]),  # 24 fits; Lightning's 5% margin leaves 22
])
def test_scale_batch_size_grows_until_out_of_memory(mode, found, tried):
    model = Tunable(oom_above=24, n=200)
    assert Tuner(Trainer(max_epochs=1, **quiet())).scale_batch_size(model, mode=mode, steps_per_trial=1) == found
    assert model.batch_size == found
    assert model.sizes == tried


def test_scale_batch_size_never_goes_beyond_the_dataset_and_sets_a_datamodule():
    class Data(DataModule):
        def __init__(self):
            super().__init__()
            self.batch_size = 3

        def train_dataloader(self):
            return DataLoader(dataset(20), batch_size=self.batch_size)

    data, model = Data(), Classifier()
    trainer = Trainer(max_epochs=1, **quiet())
    # 3, 6, 12, then 24: one batch of all 20 samples, so it stops there (Lightning's result, past the length)
    assert Tuner(trainer).scale_batch_size(model, datamodule=data, init_val=3) == 24
    assert data.batch_size == 24 and trainer.datamodule is data and trainer.train_dataloader.batch_size == 24


def test_scale_batch_size_margin_max_val_max_trials_and_the_evaluation_methods():
    tuner = Tuner(Trainer(max_epochs=1, **quiet()))
    assert tuner.scale_batch_size(Tunable(n=200), max_trials=0) == 2  # no trial: init_val
    assert tuner.scale_batch_size(Tunable(n=200), max_trials=3, steps_per_trial=1) == 8  # 2, 4, 8 ran
    assert tuner.scale_batch_size(Tunable(n=200), mode="binsearch", max_trials=3, steps_per_trial=1, margin=0.2) == 6
    assert tuner.scale_batch_size(Tunable(n=200), max_val=8, steps_per_trial=1) == 8

    class Evaluated(Tunable):
        def val_dataloader(self):
            return DataLoader(dataset(64), batch_size=self.batch_size)

    model = Evaluated(n=64)
    trainer = Trainer(max_epochs=1, callbacks=[BatchSizeFinder(max_trials=4)], **quiet())
    trainer.validate(model, verbose=False)
    assert model.batch_size == 16 and trainer.val_dataloaders.batch_size == 16 and trainer.global_step == 0


def test_the_callbacks_search_before_the_fit_builds_its_loader_and_optimizer():
    model = Tunable(oom_above=8, n=64)
    sizes, lr = BatchSizeFinder(steps_per_trial=1), LearningRateFinder(num_training_steps=20)
    trainer = Trainer(max_epochs=1, callbacks=[sizes, lr], **quiet())
    trainer.fit(model)
    assert sizes.optimal_batch_size == model.batch_size == 8
    assert lr.optimal_lr.suggestion() == model.lr == trainer.optimizer.param_groups[0]["lr"]
    assert trainer.global_step == 8  # one epoch of 64 samples in batches of 8


def test_bad_input_gets_a_sentence():
    tuner, model = Tuner(Trainer(max_epochs=1, **quiet())), Tunable()
    falling = tuner.lr_find(Tunable(), min_lr=0.1, max_lr=0.01, num_training=3, update_attr=False)  # Lightning searches downwards too
    assert falling.results["lr"] == pytest.approx([0.1, 0.1 * 0.1**0.5, 0.01])
    with pytest.raises(ValueError, match=r"mode='cosine'\): use 'exponential'"):
        tuner.lr_find(model, mode="cosine")
    with pytest.raises(ValueError, match=r"`mode` should be either of \('power', 'binsearch'\); scale_batch_size\(mode='double'\)"):
        tuner.scale_batch_size(model, mode="double")
    with pytest.raises(AttributeError, match=r"The attribute name for the learning rate was set to rate.*Classifier has no attribute 'rate'.*attr_name="):
        tuner.lr_find(Classifier(), attr_name="rate")
    with pytest.raises(MisconfigurationException, match=r"Field batch_size not found in `model`, `datamodule`, nor their `hparams`"):
        tuner.scale_batch_size(Classifier())
    with pytest.raises(MisconfigurationException, match="cannot be used with dataloaders passed directly to `.fit\\(\\)`"):
        tuner.scale_batch_size(model, train_dataloaders=loader())
    with pytest.raises(ValueError, match=r"method 'prediction' is invalid\. Should be one of"):
        tuner.scale_batch_size(model, method="prediction")
    with pytest.raises(MisconfigurationException, match="please consider setting `dataloaders` instead"):
        tuner.scale_batch_size(model, train_dataloaders=loader(), method="validate")


@requires_cuda()
def test_scale_batch_size_stops_at_a_real_cuda_out_of_memory():
    class Hungry(Tunable):
        def training_step(self, batch, batch_idx):
            held = torch.empty(len(batch[0]) * 2**28, device=self.net[0].weight.device)  # 1 GiB per sample
            return super().training_step(batch, batch_idx) + held[:1].sum() * 0

    model = Hungry(n=4096)
    # cuBLAS keeps a workspace per thread from its first matrix product (the forward's on this
    # thread, the backward's on autograd's): make both before measuring, so only the trials count.
    w = torch.ones(8, 8, device="cuda", requires_grad=True)
    (w @ w).sum().backward()
    del w
    before = torch.cuda.memory_allocated()
    found = Tuner(Trainer(max_epochs=1, **quiet())).scale_batch_size(model, steps_per_trial=1, max_trials=12)
    total = torch.cuda.get_device_properties(0).total_memory / 2**30
    assert found in (2, 4, 8, 16, 32, 64, 128) and found <= total < 2 * found + 1
    # The trials' memory is freed: a trial held GiBs; the model's weights and the allocator's
    # small blocks (about 1 MiB on an H100) stay.
    assert model.batch_size == found and torch.cuda.memory_allocated() <= before + 2**24


def test_the_batch_size_finder_refuses_distributed_strategies_and_several_evaluation_loaders():
    with pytest.raises(MisconfigurationException, match="The Batch size finder is not supported with distributed strategies"):
        BatchSizeFinder().setup(Trainer(strategy="ddp", devices=2, accelerator="cpu", **quiet()), Classifier())

    class TwoVal(Tunable):
        def val_dataloader(self):
            return [DataLoader(dataset(16), batch_size=self.batch_size)] * 2

    with pytest.raises(MisconfigurationException, match="The Batch size finder cannot be used with multiple val dataloaders"):
        Tuner(Trainer(**quiet())).scale_batch_size(TwoVal(), method="validate")

    class TwoValNoField(Classifier):  # no batch_size field either: the loaders are Lightning's first complaint
        def val_dataloader(self):
            return [DataLoader(dataset(16), batch_size=4)] * 2

    with pytest.raises(MisconfigurationException, match="The Batch size finder cannot be used with multiple val dataloaders"):
        Tuner(Trainer(**quiet())).scale_batch_size(TwoValNoField(), method="validate")


def test_fast_dev_run_skips_both_searches_with_lightnings_warnings():
    tuner = Tuner(Trainer(fast_dev_run=True))
    with pytest.warns(UserWarning, match="^Skipping learning rate finder since `fast_dev_run` is enabled."):
        assert tuner.lr_find(Tunable()) is None
    with pytest.warns(UserWarning, match="^Skipping batch size scaler since `fast_dev_run` is enabled."):
        assert tuner.scale_batch_size(Tunable()) is None
