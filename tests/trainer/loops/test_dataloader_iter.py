"""Steps that take ``dataloader_iter`` (Lightning's experimental flavour): the step draws its batches."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from trainer import Trainer, TrainModule
from trainer.core.exceptions import MisconfigurationException

pytestmark = pytest.mark.filterwarnings("ignore:Found `dataloader_iter`")


def data(n: int = 16, batch: int = 2) -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(n * 4, dtype=torch.float32).view(n, 4)), batch_size=batch)


class TwoPerStep(TrainModule):
    """Each step draws two batches: a global batch made of two micro-batches."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.fetched = {"train": [], "val": [], "test": [], "predict": []}

    def _two(self, dataloader_iter, stage):
        got = []
        for _ in range(2):
            try:
                batch, batch_idx, dataloader_idx = next(dataloader_iter)
            except StopIteration:
                break
            self.fetched[stage].append((batch_idx, dataloader_idx))
            got.append(batch[0])
        return torch.cat(got)

    def training_step(self, dataloader_iter):
        loss = self.layer(self._two(dataloader_iter, "train")).pow(2).mean()
        self.log("loss", loss, batch_size=4)
        return loss

    def validation_step(self, dataloader_iter):
        self.log("val_loss", self.layer(self._two(dataloader_iter, "val")).mean())

    def test_step(self, dataloader_iter):
        self.log("test_loss", self.layer(self._two(dataloader_iter, "test")).mean())

    def predict_step(self, dataloader_iter):
        return self.layer(self._two(dataloader_iter, "predict"))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def trainer(**options) -> Trainer:
    return Trainer(
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, **options
    )


def test_a_training_step_taking_dataloader_iter_draws_its_batches_and_steps_once_per_call(recwarn):
    model = TwoPerStep()
    t = trainer(max_epochs=1, limit_train_batches=6, num_sanity_val_steps=2)
    t.fit(model, data(), data())
    assert [i for i, _ in model.fetched["train"]] == [0, 1, 2, 3, 4, 5]  # the limit counts batches, not steps
    assert t.global_step == 3
    assert [i for i, _ in model.fetched["val"]] == [0, 1] + list(range(8))  # the sanity check's 2, then all 8
    assert "val_loss" in t.callback_metrics
    assert any("Found `dataloader_iter` argument in the `training_step`" in str(w.message) for w in recwarn)


def test_the_batch_hooks_get_the_last_batch_the_step_fetched():
    seen = []

    class Hooks(Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            seen.append(("start", None if batch is None else batch[0][0, 0].item(), batch_idx))

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            seen.append(("end", batch[0][0, 0].item(), batch_idx))

    trainer(max_epochs=1, limit_train_batches=4, limit_val_batches=0, callbacks=[Hooks()]).fit(TwoPerStep(), data())
    # batch k starts at row 2k, whose first value is 8k
    assert seen == [("start", None, 0), ("end", 8.0, 1), ("start", 8.0, 1), ("end", 24.0, 3)]


def test_evaluation_with_dataloader_iter_goes_through_every_loader_in_turn():
    model = TwoPerStep()
    t = trainer(limit_test_batches=3)
    t.test(model, [data(8), data(8)])
    # 3 batches of each loader; the second step takes loader 0's last and loader 1's first
    assert model.fetched["test"] == [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]
    predictions = trainer().predict(model, data(8))
    assert len(predictions) == 2 and predictions[0].shape == (4, 1)


def test_a_stop_iteration_from_the_step_ends_the_epoch():
    class StopsAfterTwo(TwoPerStep):
        def training_step(self, dataloader_iter):
            if self.trainer.global_step == 2:
                raise StopIteration
            return super().training_step(dataloader_iter)

    model = StopsAfterTwo()
    t = trainer(max_epochs=1, limit_val_batches=0)
    t.fit(model, data())
    assert t.global_step == 2 and len(model.fetched["train"]) == 4


def test_self_log_in_a_dataloader_iter_training_step_needs_batch_size():
    class NoBatchSize(TwoPerStep):
        def training_step(self, dataloader_iter):
            loss = self.layer(self._two(dataloader_iter, "train")).mean()
            self.log("loss", loss)
            return loss

    with pytest.raises(MisconfigurationException, match=r"self\.log\(\.\.\., batch_size=\.\.\.\)` should be provided"):
        trainer(max_epochs=1, limit_val_batches=0).fit(NoBatchSize(), data())


def test_the_batches_reach_the_step_as_the_loader_gives_them_without_the_transfer_hooks():
    class Transfers(TwoPerStep):
        calls = 0

        def on_before_batch_transfer(self, batch, dataloader_idx):
            Transfers.calls += 1
            return batch

    trainer(max_epochs=1, limit_train_batches=2, limit_val_batches=0).fit(Transfers(), data())
    assert Transfers.calls == 0  # Lightning's: the step fetches, and moves, its batches itself


class Records(TrainModule):
    """Records what the batch hooks get and what each step fetches: ``(batch, batch_idx, dataloader_idx)``."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(1, 1)
        self.starts, self.fetched, self.ends = [], [], []

    def _start(self, batch, batch_idx, dataloader_idx=0):
        self.starts.append((batch, batch_idx, dataloader_idx))

    def _step(self, dataloader_iter):
        self.fetched.append(next(dataloader_iter))

    def _end(self, outputs, batch, batch_idx, dataloader_idx=0):
        self.ends.append((batch, batch_idx, dataloader_idx))

    on_train_batch_start = on_validation_batch_start = on_predict_batch_start = _start
    training_step = validation_step = predict_step = _step
    on_train_batch_end = on_validation_batch_end = on_predict_batch_end = _end

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_a_dict_of_lists_of_values_is_several_loaders_for_a_dataloader_iter_step():
    # Lightning's rule: a list of plain values is one loader, so the dict holds two
    fit = Records()
    trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=0).fit(fit, {"a": [0, 1], "b": [2, 3]})
    assert fit.fetched == [({"a": 0, "b": 2}, 0, 0), ({"a": 1, "b": 3}, 1, 0)]  # training combines them
    assert fit.starts == [(None, 0, 0), ({"a": 0, "b": 2}, 0, 0)] and fit.ends == fit.fetched
    val = Records()
    trainer(limit_val_batches=1).validate(val, {"a": [0, 1], "b": [2, 3]})
    assert val.fetched == [(0, 0, 0), (2, 0, 1)] and val.starts == [(None, 0, 0), (0, 0, 0)]  # one loader at a time
    assert val.ends == val.fetched
    predict = Records()
    trainer().predict(predict, [[0, 1], [2, 3]])
    assert predict.fetched == [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)] and predict.ends == predict.fetched
