"""CSVLogger on a remote filesystem (fsspec's in-memory one stands in for s3://, gcs://)."""

from __future__ import annotations

import csv
import io
import os
import uuid

import fsspec
import pytest

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
