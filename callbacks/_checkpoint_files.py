"""ModelCheckpoint's files: which ones the top k keeps, writing one, retiring the one it
replaces, pointing ``last.ckpt`` at the newest, and the folder's checks. What runs on the
writer thread is here."""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import tempfile
import weakref
from typing import Any, Callable

from trainer.checkpoint import files as ckpt_io
from trainer.checkpoint.folder_lock import lock_checkpoint_folder
from trainer.checkpoint.paths import LAST, run_checkpoints  # LAST: the newest state, which "last" resumes from

log = logging.getLogger("trainer")


class TopK:
    """Which files ModelCheckpoint keeps, with Lightning's book-keeping, in plain attributes (as
    Lightning's: code sets them): ``best_k_models`` ({path: score}), the best file
    (``best_model_path``, ``best_model_score``) and, once ``save_top_k`` are kept, the worst one,
    the next to go (``kth_best_model_path``, ``kth_value``). Without a monitor there are no
    scores (Lightning's): the newest file is the best, and ``save_top_k=1`` replaces it."""

    save_top_k: int
    monitor: str | None
    mode: str

    def _reset_top_k(self) -> None:
        self.best_k_models: dict[str, float] = {}
        self.best_model_path = ""
        self.best_model_score: float | None = None
        self._refresh_kth()

    def _refresh_kth(self) -> None:
        full = self.best_k_models and (self.save_top_k == -1 or len(self.best_k_models) >= self.save_top_k)
        self.kth_best_model_path = self._worst() if full else ""
        worst = math.inf if self.mode == "min" else -math.inf
        self.kth_value = self.best_k_models[self.kth_best_model_path] if full else worst

    def _better(self, a: float, b: float) -> bool:
        if math.isnan(a):
            return False
        if self.mode == "max":
            return a > b or math.isnan(b)
        return a < b or math.isnan(b)

    def _keeps(self, score: float) -> bool:
        if self.save_top_k == 0:
            return False
        if self.monitor is None or self.save_top_k == -1 or len(self.best_k_models) < self.save_top_k:
            return True
        return self._better(score, self.best_k_models[self._worst()])

    def _leaving(self) -> str | None:
        """The file the next save pushes out (None while there is room)."""
        if self.monitor is None:
            return self.best_model_path or None if self.save_top_k == 1 else None
        full = self.save_top_k != -1 and self.best_k_models and len(self.best_k_models) >= self.save_top_k
        return self._worst() if full else None

    def _worst(self) -> str:
        worst = None
        for path, score in self.best_k_models.items():
            if worst is None or self._better(self.best_k_models[worst], score):
                worst = path
        return worst

    def _add_top_k(self, path: str, score: float) -> str | None:
        """Record ``path``; return the file that fell out of the top k (None if none did)."""
        if self.monitor is None:
            dropped, self.best_model_path = self._leaving(), path
            return dropped
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
        self.best_model_score = self.best_k_models.get(self.best_model_path)
        self._refresh_kth()
        return dropped


def resume_point(trainer: Any, given: str | None, last: str | None) -> str | None:
    """Where a stop's resume point goes: ``last``, the ``save_last`` file, if there is one; else
    ``last.ckpt`` in the run's own checkpoints folder, unless that is a folder the user named
    (``given``): a named folder holds only what Lightning would write there. None under
    ``fast_dev_run``, which saves nothing."""
    if trainer.fast_dev_run:
        return None
    if last is not None:
        return last
    folder = os.path.abspath(run_checkpoints(trainer))
    return None if folder == given else os.path.join(folder, LAST)


def free_name(dirpath: str, name: str, kept: dict[str, float], replacing: str | None, counter: bool = True) -> str:
    """``name``, or ``name-v1.ckpt``, ... if a ``kept`` checkpoint or a file on disk already has
    it (Lightning's version counter): a save never overwrites a file that top-k still counts on,
    nor one an earlier run left (a fixed filename, or a second fit to the same step, would).
    The file this save pushes out of the top k (``replacing``) may be replaced in place.
    ``counter=False`` (``enable_version_counter=False``, Lightning's) overwrites instead."""
    stem, n = name[: -len(".ckpt")], 0
    while counter and (path := os.path.join(dirpath, name)) != replacing and (
        path in kept or name == LAST or os.path.lexists(path)
    ):
        n += 1
        name = f"{stem}-v{n}.ckpt"
    return name


# Each save_last callback's last file in this process (absolute path -> the callback). A file still
# being written counts as there, as Lightning's, written in the loop, would be: a second callback
# sharing the folder takes last-v1.ckpt whatever the writer thread's timing.
_LAST_TAKEN: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()


def last_name(dirpath: str, current: str, counter: bool = True, owner: Any = None) -> str:
    """``last.ckpt`` in ``dirpath``; with Lightning's version counter, ``last-v1.ckpt``, ... when
    another run's or another callback's is there (or being written). This fit's own (``current``:
    ``last_model_path``, restored when it resumed) is overwritten. ``owner`` (the callback that
    will write it) takes the name."""
    path, n = os.path.join(dirpath, LAST), 0

    def taken(p: str) -> bool:
        other = _LAST_TAKEN.get(os.path.abspath(p))
        return os.path.lexists(p) or (other is not None and other is not owner and other._writer.in_flight)

    while counter and path != current and taken(path):
        n += 1
        path = os.path.join(dirpath, f"last-v{n}.ckpt")
    if owner is not None:
        _LAST_TAKEN[os.path.abspath(path)] = owner
    return path


def not_logged(monitor: str, logged: dict[str, Any]) -> str:
    return (
        f"ModelCheckpoint(monitor={monitor!r}) was never logged. Logged metrics: {sorted(logged) or 'none'}. "
        f"Log it with self.log({monitor!r}, value) in validation_step (or training_step), or fix the name."
    )


def write_yaml(best_k: dict[str, float], path: str | os.PathLike) -> None:
    """``{path: score}`` as YAML (JSON is YAML: no YAML package needed), as ``ModelCheckpoint.to_yaml`` writes it."""
    with open(path, "w") as f:
        json.dump({k: float(v) for k, v in best_k.items()}, f, indent=2)


def write_files(
    checkpoint: dict[str, Any] | ckpt_io.Encoded, path: str, dropped: str | None, last: str | None, link: bool = False,
) -> None:
    """On the writer thread: the new file, then (it being complete on disk) ``last``
    pointed at it, then the deletion of the file that left the top k."""
    ckpt_io.save_atomic(checkpoint, path)
    rotate(path, dropped, last, link)


def rotate(path: str, dropped: str | None, last: str | None, link: bool = False, folder: bool = False) -> None:
    """With ``path`` (a file, or with ``folder`` a sharded checkpoint's folder) complete on
    disk: point ``last`` (``last.ckpt``, the ``save_last`` file) at it (``link``, for
    ``save_last="link"``: a symbolic link; else a hard link, or a copy where there are none),
    then delete what left the top k. In this order a ``last.ckpt`` never names a deleted file,
    even if the process dies in between. On the writer thread, each system call here hands
    the GIL back and forth with training: there are as few as the job takes."""
    if last is not None:
        _point_last(path, last, symbolic=folder or link, folder=folder)
    if dropped is not None:
        ckpt_io.remove(dropped)


def _point_last(path: str, last: str, symbolic: bool, folder: bool) -> None:
    directory = os.path.dirname(path)
    # A name no other writer uses: two ModelCheckpoints may share the folder, each with its own thread.
    tmp = ckpt_io.temp_path(directory, f".tmp-{LAST}-")
    if symbolic:  # a relative link, swapped in: the folder can move
        try:
            os.symlink(os.path.basename(path), tmp)
        except FileExistsError:  # left by a killed process that had our pid
            os.unlink(tmp)
            os.symlink(os.path.basename(path), tmp)
        except OSError:  # no symbolic links here (e.g. Windows without the right): a copy
            if folder:
                raise
            shutil.copyfile(path, tmp)
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


def prepare_folder(trainer: Any, dirpath: str, save_weights_only: bool) -> None:
    """At a fit's setup (every rank): a weights-only save cannot be sharded; the folder is
    writable, locked for this run (another live run writing it is an error), and rid of the
    temp files of saves a killed run never finished."""
    if save_weights_only and trainer.strategy.sharded_checkpoints:
        raise ValueError(
            "ModelCheckpoint(save_weights_only=True) is not supported with a sharded checkpoint, whose folder "
            "each rank writes. Use FSDPStrategy(checkpoint='full'), or save_weights_only=False."
        )
    if trainer.fast_dev_run:  # which saves nothing, so makes no folder
        return
    if trainer.is_global_zero:
        check_writable(dirpath)
    lock_checkpoint_folder(trainer, dirpath)  # before touching it: another live run may be writing it
    if trainer.is_global_zero:
        remove_unfinished_saves(dirpath)


def save_at_exception(
    cb: Any, trainer: Any, exception: BaseException, saved_steps: tuple[int, ...], filename: Callable[[Any], str],
) -> None:
    """``ModelCheckpoint(save_on_exception=True)``, as Lightning's: when fit fails, the state it
    failed in goes to the ``filename`` template's file (and ``last.ckpt``), unless it is the
    sanity check or ``fast_dev_run``, no step was taken, or this step is already saved. On one
    process only: a rank failing alone cannot take part in the other ranks' collectives.
    ``saved_steps``: the steps this callback saved at; ``filename(trainer)``: the template's name."""
    if not (cb.save_on_exception and cb.dirpath and trainer.optimizers):
        return
    if trainer.fast_dev_run or trainer.sanity_checking:
        return
    if trainer.global_step in (0, *saved_steps):
        return
    if trainer.world_size > 1:
        log.info("save_on_exception: not saved, since %d processes cannot save together after one failed.",
                 trainer.world_size)
        return
    path = os.path.join(cb.dirpath, filename(trainer))
    trainer.save_checkpoint(path)
    last = last_name(cb.dirpath, cb.last_model_path, cb.enable_version_counter, cb) if cb.save_last else None
    rotate(path, None, last, cb.save_last == "link")
    cb.last_model_path = last or cb.last_model_path
    log.info("An %s was raised with message: %s, saved checkpoint to %s", type(exception).__name__, exception, path)


def check_writable(dirpath: str) -> None:
    """The folder exists (made if need be) and this process may create files in it. ``access``
    answers for the permissions and a read-only file system without creating a file (a test
    file cost a fit's start a create, an unlink and their waits); where it says no, a file is
    tried, which fails with the system's own reason (or succeeds: ``access`` can be wrong)."""
    try:
        os.makedirs(dirpath, exist_ok=True)
        if not os.access(dirpath, os.W_OK | os.X_OK):
            with tempfile.NamedTemporaryFile(dir=dirpath, prefix=".write-test-"):
                pass
    except OSError as err:
        raise PermissionError(
            f"ModelCheckpoint cannot write to dirpath={dirpath!r}: {err.strerror or err}. "
            "Pick a writable folder with ModelCheckpoint(dirpath=...) or Trainer(log_dir=...)."
        ) from None


def remove_unfinished_saves(dirpath: str) -> None:
    """Temp files of saves a killed run never finished (the real files were never touched)."""
    for name in os.listdir(dirpath):
        if name.startswith(".tmp-"):
            try:
                ckpt_io.remove(os.path.join(dirpath, name))
            except OSError:
                pass


def file_name(template: str, auto_insert_metric_name: bool, values: dict[str, Any] | None = None) -> str:
    """``template`` filled with ``values`` (``epoch``, ``step``, logged metrics); with
    ``auto_insert_metric_name``, "{epoch}" becomes "epoch=3", as Lightning does, so that file
    names say what the numbers are. Without ``values``: a check that the template formats."""
    given = template
    if auto_insert_metric_name:
        template = re.sub(r"\{([A-Za-z_][\w/.]*)(:[^}]*)?\}",
                          lambda m: f"{m.group(1)}={{{m.group(1)}{m.group(2) or ''}}}", template)
    try:
        return template.format_map(_Missing({"epoch": 0, "step": 0} if values is None else values))
    except (ValueError, TypeError, IndexError, AttributeError, KeyError) as err:
        raise ValueError(
            f"ModelCheckpoint(filename={given!r}) could not be formatted: {err}. Use names in braces "
            "with an optional format, e.g. '{epoch}-{val_loss:.3f}'."
        ) from None


class _Missing(dict):
    def __missing__(self, key: str) -> int:
        return 0  # a metric not logged yet formats as 0, as in Lightning, rather than failing


def tell_loggers(cb: Any, trainer: Any) -> None:
    """Lightning's ``logger.after_save_checkpoint(callback)`` after each save, on global rank 0.
    A logger that overrides it (MLflow's and W&B's upload the files) expects the file on disk,
    so the write in flight finishes first; with only loggers that do nothing there (the
    default), the write stays in the background."""
    if any(sum("after_save_checkpoint" in vars(c) for c in type(lg).__mro__) > 1 for lg in trainer.loggers):
        cb.wait_for_saves(trainer)  # (every rank: the loggers are the same on each)
    if not trainer.is_global_zero:
        return
    for lg in trainer.loggers:
        hook = getattr(lg, "after_save_checkpoint", None)
        if hook is not None:
            hook(cb)
