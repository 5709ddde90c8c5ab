"""Version folders: ``<save_dir>/<name>/version_<n>``, shared by the loggers and checkpoints."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.trainer import Trainer


def resumed_version(base: str, resume_path: str | None) -> str | None:
    """The version folder's name (``version_<n>``) when ``resume_path`` is a checkpoint in
    ``<base>/version_<n>/checkpoints/``: a resumed run carries on in its own folder."""
    if resume_path is None:
        return None
    version_dir = os.path.dirname(os.path.dirname(os.path.abspath(resume_path)))
    if os.path.dirname(version_dir) == os.path.abspath(base) and os.path.basename(version_dir).startswith("version_"):
        return os.path.basename(version_dir)
    return None


def claim_version(base: str, what: str) -> int:
    """The next free ``n`` of ``<base>/version_<n>``, whose folder this makes (so that two
    loggers or two runs starting at once never share one). ``what`` names the option, for errors."""
    base = os.path.abspath(base)
    try:
        os.makedirs(base, exist_ok=True)
    except OSError as err:
        raise type(err)(
            err.errno,
            f"Cannot create the run folder {base!r} for {what}: {err.strerror or err}. Pick a writable folder, "
            "or turn logging off with Trainer(logger=False) (or log_dir=None).",
        ) from None
    taken = [int(d[8:]) for d in os.listdir(base) if d.startswith("version_") and d[8:].isdigit()]
    n = max(taken, default=-1) + 1
    while True:  # another run may take the same number between listdir and mkdir
        try:
            os.mkdir(os.path.join(base, f"version_{n}"))
            return n
        except FileExistsError:
            n += 1


# --- the run folder ------------------------------------------------------------------------
def resolve_run_dir(trainer: Trainer, resume_path: str | None, fit: bool) -> tuple[str | None, str | None, list[Any]]:
    """On global rank 0, before a stage: (the run folder, where checkpoints go under;
    ``trainer.log_dir``; the loggers' versions). A fit picks each file logger's version
    folder: the resumed run's own when ``resume_path`` lies in one, else the next free one
    (the Trainer's default logger takes a new one at each fit). The run folder is Lightning's
    ``<save_dir>/<name>/<version>`` of the first logger; without a logger, ``log_dir``."""
    root = trainer.default_root_dir
    if not trainer.loggers:
        return None if root is None else os.path.abspath(root), root, []
    for lg in trainer.loggers:
        # Logger.prepare_stage: a file logger picks its version folder for a fit; the others' runs start
        # now, as in Lightning (an MLflow or W&B run, whose ids name the folder)
        prepare = getattr(type(lg), "prepare_stage", None)  # on the class: a Mock answers any name
        if prepare is not None:
            prepare(lg, resume_path, fit=fit)
        else:  # an object that logs like a Logger without being one
            getattr(lg, "experiment", None)
    first = trainer.loggers[0]
    version = first.version
    folder = version if isinstance(version, str) else f"version_{version}"
    save_dir = first.save_dir or root or os.getcwd()
    name = "" if first.name is None else str(first.name)  # str(): as Lightning joins any logger's name
    run_dir = os.path.abspath(os.path.join(save_dir, name, folder))
    return run_dir, getattr(first, "log_dir", None) or first.save_dir or root or run_dir, logger_versions(trainer)


def logger_versions(trainer: Trainer) -> list[Any]:
    return [getattr(lg, "chosen_version", None) if hasattr(type(lg), "chosen_version") else None
            for lg in trainer.loggers]


def set_logger_versions(trainer: Trainer, versions: list[Any]) -> None:
    for lg, version in zip(trainer.loggers, versions):
        if version is not None and hasattr(type(lg), "use_version"):
            lg.use_version(version)
