"""validate/test/predict with no model after fit: the fitted model, its data, the best weights."""

from __future__ import annotations

import pytest
import torch

from callbacks import ModelCheckpoint
from tests._models import Classifier, loader, quiet
from trainer import DataModule, Trainer


def one(results):
    """validate/test's result for one loader: a dict (or Lightning's list of one dict)."""
    return results[0] if isinstance(results, list) else results


class Data(DataModule):
    def train_dataloader(self):
        return loader(64, 16)

    def val_dataloader(self):
        return loader(32, 16)

    def test_dataloader(self):
        return loader(48, 16)

    def predict_dataloader(self):
        return loader(24, 8)


class Worsens(Classifier):
    """Ruined at the start of each epoch after the first: the best checkpoint is epoch 0's."""

    def on_train_epoch_start(self):
        with torch.no_grad():
            for p in self.parameters():
                p.add_(5.0 if self.trainer.current_epoch else 0.0)


def test_after_fit_with_a_datamodule_uses_the_best_checkpoint(trainer_log):
    model, data = Worsens(), Data()
    trainer = Trainer(max_epochs=3, seed=0, enable_progress_bar=False, log_dir=None,
                      callbacks=[ModelCheckpoint(monitor="val_loss", save_top_k=1, dirpath="ckpts")])
    trainer.fit(model, datamodule=data)
    best = trainer.checkpoint_callback.best_model_path
    assert best.endswith(".ckpt") and "epoch=0" in best
    saved = torch.load(best, weights_only=False)
    best_weights = saved.get("state_dict", saved.get("model"))
    with pytest.warns(UserWarning, match=r"^`.validate\(ckpt_path=None\)` was called without a model. The best model of "
                      r"the previous `fit` call will be used."):  # Lightning's
        metrics = one(trainer.validate())
    err = "\n".join(trainer_log)
    assert f"best checkpoint's weights ({best})" in err and "Worsens" in err
    assert all(torch.equal(v, best_weights[k]) for k, v in model.state_dict().items())
    assert metrics["val_loss"] == pytest.approx(float(trainer.checkpoint_callback.best_model_score), rel=1e-5)
    assert set(one(trainer.test())) == {"test_loss"}  # the DataModule's test loader
    assert sum(len(p) for p in trainer.predict()) == 24  # its predict loader


def test_after_fit_with_loaders_validates_on_fits_val_loader_with_current_weights(trainer_log):
    model = Classifier()
    trainer = Trainer(max_epochs=1, **quiet())
    trainer.fit(model, loader(64, 16), loader(32, 16))
    metrics = one(trainer.validate())
    assert "no best checkpoint was saved" in trainer_log[-1]
    assert metrics == one(Trainer(**quiet()).validate(model, loader(32, 16)))
    assert len(trainer.predict(dataloaders=loader(16, 8))) == 2
    with pytest.raises(TypeError, match=r"trainer.test\(\) has no data"):
        trainer.test()  # fit had no test data, and the model defines no test_dataloader


def test_without_a_model_and_before_fit_is_a_sentence():
    with pytest.raises((TypeError, ValueError), match=r"trainer.validate\(\).* (has not run fit|none has run)"):
        Trainer(**quiet()).validate()


def test_a_ckpt_path_set_on_the_trainer_wins_over_the_best_in_silence(recwarn):
    model = Worsens()
    trainer = Trainer(max_epochs=2, seed=0, enable_progress_bar=False, log_dir=None,
                      callbacks=[ModelCheckpoint(monitor="val_loss", save_top_k=-1, dirpath="ckpts")])
    trainer.fit(model, datamodule=Data())
    chosen = trainer.checkpoint_callback.dirpath + "/epoch=1-step=8.ckpt"
    assert "epoch=0" in trainer.checkpoint_callback.best_model_path  # not the one chosen
    trainer.ckpt_path = chosen  # Lightning's stateful use: the next calls load it
    recwarn.clear()
    trainer.validate()
    assert trainer.ckpt_path == chosen
    assert not [w for w in recwarn if "was called" in str(w.message)]  # neither "best" nor "you passed ckpt_path="
    saved = torch.load(chosen, weights_only=True)["state_dict"]
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
