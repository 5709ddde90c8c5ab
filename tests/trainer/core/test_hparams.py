"""trainer/core/hparams.py: save_hyperparameters and hparams as Lightning has them, and checkpoints
that stay loadable with weights_only=True when __init__ takes a network or partials."""

from __future__ import annotations

import argparse
import functools
import os
import warnings
from collections.abc import Mapping

import pytest
import torch
from torch import nn

from callbacks import ModelCheckpoint
from tests._models import Classifier, loader, quiet
from trainer import DataModule, Trainer, TrainModule
from trainer.core.hparams import checkpoint_hparams


class AllArgs(TrainModule):
    def __init__(self, lr: float = 0.1, hidden: int = 4, *, name: str = "x", **extra) -> None:
        super().__init__()
        self.save_hyperparameters()


def test_all_init_arguments_by_attribute_and_item():
    model = AllArgs(0.5, name="y", depth=3)
    assert model.hparams == {"lr": 0.5, "hidden": 4, "name": "y", "depth": 3}
    assert model.hparams.lr == 0.5 and model.hparams["hidden"] == 4
    model.hparams.lr = 0.25
    assert model.hparams["lr"] == 0.25 and model.hparams_initial.lr == 0.5  # initial is frozen
    with pytest.raises(AttributeError, match=r"hparams has no 'missing'.*\['depth', 'hidden', 'lr', 'name'\]"):
        model.hparams.missing


class Named(TrainModule):
    def __init__(self, lr: float, hidden: int, seed: int) -> None:
        super().__init__()
        self.save_hyperparameters("lr", "hidden")


class Ignoring(TrainModule):
    def __init__(self, lr: float, hidden: int, seed: int) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["seed"], logger=False)


class FromConfig(TrainModule):
    def __init__(self, config) -> None:
        super().__init__()
        self.save_hyperparameters(config)


class Child(AllArgs):
    def __init__(self, width: int = 2, lr: float = 0.3) -> None:
        super().__init__(lr=lr)


def test_named_ignored_dict_namespace_and_subclass_arguments():
    assert Named(0.1, 8, 3).hparams == {"lr": 0.1, "hidden": 8}
    ignoring = Ignoring(0.1, 8, 3)
    assert ignoring.hparams == {"lr": 0.1, "hidden": 8} and ignoring._log_hyperparams is False
    assert FromConfig({"a": 1}).hparams.a == 1
    assert FromConfig(argparse.Namespace(b=2)).hparams == {"b": 2}
    assert Child(width=5).hparams == {"width": 5, "lr": 0.3, "hidden": 4, "name": "x"}
    with pytest.raises(ValueError, match=r"'depth' is not an argument of Bad.__init__ .*\['lr'\]"):
        Bad()


class Bad(TrainModule):
    def __init__(self, lr: float = 1.0) -> None:
        super().__init__()
        self.save_hyperparameters("depth")


class Template(TrainModule):
    """The popular template: the network, and the optimizer and scheduler as partials."""

    def __init__(self, net: nn.Module, optimizer, scheduler, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters(logger=False)
        self.net = net

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        opt = self.hparams.optimizer(params=self.parameters())
        return {"optimizer": opt, "lr_scheduler": self.hparams.scheduler(optimizer=opt)}


def test_template_with_a_network_and_partials_checkpoints_plain_data_and_says_what_to_pass():
    net = nn.Linear(8, 2)
    with pytest.warns(UserWarning, match=r"Attribute 'net' is an instance of `nn.Module` and is already saved.*ignore=\['net'\]"):
        model = Template(net, functools.partial(torch.optim.SGD, lr=0.1), functools.partial(torch.optim.lr_scheduler.StepLR, step_size=1))
    assert model.hparams.net is net  # in memory, the very objects
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(max_epochs=2, callbacks=[ModelCheckpoint(dirpath="ck")], **quiet(enable_checkpointing=True)).fit(model, loader(32))
    left_out = [str(w.message) for w in caught if "not plain data" in str(w.message)]
    assert len(left_out) == 1, left_out  # one warning for the run, naming both partials (not the network again)
    assert "'optimizer' (partial), 'scheduler' (partial)" in left_out[0] and "net" not in left_out[0].split(":")[1]
    path = os.path.join("ck", "epoch=1-step=4.ckpt")
    ckpt = torch.load(path, weights_only=True)  # loadable without running pickled code
    assert ckpt["hyper_parameters"] == {"lr": 0.1} and ckpt["steadytrainer"]["hparams_left_out"] == ["net", "optimizer", "scheduler"]
    with pytest.raises(TypeError, match=r"left out 'net', 'optimizer', 'scheduler'.*load_from_checkpoint\(path, net=\.\.\., optimizer=\.\.\., scheduler=\.\.\.\)"):
        Template.load_from_checkpoint(path)
    with pytest.warns(UserWarning, match="'net' is an instance of `nn.Module`"):
        loaded = Template.load_from_checkpoint(path, net=nn.Linear(8, 2), optimizer=None, scheduler=None, weights_only=True)
    assert torch.equal(loaded.net.weight, model.net.weight) and not loaded.training


class Data(DataModule):
    def __init__(self, batch_size: int = 8, root: str = "data") -> None:
        super().__init__()
        self.save_hyperparameters()


def test_datamodule_hparams():
    dm = Data(batch_size=4)
    assert dm.hparams.batch_size == 4 and dm.hparams == {"batch_size": 4, "root": "data"}


def test_a_subclass_ignore_drops_what_a_base_class_recorded_and_a_primitive_is_refused_in_lightnings_words():
    class Base(TrainModule):
        def __init__(self, arg1, arg2, arg3):
            super().__init__()
            self.save_hyperparameters(ignore="arg1")

    class Sub(Base):
        def __init__(self, arg1, arg2, arg3):
            super().__init__(arg1, arg2, arg3)
            self.save_hyperparameters(ignore="arg2")

    assert dict(Sub(1, 2, 3).hparams) == {"arg1": 1, "arg3": 3}

    class Primitive(TrainModule):
        def __init__(self, x=1):
            super().__init__()
            self.save_hyperparameters(3.14, "x")

    with pytest.raises(ValueError, match=r"^Primitives \(<class 'bool'>, <class 'int'>, <class 'float'>, <class 'str'>\) are not allowed"):
        Primitive()


def test_load_from_checkpoint_gives_a_recorded_dict_back_to_its_argument_and_reads_lightnings_older_keys():
    class Configured(Classifier):
        def __init__(self, config: dict):
            super().__init__(hidden=config["hidden"])
            self.save_hyperparameters(config)

    Trainer(max_epochs=1, callbacks=[ModelCheckpoint(dirpath="ck")], **quiet(enable_checkpointing=True)).fit(Configured({"hidden": 6}), loader(32))
    (path,) = [os.path.join("ck", f) for f in os.listdir("ck")]
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["hparams_name"] == "config" and ckpt["hyper_parameters"] == {"hidden": 6}
    assert Configured.load_from_checkpoint(path).net[0].out_features == 6  # Configured(config={"hidden": 6})

    older = {k: v for k, v in ckpt.items() if k not in ("hyper_parameters", "hparams_name", "steadytrainer")}
    torch.save({**older, "module_arguments": {"hidden": 6}}, "old.ckpt")  # Lightning before 1.0
    assert Classifier.load_from_checkpoint("old.ckpt").net[0].out_features == 6


def test_a_dataclass_module_records_its_init_fields():
    import dataclasses

    @dataclasses.dataclass(eq=False)
    class Fields(Classifier):
        width: int
        note: str = "x"
        derived: int = dataclasses.field(default=0, init=False)

        def __post_init__(self):
            super().__init__(hidden=self.width)
            self.save_hyperparameters()

    assert dict(Fields(6, note="y").hparams) == {"width": 6, "note": "y"}


def test_load_from_checkpoint_takes_the_hyperparameters_of_a_loggers_hparams_file_instead(tmp_path):
    from loggers import CSVLogger

    logger = CSVLogger(tmp_path, name="run")
    trainer = Trainer(max_epochs=1, logger=logger, enable_progress_bar=False, callbacks=[ModelCheckpoint(dirpath=tmp_path / "ck")])
    trainer.fit(Classifier(hidden=6), loader(32))
    (path,) = (tmp_path / "ck").iterdir()
    hparams_yaml = os.path.join(logger.log_dir, "hparams.yaml")
    assert Classifier.load_from_checkpoint(path, hparams_file=hparams_yaml).hparams["hidden"] == 6

    with open(hparams_yaml, "a") as f:  # the file's values replace the checkpoint's, and keywords the file's
        f.write("lr: 0.5\n")
    loaded = Classifier.load_from_checkpoint(path, hparams_file=hparams_yaml, dropout=0.1)
    assert (loaded.hparams["lr"], loaded.hparams["hidden"], loaded.hparams["dropout"]) == (0.5, 6, 0.1)

    (tmp_path / "tags.csv").write_text("key,value\nhidden,6\nlr,0.25\noptimizer,sgd\n")  # Lightning's tags.csv
    assert dict(Classifier.load_from_checkpoint(path, hparams_file=tmp_path / "tags.csv").hparams) == {
        "hidden": 6, "lr": 0.25, "optimizer": "sgd"} | {k: v for k, v in Classifier(hidden=6).hparams.items() if k not in ("hidden", "lr", "optimizer")}

    (tmp_path / "evil.yaml").write_text("hidden: !!python/object/apply:os.system ['echo hi']\n")
    with pytest.raises(ValueError, match=r"hparams_file=.*evil.yaml' is not plain YAML data"):
        Classifier.load_from_checkpoint(path, hparams_file=tmp_path / "evil.yaml")
    with pytest.raises(ValueError, match=r"^.csv, .yml or .yaml is required for `hparams_file`"):
        Classifier.load_from_checkpoint(path, hparams_file=tmp_path / "hparams.json")


def test_a_subclass_value_wins_over_what_it_passed_its_base_as_in_lightning():
    class Base(TrainModule):
        def __init__(self, a=1, **kwargs):
            super().__init__()
            self.save_hyperparameters()

    class Sub(Base):
        def __init__(self, a=2, b=3):
            super().__init__(a=a + 10, c=4)

    assert dict(Sub().hparams) == {"a": 2, "b": 3, "c": 4}


@pytest.mark.parametrize("base", [TrainModule, DataModule])
def test_a_module_built_in_a_parents_init_records_the_parents_arguments_too_less_the_ignored(base):
    """Lightning's composition rule: the walk up the stack goes through the parent's __init__."""

    class Child(base):
        def __init__(self, dropout, activation, init_method):
            super().__init__()
            self.save_hyperparameters(ignore=["dropout", "activation"])

    class Parent(base):
        def __init__(self, batch_size, optimizer):
            super().__init__()
            self.child = Child(dropout=0.1, activation="relu", init_method="xavier")

    class Pipeline:  # not a module: the walk stops here
        def __init__(self, run_id="abc"):
            self.parent = Parent(batch_size=64, optimizer="adam")

    assert dict(Pipeline().parent.child.hparams) == {"init_method": "xavier", "batch_size": 64, "optimizer": "adam"}


class _Config(Mapping):
    """A read-only mapping, as an OmegaConf DictConfig is: not a dict."""

    def __init__(self, **items):
        self._items = items

    def __getitem__(self, key):
        return self._items[key]

    def __iter__(self):
        return iter(self._items)

    def __len__(self):
        return len(self._items)


def test_a_mapping_that_is_not_a_dict_is_recorded_as_its_plain_items_and_reaches_the_checkpoint(tmp_path):
    class Model(TrainModule):
        def __init__(self, config):
            super().__init__()
            self.save_hyperparameters(config)

    model = Model(_Config(lr=0.1, sizes=_Config(hidden=8)))
    assert model.hparams == {"lr": 0.1, "sizes": {"hidden": 8}} and type(model.hparams["sizes"]) is dict
    kept, left_out = checkpoint_hparams(model)
    assert kept == {"lr": 0.1, "sizes": {"hidden": 8}} and left_out == []


class WithScore(Classifier):
    def __init__(self, score=lambda x: x + 1, ignore: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["score"] if ignore else None)


def test_what_cannot_be_pickled_leaves_hparams_with_lightnings_warning_when_a_stage_starts():
    model = WithScore()
    assert "score" in model.hparams  # recorded as given, until a stage starts
    trainer = Trainer(**quiet(max_steps=1))
    with pytest.warns(UserWarning, match="Attribute 'score' removed from hparams because it cannot be pickled"):
        trainer.fit(model, loader(16))
    assert model.hparams == {"ignore": False}
    with warnings.catch_warnings():  # ignored: nothing to remove, no warning
        warnings.filterwarnings("error", message=".*cannot be pickled")
        Trainer(**quiet(max_steps=1)).fit(WithScore(ignore=True), loader(16))


class FromOmegaConf(Classifier):
    def __init__(self, config) -> None:
        super().__init__(hidden=config.hidden)
        self.save_hyperparameters(config)


class OmegaConfData(DataModule):
    def __init__(self, config) -> None:
        super().__init__()
        self.save_hyperparameters(config)

    def train_dataloader(self):
        return loader(16)


def test_an_omegaconf_config_stays_one_in_hparams_and_comes_back_one_from_a_default_load(tmp_path):
    import omegaconf  # the dev extra's: the package itself never imports it
    config = omegaconf.OmegaConf.create({"hidden": 4, "sizes": [8, {"a": 1}], "name": "${hidden}-wide"})
    model, data = FromOmegaConf(config), OmegaConfData(config)
    assert isinstance(model.hparams, omegaconf.DictConfig) and model.hparams.sizes[1].a == 1  # as in Lightning
    assert isinstance(data.hparams, omegaconf.DictConfig) and data.hparams == config
    trainer = Trainer(**quiet(max_steps=1, callbacks=[ModelCheckpoint(dirpath=tmp_path)]))
    trainer.fit(model, datamodule=data)
    path = os.path.join(tmp_path, "epoch=0-step=1.ckpt")
    raw = torch.load(path, weights_only=True)  # plain data in the file, resolved: no pickled class
    assert raw["hyper_parameters"] == {"hidden": 4, "sizes": [8, {"a": 1}], "name": "4-wide"}
    loaded, loaded_data = FromOmegaConf.load_from_checkpoint(path), OmegaConfData.load_from_checkpoint(path)
    assert isinstance(loaded.hparams, omegaconf.DictConfig) and loaded.hparams.sizes[0] == 8
    assert isinstance(loaded_data.hparams, omegaconf.DictConfig) and loaded_data.hparams.name == "4-wide"
