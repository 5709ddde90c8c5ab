"""A user's script for the folder-lock tests: fit with the default run folder, optionally
``ckpt_path="last"`` and ``logger=False``, as a relaunched job would. ``--slow`` sleeps at each
batch end, and writes ``training-<pid>`` once training has started, so that the test can start a
second run (or kill this one) while this one is writing checkpoints."""

from __future__ import annotations

import argparse
import os
import time

from callbacks import Callback, ModelCheckpoint
from tests._models import Classifier, loader
from trainer import Trainer


class Slow(Callback):
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_start(self, trainer, module):
        open(f"training-{os.getpid()}", "w").close()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        time.sleep(self.seconds)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--last", action="store_true")
    parser.add_argument("--no-logger", action="store_true")
    parser.add_argument("--max-epochs", type=int, default=2)
    parser.add_argument("--slow", type=float, default=0.0)
    args = parser.parse_args()
    trainer = Trainer(
        max_epochs=args.max_epochs, logger=not args.no_logger, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[Slow(args.slow), ModelCheckpoint(every_n_train_steps=1, save_last=True)],
    )
    trainer.fit(Classifier(), loader(32, batch_size=8), ckpt_path="last" if args.last else None)
    print("finished at step", trainer.global_step, "in", trainer.checkpoint_callback.dirpath)
