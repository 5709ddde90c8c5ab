"""A fit whose logs go to a small tmpfs of their own (mounted in a private mount namespace by the
test, under ``unshare``) and whose checkpoints go to the real disk. Writes what happened to
``<out>/outcome.json``: the error, the files left in the log folder, the checkpoints written.

    python _full_disk_script.py <log_dir (the tmpfs)> <ckpt_dir> <out_dir> <bytes to leave free> <logger>
"""

from __future__ import annotations

import json
import os
import sys
import traceback

if __name__ == "__main__":
    logs, ckpts, out, room, kind = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    os.makedirs(os.path.join(logs, "filler"), exist_ok=True)
    stat = os.statvfs(logs)
    free = stat.f_bavail * stat.f_frsize
    with open(os.path.join(logs, "filler", "blob"), "wb") as f:  # the disk is full but for `room` bytes
        f.write(b"\0" * max(0, free - room))

    from callbacks import Callback, ModelCheckpoint
    from loggers import CSVLogger, TensorBoardLogger
    from tests._models import Classifier, loader
    from trainer import Trainer

    logger = CSVLogger(logs, name="run", flush_logs_every_n_steps=1) if kind == "csv" else TensorBoardLogger(logs, name="run")
    class Validated(Callback):  # the last epoch whose validation ended: its checkpoint is due
        epoch = -1

        def on_validation_end(self, trainer, pl_module):
            if not trainer.sanity_checking:
                Validated.epoch = trainer.current_epoch

    checkpoint = ModelCheckpoint(dirpath=ckpts, every_n_epochs=1, save_top_k=-1)
    trainer = Trainer(max_epochs=60, logger=logger, callbacks=[Validated(), checkpoint], log_every_n_steps=1,
                      enable_progress_bar=False)
    error = None
    try:
        trainer.fit(Classifier(), loader(64), loader(32))
    except BaseException as err:  # noqa: BLE001 - the outcome is what the test reads
        error = f"{type(err).__name__}: {err}"
        traceback.print_exc()
    left = sorted(os.path.relpath(os.path.join(d, f), logs) for d, _, fs in os.walk(logs) for f in fs)
    with open(os.path.join(out, "outcome.json"), "w") as f:
        json.dump({"error": error, "validated": Validated.epoch, "log_files": left,
                   "checkpoints": sorted(os.listdir(ckpts)) if os.path.isdir(ckpts) else []}, f)
