"""Loggers under DDP(2), on CPU with gloo: rank 0 writes, the other ranks' loggers do nothing; a user's own
logger is called on every rank, as Lightning's."""

from __future__ import annotations

import csv
import glob
import os

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from loggers import CSVLogger, Logger, TensorBoardLogger, rank_zero_only
from strategies import DDPStrategy
from tests._models import Classifier, loader
from trainer import Trainer

pytestmark = pytest.mark.slow


class WritesOnEveryRank(Classifier):
    """Calls the experiment on every rank, as user code does, and notes what each rank got."""

    def training_step(self, batch, batch_idx):
        rank = self.trainer.strategy.global_rank
        writer = self.logger.experiment
        writer.add_scalar(f"from_rank{rank}", 1.0, self.trainer.global_step)
        with open(f"rank{rank}.txt", "w") as f:
            f.write(f"{type(writer).__name__} {self.logger.log_dir} {self.trainer.log_dir}")
        return super().training_step(batch, batch_idx)


@pytest.mark.usefixtures("ranks_from_the_fork_server")  # ranks fork from a warm server: see tests/conftest.py
def test_rank_zero_writes_and_the_other_rank_gets_a_logger_that_does_nothing():
    tb, csv_logger = TensorBoardLogger("tb", name="ddp"), CSVLogger("csv")
    trainer = Trainer(strategy=DDPStrategy(timeout=20), devices=2, max_epochs=1, log_every_n_steps=1, enable_progress_bar=False,
                      enable_model_summary=False, logger=[tb, csv_logger])
    trainer.fit(WritesOnEveryRank(), loader(64, batch_size=8), loader(32, batch_size=8))
    folder = os.path.join("tb", "ddp", "version_0")
    assert glob.glob(os.path.join("tb", "ddp", "*")) == [folder]  # one version, made by rank 0
    assert glob.glob(os.path.join("csv", "lightning_logs", "*")) == [os.path.join("csv", "lightning_logs", "version_0")]
    assert len(glob.glob(os.path.join(folder, "events.out.tfevents.*"))) == 1
    acc = EventAccumulator(folder)
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert "from_rank0" in tags and "from_rank1" not in tags and "train_loss" in tags
    zero, one = (open(f"rank{r}.txt").read().split() for r in (0, 1))
    assert zero[0] == "SummaryWriter" and one[0] == "DummyExperiment"
    assert zero[1:] == one[1:] == [folder, folder]  # every rank names rank 0's folder
    # The caller's loggers know the folders the workers used, and checkpoints are there.
    assert tb.log_dir == trainer.log_dir == folder and csv_logger.version == 0
    assert glob.glob(os.path.join(folder, "checkpoints", "*.ckpt"))
    with open(os.path.join("csv", "lightning_logs", "version_0", "metrics.csv"), newline="") as f:
        assert [int(r["step"]) for r in csv.DictReader(f)] == [0, 1, 2, 3]  # step n's row at n - 1


@pytest.mark.usefixtures("ranks_from_the_fork_server")
def test_mlflow_under_ddp_is_one_run_that_rank_0_writes_and_the_caller_knows(monkeypatch):
    from mlflow.tracking import MlflowClient

    from callbacks import ModelCheckpoint
    from loggers import MLFlowLogger

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    logger = MLFlowLogger(experiment_name="ddp", log_model="all")
    trainer = Trainer(strategy=DDPStrategy(timeout=20), devices=2, max_epochs=1, log_every_n_steps=1,
                      enable_progress_bar=False, enable_model_summary=False, logger=logger,
                      callbacks=[ModelCheckpoint(filename="last-epoch")])
    trainer.fit(Classifier(), loader(64, batch_size=8), loader(32, batch_size=8))  # 4 steps a rank
    client = MlflowClient(f"file:{os.path.abspath('mlruns')}")
    runs = client.search_runs([logger.experiment_id])
    assert [r.info.run_id for r in runs] == [logger.run_id] and runs[0].info.status == "FINISHED"
    assert [m.step for m in client.get_metric_history(logger.run_id, "train_loss")] == [0, 1, 2, 3]  # once each
    assert [a.path for a in client.list_artifacts(logger.run_id)] == ["last-epoch"]
    folder = os.path.join("mlruns", logger.experiment_id, logger.run_id, "checkpoints")
    assert trainer.checkpoint_callback.dirpath == os.path.abspath(folder)


@pytest.mark.usefixtures("ranks_from_the_fork_server")
def test_wandb_under_ddp_is_the_callers_run(monkeypatch):
    import wandb

    from loggers import WandbLogger
    from tests.loggers.test_wandb import _records, _run

    for name, value in (("WANDB_MODE", "offline"), ("WANDB_SILENT", "true"), ("WANDB_BASE_URL", "http://127.0.0.1:9")):
        monkeypatch.setenv(name, value)
    logger = WandbLogger(project="ddp", save_dir="wb", offline=True)
    trainer = Trainer(strategy=DDPStrategy(timeout=20), devices=2, max_epochs=1, log_every_n_steps=1,
                      enable_progress_bar=False, enable_model_summary=False, logger=logger)
    trainer.fit(Classifier(), loader(64, batch_size=8), loader(32, batch_size=8))
    run = logger.experiment
    assert run is wandb.run
    assert trainer.checkpoint_callback.dirpath == os.path.abspath(os.path.join("wb", "ddp", run.id, "checkpoints"))
    run.finish()
    folders = glob.glob(os.path.join("wb", "wandb", "offline-run-*"))
    assert len(folders) == 1  # one run: rank 0 wrote into the caller's
    _, history, _ = _run(_records(folders[0]))
    assert [row["trainer/global_step"] for row in history if "train_loss" in row] == [0, 1, 2, 3]


class FileRowsOfEachRank(Logger):
    """A user's logger with no ``rank_zero_only``: each rank writes the keys it was sent to its own file."""

    name, version = "rows", 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        with open(f"rows{rank_zero_only.rank}.txt", "a") as f:
            f.write(" ".join(sorted(metrics)) + "\n")


class LogsItsRank(Classifier):
    def on_train_start(self):
        self.log(f"rank-{self.global_rank}", 0.0)


@pytest.mark.usefixtures("ranks_from_the_fork_server")
def test_a_users_logger_is_called_on_every_rank_as_lightnings():
    trainer = Trainer(strategy=DDPStrategy(timeout=20), devices=2, max_epochs=1, log_every_n_steps=1,
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                      logger=FileRowsOfEachRank())
    trainer.fit(LogsItsRank(), loader(32, batch_size=8))
    for rank in (0, 1):  # each rank's row holds what that rank logged at on_train_start (the first epoch's value)
        rows = open(f"rows{rank}.txt").read().split()
        assert f"rank-{rank}" in rows and "train_loss" in rows
