"""examples/config_cli.py driven by examples/config_cli.yaml, as a user runs it: real subprocesses."""

from __future__ import annotations

import glob
import os
import subprocess
import sys

import pytest
import torch
import yaml

from tests.examples._run import EXAMPLES

pytestmark = pytest.mark.slow

SCRIPT, CONFIG = os.path.join(EXAMPLES, "config_cli.py"), os.path.join(EXAMPLES, "config_cli.yaml")


def cli(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_fit_from_the_yaml_saves_the_config_and_test_reads_it_back(script_env, tmp_path):
    done = cli("fit", "--config", CONFIG, "--trainer.max_epochs=2", "--model.hidden=16", env=script_env)
    assert done.returncode == 0, done.stderr
    assert "val_acc=" in done.stdout  # the example's after_fit hook
    saved = yaml.safe_load(open(tmp_path / "lightning_logs/version_0/config.yaml"))
    assert (saved["seed_everything"], saved["trainer"]["max_epochs"], saved["model"]["hidden"]) == (42, 2, 16)
    assert "classes" not in saved["model"] and saved["data"]["classes"] == 3  # linked: set from the data
    assert saved["trainer"]["callbacks"][0]["class_path"] == "callbacks.EarlyStopping"
    (last,) = glob.glob(str(tmp_path / "lightning_logs/version_0/checkpoints/*.ckpt"))  # the newest epoch's
    hparams = torch.load(last, weights_only=True)["hyper_parameters"]  # the config, and how to rebuild from it
    assert hparams == {"features": 8, "hidden": 16, "classes": 3, "lr": 0.01, "_instantiator": "trainer.cli.instantiate_module"}
    again = cli("test", "--config", str(tmp_path / "lightning_logs/version_0/config.yaml"), f"--ckpt_path={last}", env=script_env)
    assert again.returncode == 0, again.stderr


def test_help_lists_the_subcommands_and_every_argument_with_its_description(script_env):
    top = cli("--help", env=script_env)
    assert top.returncode == 0 and all(name in top.stdout for name in ("fit", "validate", "test", "predict"))
    fit = cli("fit", "--help", env={**script_env, "COLUMNS": "200"})
    assert fit.returncode == 0
    for text in ("--trainer.max_epochs", "--trainer.strategy", "--trainer.callbacks", "--model.hidden", "Units in the hidden layer",
                 "--data.batch_size", "--optimizer", "--lr_scheduler", "--ckpt_path", "--print_config"):
        assert text in fit.stdout, text


def test_bad_input_exits_2_and_writes_nothing(script_env, tmp_path):
    done = cli("fit", "--config", CONFIG, "--trainer.max_epochs=abc", env=script_env)
    assert done.returncode == 2 and 'Parser key "trainer.max_epochs"' in done.stderr
    assert not os.path.exists(tmp_path / "lightning_logs")


def test_fit_with_ddp_from_the_command_line_trains_with_two_processes(script_env, tmp_path):
    done = cli("fit", "--config", CONFIG, "--trainer.strategy=ddp", "--trainer.devices=2", "--trainer.max_epochs=1", env=script_env, timeout=300)
    assert done.returncode == 0, done.stderr
    (last,) = glob.glob(str(tmp_path / "lightning_logs/version_0/checkpoints/*.ckpt"))
    assert torch.load(last, weights_only=False)["steadytrainer"]["loop"]["world_size"] == 2


LIGHTNING_MAIN = '''\
from trainer.cli import LightningCLI  # was: from lightning.pytorch.cli import LightningCLI

if __name__ == "__main__":
    LightningCLI(save_config_kwargs={"overwrite": True})
'''


def test_lightnings_one_file_main_with_the_import_renamed_runs_in_subclass_mode(script_env, tmp_path):
    (tmp_path / "main.py").write_text(LIGHTNING_MAIN)
    (tmp_path / "exp1.yaml").write_text(
        "model:\n  class_path: config_cli.MLP\n  init_args:\n    hidden: 12\n"
        "data:\n  class_path: config_cli.Blobs\n  init_args:\n    samples: 256\n"
        "trainer:\n  enable_progress_bar: false\n"
    )
    env = {**script_env, "PYTHONPATH": EXAMPLES + os.pathsep + script_env["PYTHONPATH"]}
    done = subprocess.run([sys.executable, "main.py", "fit", "--config", "exp1.yaml", "--trainer.max_epochs", "2"],
                          env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    saved = yaml.safe_load(open(tmp_path / "lightning_logs/version_0/config.yaml"))
    assert saved["model"]["class_path"] == "config_cli.MLP" and saved["model"]["init_args"]["hidden"] == 12
    (last,) = glob.glob(str(tmp_path / "lightning_logs/version_0/checkpoints/*.ckpt"))
    ckpt = torch.load(last, weights_only=False)
    assert ckpt["hyper_parameters"]["hidden"] == 12 and ckpt["epoch"] == 1  # saved at epoch 1's end
