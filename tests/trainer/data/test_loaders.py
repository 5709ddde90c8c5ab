"""Where a stage's data comes from (loaders, a DataModule, the model), several evaluation
loaders, and evaluating a checkpoint with ckpt_path."""

from __future__ import annotations

import copy
import os
import warnings

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

from callbacks import ModelCheckpoint
from tests._models import Classifier, dataset, loader, quiet
from trainer import DataModule, Trainer, TrainModule


class Data(DataModule):
    """Records what the Trainer called, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def prepare_data(self):
        self.calls.append("prepare_data")

    def setup(self, stage):
        self.calls.append(f"setup:{stage}")
        self.train, self.val = dataset(64, seed=1), dataset(32, seed=2)

    def teardown(self, stage):
        self.calls.append(f"teardown:{stage}")

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=16)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=16)

    def test_dataloader(self):
        return DataLoader(self.val, batch_size=8)


class WithLoaders(Classifier):
    def train_dataloader(self):
        return loader(64, 16)

    def val_dataloader(self):
        return loader(32, 16)


def test_a_datamodule_gives_fit_and_test_their_loaders_and_runs_its_hooks_in_order():
    torch.manual_seed(0)
    model, dm = Classifier(), Data()
    reference = copy.deepcopy(model)
    trainer = Trainer(max_epochs=2, **quiet())
    trainer.fit(model, datamodule=dm)
    assert dm.calls == ["prepare_data", "setup:fit", "teardown:fit"]
    assert "val_loss" in trainer.callback_metrics
    # The same as passing the DataModule's loaders by hand.
    Trainer(max_epochs=2, **quiet()).fit(reference, loader(64, 16), DataLoader(dataset(32, seed=2), batch_size=16))
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), reference.state_dict().values()))
    result = trainer.test(model, datamodule=dm)
    assert dm.calls[3:] == ["prepare_data", "setup:test", "teardown:test"]
    assert result == trainer.test(model, DataLoader(dataset(32, seed=2), batch_size=8))
    Trainer(max_steps=1, **quiet()).fit(Classifier(), dm)  # fit(model, dm), as Lightning allows


def test_a_datamodule_prints_which_loaders_it_gives_and_their_sizes():
    dm = Data()
    assert str(dm).split(os.linesep) == [  # before setup no loader can be made
        "{Train dataloader: None}", "{Validation dataloader: None}", "{Test dataloader: None}", "{Predict dataloader: None}",
    ]
    dm.setup("fit")
    dm.predict_dataloader = lambda: [DataLoader(dm.val), DataLoader(_NoLen())]
    assert str(dm).split(os.linesep) == [
        "{Train dataloader: size=64}", "{Validation dataloader: size=32}", "{Test dataloader: size=32}",
        "{Predict dataloader: 1. size=32 ; 2. size=NA}",
    ]


class _NoLen(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(3))


def test_the_model_can_define_its_own_loaders():
    trainer = Trainer(max_epochs=1, **quiet())
    trainer.fit(WithLoaders())
    assert trainer.global_step == 4 and "val_loss" in trainer.callback_metrics
    assert [set(r) for r in trainer.validate(WithLoaders())] == [{"val_loss", "val_acc"}]


def test_the_data_must_come_from_one_place_and_be_there():
    trainer = Trainer(max_epochs=1, **quiet())
    with pytest.raises(ValueError, match=r"Both train_dataloaders and datamodule= were given.*Drop datamodule= to use "
                                         r"the loaders, or drop train_dataloaders to use the DataModule's"):
        trainer.fit(Classifier(), loader(), datamodule=Data())
    with pytest.raises(TypeError, match=r"trainer.fit\(\) has no data: train_dataloaders=None, and no datamodule= was "
                                         r"given and Classifier does not define train_dataloader\(\)"):
        trainer.fit(Classifier())

    class OnlyTrain(DataModule):
        def train_dataloader(self):
            return loader()

    with pytest.raises(TypeError, match=r"An invalid dataloader was passed to `Trainer.test\(dataloaders=...\)`. Found None. "
                                        r"Either pass the dataloader to the `.test\(\)` method OR implement `def "
                                        r"test_dataloader\(self\):`.* the DataModule OnlyTrain does not define test_dataloader\(\)"):
        trainer.test(Classifier(), datamodule=OnlyTrain())
    with pytest.raises(TypeError, match=r"datamodule=.* must be a trainer.DataModule"):
        trainer.fit(Classifier(), datamodule=object())


@pytest.mark.parametrize("stage, argument, method", [
    ("fit", "train_dataloaders", "train_dataloader"), ("validate", "dataloaders", "val_dataloader"),
    ("test", "dataloaders", "test_dataloader"), ("predict", "dataloaders", "predict_dataloader"),
])
def test_a_loader_that_cannot_be_iterated_is_named_where_it_came_from_in_lightnings_words(stage, argument, method):
    trainer = Trainer(max_epochs=1, **quiet())
    for bad, found in ((object(), "<object object"), ([1, object()], "1")):  # a list holding a non-iterable: Lightning's too
        with pytest.raises(TypeError, match=rf"An invalid dataloader was passed to `Trainer.{stage}\({argument}=...\)`. "
                                            rf"Found {found}"):
            getattr(trainer, stage)(Classifier(), **{argument: bad})
    model = Classifier()
    setattr(model, method, lambda: None)  # a loader method that returns nothing
    with pytest.raises(TypeError, match=rf"An invalid dataloader was returned from `Classifier.{method}\(\)`. Found None\. "
                                        rf"Classifier.{method}\(\)=None is not iterable"):
        getattr(trainer, stage)(model)


class Indexed(Classifier):
    """validation_step takes dataloader_idx; the hooks record the index they get."""

    def __init__(self) -> None:
        super().__init__()
        self.step_idx: list[int] = []
        self.hook_idx: list[int] = []

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        self.step_idx.append(dataloader_idx)
        super().validation_step(batch, batch_idx)

    def test_step(self, batch, batch_idx, dataloader_idx=0):
        self.log("test_loss", nn.functional.cross_entropy(self(batch[0]), batch[1]))
        self.log("idx", float(dataloader_idx))

    def on_validation_batch_end(self, outputs, batch, batch_idx, dataloader_idx=0):
        self.hook_idx.append(dataloader_idx)

    def on_validation_epoch_end(self):
        self.log("epoch_value", 7.0)


def test_several_validation_loaders_keep_their_metrics_apart_like_each_loader_alone():
    torch.manual_seed(0)
    model = Indexed()
    first, second = DataLoader(dataset(32, seed=3), batch_size=16), DataLoader(dataset(48, seed=4), batch_size=16)
    trainer = Trainer(**quiet())
    results = trainer.validate(model, [first, second])
    assert model.step_idx == [0, 0, 1, 1, 1] and model.hook_idx == [0, 0, 1, 1, 1]
    alone = [*trainer.validate(model, first), *trainer.validate(model, second)]
    for i, (result, single) in enumerate(zip(results, alone)):
        assert result == {
            f"val_loss/dataloader_idx_{i}": single["val_loss"], f"val_acc/dataloader_idx_{i}": single["val_acc"],
            "epoch_value": 7.0,
        }
    # A dict of loaders: one result per loader in the dict's order, suffixed with its index there (Lightning's names).
    by_name = trainer.validate(model, {"clean": first, "noisy": second})
    assert by_name[0]["val_loss/dataloader_idx_0"] == alone[0]["val_loss"]
    assert by_name[1]["val_acc/dataloader_idx_1"] == alone[1]["val_acc"]
    assert not any("clean" in name or "noisy" in name for name in trainer.callback_metrics)
    assert trainer.test(model, [first, second])[1]["idx/dataloader_idx_1"] == 1.0


def test_several_validation_loaders_during_fit_reach_callback_metrics_and_tensorboard():
    model = Classifier()
    trainer = Trainer(max_epochs=2, enable_progress_bar=False, callbacks=[ModelCheckpoint(monitor="val_loss/dataloader_idx_1")])
    trainer.fit(model, loader(64), [loader(32), DataLoader(dataset(16, seed=9), batch_size=8)])
    assert {"val_loss/dataloader_idx_0", "val_loss/dataloader_idx_1"} <= set(trainer.callback_metrics)
    assert trainer.val_dataloaders is not None and len(trainer.val_dataloaders) == 2
    acc = EventAccumulator(trainer.run_dir)
    acc.Reload()
    assert [e.step for e in acc.Scalars("val_loss/dataloader_idx_1")] == [3, 7]  # each epoch's last step's
    assert trainer.checkpoint_callback.best_model_path.endswith(".ckpt")


def test_predict_returns_one_list_per_loader_a_dicts_too():
    model = Classifier()
    trainer = Trainer(**quiet())
    one = trainer.predict(model, loader(32, 16))
    several = trainer.predict(model, [loader(32, 16), loader(16, 8)])
    named = trainer.predict(model, {"a": loader(16, 8), "b": loader(8, 8)})
    assert len(several) == 2 and all(torch.equal(a, b) for a, b in zip(several[0], one))
    # Lightning's: a list per loader, a dict's in its order
    assert [len(p) for p in several] == [2, 2] and isinstance(named, list) and [len(p) for p in named] == [2, 1]
    # One loader in a list is one loader, as in Lightning: its own list of predictions
    assert all(torch.equal(a, b) for a, b in zip(trainer.predict(model, [loader(32, 16)]), one))


class ArgsSteps(Classifier):
    """Steps that take *args: Lightning passes dataloader_idx only with several loaders."""

    def __init__(self) -> None:
        super().__init__()
        self.args: list[tuple] = []

    def validation_step(self, *args):
        self.args.append(tuple(a if isinstance(a, int) else "batch" for a in args))


def test_dataloader_idx_reaches_the_step_exactly_when_there_are_several_loaders():
    model, trainer = ArgsSteps(), Trainer(**quiet())
    trainer.validate(model, loader(16, 8), verbose=False)
    trainer.validate(model, [loader(8, 8)], verbose=False)  # a list of one: one loader
    assert model.args == [("batch", 0), ("batch", 1), ("batch", 0)]
    model.args.clear()
    trainer.validate(model, [loader(8, 8), loader(8, 8)], verbose=False)
    assert model.args == [("batch", 0, 0), ("batch", 0, 1)]

    class Requires(Classifier):
        def validation_step(self, batch, batch_idx, dataloader_idx):
            pass

    with pytest.raises(RuntimeError, match=r"You provided only a single `val_dataloader`, but have included `dataloader_idx` in `Requires.validation_step\(\)`"):
        trainer.validate(Requires(), loader(8, 8))
    with pytest.raises(RuntimeError, match=r"You provided multiple `val_dataloader`, but no `dataloader_idx` argument in `Best.validation_step\(\)`"):
        trainer.validate(Best(), [loader(8, 8), loader(8, 8)])


# --- ckpt_path for validate, test and predict ---------------------------------------------
class Best(Classifier):
    """Logs a validation score that is best (lowest) at the first epoch's end."""

    def validation_step(self, batch, batch_idx):
        self.log("score", float(self.trainer.current_epoch))


def _weights(path: str) -> dict:
    return torch.load(path, weights_only=True)["state_dict"]


def test_validate_with_ckpt_path_best_last_or_a_file_evaluates_those_weights_at_the_trainers_step(tmp_path):
    model = Best()
    trainer = Trainer(max_epochs=3, enable_progress_bar=False, callbacks=[ModelCheckpoint(monitor="score", save_last=True)])
    trainer.fit(model, loader(64), loader(32))
    best = trainer.checkpoint_callback.best_model_path
    assert "epoch=0" in best and trainer.global_step == 12
    final = copy.deepcopy(model.state_dict())

    expected = Classifier()
    expected.load_state_dict(_weights(best))
    metrics = trainer.validate(model, loader(32), ckpt_path="best")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), expected.state_dict().values()))
    assert metrics == [{"score": 3.0}]  # Lightning's: the checkpoint's weights, the Trainer's own counters (epoch 3)
    assert trainer.global_step == 12
    acc = EventAccumulator(trainer.run_dir)
    acc.Reload()
    # Logged at the Trainer's step. The newest by wall time: TensorBoard orders the event files
    # of one second by a counter compared as text, so in a busy process "...10" sorts before "...9".
    assert max(acc.Scalars("score"), key=lambda e: e.wall_time).step == 12

    trainer.test(model, loader(32), ckpt_path="last")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), final.values()))
    predictions = trainer.predict(model, loader(16, 16), ckpt_path=best)
    assert torch.equal(predictions[0], expected(dataset(16).tensors[0]).argmax(-1))


def test_ckpt_path_best_explains_when_there_is_no_best():
    # Lightning's sentences first, then ours
    with pytest.raises(ValueError, match=r'^`.validate\(ckpt_path="best"\)` is set but `ModelCheckpoint` is not configured to '
                       r"save the best model. It has saved no checkpoint yet"):
        Trainer(log_dir=None, enable_progress_bar=False).validate(Classifier(), loader(), ckpt_path="best")
    with pytest.raises(ValueError, match=r'^`.test\(ckpt_path="best"\)` is set but `ModelCheckpoint` is not configured. '
                       r".*\(enable_checkpointing=False\)"):
        Trainer(**quiet()).test(Classifier(), loader(), ckpt_path="best")
    with pytest.raises(ValueError, match=r"ckpt_path='best' is for validate, test and predict"):
        Trainer(max_epochs=1, **quiet()).fit(Classifier(), loader(), ckpt_path="best")


def test_ckpt_path_last_with_no_checkpoint_warns_and_evaluates_the_model_as_it_is(tmp_path):
    model = Classifier()
    trainer = Trainer(enable_progress_bar=False, log_dir=tmp_path)
    with pytest.warns(UserWarning, match=r'^.test\(ckpt_path="last"\) is set, but there is no last checkpoint available. '
                      r"No checkpoint will be loaded. .*starting from scratch"):
        metrics = trainer.test(model, loader(32), ckpt_path="last", verbose=False)
    assert trainer.ckpt_path is None
    assert metrics == Trainer(**quiet()).test(model, loader(32), verbose=False)  # the model's own weights
    with pytest.raises(ValueError, match=r"ckpt_path='nope.ckpt' does not exist. Pass an existing file, 'best' or 'last', or None"):
        Trainer(**quiet()).test(Classifier(), loader(), ckpt_path="nope.ckpt")


class Scales(DataModule):
    """Lightning's DataModule batch hooks: they change each batch before the step sees it."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def train_dataloader(self):
        return loader(16, 8)

    def test_dataloader(self):
        return loader(16, 8)

    def on_before_batch_transfer(self, batch, dataloader_idx):
        self.calls.append("before")
        return batch

    def transfer_batch_to_device(self, batch, device, dataloader_idx):
        self.calls.append("transfer")
        x, y = batch
        return x.to(device) * 0, y.to(device)

    def on_after_batch_transfer(self, batch, dataloader_idx):
        self.calls.append("after")
        return batch


class SeesInputs(Classifier):
    def __init__(self) -> None:
        super().__init__()
        self.sums: list[float] = []

    def training_step(self, batch, batch_idx):
        self.sums.append(float(batch[0].abs().sum()))
        return super().training_step(batch, batch_idx)

    def test_step(self, batch, batch_idx, dataloader_idx=0):
        self.sums.append(float(batch[0].abs().sum()))


def test_a_datamodules_batch_hooks_run_in_fit_and_test_and_win_over_the_models():
    dm, model = Scales(), SeesInputs()
    trainer = Trainer(max_epochs=1, **quiet())
    trainer.fit(model, datamodule=dm)
    trainer.test(model, datamodule=dm, verbose=False)
    assert dm.calls == ["before", "transfer", "after"] * 4 and model.sums == [0.0] * 4

    class AlsoMoves(SeesInputs):
        def transfer_batch_to_device(self, batch, device, dataloader_idx):
            raise AssertionError("the DataModule's hook is used")

    with pytest.warns(UserWarning, match="overridden `transfer_batch_to_device` in both `LightningModule` and `LightningDataModule`"):
        Trainer(max_steps=1, **quiet()).fit(AlsoMoves(), datamodule=Scales())


def test_a_loader_method_set_to_none_on_the_instance_is_not_defined():
    class OwnLoaders(Classifier):
        def train_dataloader(self):
            return loader(32)

        def val_dataloader(self):
            raise AssertionError("set to None: not called")

    model = OwnLoaders()
    model.val_dataloader = None  # as Lightning's tests and scripts undefine a hook
    model.validation_step = None
    trainer = Trainer(max_steps=2, **quiet())
    trainer.fit(model)
    assert trainer.global_step == 2 and trainer.val_dataloaders is None


def test_the_default_predict_step_takes_several_loaders_and_overfit_without_validation_step_validates_nothing():
    class Forward(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(8, 2)

        def forward(self, batch):
            return self.layer(batch[0])

    out = Trainer(**quiet()).predict(Forward(), [loader(8, 4), loader(4, 4)])
    assert [len(o) for o in out] == [2, 1]
    model = Classifier()
    model.validation_step = None
    trainer = Trainer(max_epochs=1, overfit_batches=2, **quiet())
    trainer.fit(model, loader(64))
    assert trainer.num_val_batches == [] and trainer.num_training_batches == 2


@pytest.mark.parametrize("save_last", [True, False])
def test_evaluating_last_takes_the_last_ckpt_file_and_without_one_the_models_own_weights(save_last):
    cb = ModelCheckpoint(dirpath="ck", save_last=save_last)
    trainer = Trainer(**quiet(max_epochs=1, callbacks=[cb]))
    trainer.fit(Classifier(), loader(32), loader(16))
    if save_last:
        trainer.validate(dataloaders=loader(16), ckpt_path="last")
        assert trainer.ckpt_path == cb.last_model_path == os.path.abspath("ck/last.ckpt")
    else:  # an epoch file is there, but "last" means Lightning's last.ckpt
        with pytest.warns(UserWarning, match="No checkpoint will be loaded"):
            trainer.validate(dataloaders=loader(16), ckpt_path="last")
        assert trainer.ckpt_path is None and os.listdir("ck") == ["epoch=0-step=2.ckpt"]


class StepAndEpoch(Classifier):
    def test_step(self, batch, batch_idx, dataloader_idx=0):
        loss = super().validation_step(batch, batch_idx)
        self.log("test_loss", torch.tensor(float(batch_idx)), on_step=True, on_epoch=True)
        self.log("hidden", 1.0, logger=False)
        return loss


@pytest.mark.parametrize("several", [False, True])
def test_test_results_hold_the_epoch_values_the_loggers_got_not_the_step_rows(several):
    data = [loader(32), loader(32)] if several else loader(32)
    trainer = Trainer(**quiet(max_epochs=1))
    results = trainer.test(StepAndEpoch(), data, verbose=False)
    suffix = [f"/dataloader_idx_{i}" for i in range(2)] if several else [""]
    # Lightning's metrics["log"]: no test_loss_step rows, no plain test_loss alias, no logger=False value
    assert [set(r) for r in results] == [{f"{name}{s}" for name in ("test_loss_epoch", "val_loss", "val_acc")} for s in suffix]


def test_each_loaders_result_holds_what_its_steps_logged_without_the_suffix_too():
    class Unsuffixed(Classifier):
        def test_step(self, batch, batch_idx, dataloader_idx=0):
            self.log("common", 789.0)
            self.log(f"only_{dataloader_idx}", 321.0 * (dataloader_idx + 1), add_dataloader_idx=False)

        def on_test_epoch_end(self):
            self.log("at_the_end", 3.0)

    results = Trainer(**quiet()).test(Unsuffixed(), [loader(16, 8), loader(16, 8)], verbose=False)
    assert results == [
        {"common/dataloader_idx_0": 789.0, "only_0": 321.0, "at_the_end": 3.0},
        {"common/dataloader_idx_1": 789.0, "only_1": 642.0, "at_the_end": 3.0},
    ]


class EpochRecording(SequentialSampler):
    """A sampler that records the epochs it is told (as a DistributedSampler would shuffle by them)."""

    def __init__(self, data) -> None:
        super().__init__(data)
        self.epochs: list[int] = []

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


@pytest.mark.parametrize("batch_sampler", [False, True])
def test_training_and_evaluation_samplers_are_told_each_epoch_once(batch_sampler):
    def made() -> DataLoader:
        data = dataset(16)
        sampler = EpochRecording(data)
        if batch_sampler:
            return DataLoader(data, batch_sampler=BatchSampler(sampler, 8, drop_last=False))
        return DataLoader(data, sampler=sampler, batch_size=8)

    def sampler_of(dl: DataLoader) -> EpochRecording:
        return dl.batch_sampler.sampler if batch_sampler else dl.sampler

    train, val = made(), made()
    trainer = Trainer(max_epochs=2, limit_train_batches=1, limit_val_batches=1, **quiet())
    trainer.fit(Classifier(), train, val)
    assert sampler_of(train).epochs == [0, 1]
    assert sampler_of(val).epochs == [0, 0, 1]  # the sanity check, then each epoch's validation
    again = made()
    trainer.validate(Classifier(), again, verbose=False)
    assert sampler_of(again).epochs == [2]  # the epoch fit ended at, as Lightning's


@pytest.mark.slow  # starts a worker process
def test_spawned_workers_that_do_not_persist_get_lightnings_advice():
    spawned = DataLoader(dataset(16), batch_size=8, num_workers=1, multiprocessing_context="spawn")
    with pytest.warns(UserWarning, match=r"Consider setting `persistent_workers=True` in 'train_dataloader' to speed up"):
        Trainer(max_steps=1, **quiet()).fit(Classifier(), spawned)
    persistent = DataLoader(dataset(16), batch_size=8, num_workers=1, multiprocessing_context="spawn", persistent_workers=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="Consider setting `persistent_workers")
        Trainer(max_steps=1, **quiet()).fit(Classifier(), persistent)


def test_lists_of_plain_values_are_loaders_and_predictions_come_back_per_loader():
    class Echo(Classifier):
        def predict_step(self, batch, batch_idx, dataloader_idx=0):
            return batch, batch_idx, dataloader_idx

    trainer = Trainer(**quiet())
    assert trainer.predict(Echo(), [0, 1]) == [(0, 0, 0), (1, 1, 0)]  # one loader of two batches
    assert trainer.predict(Echo(), {"a": [0, 1], "b": [2]}) == [[(0, 0, 0), (1, 1, 0)], [(2, 0, 1)]]
    assert trainer.predict(Echo(), [[0, 1], [2]]) == [[(0, 0, 0), (1, 1, 0)], [(2, 0, 1)]]
