"""BasePredictionWriter and predict(return_predictions=False): real files, read back."""

from __future__ import annotations

import gc
import os
import weakref

import pytest
import torch
from torch.utils.data import DataLoader

from callbacks import BasePredictionWriter
from tests._models import Classifier, dataset, loader, quiet
from trainer import Trainer


class Logits(Classifier):
    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return self(batch[0]) + dataloader_idx


class FileWriter(BasePredictionWriter):
    """Each batch to ``<folder>/rank<r>_loader<d>_batch<i>.pt``, with its indices; or the whole pass."""

    def __init__(self, folder: str, write_interval: str = "batch") -> None:
        super().__init__(write_interval)
        self.folder = folder
        os.makedirs(folder, exist_ok=True)

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        rank = trainer.strategy.global_rank
        torch.save({"prediction": prediction, "indices": batch_indices},
                   os.path.join(self.folder, f"rank{rank}_loader{dataloader_idx}_batch{batch_idx}.pt"))

    def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
        rank = trainer.strategy.global_rank
        torch.save({"predictions": predictions, "indices": batch_indices}, os.path.join(self.folder, f"epoch_rank{rank}.pt"))


def reassemble(folder: str, n: int, prefix: str = "") -> torch.Tensor:
    """Every written batch put back in the dataset's order by its indices."""
    out: torch.Tensor | None = None
    for name in os.listdir(folder):
        if name.startswith(prefix) and "batch" in name:
            part = torch.load(os.path.join(folder, name))
            if out is None:
                out = torch.full((n, part["prediction"].shape[1]), float("nan"))
            out[torch.tensor(part["indices"])] = part["prediction"]
    assert out is not None and not out.isnan().any(), "some samples were never written"
    return out


def test_batch_writer_writes_every_batch_with_its_indices_and_returns_nothing(tmp_path):
    model = Logits()
    expected = torch.cat(Trainer(**quiet()).predict(model, loader(50, 8)))
    shuffled = DataLoader(dataset(50), batch_size=8, shuffle=True)
    trainer = Trainer(callbacks=[FileWriter(str(tmp_path / "out"))], **quiet())
    assert trainer.predict(model, shuffled, return_predictions=False) is None
    assert len(os.listdir(tmp_path / "out")) == 7
    # the same rows, batched differently: equal up to float rounding
    torch.testing.assert_close(reassemble(str(tmp_path / "out"), 50), expected)


def test_epoch_writer_gets_each_loaders_predictions_and_indices(tmp_path):
    model = Logits()
    writer = FileWriter(str(tmp_path / "out"), "batch_and_epoch")
    returned = Trainer(callbacks=[writer], **quiet()).predict(model, [loader(20, 8), loader(12, 4)])
    written = torch.load(tmp_path / "out" / "epoch_rank0.pt")
    assert [len(p) for p in written["predictions"]] == [3, 3]
    assert written["indices"] == [[list(range(0, 8)), list(range(8, 16)), [16, 17, 18, 19]],
                                  [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]]
    for got, want in zip(written["predictions"], returned):
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert torch.equal(written["predictions"][1][0], model(dataset(12).tensors[0][:4]) + 1)  # dataloader_idx reached the step
    names = sorted(n for n in os.listdir(tmp_path / "out") if n.startswith("rank0_loader1"))
    assert names == ["rank0_loader1_batch0.pt", "rank0_loader1_batch1.pt", "rank0_loader1_batch2.pt"]


class Remembers(Classifier):
    """Keeps a weak reference to each output: alive only while something holds it."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[weakref.ref] = []

    def predict_step(self, batch, batch_idx):
        out = self(batch[0])
        self.refs.append(weakref.ref(out))
        return out


class Counts(BasePredictionWriter):
    def __init__(self) -> None:
        super().__init__("batch")
        self.rows = 0

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        self.rows += len(prediction)


@pytest.mark.parametrize("keep", [False, True])
def test_return_predictions_false_keeps_no_output(keep):
    model, writer = Remembers(), Counts()
    trainer = Trainer(callbacks=[writer], **quiet())
    result = trainer.predict(model, loader(400, 2), return_predictions=keep)
    gc.collect()
    alive = sum(ref() is not None for ref in model.refs)
    assert len(model.refs) == 200 and writer.rows == 400
    if keep:
        assert alive == 200 and len(result) == 200
    else:
        assert result is None and alive == 0


def test_bad_write_interval_is_a_sentence():
    with pytest.raises(ValueError, match=r"write_interval='step'.*'batch', 'epoch', 'batch_and_epoch'"):
        BasePredictionWriter("step")


def test_writer_without_its_method_says_which_to_override():
    with pytest.raises(NotImplementedError, match="must override write_on_batch_end"):
        Trainer(callbacks=[BasePredictionWriter()], **quiet()).predict(Logits(), loader(8, 4))


def test_return_predictions_must_be_a_bool():
    with pytest.raises(TypeError, match="return_predictions='no'"):
        Trainer(**quiet()).predict(Logits(), loader(8, 4), return_predictions="no")


@pytest.mark.slow
@pytest.mark.usefixtures("ranks_from_the_fork_server")  # ranks fork from a warm server: see tests/conftest.py
def test_ddp_ranks_write_their_parts_and_the_indices_put_them_back_in_order(tmp_path):
    torch.manual_seed(0)
    model = Logits()
    data = loader(45, 4)  # 23 samples on rank 0, 22 on rank 1
    expected = torch.cat(Trainer(**quiet()).predict(model, data))
    folder = str(tmp_path / "out")
    trainer = Trainer(strategy="ddp", devices=2, callbacks=[FileWriter(folder, "batch_and_epoch")], **quiet())
    assert trainer.predict(model, data, return_predictions=False) is None
    assert {n[:5] for n in os.listdir(folder) if "batch" in n} == {"rank0", "rank1"}
    torch.testing.assert_close(reassemble(folder, 45), expected)  # batched differently: up to rounding
    epoch = [torch.load(os.path.join(folder, f"epoch_rank{r}.pt")) for r in (0, 1)]
    order = torch.tensor([i for part in epoch for batch in part["indices"][0] for i in batch])
    rows = torch.cat([torch.cat(part["predictions"]) for part in epoch])
    assert sorted(order.tolist()) == list(range(45))
    torch.testing.assert_close(rows[order.argsort()], expected)


class Indices(BasePredictionWriter):
    def __init__(self):
        super().__init__("batch_and_epoch")
        self.batches, self.epoch = [], None

    def write_on_batch_end(self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
        self.batches.append(batch_indices)

    def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
        self.epoch = batch_indices


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_batch_indices_are_each_batchs_own_with_worker_processes_too(workers):
    # Workers are given a few batches' indices before the first batch is asked for: those count too.
    writer = Indices()
    data = DataLoader(dataset(64), batch_size=4, num_workers=workers)
    Trainer(**quiet(callbacks=[writer], limit_predict_batches=4)).predict(Logits(), data, return_predictions=False)
    expected = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert writer.batches == expected and writer.epoch == [expected]
