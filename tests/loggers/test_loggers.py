"""Trainer(logger=...), CSVLogger, a Logger subclass, and self.logger.experiment: read back from the files."""

from __future__ import annotations

import csv
import glob
import os

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from callbacks import Callback, ModelCheckpoint
from loggers import CSVLogger, DummyExperiment, Logger, TensorBoardLogger, rank_zero_experiment, rank_zero_only
from tests._models import Classifier, loader
from trainer import Trainer


def _fit(logger, model=None, **options):
    opts = dict(max_epochs=2, log_every_n_steps=2, enable_progress_bar=False, enable_model_summary=False, logger=logger)
    opts.update(options)
    trainer = Trainer(**opts)
    trainer.fit(model or Classifier(), loader(64), loader(32))  # 4 steps per epoch
    return trainer


def _rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_csv_logger_writes_one_row_per_logged_step_and_the_hparams_beside_it():
    trainer = _fit(CSVLogger("logs", name="exp"), model=Classifier(hidden=12, optimizer="adam"))
    folder = os.path.join("logs", "exp", "version_0")
    assert trainer.log_dir == folder and trainer.logger.log_dir == folder
    rows = _rows(os.path.join(folder, "metrics.csv"))
    # Lightning's axis: step n's row at n - 1, every 2nd step; the epoch means and the validation
    # share the epoch's last step's row.
    assert [int(r["step"]) for r in rows] == [1, 3, 5, 7]
    header = list(rows[0])
    assert header[0] == "step" and header[1:] == sorted(header[1:])
    assert {"train_loss", "val_loss", "val_acc", "epoch"} <= set(header)
    assert not {h for h in header if h.startswith("throughput")}  # Lightning's: ThroughputMonitor logs it
    assert not {h for h in header if h.startswith("lr")}  # Lightning's: LearningRateMonitor logs the learning rate
    assert "train_loss_epoch" not in header  # training_step's defaults: no epoch value (Lightning's)
    assert [r["val_loss"] != "" for r in rows] == [False, True, False, True]  # empty where not logged
    assert float(rows[-1]["val_loss"]) == pytest.approx(trainer.callback_metrics["val_loss"].item(), rel=1e-6)
    assert [r["epoch"] for r in rows] == ["0", "0", "1", "1"]
    yaml_text = open(os.path.join(folder, "hparams.yaml")).read()
    assert yaml_text.splitlines() == [
        "features: 8", "hidden: 12", "classes: 2", "dropout: 0.0", "lr: 0.1", 'optimizer: "adam"',
    ]  # the model's arguments; the trainer's options stay in TensorBoard's HParams tab
    # Checkpoints go under the first logger's version folder.
    assert glob.glob(os.path.join(folder, "checkpoints", "*.ckpt")) and trainer.run_dir == os.path.abspath(folder)


def test_a_second_fit_with_a_new_column_rewrites_the_header_and_keeps_the_rows():
    logger = CSVLogger("logs", version=3)
    trainer = Trainer(max_steps=2, log_every_n_steps=1, enable_progress_bar=False, logger=logger, enable_checkpointing=False)
    trainer.fit(Classifier(), loader(32))  # no validation: no val_ columns yet
    path = os.path.join("logs", "lightning_logs", "version_3", "metrics.csv")
    assert "val_loss" not in _rows(path)[0]
    trainer.validate(Classifier(), loader(16))
    rows = _rows(path)
    # fit's rows at 0 and 1 (step n's at n - 1); the validate after it at the steps taken, 2
    assert [int(r["step"]) for r in rows] == [0, 1, 2] and [r["val_loss"] != "" for r in rows] == [False, False, True]
    assert rows[0]["train_loss"] != ""


def test_several_loggers_get_everything_and_the_first_names_the_folders():
    tb, csv_logger = TensorBoardLogger("tb", name="run"), CSVLogger("csv")
    model = Classifier()
    trainer = _fit([tb, csv_logger], model=model)
    assert trainer.logger is tb and trainer.loggers == [tb, csv_logger]
    assert model.logger is tb and model.loggers == [tb, csv_logger]
    assert trainer.log_dir == os.path.join("tb", "run", "version_0")
    assert glob.glob(os.path.join("tb", "run", "version_0", "checkpoints", "*.ckpt"))
    acc = EventAccumulator(tb.log_dir)
    acc.Reload()
    assert [e.step for e in acc.Scalars("train_loss")] == [1, 3, 5, 7]  # every 2nd step, step n at n - 1
    # Lightning's default: an hp_metric of -1 for the HParams tab (the Trainer's own logger leaves it out).
    assert [(e.step, e.value) for e in acc.Scalars("hp_metric")] == [(0, -1.0)]
    rows = _rows(os.path.join("csv", "lightning_logs", "version_0", "metrics.csv"))
    tb_loss = [e.value for e in acc.Scalars("train_loss")]
    assert [float(r["train_loss"]) for r in rows] == pytest.approx(tb_loss, rel=1e-6)
    assert not os.path.exists("lightning_logs")  # no default logger beside them


class DrawsInTensorBoard(Classifier):
    def training_step(self, batch, batch_idx):
        if batch_idx == 0:
            writer = self.logger.experiment
            writer.add_image("input", torch.rand(1, 4, 4), self.global_step_for_test())
            writer.add_histogram("weights", self.net[0].weight, self.global_step_for_test())
            writer.add_text("note", "hello", self.global_step_for_test())
        return super().training_step(batch, batch_idx)

    def global_step_for_test(self) -> int:
        return self.trainer.global_step


def test_the_default_logger_experiment_is_the_summary_writer_of_the_run():
    trainer = Trainer(max_epochs=2, log_every_n_steps=1, enable_progress_bar=False, enable_checkpointing=False)
    trainer.fit(DrawsInTensorBoard(), loader(64))
    assert isinstance(trainer.logger, TensorBoardLogger)
    assert trainer.log_dir == os.path.join(os.getcwd(), "lightning_logs", "version_0") == trainer.logger.log_dir
    files = glob.glob(os.path.join(trainer.log_dir, "events.out.tfevents.*"))
    assert len(files) == 1  # the user's images share the run's one event file
    acc = EventAccumulator(trainer.log_dir, size_guidance={"images": 0, "histograms": 0})
    acc.Reload()
    assert acc.Tags()["images"] == ["input"] and [e.step for e in acc.Images("input")] == [0, 4]
    assert [e.step for e in acc.Histograms("weights")] == [0, 4]
    assert "train_loss" in acc.Tags()["scalars"] and "hp_metric" not in acc.Tags()["scalars"]


def test_logger_false_writes_no_logs_and_checkpoints_go_under_log_dir():
    model = Classifier()
    trainer = _fit(False, model=model)
    assert trainer.logger is None and trainer.loggers == [] and model.logger is None
    assert not glob.glob("**/events.out.tfevents.*", recursive=True)
    assert glob.glob(os.path.join("checkpoints", "*.ckpt"))  # Lightning's <default_root_dir>/checkpoints
    assert trainer.log_dir == os.getcwd()  # default_root_dir: the working directory


class Recording(Logger):
    """A logger for a tracking service, as a user writes one."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    @property
    def name(self):
        return "recording"

    @property
    def version(self):
        return "run-1"

    def log_hyperparams(self, params, *args, **kwargs):
        self.calls.append(("hparams", dict(params)))

    def log_metrics(self, metrics, step=None):
        self.calls.append(("metrics", step, dict(metrics)))

    def finalize(self, status):
        self.calls.append(("finalize", status))


def test_a_logger_subclass_gets_hparams_metrics_and_the_end_of_each_stage():
    logger = Recording()
    trainer = _fit(logger, max_epochs=1)
    kinds = [c[0] for c in logger.calls]
    assert kinds[0] == "hparams" and kinds[-1] == "finalize" and logger.calls[-1] == ("finalize", "success")
    assert logger.calls[0][1]["hidden"] == 16 and not any(k.startswith("trainer/") for k in logger.calls[0][1])
    steps = [(c[1], sorted(c[2])) for c in logger.calls if c[0] == "metrics"]
    assert steps[0][0] == 1 and {"train_loss", "epoch"} <= set(steps[0][1]) and "lr" not in steps[0][1]  # the 2nd step's row, at 1
    assert (3, ["epoch", "val_acc", "val_loss"]) in steps  # at the last step's, with the epoch, as Lightning's rows
    # Checkpoints: <log_dir>/<name>/<version>/checkpoints, as Lightning puts them for any logger.
    assert glob.glob(os.path.join("recording", "run-1", "checkpoints", "*.ckpt"))
    assert isinstance(logger.experiment, DummyExperiment) and trainer.log_dir == os.getcwd()  # no folder of its own

    class Boom(Classifier):
        def training_step(self, batch, batch_idx):
            raise RuntimeError("boom")

    failing = Recording()
    with pytest.raises(RuntimeError, match="boom"):
        _fit(failing, model=Boom())
    assert failing.calls[-1] == ("finalize", "failed") and ("finalize", "success") not in failing.calls


class Uploading(Recording):
    """A tracker that uploads checkpoints and names its run when it starts, as MLflow's and W&B's do."""

    run = None

    @property
    def experiment(self):
        self.run = self.run or "run-7"
        return self.run

    @property
    def version(self):
        return self.run or "none-yet"

    def after_save_checkpoint(self, checkpoint_callback):
        path = checkpoint_callback.best_model_path
        self.calls.append(("saved", os.path.basename(path), os.path.getsize(path)))  # on disk when told


def test_a_tracker_is_told_of_each_checkpoint_on_disk_and_its_run_names_the_folder():
    class Look(Callback):
        def setup(self, trainer, pl_module, stage):
            seen.append(trainer.logger.run)  # started before the callbacks' setup, as in Lightning

    seen: list = []
    logger = Uploading()
    trainer = _fit(logger, max_epochs=2, callbacks=[Look(), ModelCheckpoint(save_top_k=-1, filename="{epoch}")])
    saved = [c[1:] for c in logger.calls if c[0] == "saved"]
    assert [name for name, _ in saved] == ["epoch=0.ckpt", "epoch=1.ckpt"] and all(size > 0 for _, size in saved)
    assert seen == ["run-7"] and trainer.checkpoint_callback.dirpath == os.path.abspath(os.path.join("recording", "run-7", "checkpoints"))


def test_only_rank_zero_writes_and_the_experiment_elsewhere_does_nothing(monkeypatch):
    logger = TensorBoardLogger("tb")
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    experiment = logger.experiment
    assert isinstance(experiment, DummyExperiment)
    experiment.add_image("x", torch.zeros(1, 2, 2))  # nothing, and no error
    experiment[0].add_scalar("y", 1.0)
    logger.log_metrics({"a": 1.0}, 1)
    logger.save()
    logger.finalize("success")
    assert not os.path.exists("tb")

    class Service(Logger):
        name, version = "s", 0

        @property
        @rank_zero_experiment
        def experiment(self):
            raise AssertionError("never built on rank 1")

        def log_metrics(self, metrics, step=None): ...
        def log_hyperparams(self, params, *args, **kwargs): ...

    assert isinstance(Service().experiment, DummyExperiment)


def test_tensorboard_logger_options_name_its_folder_and_tags():
    logger = TensorBoardLogger("tb", name="", version="final", prefix="p", sub_dir="sub", flush_secs=5)
    assert logger.log_dir == os.path.join("tb", "final", "sub") and logger.root_dir == os.path.join("tb", "")
    trainer = _fit(logger, max_epochs=1)
    acc = EventAccumulator(logger.log_dir)
    acc.Reload()
    assert "p-train_loss" in acc.Tags()["scalars"] and "train_loss" not in acc.Tags()["scalars"]
    assert glob.glob(os.path.join("tb", "final", "checkpoints", "*.ckpt"))  # sub_dir is for the events only
    assert trainer.log_dir == logger.log_dir
    assert TensorBoardLogger("tb").version == 0 and TensorBoardLogger("tb").version == 1  # each claims its folder


def test_a_resumed_fit_carries_on_in_a_user_loggers_folder_without_the_rows_after_the_checkpoint():
    first = _fit(CSVLogger("logs"), max_epochs=2, callbacks=[ModelCheckpoint(save_top_k=-1)])
    ckpt = glob.glob(os.path.join(first.log_dir, "checkpoints", "epoch=0-*.ckpt"))[0]  # step 4; the run went on to 8
    again = Trainer(max_epochs=2, log_every_n_steps=2, enable_progress_bar=False, enable_model_summary=False,
                    logger=CSVLogger("logs"))
    again.fit(Classifier(), loader(64), loader(32), ckpt_path=ckpt)
    assert again.log_dir == first.log_dir
    assert [int(r["step"]) for r in _rows(os.path.join(first.log_dir, "metrics.csv"))] == [1, 3, 5, 7]


@pytest.mark.parametrize("bad, message", [
    ("tb", "logger='tb' must be True"),
    ([CSVLogger("x"), "y"], "logger contains 'y', which is not a loggers.Logger"),
    ([CSVLogger], "not an instance: pass CSVLogger"),
])
def test_bad_logger_arguments_say_what_is_accepted(bad, message):
    with pytest.raises(TypeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Trainer(logger=bad)


@pytest.mark.parametrize("make, message", [
    (lambda: TensorBoardLogger("x", flush_secs=0), r"TensorBoardLogger\(flush_secs\)=0"),
    (lambda: TensorBoardLogger(3), r"TensorBoardLogger\(save_dir=3\) must be a folder path"),
    (lambda: CSVLogger("x", version=1.5), r"CSVLogger\(version=1.5\) must be an int"),
    (lambda: CSVLogger("x", flush_logs_every_n_steps=0), r"flush_logs_every_n_steps"),
])
def test_bad_logger_options_name_the_option(make, message):
    with pytest.raises((TypeError, ValueError), match=message):
        make()


def test_callbacks_tensorboard_logger_is_the_logger_and_still_configures_the_default():
    import callbacks

    assert callbacks.TensorBoardLogger is TensorBoardLogger
    trainer = Trainer(max_steps=2, enable_progress_bar=False, enable_checkpointing=False, callbacks=[TensorBoardLogger(flush_secs=5)])
    assert trainer.logger.flush_secs == 5 and trainer.callbacks == [cb for cb in trainer.callbacks if not isinstance(cb, Logger)]
    trainer.fit(Classifier(), loader(32))
    assert trainer.log_dir == os.path.join(os.getcwd(), "lightning_logs", "version_0")
    assert np.isfinite(trainer.callback_metrics["train_loss"])


def test_log_graph_writes_the_models_graph_from_example_input_array():
    model = Classifier()
    model.example_input_array = torch.zeros(2, 8)
    logger = TensorBoardLogger("tb", log_graph=True, default_hp_metric=False)
    _fit(logger, model=model, max_epochs=1)
    acc = EventAccumulator(logger.log_dir)
    acc.Reload()
    assert acc.Tags()["graph"] and len(acc.Graph().node) > 0


def test_log_graph_of_a_module_no_trainer_has_and_lightnings_warnings_without_a_traceable_input():
    model = Classifier()  # not attached: tracing reads model.trainer, which must not raise
    logger = TensorBoardLogger("tb", log_graph=True, default_hp_metric=False)
    logger.log_graph(model, torch.zeros(2, 8))
    logger.save()
    acc = EventAccumulator(logger.log_dir)
    acc.Reload()
    assert acc.Tags()["graph"]
    with pytest.warns(UserWarning, match=r"^Could not log computational graph to TensorBoard: The `model.example_input_array` "
                                         r"attribute is not set or `input_array` was not given"):
        logger.log_graph(model)
    model.example_input_array = {"x": 1}
    with pytest.warns(UserWarning, match=r"^Could not log computational graph to TensorBoard: .* can't be traced by TensorBoard"):
        logger.log_graph(model)
    with pytest.raises(RuntimeError, match="is not attached to a `Trainer`"):
        model.trainer  # outside the trace, as before


def test_the_csv_writer_updates_a_written_row_when_its_step_comes_again():
    from loggers.csv_logs import ExperimentWriter

    writer = ExperimentWriter("out")
    writer.log_metrics({"loss": 1.0, "é/ü": 2.0}, 1)
    writer.save()
    writer.log_metrics({"loss": 0.5}, 1)  # the same step, the same columns: the row on disk is rewritten
    writer.log_metrics({"loss": 0.25}, 2)
    writer.save()
    writer.log_metrics({"acc": 0.9}, 2)  # a new column for the row on disk: the file is rewritten
    writer.save()
    assert _rows(os.path.join("out", "metrics.csv")) == [
        {"step": "1", "acc": "", "loss": "0.5", "é/ü": "2.0"},
        {"step": "2", "acc": "0.9", "loss": "0.25", "é/ü": ""},
    ]


def test_the_csv_writers_waiting_rows_are_its_metrics_and_a_save_empties_them_as_in_lightning(tmp_path):
    logger = CSVLogger(str(tmp_path), flush_logs_every_n_steps=2)
    logger.log_metrics({"test": 1}, step=0)
    assert logger.experiment.metrics == [{"step": 0, "test": 1}]
    logger.log_metrics({"test": 2}, step=1)  # the second step: saved
    assert logger.experiment.metrics == [] and _rows(os.path.join(logger.log_dir, "metrics.csv"))[-1]["test"] == "2"
    logger.experiment.log_metrics({"loss": 0.1})  # no step: the count of rows waiting, as Lightning's writer
    assert logger.experiment.metrics == [{"step": 0, "loss": 0.1}]


class LogsAtBatchEnd(Callback):
    """Logs the batch index in on_train_batch_end, as Lightning's docs' callbacks log their values."""

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        module.log("seen_batch", float(batch_idx))


def test_a_value_logged_in_on_train_batch_end_is_in_that_steps_row_at_lightnings_step():
    logger = CSVLogger("logs")
    trainer = Trainer(max_epochs=1, log_every_n_steps=2, enable_progress_bar=False, enable_checkpointing=False,
                      logger=logger, callbacks=[LogsAtBatchEnd()])
    trainer.fit(Classifier(), loader(64))  # 4 steps: rows for steps 2 and 4, at 1 and 3
    rows = [r for r in _rows(os.path.join(logger.log_dir, "metrics.csv")) if r["train_loss"]]
    assert [(int(r["step"]), float(r["seen_batch"])) for r in rows] == [(1, 1.0), (3, 3.0)]  # its own batch's, not the one before


class ToService:
    """Not a Logger subclass: an adapter with a Logger's methods, as Lightning takes one."""

    name, version = "service", "7"

    def __init__(self, save_dir):
        self.save_dir, self.sent = save_dir, []

    def log_hyperparams(self, params):
        self.sent.append(("params", dict(params)))

    def log_metrics(self, metrics, step):
        self.sent.append(("metrics", step, sorted(metrics)))

    def log_graph(self, model):  # Lightning's Trainer calls these three too
        pass

    def save(self):
        pass

    def finalize(self, status):
        self.sent.append(("end", status))


def test_an_object_with_a_loggers_methods_is_taken_as_a_logger(tmp_path):
    service = ToService(tmp_path)
    trainer = Trainer(max_epochs=1, logger=service, log_every_n_steps=1, enable_progress_bar=False, enable_checkpointing=False)
    trainer.fit(Classifier(hidden=6), loader(32))
    assert trainer.logger is service
    assert service.sent[0] == ("params", Classifier(hidden=6).hparams)
    rows = [(m[1], m[2]) for m in service.sent if m[0] == "metrics"]
    assert rows[0][0] == 0 and {"train_loss", "epoch"} <= set(rows[0][1])
    assert service.sent[-1] == ("end", "success") and trainer.log_dir == tmp_path


class LogsItsOwnStep(Classifier):
    def on_train_epoch_end(self):
        self.log_dict({"step": float(10 + self.current_epoch), "train_acc": 0.5})

    def on_validation_epoch_end(self):
        self.log_dict({"step": float(20 + self.current_epoch), "val_acc2": 0.25})


def test_a_value_logged_as_step_is_the_rows_step_as_in_lightning():
    logger = Recording()
    _fit(logger, model=LogsItsOwnStep(), num_sanity_val_steps=0)
    rows = [(c[1], c[2]) for c in logger.calls if c[0] == "metrics"]
    own = [(step, sorted(values)) for step, values in rows if "train_acc" in values or "val_acc2" in values]
    assert (10, ["train_acc"]) in own and (11, ["train_acc"]) in own  # no "epoch" is added then
    assert (20, ["val_acc", "val_acc2", "val_loss"]) in own and (21, ["val_acc", "val_acc2", "val_loss"]) in own
    assert all("epoch" in values for step, values in rows if step not in (10, 11, 20, 21))


class LogsEvalSteps(Classifier):
    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        self.log("seen", float(batch_idx), on_step=True, on_epoch=False)
        self.log("b", float(batch_idx), on_step=True, on_epoch=True)


class KeywordsOnly(Recording):
    def log_metrics(self, *, metrics, step):  # Lightning calls log_metrics(metrics=..., step=...)
        super().log_metrics(metrics, step)


def test_evaluation_values_logged_on_step_get_a_row_per_batch_counted_across_the_fits_validations():
    logger = KeywordsOnly()
    trainer = Trainer(max_epochs=2, log_every_n_steps=50, logger=logger, enable_progress_bar=False, num_sanity_val_steps=1)
    trainer.fit(LogsEvalSteps(), loader(32), loader(48))  # 3 validation batches a validation
    rows = [(c[1], c[2]) for c in logger.calls if c[0] == "metrics"]
    assert [(s, v) for s, v in rows if "seen" in v] == [(s, {"seen": float(s % 3), "b_step": float(s % 3)}) for s in range(6)]
    assert [(s, v) for s, v in rows if "b_epoch" in v] == [(1, {"b_epoch": 1.0, "epoch": 0}), (3, {"b_epoch": 1.0, "epoch": 1})]
    assert {"seen", "b_step", "b_epoch"} <= set(trainer.logged_metrics)
    assert {"b", "b_epoch"} <= set(trainer.callback_metrics) and not {"seen", "b_step"} & set(trainer.callback_metrics)

    logger.calls.clear()
    trainer.validate(LogsEvalSteps(), loader(32), verbose=False)  # a new stage counts from 0
    assert [c[1] for c in logger.calls if c[0] == "metrics" and "seen" in c[2]] == [0, 1]


class LogsNothing(Classifier):
    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self(x), y)


def test_a_step_that_logged_nothing_sends_no_row():
    logger = Recording()
    _fit(logger, model=LogsNothing(), log_every_n_steps=1, limit_val_batches=0)
    assert [c for c in logger.calls if c[0] == "metrics"] == []  # Lightning's: no lr or throughput row on its own


@pytest.mark.parametrize("name", ["", None])
def test_log_hyperparams_called_by_the_user_is_on_disk_at_once_as_in_lightning(tmp_path, name):
    tb = TensorBoardLogger(save_dir=str(tmp_path / "tb"), name=name)
    tb.log_hyperparams({"lr": 0.1, "layers": 2})
    files = os.listdir(tmp_path / "tb" / "version_0")  # no name: the version folder is right under save_dir
    assert len(files) == 1 and files[0].startswith("events.out.tfevents")
    tb.save()  # the writer's buffer, flushed (Lightning's does the same)
    events = EventAccumulator(str(tmp_path / "tb" / "version_0"))
    events.Reload()
    assert "_hparams_/session_start_info" in events.summary_metadata

    csv_logger = CSVLogger(save_dir=str(tmp_path / "csv"), name=name)
    csv_logger.log_hyperparams()  # params default to none, as Lightning's
    assert (tmp_path / "csv" / "version_0" / "hparams.yaml").read_text() == "{}\n"
    csv_logger.log_hyperparams({"lr": 0.1})
    assert "lr: 0.1" in (tmp_path / "csv" / "version_0" / "hparams.yaml").read_text()


def test_a_logger_subclasss_own_name_and_version_and_home_in_save_dir_make_its_folder(tmp_path, monkeypatch):
    class Named(TensorBoardLogger):
        @property
        def version(self):
            return "version"

        @property
        def name(self):
            return "name"

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("RUNS", "runs")
    assert Named(str(tmp_path / "logs")).log_dir == str(tmp_path / "logs" / "name" / "version")
    assert Named("~/logs", sub_dir="sub").log_dir == str(tmp_path / "logs" / "name" / "version" / "sub")
    assert TensorBoardLogger("$RUNS/tb").root_dir == os.path.join("runs", "tb", "lightning_logs")


def test_the_run_folder_has_hparams_yaml_even_without_hyperparameters_as_in_lightning(tmp_path):
    from trainer import TrainModule

    class NoHparams(TrainModule):  # never calls save_hyperparameters
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(8, 2)

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.cross_entropy(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    logger = TensorBoardLogger(str(tmp_path), default_hp_metric=False)
    Trainer(max_steps=1, logger=logger, enable_progress_bar=False, enable_checkpointing=False).fit(NoHparams(), loader(32))
    assert (tmp_path / "lightning_logs" / "version_0" / "hparams.yaml").read_text() == "{}\n"
    assert not (tmp_path / "hparams.yaml").exists()


def test_trainer_log_dir_read_before_fit_is_the_fits_folder_as_in_lightning(tmp_path):
    trainer = Trainer(default_root_dir=str(tmp_path), max_steps=2, enable_progress_bar=False)
    before = trainer.log_dir
    seen = []

    class Reads(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            seen.append(trainer.log_dir)

    trainer.callbacks.append(Reads())
    trainer.fit(Classifier(), loader(32))
    assert before == str(tmp_path / "lightning_logs" / "version_0") == trainer.log_dir and set(seen) == {before}
    assert sorted(os.listdir(tmp_path / "lightning_logs")) == ["version_0"]


def test_log_hyperparams_before_fit_and_the_fit_share_one_version_folder_as_in_lightning(tmp_path):
    trainer = Trainer(default_root_dir=str(tmp_path), max_steps=2, log_every_n_steps=1, enable_progress_bar=False)
    trainer.logger.log_hyperparams({"batch_size": 16})  # before fit, as a script does with its own settings
    trainer.fit(Classifier(hidden=12), loader(32))
    assert sorted(os.listdir(tmp_path / "lightning_logs")) == ["version_0"]
    folder = tmp_path / "lightning_logs" / "version_0"
    assert trainer.log_dir == str(folder) and (folder / "checkpoints").is_dir()
    text = (folder / "hparams.yaml").read_text()
    assert "batch_size: 16" in text and "hidden: 12" in text
    events = EventAccumulator(str(folder))
    events.Reload()
    assert "train_loss" in events.Tags()["scalars"] and "_hparams_/session_start_info" in events.summary_metadata
    trainer.fit(Classifier(), loader(32))  # a second fit of the Trainer's own logger: a folder of its own, as before
    assert sorted(os.listdir(tmp_path / "lightning_logs")) == ["version_0", "version_1"]


def test_the_csv_experiment_writer_is_importable_from_loggers_with_lightnings_file_name(tmp_path):
    from loggers import ExperimentWriter

    logger = CSVLogger(tmp_path)
    logger.log_metrics({"float": 0.3, "tensor": torch.tensor(0.1)}, step=10)
    logger.save()
    assert isinstance(logger.experiment, ExperimentWriter) and ExperimentWriter.NAME_METRICS_FILE == "metrics.csv"
    rows = _rows(os.path.join(logger.log_dir, ExperimentWriter.NAME_METRICS_FILE))
    assert rows == [{"step": "10", "float": "0.3", "tensor": "0.10000000149011612"}]


# --- the Trainer's side of Logger (issue 53): public methods with defaults ----------------
def test_a_service_logger_that_defines_none_of_the_trainers_methods_starts_its_run_before_fit(tmp_path):
    class Service(Logger):
        def __init__(self):
            self.started, self.hparams, self.rows = 0, [], []

        name = property(lambda self: "svc")
        version = property(lambda self: "run-1")

        @property
        def experiment(self):
            self.started += 1
            return self

        def log_hyperparams(self, params, *args, **kwargs):
            self.hparams.append(dict(params))

        def log_metrics(self, metrics, step=None):
            self.rows.append(step)

    class Logged(Classifier):
        def __init__(self, width: int = 4):
            super().__init__()
            self.save_hyperparameters()

    svc = Service()
    Trainer(max_epochs=1, log_every_n_steps=1, enable_progress_bar=False, enable_checkpointing=False,
            default_root_dir=tmp_path, logger=svc).fit(Logged(), loader(16))
    assert svc.started >= 1 and svc.rows  # prepare_stage's default read experiment before the first row
    assert svc.hparams == [{"width": 4}]  # log_fit_hyperparams' default: Lightning's log_hyperparams, no trainer/ options
    assert svc.pinned_version is None and svc.chosen_version is None


def test_file_loggers_say_their_pinned_and_chosen_versions_and_take_rank_zeros(tmp_path):
    pinned, free = CSVLogger(tmp_path, version=3), TensorBoardLogger(tmp_path)
    assert (pinned.pinned_version, pinned.chosen_version) == (3, 3)
    assert (free.pinned_version, free.chosen_version) == (None, None)  # asking does not claim a folder
    assert not os.path.exists(os.path.join(tmp_path, "lightning_logs"))
    free.use_version(7)
    assert free.log_dir == os.path.join(tmp_path, "lightning_logs", "version_7") and free.pinned_version is None
