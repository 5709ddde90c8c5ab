"""A LightningCLI config's class paths, rewritten in the text: everything else stays byte for byte."""

from __future__ import annotations

import yaml

from trainer.migrate.yaml_files import migrate_yaml

CONFIG = """\
# trainer settings
trainer:
  logger:
    class_path: lightning.pytorch.loggers.TensorBoardLogger  # the default
    init_args: {save_dir: "logs/lightning.pytorch"}
  callbacks:
    - class_path: 'pytorch_lightning.callbacks.early_stopping.EarlyStopping'
      init_args:
        monitor: val_loss
    - {class_path: "lightning.pytorch.callbacks.ModelCheckpoint", init_args: {save_top_k: 2}}
    - lightning.pytorch.callbacks.LearningRateMonitor
  plugins: [lightning.pytorch.callbacks.Timer, other.Thing]
model:
  class_path: mypkg.Model
  init_args:
    note: lightning.pytorch.Trainer is mentioned here
    lightning.pytorch.Trainer: a key stays
"""


def test_class_paths_are_rewritten_in_place():
    new, problems = migrate_yaml(CONFIG, "config.yaml")
    assert problems == []
    assert new == (
        CONFIG.replace("lightning.pytorch.loggers.TensorBoardLogger", "loggers.TensorBoardLogger")
        .replace("pytorch_lightning.callbacks.early_stopping.EarlyStopping", "callbacks.EarlyStopping")
        .replace('"lightning.pytorch.callbacks.ModelCheckpoint"', '"callbacks.ModelCheckpoint"')
        .replace("- lightning.pytorch.callbacks.LearningRateMonitor", "- callbacks.LearningRateMonitor")
        .replace("[lightning.pytorch.callbacks.Timer", "[callbacks.Timer")
    )
    loaded = yaml.safe_load(new)
    assert loaded["trainer"]["callbacks"][0]["class_path"] == "callbacks.EarlyStopping"
    assert loaded["model"]["init_args"] == yaml.safe_load(CONFIG)["model"]["init_args"]  # text and keys left alone
    assert migrate_yaml(new, "config.yaml") == (new, [])


def test_a_class_path_with_no_counterpart_is_reported_and_the_file_left():
    source = CONFIG + "fabric:\n  class_path: lightning.fabric.Fabric\n"
    new, problems = migrate_yaml(source, "config.yaml")
    assert new == source
    assert [str(p) for p in problems] == ["no counterpart for lightning.fabric.Fabric at config.yaml:19"]


def test_a_config_without_lightning_comes_back_byte_for_byte():
    source = "trainer:\r\n  max_epochs: 3   # lightning fast\r\nmodel: {class_path: mypkg.Model}\r\n"
    assert migrate_yaml(source, "c.yml") == (source, [])


def test_a_file_that_is_not_yaml_is_reported():
    source = "trainer:\n  callbacks: [lightning.pytorch.callbacks.Timer\n  bad: {\n"
    new, problems = migrate_yaml(source, "c.yaml")
    assert new == source and len(problems) == 1 and str(problems[0]).startswith("cannot read the file as YAML")


def test_windows_line_endings_are_kept():
    source = "trainer:\r\n  callbacks:\r\n    - class_path: lightning.pytorch.callbacks.Timer\r\n      init_args: {}\r\n"
    assert migrate_yaml(source, "c.yaml") == (source.replace("lightning.pytorch.callbacks.Timer", "callbacks.Timer"), [])
