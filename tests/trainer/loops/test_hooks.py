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


def test_each_callback_is_called_for_the_hooks_it_overrides_and_wants_however_it_overrides_them():
    from unittest import mock

    from callbacks import Callback
    from trainer.loops.hooks import Hooks

    class Mixin:
        def on_fit_start(self, trainer, module):
            pass

    class Base(Callback):
        def on_train_start(self, trainer, module):
            pass

    class Child(Mixin, Base):  # hooks from a mixin before Callback and from a base class
        on_validation_start = Callback.on_validation_start  # the base's own function: not an override

        def wants_hook(self, hook):
            return hook != "on_train_start"  # declined for this run

    class After(Callback, Mixin):  # Callback's no-op comes first: not an override
        pass

    child, after, lam, spec = Child(), After(), Callback(), mock.Mock(spec=Callback)
    lam.on_train_end = lambda trainer, module: None  # an instance attribute, as LambdaCallback attaches them
    hooks = Hooks([child, after, lam, spec])
    assert hooks.on_fit_start == [child.on_fit_start, spec.on_fit_start]
    assert hooks.on_train_start == [spec.on_train_start]
    assert hooks.on_validation_start == [spec.on_validation_start]
    assert hooks.on_train_end == [lam.on_train_end, spec.on_train_end]
    assert Hooks([]).on_fit_start == [] and Hooks([]).module_hooks == {}
