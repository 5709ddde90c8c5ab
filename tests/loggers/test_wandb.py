"""WandbLogger with a real wandb run, offline, read back from the run's own record file (run-<id>.wandb)."""

from __future__ import annotations

import glob
import json
import os
import pickle
import struct
import sys
import time

import pytest
import torch
import wandb
from wandb.proto import wandb_internal_pb2

from loggers import DummyExperiment, WandbLogger, rank_zero_only
from tests._models import Classifier, loader
from trainer import MisconfigurationException, Trainer


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path):
    """Nothing reaches the network: offline mode, no key, a server address that answers nothing,
    and wandb's own folders (settings, cache, artifacts) in the test's folder."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home"))
    yield
    if wandb.run is not None:  # a test that failed before finishing its run
        wandb.finish()
    wandb.teardown()  # and its service process, which outlives runs: a later test in this worker counts children


# --- the run's record file: LevelDB-style 32 KiB blocks of chunks, each a wandb_internal_pb2.Record ---
_BLOCK, _HEADER = 32768, 7


def _records(run_folder: str, timeout: float = 30.0) -> list:
    """The records of the finished run in ``run_folder``; ``finish()`` may return before wandb's
    service writes the file or the last of its records, so wait for the exit record."""
    deadline = time.monotonic() + timeout
    while True:
        paths = glob.glob(os.path.join(run_folder, "run-*.wandb"))  # (not even there, at first)
        found = _read(paths[0]) if paths else []
        if any(r.WhichOneof("record_type") == "exit" for r in found) or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def _read(path: str) -> list:
    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B", data[:7]
    found, pos, parts = [], _HEADER, b""
    while pos + _HEADER <= len(data):
        left = _BLOCK - pos % _BLOCK
        _, length, kind = struct.unpack("<IHB", data[pos:pos + _HEADER])
        if left < _HEADER or (kind == 0 and length == 0):  # a block's padding
            pos += left
            continue
        if pos + _HEADER + length > len(data):  # a chunk still being written
            break
        parts = (b"" if kind in (1, 2) else parts) + data[pos + _HEADER:pos + _HEADER + length]
        pos += _HEADER + length
        if kind in (1, 4):  # FULL, or the LAST of FIRST/MIDDLE.../LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            found.append(record)
    return found


def _items(items) -> dict:
    """Items (a ``key``, or a ``nested_key`` path into dicts, and a JSON value) as a dict."""
    found: dict = {}
    for item in items:
        *path, last = list(item.nested_key) or [item.key]
        place = found
        for key in path:
            place = place.setdefault(key, {})
        place[last] = json.loads(item.value_json)
    return found


def _run(records) -> tuple[dict, list[dict], dict]:
    """(config, history rows, summary) as the W&B app would show them."""
    config, history, summary = {}, [], {}
    for r in records:
        kind = r.WhichOneof("record_type")
        if kind in ("run", "config"):
            config.update(_items((r.run.config if kind == "run" else r.config).update))
        elif kind == "history":
            history.append(_items(r.history.item))
        elif kind == "summary":
            summary.update(_items(r.summary.update))
    return config, history, summary


def test_an_offline_fit_records_the_config_rows_at_trainer_global_step_and_the_gradients():
    logger = WandbLogger(project="proj", name="first", save_dir="wb", offline=True)
    model = Classifier(hidden=12)
    logger.watch(model, log="all", log_freq=2)
    trainer = Trainer(max_epochs=2, log_every_n_steps=2, enable_progress_bar=False, enable_model_summary=False,
                      logger=logger)
    trainer.fit(model, loader(64), loader(32))  # 4 steps an epoch
    run = logger.experiment
    folder, run_id = os.path.dirname(run.dir), run.id
    assert (logger.name, logger.version, logger.save_dir, run.name) == ("proj", run_id, "wb", "first")
    assert trainer.log_dir == "wb"
    assert trainer.checkpoint_callback.dirpath == os.path.abspath(os.path.join("wb", "proj", run_id, "checkpoints"))
    run.finish()
    assert os.path.dirname(folder) == os.path.abspath(os.path.join("wb", "wandb"))
    assert os.path.basename(folder).startswith("offline-run-")
    config, history, summary = _run(_records(folder))
    expected = {"features": 8, "hidden": 12, "lr": 0.1, "optimizer": "sgd"}
    assert {k: config[k] for k in expected} == expected
    train = [(row["trainer/global_step"], row["epoch"]) for row in history if "train_loss" in row]
    assert train == [(1, 0), (3, 0), (5, 1), (7, 1)]  # Lightning's steps
    val = [row for row in history if "val_loss" in row]
    assert [row["trainer/global_step"] for row in val] == [3, 7]
    assert val[-1]["val_loss"] == pytest.approx(trainer.callback_metrics["val_loss"].item(), rel=1e-6)
    assert summary["val_loss"] == val[-1]["val_loss"] and summary["trainer/global_step"] == 7
    assert any(k.startswith("gradients/net.0.weight") for row in history for k in row)  # watch(log="all")
    assert any(k.startswith("parameters/net.0.weight") for row in history for k in row)


def test_id_names_and_resumes_the_run_and_media_and_prefix_reach_its_rows():
    logger = WandbLogger(id="run0001", save_dir="wb", offline=True, prefix="eval")
    assert logger.version == "run0001" and logger.name == "lightning_logs"  # before the run starts
    logger.log_hyperparams({"optimizer": torch.optim.SGD, "layers": [4, 4], "device": torch.device("cpu")})
    logger.log_table("samples", columns=["text", "label"], data=[["a", 0], ["b", 1]], step=3)
    logger.log_image("pictures", images=[torch.rand(3, 8, 8), torch.rand(3, 8, 8)], caption=["one", "two"], step=4)
    assert logger.experiment.id == "run0001"
    folder = os.path.dirname(logger.experiment.dir)
    logger.experiment.finish()
    config, history, _ = _run(_records(folder))
    assert config["optimizer"] == "SGD" and config["layers"] == [4, 4] and config["device"] == "cpu"  # as JSON
    assert history[0]["eval-samples"]["_type"] == "table-file" and history[0]["trainer/global_step"] == 3
    assert history[1]["eval-pictures"]["_type"] == "images/separated" and history[1]["eval-pictures"]["count"] == 2
    assert history[1]["trainer/global_step"] == 4
    resumed = WandbLogger(version="run0001", save_dir="wb", offline=True)
    resumed.log_metrics({"loss": 1.0}, step=9)
    assert resumed.experiment.id == "run0001"
    resumed.experiment.finish()


def test_a_run_in_progress_is_reused_and_a_pickled_logger_keeps_its_run():
    run = wandb.init(project="mine", dir=".", mode="offline")
    logger = WandbLogger(offline=True)
    with pytest.warns(UserWarning, match="There is a wandb run already in progress"):
        assert logger.experiment is run
    copy = pickle.loads(pickle.dumps(logger))
    assert copy.version == run.id and copy.name == "lightning_logs" and copy.save_dir == "."
    run.finish()


def test_ranks_other_than_0_start_no_run(monkeypatch):
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    logger = WandbLogger(save_dir="wb", offline=True)
    assert isinstance(logger.experiment, DummyExperiment)
    logger.log_hyperparams({"lr": 0.1})
    logger.log_metrics({"loss": 1.0}, step=0)
    logger.finalize("success")
    assert wandb.run is None and not os.path.exists("wb")


def test_bad_arguments_and_a_missing_wandb_are_sentences(monkeypatch):
    with pytest.raises(MisconfigurationException, match="Providing log_model=True and offline=True is an invalid"):
        WandbLogger(offline=True, log_model=True)
    with pytest.raises(ValueError, match=r"WandbLogger\(log_model='best'\) must be False"):
        WandbLogger(log_model="best")
    logger = WandbLogger(offline=True)
    with pytest.raises(TypeError, match='Expected a list as "images"'):
        logger.log_image("x", images=torch.rand(3, 4, 4))
    with pytest.raises(ValueError, match="Expected 2 items but only found 1 for caption"):
        logger.log_image("x", images=[torch.rand(3, 4, 4)] * 2, caption=["one"])
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(ModuleNotFoundError, match=r'not installed: pip install "wandb.*steadytrainer\[wandb\]'):
        WandbLogger()


def test_log_model_all_logs_each_checkpoint_as_a_model_artifact():
    from callbacks import ModelCheckpoint

    logger = WandbLogger(save_dir="wb", log_model="all")  # offline through WANDB_MODE: the artifacts wait for a sync
    trainer = Trainer(max_epochs=2, log_every_n_steps=2, enable_progress_bar=False, enable_model_summary=False,
                      logger=logger, callbacks=[ModelCheckpoint(save_top_k=-1, filename="{epoch}")])
    trainer.fit(Classifier(), loader(64), loader(32))
    run = logger.experiment
    folder = os.path.dirname(run.dir)
    run.finish()
    artifacts = [r.artifact for r in _records(folder) if r.WhichOneof("record_type") == "artifact"]
    assert [(a.name, a.type) for a in artifacts] == [(f"model-{run.id}", "model")] * 2
    assert [json.loads(a.metadata)["original_filename"] for a in artifacts] == ["epoch=0.ckpt", "epoch=1.ckpt"]
    assert [[e.path for e in a.manifest.contents] for a in artifacts] == [["model.ckpt"]] * 2
