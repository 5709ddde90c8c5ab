"""The Trainer's side of callbacks (trainer/loops/hooks.py)."""

from __future__ import annotations

import pickle

from tests._models import Classifier, loader, quiet
from trainer import Trainer


def test_a_fitted_trainer_with_a_checkpoint_callback_pickles_as_lightnings_does():
    # Lightning's tests pickle a progress bar (it holds the Trainer) and torch.save a fitted model
    trainer = Trainer(max_epochs=1, **quiet(enable_checkpointing=True))
    trainer.fit(Classifier(), loader(32))
    restored = pickle.loads(pickle.dumps(trainer))
    assert restored.global_step == trainer.global_step
