"""TensorBoardLogger: the event files read back with tensorboard's own reader, and a live server."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import api_pb2, metadata
from torch.utils.tensorboard import SummaryWriter

from callbacks import Callback, ModelCheckpoint
from loggers import TensorBoardLogger
from strategies._spawn import free_port
from tests._models import Classifier, loader
from trainer import Trainer

# No lr (LearningRateMonitor logs it) and no throughput (ThroughputMonitor does), as in Lightning.
DEFAULT_TAGS = {"train_loss", "val_loss", "val_acc", "epoch"}


class RecordsLosses(Classifier):
    """Keeps every training loss it computed, as floats, in order."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.losses.append(loss.item())
        return loss


def _read(run_dir: str) -> EventAccumulator:
    acc = EventAccumulator(run_dir)
    acc.Reload()
    return acc


def _series(acc: EventAccumulator, tag: str) -> list[tuple[int, float]]:
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def _fit(model=None, val=True, **options) -> tuple[Trainer, Classifier]:
    model = model or RecordsLosses()
    opts = dict(max_epochs=2, log_every_n_steps=2, enable_progress_bar=False, enable_checkpointing=False)
    opts.update(options)
    trainer = Trainer(**opts)
    # 4 training batches of 16 per epoch, validation on 2 batches.
    trainer.fit(model, loader(64), loader(32) if val else None)
    return trainer, model


def test_a_default_run_writes_every_tag_with_the_values_training_computed():
    trainer, model = _fit(gradient_clip_val=1.0)
    assert trainer.run_dir == os.path.abspath(os.path.join("lightning_logs", "version_0"))
    assert len(glob.glob(os.path.join(trainer.run_dir, "events.out.tfevents.*"))) == 1
    acc = _read(trainer.run_dir)
    assert set(acc.Tags()["scalars"]) == DEFAULT_TAGS  # clipping adds no grad_norm, as in Lightning

    # Every log_every_n_steps=2 optimizer steps, Lightning's axis: step n's row at n - 1, with
    # the loss of the batch that made step n.
    train_loss = _series(acc, "train_loss")
    assert [s for s, _ in train_loss] == [1, 3, 5, 7]
    for step, value in train_loss:
        assert value == pytest.approx(model.losses[step], rel=1e-6)
    # training_step's defaults have no epoch value (Lightning's on_epoch=False): no train_loss_epoch.
    # Validation means, once per epoch; the last one is what fit left in callback_metrics.
    val_loss = _series(acc, "val_loss")
    assert [s for s, _ in val_loss] == [3, 7]
    assert val_loss[-1][1] == pytest.approx(trainer.callback_metrics["val_loss"].item(), rel=1e-6)

    assert sorted(set(_series(acc, "epoch"))) == [(1, 0.0), (3, 0.0), (5, 1.0), (7, 1.0)]  # every row has it, as Lightning's


def test_hparams_hold_the_trainer_options_and_model_arguments_and_mark_the_run_finished():
    trainer, _ = _fit(model=RecordsLosses(hidden=12, optimizer="adam"), seed=7)
    acc = _read(trainer.run_dir)
    start = metadata.parse_session_start_info_plugin_data(acc.PluginTagToContent(metadata.PLUGIN_NAME)[metadata.SESSION_START_INFO_TAG])
    hp = {k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind")) for k, v in start.hparams.items()}
    assert hp["hidden"] == 12 and hp["lr"] == pytest.approx(0.1) and hp["optimizer"] == "adam"
    assert hp["trainer/max_epochs"] == 2 and hp["trainer/seed"] == 7 and hp["trainer/log_every_n_steps"] == 2
    assert hp["trainer/strategy"] == "single" and hp["trainer/precision"] == "32-true"
    assert hp["trainer/deterministic"] is False  # a bool, not the number 0
    assert "trainer/max_steps" not in hp  # None is left out, so a column keeps one type
    end = metadata.parse_session_end_info_plugin_data(acc.PluginTagToContent(metadata.PLUGIN_NAME)[metadata.SESSION_END_INFO_TAG])
    assert end.status == api_pb2.STATUS_SUCCESS
    # The run's list of columns, written when fit ends (tests/loggers/test_hparams.py reads it).
    assert metadata.EXPERIMENT_TAG in acc.PluginTagToContent(metadata.PLUGIN_NAME)


def test_accumulation_writes_each_step_once_and_param_groups_get_no_lr_tags_of_the_trainers():
    model = TwoGroups()
    trainer, _ = _fit(model=model, val=False, max_epochs=1, log_every_n_steps=1, accumulate_grad_batches=2)
    acc = _read(trainer.run_dir)
    tags = set(acc.Tags()["scalars"])
    assert not {t for t in tags if t.startswith("lr")}  # Lightning's: LearningRateMonitor logs them
    assert "grad_norm" not in tags  # no clipping, no norm
    assert not {t for t in tags if t.startswith("val_")}
    # 4 batches, 2 per step: steps 1 and 2 (rows 0 and 1), once each, with the loss of the batch that completed them.
    assert _series(acc, "train_loss") == [(0, pytest.approx(model.losses[1], rel=1e-6)), (1, pytest.approx(model.losses[3], rel=1e-6))]


class TwoGroups(RecordsLosses):
    def configure_optimizers(self):
        first, second = self.net[0], self.net[3]
        return torch.optim.SGD([{"params": first.parameters()}, {"params": second.parameters(), "lr": 0.01}], lr=0.1)


def test_validate_and_test_after_fit_land_at_the_fit_step_and_predict_writes_nothing():
    trainer, model = _fit(max_epochs=1)
    trainer.validate(model, loader(32))
    trainer.test(model, loader(32))
    test_loss = trainer.callback_metrics["test_loss"].item()
    trainer.predict(model, loader(32))
    assert trainer.callback_metrics == {}  # each call starts afresh, as Lightning's; predict logs nothing
    assert sorted(os.listdir("lightning_logs")) == ["version_0"]  # predict made no folder
    assert trainer.global_step == 4  # evaluation moved no counter
    acc = _read(trainer.run_dir)
    # fit's validation at its last step's, then validate's at the steps taken (in the order written:
    # event files of one second sort by a counter compared as text)
    assert [e.step for e in sorted(acc.Scalars("val_loss"), key=lambda e: e.wall_time)] == [3, 4]
    assert _series(acc, "test_loss") == [(4, pytest.approx(test_loss, rel=1e-6))]

    fresh = Trainer(enable_progress_bar=False)
    fresh.predict(model, loader(32))
    assert fresh.run_dir is None and sorted(os.listdir("lightning_logs")) == ["version_0"]
    fresh.test(model, loader(32))
    assert fresh.run_dir.endswith("version_1") and set(_read(fresh.run_dir).Tags()["scalars"]) == {"test_loss", "epoch"}


def test_a_resumed_run_continues_its_curves_in_the_same_folder_without_repeated_steps():
    first = Trainer(max_epochs=3, log_every_n_steps=1, enable_progress_bar=False, callbacks=[ModelCheckpoint(save_top_k=-1)])
    first.fit(RecordsLosses(), loader(64), loader(32))
    after_epoch_0 = glob.glob(os.path.join(first.run_dir, "checkpoints", "epoch=0-*.ckpt"))[0]
    # TensorBoard reads a run's files in name order; a name starts with the second it was made
    # in, then a per-process counter (".9" sorts after ".10"). A real resume comes seconds later.
    made = int(os.path.basename(glob.glob(os.path.join(first.run_dir, "events.out.tfevents.*"))[0]).split(".")[3])
    time.sleep(max(0.0, made + 1.01 - time.time()))
    # As if the first run had crashed after epoch 0 having logged up to step 12: resume there.
    resumed = Trainer(max_epochs=3, log_every_n_steps=1, enable_progress_bar=False, enable_checkpointing=False)
    resumed.fit(RecordsLosses(), loader(64), loader(32), ckpt_path=after_epoch_0)
    assert resumed.run_dir == first.run_dir
    acc = _read(first.run_dir)
    assert [s for s, _ in _series(acc, "train_loss")] == list(range(12))
    assert [s for s, _ in _series(acc, "val_loss")] == [3, 7, 11]


class FailsInEpoch1(RecordsLosses):
    def training_step(self, batch, batch_idx):
        if self.trainer.current_epoch == 1:
            raise RuntimeError("boom")
        return super().training_step(batch, batch_idx)


def test_a_crashed_run_keeps_what_it_logged():
    trainer = Trainer(max_epochs=2, log_every_n_steps=1, enable_progress_bar=False, enable_checkpointing=False)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(FailsInEpoch1(), loader(64), loader(32))
    acc = _read(trainer.run_dir)
    assert [s for s, _ in _series(acc, "train_loss")] == [0, 1, 2, 3]
    tags = acc.PluginTagToContent(metadata.PLUGIN_NAME)
    assert metadata.SESSION_START_INFO_TAG in tags  # its options, though it failed before any save
    assert metadata.SESSION_END_INFO_TAG not in tags  # not marked finished


def test_log_dir_none_writes_nothing():
    trainer = Trainer(max_epochs=1, log_dir=None, enable_progress_bar=False, enable_checkpointing=False)
    trainer.fit(Classifier(), loader(32), loader(16))
    assert trainer.run_dir is None and os.listdir(".") == []


# --- a live server -------------------------------------------------------------------------
def _get(url: str):
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def _post(url: str, body: dict):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.load(response)


@pytest.mark.slow
def test_a_live_tensorboard_server_lists_the_run_and_its_hparams(tmp_path, script_env):
    trainer, _ = _fit(max_epochs=1, log_every_n_steps=1)
    port = free_port()
    log_path = tmp_path / "tensorboard.log"
    with open(log_path, "w") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "tensorboard.main", "--logdir", "lightning_logs", "--host", "127.0.0.1", "--port", str(port)],
            env=script_env, stdout=log, stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}/data/plugin"
    try:
        tags: dict = {}
        deadline = time.monotonic() + 60
        while not DEFAULT_TAGS <= set(tags.get("version_0", {})):
            if server.poll() is not None:
                pytest.skip(f"tensorboard could not start: {log_path.read_text()[-500:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"tensorboard listed {tags} after 60 s; wanted {sorted(DEFAULT_TAGS)}")
            time.sleep(0.25)
            try:
                tags = _get(f"{base}/scalars/tags")
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                continue
        assert set(tags["version_0"]) == DEFAULT_TAGS

        # The HParams tab: the options and model arguments as columns, the final metrics as values.
        experiment = _post(f"{base}/hparams/experiment", {"experimentName": ""})
        columns = {h["name"]: h["type"] for h in experiment["hparamInfos"]}
        assert columns["trainer/max_epochs"] == "DATA_TYPE_FLOAT64" and columns["optimizer"] == "DATA_TYPE_STRING"
        assert {m["name"]["tag"] for m in experiment["metricInfos"]} >= {"val_loss", "val_acc"}
        groups = _post(f"{base}/hparams/session_groups", {
            "experimentName": "", "startIndex": 0, "sliceSize": 10, "colParams": [],
            "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"],
        })["sessionGroups"]
        assert [g["name"] for g in groups] == ["version_0"]
        assert groups[0]["hparams"]["hidden"] == 16
        values = {m["name"]["tag"]: m["value"] for m in groups[0]["metricValues"]}
        assert values["val_loss"] == pytest.approx(trainer.callback_metrics["val_loss"].item(), rel=1e-6)
        assert groups[0]["sessions"][0]["status"] == "STATUS_SUCCESS"
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


class CountsHandOffs(Callback):
    """Records the epoch of each event given to the writer (whose thread then wakes) while training runs."""

    def on_train_start(self, trainer, module):
        writer = trainer.logger.experiment.file_writer
        real, self.epochs, self.started = writer.add_summary, [], time.perf_counter()

        def spy(*args, **kwargs):
            self.epochs.append(trainer.current_epoch)
            return real(*args, **kwargs)

        writer.add_summary = spy

    def on_train_end(self, trainer, module):
        self.during, self.took = list(self.epochs), time.perf_counter() - self.started


def test_short_epochs_hand_their_values_to_the_writer_at_most_once_a_second_and_all_arrive():
    counter = CountsHandOffs()
    trainer, _ = _fit(max_epochs=6, log_every_n_steps=50, callbacks=[counter])
    # Epochs of milliseconds: one epoch end wakes the writer, the rest wait (a flush is due once a second).
    assert len(set(counter.during)) <= 1 + int(counter.took), (counter.during, counter.took)
    acc = _read(trainer.run_dir)
    assert [step for step, _ in _series(acc, "val_loss")] == [3, 7, 11, 15, 19, 23]


class ListsEventFiles(Callback):
    def __init__(self):
        self.seen = []

    def _look(self, trainer, when):
        self.seen.append((when, len(glob.glob(os.path.join(trainer.log_dir, "events.out.tfevents.*")))))

    def on_train_start(self, trainer, module):
        self._look(trainer, "before the first step")

    def on_train_epoch_end(self, trainer, module):
        self._look(trainer, "after the first epoch")


def test_the_event_file_is_opened_after_the_first_step_and_gets_the_hparams_and_every_value():
    files = ListsEventFiles()
    trainer, _ = _fit(max_epochs=1, log_every_n_steps=1, callbacks=[files])
    assert files.seen == [("before the first step", 0), ("after the first epoch", 1)]
    acc = _read(trainer.run_dir)
    assert [step for step, _ in _series(acc, "train_loss")] == [0, 1, 2, 3]
    assert metadata.SESSION_START_INFO_TAG in acc.PluginTagToContent(metadata.PLUGIN_NAME)


def test_flush_secs_is_checked():
    with pytest.raises(ValueError, match=r"TensorBoardLogger\(flush_secs\)=0"):
        TensorBoardLogger(flush_secs=0)


class OwnLRCurve(Classifier):
    """Writes its own ``lr`` curve into the run, once per epoch, as a user's script does."""

    def on_train_epoch_end(self):
        self.logger.experiment.add_scalar("lr", 0.5 + self.current_epoch, self.current_epoch)


def test_a_users_lr_curve_holds_the_users_points_only_and_learning_rate_monitor_logs_the_rate():
    from callbacks import LearningRateMonitor

    trainer = Trainer(max_epochs=2, log_every_n_steps=1, enable_progress_bar=False, enable_checkpointing=False)
    trainer.fit(OwnLRCurve(), loader(n=64, batch_size=16))  # 4 steps an epoch, a row at each
    assert _series(_read(trainer.run_dir), "lr") == [(0, 0.5), (1, 1.5)]  # no point of the Trainer's among them

    trainer = Trainer(max_epochs=1, log_every_n_steps=1, enable_progress_bar=False, enable_checkpointing=False,
                      callbacks=[LearningRateMonitor(logging_interval="step")])
    trainer.fit(Classifier(lr=0.05), loader(n=64, batch_size=16))
    acc = _read(trainer.run_dir)
    assert _series(acc, "lr-SGD") == [(s, pytest.approx(0.05)) for s in range(4)] and "lr" not in acc.Tags()["scalars"]


@pytest.mark.skipif(importlib.util.find_spec("boto3") is None, reason="boto3 is not installed")
def test_the_logger_keeps_tensorboard_from_importing_boto3_and_leaves_a_users_import_alone(tmp_path, script_env):
    code = (
        "import sys\n"
        "from tests._models import Classifier, loader\n"
        "from trainer import Trainer\n"
        f"Trainer(max_steps=2, log_dir={str(tmp_path)!r}, enable_progress_bar=False).fit(Classifier(), loader())\n"
        "print('boto3' in sys.modules, 'botocore' in sys.modules)\n"
        "import boto3\n"  # installed, so the user's own import still works
        "print(boto3.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=script_env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "boto3"]
    assert glob.glob(str(tmp_path / "*" / "version_0" / "events.out.tfevents.*"))  # and it logged


# --- runs shorter than log_every_n_steps --------------------------------------------------------
class EpochLR(RecordsLosses):
    """The learning rate drops tenfold at each epoch's end (a scheduler with interval="epoch")."""

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.1)}


def test_a_48_step_run_with_the_default_interval_gets_its_epoch_values_and_a_hint_for_its_curves(trainer_log):
    model = EpochLR()
    trainer = Trainer(max_epochs=2, enable_progress_bar=False, enable_checkpointing=False)  # log_every_n_steps=50
    trainer.fit(model, loader(n=48, batch_size=2))  # 24 steps an epoch
    acc = _read(trainer.run_dir)
    # Lightning's rows come every 50th step: none here, and training_step's default has no epoch value.
    assert not {"train_loss", "lr", "train_loss_epoch"} & set(acc.Tags()["scalars"])
    hints = [line for line in trainer_log if "fewer than log_every_n_steps=50" in line]
    assert hints == [
        "This fit makes 48 optimizer steps, fewer than log_every_n_steps=50: its per-step curves get no "
        "point, only the epoch values do. Trainer(log_every_n_steps=5) gives about 10 points."
    ]


def test_a_2_step_run_cut_by_max_steps_has_both_steps_on_its_curves():
    model = RecordsLosses()
    trainer = Trainer(max_steps=2, log_every_n_steps=1, enable_progress_bar=False, enable_checkpointing=False)
    trainer.fit(model, loader(n=64, batch_size=8))  # stops inside the first epoch
    acc = _read(trainer.run_dir)
    assert _series(acc, "train_loss") == [(0, pytest.approx(model.losses[0])), (1, pytest.approx(model.losses[1]))]


def test_a_run_as_long_as_the_interval_gets_no_hint_and_no_extra_points(trainer_log):
    trainer = Trainer(max_epochs=1, log_every_n_steps=4, enable_progress_bar=False, enable_checkpointing=False)
    trainer.fit(RecordsLosses(), loader(n=64, batch_size=8))  # 8 steps: 4 and 8 are on the interval
    assert [s for s, _ in _series(_read(trainer.run_dir), "train_loss")] == [3, 7]
    assert not [line for line in trainer_log if "log_every_n_steps" in line]


def test_the_writer_starts_no_thread_and_what_it_is_given_is_on_disk_at_each_flush(tmp_path):
    logger = TensorBoardLogger(save_dir=tmp_path, name="run", version=0, flush_secs=3600)
    threads = {t.ident for t in threading.enumerate()}
    writer = logger.experiment  # torch's SummaryWriter (a subclass), as Lightning users call it
    assert isinstance(writer, SummaryWriter)
    writer.add_scalar("loss", 0.5, 1)
    writer.add_text("note", "a user's text", 1)
    assert {t.ident for t in threading.enumerate()} == threads  # no writer thread per run
    writer.flush()
    (first,) = glob.glob(str(tmp_path / "run" / "version_0" / "events.out.tfevents.*"))
    events = EventAccumulator(first)
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 0.5)]
    assert "note/text_summary" in events.Tags()["tensors"]
    writer.close()
    writer.add_scalar("loss", 0.25, 2)  # as torch's: after close, a new event file in the same folder
    writer.close()
    files = glob.glob(str(tmp_path / "run" / "version_0" / "events.out.tfevents.*"))
    (second,) = set(files) - {first}
    events = EventAccumulator(second)
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(2, 0.25)]


def test_an_event_is_on_disk_without_a_flush_once_flush_secs_have_passed(tmp_path):
    writer = TensorBoardLogger(save_dir=tmp_path, name="run", version=0, flush_secs=1e-6).experiment
    time.sleep(0.01)
    writer.add_scalar("loss", 0.5, 1)
    (path,) = glob.glob(str(tmp_path / "run" / "version_0" / "events.out.tfevents.*"))
    events = EventAccumulator(path)
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(1, 0.5)]
    writer.close()


def test_the_hp_metric_placeholder_goes_through_log_metrics_as_lightnings(tmp_path):
    class Records(TensorBoardLogger):
        def log_metrics(self, metrics, step=None):
            calls.append((dict(metrics), step))
            super().log_metrics(metrics, step)

    calls = []
    trainer = Trainer(max_epochs=1, logger=Records(tmp_path), log_every_n_steps=2, enable_progress_bar=False,
                      enable_checkpointing=False)
    trainer.fit(RecordsLosses(), loader(64))
    # Lightning's call, the first one a subclass (or a mock of log_metrics) sees; then the training rows.
    assert calls[0] == ({"hp_metric": -1}, None)
    assert [step for _, step in calls[1:]] == [1, 3]
    assert [e.step for e in _read(trainer.run_dir).Scalars("hp_metric")] == [0]
