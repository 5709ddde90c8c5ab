"""CometLogger with a real comet_ml experiment, offline, read back from the archive it writes (messages.json)."""

from __future__ import annotations

import json
import os
import pickle
import sys
import zipfile

import pytest
import torch

from loggers import CometLogger
from tests._models import Classifier, loader
from trainer import Trainer


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    """Nothing reaches the network: no key, no config file of the user's, a server that answers nothing."""
    for name in [n for n in os.environ if n.startswith("COMET_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("COMET_CONFIG", str(tmp_path / "no-comet-config"))
    monkeypatch.setenv("COMET_URL_OVERRIDE", "http://127.0.0.1:9/clientlib/")


def _messages(folder) -> list[dict]:
    """The records of the one offline archive in ``folder``."""
    (archive,) = [f for f in os.listdir(folder) if f.endswith(".zip")]
    with zipfile.ZipFile(os.path.join(folder, archive)) as zf:
        return [json.loads(line) for line in zf.read("messages.json").decode().splitlines() if line.strip()]


def _metrics(messages: list[dict]) -> dict[str, list[tuple]]:
    out: dict[str, list[tuple]] = {}
    for m in messages:
        if m["type"] == "metric_msg" and not m["payload"]["metric"]["metricName"].startswith("sys."):
            metric = m["payload"]["metric"]
            out.setdefault(metric["metricName"], []).append((metric["step"], metric["epoch"]))
    return out


def test_fit_and_test_log_into_one_offline_experiment_that_pickles_with_the_trainer(tmp_path):
    logger = CometLogger(online=False, project="proj", prefix="run1", offline_directory=str(tmp_path / "comet"))
    assert (logger.name, logger.save_dir) == ("proj", str(tmp_path / "comet")) and len(logger.version) == 32
    trainer = Trainer(max_epochs=2, logger=logger, log_every_n_steps=2, enable_progress_bar=False,
                      enable_checkpointing=False, enable_model_summary=False)
    model = Classifier()
    trainer.fit(model, loader(64, batch_size=16), loader(32, batch_size=16))
    trainer.test(model, loader(32, batch_size=16))
    key = logger.version
    again = pickle.loads(pickle.dumps(trainer))  # the experiment stays behind; its key goes along
    assert again.logger._experiment is None and again.logger._experiment_key == key
    logger.experiment.end()  # writes the archive

    messages = _messages(tmp_path / "comet")
    params = {m["payload"]["param"]["paramName"]: m["payload"]["param"]["paramValue"]
              for m in messages if m["type"] == "parameter_msg" and m["payload"]["param"]["source"] == "manual"}
    assert params["hidden"] == 16 and params["lr"] == 0.1  # save_hyperparameters, at fit's start
    metrics = _metrics(messages)
    # 4 steps an epoch, logged every 2nd, with the epoch beside the step; the prefix joins with '_' (Comet's)
    assert metrics["run1_train_loss"] == [(1, 0), (3, 0), (5, 1), (7, 1)]
    assert metrics["run1_val_loss"] == [(3, 0), (7, 1)] and metrics["run1_test_loss"] == [(8, 2)]
    assert "run1_epoch" not in metrics
    others = {m["payload"]["key"]: m["payload"]["value"] for m in messages if m["type"] == "log_other"}
    assert others["Created from"] == "pytorch-lightning"


def test_arguments_are_checked_and_lightnings_old_names_still_work(tmp_path, monkeypatch, caplog):
    with pytest.raises(ValueError, match=r"CometLogger\(mode='reuse'\) must be one of \[None, 'get_or_create'"):
        CometLogger(mode="reuse")
    with pytest.raises(TypeError, match=r"CometLogger\(online='no'\) must be True"):
        CometLogger(online="no")
    with pytest.raises(TypeError, match=r"CometLogger\(project=3\) must be a string"):
        CometLogger(project=3)
    logger = CometLogger(offline=True, save_dir=str(tmp_path / "old"), project_name="older")
    assert (logger.name, logger.save_dir) == ("older", str(tmp_path / "old"))
    logger.log_metrics({"loss": torch.tensor(0.5), "epoch": 0}, step=4)
    logger.experiment.end()
    assert _metrics(_messages(tmp_path / "old")) == {"loss": [(4, 0)]}
    assert "The parameter `save_dir` is deprecated, please use `offline_directory` instead." in caplog.text
    monkeypatch.setitem(sys.modules, "comet_ml", None)  # as if not installed
    with pytest.raises(ModuleNotFoundError, match=r'not installed: pip install "comet-ml.*steadytrainer\[comet\]'):
        CometLogger()
