"""Lightning scripts with only the imports renamed: the README autoencoder, the bug-report
BoringModel (fit, validate, test, predict, and the hooks' order), the demo Transformer and LSTM,
a GAN with manual optimization, a DataModule, and the checkpoint workflow. Each asserts what a
Lightning user would check. Lightning's ``default_root_dir=`` is ``log_dir=`` until the Trainer
takes that name."""

from __future__ import annotations

import copy
import glob
import os

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.data import DataLoader

import trainer as L  # was: import lightning as L
from callbacks import EarlyStopping, ModelCheckpoint  # was: from lightning.pytorch.callbacks import ...

from tests.compat._lit import (
    GAN, BoringModel, LightningLSTM, LightningTransformer, LitAutoEncoder, LitClassifier, MNISTDataModule,
    RandomDataset, tiny_mnist, tokens,
)


def _scalars(root: str) -> dict[str, list[float]]:
    (events,) = glob.glob(os.path.join(root, "**", "events.out.tfevents.*"), recursive=True)
    acc = EventAccumulator(events)
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_readme_autoencoder():
    autoencoder = LitAutoEncoder()
    before = copy.deepcopy(autoencoder.state_dict())
    train_loader = DataLoader(tiny_mnist(64), batch_size=8)
    trainer = L.Trainer(limit_train_batches=4, max_epochs=2, log_every_n_steps=1, log_dir="logs", enable_progress_bar=False)
    trainer.fit(model=autoencoder, train_dataloaders=train_loader)
    assert trainer.global_step == 8 and trainer.current_epoch == 2
    assert not torch.equal(before["encoder.0.weight"], autoencoder.encoder[0].weight)
    assert len(_scalars("logs")["train_loss"]) == 8  # one point per step
    assert os.path.isfile(trainer.checkpoint_callback.best_model_path)
    assert trainer.checkpoint_callback.last_model_path == ""  # as in Lightning: no last.ckpt unless save_last
    embedding = autoencoder(torch.rand(4, 64))
    assert embedding.shape == (4, 3)


def test_bug_report_boring_model_fit_validate_test_predict_and_hook_order():
    train_data = DataLoader(RandomDataset(32, 64), batch_size=2)
    val_data = DataLoader(RandomDataset(32, 64), batch_size=2)
    test_data = DataLoader(RandomDataset(32, 64), batch_size=2)
    model = BoringModel()
    trainer = L.Trainer(
        log_dir=".", limit_train_batches=2, limit_val_batches=1, limit_test_batches=1, num_sanity_val_steps=0,
        max_epochs=1, enable_model_summary=False, enable_progress_bar=False,
    )
    trainer.fit(model, train_dataloaders=train_data, val_dataloaders=val_data)
    batch = [
        "on_train_batch_start", "on_before_zero_grad", "on_before_backward", "on_after_backward",
        "on_before_optimizer_step", "on_train_batch_end",
    ]
    assert model.called == [
        "on_fit_start", "on_train_start", "on_train_epoch_start", *batch, *batch,
        "on_validation_epoch_start", "on_validation_epoch_end", "on_train_epoch_end", "on_train_end", "on_fit_end",
    ]
    assert {"train_loss", "valid_loss"} <= set(trainer.callback_metrics)
    for evaluate, data, key in ((trainer.validate, val_data, "valid_loss"), (trainer.test, test_data, "test_loss")):
        result = evaluate(model, dataloaders=data)[0]  # Lightning: one dict per loader, in a list
        assert set(result) == {key} and result[key] == trainer.callback_metrics[key]
        assert set(trainer.callback_metrics) == {key}  # each call starts afresh, as Lightning's
    predictions = trainer.predict(model, dataloaders=DataLoader(RandomDataset(32, 6), batch_size=2))
    assert len(predictions) == 3 and all(p.shape == (2, 2) for p in predictions)


def test_validate_returns_a_list_of_one_dict_per_loader():
    model = BoringModel()
    trainer = L.Trainer(log_dir=None, enable_progress_bar=False, enable_model_summary=False)
    assert isinstance(trainer.validate(model, DataLoader(RandomDataset(32, 4), batch_size=2)), list)


def test_demo_transformer_logs_step_and_epoch_values():
    model = LightningTransformer(vocab_size=20)
    trainer = L.Trainer(max_epochs=2, log_every_n_steps=1, log_dir="logs", enable_progress_bar=False, enable_checkpointing=False)
    trainer.fit(model, DataLoader(tokens(16), batch_size=4))
    scalars = _scalars("logs")
    assert len(scalars["train_loss_step"]) == 8 and len(scalars["train_loss_epoch"]) == 2
    assert scalars["train_loss_epoch"][1] == pytest.approx(trainer.callback_metrics["train_loss_epoch"].item())
    assert trainer.callback_metrics["train_loss"] == trainer.callback_metrics["train_loss_epoch"]
    assert model.hparams.vocab_size == 20


def test_demo_lstm_with_its_sequence_sampler_and_hidden_state():
    model = LightningLSTM(vocab_size=20)
    trainer = L.Trainer(max_epochs=2, gradient_clip_val=0.25, log_dir=None, enable_progress_bar=False, enable_checkpointing=False)
    trainer.fit(model)
    assert trainer.global_step == 20 and model.hidden_resets == 2  # 10 batches of 4 per epoch
    assert torch.isfinite(torch.tensor(trainer.callback_metrics["train_loss"]))


def test_gan_with_manual_optimization_steps_both_networks():
    model = GAN()
    g0, d0 = copy.deepcopy(model.generator), copy.deepcopy(model.discriminator)
    trainer = L.Trainer(max_epochs=1, log_every_n_steps=1, log_dir=None, enable_progress_bar=False, enable_checkpointing=False)
    trainer.fit(model, DataLoader(tiny_mnist(32), batch_size=8))
    assert trainer.global_step == 8  # every optimizer.step() counts: two a batch
    assert not torch.equal(g0[0].weight, model.generator[0].weight) and not torch.equal(d0[0].weight, model.discriminator[0].weight)
    assert {"g_loss", "d_loss"} <= set(trainer.callback_metrics) and {"g_loss", "d_loss"} <= trainer.prog_bar_names
    assert all(p.requires_grad for p in model.parameters())  # untoggled


def test_datamodule_fit_test_predict():
    dm = MNISTDataModule(data_dir="data", batch_size=16)
    model = LitClassifier()
    trainer = L.Trainer(max_epochs=2, log_dir=None, enable_progress_bar=False, enable_checkpointing=False)
    trainer.fit(model, datamodule=dm)
    assert os.path.isfile(os.path.join("data", "mnist.pt"))  # prepare_data ran
    # on_epoch=True in training_step: name_epoch (name_step reaches callback_metrics every log_every_n_steps)
    assert {"train_loss", "train_loss_epoch", "val_loss", "val_acc"} <= set(trainer.callback_metrics)
    result = trainer.test(model, datamodule=dm)
    result = result[0] if isinstance(result, list) else result
    assert set(result) == {"test_loss"}
    predictions = trainer.predict(model, datamodule=dm)
    assert torch.cat(predictions).shape == (96,)
    assert dm.stages == ["fit", "test", "predict"] and dm.hparams.batch_size == 16 and dm.trainer is trainer


def test_checkpoint_workflow_best_model_path_load_from_checkpoint_and_test():
    dm = MNISTDataModule(data_dir="data", batch_size=16)
    model = LitClassifier(hidden_dim=12)
    checkpoint = ModelCheckpoint(monitor="val_loss", mode="min", save_top_k=1, filename="{epoch}-{val_loss:.3f}")
    trainer = L.Trainer(
        max_epochs=3, log_dir="logs", enable_progress_bar=False,
        callbacks=[checkpoint, EarlyStopping(monitor="val_loss", patience=5)],
    )
    trainer.fit(model, datamodule=dm)
    best = trainer.checkpoint_callback.best_model_path
    assert best and os.path.isfile(best) and os.path.basename(best).startswith("epoch=")
    assert checkpoint.best_model_score is not None
    loaded = LitClassifier.load_from_checkpoint(best)
    assert loaded.hparams.hidden_dim == 12 and loaded.l1.out_features == 12 and not loaded.training
    saved = torch.load(best, weights_only=True)
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, saved["state_dict"][name]), name  # where Lightning keeps the weights
    result = trainer.test(model, datamodule=dm, ckpt_path="best")
    result = result[0] if isinstance(result, list) else result
    direct = L.Trainer(log_dir=None, enable_progress_bar=False).test(loaded, datamodule=dm)
    direct = direct[0] if isinstance(direct, list) else direct
    assert result["test_loss"] == pytest.approx(direct["test_loss"])


@pytest.mark.slow
@pytest.mark.usefixtures("ranks_from_the_fork_server")  # ranks fork from a warm server: see tests/conftest.py
def test_boring_model_under_ddp_with_two_processes():
    model = BoringModel()
    trainer = L.Trainer(
        strategy="ddp", devices=2, log_dir="logs", limit_train_batches=4, limit_val_batches=2, max_epochs=2,
        enable_progress_bar=False, enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(RandomDataset(32, 64), batch_size=2), DataLoader(RandomDataset(32, 64), batch_size=2))
    assert trainer.global_step == 8 and {"train_loss", "valid_loss"} <= set(trainer.callback_metrics)
    assert os.path.isfile(trainer.checkpoint_callback.best_model_path)
    assert trainer.checkpoint_callback.last_model_path == ""  # as in Lightning: no last.ckpt unless save_last
    scalars = _scalars("logs")  # 4 steps an epoch, under log_every_n_steps=50: epoch values only
    assert len(scalars["valid_loss"]) == 2  # training_step's defaults have none (Lightning's on_epoch=False)
    assert "train_loss" not in scalars and "train_loss_epoch" not in scalars
