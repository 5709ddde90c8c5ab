"""On one device, with every default on, fit's weights equal a hand-written loop's, bit for bit."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader

from tests._models import Classifier, dataset
from trainer import Trainer, seed_everything


def _hand_written(epochs: int, with_val: bool) -> dict[str, torch.Tensor]:
    seed_everything(0)
    model = Classifier(dropout=0.3, optimizer="adam", lr=0.01)
    train = DataLoader(dataset(200), batch_size=16, shuffle=True)
    val = DataLoader(dataset(64, seed=2), batch_size=32)
    opt = model.configure_optimizers()
    for _ in range(epochs):
        model.train()
        for x, y in train:
            loss = nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if with_val:
            model.eval()
            with torch.no_grad():
                for x, _ in val:
                    model(x)
    return model.state_dict()


def _trainer(epochs: int, with_val: bool) -> tuple[dict[str, torch.Tensor], Trainer]:
    seed_everything(0)
    model = Classifier(dropout=0.3, optimizer="adam", lr=0.01)
    train = DataLoader(dataset(200), batch_size=16, shuffle=True)
    val = DataLoader(dataset(64, seed=2), batch_size=32) if with_val else None
    trainer = Trainer(max_epochs=epochs, log_every_n_steps=5)  # progress bar, TensorBoard, checkpoints: on
    trainer.fit(model, train, val)
    return model.state_dict(), trainer


def _assert_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), f"{key} differs"


def test_fit_equals_hand_written_loop_with_shuffle_and_dropout():
    expected = _hand_written(epochs=3, with_val=False)
    got, trainer = _trainer(epochs=3, with_val=False)
    _assert_equal(expected, got)
    assert trainer.global_step == 3 * 13 and trainer.current_epoch == 3
    # The defaults really were on: a checkpoint and an event file exist.
    assert trainer.checkpoint_callback.best_model_path.endswith("epoch=2-step=39.ckpt")
    assert any(p.name.startswith("events.out.tfevents") for p in __import__("pathlib").Path(trainer.run_dir).iterdir())


def test_validation_does_not_disturb_the_rng_stream_beyond_what_a_loop_does():
    expected = _hand_written(epochs=2, with_val=True)
    got, _ = _trainer(epochs=2, with_val=True)
    _assert_equal(expected, got)
