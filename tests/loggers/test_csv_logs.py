"""CSVLogger: a version folder used again, and a remote filesystem (fsspec's in-memory one stands in for s3://)."""

from __future__ import annotations

import csv
import io
import os
import uuid

import fsspec
import pytest

from callbacks import ModelCheckpoint
from loggers import CSVLogger
from tests._models import Classifier, loader, quiet
from trainer import Trainer


@pytest.fixture
def remote_dir():
    path = f"memory://csv-{uuid.uuid4().hex}"
    yield path
    fsspec.filesystem("memory").rm(path.removeprefix("memory://"), recursive=True)


def _rows(fs, path: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(fs.cat(path).decode("utf-8"))))


def test_remote_fit_writes_metrics_and_hparams_there(remote_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a local folder named after the URL ("memory:") would show here
    logger = CSVLogger(save_dir=remote_dir)
    trainer = Trainer(**quiet(max_epochs=2, logger=logger, log_every_n_steps=2))
    trainer.fit(Classifier(), loader(64), loader(32))
    fs = fsspec.filesystem("memory")
    assert logger.log_dir == f"{remote_dir}/lightning_logs/version_0"
    rows = _rows(fs, os.path.join(logger.log_dir, "metrics.csv"))
    assert [r["epoch"] for r in rows if r["val_loss"]] == ["0", "1"]  # each epoch's validation, in the file
    assert sum(1 for r in rows if r["train_loss"]) == 4  # 4 steps an epoch, a row every 2
    assert "lr: 0.1" in fs.cat(os.path.join(logger.log_dir, "hparams.yaml")).decode()
    assert os.listdir(tmp_path) == []
    assert CSVLogger(save_dir=remote_dir).version == 1  # the next run takes the next folder there


def test_remote_rows_of_one_step_share_a_row(remote_dir):
    logger = CSVLogger(save_dir=remote_dir)
    logger.log_metrics({"loss": 0.5}, step=0)
    logger.save()
    logger.log_metrics({"val_loss": 0.25}, step=0)  # the same step, after its row was written
    logger.log_metrics({"loss": 0.4}, step=1)
    logger.save()
    rows = _rows(fsspec.filesystem("memory"), os.path.join(logger.log_dir, "metrics.csv"))
    assert rows == [{"step": "0", "loss": "0.5", "val_loss": "0.25"}, {"step": "1", "loss": "0.4", "val_loss": ""}]


def test_a_version_folder_used_again_warns_and_the_new_run_starts_a_new_metrics_csv(tmp_path):
    old = tmp_path / "exp" / "version_0" / "metrics.csv"
    old.parent.mkdir(parents=True)
    old.write_text("step,old_loss\n0,1.0\n")
    logger = CSVLogger(save_dir=tmp_path, name="exp", version=0)
    with pytest.warns(UserWarning, match="Experiment logs directory .* exists and is not empty"):
        logger.experiment  # Lightning's: the old file goes when the writer opens the folder
    assert not old.exists()
    logger.log_metrics({"loss": 0.5}, step=3)
    logger.save()
    assert _local_rows(old) == [{"step": "3", "loss": "0.5"}]  # no row, nor column, of the old run


def test_a_fit_that_resumes_goes_on_after_the_kept_rows_without_the_warning(tmp_path, recwarn):
    def make(epochs: int) -> Trainer:
        return Trainer(max_epochs=epochs, log_every_n_steps=2, enable_progress_bar=False, enable_model_summary=False,
                       logger=CSVLogger(tmp_path), callbacks=[ModelCheckpoint(save_last=True)])

    first = make(2)
    first.fit(Classifier(), loader(64), loader(32))
    ckpt = os.path.join(first.log_dir, "checkpoints", "last.ckpt")
    again = make(3)
    again.fit(Classifier(), loader(64), loader(32), ckpt_path=ckpt)
    assert again.log_dir == first.log_dir
    assert [r["step"] for r in _local_rows(os.path.join(first.log_dir, "metrics.csv"))] == ["1", "3", "5", "7", "9", "11"]
    assert not [w for w in recwarn if "exists and is not empty" in str(w.message)]


def _local_rows(path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))
