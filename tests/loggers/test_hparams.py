"""The HParams tab: the event files read back through tensorboard's own hparams backend, which
serves the tab its columns, and the columns the tab ticks without the user's help."""

from __future__ import annotations

import math
import os

import pytest
import torch
import yaml
from hypothesis import given, settings, strategies as st
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.context import RequestContext
from tensorboard.plugins import base_plugin
from tensorboard.plugins.hparams import api_pb2, backend_context, get_experiment, metadata

from loggers import TensorBoardLogger
from loggers._hparams import write_yaml
from tests._models import Classifier, loader
from trainer import Trainer
from trainer.checkpoint.from_checkpoint import read_hparams_file


def _fit(model=None, **options) -> Trainer:
    opts = dict(max_epochs=2, log_every_n_steps=2, enable_progress_bar=False, enable_checkpointing=False)
    opts.update(options)
    trainer = Trainer(**opts)
    trainer.fit(model or Classifier(), loader(64), loader(32))  # 4 steps an epoch, a validation at each end
    return trainer


def _experiment(logdir: str) -> api_pb2.Experiment:
    """What TensorBoard's server answers the HParams tab's first request with."""
    runs = plugin_event_multiplexer.EventMultiplexer()
    runs.AddRunsFromDirectory(logdir)
    runs.Reload()
    context = base_plugin.TBContext(logdir=logdir, data_provider=data_provider.MultiplexerDataProvider(runs, logdir), multiplexer=runs)
    request = api_pb2.GetExperimentRequest()
    return get_experiment.Handler(RequestContext(), backend_context.Context(context), "", request).run()


def _ticked(experiment: api_pb2.Experiment) -> tuple[list[str], list[str]]:
    """The columns shown before any is ticked: the first 5 hyperparameters (those whose values
    differ between runs first) and the first 5 metrics, as tensorboard 2.x's tab picks them
    (tf-hparams-query-pane: `displayed: i < 5`)."""
    hparams = sorted(experiment.hparam_infos, key=lambda h: not h.differs)  # a stable sort, as the tab's
    return [h.name for h in hparams[:5]], [m.name.tag for m in experiment.metric_infos[:5]]


def _records(run_dir: str) -> dict[str, bytes]:
    acc = EventAccumulator(run_dir)
    acc.Reload()
    return acc.PluginTagToContent(metadata.PLUGIN_NAME)


class LogsItsLR(Classifier):
    """Logs its learning rate under the name of its ``lr`` argument."""

    def training_step(self, batch, batch_idx):
        self.log("lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        return super().training_step(batch, batch_idx)


def test_a_finished_fit_lists_its_validation_and_epoch_values_first_and_lr_once():
    trainer = _fit(LogsItsLR(), gradient_clip_val=1.0)
    experiment = _experiment(os.path.dirname(trainer.run_dir))
    metrics = [m.name.tag for m in experiment.metric_infos]
    # Means first (2 points each), then the per-step loss (4 points), then the Trainer's own epoch.
    assert metrics == ["val_acc", "val_loss", "train_loss", "epoch"]  # no grad_norm of the Trainer's, as Lightning
    # `lr` is the model's hyperparameter; the learning rate's curve stays in the Time Series tab.
    assert "lr" not in metrics and "lr" in {h.name for h in experiment.hparam_infos}
    hparams, ticked = _ticked(experiment)
    assert ticked == ["val_acc", "val_loss", "train_loss", "epoch"]
    assert hparams == ["classes", "dropout", "features", "hidden", "lr"]  # the model's, before trainer/...

    types = {h.name: h.type for h in experiment.hparam_infos}
    assert types["optimizer"] == api_pb2.DATA_TYPE_STRING and types["trainer/deterministic"] == api_pb2.DATA_TYPE_BOOL
    assert types["trainer/max_epochs"] == api_pb2.DATA_TYPE_FLOAT64 and "trainer/max_steps" not in types  # None left out
    # No domain: a domain would make the filter list this run's values only, hiding other runs'.
    assert not any(h.HasField("domain_discrete") or h.HasField("domain_interval") for h in experiment.hparam_infos)


def test_the_learning_rate_is_a_metric_column_when_no_hyperparameter_has_its_name():
    class NoLrArgument(LogsItsLR):
        def __init__(self):
            super().__init__()
            self.save_hyperparameters({k: v for k, v in self.hparams.items() if k != "lr"})  # as first recorded, without lr

    trainer = _fit(NoLrArgument())
    metrics = [m.name.tag for m in _experiment(os.path.dirname(trainer.run_dir)).metric_infos]
    assert metrics == ["val_acc", "val_loss", "lr", "train_loss", "epoch"]


class ChoosesItsColumns(Classifier):
    """Lightning's documented way to pick the tab's metrics (default_hp_metric=False)."""

    def on_train_start(self):
        self.logger.log_hyperparams(self.hparams, {"hp/acc": 0, "hp/loss": 0})

    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        x, y = batch
        logits = self(x)
        self.log("hp/acc", (logits.argmax(-1) == y).float().mean())
        self.log("hp/loss", torch.nn.functional.cross_entropy(logits, y))


def test_metrics_given_to_log_hyperparams_come_first_and_the_placeholder_last():
    chosen = _fit(ChoosesItsColumns(), logger=TensorBoardLogger("tb", default_hp_metric=False))
    assert [m.name.tag for m in _experiment(chosen.logger.log_dir).metric_infos][:3] == ["hp/acc", "hp/loss", "val_acc"]

    # TensorBoardLogger()'s placeholder hp_metric=-1, never logged again, goes with the Trainer's values.
    placeholder = _fit(logger=TensorBoardLogger("placeholder"))
    metrics = [m.name.tag for m in _experiment(placeholder.logger.log_dir).metric_infos]
    assert metrics[:3] == ["val_acc", "val_loss", "train_loss"] and metrics[3:5] == ["epoch", "hp_metric"]


def test_each_fit_of_the_default_logger_lists_its_own_columns_once():
    trainer = _fit(max_epochs=1)
    first = trainer.run_dir
    trainer.max_epochs = 2  # a second fit goes on from the first's end (Lightning's): one epoch more
    trainer.fit(Classifier(hidden=8), loader(64))  # no validation this time, a new version
    trainer.test(Classifier(), loader(32))  # after fit: adds no second list
    assert trainer.run_dir != first
    assert metadata.EXPERIMENT_TAG in _records(first)
    acc = EventAccumulator(trainer.run_dir)
    acc.Reload()
    assert len(acc.Tensors(metadata.EXPERIMENT_TAG)) == 1
    columns = metadata.parse_experiment_plugin_data(acc.PluginTagToContent(metadata.PLUGIN_NAME)[metadata.EXPERIMENT_TAG])
    assert [m.name.tag for m in columns.metric_infos][:2] == ["train_loss", "epoch"]


def test_a_fit_that_fails_lists_no_columns():
    class Fails(Classifier):
        def training_step(self, batch, batch_idx):
            if self.global_step == 3:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    trainer = Trainer(max_epochs=2, log_every_n_steps=1, enable_progress_bar=False, enable_checkpointing=False)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Fails(), loader(64), loader(32))
    # Before its first validation: a list from it would have no val_loss, and tensorboard would
    # use it for every run in the folder. Without one, tensorboard builds the columns itself.
    records = _records(trainer.run_dir)
    assert metadata.SESSION_START_INFO_TAG in records and metadata.EXPERIMENT_TAG not in records
    assert "train_loss" in {m.name.tag for m in _experiment(os.path.dirname(trainer.run_dir)).metric_infos}


class RecordsOnly(Classifier):
    def __init__(self, hidden: int = 16):
        super().__init__(hidden=hidden)
        self.save_hyperparameters(logger=False)  # checkpoints get them, loggers not


class Calls(TensorBoardLogger):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.hparams_calls = []

    def log_hyperparams(self, params, metrics=None):
        self.hparams_calls.append(dict(params))
        super().log_hyperparams(params, metrics)


def test_hyperparameters_recorded_with_logger_false_are_not_logged_at_all(tmp_path):
    logger = Calls(tmp_path)
    Trainer(max_epochs=1, logger=logger, enable_progress_bar=False, enable_checkpointing=False).fit(RecordsOnly(), loader(32))
    assert logger.hparams_calls == []  # Lightning calls log_hyperparams only with something to log


def test_the_model_and_the_datamodule_recording_one_name_with_two_values_is_lightnings_error(tmp_path):
    from trainer import DataModule

    class Data(DataModule):
        def __init__(self, hidden: int = 8):
            super().__init__()
            self.save_hyperparameters()

        def train_dataloader(self):
            return loader(32)

    trainer = Trainer(max_epochs=1, logger=Calls(tmp_path), enable_progress_bar=False, enable_checkpointing=False)
    with pytest.raises(RuntimeError, match=r"^Error while merging hparams: the keys \['hidden'\] are present in both"):
        trainer.fit(Classifier(hidden=16), datamodule=Data(hidden=8))
    agreeing = Calls(tmp_path)
    Trainer(max_epochs=1, logger=agreeing, enable_progress_bar=False, enable_checkpointing=False).fit(
        Classifier(hidden=16), datamodule=Data(hidden=16))
    assert agreeing.hparams_calls[0]["hidden"] == 16 and agreeing.hparams_calls[0]["trainer/max_epochs"] == 1


def test_a_model_that_never_saved_hyperparameters_gets_no_log_hyperparams_call(tmp_path):
    class Bare(Classifier):
        def __init__(self):
            super(Classifier, self).__init__()  # TrainModule's: no save_hyperparameters()
            self.net = torch.nn.Linear(8, 2)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    logger = Calls(tmp_path)
    Trainer(max_epochs=1, logger=logger, enable_progress_bar=False, enable_checkpointing=False).fit(Bare(), loader(32))
    assert logger.hparams_calls == []  # Lightning's: only what save_hyperparameters recorded is logged
    recorded = Calls(tmp_path)
    Trainer(max_epochs=1, logger=recorded, enable_progress_bar=False, enable_checkpointing=False).fit(Classifier(hidden=16), loader(32))
    (params,) = recorded.hparams_calls
    assert params["hidden"] == 16 and params["trainer/max_epochs"] == 1  # TensorBoard's HParams get the options too


# --- hparams.yaml reads back -----------------------------------------------------------------
_scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
_keys = st.text() | st.integers()
_values = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=4), max_leaves=12)


def _same(a, b) -> bool:
    """Equal as data: NaN equals NaN, a tuple reads back as a list, 0.0 keeps its sign."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(), _values, max_size=6))
def test_hparams_yaml_reads_back_every_plain_value(tmp_path_factory, params):
    path = str(tmp_path_factory.mktemp("h") / "hparams.yaml")
    write_yaml(path, params)
    assert _same(params, read_hparams_file(path))  # load_from_checkpoint(hparams_file=...)'s reader
    with open(path, encoding="utf-8") as f:
        assert _same(params, yaml.safe_load(f) or {})


def test_floats_in_every_notation_and_control_characters_read_back(tmp_path):
    params = {"lr": 1e-5, "eps": 1e-8, "big": 1e20, "tiny": 5e-324, "neg": -0.0, "inf": float("-inf"),
              "text": "a\x7fb\x85c\x9f\u2028d\ud83d\ude00", "nested": {"betas": (0.9, 0.999), 3: [1e-5, None]}}
    write_yaml(str(tmp_path / "hparams.yaml"), params)
    back = read_hparams_file(tmp_path / "hparams.yaml")
    assert back["lr"] == 1e-5 and back["eps"] == 1e-8 and back["big"] == 1e20 and isinstance(back["big"], float)
    assert back["text"] == params["text"] and back["nested"] == {"betas": [0.9, 0.999], 3: [1e-5, None]}
