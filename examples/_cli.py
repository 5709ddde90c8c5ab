"""The examples' shared command line: the Trainer's options, each with a sentence and its default.

An example imports it as a sibling module (``from _cli import ...``): running
``python examples/<name>.py`` puts this folder first on ``sys.path``, and DDP's spawned
workers and torchrun's processes inherit or repeat that.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from callbacks import ModelCheckpoint


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Appends each option's default to its help, and prints the epilog's commands as written."""


def devices(text: str) -> str | int | list[int]:
    """--devices: 'auto', a count ('2'), or device indices ('0,1')."""
    try:
        if text == "auto":
            return text
        if "," in text:
            return [int(i) for i in text.split(",") if i]
        return int(text)
    except ValueError:
        # argparse prefixes "argument --devices: "
        raise argparse.ArgumentTypeError(f"{text!r} is not a device choice. Use 'auto', a count such as 2, or indices such as 0,1.") from None


def trainer_parser(
    doc: str,
    *,
    examples: Sequence[str],
    strategy: str,
    strategy_help: str,
    devices_default: str | int,
    devices_help: str,
    max_epochs: int,
    batch_size: int,
    batch_size_help: str,
) -> argparse.ArgumentParser:
    """A parser with the options every example passes to the Trainer, and ``--batch-size``.

    ``doc`` is the example's docstring: its first paragraph is the description. ``examples``
    are command lines, printed one per line at the end of ``--help``. The example adds its
    own options, each with a help sentence (the default is appended to it).
    """
    p = argparse.ArgumentParser(
        description=doc.split("\n\n")[0],
        epilog="examples:\n" + "\n".join(f"  {line}" for line in examples),
        formatter_class=_HelpFormatter,
    )
    p.add_argument("--strategy", default=strategy, help=strategy_help)
    p.add_argument("--devices", type=devices, default=devices_default, help=devices_help)
    p.add_argument("--precision", default="32", help="32 (full precision), bf16-mixed, or 16-mixed (CUDA only)")
    p.add_argument(
        "--max-epochs", type=int, default=max_epochs,
        help="passes over the training data; with --max-steps, whichever comes first ends the run",
    )
    p.add_argument(
        "--max-steps", type=int, default=None,
        help="optimizer steps to run at most (default: %(default)s, no step limit); with --max-epochs, whichever comes first ends the run",
    )
    p.add_argument("--log-dir", default=".", help="TensorBoard logs and checkpoints go to LOG_DIR/lightning_logs/version_<n>")
    p.add_argument("--seed", type=int, default=0, help="seeds the initial weights, the data order and dropout: the same seed repeats the run")
    p.add_argument("--batch-size", type=int, default=batch_size, help=batch_size_help)
    return p


def trainer_options(args: argparse.Namespace, **overrides: Any) -> dict[str, Any]:
    """The Trainer's keyword arguments from the shared options; ``overrides`` replace or add some."""
    options = {
        "strategy": args.strategy, "devices": args.devices, "precision": args.precision, "max_epochs": args.max_epochs,
        "max_steps": args.max_steps, "log_dir": args.log_dir, "seed": args.seed,
        # last.ckpt: the state the run ended with, whether at an epoch's end or at max_steps
        "callbacks": [ModelCheckpoint(save_last=True)],
    }
    return {**options, **overrides}
