"""trainer.cli.TrainerCLI in-process, with args= (the subprocess runs are in tests/examples/test_config_cli.py)."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from typing import Callable

import pytest
import torch
import yaml

from tests._models import Classifier
from trainer import Trainer, TrainModule
from trainer.cli import LightningCLI, TrainerCLI

@pytest.fixture(autouse=True)
def _no_command_line(monkeypatch):
    """args= stands for the command line, as when a script runs: pytest's own arguments are not it."""
    monkeypatch.setattr(sys, "argv", ["main.py"])


QUIET = {"enable_progress_bar": False, "enable_model_summary": False, "limit_train_batches": 2, "limit_val_batches": 1}


def _exit_code(capsys, **kwargs) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info:
        TrainerCLI(Classifier, **kwargs)
    return info.value.code, capsys.readouterr().err


def test_lightning_cli_is_the_same_class():
    assert LightningCLI is TrainerCLI


@pytest.mark.parametrize("args, key", [
    (["fit", "--trainer.max_epochz=1"], "--trainer.max_epochz"),
    (["fit", "--trainer.max_epochs=many"], "trainer.max_epochs"),
    (["fit", "--model.hidden=1.5"], "model.hidden"),
    (["fit", "--config=missing.yaml"], "missing.yaml"),
    (["fit", "--trainer.precision=8-mixed"], "precision"),  # the Trainer's own check, still exit 2
])
def test_bad_input_exits_2_naming_the_key_and_writes_nothing(capsys, args, key):
    code, err = _exit_code(capsys, args=args)
    assert code == 2 and key in err
    assert os.listdir(".") == [] or os.listdir(".") == ["missing.yaml"]


def test_a_yaml_that_does_not_parse_exits_2(capsys):
    with open("bad.yaml", "w") as f:
        f.write("trainer: [max_epochs: 1\n")
    code, err = _exit_code(capsys, args=["fit", "--config=bad.yaml"])
    assert code == 2 and "Problems parsing config" in err
    assert os.listdir(".") == ["bad.yaml"]


def test_subclass_mode_needs_a_model(capsys):
    with pytest.raises(SystemExit) as info:
        TrainerCLI(args=["fit"])
    assert info.value.code == 2 and "model" in capsys.readouterr().err


def test_run_false_builds_the_objects_from_a_dict_and_a_later_fit_uses_them():
    cli = TrainerCLI(Classifier, args={"trainer": {"max_epochs": 1, "log_dir": None, **QUIET}, "model": {"hidden": 4}, "seed_everything": 3}, run=False)
    assert isinstance(cli.model, Classifier) and cli.model.hparams["hidden"] == 4
    assert cli.trainer.max_epochs == 1 and cli.datamodule is None and cli.subcommand is None
    expected = torch.manual_seed(3) and Classifier(hidden=4)
    assert all(torch.equal(a, b) for a, b in zip(cli.model.parameters(), expected.parameters()))  # seeded before the model


def test_configs_merge_in_order_and_flags_override_them(tmp_path):
    (tmp_path / "a.yaml").write_text("trainer:\n  max_epochs: 5\n  log_dir: null\nmodel:\n  hidden: 3\n")
    (tmp_path / "b.yaml").write_text("model:\n  hidden: 6\n  lr: 0.5\n")
    cli = TrainerCLI(Classifier, args=["--config=a.yaml", "--config=b.yaml", "--model.lr=0.25"], run=False)
    assert (cli.trainer.max_epochs, cli.model.hparams["hidden"], cli.model.lr) == (5, 6, 0.25)


class WithLoaders(Classifier):
    def train_dataloader(self):
        from tests._models import loader
        return loader(32, 8)

    def val_dataloader(self):
        from tests._models import loader
        return loader(16, 8)


def test_fit_saves_the_config_and_refuses_to_overwrite_another_runs(tmp_path):
    args = ["fit", "--trainer.max_epochs=1", "--trainer.log_dir=null", "--trainer.enable_progress_bar=false", "--model.hidden=5"]
    TrainerCLI(WithLoaders, args=args)
    saved = yaml.safe_load(open("config.yaml"))
    assert saved["model"]["hidden"] == 5 and saved["trainer"]["max_epochs"] == 1 and isinstance(saved["seed_everything"], int)
    with pytest.raises(RuntimeError, match=r"config.yaml to NOT exist\. Aborting to avoid overwriting results of a previous run"):
        TrainerCLI(WithLoaders, args=args)
    TrainerCLI(WithLoaders, args=args[:-1] + ["--model.hidden=7"], save_config_kwargs={"overwrite": True})
    assert yaml.safe_load(open("config.yaml"))["model"]["hidden"] == 7


def test_optimizer_and_scheduler_from_the_command_line_are_in_the_checkpoint():
    class NoOptim(WithLoaders):
        configure_optimizers = None  # replaced below by the class's base

    NoOptim.configure_optimizers = Classifier.__mro__[1].configure_optimizers  # TrainModule's: returns None
    cli = TrainerCLI(NoOptim, args=[
        "fit", "--trainer.max_epochs=2", "--trainer.enable_progress_bar=false", "--optimizer=AdamW", "--optimizer.lr=0.01",
        "--lr_scheduler=StepLR", "--lr_scheduler.step_size=1", "--lr_scheduler.gamma=0.5",
    ])
    assert isinstance(cli.trainer.optimizer, torch.optim.AdamW)
    assert cli.trainer.optimizer.param_groups[0]["lr"] == pytest.approx(0.0025)  # two epochs of gamma 0.5
    ckpt = torch.load(cli.trainer.checkpoint_callback.best_model_path, weights_only=False)
    (scheduler,) = ckpt["lr_schedulers"]
    assert scheduler["step_size"] == 1 and scheduler["gamma"] == 0.5 and scheduler["last_epoch"] == 2
    assert ckpt["optimizer_states"][0]["param_groups"][0]["lr"] == pytest.approx(0.0025)


def test_env_variables_when_asked(monkeypatch):
    monkeypatch.setenv("PL_TRAINER__MAX_EPOCHS", "9")  # Lightning's prefix
    cli = TrainerCLI(Classifier, args=["--trainer.log_dir=null"], run=False, parser_kwargs={"default_env": True})
    assert cli.trainer.max_epochs == 9


def test_link_arguments_and_hooks():
    calls = []

    class CLI(TrainerCLI):
        def add_arguments_to_parser(self, parser):
            parser.add_argument("--width", type=int, default=3)
            parser.link_arguments("width", "model.hidden")

        def before_fit(self):
            calls.append(("before", self.trainer.global_step))

        def after_fit(self):
            calls.append(("after", self.trainer.global_step))

    cli = CLI(WithLoaders, args=["fit", "--width=11", "--trainer.max_epochs=1", "--trainer.log_dir=null", "--trainer.enable_progress_bar=false"])
    assert cli.model.hparams["hidden"] == 11 and calls == [("before", 0), ("after", 4)]


@pytest.mark.slow
def test_without_jsonargparse_building_the_cli_is_one_sentence_and_import_trainer_does_not_need_it(script_env):
    code = (
        "import sys; sys.modules['jsonargparse'] = None\n"
        "import trainer, trainer.trainer\n"
        "assert 'trainer.cli' not in sys.modules\n"
        "from trainer.cli import TrainerCLI\n"
        "try:\n    TrainerCLI()\nexcept ModuleNotFoundError as e:\n    print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=script_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "jsonargparse, which is not installed: pip install" in done.stdout and ".[cli]" in done.stdout


def test_a_yaml_config_sets_the_logger_to_a_tensorboard_logger(tmp_path):
    from jsonargparse import lazy_instance

    from loggers import TensorBoardLogger

    assert isinstance(lazy_instance(TensorBoardLogger, save_dir=str(tmp_path)), TensorBoardLogger)  # as Lightning's docs build defaults
    config = {
        "trainer": {"max_epochs": 1, **QUIET, "enable_checkpointing": False,
                    "logger": {"class_path": "loggers.TensorBoardLogger", "init_args": {"save_dir": str(tmp_path / "tb"), "name": "exp"}}},
        "model": {"hidden": 4},
    }
    cli = TrainerCLI(Classifier, args=config, run=False)
    assert isinstance(cli.trainer.logger, TensorBoardLogger) and cli.trainer.logger.name == "exp"
    cli.trainer.fit(cli.model, torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 8), torch.randint(0, 2, (8,))), batch_size=4))
    assert os.listdir(tmp_path / "tb" / "exp" / "version_0")


def test_run_false_saves_the_config_when_fit_runs_and_a_single_default_callback_joins(tmp_path):
    from callbacks import Callback, EarlyStopping
    from trainer.cli import SaveConfigCallback

    class Sampler(Callback):  # one callback, not a list, as Lightning's examples pass it
        pass

    cli = TrainerCLI(WithLoaders, args={"trainer": {"max_epochs": 1, "logger": False, **QUIET}}, run=False,
                     trainer_defaults={"callbacks": Sampler()})
    assert any(isinstance(cb, Sampler) for cb in cli.trainer.callbacks)
    saver = next(cb for cb in cli.trainer.callbacks if isinstance(cb, SaveConfigCallback))
    assert not saver.already_saved and not os.path.exists("config.yaml")
    cli.trainer.fit(cli.model)
    assert saver.already_saved and yaml.safe_load(open("config.yaml"))["trainer"]["max_epochs"] == 1
    with_class_path = TrainerCLI(WithLoaders, args={"trainer": {"logger": False}}, run=False, trainer_defaults={
        "callbacks": {"class_path": "callbacks.EarlyStopping", "init_args": {"monitor": "val_loss"}}})
    assert any(isinstance(cb, EarlyStopping) and cb.monitor == "val_loss" for cb in with_class_path.trainer.callbacks)


@pytest.mark.parametrize("spec, words", [
    ('{"mode": "fastest"}', "unknown mode 'fastest'"),
    ('{"backend": "nope"}', "unknown backend 'nope'"),
    ('{"options": 3}', "'options' must be dict or None, got 3"),
    ('{"dynamic": "maybe"}', "'dynamic' must be bool or None"),
    ('{"options": {"bogus": 1}}', "unknown options ['bogus']"),
    ('{"mode": "default", "options": {"debug": true}}', "'mode' or 'options', not both"),
])
def test_a_bad_compile_spec_exits_2_before_anything_runs(capsys, spec, words):
    code, err = _exit_code(capsys, args=["fit", f"--trainer.compile={spec}", "--trainer.max_epochs=1"])
    assert code == 2 and "compile=" in err and words in err
    assert os.listdir(".") == []


class TakesAnything(WithLoaders):
    def __init__(self, activation: Callable = torch.relu):
        super().__init__()


@pytest.mark.parametrize("key, value", [
    ("activation", "subprocess.getoutput"),
    ("activation", "os.system"),
    ("activation", "pickle.loads"),
])
def test_a_class_path_on_jsonargparses_import_block_list_is_refused(capsys, key, value):
    with open("bad.yaml", "w") as f:
        yaml.safe_dump({"model": {key: value}, "trainer": {"max_epochs": 1}}, f)
    with pytest.raises(SystemExit) as info:
        TrainerCLI(TakesAnything, args=["fit", "--config=bad.yaml"])
    assert info.value.code == 2 and f"Importing '{value}' is not allowed" in capsys.readouterr().err
# --- --ckpt_path: read at parse time (its hyperparameters), through the Trainer's reader ---------------
def _bad_checkpoints(tmp_path) -> dict[str, tuple[str, str]]:
    """name -> (path, what our reader says about it); the sentences trainer.fit(ckpt_path=...) gives too."""
    import fractions

    from trainer import Trainer

    good = tmp_path / "good.ckpt"
    trainer = Trainer(max_steps=1, enable_progress_bar=False, log_dir=None, enable_checkpointing=False)
    trainer.fit(Classifier(hidden=12), torch.utils.data.DataLoader(torch.utils.data.TensorDataset(
        torch.randn(8, 8), torch.randint(0, 2, (8,))), batch_size=8))
    trainer.save_checkpoint(good)
    data = good.read_bytes()
    (tmp_path / "truncated.ckpt").write_bytes(data[: len(data) // 2])
    (tmp_path / "notes.ckpt").write_text("not a checkpoint\n")
    torch.save({"state_dict": {}, "hyper_parameters": {"ratio": fractions.Fraction(1, 3)}}, tmp_path / "code.ckpt")
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xFF  # inside a weight: same size, same zip structure
    (tmp_path / "flipped.ckpt").write_bytes(bytes(flipped))
    return {
        "truncated": (str(tmp_path / "truncated.ckpt"), "is not a checkpoint: torch.save writes a zip archive"),
        "text": (str(tmp_path / "notes.ckpt"), "is not a checkpoint: torch.save writes a zip archive"),
        "pickled code": (str(tmp_path / "code.ckpt"), "Refusing to load"),
        "flipped bit": (str(tmp_path / "flipped.ckpt"), "is damaged"),
    }


def test_a_bad_ckpt_path_exits_2_with_the_readers_sentence_naming_the_file(tmp_path, capsys):
    for name, (path, sentence) in _bad_checkpoints(tmp_path).items():
        code, err = _exit_code(capsys, args=["test", f"--ckpt_path={path}", "--trainer.log_dir=null"])
        assert code == 2 and "--ckpt_path: " in err and repr(path) in err and sentence in err, (name, err)
        assert "weights_only=False" not in err or name == "pickled code"  # not torch's advice to unpickle it
        assert "Errno 22" not in err


def test_a_good_ckpt_path_gives_the_model_its_hyperparameters(tmp_path):
    _bad_checkpoints(tmp_path)
    built = []

    class Stop(Exception):
        pass

    class CLI(TrainerCLI):
        def before_test(self):  # parsed and built: what test would run with
            built.append(self.model)
            raise Stop

    with pytest.raises(Stop):
        CLI(Classifier, args=["test", f"--ckpt_path={tmp_path / 'good.ckpt'}", "--trainer.log_dir=null"])
    assert built[0].hparams.hidden == 12 and built[0].net[0].out_features == 12


class Injected(WithLoaders):
    """A module given objects by the command line: an activation module and an optimizer factory."""

    def __init__(self, activation: torch.nn.Module | None = None, optimizer: Callable[..., torch.optim.Optimizer] = torch.optim.SGD,
                 hidden: int = 16) -> None:
        super().__init__(hidden=hidden)
        self.save_hyperparameters()
        self.activation, self.make_optimizer = activation or torch.nn.ReLU(), optimizer

    def configure_optimizers(self):
        return self.make_optimizer(self.parameters(), lr=0.1)


@pytest.mark.parametrize("subclass_mode", [False, True])
def test_a_module_the_cli_built_loads_from_its_checkpoint_with_the_objects_it_was_given(subclass_mode):
    model_args = ["--model=tests.trainer.test_cli.Injected"] if subclass_mode else []
    cli = TrainerCLI(Injected, subclass_mode_model=subclass_mode, auto_configure_optimizers=False, args=[
        "fit", *model_args, "--model.activation=torch.nn.LeakyReLU", "--model.activation.negative_slope=0.2",
        "--model.optimizer=torch.optim.Adam", "--model.hidden=5", "--trainer.max_epochs=1", "--trainer.enable_progress_bar=false",
    ])
    path = cli.trainer.checkpoint_callback.best_model_path
    saved = torch.load(path, weights_only=True)["hyper_parameters"]  # plain data: the config, with class paths
    assert saved["_instantiator"] == "trainer.cli.instantiate_module" and saved["hidden"] == 5
    assert saved["activation"] == {"class_path": "torch.nn.LeakyReLU", "init_args": {"negative_slope": 0.2, "inplace": False}}
    assert ("_class_path" in saved) is subclass_mode
    loaded = (TrainModule if subclass_mode else Injected).load_from_checkpoint(path)
    assert type(loaded) is Injected and loaded.net[0].out_features == 5
    assert isinstance(loaded.activation, torch.nn.LeakyReLU) and loaded.activation.negative_slope == 0.2
    assert isinstance(loaded.configure_optimizers(), torch.optim.Adam)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), cli.model.state_dict().values()))


def test_a_checkpoint_naming_another_instantiator_is_refused(tmp_path):
    model = Classifier()
    path = tmp_path / "evil.ckpt"
    torch.save({"state_dict": model.state_dict(), "hyper_parameters": {"_instantiator": "os.system"}}, path)
    with pytest.raises(ValueError, match=r"The instantiator 'os.system' from the checkpoint is not in the allowlist"):
        Classifier.load_from_checkpoint(path)


def test_load_from_checkpoint_support_false_records_the_arguments_init_received():
    cli = TrainerCLI(Classifier, args=["--model.hidden=3", "--trainer.log_dir=null"], run=False, load_from_checkpoint_support=False)
    assert dict(cli.model.hparams) == {"features": 8, "hidden": 3, "classes": 2, "dropout": 0.0, "lr": 0.1, "optimizer": "sgd"}


def test_the_tensorboard_loggers_summary_writer_arguments_are_options(tmp_path):
    cli = TrainerCLI(Classifier, run=False, args=[
        "--trainer.logger=TensorBoardLogger", f"--trainer.logger.save_dir={tmp_path}", "--trainer.logger.max_queue=3",
        "--trainer.logger.filename_suffix=.cli",
    ])
    writer = cli.trainer.logger.experiment  # SummaryWriter's own arguments, as with Lightning's CLI
    assert writer.max_queue == 3 and writer.filename_suffix == ".cli"
    cli.trainer.logger.finalize("success")
    assert any(name.endswith(".cli") for name in os.listdir(cli.trainer.logger.log_dir))


def test_help_lists_every_trainer_argument_its_signature_shows(capsys):
    # The signature is the arguments the Trainer takes, as Lightning's: no **unknown (which only answers typos)
    names = list(inspect.signature(Trainer.__init__).parameters)[1:]
    assert "max_epochs" in names and "compile" in names and "unknown" not in names
    with pytest.raises(SystemExit):
        TrainerCLI(Classifier, args=["fit", "--help"])
    out = capsys.readouterr().out
    assert [name for name in names if f"--trainer.{name}" not in out] == []
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_epoch'. Did you mean 'max_epochs'"):
        Trainer(max_epoch=1)  # still answered with a sentence


def test_a_comet_logger_from_the_command_line_takes_its_arguments_and_comets_config_keywords(capsys):
    args = ["--trainer.logger=CometLogger", "--trainer.logger.experiment_key=some_key", "--trainer.logger.workspace=ws",
            "--trainer.logger.name=run1", "--trainer.logger.dict_kwargs.save_dir=comet", "--print_config"]
    with pytest.raises(SystemExit):
        TrainerCLI(Classifier, run=False, args=args)
    logger = yaml.safe_load(capsys.readouterr().out)["trainer"]["logger"]
    assert logger["class_path"] == "loggers.CometLogger"
    assert {k: logger["init_args"][k] for k in ("experiment_key", "workspace", "name")} == {
        "experiment_key": "some_key", "workspace": "ws", "name": "run1"}  # name: comet_ml.ExperimentConfig's
    assert logger["dict_kwargs"] == {"save_dir": "comet"}
