"""trainer.utilities.parsing: Lightning's parsing helpers, as a user calls them."""

from __future__ import annotations

import inspect
import threading

import pytest
import torch

from trainer import DataModule, Trainer, TrainModule
from trainer.loops.run import record_data
from trainer.utilities.parsing import (
    clean_namespace, collect_init_args, get_init_args, is_picklable, lightning_getattr, lightning_hasattr,
    lightning_setattr, parse_class_init_keys,
)


def _local_function():
    return None


def test_is_picklable_says_what_pickle_can_write():
    class Local:
        pass

    assert all(is_picklable(v) is True for v in (None, True, 3, "s", (1, "a"), max))
    assert all(is_picklable(v) is False for v in (lambda: None, Local, threading.Lock()))


def test_clean_namespace_drops_what_cannot_be_pickled_and_says_which():
    hparams = {"lr": 0.1, "fn": lambda: None, "n": 3}
    with pytest.warns(UserWarning, match="Attribute 'fn' removed from hparams because it cannot be pickled"):
        clean_namespace(hparams)
    assert hparams == {"lr": 0.1, "n": 3}


def test_parse_class_init_keys_names_self_args_and_kwargs():
    class WithBoth:
        def __init__(this, hparams, *rest, flag=1, **options):
            pass

    class WithNone:
        def __init__(self, a):
            pass

    assert parse_class_init_keys(WithBoth) == ("this", "rest", "options")
    assert parse_class_init_keys(WithNone) == ("self", None, None)


def test_collect_init_args_walks_the_super_chain_innermost_first():
    class Parent:
        def __init__(self, a, b=2, **kwargs):
            super().__init__()
            self.chain = collect_init_args(inspect.currentframe(), [])
            self.own = get_init_args(inspect.currentframe())

    class Child(Parent):
        def __init__(self, a, c, b=2, **kwargs):
            super().__init__(a, b=b, **kwargs)

    child = Child(1, 3, b=4, extra=5)
    assert child.chain == [{"a": 1, "b": 4, "extra": 5}, {"a": 1, "c": 3, "b": 4, "extra": 5}]
    assert child.own == {"a": 1, "b": 4, "extra": 5}


class _Net(TrainModule):
    def __init__(self, lr: float = 0.1):
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(2, 1)


class _Data(DataModule):
    def __init__(self, batch_size: int = 8):
        super().__init__()
        self.save_hyperparameters()


def test_getattr_and_setattr_search_the_model_its_hparams_and_the_datamodule():
    model, trainer = _Net(), Trainer(logger=False, enable_checkpointing=False)
    record_data(trainer, _Data(batch_size=16))  # as a call records it: trainer.datamodule is read-only, as in Lightning
    model.trainer = trainer
    assert lightning_hasattr(model, "lr") and lightning_getattr(model, "lr") == 0.1
    assert lightning_getattr(model, "batch_size") == 16  # from the DataModule's hparams
    lightning_setattr(model, "batch_size", 32)
    lightning_setattr(model, "lr", 0.5)
    assert trainer.datamodule.hparams.batch_size == 32 and model.hparams.lr == 0.5
    assert not lightning_hasattr(model, "missing")
    with pytest.raises(AttributeError, match="missing is neither stored in the model namespace nor the `hparams`"):
        lightning_getattr(model, "missing")
    with pytest.raises(AttributeError, match="nor the datamodule"):
        lightning_setattr(model, "missing", 1)
