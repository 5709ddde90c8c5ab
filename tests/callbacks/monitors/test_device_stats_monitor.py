"""DeviceStatsMonitor: the keys in a real CSV logger's metrics.csv, when they are written, and its errors."""

from __future__ import annotations

import csv
import os

import pytest

from callbacks import DeviceStatsMonitor
from loggers import CSVLogger
from tests._models import Classifier, loader
from tests.conftest import requires_cuda
from trainer import MisconfigurationException, Trainer


def _rows(folder) -> list[dict[str, str]]:
    with open(os.path.join(folder, "lightning_logs", "version_0", "metrics.csv")) as f:
        return list(csv.DictReader(f))


def _trainer(tmp_path, monitor, **options):
    options = (
        dict(
            max_epochs=1,
            log_every_n_steps=1,
            enable_progress_bar=False,
            enable_checkpointing=False,
            enable_model_summary=False,
            logger=CSVLogger(tmp_path),
            callbacks=[monitor],
        )
        | options
    )
    return Trainer(**options)


def test_cpu_stats_of_each_stage_are_in_metrics_csv(tmp_path):
    trainer = _trainer(tmp_path, DeviceStatsMonitor(), limit_val_batches=2, num_sanity_val_steps=0)
    trainer.fit(Classifier(), loader(64), loader(32))
    trainer.test(Classifier(), loader(32))
    rows = _rows(tmp_path)
    for hook in (
        "on_train_batch_start",
        "on_train_batch_end",
        "on_validation_batch_start",
        "on_validation_batch_end",
        "on_test_batch_start",
        "on_test_batch_end",
    ):
        for key in ("cpu_percent", "cpu_vm_percent", "cpu_swap_percent"):
            values = [
                float(r[f"DeviceStatsMonitor.{hook}/{key}"]) for r in rows if r.get(f"DeviceStatsMonitor.{hook}/{key}")
            ]
            assert values and all(0 <= v <= 100 for v in values), (hook, key)
    train_steps = sorted({int(r["step"]) for r in rows if r.get("DeviceStatsMonitor.on_train_batch_end/cpu_percent")})
    assert train_steps == [0, 1, 2, 3]  # Lightning's: the steps taken before each batch


def test_log_every_n_steps_sets_the_cadence_and_filter_keys_the_keys(tmp_path):
    monitor = DeviceStatsMonitor(filter_keys={"cpu_percent"})
    trainer = _trainer(tmp_path, monitor, log_every_n_steps=2, limit_val_batches=0, max_epochs=2)
    trainer.fit(Classifier(), loader(64))
    rows = _rows(tmp_path)
    stats = [k for k in rows[0] if k.startswith("DeviceStatsMonitor")]
    assert sorted(stats) == [
        "DeviceStatsMonitor.on_train_batch_end/cpu_percent",
        "DeviceStatsMonitor.on_train_batch_start/cpu_percent",
    ]
    steps = sorted({int(r["step"]) for r in rows if r.get("DeviceStatsMonitor.on_train_batch_end/cpu_percent")})
    assert steps == [1, 3, 5, 7]


def test_cpu_stats_false_logs_nothing_on_the_cpu(tmp_path):
    trainer = _trainer(tmp_path, DeviceStatsMonitor(cpu_stats=False), limit_val_batches=0)
    trainer.fit(Classifier(), loader(64))
    assert not any(k.startswith("DeviceStatsMonitor") for r in _rows(tmp_path) for k in r if r[k])


def test_fit_without_a_logger_is_an_error(tmp_path):
    trainer = Trainer(
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        callbacks=[DeviceStatsMonitor()],
    )
    with pytest.raises(MisconfigurationException, match="Cannot use `DeviceStatsMonitor` callback with `Trainer"):
        trainer.fit(Classifier(), loader(64))


def test_an_unknown_filter_key_is_warned_about(tmp_path):
    trainer = _trainer(
        tmp_path, DeviceStatsMonitor(filter_keys={"cpu_percnt"}), limit_train_batches=1, limit_val_batches=0
    )
    with pytest.warns(UserWarning, match="filter_keys contains keys not found in device stats.*cpu_percnt"):
        trainer.fit(Classifier(), loader(64))


def test_without_psutil_fit_stops_at_setup_with_the_install_command(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "psutil", None)  # as if not installed: its import fails
    trainer = _trainer(tmp_path, DeviceStatsMonitor(), limit_val_batches=0)
    with pytest.raises(
        ModuleNotFoundError, match=r"psutil` is not installed: pip install psutil .*steadytrainer\[monitors\]"
    ):
        trainer.fit(Classifier(), loader(64))


@requires_cuda(1)
def test_cuda_memory_statistics_on_a_gpu(tmp_path):
    trainer = _trainer(tmp_path, DeviceStatsMonitor(), accelerator="cuda", devices=1, limit_val_batches=0)
    trainer.fit(Classifier(), loader(64))
    keys = set(_rows(tmp_path)[0])
    for key in (
        "allocated_bytes.all.current",
        "allocated_bytes.all.peak",
        "reserved_bytes.large_pool.peak",
        "num_ooms",
    ):
        assert f"DeviceStatsMonitor.on_train_batch_end/{key}" in keys
    assert not any(k.endswith("/cpu_percent") for k in keys)  # cpu_stats=None: the GPU's only
