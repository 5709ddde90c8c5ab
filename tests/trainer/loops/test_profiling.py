"""trainer/loops/profiling.py: what Trainer(profiler=...) records, with Lightning's names, and what it costs when off."""

from __future__ import annotations

import pytest

from callbacks import Callback, EarlyStopping
from trainer import MisconfigurationException, Trainer
from trainer.profilers import AdvancedProfiler, PassThroughProfiler, Profiler, PyTorchProfiler, SimpleProfiler

from tests._models import Classifier, loader, quiet


class Watch(Callback):
    def on_train_epoch_end(self, trainer, module):
        pass


class Timed(Classifier):
    """A module that profiles an action of its own, through the Trainer's profiler."""

    def training_step(self, batch, batch_idx):
        with self.trainer.profiler.profile("my_action"):
            x, y = batch
        return super().training_step((x, y), batch_idx)


def test_a_validation_cut_at_its_limit_records_only_the_batches_it_ran_as_lightnings():
    profiler = SimpleProfiler()
    trainer = Trainer(max_epochs=1, limit_train_batches=1, limit_val_batches=2, num_sanity_val_steps=0,
                      profiler=profiler, **quiet())
    trainer.fit(Classifier(), loader(16), loader(96))  # 6 validation batches, 2 run: no third draw
    assert len(profiler.recorded_durations["[_EvaluationLoop].val_next"]) == 2


def test_a_short_fit_records_lightnings_actions_and_counts(tmp_path):
    profiler = SimpleProfiler(dirpath=tmp_path, filename="perf")
    trainer = Trainer(max_epochs=2, limit_train_batches=3, limit_val_batches=2, profiler=profiler, callbacks=[Watch()], **quiet())
    trainer.fit(Timed(), loader(48), loader(32))
    calls = {action: len(durations) for action, durations in profiler.recorded_durations.items()}
    key = Watch().state_key
    expected = {
        "run_training_epoch": 2, "run_training_batch": 6, "my_action": 6, "optimizer_step": 6,
        "[Strategy]SingleDeviceStrategy.training_step": 6, "[Strategy]SingleDeviceStrategy.backward": 6,
        "[Strategy]SingleDeviceStrategy.validation_step": 2 + 2 * 2,  # the sanity check's, then each epoch's
        "[_TrainingEpochLoop].train_dataloader_next": 2 * 4,  # each epoch's 3 batches, and the draw that stops it
        "[_EvaluationLoop].val_next": 3 * 3,  # each of the 3 runs: 2 batches, and the draw that finds the loader's end
        f"[Callback]{key}.on_train_epoch_end": 2,  # the callback's own hook
        f"[Callback]{key}.on_train_batch_start": 6,  # one it does not override, as Lightning calls it
        "[LightningModule]Timed.on_train_epoch_start": 2, "[LightningModule]Timed.setup": 1,
    }
    assert {action: calls.get(action) for action in expected} == expected
    report = (tmp_path / "fit-perf.txt").read_text()
    assert report.startswith("FIT Profiler Report") and "run_training_batch" in report and "my_action" in report
    assert not trainer.optimizers[0]._optimizer_step_pre_hooks  # the optimizer's step hooks are gone after fit


def test_validate_test_and_predict_write_one_report_each_in_the_log_dir(tmp_path):
    profiler = SimpleProfiler(filename="perf")
    trainer = Trainer(limit_val_batches=2, limit_test_batches=2, limit_predict_batches=2, profiler=profiler,
                      enable_progress_bar=False, logger=False, default_root_dir=tmp_path)
    model = Classifier()
    trainer.validate(model, loader(32), verbose=False)
    trainer.test(model, loader(32), verbose=False)
    trainer.predict(model, loader(32))
    assert profiler.dirpath == str(tmp_path) == trainer.log_dir
    assert sorted(p.name for p in tmp_path.iterdir()) == ["predict-perf.txt", "test-perf.txt", "validate-perf.txt"]
    assert "[Strategy]SingleDeviceStrategy.test_step" in (tmp_path / "test-perf.txt").read_text()
    assert "[_PredictionLoop].predict_next" in (tmp_path / "predict-perf.txt").read_text()
    calls = {action: len(durations) for action, durations in profiler.recorded_durations.items()}
    assert calls["[Strategy]SingleDeviceStrategy.predict_step"] == 2 and calls["[_EvaluationLoop].test_next"] == 2 + 1  # and the end


def test_without_a_filename_the_report_is_logged(trainer_log):
    trainer = Trainer(max_steps=1, profiler="simple", **quiet())
    trainer.fit(Classifier(), loader(16))
    assert sum("FIT Profiler Report" in line for line in trainer_log) == 1


def test_a_users_profiler_gets_the_stage_and_every_action():
    class Recorder(Profiler):
        def __init__(self):
            super().__init__()
            self.events = []

        def start(self, action_name):
            self.events.append(("start", action_name))

        def stop(self, action_name):
            self.events.append(("stop", action_name))

        def summary(self):
            return f"{len(self.events)} events"

    profiler = Recorder()
    trainer = Trainer(max_steps=1, profiler=profiler, **quiet())
    trainer.fit(Classifier(), loader(16))
    assert profiler._stage == "fit" and trainer.profiler is profiler
    batch = [e for e in profiler.events if "run_training_batch" in e[1] or "training_step" in e[1] or e[1] == "optimizer_step"]
    assert batch == [
        ("start", "run_training_batch"), ("start", "[Strategy]SingleDeviceStrategy.training_step"),
        ("stop", "[Strategy]SingleDeviceStrategy.training_step"), ("start", "optimizer_step"), ("stop", "optimizer_step"),
        ("stop", "run_training_batch"),
    ]
    assert profiler.events.count(("start", "run_training_epoch")) == 1


def test_a_batch_that_ends_the_epoch_early_closes_its_record():
    class EndAtTwo(Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            return -1 if batch_idx == 1 else None

    profiler = SimpleProfiler()
    trainer = Trainer(max_epochs=2, profiler=profiler, **quiet(callbacks=[EndAtTwo()]))
    trainer.fit(Classifier(), loader(64))
    assert len(profiler.recorded_durations["run_training_batch"]) == 4 and not profiler.current_actions


def test_the_default_profiler_records_nothing_and_the_loop_is_untouched():
    seen = {}

    class Peek(Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            seen["hooks"] = trainer._current_run().hooks.on_train_batch_start

    peek = Peek()
    trainer = Trainer(max_steps=1, callbacks=[peek], **quiet())
    trainer.fit(Classifier(), loader(16))
    assert isinstance(trainer.profiler, PassThroughProfiler)
    assert seen["hooks"] == [peek.on_train_batch_start]  # the callback's own method, nothing around it


def test_a_module_can_hold_its_own_passthrough_profiler():
    class Custom(Classifier):
        def __init__(self, profiler=None):
            super().__init__()
            self.profiler = profiler or PassThroughProfiler()

        def training_step(self, batch, batch_idx):
            with self.profiler.profile("my_custom_action"):
                return super().training_step(batch, batch_idx)

    Trainer(max_steps=1, **quiet()).fit(Custom(), loader(16))  # records nothing, costs a with block
    profiler = SimpleProfiler()
    Trainer(max_steps=2, profiler=profiler, **quiet()).fit(Custom(profiler), loader(32))
    assert len(profiler.recorded_durations["my_custom_action"]) == 2


def test_callbacks_of_one_type_are_told_apart_by_their_state_key():
    profiler = SimpleProfiler()
    trainer = Trainer(fast_dev_run=1, profiler=profiler, callbacks=[EarlyStopping("val_loss"), EarlyStopping("train_loss")],
                      enable_progress_bar=False)
    trainer.fit(Classifier(), loader(16), loader(16))
    for monitor in ("val_loss", "train_loss"):
        assert len(profiler.recorded_durations[f"[Callback]EarlyStopping{{'monitor': '{monitor}', 'mode': 'min'}}.on_validation_start"]) == 1


@pytest.mark.parametrize(
    ("given", "kind"),
    [(None, PassThroughProfiler), ("simple", SimpleProfiler), ("Simple", SimpleProfiler), ("advanced", AdvancedProfiler),
     ("pytorch", PyTorchProfiler), (SimpleProfiler(), SimpleProfiler)],
)
def test_trainer_profiler_takes_a_name_or_an_instance(given, kind):
    assert type(Trainer(profiler=given).profiler) is kind


def test_a_bad_profiler_is_refused_with_the_choices():
    with pytest.raises(MisconfigurationException, match=r"it can only be one of \['simple', 'advanced', 'pytorch', 'xla'\]"
                       r".*Unknown profiler='simpel'.*Did you mean 'simple'"):
        Trainer(profiler="simpel")
    with pytest.raises(MisconfigurationException, match="profiler='xla' profiles TPUs through torch_xla"):
        Trainer(profiler="xla")
    with pytest.raises(TypeError, match=r"profiler=3 must be None, one of 'simple', 'advanced', 'pytorch', or a trainer.profilers.Profiler"):
        Trainer(profiler=3)
    with pytest.raises(ValueError, match=r"`Trainer\(barebones=True, profiler='simple'\)` was passed. Profiling can impact raw speed"):
        Trainer(barebones=True, profiler="simple")


def test_an_advanced_profile_of_a_fit_names_the_models_functions(tmp_path):
    profiler = AdvancedProfiler(dirpath=tmp_path, filename="perf")
    Trainer(max_steps=2, profiler=profiler, **quiet()).fit(Classifier(), loader(32))
    report = (tmp_path / "fit-perf.txt").read_text()
    step = report[report.index("Profile stats for: [Strategy]SingleDeviceStrategy.training_step"):]
    assert "training_step" in step.split("Profile stats for:")[1] and "cross_entropy" in step.split("Profile stats for:")[1]


@pytest.mark.slow
@pytest.mark.usefixtures("ranks_from_the_fork_server")  # ranks fork from a warm server: see tests/conftest.py
def test_under_ddp_each_rank_writes_its_own_report(tmp_path):
    profiler = SimpleProfiler(dirpath=tmp_path, filename="profiler")
    trainer = Trainer(strategy="ddp", accelerator="cpu", devices=2, fast_dev_run=2, profiler=profiler, logger=False,
                      enable_progress_bar=False)
    trainer.fit(Classifier(), loader(64))
    trainer.validate(Classifier(), loader(64), verbose=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{s}-profiler-{r}.txt" for s in ("fit", "validate") for r in (0, 1)]
    assert all("Profiler Report" in p.read_text() for p in tmp_path.iterdir())
    assert len(trainer.profiler.recorded_durations["[Strategy]DDPStrategy.training_step"]) == 2  # rank 0's, sent back
