"""ThroughputMonitor: the values in a real CSV logger's metrics.csv, at Lightning's keys and steps."""

from __future__ import annotations

import csv
import os

import pytest
import torch

from callbacks import ThroughputMonitor, measure_flops
from loggers import CSVLogger
from tests._models import Classifier, loader
from trainer import Trainer


def _rows(folder) -> list[dict[str, str]]:
    with open(os.path.join(folder, "lightning_logs", "version_0", "metrics.csv")) as f:
        return [{k: v for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


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


class Counted(Classifier):
    """A Classifier that knows its FLOPs per training batch of 16."""

    def __init__(self) -> None:
        super().__init__()
        with torch.device("meta"):
            twin, x, y = Classifier(), torch.randn(16, 8), torch.randint(0, 2, (16,))
        self.flops_per_batch = measure_flops(
            twin, lambda: twin(x), lambda out: torch.nn.functional.cross_entropy(out, y)
        )


def test_training_rates_are_logged_at_each_logging_step_once_the_window_is_full(tmp_path):
    monitor = ThroughputMonitor(
        batch_size_fn=lambda batch: batch[0].size(0), length_fn=lambda batch: 3 * batch[0].size(0), window_size=3
    )
    model = Counted()
    _trainer(tmp_path, monitor, max_epochs=2, log_every_n_steps=2, limit_val_batches=0).fit(model, loader(128))
    rows = [r for r in _rows(tmp_path) if "train/batches" in r]
    assert [int(r["step"]) for r in rows] == [1, 3, 5, 7, 9, 11, 13, 15]  # 8 batches an epoch, every second step
    assert [int(float(r["train/samples"])) for r in rows] == [16 * (int(r["step"]) + 1) for r in rows]
    assert [int(float(r["train/lengths"])) for r in rows] == [48 * (int(r["step"]) + 1) for r in rows]
    assert [float(r["epoch"]) for r in rows] == [0] * 4 + [1] * 4
    assert "train/device/batches_per_sec" not in rows[0]  # two updates: the window of 3 is not full yet
    for row in rows[1:]:
        per_sec = float(row["train/device/batches_per_sec"])
        assert float(row["train/device/samples_per_sec"]) == pytest.approx(16 * per_sec)
        assert float(row["train/device/items_per_sec"]) == pytest.approx(48 * per_sec)
        assert float(row["train/device/flops_per_sec"]) == pytest.approx(model.flops_per_batch * per_sec)
        assert "train/device/mfu" not in row  # no peak FLOPs known on a CPU


def test_under_accumulation_a_row_comes_only_after_an_optimizer_step(tmp_path):
    monitor = ThroughputMonitor(batch_size_fn=lambda batch: 16, window_size=2)
    _trainer(tmp_path, monitor, accumulate_grad_batches=3, limit_val_batches=0).fit(Classifier(), loader(128))
    rows = [r for r in _rows(tmp_path) if "train/batches" in r]
    # 8 batches: steps after batches 3, 6 and the epoch's last, 8
    assert [(int(r["step"]), int(float(r["train/batches"]))) for r in rows] == [(0, 3), (1, 6), (2, 8)]


def test_validation_has_its_own_counts_and_rows(tmp_path):
    monitor = ThroughputMonitor(batch_size_fn=lambda batch: batch[0].size(0), window_size=2)
    _trainer(tmp_path, monitor, max_epochs=2, limit_val_batches=2).fit(Classifier(), loader(64), loader(64))
    rows = [r for r in _rows(tmp_path) if "validate/batches" in r]
    # the validation loop's batches over the fit: two each epoch, rows at that count
    assert [(int(r["step"]), int(float(r["validate/batches"]))) for r in rows] == [(1, 1), (2, 2), (3, 1), (4, 2)]
    assert not any("train/" in k for r in rows for k in r)


def test_test_counts_on_across_calls(tmp_path):
    monitor = ThroughputMonitor(batch_size_fn=lambda batch: 16, window_size=3)
    trainer = _trainer(tmp_path, monitor, log_every_n_steps=3)
    trainer.test(Classifier(), loader(96))
    trainer.test(Classifier(), loader(96))
    rows = [r for r in _rows(tmp_path) if "test/batches" in r]
    assert [(int(r["step"]), int(float(r["test/samples"]))) for r in rows] == [(3, 48), (6, 96), (9, 144), (12, 192)]
    assert all("test/device/samples_per_sec" in r for r in rows)


def test_a_model_without_flops_per_batch_is_warned_about_once(tmp_path):
    monitor = ThroughputMonitor(batch_size_fn=lambda batch: 16)
    with pytest.warns(UserWarning, match="define a `flops_per_batch` attribute") as caught:
        _trainer(tmp_path, monitor, limit_val_batches=0, limit_train_batches=3).fit(Classifier(), loader(64))
    assert sum("flops_per_batch" in str(w.message) for w in caught) == 1


def test_batch_size_fn_must_be_a_function():
    with pytest.raises(TypeError, match="batch_size_fn=16"):
        ThroughputMonitor(batch_size_fn=16)
