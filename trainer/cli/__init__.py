"""The command line with YAML configs: ``TrainerCLI`` (also ``LightningCLI``) does Lightning's ``LightningCLI``'s job.

It is built on jsonargparse, an optional extra: ``pip install "steadytrainer[cli]"`` (or
``pip install ".[cli]"`` in a checkout). ``import trainer`` never imports this package.

    python main.py fit --config exp.yaml --trainer.max_epochs=20
    python main.py fit --model=pkg.mod.Net --optimizer=AdamW --optimizer.lr=0.01
    python main.py fit --print_config > exp.yaml
    python main.py test --ckpt_path=lightning_logs/version_0/checkpoints/last.ckpt

Every subcommand (``fit``, ``validate``, ``test``, ``predict``) takes ``--config`` (repeatable,
merged in order; flags after it override it; a config before the subcommand holds each
subcommand's part), ``--seed_everything``, ``--trainer.*`` (every Trainer argument),
``--model.*``, ``--data.*``, ``--optimizer``/``--lr_scheduler`` and the Trainer method's own
arguments (``--ckpt_path``, ...). A bad key, type or file exits with status 2 before anything
is built. The parts: ``parser.py`` (LightningArgumentParser), ``save_config.py``
(SaveConfigCallback), ``command.py`` (the CLI).
"""

from trainer.cli.command import LightningCLI, TrainerCLI
from trainer.cli.instantiator import instantiate_module
from trainer.cli.parser import (
    ArgsType, LightningArgumentParser, LRSchedulerCallable, LRSchedulerTypeTuple, OptimizerCallable, ReduceLROnPlateau,
    instantiate_class,
)
from trainer.cli.save_config import SaveConfigCallback

__all__ = [
    "ArgsType", "LRSchedulerCallable", "LRSchedulerTypeTuple", "LightningArgumentParser", "LightningCLI",
    "OptimizerCallable", "ReduceLROnPlateau", "SaveConfigCallback", "TrainerCLI", "instantiate_class",
    "instantiate_module",
]
