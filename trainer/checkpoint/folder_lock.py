"""One live run per checkpoint folder.

Two runs that write one folder (two relaunches with ``ckpt_path="last"``, or two runs with
``logger=False`` sharing ``<root>/checkpoints``) overwrite each other's ``last.ckpt`` and
delete each other's top-k files. So a fit holds an OS lock on each checkpoint folder it writes
(``flock`` on the folder itself: no file is added to it), from its ``setup`` to its
``teardown``. The kernel drops the lock when the process dies, so a run killed with
``kill -9`` leaves nothing stale. Platforms without ``flock`` (Windows) are not locked.
"""

from __future__ import annotations

import os
import weakref
from typing import TYPE_CHECKING, Any

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from trainer.trainer import Trainer

# In this process: folder (real path) -> (the open folder's descriptor, the Trainer holding it)
_held: dict[str, tuple[int, weakref.ref]] = {}


def lock_checkpoint_folder(trainer: Trainer, folder: str) -> None:
    """Lock ``folder`` for this fit (global rank 0 locks; every rank must call, and every
    rank raises if another live run holds it)."""
    strategy = trainer.strategy
    problem = _claim(folder, trainer) if strategy.is_global_zero else None
    if strategy.world_size > 1:
        problem = strategy.broadcast_object(problem)
    if problem is not None:
        raise RuntimeError(problem)


def unlock_checkpoint_folders(trainer: Trainer) -> None:
    """Release the folders ``trainer``'s fit locked (at its teardown, however it ended)."""
    for folder, (fd, owner) in list(_held.items()):
        if owner() is trainer:
            del _held[folder]
            os.close(fd)  # closing the last descriptor releases the flock


def _claim(folder: str, trainer: Trainer) -> str | None:
    if fcntl is None:
        return None
    key = os.path.realpath(folder)
    if key in _held:
        fd, owner = _held[key]
        holder = owner()
        if holder is None or holder is trainer or holder.state.stage != "fit":
            _held[key] = (fd, weakref.ref(trainer))  # this Trainer's again, or left by a fit that ended
            return None
        return _busy(folder, f"another Trainer in this process (pid {os.getpid()})")
    fd = os.open(key, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        pid = _lock_holder(key)
        return _busy(folder, "another process" + (f" (pid {pid})" if pid else ""))
    except OSError:  # a file system without locks (some network mounts): nothing to hold
        os.close(fd)
        return None
    _held[key] = (fd, weakref.ref(trainer))
    return None


def _busy(folder: str, who: str) -> str:
    return (
        f"The checkpoint folder {folder!r} is being written by a run that is still going: {who} holds its lock. "
        "Two runs writing one folder overwrite each other's checkpoints, so this one stops before training. Wait "
        "for that run to end (fit(ckpt_path='last') then resumes from its newest checkpoint), or give this run a "
        "folder of its own: Trainer(default_root_dir=...) or ModelCheckpoint(dirpath=...)."
    )


def _lock_holder(path: str) -> Any:
    """The pid holding a flock on ``path``, from Linux's /proc/locks; None where that is unknown."""
    try:
        st = os.stat(path)
        device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        with open("/proc/locks") as f:
            for line in f:
                fields = line.split()
                if "FLOCK" in fields and device in fields:
                    return int(fields[fields.index(device) - 1])
    except (OSError, ValueError, IndexError):
        pass
    return None
