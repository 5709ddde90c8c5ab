"""ModelCheckpoint: top-k by a monitored metric, ``last.ckpt`` when asked, and a stop's resume point."""

from __future__ import annotations

import datetime
import logging
import math
import os
import time
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Literal, Optional, Union

import torch

from trainer.checkpoint.background_save import BackgroundWriter, hand_off
from trainer.checkpoint.integrity import deferred_refusal, refuse_non_finite
from trainer.core.checks import flag, one_of, positive_int
from trainer.core.exceptions import misconfigured

from . import _checkpoint_files as files
from ._checkpoint_files import (TopK, file_name, free_name, last_name, not_logged, prepare_folder, resume_point, rotate,
                                write_files, write_yaml)
from ._schedule import fit_validates, saves_at_epoch_end, triggers, validation_next
from .base import Callback

if TYPE_CHECKING:
    from trainer import Trainer, TrainModule

log = logging.getLogger("trainer")
_WRITERS: weakref.WeakKeyDictionary[ModelCheckpoint, BackgroundWriter] = weakref.WeakKeyDictionary()


class ModelCheckpoint(TopK, Callback):
    """Save the training state when one trigger fires, keep the ``save_top_k`` best files by ``monitor`` (without one,
    the newest; ``-1`` keeps all, ``0`` none), and with ``save_last`` keep ``last.ckpt`` as the newest save: Lightning's
    files. A stop mid-epoch writes its resume point (``write_last``), which ``ckpt_path="last"`` finds.

    One trigger at most (Lightning's): ``every_n_epochs`` (1 when none is given) saves after each validation of every
    n-th epoch, mid-epoch ones too, or at epoch ends (as ``save_on_train_epoch_end`` says; by default when validation
    runs once an epoch or never); ``every_n_train_steps`` at every n-th optimizer step; ``train_time_interval`` (a
    ``timedelta``) at the first step after it passed. A step or time save whose monitor is not logged yet waits for the
    next validation. ``filename`` formats ``epoch``, ``step`` and logged metrics (``"{epoch}-{step}-{val_loss:.3f}"``);
    ``save_weights_only`` files evaluate but do not resume; ``save_last="link"`` makes ``last.ckpt`` a symbolic link
    (docs/checkpoint-saves.md). A taken name gets ``-v1``, ``-v2``, ... (``enable_version_counter=False``: overwrites).

    Training does not wait for the disk: a save copies the state to the CPU, and a thread writes it during the next
    steps. The next save, the end of fit, and a stop by signal wait for that write (and raise its error, e.g. a full
    disk, on every rank). During fit, ``best_model_path`` and ``last_model_path`` may name a file still being written;
    when fit returns, they are on disk."""

    def __init__(
        self,
        dirpath: str | os.PathLike | None = None,
        filename: str | None = None,
        monitor: str | None = None,
        *,
        save_last: bool | str | None = None,
        save_top_k: int = 1,
        save_weights_only: bool = False,
        mode: str = "min",
        auto_insert_metric_name: bool = True,
        every_n_train_steps: int | None = None,
        train_time_interval: datetime.timedelta | None = None,
        every_n_epochs: int | None = None,
        save_on_train_epoch_end: bool | None = None,
        verbose: bool = False,
        save_on_exception: bool = False,
        enable_version_counter: bool = True,
    ) -> None:
        self.enable_version_counter = flag("ModelCheckpoint(enable_version_counter)", enable_version_counter)
        self.save_on_exception = flag("ModelCheckpoint(save_on_exception)", save_on_exception)
        self.verbose = flag("ModelCheckpoint(verbose)", verbose)
        if dirpath is not None and not isinstance(dirpath, (str, os.PathLike)):
            raise TypeError(f"ModelCheckpoint(dirpath={dirpath!r}) must be a path or None.")
        if filename is not None and not isinstance(filename, str):
            raise TypeError(f"ModelCheckpoint(filename={filename!r}) must be a format string such as '{epoch}-{step}'.")
        if monitor is not None and (not isinstance(monitor, str) or not monitor):
            raise TypeError(f"ModelCheckpoint(monitor={monitor!r}) must be a logged metric's name or None.")
        # Absolute, as in Lightning: best_model_path and friends stay right if the process changes folder.
        given = None if dirpath is None else os.fspath(dirpath)
        remote = given is not None and "://" in given  # s3://, memory://: refused at setup, as Lightning's link
        self.dirpath_given = given if given is None or remote else os.path.abspath(os.path.expanduser(given))
        self.dirpath: str | None = self.dirpath_given
        self.filename = filename or "{epoch}-{step}"  # Lightning's default, with a monitor too
        self.monitor = monitor
        self.mode = one_of("ModelCheckpoint(mode)", mode, ("min", "max"),
                           lightning=f"`mode` can be min, max but got {mode}")
        self.save_top_k = positive_int("ModelCheckpoint(save_top_k)", save_top_k, minimum=-1,
                                       lightning=f"Invalid value for save_top_k={save_top_k}. Must be >= -1")
        if monitor is None and save_top_k not in (-1, 0, 1):
            raise misconfigured(
                "Give monitor= (a logged metric's name) to keep the k best files, or save_top_k=-1 to keep every one.",
                f"ModelCheckpoint(save_top_k={save_top_k}, monitor=None) is not a valid configuration. "
                "No quantity for top_k to track.",
            )
        if save_last not in (True, False, None, "link"):
            raise TypeError(f"ModelCheckpoint(save_last={save_last!r}) must be True, False or 'link' (a symlink).")
        self.save_last: bool | str = save_last or False
        self.save_weights_only = flag("ModelCheckpoint(save_weights_only)", save_weights_only)
        self.auto_insert_metric_name = flag("ModelCheckpoint(auto_insert_metric_name)", auto_insert_metric_name)
        triggered = triggers(every_n_train_steps, train_time_interval, every_n_epochs)
        self.every_n_train_steps, self.train_time_interval, self.every_n_epochs = triggered
        self.save_on_train_epoch_end = None if save_on_train_epoch_end is None else (
            flag("ModelCheckpoint(save_on_train_epoch_end)", save_on_train_epoch_end))
        self._template()  # a bad filename fails now, not at the first save after an epoch of training
        self._reset_top_k()
        self.last_model_path = ""
        self.current_score: float | None = None  # the monitored value at the latest save
        self._last_step_saved = -1  # the step of the latest save a trigger made (a ranked file, or last.ckpt)
        self._newest_step, self._newest_path = -1, ""  # the newest state on disk (write_last's too): its step, its file
        self._step_seen = -1  # global_step at the previous batch end: did this batch step the optimizer?
        self._monitor_due = False  # validation (or, without it, an epoch end) has run: the monitor must exist
        self._warned_early = self._warned_group = False
        self._at_epoch_end = True  # whether epoch saves happen at the train epoch's end (on_train_start decides)
        self._waiting = self._after_epoch = False  # a step/time save waits for validation, the epoch end's for the end
        self._last_time = 0.0  # train_time_interval: when the clock last started

    @property
    def _writer(self) -> BackgroundWriter:
        """This process's writer thread (global rank 0 writes; the others never submit): process state, not
        configuration, so kept outside its attributes: a copy or unpickled one compares equal and starts with none."""
        writer = _WRITERS.get(self)
        if writer is None:
            writer = _WRITERS[self] = BackgroundWriter()
        return writer

    @_writer.setter
    def _writer(self, writer: BackgroundWriter) -> None:
        _WRITERS[self] = writer

    @property
    def state_key(self) -> str:
        # Lightning's key: two ModelCheckpoints that differ in these keep their states apart.
        return "ModelCheckpoint" + repr({
            "monitor": self.monitor, "mode": self.mode, "every_n_train_steps": self.every_n_train_steps or 0,
            "every_n_epochs": self.every_n_epochs or 0, "train_time_interval": self.train_time_interval,
        })

    @property
    def legacy_state_key(self) -> str:  # older files' key, read when the new one is absent
        return f"ModelCheckpoint[monitor={self.monitor}]"

    def to_yaml(self, filepath: str | os.PathLike | None = None) -> None:
        """Write ``best_k_models`` ({path: score}) as YAML, by default to ``<dirpath>/best_k_models.yaml``."""
        write_yaml(self.best_k_models, filepath or os.path.join(self.dirpath, "best_k_models.yaml"))

    # --- hooks -------------------------------------------------------------------------
    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        if stage != "fit":
            return
        if self.dirpath_given is not None and "://" in self.dirpath_given:
            link = ("`ModelCheckpoint(save_last='link')` is only supported for local file paths, "
                    f"got `dirpath={self.dirpath_given}`. ") if self.save_last == "link" else ""
            raise ValueError(link + f"ModelCheckpoint(dirpath={self.dirpath_given!r}): checkpoints are written to "
                             "local folders only. Give a local dirpath and copy the files to remote storage "
                             "from there.")
        if self.dirpath_given is None:
            self.dirpath = files.run_checkpoints(trainer)  # the run folder's
        prepare_folder(trainer, self.dirpath, self.save_weights_only)  # writable, ours alone (locked), no half saves
        self._monitor_due = self._waiting = self._after_epoch = False
        # A new fit starts with nothing saved (a checkpoint being resumed loads its own state
        # after this): an earlier fit's files and steps must not rank or block this one's.
        self._reset_top_k()
        self.last_model_path = self._newest_path = ""
        self.current_score = None
        self._last_step_saved = self._step_seen = self._newest_step = -1

    def on_train_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        self._step_seen = trainer.global_step
        self._last_time = time.monotonic()
        self._at_epoch_end = saves_at_epoch_end(trainer, self.save_on_train_epoch_end)

    def wants_hook(self, hook: str) -> bool:
        # Saving only by epochs, nothing happens at batch ends: not called on every batch then.
        timed = self.every_n_train_steps is not None or self.train_time_interval is not None
        return hook != "on_train_batch_end" or timed or (
            type(self).on_train_batch_end is not ModelCheckpoint.on_train_batch_end  # a subclass's own
        )

    def on_train_batch_end(self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if step == self._step_seen:
            return  # an accumulation micro-batch, not a state we could save
        self._step_seen = step
        due = self.every_n_train_steps is not None and step % self.every_n_train_steps == 0
        if self.train_time_interval is not None:
            now = time.monotonic()
            late = now - self._last_time >= self.train_time_interval.total_seconds()
            if trainer.world_size > 1:  # rank 0's clock decides for all: one save, on every rank
                mine = torch.tensor([float(late and trainer.is_global_zero)])
                late = bool(trainer.strategy.all_reduce_sum(mine).item())
            if late:
                self._last_time, due = now, True
        if not due or step == self._last_step_saved:
            return
        if self.monitor is not None and (self._current(trainer) is None or validation_next(trainer, batch_idx)):
            self._waiting = True  # the next validation saves, with its value
            return
        self._save(trainer)

    def on_validation_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if trainer.state.fn != "fit" or trainer.sanity_checking:
            return  # trainer.validate() and the sanity check save nothing
        self._monitor_due = True  # from now on a save whose monitor is missing is an error that lists what was logged
        epoch_due = not self._at_epoch_end and self._epoch_due(trainer)
        if not (epoch_due or self._waiting) or trainer.global_step == self._last_step_saved:
            return
        if trainer.at_epoch_end:  # the epoch-end validation: save after the epoch's end (hooks, scheduler)
            self._after_epoch = True
            return
        batch, group = trainer.state.batch_in_epoch, trainer.accumulate_grad_batches
        if group > 1 and batch % group and batch < trainer.num_training_batches and not self._warned_group:
            self._warned_group = True
            warnings.warn(
                f"Validation ran after batch {batch}, inside an accumulation group of accumulate_grad_batches={group}: "
                "the checkpoint saved there lacks the group's gradients so far, so a run resumed from it is not "
                "exact. Make val_check_interval a multiple of accumulate_grad_batches.", stacklevel=2,
            )
        self._save(trainer)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        validates = fit_validates(trainer)
        if not validates:  # a monitored metric must come from training, and is due now
            self._monitor_due = True
        due = self._after_epoch or self._at_epoch_end and self._epoch_due(trainer) or self._waiting and not validates
        self._after_epoch = False
        if due and trainer.global_step != self._last_step_saved:
            self._save(trainer)

    def _epoch_due(self, trainer: Trainer) -> bool:
        n = self.every_n_epochs
        return n is not None and (trainer.current_epoch + 1) % n == 0

    def on_train_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        # Lightning's: save_last writes last.ckpt at the end only if this fit saved nothing.
        if self.save_last and self._newest_step == -1 and trainer.global_step > 0:
            self.write_last(trainer, pl_module)
        self.wait_for_saves(trainer, release=True)  # fit returns with its files on disk, or with the write's error

    def on_exception(self, trainer: Trainer, pl_module: TrainModule, exception: BaseException) -> None:
        error = self._writer.error(release=True)  # let a write in flight finish: it is complete and resumable
        if error is not None:  # the run fails with its own error; say that this save failed too
            warnings.warn(f"The checkpoint being written when fit failed was not saved: {error}", stacklevel=2)
        files.save_at_exception(self, trainer, exception, (self._last_step_saved, self._newest_step), self._format)

    def wait_for_saves(self, trainer: Trainer, release: bool = False) -> None:
        """Wait for the write in flight (rank 0); the Trainer calls it before every callback's ``on_train_end``, so the
        files saved so far are on disk, as Lightning's are once its loop ends. If it failed, every rank raises, together
        and with its message, rather than waiting in the next collective: whichever rank a launcher reports first, the
        reason is in it. ``release``: at the end, free the copy kept for the next save."""
        error = self._writer.error(release)
        said = None if error is None else f"{type(error).__name__}: {error}"
        reason = trainer.strategy.broadcast_object(said) if trainer.world_size > 1 else None
        if error is not None:
            raise error
        if reason is not None:
            raise RuntimeError(f"Global rank 0 could not write a checkpoint, so every rank stops. {reason}")

    def write_last(self, trainer: Trainer, pl_module: TrainModule) -> str | None:
        """Write the resume point of a stop mid-epoch (a signal, ``max_steps``, ``should_stop``), now, with the full
        state, where ``resume_point`` says (never into a ``dirpath`` given without ``save_last``). Every rank must call.
        A save at this very step is the answer."""
        self.wait_for_saves(trainer)
        if trainer.global_step == self._newest_step and self._newest_path:
            return self._newest_path
        versioned = self.enable_version_counter
        last = last_name(self.dirpath, self.last_model_path, versioned, self) if self.save_last else None
        path = resume_point(trainer, self.dirpath_given, last)
        if path is not None:
            self.last_model_path = path if self.save_last else self.last_model_path
            self._newest_step, self._newest_path = trainer.global_step, path  # a validation here may still rank a file
            trainer.save_checkpoint(path)
            files.tell_loggers(self, trainer)
        return path

    # --- saving ------------------------------------------------------------------------
    def _save(self, trainer: Trainer) -> None:
        if trainer.fast_dev_run:  # Lightning's: a development run keeps its checkpointers but writes nothing
            return
        self.wait_for_saves(trainer)  # the previous write's error surfaces before any book-keeping
        # NaN weights never push the last good file out: checked on the writer's copy (1 process) or now (a collective)
        own = type(trainer).save_checkpoint.__qualname__ == "Trainer.save_checkpoint"
        refuse = deferred_refusal if trainer.world_size == 1 and own else refuse_non_finite
        check = refuse(trainer, f"a checkpoint into {self.dirpath!r}")
        self._waiting = False
        score = self._score(trainer)
        self.current_score = score if self.monitor is not None else None
        last = last_name(self.dirpath, self.last_model_path, self.enable_version_counter,
                         self if self.save_last else None)
        if score is None or not self._keeps(score):  # no file to rank: only last.ckpt moves on
            if self.save_last:
                self._last_step_saved = self._newest_step = trainer.global_step
                self.last_model_path = self._newest_path = last
                self._write(trainer, last, check=check)  # last.ckpt itself: nothing to point at it
            return
        self._last_step_saved = self._newest_step = trainer.global_step
        leaving = self._leaving()  # the file this save pushes out
        name = free_name(self.dirpath, self._format(trainer), self.best_k_models, leaving, self.enable_version_counter)
        path = os.path.join(self.dirpath, name)
        if trainer.world_size > 1:  # rank 0's disk decides the name (-v1, ...): every rank keeps the same list
            path = trainer.strategy.broadcast_object(path)
        # Book-keeping first, so that the file records itself among the top k: a run resumed
        # from it still knows every file it kept, and deletes the right ones later.
        dropped = self._add_top_k(path, score)
        if self.verbose and trainer.is_global_zero:
            log.info("Step %d: %s=%s, saving %s (best %s).",
                     trainer.global_step, self.monitor or "step", score, path, self.best_model_score)
        if self.save_last:
            self.last_model_path = last
        self._newest_path = last if self.save_last else path
        # Only our folder's files go: a state loaded from elsewhere (another callback's, a moved run) keeps its files.
        ours = dropped is not None and os.path.dirname(os.path.abspath(dropped)) == os.path.abspath(self.dirpath)
        ours = ours and os.path.abspath(dropped) != os.path.abspath(trainer.ckpt_path or "")  # nor fit's resumed file
        dropped = dropped if ours and dropped != path else None
        self._write(trainer, path, dropped, last if self.save_last else None, check)

    def _write(self, trainer: Trainer, path: str, dropped: str | None = None, last: str | None = None,
               check: Any = None) -> None:
        """Lightning's ``trainer.save_checkpoint(path, save_weights_only)`` (every rank: it is a collective), which
        hands rank 0's write to the writer thread: the file, then ``last`` pointed at it, then ``dropped`` deleted. A
        sharded save, or a Trainer subclass's own save_checkpoint, writes at once; the rest of the job follows here.
        ``check``: ``deferred_refusal``'s."""
        link = self.save_last == "link"
        with hand_off(self._writer, write_files, dropped, last, link, check=check) as job:
            trainer.save_checkpoint(path, self.save_weights_only)
        if not job.taken and trainer.is_global_zero and os.path.lexists(path):  # (a stand-in that wrote nothing: done)
            rotate(path, dropped, last, link, folder=os.path.isdir(path))
        files.tell_loggers(self, trainer)

    def _score(self, trainer: Trainer) -> float | None:
        """The monitored value; None while it may still be logged (before the fit's first
        validation, or, in a fit without validation, before the first epoch end)."""
        if self.monitor is None:
            return float(trainer.global_step)
        value = self._current(trainer)
        if value is not None:  # NaN ranks last, as in Lightning: +inf with mode="min", -inf with "max"
            value = float(value)
            return (math.inf if self.mode == "min" else -math.inf) if math.isnan(value) else value
        if self._monitor_due:
            raise ValueError(not_logged(self.monitor, trainer.callback_metrics))
        if not self._warned_early:  # a checkpoint before the first validation
            self._warned_early = True
            warnings.warn(f"{not_logged(self.monitor, trainer.callback_metrics)} Until it is, no file is ranked.",
                          stacklevel=2)
        return None

    def _current(self, trainer: Trainer) -> Any:
        """The monitor's latest value, or None. A value training logs is published at each log step: between two, this
        step's is published now (every rank takes this path alike)."""
        trainer.publish_step_metrics()  # this step's values, as Lightning's callback_metrics always are (once a step)
        counters = {"epoch": trainer.current_epoch, "step": trainer.global_step}  # Lightning's candidates too
        return trainer.callback_metrics.numbers().get(self.monitor, counters.get(self.monitor))

    def _format(self, trainer: Trainer) -> str:
        values = {"epoch": trainer.current_epoch, "step": trainer.global_step, **trainer.callback_metrics.numbers()}
        return self._template(values).replace(os.sep, "_") + ".ckpt"

    def _template(self, values: dict[str, Any] | None = None) -> str:
        return file_name(self.filename, self.auto_insert_metric_name, values)

    # --- state -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "dirpath": self.dirpath,
            "monitor": self.monitor,
            "best_k_models": dict(self.best_k_models),
            "best_model_path": self.best_model_path,
            "best_model_score": self.best_model_score,
            "current_score": self.current_score,
            "kth_best_model_path": self.kth_best_model_path,
            "kth_value": self.kth_value,
            "last_model_path": self.last_model_path,
            "last_step_saved": self._last_step_saved,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Lightning's: the kept files' book-keeping is restored only into their folder (a new ``dirpath`` warns)."""
        saved_dir = state_dict.get("dirpath", self.dirpath)
        if self.dirpath is None:  # loaded before setup named the folder: the saved one
            self.dirpath = saved_dir
        if self.dirpath == saved_dir:
            self.best_k_models = dict(state_dict.get("best_k_models", {}))
            self.last_model_path = state_dict.get("last_model_path", "")
            self._last_step_saved = state_dict.get("last_step_saved", -1)
            self._refresh_kth()
            best = self.best_k_models.get(state_dict.get("best_model_path"))
            self.best_model_score = state_dict.get("best_model_score", best)
        else:
            warnings.warn(
                f"The dirpath has changed from {saved_dir!r} to {self.dirpath!r}, therefore `best_model_score`, "
                "`kth_best_model_path`, `kth_value`, `last_model_path` and `best_k_models` won't be reloaded. Only "
                "`best_model_path` will be reloaded.", stacklevel=2,
            )
        self.best_model_path = state_dict.get("best_model_path", "")


# save_last's type as an object (this module's annotations are strings), Lightning's: argparse and jsonargparse parse it
ModelCheckpoint.__init__.__annotations__["save_last"] = Optional[Union[bool, Literal["link"]]]
