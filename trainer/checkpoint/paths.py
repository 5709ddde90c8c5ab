"""Which checkpoint file a ``ckpt_path`` names: ``"last"`` (the newest good file of the latest
fit's folder), ``"best"`` (the checkpoint callback's), or a path; and whether a file can resume."""

from __future__ import annotations

import glob
import os
import re
import warnings
from typing import TYPE_CHECKING, Any

from trainer.checkpoint import files as ckpt_io
from trainer.checkpoint import layout
from trainer.checkpoint.files import CheckpointError
from trainer.core.distributed import rank_zero_warn

if TYPE_CHECKING:
    from trainer.trainer import Trainer

LAST = "last.ckpt"


def best_checkpoint(callback: Any, stage: str) -> str:
    """``ckpt_path="best"`` for evaluation: the checkpoint callback's best file."""
    if callback is None:
        raise ValueError(
            f'`.{stage}(ckpt_path="best")` is set but `ModelCheckpoint` is not configured. This Trainer has no '
            "ModelCheckpoint callback to rank the checkpoints (enable_checkpointing=False). Pass the file's path, or 'last'."
        )
    if not callback.best_model_path:
        raise ValueError(
            f'`.{stage}(ckpt_path="best")` is set but `ModelCheckpoint` is not configured to save the best model. '
            "It has saved no checkpoint yet (or save_top_k=0): run trainer.fit(...) first, or pass a checkpoint's "
            "path, or 'last'."
        )
    return callback.best_model_path


def warn_no_last(stage: str, where: str) -> None:
    """``ckpt_path="last"`` found nothing: Lightning's warning (not an error, so that a relaunch
    script can always pass it), and where we looked."""
    rank_zero_warn(
        f'.{stage}(ckpt_path="last") is set, but there is no last checkpoint available. No checkpoint will be '
        f"loaded. HINT: Set `ModelCheckpoint(..., save_last=True)`. (Looked for one: {where}; starting from scratch.)"
    )


def resolve_path(trainer: Trainer, ckpt_path: Any) -> str | None:
    """``"last"`` -> the newest good checkpoint of the folders :func:`_search_folders` picks (rank 0
    looks, every rank gets its answer)."""
    if ckpt_path is None:
        return None
    path = os.fspath(ckpt_path)
    if path != "last":
        return path
    folder, path = last_checkpoint(trainer)
    if path is None:
        warn_no_last("fit", f"no earlier fit in {runs_base(trainer)[0]}" if folder is None else f"no checkpoint in {folder}")
    return path


def last_checkpoint(trainer: Trainer, pattern: str = "*.ckpt") -> tuple[str | None, str | None]:
    """(the folders searched, the newest good checkpoint in them named as ``pattern`` says):
    rank 0 looks, every rank gets the path (the folders only on rank 0, for its messages). Fit
    resumes from the newest of any name (ours: a kill -9 resumes without ``save_last``); an
    evaluation takes Lightning's "last", a ``last*.ckpt`` file (``save_last``, a stop's resume point)."""
    strategy = trainer.strategy
    folders = _search_folders(trainer) if strategy.is_global_zero else []
    found = _find_last(folders, pattern) if folders else None
    return (" and ".join(folders) or None), strategy.broadcast_object(found)


def run_checkpoints(trainer: Trainer) -> str:
    """The run's own checkpoints folder: ``<run folder>/checkpoints`` (the first logger's
    ``<save_dir>/<name>/version_<n>``; without a logger ``default_root_dir``, or the working
    folder). The default ModelCheckpoint writes there, and a stop's resume point goes there
    when a ``dirpath`` the user gave holds no ``last.ckpt``."""
    base = trainer.run_dir if trainer.run_dir is not None else os.getcwd()
    return os.path.join(base, "checkpoints")


def _search_folders(trainer: Trainer) -> list[str]:
    """Where ``"last"`` looks: the ModelCheckpoint's ``dirpath`` when given, and the latest fit's
    own checkpoints folder (a stop's resume point is there when ``dirpath`` holds none)."""
    run = _run_folder(trainer)
    run = None if run is None else os.path.abspath(run)
    cb = trainer.checkpoint_callback
    given = None if cb is None else cb.dirpath_given
    if given is None:
        return [] if run is None else [run]
    return [given] + ([run] if run is not None and run != given else [])


def _run_folder(trainer: Trainer) -> str | None:
    """The latest fit's own checkpoints folder: without a logger, ``<log_dir>/checkpoints``
    (``./checkpoints`` with ``log_dir=None``); else that of the first logger's latest fit only:
    its fixed version's folder, or the newest ``<save_dir>/<name>/version_<n>`` with a
    ``checkpoints`` folder (None if none).

    Never any older version: in the default ``lightning_logs`` they belong to other runs,
    and the latest fit, killed before its first save, must start afresh, not resume one of them.
    """
    base, fixed = runs_base(trainer)
    if base is None:
        return os.path.join(os.path.abspath(trainer.default_root_dir or os.getcwd()), "checkpoints")
    if fixed is not None:
        folder = os.path.join(base, fixed, "checkpoints")
        return folder if os.path.isdir(folder) else None
    try:
        names = os.listdir(base)
    except OSError:  # no run of this name yet
        return None
    # A fit with checkpointing makes its version's checkpoints folder at its start; validate and test make none.
    fits = [
        int(d[8:]) for d in names
        if d.startswith("version_") and d[8:].isdigit() and os.path.isdir(os.path.join(base, d, "checkpoints"))
    ]
    return os.path.join(base, f"version_{max(fits)}", "checkpoints") if fits else None


def runs_base(trainer: Trainer) -> tuple[str | None, str | None]:
    """(the first logger's ``<save_dir>/<name>``, its fixed version folder or None), or (None, None)."""
    if not trainer.loggers:
        return None, None
    first = trainer.loggers[0]
    base = os.path.join(first.save_dir or trainer.default_root_dir or os.getcwd(), first.name or "")
    version = getattr(first, "_version", None) if getattr(first, "_fixed_version", False) else None
    return base, None if version is None else (version if isinstance(version, str) else f"version_{version}")


def _find_last(folders: list[str], pattern: str = "*.ckpt") -> str | None:
    """The newest checkpoint in ``folders`` that is intact and loads safely; a damaged,
    truncated or refused newer file is skipped with a warning that names it and the file
    resumed instead."""
    # Temp files of unfinished saves start with "." and never match.
    files = [
        f for folder in folders for f in glob.glob(os.path.join(glob.escape(folder), pattern))
        if os.path.exists(f)  # no dangling link
    ]
    files.sort(key=_newest_first, reverse=True)
    skipped: list[str] = []
    found = None
    for f in files:
        try:
            load_good(f, mmap=True)  # the CRCs read, the tensors mapped: no copy of them
        except CheckpointError as err:
            skipped.append(f"skipping {f}: {err}")
            continue
        found = f
        break
    instead = f"Resuming from {found} instead, the newest intact checkpoint." if found else "No intact checkpoint is left."
    for skip in skipped:
        warnings.warn(f"ckpt_path='last': {skip} {instead}", stacklevel=3)
    return found


_STEP = re.compile(r"step=(\d+)")


def _newest_first(path: str) -> tuple[int, bool, int]:
    """Newest first. A file's time has the kernel's clock tick (4 ms at HZ=250), so saves a few
    fast steps apart can tie: ``last.ckpt``, a hard link to the newest save, wins a tie, then the
    higher ``step=`` in the name (an epoch-end file and the step save after it, in one tick)."""
    name = os.path.basename(path)
    step = _STEP.search(name)
    return os.stat(path).st_mtime_ns, name == LAST, int(step.group(1)) if step else -1


def load_good(path: str, mmap: bool = False) -> dict[str, Any]:
    """``path`` loaded, if fit can resume from it."""
    ckpt = ckpt_io.load(path, mmap=mmap)
    if layout.is_weights_only(ckpt):
        raise CheckpointError(
            f"{path!r} holds the model's weights only (ModelCheckpoint(save_weights_only=True)), no optimizer or "
            "loop state, so fit cannot resume from it. Evaluate it with test(ckpt_path=...), or resume from a "
            "file saved with save_weights_only=False."
        )
    return ckpt
