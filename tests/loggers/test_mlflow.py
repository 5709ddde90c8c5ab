"""MLFlowLogger against a real MLflow file store under tmp_path, read back with MlflowClient."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from mlflow.tracking import MlflowClient

from callbacks import ModelCheckpoint
from loggers import DummyExperiment, MLFlowLogger, rank_zero_only
from tests._models import Classifier, loader
from trainer import Trainer


@pytest.fixture(autouse=True)
def _store(monkeypatch):
    """A local store in the test's folder: no tracking server from the environment."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)  # the logger sets it; monkeypatch removes it after


def _fit(logger, model=None, callbacks=None, **options):
    opts = dict(max_epochs=2, log_every_n_steps=2, enable_progress_bar=False, enable_model_summary=False, logger=logger)
    opts.update(options)
    trainer = Trainer(callbacks=callbacks, **opts)
    trainer.fit(model or Classifier(), loader(64), loader(32))  # 4 steps an epoch
    return trainer


def _client() -> MlflowClient:
    return MlflowClient(f"file:{os.path.abspath('mlruns')}")  # (MLflow keeps a store per URI: not a relative one)


def test_a_fit_stores_params_metrics_at_their_steps_tags_and_a_finished_run():
    logger = MLFlowLogger(experiment_name="exp", run_name="first", tags={"team": "vision"})
    trainer = _fit(logger, model=Classifier(hidden=12, optimizer="adam"))
    client = _client()
    run = client.get_run(logger.run_id)
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == "exp"
    assert run.data.tags["mlflow.runName"] == "first" and run.data.tags["team"] == "vision"
    params = {"features": "8", "hidden": "12", "classes": "2", "dropout": "0.0", "lr": "0.1", "optimizer": "adam"}
    assert run.data.params == params
    # Lightning's steps: every 2nd optimizer step's values at step - 1, validation at the epoch's last step.
    assert [m.step for m in client.get_metric_history(logger.run_id, "train_loss")] == [1, 3, 5, 7]
    val = client.get_metric_history(logger.run_id, "val_loss")
    assert [m.step for m in val] == [3, 7]
    assert val[-1].value == pytest.approx(trainer.callback_metrics["val_loss"].item(), rel=1e-6)
    assert [m.value for m in client.get_metric_history(logger.run_id, "epoch")] == [0, 0, 0, 1, 1, 1]  # with each row
    # Lightning's folders: the store is save_dir, checkpoints go to <store>/<experiment id>/<run id>/checkpoints.
    assert logger.save_dir == "./mlruns" and trainer.log_dir == "./mlruns"
    assert (logger.name, logger.version) == (run.info.experiment_id, run.info.run_id)
    folder = os.path.abspath(os.path.join("mlruns", logger.name, logger.version, "checkpoints"))
    assert trainer.checkpoint_callback.dirpath == folder and os.listdir(folder)


def test_log_model_all_uploads_each_checkpoint_as_it_is_saved_with_its_metadata():
    logger = MLFlowLogger(log_model="all")
    uploaded_at_epoch_end = []

    class Look(ModelCheckpoint):
        def on_train_epoch_end(self, trainer, pl_module):
            super().on_train_epoch_end(trainer, pl_module)
            uploaded_at_epoch_end.append(sorted(a.path for a in _client().list_artifacts(logger.run_id)))

    _fit(logger, callbacks=[Look(save_top_k=-1, filename="{epoch}")], limit_val_batches=0)
    assert uploaded_at_epoch_end == [["epoch=0"], ["epoch=0", "epoch=1"]]  # during training, not at its end
    client = _client()
    files = sorted(a.path for a in client.list_artifacts(logger.run_id, "epoch=1"))
    assert files == ["epoch=1/aliases.txt", "epoch=1/epoch=1.ckpt", "epoch=1/metadata.yaml"]
    here = client.download_artifacts(logger.run_id, "epoch=1", ".")
    assert torch.load(os.path.join(here, "epoch=1.ckpt"), weights_only=False)["global_step"] == 8
    metadata = open(os.path.join(here, "metadata.yaml")).read()
    assert 'original_filename: "epoch=1.ckpt"' in metadata and "save_top_k: -1" in metadata
    assert open(os.path.join(here, "aliases.txt")).read() == "['latest', 'best']"


def test_log_model_true_uploads_the_kept_checkpoint_when_training_ends_and_false_none():
    keep = ModelCheckpoint(monitor="val_loss", save_top_k=1, filename="best")
    logger = MLFlowLogger(log_model=True)
    trainer = _fit(logger, callbacks=[keep])
    assert [a.path for a in _client().list_artifacts(logger.run_id)] == ["best"]
    assert os.path.basename(keep.best_model_path) == "best.ckpt" and trainer.state.finished
    logger = MLFlowLogger(log_model=False)
    _fit(logger, callbacks=[ModelCheckpoint(save_top_k=-1)])
    assert _client().list_artifacts(logger.run_id) == []


def test_a_fit_that_raises_leaves_its_run_failed_with_what_it_logged():
    class Breaks(Classifier):
        def training_step(self, batch, batch_idx):
            if self.global_step == 3:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    logger = MLFlowLogger()
    with pytest.raises(RuntimeError, match="boom"):
        _fit(logger, model=Breaks(), log_every_n_steps=1)
    client = _client()
    assert client.get_run(logger.run_id).info.status == "FAILED"
    assert [m.step for m in client.get_metric_history(logger.run_id, "train_loss")] == [0, 1, 2]


def test_run_id_continues_a_run_and_prefix_goes_before_each_name():
    first = MLFlowLogger(experiment_name="exp")
    first.log_metrics({"loss": 2.0}, step=0)
    first.finalize("success")
    again = MLFlowLogger(run_id=first.run_id, prefix="resumed")
    again.log_metrics({"loss": torch.tensor(1.0), "note": "text"}, step=5)  # a string is no metric: dropped
    with pytest.warns(RuntimeWarning, match="Replacing resumed-acc@1 with resumed-acc1"):
        again.log_metrics({"acc@1": 0.5}, step=5)
    again.log_hyperparams({"optim": {"name": "sgd", "lr": 0.1}})  # nested: flattened
    client = _client()
    run = client.get_run(first.run_id)
    assert again.experiment_id == first.experiment_id and run.data.params == {"optim/name": "sgd", "optim/lr": "0.1"}
    assert [(m.step, m.value) for m in client.get_metric_history(first.run_id, "loss")] == [(0, 2.0)]
    assert [(m.step, m.value) for m in client.get_metric_history(first.run_id, "resumed-loss")] == [(5, 1.0)]
    assert set(run.data.metrics) == {"loss", "resumed-loss", "resumed-acc1"}


def test_tracking_uri_comes_from_the_argument_or_the_environment(monkeypatch, tmp_path):
    uri = f"file:{tmp_path / 'elsewhere'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    logger = MLFlowLogger()
    logger.log_metrics({"x": 1.0}, step=1)
    assert logger.save_dir == str(tmp_path / "elsewhere") and not os.path.exists("mlruns")
    assert MlflowClient(uri).get_metric_history(logger.run_id, "x")[0].step == 1
    assert MLFlowLogger(tracking_uri="file:./other", save_dir="ignored").save_dir == "./other"


def test_ranks_other_than_0_write_nothing(monkeypatch):
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    logger = MLFlowLogger()
    assert isinstance(logger.experiment, DummyExperiment)
    logger.log_hyperparams({"lr": 0.1})
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.finalize("success")
    assert logger.run_id is None and not os.path.exists("mlruns")


def test_bad_arguments_and_a_missing_mlflow_are_sentences(monkeypatch):
    with pytest.raises(ValueError, match=r"MLFlowLogger\(log_model='best'\) must be False .*True .*'all'"):
        MLFlowLogger(log_model="best")
    with pytest.raises(TypeError, match=r"MLFlowLogger\(tags=\['a'\]\) must be a dict"):
        MLFlowLogger(tags=["a"])
    with pytest.raises(TypeError, match=r"MLFlowLogger\(synchronous\)='yes' must be True or False"):
        MLFlowLogger(synchronous="yes")
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed
    with pytest.raises(ModuleNotFoundError, match=r'not installed: pip install "mlflow-skinny.*"steadytrainer\[mlflow\]'):
        MLFlowLogger()
