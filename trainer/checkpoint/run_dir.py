"""The run folder: ``<log_dir>/<name>/version_<n>``, shared by TensorBoard and checkpoints."""

from __future__ import annotations

import os


def run_dir(log_dir: str, name: str, resume_path: str | None) -> str:
    """``<log_dir>/<name>/version_<n>``: the resumed run's own folder, or the next free one."""
    base = os.path.abspath(os.path.join(log_dir, name))
    if resume_path is not None:
        version_dir = os.path.dirname(os.path.dirname(os.path.abspath(resume_path)))
        if os.path.dirname(version_dir) == base and os.path.basename(version_dir).startswith("version_"):
            return version_dir
    try:
        os.makedirs(base, exist_ok=True)
    except OSError as err:
        raise type(err)(
            err.errno,
            f"Cannot create the run folder {base!r} for Trainer(log_dir={log_dir!r}, name={name!r}): "
            f"{err.strerror or err}. Pick a writable log_dir, or log_dir=None to turn logging off.",
        ) from None
    taken = [int(d[8:]) for d in os.listdir(base) if d.startswith("version_") and d[8:].isdigit()]
    n = max(taken, default=-1) + 1
    while True:  # another run may take the same number between listdir and mkdir
        try:
            os.mkdir(os.path.join(base, f"version_{n}"))
            return os.path.join(base, f"version_{n}")
        except FileExistsError:
            n += 1
