"""Nothing good is lost: a save of NaN weights is refused and keeps the last finite checkpoint,
and a checkpoint whose bytes changed on disk (its zip CRCs no longer match) is never resumed or
loaded in silence: "last" falls back to the newest intact file, an explicit path is an error."""

from __future__ import annotations

import glob
import os
import shutil
import zipfile

import pytest
import torch

from callbacks import Callback, ModelCheckpoint
from tests._models import Classifier, loader, quiet
from trainer import CheckpointError, Trainer
from trainer.checkpoint.integrity import damage


class DivergesAt(Classifier):
    """Trains normally, then from optimizer step ``step`` on its loss is NaN, and so, after
    that step, are its weights."""

    def __init__(self, step: int = 10**9, **kwargs) -> None:
        super().__init__(**kwargs)
        self.diverge_at = step

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if self.trainer.global_step >= self.diverge_at else loss


class StartStep(Callback):
    def on_train_start(self, trainer, module):
        self.step = trainer.global_step
        self.weights = {k: v.clone() for k, v in module.state_dict().items()}


def _fit(model, epochs, ckpt_path=None, callbacks=(), **kw):
    # 32 samples in batches of 8: 4 steps an epoch. The NaN loss check runs at logging steps (1, 50):
    # a loss that turns NaN at step 6 is not caught by it before the epoch-end save at step 8.
    t = Trainer(**quiet(enable_checkpointing=True, max_epochs=epochs, callbacks=list(callbacks), **kw))
    t.fit(model, loader(32, batch_size=8), ckpt_path=ckpt_path)
    return t


def _finite(path: str) -> bool:
    ckpt = torch.load(path, weights_only=True)
    return all(torch.isfinite(v).all() for v in ckpt["state_dict"].values())


# --- a NaN never replaces the last good model ------------------------------------------------
def test_a_save_of_nan_weights_is_refused_and_last_resumes_the_last_finite_state():
    with pytest.raises(CheckpointError, match=r"Not saving a checkpoint into '.*checkpoints' at step 8 \(epoch 1\): "
                                              r"the weight 'net.0.weight' holds NaN or infinite values.*are kept"):
        _fit(DivergesAt(step=6), epochs=3, callbacks=[ModelCheckpoint(save_last=True)])

    # save_top_k=1 would have deleted epoch 0's file for epoch 1's NaN one, and last.ckpt moved on.
    assert sorted(os.listdir("checkpoints")) == ["epoch=0-step=4.ckpt", "last.ckpt"]
    assert _finite("checkpoints/last.ckpt") and _finite("checkpoints/epoch=0-step=4.ckpt")

    kept = torch.load("checkpoints/epoch=0-step=4.ckpt", weights_only=True)["state_dict"]
    start = StartStep()
    _fit(DivergesAt(), epochs=3, ckpt_path="last", callbacks=[start, ModelCheckpoint(save_last=True)])
    assert start.step == 4 and all(torch.equal(start.weights[k], v) for k, v in kept.items())
    assert _finite("checkpoints/last.ckpt") and torch.load("checkpoints/last.ckpt", weights_only=True)["global_step"] == 12


def test_a_nan_optimizer_state_is_refused_too_and_save_checkpoint_keeps_the_file():
    t = _fit(Classifier(optimizer="adam", lr=0.01), epochs=1, callbacks=[ModelCheckpoint(save_last=True)])
    with open("checkpoints/last.ckpt", "rb") as f:
        before = f.read()
    first = next(iter(t.optimizer.state.values()))
    first["exp_avg_sq"].fill_(float("inf"))  # weights still finite; Adam's next step would not be

    with pytest.raises(CheckpointError, match=r"Not saving 'checkpoints/last.ckpt' at step 4.*optimizer 0's 'exp_avg_sq' of 'net.0.weight'"):
        t.save_checkpoint("checkpoints/last.ckpt")
    with open("checkpoints/last.ckpt", "rb") as f:
        assert f.read() == before


class CausalMask(Classifier):
    """A buffer that holds -inf by design, as a transformer's causal mask does."""

    def __init__(self, persistent: bool):
        super().__init__()
        self.register_buffer("mask", torch.full((4, 4), float("-inf")).triu(1), persistent=persistent)


@pytest.mark.parametrize("persistent", [False, True])
def test_a_buffer_that_holds_infinity_by_design_does_not_stop_the_saves(persistent):
    _fit(CausalMask(persistent), epochs=2, callbacks=[ModelCheckpoint(save_last=True)])
    saved = torch.load("checkpoints/last.ckpt", weights_only=True)
    assert saved["global_step"] == 8 and ("mask" in saved["state_dict"]) == persistent


@pytest.mark.slow
@pytest.mark.usefixtures("ranks_from_the_fork_server")  # ranks fork from a warm server: see tests/conftest.py
def test_under_ddp_every_rank_refuses_the_save_together(tmp_path):
    # Each rank checks its own tensors, one all-reduce decides: no rank waits in a save the others skip.
    with pytest.raises(Exception, match=r"Not saving a checkpoint .* at step 4 \(epoch 1\): the weight 'net.0.weight'"):
        _fit(DivergesAt(step=2), epochs=3, strategy="ddp", devices=2, callbacks=[ModelCheckpoint(save_last=True)])
    assert sorted(os.listdir("checkpoints")) == ["epoch=0-step=2.ckpt", "last.ckpt"]
    assert _finite("checkpoints/last.ckpt")


# --- damaged files ----------------------------------------------------------------------------
def _flip_16_bytes_inside_a_weight(path: str) -> None:
    """Change 16 bytes in the middle of the largest tensor's data, in place: same size, same
    zip structure, and torch.load reads it back without a word."""
    with zipfile.ZipFile(path) as archive:
        entry = max((e for e in archive.infolist() if "/data/" in e.filename), key=lambda e: e.file_size)
    with open(path, "r+b") as f:
        f.seek(entry.header_offset + 26)
        name_len, extra_len = int.from_bytes(f.read(2), "little"), int.from_bytes(f.read(2), "little")
        start = entry.header_offset + 30 + name_len + extra_len + entry.file_size // 2
        f.seek(start)
        data = f.read(16)
        f.seek(start)
        f.write(bytes(b ^ 0xFF for b in data))


def test_a_damaged_last_ckpt_falls_back_to_the_newest_intact_checkpoint_naming_both():
    _fit(Classifier(), epochs=2, callbacks=[ModelCheckpoint(every_n_train_steps=1, save_top_k=3, monitor="step", mode="max", save_last=True)])
    # last.ckpt is a hard link to the newest top-k file (step 8): damaging it damages both.
    _flip_16_bytes_inside_a_weight("checkpoints/last.ckpt")
    damaged = torch.load("checkpoints/last.ckpt", weights_only=True)["state_dict"]  # what resumed in silence before
    intact = torch.load("checkpoints/epoch=1-step=7.ckpt", weights_only=True)["state_dict"]
    assert any(not torch.equal(damaged[k], v) for k, v in intact.items())

    start = StartStep()
    with pytest.warns(UserWarning, match=r"skipping .*last.ckpt: '.*last.ckpt' is damaged: the bytes of entry .* do not match "
                                         r"its CRC-32.* Resuming from .*epoch=1-step=7.ckpt instead, the newest intact checkpoint"):
        _fit(Classifier(), epochs=3, ckpt_path="last", callbacks=[start, ModelCheckpoint(every_n_train_steps=1, save_top_k=3, monitor="step", mode="max", save_last=True)])

    assert start.step == 7
    assert all(torch.equal(start.weights[k], v) for k, v in intact.items())


def test_a_damaged_file_passed_by_path_is_an_error_naming_it():
    _fit(Classifier(), epochs=1)
    shutil.copy(glob.glob("checkpoints/epoch=*.ckpt")[0], "damaged.ckpt")
    _flip_16_bytes_inside_a_weight("damaged.ckpt")
    torch.load("damaged.ckpt", weights_only=True)  # torch itself does not notice

    message = r"'damaged.ckpt' is damaged: the bytes of entry '.*/data/\d+' do not match its CRC-32"
    with pytest.raises(CheckpointError, match=message):
        Classifier.load_from_checkpoint("damaged.ckpt")
    with pytest.raises(CheckpointError, match=message):
        _fit(Classifier(), epochs=2, ckpt_path="damaged.ckpt")
    with pytest.raises(CheckpointError, match=message):
        Trainer(**quiet()).test(Classifier(), loader(16), ckpt_path="damaged.ckpt", verbose=False)


def test_every_file_the_trainer_writes_passes_the_check():
    t = _fit(Classifier(optimizer="adam", lr=0.01), epochs=2, callbacks=[ModelCheckpoint(every_n_train_steps=3, save_top_k=-1, save_last="link")])
    t.save_checkpoint("direct.ckpt")
    t.save_checkpoint("weights.ckpt", weights_only=True)
    files = glob.glob("checkpoints/*.ckpt") + ["direct.ckpt", "weights.ckpt"]
    assert len(files) >= 5 and [damage(f) for f in files] == [None] * len(files)
    with open("direct.ckpt", "rb") as whole, open("cut.ckpt", "wb") as cut:  # and a file cut short is named as broken
        cut.write(whole.read()[:-100])
    assert "zip structure is broken" in damage("cut.ckpt")
