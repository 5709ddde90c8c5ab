"""A log file that cannot be written (a full disk, a quota, a file-size limit): an ``OSError``
that names the file and its folder, which the operating system's own message does not."""

from __future__ import annotations

import contextlib
import os
from typing import Iterator


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
