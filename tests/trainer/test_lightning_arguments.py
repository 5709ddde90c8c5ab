"""Trainer(...) with Lightning's argument names and meanings: where runs go, the accelerator and
devices, precision spellings, arguments we do not take, max_time and min_*, and the torch flags."""

from __future__ import annotations

import os
import warnings
from datetime import timedelta

import pytest
import torch
from torch.utils.data import DataLoader

from callbacks import Callback, ModelCheckpoint, RichModelSummary, RichProgressBar, TensorBoardLogger, Timer
from strategies import DDPStrategy
from tests._models import Classifier, dataset, loader, quiet
from trainer import Trainer
from trainer.init_arguments import UNSUPPORTED

NO_CUDA = not torch.cuda.is_available()


# --- default_root_dir -----------------------------------------------------------------------
def test_default_root_dir_holds_the_run_folder_with_its_logs_and_checkpoints(tmp_path):
    trainer = Trainer(default_root_dir=tmp_path / "out", max_steps=2, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Classifier(), loader(32))
    assert trainer.default_root_dir == str(tmp_path / "out")
    assert trainer.run_dir == str(tmp_path / "out" / "lightning_logs" / "version_0")
    assert any(f.startswith("events.out.tfevents") for f in os.listdir(trainer.run_dir))
    assert os.listdir(os.path.join(trainer.run_dir, "checkpoints")) == ["epoch=0-step=2.ckpt"]  # as Lightning names it
    assert trainer.checkpoint_callback.best_model_path.startswith(str(tmp_path / "out"))


def test_log_dir_is_an_alias_and_giving_both_is_an_error(tmp_path):
    assert Trainer(log_dir="elsewhere").default_root_dir == "elsewhere"
    assert Trainer().default_root_dir == os.getcwd()  # Lightning's default: the working directory
    assert Trainer(default_root_dir=None).default_root_dir == os.getcwd()  # Lightning's None: the default
    assert Trainer(log_dir=None).default_root_dir is None  # no run folder, no TensorBoard
    assert Trainer(log_dir=None).loggers == [] and isinstance(Trainer().logger, TensorBoardLogger)
    with pytest.raises(ValueError, match=r"default_root_dir='a' and log_dir='b' name the same folder: give only one"):
        Trainer(default_root_dir="a", log_dir="b")
    with pytest.raises(ValueError, match="give only one"):
        Trainer(default_root_dir="a", log_dir=".")  # written out, still two names for one folder
    with pytest.raises(TypeError, match=r"default_root_dir=3 must be a path"):
        Trainer(default_root_dir=3)


# --- accelerator, devices, strategy, num_nodes ----------------------------------------------
@pytest.mark.parametrize(("devices", "strategy", "processes"), [("auto", "single", None), (1, "single", None), (-1, "single", None), ("-1", "single", None), ("1", "single", None), (2, "ddp", 2), ("2", "ddp", 2)])
def test_accelerator_cpu_with_lightnings_device_spellings(devices, strategy, processes):
    trainer = Trainer(accelerator="cpu", devices=devices)
    assert trainer.strategy.name == strategy and trainer.strategy.root_device == torch.device("cpu")
    assert getattr(trainer.strategy, "num_processes", None) == processes
    assert trainer.num_devices == (processes or 1)


@pytest.mark.skipif(not NO_CUDA, reason="needs a machine without a GPU")
@pytest.mark.parametrize("name", ["gpu", "cuda", "GPU"])
def test_accelerator_gpu_without_a_gpu_says_so_and_what_to_pass(name):
    with pytest.raises(ValueError) as info:
        Trainer(accelerator=name)
    message = str(info.value)
    assert f"accelerator={name!r}" in message and "no CUDA GPU was found" in message
    assert "accelerator='cpu'" in message and "accelerator='auto'" in message


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="needs a machine without MPS")
def test_accelerator_mps_without_mps_says_so():
    with pytest.raises(ValueError, match=r"accelerator='mps' but Apple's MPS device is not available.*accelerator='cpu'"):
        Trainer(accelerator="mps")


@pytest.mark.parametrize(
    ("kwargs", "error", "says"),
    [
        (dict(accelerator="tpu"), ValueError, ["accelerator='tpu'", "not supported", "accelerator='auto', 'gpu' or 'cpu'"]),
        (dict(accelerator="hpu"), ValueError, ["accelerator='hpu'", "not supported"]),
        (dict(accelerator="cpus"), ValueError, ["Unknown accelerator='cpus'", "Did you mean 'cpu'"]),
        (dict(accelerator=None), TypeError, ["accelerator=None", "'auto', 'cpu', 'gpu'"]),
        (dict(accelerator="cpu", devices=[0, 1]), ValueError, ["devices=[0, 1]", "accelerator='cpu'", "devices=2"]),
        (dict(accelerator="cpu", devices=[0]), ValueError, ["devices=[0]", "accelerator='cpu'", "devices=1"]),
        (dict(devices="0"), ValueError, ["devices='0'", "at least 1"]),
        (dict(devices="two"), ValueError, ["devices='two'", "not understood"]),
        (dict(num_nodes=0), ValueError, ["num_nodes=0", "int >= 1"]),
        (dict(num_nodes=2), ValueError, ["num_nodes=2", "torchrun --nnodes=2", "not started by one"]),
        (dict(strategy="deepspeed_stage_2"), ValueError, ["strategy='deepspeed_stage_2'", "'fsdp'"]),
        (dict(strategy="dpp"), ValueError, ["Unknown strategy 'dpp'", "Did you mean 'ddp'"]),
    ],
)
def test_bad_accelerators_devices_and_nodes_are_answered_with_the_fix(kwargs, error, says):
    with pytest.raises(error) as info:
        Trainer(**kwargs)
    for words in says:
        assert words in str(info.value)


def test_num_nodes_must_match_what_the_launcher_started(monkeypatch):
    env = {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    trainer = Trainer(accelerator="cpu", num_nodes=2)  # 2 machines x 2 processes: joins the launcher's group
    assert trainer.strategy.name == "ddp" and trainer.num_nodes == 2 and trainer.num_devices == 2
    assert trainer.node_rank == 1
    with pytest.raises(ValueError, match=r"num_nodes=3, but the launcher started 4 process\(es\), 2 on this machine"):
        Trainer(accelerator="cpu", num_nodes=3)


def test_lightnings_strategy_names_map_to_ours():
    assert isinstance(Trainer(strategy="ddp_spawn", devices=2).strategy, DDPStrategy)
    assert Trainer(strategy="ddp_find_unused_parameters_true", devices=2).strategy.find_unused_parameters is True
    assert Trainer(strategy="ddp_notebook", accelerator="cpu", devices=2).strategy.num_processes == 2


# --- precision ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("given", "name"),
    [(32, "32-true"), ("32", "32-true"), ("32-true", "32-true"), (16, "16-mixed"), ("16", "16-mixed"),
     ("16-mixed", "16-mixed"), ("bf16", "bf16-mixed"), ("bf16-mixed", "bf16-mixed"), ("bf16-true", "bf16-true"),
     ("16-true", "16-true"), (64, "64-true"), ("64", "64-true"), ("64-true", "64-true")],
)
def test_every_lightning_precision_spelling_is_its_full_name(given, name):
    if name == "16-mixed" and not torch.cuda.is_available():  # Lightning's: fp16 AMP on the CPU runs as bf16, warned
        name = "bf16-mixed"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert Trainer(precision=given).precision == name


def test_a_plugins_precision_and_a_typo_are_answered():
    with pytest.raises(ValueError, match=r"precision='transformer-engine' \(a Lightning plugin's precision\) is not supported"):
        Trainer(precision="transformer-engine")
    with pytest.raises(ValueError, match=r"Unknown precision='bf16-ture'.*Did you mean 'bf16-true'"):
        Trainer(precision="bf16-ture")


class SeesDtype(Classifier):
    def training_step(self, batch, batch_idx):
        self.seen = (batch[0].dtype, batch[1].dtype, torch.zeros(1).dtype)
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize(("precision", "dtype"), [("64-true", torch.float64), ("bf16-true", torch.bfloat16)])
def test_true_precision_trains_the_model_in_that_dtype(precision, dtype):
    model = SeesDtype()
    before = [p.detach().clone() for p in model.parameters()]
    trainer = Trainer(precision=precision, max_steps=3, **quiet())
    trainer.fit(model, loader(64))
    assert {p.dtype for p in model.parameters()} == {dtype}
    assert model.seen == (dtype, torch.int64, dtype)  # floats converted, labels left alone, default dtype set
    assert torch.get_default_dtype() == torch.float32  # and put back after each step
    assert not all(torch.equal(a.to(dtype), b) for a, b in zip(before, model.parameters()))
    [result] = trainer.validate(model, loader(32), verbose=False)
    assert torch.isfinite(torch.tensor(result["val_loss"]))


# --- arguments we do not take ---------------------------------------------------------------
@pytest.mark.parametrize(("typo", "meant"), [("max_epoch", "max_epochs"), ("default_root", "default_root_dir"), ("accelarator", "accelerator"), ("check_val_every_n_epochs", "check_val_every_n_epoch"), ("precison", "precision")])
def test_a_misspelt_argument_gets_the_closest_name(typo, meant):
    with pytest.raises(TypeError, match=rf"Trainer\.__init__\(\) got an unexpected keyword argument '{typo}'. Did you mean '{meant}'\?"):
        Trainer(**{typo: 1})


def test_an_argument_nothing_like_ours_points_at_the_list():
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'zzz_qqq'. See docs/trainer-arguments.md"):
        Trainer(zzz_qqq=1)


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_each_unsupported_lightning_argument_gets_a_sentence(name):
    with pytest.raises(TypeError) as info:
        Trainer(**{name: "something"})
    message = str(info.value)
    assert message.startswith(f"Trainer({name}='something') is not supported: ")
    assert len(message) > len(f"Trainer({name}='something') is not supported: ") + 20  # says what to do instead


def test_lightnings_defaults_for_arguments_we_do_not_take_change_nothing():
    Trainer(plugins=None, model_registry=None, enable_autolog_hparams=True, suggest_integrations=False)
    with pytest.raises(TypeError, match="enable_autolog_hparams=False"):
        Trainer(enable_autolog_hparams=False)


def test_barebones_turns_off_what_costs_time():
    trainer = Trainer(barebones=True)
    assert trainer.callbacks == [] and trainer.default_root_dir is None and trainer.num_sanity_val_steps == 0
    Trainer(barebones=True, enable_checkpointing=False, logger=False, enable_progress_bar=False, fast_dev_run=False,
            enable_model_summary=False, num_sanity_val_steps=0, detect_anomaly=False)  # off, said again: accepted


@pytest.mark.parametrize("option, value, why", [
    ("enable_checkpointing", True, "Checkpointing can impact raw speed"),
    ("logger", True, "Logging can impact raw speed"),
    ("enable_progress_bar", True, "The progress bar can impact raw speed"),
    ("enable_model_summary", True, "Model summary can impact raw speed"),
    ("log_every_n_steps", 1, "Logging can impact raw speed"),
    ("num_sanity_val_steps", 1, "Sanity checking can impact raw speed"),
    ("fast_dev_run", 1, "Development run is not meant for raw speed evaluation"),
    ("detect_anomaly", True, "Anomaly detection can impact raw speed"),
])
def test_barebones_refuses_what_it_turns_off_in_lightnings_words(option, value, why):
    with pytest.raises(ValueError, match=rf"^`Trainer\(barebones=True, {option}={value}\)` was passed. {why}"):
        Trainer(barebones=True, **{option: value})


# --- loop limits ----------------------------------------------------------------------------
def test_lightnings_no_limit_spellings():
    # Lightning's values read back: -1 is no step limit (the default; None too) and max_epochs=-1 is endless
    assert Trainer().max_steps == -1 and Trainer(max_steps=None).max_steps == -1 and Trainer().max_epochs is None
    assert Trainer(max_epochs=-1).max_epochs == -1
    trainer = Trainer(max_steps=3, **quiet())
    trainer.fit(Classifier(), loader(64))  # 4 batches an epoch
    assert trainer.global_step == 3 and trainer.max_epochs == -1 and trainer.current_epoch == 0  # the steps end it
    trainer = Trainer(max_epochs=-1, max_steps=10, **quiet())
    trainer.fit(Classifier(), loader(64))
    assert trainer.global_step == 10 and trainer.current_epoch == 2  # ended by max_steps in the third epoch
    with pytest.raises(ValueError, match=r"min_epochs=3 is more than max_epochs=2"):
        Trainer(min_epochs=3, max_epochs=2)


def test_fit_without_an_end_trains_1000_epochs_and_says_so():
    trainer = Trainer(limit_train_batches=1, callbacks=[StopAt(3)], **quiet())
    with pytest.warns(UserWarning, match=r"`max_epochs` was not set\. Setting it to 1000 epochs\. To train without an epoch limit, set `max_epochs=-1`"):
        trainer.fit(Classifier(), loader(32))
    assert trainer.max_epochs == 1000 and trainer.global_step == 3  # ended by should_stop, as StopAt asks
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # max_epochs=-1 or max_steps: an end the user chose, no warning
        warnings.filterwarnings("ignore", message="You defined a `validation_step` but have no `val_dataloader`")
        Trainer(max_epochs=-1, limit_train_batches=1, callbacks=[StopAt(2)], **quiet()).fit(Classifier(), loader(32))
        Trainer(max_steps=2, **quiet()).fit(Classifier(), loader(32))


class StopAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step >= self.step:
            trainer.should_stop = True


def test_max_epochs_minus_one_trains_until_should_stop():
    trainer = Trainer(max_epochs=-1, callbacks=[StopAt(5)], **quiet())
    trainer.fit(Classifier(), loader(32, 8))  # 4 steps an epoch
    assert trainer.global_step == 5 and trainer.should_stop


def test_should_stop_waits_for_min_steps_and_min_epochs(caplog):
    trainer = Trainer(max_epochs=10, min_steps=6, callbacks=[StopAt(1)], **quiet())
    trainer.fit(Classifier(), loader(32, 8))
    assert trainer.global_step == 6
    trainer = Trainer(max_epochs=10, min_epochs=3, callbacks=[StopAt(1)], **quiet())
    caplog.clear()
    with caplog.at_level("INFO", logger="trainer"):
        trainer.fit(Classifier(), loader(32, 8))
    assert trainer.current_epoch == 3 and trainer.global_step == 12  # stops as epoch 3 ends, not before
    said = [r.getMessage() for r in caplog.records if "has not been met" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(  # once, in Lightning's words
        "Trainer was signaled to stop but the required `min_epochs=3` or `min_steps=None` has not been met. Training will continue")


def test_default_root_dir_expands_the_home_folder_as_lightning_does(tmp_path, monkeypatch):
    from pathlib import Path

    monkeypatch.setenv("HOME", str(tmp_path))
    assert Trainer(default_root_dir="~/runs/").default_root_dir == str(tmp_path / "runs")
    assert Trainer(default_root_dir=Path("~/runs")).default_root_dir == str(tmp_path / "runs")


@pytest.mark.parametrize(("max_time", "seconds"), [("00:12:00:00", 43200.0), ("01:00:00:30", 86430.0), (timedelta(minutes=2), 120.0), ({"hours": 1, "minutes": 1}, 3660.0), (90, 90.0)])
def test_max_time_in_each_of_lightnings_forms_adds_a_timer(max_time, seconds):
    [timer] = [cb for cb in Trainer(max_time=max_time).callbacks if isinstance(cb, Timer)]
    assert timer.duration == seconds and timer.interval == "step"


def test_max_time_stops_fit_and_a_given_timer_wins():
    class Slow(Classifier):
        def training_step(self, batch, batch_idx):
            torch.ones(1).add_(1)
            import time

            time.sleep(0.02)
            return super().training_step(batch, batch_idx)

    trainer = Trainer(max_epochs=1000, max_time={"seconds": 0.3}, **quiet())
    trainer.fit(Slow(), loader(32, 8))
    assert trainer.state.stop_reason == "timer" and 3 <= trainer.global_step < 200
    mine = Timer(5)
    assert [cb for cb in Trainer(max_time=1, callbacks=[mine]).callbacks if isinstance(cb, Timer)] == [mine]
    with pytest.raises(ValueError, match=r"max_time='12:00' must be a 'DD:HH:MM:SS' string"):
        Trainer(max_time="12:00")


# --- the torch flags ------------------------------------------------------------------------
class Flags(Classifier):
    def training_step(self, batch, batch_idx):
        self.train_flags = (torch.backends.cudnn.benchmark, torch.is_anomaly_enabled(), torch.is_inference_mode_enabled())
        return super().training_step(batch, batch_idx)

    def validation_step(self, batch, batch_idx):
        self.val_flags = (torch.is_inference_mode_enabled(), torch.is_grad_enabled())
        return super().validation_step(batch, batch_idx)


def test_benchmark_and_detect_anomaly_hold_for_the_stage_and_are_put_back():
    before = torch.backends.cudnn.benchmark
    model = Flags()
    Trainer(benchmark=not before, detect_anomaly=True, max_steps=1, **quiet()).fit(model, loader(16))
    assert model.train_flags == (not before, True, False)
    assert torch.backends.cudnn.benchmark == before and not torch.is_anomaly_enabled()


def test_inference_mode_in_validate_and_test_and_no_grad_inside_fit():
    model = Flags()
    Trainer(**quiet()).validate(model, loader(16), verbose=False)
    assert model.val_flags == (True, False)
    Trainer(inference_mode=False, **quiet()).validate(model, loader(16), verbose=False)
    assert model.val_flags == (False, False)
    Trainer(max_steps=1, num_sanity_val_steps=0, **quiet()).fit(model, loader(16), loader(16))
    assert model.val_flags == (False, False)  # fit's validation: no_grad, so training can reuse its tensors


def test_deterministic_warn_is_accepted():
    seen = []

    class Watch(Classifier):
        def training_step(self, batch, batch_idx):
            seen.append((torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()))
            return super().training_step(batch, batch_idx)

    Trainer(deterministic="warn", max_steps=1, **quiet()).fit(Watch(), loader(16))
    assert seen == [(True, True)]


class CountsLoaders(Classifier):
    def __init__(self) -> None:
        super().__init__()
        self.made = {"train": 0, "val": 0}

    def train_dataloader(self):
        self.made["train"] += 1
        return loader(16 * self.made["train"], 16)  # one more batch each time

    def val_dataloader(self):
        self.made["val"] += 1
        return loader(16)


@pytest.mark.parametrize(("every", "made", "batches"), [(0, 1, 1), (1, 3, 3), (2, 2, 2)])
def test_reload_dataloaders_every_n_epochs_calls_the_hooks_again(every, made, batches):
    model = CountsLoaders()
    trainer = Trainer(max_epochs=3, reload_dataloaders_every_n_epochs=every, num_sanity_val_steps=0, **quiet())
    trainer.fit(model)
    assert model.made == {"train": made, "val": made}
    assert trainer.num_training_batches == batches


def test_each_new_flag_checks_its_value():
    for kwargs, words in [
        (dict(benchmark="yes"), "benchmark='yes' must be True or False"),
        (dict(detect_anomaly=1), "detect_anomaly=1 must be True or False"),
        (dict(inference_mode=None), "inference_mode=None must be True or False"),
        (dict(use_distributed_sampler="no"), "use_distributed_sampler='no' must be True or False"),
        (dict(reload_dataloaders_every_n_epochs=-1), "reload_dataloaders_every_n_epochs=-1 must be >= 0"),
        (dict(min_steps=-1), "min_steps=-1 must be >= 0"),
        (dict(val_check_interval="00:00:10:00"), "val_check_interval='00:00:10:00': a time-based interval is not supported"),
    ]:
        with pytest.raises((TypeError, ValueError)) as info:
            Trainer(**kwargs)
        assert words in str(info.value)


def test_use_distributed_sampler_false_leaves_the_loader_as_given():
    strategy = Trainer(strategy="ddp", accelerator="cpu", devices=2, use_distributed_sampler=False).strategy
    given = DataLoader(dataset(32), batch_size=8, shuffle=True)
    assert strategy.process_dataloader(given, "train") is given


def test_the_default_callbacks_are_built_from_the_options():
    trainer = Trainer()
    # Lightning's order, checkpoints last; rich's bar and summary, as Lightning's when rich is installed (it is in dev)
    assert [type(cb) for cb in trainer.callbacks] == [RichProgressBar, RichModelSummary, ModelCheckpoint]
    assert isinstance(trainer.logger, TensorBoardLogger)  # logger=True: a logger, no longer a callback


def test_none_means_lightnings_default_as_a_config_that_writes_every_argument_out_has_it():
    trainer = Trainer(
        precision=None, num_sanity_val_steps=None, log_every_n_steps=None, enable_checkpointing=None,
        enable_progress_bar=None, enable_model_summary=None, gradient_clip_algorithm=None, deterministic=None,
        benchmark=None, max_steps=-1, max_epochs=1, min_epochs=None, max_time=None, profiler=None,
    )
    assert (trainer.precision, trainer.num_sanity_val_steps, trainer.log_every_n_steps) == ("32-true", 2, 50)
    assert trainer.enable_checkpointing and trainer.enable_progress_bar and trainer.enable_model_summary
    assert trainer.gradient_clip_algorithm is None and trainer.deterministic is False  # Lightning's None: by norm


@pytest.mark.parametrize("name", ["limit_train_batches", "limit_val_batches", "overfit_batches", "val_check_interval"])
def test_a_limit_of_one_or_one_point_zero_says_which_it_means(trainer_log, name):
    Trainer(**{name: 1})
    Trainer(**{name: 1.0})
    Trainer(**{name: 2})
    said = [line for line in trainer_log if line.startswith(f"`Trainer({name}=")]
    assert len(said) == 2 and said[0].startswith(f"`Trainer({name}=1)` was configured so ")
    assert said[1].startswith(f"`Trainer({name}=1.0)` was configured so ") and ("100%" in said[1] or "end of the training epoch" in said[1])


class RecordsLoads(Classifier):
    """When each loader hook runs: (hook, epoch, sanity checking), in call order."""

    def __init__(self, steps_estimate: bool = False) -> None:
        super().__init__()
        self.calls, self.steps_estimate = [], steps_estimate

    def train_dataloader(self):
        self.calls.append(("train", self.trainer.current_epoch, self.trainer.sanity_checking))
        return loader(16)

    def val_dataloader(self):
        self.calls.append(("val", self.trainer.current_epoch, self.trainer.sanity_checking))
        return loader(16)

    def configure_optimizers(self):
        if self.steps_estimate:  # as a OneCycleLR's total_steps does
            self.calls.append(("estimate", self.trainer.estimated_stepping_batches))
        return super().configure_optimizers()


def test_the_sanity_check_loads_the_validation_loader_first_and_the_training_loader_comes_after():
    model = RecordsLoads()
    Trainer(max_epochs=1, num_sanity_val_steps=1, **quiet()).fit(model)
    assert model.calls == [("val", 0, True), ("train", 0, False)]  # Lightning's order; the sanity check's loader is reused


def test_estimated_stepping_batches_in_configure_optimizers_loads_the_training_loader_then():
    model = RecordsLoads(steps_estimate=True)
    Trainer(max_epochs=2, num_sanity_val_steps=1, **quiet()).fit(model)
    assert model.calls == [("train", 0, False), ("estimate", 2), ("val", 0, True)]  # loaded once


@pytest.mark.parametrize(
    ("sanity", "every_val", "reload", "train", "val", "validated"),
    [  # Lightning's own expectations (its test_dataloaders_load_every_n_epochs_infrequent_val)
        (1, 1, 2, [0, 2, 4], [2, 4], [0, 1, 2, 3, 4, 5]),
        (0, 3, 4, [0, 4], [2], [2, 5]),
        (1, 3, 4, [0, 4], [2], [2, 5]),  # the sanity check's load is off the schedule: epoch 2 loads again
        (1, 2, 1, [0, 1, 2, 3, 4, 5], [1, 3, 5], [1, 3, 5]),
    ],
)
def test_the_validation_loader_reloads_counted_from_its_own_last_load(sanity, every_val, reload, train, val, validated):
    class Counts(RecordsLoads):
        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            if not self.trainer.sanity_checking:
                self.calls.append(("validated", self.trainer.current_epoch, False))
            return super().validation_step(batch, batch_idx)

    model = Counts()
    Trainer(max_epochs=6, num_sanity_val_steps=sanity, check_val_every_n_epoch=every_val,
            reload_dataloaders_every_n_epochs=reload, **quiet()).fit(model)
    epochs = {kind: [e for k, e, sanity_checking in model.calls if k == kind and not sanity_checking] for kind in ("train", "val", "validated")}
    assert epochs == {"train": train, "val": val, "validated": validated}
    assert [c for c in model.calls if c[2]] == ([("val", 0, True)] if sanity else [])


def test_without_validation_the_validation_loader_is_never_asked_for():
    model = RecordsLoads()
    Trainer(max_epochs=2, limit_val_batches=0, **quiet()).fit(model)
    assert model.calls == [("train", 0, False)]


class SeesGradMode(Classifier):
    def __init__(self) -> None:
        super().__init__()
        self.seen = []

    def _record(self):
        self.seen.append((self.trainer.state.fn, torch.is_grad_enabled(), torch.is_inference_mode_enabled()))

    on_validation_start = on_test_start = on_predict_start = on_validation_epoch_end = _record


@pytest.mark.parametrize("inference_mode", [True, False])
def test_the_evaluation_hooks_run_without_grad_and_in_inference_mode_as_set(inference_mode):
    model = SeesGradMode()
    trainer = Trainer(max_epochs=1, num_sanity_val_steps=0, inference_mode=inference_mode, **quiet())
    trainer.fit(model, loader(16), loader(16))  # inside fit: no_grad, never inference tensors
    trainer.validate(model, loader(16), verbose=False)
    trainer.test(model, loader(16), verbose=False)
    trainer.predict(model, loader(16))
    assert model.seen == [("fit", False, False)] * 2 + [("validate", False, inference_mode)] * 2 + [
        ("test", False, inference_mode), ("predict", False, inference_mode)]


def test_limit_train_batches_0_trains_nothing_and_limit_val_batches_0_0_validates_nothing():
    model = RecordsLoads()
    trainer = Trainer(max_epochs=2, limit_train_batches=0, **quiet())
    trainer.fit(model)
    assert (trainer.global_step, model.calls) == (0, [("val", 0, True)])  # the sanity check ran; no training loader asked for
    model = RecordsLoads()
    trainer = Trainer(max_epochs=1, limit_val_batches=0.0, val_check_interval=10, **quiet())  # as Lightning's: no validation,
    trainer.fit(model)  # so an interval longer than the epoch is not an error
    assert trainer.global_step == 1 and model.calls == [("train", 0, False)]


def test_pl_trainer_environment_variables_are_defaults_and_an_argument_passed_wins(monkeypatch):
    monkeypatch.setenv("PL_TRAINER_LOGGER", "False")  # Lightning's literals: False, 7, a string as it is
    monkeypatch.setenv("PL_TRAINER_MAX_STEPS", "7")
    monkeypatch.setenv("PL_TRAINER_ACCELERATOR", "cpu")
    monkeypatch.setenv("PL_TRAINER_PRECISION", "bf16-mixed")
    monkeypatch.setenv("PL_TRAINER_NUM_SANITY_VAL_STEPS", "")  # empty: not set
    trainer = Trainer()
    assert trainer.logger is None and trainer.max_steps == 7 and trainer.precision == "bf16-mixed"
    assert trainer.num_sanity_val_steps == 2
    trainer = Trainer(max_steps=42, logger=True, log_dir=None)
    assert trainer.max_steps == 42 and trainer.precision == "bf16-mixed"
    monkeypatch.setenv("PL_TRAINER_MAX_EPOCHS", "0")  # checked as if passed
    with pytest.raises(ValueError, match=r"max_epochs=0"):
        Trainer()


def test_16_mixed_on_the_cpu_runs_bf16_mixed_with_lightnings_warning():
    class SeesItsDtype(Classifier):
        def training_step(self, batch, batch_idx):
            self.dtypes = getattr(self, "dtypes", []) + [self(batch[0]).dtype]
            return super().training_step(batch, batch_idx)

    with pytest.warns(UserWarning, match=r"^You passed `Trainer\(accelerator='cpu', precision='16-mixed'\)` but AMP with "
                      r"fp16 is not supported on CPU\. Using `precision='bf16-mixed'` instead\."):
        trainer = Trainer(accelerator="cpu", precision="16-mixed", max_steps=2, enable_progress_bar=False, log_dir=None,
                          enable_checkpointing=False)
    assert trainer.precision == "bf16-mixed"
    model = SeesItsDtype()
    trainer.fit(model, loader(32))
    assert model.dtypes == [torch.bfloat16] * 2 and trainer.global_step == 2
    if not torch.cuda.is_available():  # accelerator="auto" on a machine without CUDA is the CPU too
        with pytest.warns(UserWarning, match=r"AMP with fp16 is not supported on CPU"):
            assert Trainer(precision="16-mixed", log_dir=None).precision == "bf16-mixed"
