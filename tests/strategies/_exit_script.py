"""A small ddp run (2 processes, 2 steps) for test_spawn_exit.py: it must end with nothing on
stderr from multiprocessing's resource tracker.

``--compile``: ``Trainer(compile=True)`` (inductor, whose compile workers' progress bar makes a
tqdm lock in each rank). ``--lock``: a callback makes a multiprocessing lock in each rank, as a
tqdm bar does (the Trainer's own, in a terminal, or a user's).
"""

from __future__ import annotations

import multiprocessing
import sys

from callbacks import Callback
from tests._models import Classifier, loader, quiet
from trainer import Trainer

_LOCKS: list[object] = []  # module-level: a lock cannot be pickled back with the callback


class MakesALock(Callback):
    def on_train_start(self, trainer, module):
        _LOCKS.append(multiprocessing.RLock())  # tqdm.tqdm.get_lock() makes this one


if __name__ == "__main__":
    callbacks = [MakesALock()] if "--lock" in sys.argv else []
    trainer = Trainer(strategy="ddp", devices=2, max_steps=2, compile="--compile" in sys.argv, **quiet(callbacks=callbacks))
    trainer.fit(Classifier(), loader(n=64, batch_size=8))
    print(f"done step={trainer.global_step}", flush=True)
