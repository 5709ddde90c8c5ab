"""ModelCheckpoint: top-k by a monitored metric, plus an always-newest ``last.ckpt``."""

from __future__ import annotations

import math
import os
import re
import shutil
import tempfile
import warnings
from typing import TYPE_CHECKING, Any

from trainer.checkpoint import files as ckpt_io
from trainer.checkpoint.background_save import BackgroundWriter, freeze
from trainer.core.checks import flag, one_of, positive_int

from ._schedule import fit_validates
from .base import Callback

if TYPE_CHECKING:
    from trainer import Trainer, TrainModule

LAST = "last.ckpt"


class ModelCheckpoint(Callback):
    """Save the full training state every ``every_n_epochs`` epochs and/or every
    ``every_n_train_steps`` optimizer steps.

    Keeps the ``save_top_k`` best files by ``monitor`` (the most recent ones without a
    monitor; ``-1`` keeps all, ``0`` none) and, with ``save_last``, ``last.ckpt`` as the
    newest. ``dirpath`` defaults to ``<run dir>/checkpoints``. ``filename`` is a format
    string over ``epoch``, ``step`` and logged metrics, e.g. ``"{epoch}-{val_loss:.3f}"``.
    Files are written atomically, and an old top-k file is deleted only after its
    replacement is fully on disk.

    Training does not wait for the disk: a save copies the state to the CPU, and a thread
    writes it while the next steps run. The next save, the end of fit, and a stop by
    signal wait for that write (and raise its error, e.g. a full disk, on every rank).
    During fit, ``best_model_path`` and ``last_model_path`` may name a file whose write is
    still in flight; when fit returns, they are on disk.
    """

    def __init__(
        self,
        dirpath: str | os.PathLike | None = None,
        filename: str | None = None,
        monitor: str | None = None,
        mode: str = "min",
        save_top_k: int = 1,
        save_last: bool = True,
        every_n_train_steps: int | None = None,
        every_n_epochs: int | None = 1,
    ) -> None:
        if dirpath is not None and not isinstance(dirpath, (str, os.PathLike)):
            raise TypeError(f"ModelCheckpoint(dirpath={dirpath!r}) must be a path or None.")
        if filename is not None and not isinstance(filename, str):
            raise TypeError(f"ModelCheckpoint(filename={filename!r}) must be a format string such as '{{epoch}}-{{step}}'.")
        if monitor is not None and (not isinstance(monitor, str) or not monitor):
            raise TypeError(f"ModelCheckpoint(monitor={monitor!r}) must be a logged metric's name or None.")
        self.dirpath_given = None if dirpath is None else os.fspath(dirpath)
        self.dirpath: str | None = self.dirpath_given
        self.filename = filename or ("{epoch}-{step}" if monitor is None else "{epoch}-{step}-{" + monitor + ":.4g}")
        self.monitor = monitor
        self.mode = one_of("ModelCheckpoint(mode)", mode, ("min", "max"))
        self.save_top_k = positive_int("ModelCheckpoint(save_top_k)", save_top_k, minimum=-1)
        self.save_last = flag("ModelCheckpoint(save_last)", save_last)
        self.every_n_train_steps = positive_int("ModelCheckpoint(every_n_train_steps)", every_n_train_steps, allow_none=True)
        self.every_n_epochs = positive_int("ModelCheckpoint(every_n_epochs)", every_n_epochs, allow_none=True)
        self._template()  # a bad filename fails now, not at the first save after an epoch of training
        self.best_k_models: dict[str, float] = {}  # path -> score (step number without monitor)
        self.best_model_path = ""
        self.last_model_path = ""
        self._last_step_saved = -1
        self._step_seen = -1  # global_step at the previous batch end: did this batch step the optimizer?
        self._monitor_due = False  # validation (or, without it, an epoch end) has run: the monitor must exist
        self._warned_early = False
        self._writer = BackgroundWriter()  # global rank 0 writes; the others never submit

    @property
    def state_key(self) -> str:
        return f"ModelCheckpoint[monitor={self.monitor}]"

    @property
    def best_model_score(self) -> float | None:
        return self.best_k_models.get(self.best_model_path)

    # --- hooks -------------------------------------------------------------------------
    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        if stage != "fit":
            return
        if self.dirpath_given is None:
            base = trainer.run_dir if trainer.run_dir is not None else os.getcwd()
            self.dirpath = os.path.join(base, "checkpoints")
        if trainer.is_global_zero:
            _check_writable(self.dirpath)
            _remove_unfinished_saves(self.dirpath)
        self._monitor_due = False
        # A new fit starts with nothing saved (a checkpoint being resumed loads its own state
        # after this): an earlier fit's files and steps must not rank or block this one's.
        self.best_k_models, self.best_model_path, self.last_model_path = {}, "", ""
        self._last_step_saved = self._step_seen = -1

    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
        self._step_seen = trainer.global_step

    def wants(self, hook: str) -> bool:
        # Saving only by epochs, nothing happens at batch ends: not called on every batch then.
        return hook != "on_train_batch_end" or self.every_n_train_steps is not None or (
            type(self).on_train_batch_end is not ModelCheckpoint.on_train_batch_end  # a subclass's own
        )

    def on_train_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.every_n_train_steps is None or trainer.global_step == self._step_seen:
            return  # not saving by steps; or an accumulation micro-batch, not a state we could save
        self._step_seen = trainer.global_step
        if trainer.global_step % self.every_n_train_steps == 0 and trainer.global_step != self._last_step_saved:
            self._save(trainer, module)

    def on_validation_end(self, trainer: Trainer, module: TrainModule) -> None:
        self._monitor_due = True

    def on_train_epoch_end(self, trainer: Trainer, module: TrainModule) -> None:
        # With validation every n epochs, a validation metric is not due before the first one runs.
        if not fit_validates(trainer):
            self._monitor_due = True
        n = self.every_n_epochs
        if n is not None and (trainer.current_epoch + 1) % n == 0 and trainer.global_step != self._last_step_saved:
            self._save(trainer, module)

    def on_train_end(self, trainer: Trainer, module: TrainModule) -> None:
        self._wait_for_writer(trainer)  # fit returns with its files on disk, or with the write's error

    def on_exception(self, trainer: Trainer, module: TrainModule, exception: BaseException) -> None:
        error = self._writer.error()  # let a write in flight finish: it is complete and resumable
        if error is not None:  # the run fails with its own error; say that this save failed too
            warnings.warn(f"The checkpoint being written when fit failed was not saved: {error}", stacklevel=2)

    def _wait_for_writer(self, trainer: Trainer) -> None:
        """Wait for the write in flight (rank 0). If it failed, every rank raises, together and
        with its message, rather than waiting in the next collective: whichever rank a launcher
        reports first, the reason is in it."""
        error = self._writer.error()
        if trainer.world_size > 1:
            reason = trainer.strategy.broadcast_object(None if error is None else f"{type(error).__name__}: {error}")
        else:
            reason = None
        if error is not None:
            raise error
        if reason is not None:
            raise RuntimeError(f"Global rank 0 could not write a checkpoint, so every rank stops. {reason}")

    def write_last(self, trainer: Trainer, module: TrainModule) -> str:
        """Write only ``last.ckpt``, now (when fit stops mid-epoch). Every rank must call. A save
        at this very step already holds this state: its file is the answer, not a second write."""
        self._wait_for_writer(trainer)
        if self._last_step_saved == trainer.global_step and self.last_model_path:
            return self.last_model_path
        path = os.path.join(self.dirpath, LAST)
        self.last_model_path = path
        trainer.save_checkpoint(path)
        return path

    # --- saving ------------------------------------------------------------------------
    def _save(self, trainer: Trainer, module: TrainModule) -> None:
        self._wait_for_writer(trainer)  # the previous write's error surfaces before any book-keeping
        score = self._score(trainer)
        last = os.path.join(self.dirpath, LAST)
        if score is not None:  # None: the monitor is not logged yet; this step's epoch end may still rank a file
            self._last_step_saved = trainer.global_step
        if score is None or not self._keeps(score):  # no file to rank: only last.ckpt moves on
            if self.save_last:
                self.last_model_path = last
                self._write(trainer, last)
            return
        path = os.path.join(self.dirpath, self._free_name(self._format(trainer)))
        # Book-keeping first, so that the file records itself among the top k: a run resumed
        # from it still knows every file it kept, and deletes the right ones later.
        dropped = self._add_top_k(path, score)
        self.last_model_path = last if self.save_last else path
        # Only a file in our own folder is deleted: a state loaded from elsewhere (another
        # callback's, a moved run) must not delete its files.
        ours = dropped is not None and os.path.dirname(os.path.abspath(dropped)) == os.path.abspath(self.dirpath)
        self._write(trainer, path, dropped if ours and dropped != path else None, link_last=self.save_last)

    def _write(self, trainer: Trainer, path: str, dropped: str | None = None, link_last: bool = False) -> None:
        """Take the state now (every rank: it is a collective) and have rank 0 write it in the background."""
        if trainer.strategy.sharded_checkpoints:  # a folder that every rank writes into, now
            trainer.save_checkpoint(path)
            if trainer.is_global_zero:
                _rotate(path, dropped, link_last, folder=True)
            return
        checkpoint = trainer.checkpoint_state()
        if checkpoint is not None:
            self._writer.submit(_write_files, freeze(checkpoint), path, dropped, link_last)

    def _free_name(self, name: str) -> str:
        """``name``, or ``name-v1.ckpt``, ... if a kept checkpoint already has it: a save never
        overwrites a file that top-k still counts on (a fixed filename would otherwise do so)."""
        stem, n = name[: -len(".ckpt")], 0
        while os.path.join(self.dirpath, name) in self.best_k_models or name == LAST:
            n += 1
            name = f"{stem}-v{n}.ckpt"
        return name

    def _score(self, trainer: Trainer) -> float | None:
        """The monitored value; None while it may still be logged (before the fit's first
        validation, or, in a fit without validation, before the first epoch end)."""
        if self.monitor is None:
            return float(trainer.global_step)
        if self.monitor in trainer.callback_metrics:
            return float(trainer.callback_metrics[self.monitor])
        message = (
            f"ModelCheckpoint(monitor={self.monitor!r}) was never logged. Logged metrics: "
            f"{sorted(trainer.callback_metrics) or 'none'}. Log it with self.log({self.monitor!r}, value) "
            "in validation_step (or training_step), or fix the name."
        )
        if self._monitor_due:
            raise ValueError(message)
        if not self._warned_early:  # a checkpoint before the first validation
            self._warned_early = True
            warnings.warn(f"{message} Until it is, checkpoints only update {LAST}.", stacklevel=2)
        return None

    def _better(self, a: float, b: float) -> bool:
        if math.isnan(a):
            return False
        if self.monitor is None or self.mode == "max":
            return a > b or math.isnan(b)
        return a < b or math.isnan(b)

    def _keeps(self, score: float) -> bool:
        if self.save_top_k == 0:
            return False
        if self.save_top_k == -1 or len(self.best_k_models) < self.save_top_k:
            return True
        worst = self._worst()
        return self._better(score, self.best_k_models[worst])

    def _worst(self) -> str:
        worst = None
        for path, score in self.best_k_models.items():
            if worst is None or self._better(self.best_k_models[worst], score):
                worst = path
        return worst

    def _add_top_k(self, path: str, score: float) -> str | None:
        """Record ``path``; return the file that fell out of the top k (None if none did)."""
        self.best_k_models[path] = score
        dropped = None
        if self.save_top_k != -1 and len(self.best_k_models) > self.save_top_k:
            dropped = self._worst()
            del self.best_k_models[dropped]
        best = None
        for p, s in self.best_k_models.items():
            if best is None or self._better(s, self.best_k_models[best]):
                best = p
        self.best_model_path = best or ""
        return dropped

    def _format(self, trainer: Trainer) -> str:
        values = {"epoch": trainer.current_epoch, "step": trainer.global_step, **trainer.callback_metrics}
        return self._template(values).replace(os.sep, "_") + ".ckpt"

    def _template(self, values: dict[str, Any] | None = None) -> str:
        # "{epoch}" -> "epoch=3", as Lightning does, so file names say what the numbers are.
        template = re.sub(r"\{([A-Za-z_][\w/.]*)(:[^}]*)?\}", lambda m: f"{m.group(1)}={{{m.group(1)}{m.group(2) or ''}}}", self.filename)
        try:
            return template.format_map(_Missing({"epoch": 0, "step": 0} if values is None else values))
        except (ValueError, TypeError, IndexError, AttributeError) as err:
            raise ValueError(
                f"ModelCheckpoint(filename={self.filename!r}) could not be formatted: {err}. Use names in braces "
                "with an optional format, e.g. '{epoch}-{val_loss:.3f}'."
            ) from None

    # --- state -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "dirpath": self.dirpath,
            "best_k_models": dict(self.best_k_models),
            "best_model_path": self.best_model_path,
            "last_model_path": self.last_model_path,
            "last_step_saved": self._last_step_saved,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best_k_models = dict(state_dict.get("best_k_models", {}))
        self.best_model_path = state_dict.get("best_model_path", "")
        self.last_model_path = state_dict.get("last_model_path", "")
        self._last_step_saved = state_dict.get("last_step_saved", -1)
        if self.dirpath is None:
            self.dirpath = state_dict.get("dirpath")


def _write_files(checkpoint: dict[str, Any] | ckpt_io.Encoded, path: str, dropped: str | None, link_last: bool) -> None:
    """On the writer thread: the new file, then (it being complete on disk) the old top-k
    file's deletion, then ``last.ckpt`` pointed at the new file."""
    ckpt_io.save_atomic(checkpoint, path)
    _rotate(path, dropped, link_last)


def _rotate(path: str, dropped: str | None, link_last: bool, folder: bool = False) -> None:
    """With ``path`` (a file, or with ``folder`` a sharded checkpoint's folder) complete on
    disk: delete the file or folder that left the top k, then point ``last.ckpt`` at ``path``.
    On the writer thread, each system call here hands the GIL back and forth with training:
    there are as few as the job takes."""
    if dropped is not None:
        ckpt_io.remove(dropped)
    if link_last:
        directory = os.path.dirname(path)
        # A name no other writer uses: two ModelCheckpoints may share the folder, each with its own thread.
        last, tmp = os.path.join(directory, LAST), ckpt_io.temp_path(directory, f".tmp-{LAST}-")
        if folder:  # a sharded checkpoint: a relative link to its folder, swapped in
            os.symlink(os.path.basename(path), tmp)
            if os.path.isdir(last) and not os.path.islink(last):  # a folder write_last left
                ckpt_io.replace_folder(tmp, last)
            else:
                os.replace(tmp, last)
            return
        try:  # a hard link swapped in atomically
            os.link(path, tmp)
        except FileExistsError:  # left by a killed process that had our pid
            os.unlink(tmp)
            os.link(path, tmp)
        except OSError:  # no hard links on this filesystem: copy
            shutil.copyfile(path, tmp)
        os.replace(tmp, last)



class _Missing(dict):
    def __missing__(self, key: str) -> float:
        return math.nan  # a metric not logged yet formats as "nan" rather than failing


def _check_writable(dirpath: str) -> None:
    try:
        os.makedirs(dirpath, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=dirpath, prefix=".write-test-"):
            pass
    except OSError as err:
        raise PermissionError(
            f"ModelCheckpoint cannot write to dirpath={dirpath!r}: {err.strerror or err}. "
            "Pick a writable folder with ModelCheckpoint(dirpath=...) or Trainer(log_dir=...)."
        ) from None


def _remove_unfinished_saves(dirpath: str) -> None:
    """Temp files of saves a killed run never finished (the real files were never touched)."""
    for name in os.listdir(dirpath):
        if name.startswith(".tmp-"):
            try:
                ckpt_io.remove(os.path.join(dirpath, name))
            except OSError:
                pass
