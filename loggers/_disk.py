"""A log file that cannot be written (a full disk, a quota, a file-size limit): an ``OSError``
that names the file and its folder, which the operating system's own message does not; and the
filesystem of a remote log folder (``s3://...``, ``memory://...``), through fsspec."""

from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator


_SAYS = "Could not write the log file"


def write_error(path: str, err: OSError) -> OSError:
    """An ``OSError`` with ``err``'s ``errno``, whose message names the log file and its folder."""
    if (err.strerror or "").startswith(_SAYS):  # named already, by a write inside this one
        return err
    folder, name = os.path.split(os.path.abspath(path))
    reason = err.strerror or str(err)
    return OSError(
        err.errno,
        f"{_SAYS} {name!r} in the folder {folder!r}: {reason}. What the logger wrote before "
        "is kept, and checkpoints are written apart. Free space there or log to another folder (the logger's "
        "save_dir), then resume with fit(..., ckpt_path='last').",
    )


@contextlib.contextmanager
def naming(path: str, tmp: str | None = None) -> Iterator[None]:
    """An ``OSError`` inside becomes :func:`write_error`'s; ``tmp``, a file written to be renamed
    to ``path``, is removed: a failed write leaves the file as it was and nothing beside it."""
    try:
        yield
    except OSError as err:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.remove(tmp)
        raise write_error(path, err) from err


def remote_fs(path: str) -> Any:
    """fsspec's filesystem for a path with a protocol (``s3://bucket/logs``), as Lightning's loggers
    write there; None for a local path (written with ``os``: no fsspec needed)."""
    if "://" not in str(path) or str(path).startswith("file://"):
        return None
    try:
        import fsspec  # only for a remote folder
    except ImportError:
        raise ModuleNotFoundError(
            f"The log folder {str(path)!r} is on a remote filesystem, which needs fsspec: pip install fsspec "
            "(or pip install 'steadytrainer[remote]'), plus the filesystem's own package (s3fs, gcsfs, adlfs)."
        ) from None
    return fsspec.core.url_to_fs(str(path))[0]
