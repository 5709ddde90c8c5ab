"""Version folders: ``<save_dir>/<name>/version_<n>``, shared by the loggers and checkpoints."""

from __future__ import annotations

import os


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
