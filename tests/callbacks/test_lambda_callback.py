"""LambdaCallback: plain functions run as hooks, and bad hook names are caught when built."""

from __future__ import annotations

import pytest

from callbacks import Callback, LambdaCallback
from callbacks.base import HOOKS
from tests._models import Classifier, loader, quiet
from trainer import Trainer


def test_the_given_functions_run_with_the_hook_arguments():
    calls: list[tuple] = []
    cb = LambdaCallback(
        on_train_epoch_end=lambda trainer, module: calls.append(("epoch_end", trainer.current_epoch)),
        on_train_batch_end=lambda trainer, module, outputs, batch, batch_idx: calls.append(("batch_end", batch_idx)),
        setup=lambda trainer, module, stage: calls.append(("setup", stage)),
    )
    trainer = Trainer(**quiet(callbacks=[cb], max_epochs=2))
    trainer.fit(Classifier(), loader(16, batch_size=8))
    assert calls == [
        ("setup", "fit"),
        ("batch_end", 0), ("batch_end", 1), ("epoch_end", 0),
        ("batch_end", 0), ("batch_end", 1), ("epoch_end", 1),
    ]


def test_hooks_not_given_stay_the_base_no_ops():
    cb = LambdaCallback(on_fit_end=print)
    assert cb.on_fit_end is print
    assert type(cb).on_train_batch_end is Callback.on_train_batch_end


def test_an_unknown_hook_name_is_a_type_error_listing_the_valid_ones():
    with pytest.raises(TypeError) as info:
        LambdaCallback(on_train_batch_ends=print)
    message = str(info.value)
    assert "unknown hook 'on_train_batch_ends'" in message and "Did you mean 'on_train_batch_end'?" in message
    assert all(name in message for name in HOOKS)


def test_a_value_that_is_not_callable_is_a_type_error():
    with pytest.raises(TypeError, match=r"LambdaCallback\(on_fit_start=3\): the value must be a function"):
        LambdaCallback(on_fit_start=3)
