"""What Lightning code reads on the Trainer during and after fit, validate/test's results and their
table, save_checkpoint(weights_only=...), weights_only= on the entry points (the profiler: tests/trainer/loops/test_profiling.py)."""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch
from torch.utils.data import DataLoader

from callbacks import Callback, EarlyStopping, ModelCheckpoint
from tests._models import Classifier, dataset, loader, quiet
from trainer import CheckpointError, DataModule, Trainer


class WithScheduler(Classifier):
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1), "interval": "step"}}


class Records(Callback):
    """What a Lightning callback would read, in the hooks it would read it in."""

    def __init__(self) -> None:
        self.seen: dict[str, dict] = {}

    def _stage(self, trainer) -> tuple:
        return (trainer.training, trainer.validating, trainer.testing, trainer.predicting, trainer.sanity_checking)

    def on_sanity_check_start(self, trainer, module):
        self.seen["sanity"] = {"stage": self._stage(trainer)}

    def on_train_start(self, trainer, module):
        self.seen["train_start"] = {
            "stage": self._stage(trainer), "lightning_module": trainer.lightning_module is module,
            "model": trainer.model is module, "optimizers": trainer.optimizers, "num_training_batches": trainer.num_training_batches,
            "num_val_batches": trainer.num_val_batches, "train_dataloader": trainer.train_dataloader,
            "val_dataloaders": trainer.val_dataloaders, "estimated": trainer.estimated_stepping_batches,
            "schedulers": [c.scheduler for c in trainer.lr_scheduler_configs],
            "intervals": [c.interval for c in trainer.lr_scheduler_configs],
            "ranks": (trainer.global_rank, trainer.local_rank, trainer.node_rank, trainer.world_size, trainer.is_global_zero, trainer.num_devices, trainer.num_nodes),
            "datamodule": trainer.datamodule,
        }

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.seen.setdefault("bar", []).append(dict(trainer.progress_bar_metrics))

    def on_validation_start(self, trainer, module):
        self.seen.setdefault("validation", []).append(self._stage(trainer))

    def on_test_start(self, trainer, module):
        self.seen["test"] = self._stage(trainer)

    def on_predict_start(self, trainer, module):
        self.seen["predict"] = self._stage(trainer)


class Data(DataModule):
    def train_dataloader(self):
        return loader(48, 16)

    def val_dataloader(self):
        return [loader(32, 16), loader(16, 16)]


def test_what_callbacks_read_during_and_after_fit():
    rec, stop = Records(), EarlyStopping(monitor="val_loss/dataloader_idx_0", patience=100)
    model, dm = WithScheduler(), Data()
    trainer = Trainer(max_epochs=2, limit_val_batches=1, callbacks=[rec, stop], enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, datamodule=dm)
    start = rec.seen["train_start"]
    assert rec.seen["sanity"]["stage"] == (False, False, False, False, True)
    assert start["stage"] == (True, False, False, False, False)
    # the sanity check's validation first, its hooks run with sanity_checking True (Lightning's)
    assert rec.seen["validation"] == [(False, False, False, False, True)] + [(False, True, False, False, False)] * 2
    assert start["lightning_module"] and start["model"]  # one process: the model is the module itself
    assert start["optimizers"] == trainer.optimizers and len(start["optimizers"]) == 1
    assert start["num_training_batches"] == 3 and start["num_val_batches"] == [1, 1]  # after limit_val_batches
    assert isinstance(start["train_dataloader"], DataLoader) and len(start["val_dataloaders"]) == 2
    assert start["estimated"] == 6
    assert start["schedulers"] == [trainer.lr_scheduler] and start["intervals"] == ["step"]
    assert start["ranks"] == (0, 0, 0, 1, True, 1, 1)
    assert start["datamodule"] is dm and trainer.datamodule is dm
    assert all("train_loss" in bar for bar in rec.seen["bar"])  # logged with prog_bar=True
    assert "val_loss/dataloader_idx_0" not in rec.seen["bar"][-1]  # not prog_bar
    # After fit.
    assert (trainer.current_epoch, trainer.global_step, trainer.max_epochs, trainer.max_steps) == (2, 6, 2, -1)  # Lightning's -1: no step limit
    assert isinstance(trainer.checkpoint_callback, ModelCheckpoint) and trainer.checkpoint_callbacks == [trainer.checkpoint_callback]
    assert trainer.early_stopping_callback is stop and trainer.early_stopping_callbacks == [stop]
    assert {"train_loss", "val_loss/dataloader_idx_0", "val_acc/dataloader_idx_1"} <= set(trainer.callback_metrics)
    assert set(trainer.logged_metrics) >= {"val_loss/dataloader_idx_0"}
    assert list(trainer.progress_bar_metrics) == ["train_loss"]  # the latest step's value
    assert not (trainer.training or trainer.validating or trainer.testing or trainer.predicting or trainer.sanity_checking)
    trainer.test(model, loader(16), verbose=False)
    trainer.predict(model, loader(16))
    assert rec.seen["test"] == (False, False, True, False, False) and rec.seen["predict"] == (False, False, False, True, False)
    assert trainer.num_test_batches == [1] and trainer.num_predict_batches == [1]


def test_should_stop_is_settable_and_fit_stops_at_the_next_step():
    class Stopper(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.global_step == 3:
                trainer.should_stop = True

    trainer = Trainer(max_epochs=5, callbacks=[Stopper()], **quiet())
    trainer.fit(Classifier(), loader(64, 16))
    assert trainer.should_stop and trainer.global_step == 3 and trainer.current_epoch == 0


# --- validate() and test() ------------------------------------------------------------------
def test_validate_and_test_return_one_dict_per_loader_and_print_lightnings_table(capsys):
    model = Classifier()
    trainer = Trainer(**quiet())
    one = trainer.validate(model, loader(32))
    table = capsys.readouterr().out
    assert isinstance(one, list) and len(one) == 1 and set(one[0]) == {"val_loss", "val_acc"}
    assert "Validate metric" in table and "DataLoader 0" in table and "DataLoader 1" not in table
    line = next(row for row in table.splitlines() if row.split() and row.split()[0] == "val_loss")
    assert float(line.split()[1]) == pytest.approx(one[0]["val_loss"], rel=1e-5)

    two = trainer.test(model, [loader(32), loader(16)])
    table = capsys.readouterr().out
    assert [set(r) for r in two] == [{"test_loss/dataloader_idx_0"}, {"test_loss/dataloader_idx_1"}]
    assert "Test metric" in table and "DataLoader 1" in table
    row = next(r for r in table.splitlines() if r.split() and r.split()[0] == "test_loss").split()
    assert [float(v) for v in row[1:]] == pytest.approx([two[0]["test_loss/dataloader_idx_0"], two[1]["test_loss/dataloader_idx_1"]], rel=1e-5)

    assert trainer.validate(model, loader(32), verbose=False) == one
    assert capsys.readouterr().out == ""
    with pytest.raises(TypeError, match=r"verbose='yes' must be True or False"):
        trainer.validate(model, loader(32), verbose="yes")


def test_validate_without_a_model_runs_the_last_fits():
    trainer = Trainer(max_steps=2, **quiet())
    for error in (TypeError, ValueError):  # Lightning's type, and ours before
        with pytest.raises(error, match=r"^`Trainer.validate\(\)` requires a `LightningModule` when it hasn't been passed "
                                        r"in a previous run. trainer.validate\(\) was called without a model"):
            trainer.validate(dataloaders=loader(16))
    model = Classifier()
    trainer.fit(model, loader(32))
    assert trainer.validate(dataloaders=loader(16), verbose=False) == trainer.validate(model, loader(16), verbose=False)


# --- checkpoints ----------------------------------------------------------------------------
def test_save_checkpoint_weights_only_keeps_the_weights_and_no_training_state(tmp_path):
    model = Classifier(hidden=5)
    trainer = Trainer(max_steps=3, **quiet())
    trainer.fit(model, loader(64))
    trainer.save_checkpoint(tmp_path / "full.ckpt")
    trainer.save_checkpoint(tmp_path / "weights.ckpt", weights_only=True)
    full = torch.load(tmp_path / "full.ckpt", weights_only=True)
    light = torch.load(tmp_path / "weights.ckpt", weights_only=True)
    assert {"optimizer_states", "lr_schedulers", "callbacks"} <= set(full) and "rng" in full["steadytrainer"]
    assert not {"optimizer_states", "lr_schedulers", "callbacks"} & set(light) and "rng" not in light["steadytrainer"]
    assert light["global_step"] == 3 and "loops" in light  # Lightning's weights-only file keeps the loops
    assert all(torch.equal(light["state_dict"][k], v) for k, v in model.state_dict().items())
    restored = Classifier.load_from_checkpoint(tmp_path / "weights.ckpt")
    assert restored.net[0].out_features == 5 and torch.equal(restored.net[0].weight, model.net[0].weight)
    [result] = Trainer(**quiet()).validate(Classifier(hidden=5), loader(32), ckpt_path=tmp_path / "weights.ckpt", verbose=False)
    assert result == trainer.validate(model, loader(32), verbose=False)[0]
    with pytest.raises(CheckpointError, match="weights only.*fit cannot resume from it"):
        Trainer(max_steps=4, **quiet()).fit(Classifier(hidden=5), loader(64), ckpt_path=tmp_path / "weights.ckpt")
    with pytest.raises(ValueError, match="remote file systems are not supported"):
        trainer.save_checkpoint(tmp_path / "x.ckpt", storage_options={"anon": True})


def test_the_entry_points_accept_lightnings_weights_only(tmp_path):
    model = Classifier()
    trainer = Trainer(max_steps=2, **quiet())
    trainer.fit(model, loader(32), weights_only=False)
    trainer.save_checkpoint(tmp_path / "a.ckpt")
    for weights_only in (True, False, None):
        trainer.validate(model, loader(16), ckpt_path=tmp_path / "a.ckpt", verbose=False, weights_only=weights_only)
        trainer.test(model, loader(16), ckpt_path=tmp_path / "a.ckpt", verbose=False, weights_only=weights_only)
        assert len(trainer.predict(model, loader(16), ckpt_path=tmp_path / "a.ckpt", weights_only=weights_only)) == 1
    with pytest.raises(TypeError, match=r"weights_only='no' must be True, False or None"):
        trainer.test(model, loader(16), weights_only="no")
    assert trainer.predict(model, loader(16), return_predictions=False) is None


def test_ckpt_path_is_the_file_resumed_or_evaluated_and_setting_it_loads_that_file_next(tmp_path):
    trainer = Trainer(max_epochs=1, callbacks=[ModelCheckpoint(dirpath=tmp_path, save_top_k=-1)], **quiet(enable_checkpointing=True))
    trainer.fit(Classifier(), loader(32))
    assert trainer.ckpt_path is None  # nothing was resumed
    trainer.test(Classifier(), loader(16), ckpt_path="best", verbose=False)
    assert trainer.ckpt_path == trainer.checkpoint_callback.best_model_path  # "best", resolved

    again = Trainer(max_epochs=2, callbacks=[ModelCheckpoint(dirpath=tmp_path, save_top_k=-1)], **quiet(enable_checkpointing=True))
    again.fit(Classifier(), loader(32), ckpt_path="last")
    assert again.ckpt_path == str(tmp_path / "epoch=0-step=2.ckpt") and again.global_step == 4  # "last", resolved

    stateful = Trainer(max_epochs=3, **quiet(enable_checkpointing=True))
    stateful.ckpt_path = tmp_path / "epoch=0-step=2.ckpt"  # Lightning's stateful use: the next calls load it
    stateful.fit(Classifier(), loader(32))
    assert stateful.global_step == 6 and stateful.ckpt_path == str(tmp_path / "epoch=0-step=2.ckpt")
    with pytest.warns(UserWarning, match=r"trainer.ckpt_path = .* was called but then you passed `ckpt_path="):
        stateful.ckpt_path = tmp_path / "epoch=0-step=2.ckpt"
        Trainer.validate(stateful, Classifier(), loader(16), ckpt_path=tmp_path / "epoch=1-step=4.ckpt", verbose=False)
    assert stateful.ckpt_path == str(tmp_path / "epoch=1-step=4.ckpt")  # the one passed won, and the setting is gone


# --- under ddp ------------------------------------------------------------------------------
class RanksToFile(Callback):
    def on_train_start(self, trainer, module):
        facts = {
            "global_rank": trainer.global_rank, "local_rank": trainer.local_rank, "world_size": trainer.world_size,
            "is_global_zero": trainer.is_global_zero, "num_devices": trainer.num_devices, "node_rank": trainer.node_rank,
            "num_training_batches": trainer.num_training_batches, "training": trainer.training,
            "model_is_wrapped": trainer.model is not trainer.lightning_module,
        }
        with open(f"rank_{trainer.global_rank}.json", "w") as f:
            json.dump(facts, f)


@pytest.mark.slow
@pytest.mark.parametrize("use_distributed_sampler", [True, False])
@pytest.mark.usefixtures("ranks_from_the_fork_server")  # ranks fork from a warm server: see tests/conftest.py
def test_ranks_and_sampler_under_ddp_with_two_processes(use_distributed_sampler):
    trainer = Trainer(
        strategy="ddp", accelerator="cpu", devices=2, max_steps=1, callbacks=[RanksToFile()],
        use_distributed_sampler=use_distributed_sampler, profiler="simple", **quiet(),
    )
    trainer.fit(Classifier(), DataLoader(dataset(64), batch_size=8))
    facts = [json.load(open(f"rank_{r}.json")) for r in range(2)]
    batches = 4 if use_distributed_sampler else 8  # each rank its half, or all of it
    for rank, seen in enumerate(facts):
        assert seen == {
            "global_rank": rank, "local_rank": rank, "world_size": 2, "is_global_zero": rank == 0, "num_devices": 2,
            "node_rank": 0, "num_training_batches": batches, "training": True, "model_is_wrapped": True,
        }
    assert trainer.lightning_module is not None and trainer.model is trainer.lightning_module  # the caller's module
    assert trainer.global_step == 1  # rank 0's counters came back to the caller, and its profile
    recorded = trainer.profiler.recorded_durations
    assert len(recorded["[Strategy]DDPStrategy.training_step"]) == 1 and len(recorded["optimizer_step"]) == 1
    assert not os.path.exists("rank_2.json")


def test_is_last_batch_is_true_for_the_epochs_last_batch_only():
    seen = []

    class Watch(Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            seen.append(("start", batch_idx, trainer.is_last_batch))

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            seen.append(("end", batch_idx, trainer.is_last_batch))

    trainer = Trainer(max_epochs=2, limit_train_batches=3, **quiet(callbacks=[Watch()]))
    trainer.fit(Classifier(), loader(64, batch_size=8))
    assert [flag for _, _, flag in seen] == [False, False, False, False, True, True] * 2


# --- what callbacks and the Tuner use of ours (trainer/trainer_properties.py, trainer/loops/run.py) --------
def test_a_copy_of_the_trainer_has_its_own_options_and_no_run():
    trainer = Trainer(max_steps=2, **quiet())
    trainer.fit(Classifier(), loader(64))
    clone = copy.copy(trainer)
    assert clone.strategy is trainer.strategy and list(clone.callbacks) == list(trainer.callbacks)
    assert (clone.global_step, clone.optimizers, clone.callback_metrics, clone.lightning_module) == (0, [], {}, None)
    clone.max_steps, clone.callbacks = 3, []
    assert trainer.max_steps == 2 and trainer.callbacks  # setting the copy's options leaves the original's
    clone.fit(Classifier(), loader(64))
    assert clone.global_step == 3 and trainer.global_step == 2 and trainer.optimizer is not clone.optimizer


def test_at_epoch_end_is_true_from_the_end_of_the_epochs_batches_to_its_on_train_epoch_end():
    seen = []

    class Watch(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            seen.append(("batch", trainer.at_epoch_end))

        def on_validation_end(self, trainer, module):
            seen.append(("validation", trainer.at_epoch_end))

        def on_train_epoch_end(self, trainer, module):
            seen.append(("epoch_end", trainer.at_epoch_end))

    trainer = Trainer(max_epochs=1, val_check_interval=1, num_sanity_val_steps=0, **quiet(callbacks=[Watch()]))
    trainer.fit(Classifier(), loader(16, batch_size=8), loader(8))
    # Lightning's order: each batch's validation after its on_train_batch_end, the last one's before the epoch's end
    assert seen == [("batch", False), ("validation", False), ("batch", False), ("validation", False), ("epoch_end", True)]
    assert trainer.at_epoch_end is False


def test_publish_step_metrics_puts_this_steps_values_into_callback_metrics_between_log_steps():
    seen = []

    class Publish(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            before = trainer.callback_metrics.get("train_loss")
            seen.append((before, trainer.publish_step_metrics()["train_loss"], trainer.callback_metrics["train_loss"]))

    trainer = Trainer(max_steps=3, log_every_n_steps=50, **quiet(callbacks=[Publish()]))
    trainer.fit(Classifier(), loader(64))
    (before1, step1, after1), (before, published, after), _ = seen
    assert before1 is None and step1 == after1  # no row before step 50: nothing until published
    assert before == step1 and published == after != before  # step 1's until step 2's is published
    assert Trainer(**quiet()).publish_step_metrics() == {}  # outside fit: nothing to publish


def test_the_evaluation_loaders_and_the_sanity_batches_are_lightnings_attributes():
    trainer = Trainer(num_sanity_val_steps=3, **quiet(max_epochs=1))
    assert trainer.test_dataloaders is None and trainer.predict_dataloaders is None and trainer.val_dataloaders is None
    val, test, predict = loader(32, 16), [loader(16, 8), loader(8, 8)], loader(8, 4)
    model = Classifier()
    trainer.fit(model, loader(32), val)
    assert trainer.val_dataloaders is val and trainer.num_sanity_val_batches == [2]  # min(3, the loader's 2)
    trainer.test(model, test, verbose=False)
    assert trainer.test_dataloaders == test and trainer.predict_dataloaders is None
    trainer.predict(model, predict)
    assert trainer.predict_dataloaders is predict
    assert Trainer(num_sanity_val_steps=-1, **quiet()).num_sanity_val_batches == []


def test_init_module_builds_on_the_device_in_a_true_precisions_dtype_and_can_skip_init():
    with Trainer(precision="bf16-true", **quiet()).init_module():
        model = Classifier()
    assert model.net[0].weight.dtype == torch.bfloat16 and model.device.type == "cpu"
    assert torch.get_default_dtype() == torch.float32  # put back
    torch.manual_seed(0)
    with Trainer(**quiet()).init_module(empty_init=True):
        skipped = torch.nn.Linear(4, 4)
    torch.manual_seed(0)
    initialized = torch.nn.Linear(4, 4)
    assert skipped.weight.dtype == torch.float32 and not torch.equal(skipped.weight, initialized.weight)


def test_state_finished_says_whether_the_last_call_ran_to_its_end():
    class Fails(Classifier):
        def validation_step(self, batch, batch_idx):
            raise RuntimeError("broken")

    trainer = Trainer(max_steps=2, **quiet())
    assert not trainer.state.finished and trainer.state.status == "initializing"
    trainer.fit(Classifier(), loader(32))
    assert trainer.state.finished and trainer.state.stopped
    with pytest.raises(RuntimeError, match="broken"):
        trainer.validate(Fails(), loader(16), verbose=False)
    assert not trainer.state.finished and trainer.state.stopped and trainer.state.status == "interrupted"


class EpochEndOverrides(Classifier):
    def training_step(self, batch, batch_idx):
        self.log_dict({"step_metric": float(-1 - batch_idx), "shared": 100.0}, logger=False, prog_bar=True)
        return super().training_step(batch, batch_idx)

    def on_train_epoch_end(self):
        self.log_dict({f"epoch_metric_{self.current_epoch}": float(self.current_epoch), "shared": 111.0}, logger=False, prog_bar=True)


def test_progress_bar_metrics_hold_the_latest_of_each_value_an_epoch_end_included():
    trainer = Trainer(max_epochs=3, **quiet())
    trainer.fit(EpochEndOverrides(), loader(32, batch_size=16))
    metrics = trainer.progress_bar_metrics
    assert metrics["shared"] == 111.0  # on_train_epoch_end logged it after the last step's 100
    assert metrics["step_metric"] == -2.0  # the last step's
    assert {k: metrics[k] for k in ("epoch_metric_0", "epoch_metric_1", "epoch_metric_2")} == {
        "epoch_metric_0": 0.0, "epoch_metric_1": 1.0, "epoch_metric_2": 2.0}  # each epoch's stays
