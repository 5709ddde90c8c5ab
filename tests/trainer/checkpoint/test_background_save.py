"""Background saves of a big state: the copy reuses the previous copy's memory, every file holds
the state of its own step, and a NaN is refused on the writer thread with the last good files kept."""

from __future__ import annotations

import io
import os
import zipfile

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback, ModelCheckpoint
from trainer import Trainer, TrainModule
from trainer.checkpoint import integrity
from trainer.checkpoint.background_save import snapshot
from trainer.checkpoint.files import CheckpointError

WIDTH = 1536  # 9 MiB a weight, 27 MiB with Adam's two moments: above what is serialized inline (16 MiB)


def test_a_snapshot_copies_into_the_spare_storages_it_is_given_and_equals_the_state():
    state = {"w": torch.randn(64, 64), "view": torch.arange(10.0)[2:5], "n": 3}
    first_memo: dict = {}
    first = snapshot(state, memo=first_memo)
    spares: dict = {}
    for storage in first_memo.values():
        spares.setdefault(storage.nbytes(), []).append(storage)
    addresses = {s.data_ptr() for s in first_memo.values()}
    state["w"].add_(1.0)
    second = snapshot(state, spares)
    assert second["w"].untyped_storage().data_ptr() in addresses  # the first copy's memory, not new memory
    assert second["view"].untyped_storage().data_ptr() in addresses
    assert torch.equal(second["w"], state["w"]) and torch.equal(second["view"], state["view"]) and second["n"] == 3
    state["w"].add_(1.0)
    assert not torch.equal(second["w"], state["w"])  # a copy: training goes on changing the original


class Wide(TrainModule):
    def __init__(self, nan_at: int | None = None) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, 1)
        self.nan_at = nan_at

    def training_step(self, batch, batch_idx):
        loss = nn.functional.mse_loss(self.b(torch.relu(self.a(batch[0]))), batch[1])
        return loss * float("nan") if self.nan_at is not None and self.global_step >= self.nan_at else loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class Weights(Callback):
    """The weights after each step, as the saves at that step must hold them."""

    def __init__(self) -> None:
        self.at: dict[int, torch.Tensor] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.at[trainer.global_step] = pl_module.a.weight.detach().clone()


def _fit(tmp_path, model: Wide, steps: int, *callbacks: Callback) -> Trainer:
    data = TensorDataset(torch.randn(8 * steps, WIDTH), torch.randn(8 * steps, 1))
    trainer = Trainer(max_steps=steps, logger=False, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=list(callbacks))
    trainer.fit(model, DataLoader(data, batch_size=8))
    return trainer


def test_every_background_save_of_a_big_state_holds_the_weights_of_its_own_step(tmp_path):
    weights = Weights()
    _fit(tmp_path, Wide(), 6, weights, ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1))
    assert sorted(os.listdir(tmp_path)) == ["epoch=0-step=2.ckpt", "epoch=0-step=4.ckpt", "epoch=0-step=6.ckpt"]
    for step in (2, 4, 6):
        saved = torch.load(tmp_path / f"epoch=0-step={step}.ckpt", weights_only=True)
        assert saved["global_step"] == step
        assert torch.equal(saved["state_dict"]["a.weight"], weights.at[step])
        assert len(saved["optimizer_states"][0]["state"]) == 4


def test_a_nan_in_a_big_state_is_refused_on_the_writer_thread_and_the_last_good_files_stay(tmp_path):
    checkpoint = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=1, save_last=True)
    with pytest.raises(CheckpointError, match=r"Not saving a checkpoint into .* at step 4 \(epoch 0\): the weight "
                                              r"'a.weight' holds NaN or infinite values"):
        _fit(tmp_path, Wide(nan_at=2), 8, checkpoint)
    assert sorted(os.listdir(tmp_path)) == ["epoch=0-step=2.ckpt", "last.ckpt"]  # top 1 kept, last.ckpt not moved on
    for name in ("epoch=0-step=2.ckpt", "last.ckpt"):
        saved = torch.load(tmp_path / name, weights_only=True)
        assert saved["global_step"] == 2 and all(torch.isfinite(v).all() for v in saved["state_dict"].values())


def test_a_big_background_save_is_torch_saves_bytes_with_every_crc_and_resumes(tmp_path):
    from torch.utils.serialization import config

    before, config.save.compute_crc32 = config.save.compute_crc32, False  # a user's choice: torch.save skips CRCs
    try:
        _fit(tmp_path, Wide(), 2, ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2))
    finally:
        config.save.compute_crc32 = before
    path = tmp_path / "epoch=0-step=2.ckpt"
    saved = torch.load(path, weights_only=True)
    expected = io.BytesIO()
    torch.save(saved, expected)
    assert path.read_bytes() == expected.getvalue()  # the CRCs zlib filled in on the writer thread are torch's
    assert zipfile.ZipFile(path).testzip() is None and integrity.damage(path) is None
    resumed = Trainer(max_steps=3, logger=False, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False)
    resumed.fit(Wide(), DataLoader(TensorDataset(torch.randn(24, WIDTH), torch.randn(24, 1)), batch_size=8),
                ckpt_path=str(path))  # the load checks every CRC first
    assert resumed.global_step == 3


def test_freeze_serializes_a_plain_cpu_state_and_copies_anything_else():
    import numpy as np

    from trainer.checkpoint.background_save import SERIALIZE_INLINE_MAX, freeze
    from trainer.checkpoint.files import Encoded, plain_size

    w = torch.zeros(4, 4)
    loops = {"fit_loop": {"epoch_progress": {"total": {"ready": 3, "completed": 3}}, "flags": [True, None, 1.5, "a"]}}
    state = {"state_dict": {"w": w, "tied": w}, "loops": loops, "shape": (torch.Size([4]), torch.float32, b"x")}
    assert plain_size(state) == 2 * w.untyped_storage().nbytes()  # each tensor counted, as the check for size wants
    assert isinstance(freeze(state), Encoded)
    for odd in ({"x": np.float64(0.5)}, {1.5j: 1}, {"x": [1, {"y": object()}]}, {"x": (1, [2, np.int64(3)])}):
        assert plain_size({"loops": loops, **odd}) is None
        assert not isinstance(freeze({"loops": loops, **odd}), Encoded)  # not plain: a copy, checked by loading back
    meta = {"w": torch.zeros(2, device="meta")}
    assert plain_size(meta) == 8 and plain_size(meta, cpu_only=True) is None
    assert plain_size({"big": torch.zeros(SERIALIZE_INLINE_MAX // 4 + 1)}) > SERIALIZE_INLINE_MAX
    assert not isinstance(freeze({"big": torch.zeros(SERIALIZE_INLINE_MAX // 4 + 1)}), Encoded)
