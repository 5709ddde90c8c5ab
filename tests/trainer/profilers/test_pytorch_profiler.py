"""trainer/profilers/pytorch.py: torch.profiler's operators, module labels, traces and the checks, on the CPU."""

from __future__ import annotations

import copy
import json
import os
import pickle

import pytest
import torch
from torch import nn

from trainer import MisconfigurationException, Trainer
from trainer.profilers import PyTorchProfiler
from trainer.profilers.pytorch import RegisterRecordFunction

from tests._models import Classifier, loader, quiet


def test_nested_actions_and_their_operators_are_recorded(tmp_path):
    profiler = PyTorchProfiler(dirpath=tmp_path, filename="profiler", schedule=None)
    with profiler.profile("a"):
        a = torch.ones(42)
        with profiler.profile("b"):
            b = torch.zeros(42)
        with profiler.profile("c"):
            _ = a + b
    profiler.describe()
    names = {e.name for e in profiler.function_events}
    assert {"[pl][profile]a", "[pl][profile]b", "[pl][profile]c", "aten::ones", "aten::zeros", "aten::add"} <= names
    report = (tmp_path / "profiler.txt").read_text()
    assert report.startswith("Profiler Report") and "Profile stats for: records" in report and "aten::add" in report
    assert copy.deepcopy(profiler).function_events is not None


def test_register_record_function_labels_each_submodule(tmp_path):
    profiler = PyTorchProfiler(dirpath=tmp_path, filename="p", schedule=None, export_to_chrome=False)
    model = nn.Sequential(nn.Linear(1, 1), nn.ReLU())
    with profiler.profile("a"), RegisterRecordFunction(model):
        model(torch.rand(1, 1))
    profiler.describe()
    names = {e.name for e in profiler.function_events}
    assert {"[pl][module]torch.nn.modules.linear.Linear: 0", "[pl][module]torch.nn.modules.activation.ReLU: 1"} <= names
    assert not model[0]._forward_hooks and not model[0]._forward_pre_hooks  # the hooks are gone after


def test_a_fit_records_the_steps_the_modules_and_writes_a_chrome_trace(tmp_path):
    profiler = PyTorchProfiler(dirpath=tmp_path, filename="profile")
    trainer = Trainer(max_epochs=1, limit_train_batches=6, limit_val_batches=6, profiler=profiler, **quiet())
    trainer.fit(Classifier(), loader(96), loader(96))
    names = {e.name for e in profiler.function_events}
    assert "[pl][profile][Strategy]SingleDeviceStrategy.validation_step" in names
    assert "[pl][module]torch.nn.modules.linear.Linear: net.0" in names  # record_module_names=True
    assert "FIT Profiler Report" in (tmp_path / "fit-profile.txt").read_text()
    traces = [f for f in os.listdir(tmp_path) if f.endswith(".pt.trace.json")]
    # one trace per kind of step, after the default schedule's 3 active steps (wait=1, warmup=1, active=3)
    assert any(f.startswith("fit-profile-[Strategy]SingleDeviceStrategy.training_step") for f in traces), traces
    assert any(f.startswith("fit-profile-[Strategy]SingleDeviceStrategy.validation_step") for f in traces), traces
    with open(tmp_path / traces[0]) as f:
        assert json.load(f)["traceEvents"]


@pytest.mark.parametrize(("fn", "step"), [("validate", "validation_step"), ("test", "test_step"), ("predict", "predict_step")])
def test_each_evaluation_stage_is_profiled(tmp_path, fn, step):
    profiler = PyTorchProfiler(dirpath=tmp_path, filename="profile", schedule=None)
    trainer = Trainer(limit_val_batches=2, limit_test_batches=2, limit_predict_batches=2, profiler=profiler, **quiet())
    getattr(trainer, fn)(Classifier(), loader(32))
    assert any(e.name == f"[pl][profile][Strategy]SingleDeviceStrategy.{step}" for e in profiler.function_events)
    assert (tmp_path / f"{fn}-profile.txt").read_text()
    assert any(f.startswith(f"{fn}-profile") and f.endswith(".json") for f in os.listdir(tmp_path))


def test_too_few_steps_for_the_default_schedule_warns_and_records_every_step(tmp_path):
    trainer = Trainer(max_epochs=1, limit_train_batches=3, profiler="pytorch", **quiet(log_dir=str(tmp_path)))
    with pytest.warns(UserWarning, match="not enough steps to properly record traces"):
        trainer.fit(Classifier(), loader(48))
    assert trainer.profiler._schedule is None
    names = [e.name for e in trainer.profiler.function_events]
    # the first step ran under the default schedule's wait; the override records the ones after it
    assert names.count("[pl][profile][Strategy]SingleDeviceStrategy.training_step") == 2


def test_the_traces_go_to_the_loggers_folder(tmp_path):
    trainer = Trainer(max_epochs=1, limit_train_batches=5, profiler="pytorch", enable_progress_bar=False,
                      enable_checkpointing=False, default_root_dir=tmp_path)
    trainer.fit(Classifier(), loader(80))
    assert trainer.log_dir == str(tmp_path / "lightning_logs" / "version_0")
    assert any(f.endswith("trace.json") for f in os.listdir(trainer.log_dir))


def test_table_kwargs_shape_the_report(tmp_path):
    widths = []
    for table_kwargs in ({"max_name_column_width": 5}, None):
        profiler = PyTorchProfiler(dirpath=tmp_path, filename="p", schedule=None, table_kwargs=table_kwargs)
        with profiler.profile("a"):
            torch.ones(1)
        profiler.describe()
        widths.append(profiler.summary().count("-"))
    assert widths[0] < widths[1]


def test_the_arguments_are_checked_when_it_is_built():
    with pytest.raises(MisconfigurationException, match="Found sort_by_key: cpu. Should be within"):
        PyTorchProfiler(sort_by_key="cpu")
    with pytest.raises(KeyError, match="Found invalid table_kwargs key: row_limit. This is already a positional argument"):
        PyTorchProfiler(table_kwargs={"row_limit": 3})
    with pytest.raises(KeyError, match="Found invalid table_kwargs key: widht. Should be within"):
        PyTorchProfiler(table_kwargs={"widht": 3})
    with pytest.raises(MisconfigurationException, match="Schedule should be a callable. Found: 3"):
        PyTorchProfiler(schedule=3)
    with pytest.raises(MisconfigurationException, match="Schedule should return a `torch.profiler.ProfilerAction`"):
        PyTorchProfiler(schedule=lambda step: "record")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_emit_nvtx_needs_cuda():
    with pytest.raises(ValueError, match=r"emit_nvtx=True\) marks NVTX ranges .* this machine has none"):
        PyTorchProfiler(emit_nvtx=True)


def test_a_profiler_that_ran_can_be_pickled(tmp_path):
    profiler = PyTorchProfiler(dirpath=tmp_path, filename="p", schedule=None)
    profiler.start("on_train_start")
    torch.tensor(1)
    clone = pickle.loads(pickle.dumps(profiler))  # a spawned worker's copy: the running profiler stays behind
    assert clone.profiler is None
    profiler.describe()
    assert pickle.loads(pickle.dumps(profiler)).function_events is not None
