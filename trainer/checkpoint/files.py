"""Checkpoint files: atomic writes, safe loads, and the RNG states that make resume exact."""

from __future__ import annotations

import collections
import io
import itertools
import os
import pickle
import shutil
import zipfile
from typing import Any

import torch

from trainer.checkpoint import layout, serialize


class CheckpointError(ValueError):
    """A checkpoint file is missing, unreadable, unsafe, or does not fit the model."""


class MissingCheckpoint(CheckpointError, FileNotFoundError):
    """A ``ckpt_path`` that does not exist: Lightning raises ``FileNotFoundError`` there."""


def save_atomic(obj: dict[str, Any] | Encoded, path: str | os.PathLike) -> None:
    """Write ``obj`` (or the bytes ``freeze`` made of it) so that ``path`` is either the old
    file or the complete new one, and only ever a file that ``torch.load(weights_only=True)``
    reads back.

    temp file in the same directory -> flush -> fsync -> check it loads (anything but plain
    tensors and containers is loaded back) -> os.replace -> fsync the directory.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    # Hidden, and not named *.ckpt: a write cut short must never pass for a checkpoint.
    fd, tmp = open_temp(directory, f".tmp-{os.path.basename(path)}-")
    try:
        if isinstance(obj, Encoded):  # os-level writes: each file object would add system calls
            try:
                view = memoryview(obj.data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
        else:
            with os.fdopen(fd, "wb") as f:
                serialize.save(obj, f)
                f.flush()
                os.fsync(f.fileno())
        # e.g. a numpy number in a callback's state: load it back to be sure
        if not isinstance(obj, Encoded) and not _plainly_loadable(obj):
            _check_loads(tmp, obj, path)
        os.replace(tmp, path)
    except BaseException as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(err, OSError) and err.errno is not None:
            # Same type and errno (callers may test them), plus what happened and what did not.
            raise type(err)(
                err.errno,
                f"Could not write the checkpoint {path!r}: {err.strerror or err}. The file there before (if any) "
                "is unchanged. Free disk space or choose another folder (ModelCheckpoint(dirpath=...)), then "
                "resume with fit(..., ckpt_path='last')",
            ) from err
        raise
    try:  # make the rename itself durable
        dir_fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


_temp_names = itertools.count()


def temp_path(directory: str, prefix: str) -> str:
    """``<directory>/<prefix><pid>-<n>``: a name no other thread (the counter) or process
    (the pid) of ours uses; one left by a killed process with the same pid may exist."""
    return os.path.join(directory, f"{prefix}{os.getpid()}-{next(_temp_names)}")


def open_temp(directory: str, prefix: str) -> tuple[int, str]:
    """A new file ``<directory>/<prefix><pid>-<n>``, opened for writing (the folder made if
    missing): what ``tempfile.mkstemp`` does, in one system call where it makes three or
    more. The writer thread makes them, and each one hands the GIL back and forth with
    training (benchmarks/epoch_cost.py)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    for _ in range(1000):
        name = temp_path(directory, prefix)
        try:
            return os.open(name, flags, 0o600), name
        except FileExistsError:  # left by an earlier process with this pid
            continue
        except FileNotFoundError:
            os.makedirs(directory, exist_ok=True)
    raise FileExistsError(f"Could not create a temporary file in {directory!r}: every name tried exists.")


class Encoded:
    """A checkpoint already serialized by ``torch.save``: ``save_atomic`` writes its bytes."""

    __slots__ = ("data",)

    def __init__(self, data: memoryview) -> None:
        self.data = data


_PLAIN_LEAVES = frozenset((type(None), bool, int, float, str, bytes, torch.dtype, torch.device, torch.Size))
_PLAIN_TENSORS = frozenset((torch.Tensor, torch.nn.Parameter))


def _plainly_loadable(value: Any) -> bool:
    """True if ``value`` holds only what ``torch.load(weights_only=True)`` always reads back:
    tensors, plain numbers and strings, dtypes, and dicts, lists and tuples of them. A walk,
    about 20x cheaper than loading the file back, which is left for anything else."""
    return plain_size(value) is not None


def plain_size(value: Any, cpu_only: bool = False) -> int | None:
    """The bytes of the tensors' storages in ``value`` if it is plainly loadable (and, with
    ``cpu_only``, all its tensors are on the CPU), else None."""
    kind = type(value)
    if kind in _PLAIN_TENSORS:
        return None if cpu_only and not value.is_cpu else value.untyped_storage().nbytes()
    if kind in _PLAIN_LEAVES:
        return 0
    if kind is dict or kind is collections.OrderedDict:
        for k in value:
            if type(k) not in _PLAIN_LEAVES:
                return None
        value = value.values()
    elif kind is not list and kind is not tuple:
        return None
    total = 0
    # Leaves and tensors are looked at here, not in a call each: an epoch-end checkpoint is
    # hundreds of them (the loop counters), walked on the training thread (benchmarks/fit_cost.py).
    for v in value:
        kind = type(v)
        if kind in _PLAIN_LEAVES:
            continue
        if kind in _PLAIN_TENSORS:
            if cpu_only and not v.is_cpu:
                return None
            total += v.untyped_storage().nbytes()
            continue
        size = plain_size(v, cpu_only)
        if size is None:
            return None
        total += size
    return total


def _check_loads(tmp: str, obj: dict[str, Any], path: str) -> None:
    """Refuse now, not at resume time, a checkpoint that only an unsafe load could read:
    e.g. a callback's state holding a numpy float."""
    try:
        torch.load(tmp, map_location="cpu", weights_only=True, mmap=True)  # reads the structure only
    except pickle.UnpicklingError as err:
        where, kind = _first_unloadable(obj, "checkpoint")
        raise CheckpointError(
            f"Not writing {path!r}: {where} is a {kind}, which torch.load(weights_only=True) refuses "
            f"({_unpickler_reason(err)}). Keep plain Python values and tensors in checkpoints, "
            "e.g. float(x) for a numpy number or torch.as_tensor(a) for an array."
        ) from None


def _first_unloadable(value: Any, where: str) -> tuple[str, str]:
    """The path of the first entry that does not survive a weights_only round trip (slow; errors only)."""
    children: list[tuple[str, Any]] = []
    if isinstance(value, dict):
        children = [(f"{where}[{k!r}]", v) for k, v in value.items()]
    elif isinstance(value, (list, tuple)):
        children = [(f"{where}[{i}]", v) for i, v in enumerate(value)]
    for child_where, child in children:
        if not _round_trips(child):
            return _first_unloadable(child, child_where)
    return where, type(value).__module__ + "." + type(value).__qualname__


def _round_trips(value: Any) -> bool:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    try:
        torch.load(buffer, weights_only=True)
    except pickle.UnpicklingError:
        return False
    return True


def load(
    path: str | os.PathLike, map_location: Any = "cpu", mmap: bool = False, weights_only: bool = True
) -> dict[str, Any]:
    """Load with ``weights_only=True``: tensors and plain containers only, no code runs
    (``weights_only=False``, for a file one trusts, unpickles anything in it). Any layout this
    project reads (its own, Lightning's, its 0.1 one) comes back in today's (``layout.read``).

    ``mmap=True`` reads the structure and maps the tensors without reading them: a cheap
    check that a file is complete and safe.
    """
    path = os.fspath(path)  # a URL: paths.local_file gives its local copy first
    if is_sharded(path):  # a folder: its meta file here, its tensors through torch.distributed.checkpoint
        from trainer.checkpoint.sharded_read import check_metadata  # imports DCP: only for folders

        check_metadata(path)  # DCP would unpickle it unchecked
        ckpt = _load_file(os.path.join(path, SHARDED_META), map_location, mmap, weights_only)
        if not isinstance(ckpt, dict) or not ({"loop", "loops", layout.KEY} & set(ckpt)):
            raise CheckpointError(f"{path!r} is not a trainer checkpoint: its {SHARDED_META} holds no training state.")
        ckpt = layout.read(ckpt)
        layout.ours(ckpt)["sharded"] = path
        return ckpt
    ckpt = _load_file(path, map_location, mmap, weights_only)
    if not isinstance(ckpt, dict) or not ({"state_dict", "model"} & set(ckpt)):
        raise CheckpointError(
            f"{path!r} is not a trainer checkpoint: it has no 'state_dict' entry (the model's weights, where "
            "Lightning and this project put them)."
        )
    return layout.read(ckpt)


def _load_file(path: str, map_location: Any, mmap: bool, weights_only: bool = True) -> Any:
    if not os.path.isfile(path):
        raise MissingCheckpoint(
            f"Checkpoint file not found: {path}. ckpt_path={path!r} does not exist (or is not a file)."
        )
    require_archive(path, repr(path))  # also what lets torch.load map it
    from trainer.checkpoint.integrity import verify  # integrity sits beside this module, and imports it

    verify(path)  # torch.load does not check the CRCs: a flipped bit would load silently
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=weights_only, mmap=mmap)
    except pickle.UnpicklingError as err:
        raise CheckpointError(
            f"Refusing to load {path!r}: it holds pickled objects other than tensors and plain "
            f"containers, which could run code, and checkpoints are only loaded with weights_only=True. "
            f"({_unpickler_reason(err)}) Only load a file like this with torch.load(weights_only=False) "
            "if you trust where it came from."
        ) from None
    except Exception as err:  # noqa: BLE001 - torch.load fails on foreign bytes in many ways (KeyError on text)
        raise CheckpointError(
            f"{path!r} is not a readable checkpoint (truncated, corrupt, or another kind of file): "
            f"{type(err).__name__}: {err}"
        ) from None
    return ckpt


#: In a sharded checkpoint folder (``FSDPStrategy(checkpoint="sharded")``): everything but the
#: model's and the optimizers' tensors, which ``torch.distributed.checkpoint`` wrote beside it.
SHARDED_META = "meta.pt"


def is_sharded(path: str | os.PathLike) -> bool:
    return os.path.isdir(path) and os.path.isfile(os.path.join(path, SHARDED_META))


def _unpickler_reason(err: Exception) -> str:
    """The sentence of torch's long weights_only message that names what was refused."""
    text = str(err)
    if "WeightsUnpickler error:" in text:
        reason = text.split("WeightsUnpickler error:", 1)[1].strip().splitlines()[0]
        return reason.split(" Please use")[0]  # drop the advice to allowlist it
    boilerplate = ("Weights only load failed", "Check the documentation", "Please file an issue")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    useful = [line for line in lines if not line.startswith(boilerplate)]
    return (useful or lines or [type(err).__name__])[0]


def require_archive(path: str, label: str) -> None:
    """torch.save writes a zip archive: anything else is another kind of file, or was cut off
    while being written. Cheap: reads only the end of the file."""
    if not zipfile.is_zipfile(path):
        raise CheckpointError(
            f"{label} is not a checkpoint: torch.save writes a zip archive and this file is not one "
            "(another kind of file, or cut off while being written). Pass a .ckpt file the Trainer wrote, or 'last'."
        )


def plain(value: Any) -> Any:
    """Hyperparameters as plain values (weights_only refuses arbitrary objects)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return repr(value)


def replace_folder(new: str, path: str) -> None:
    """Put the complete folder ``new`` at ``path``. What was there (a folder, a link or a file) is
    first renamed aside and deleted after: a crash in between leaves no ``path``, never a half one."""
    old = None
    if os.path.lexists(path):
        old = os.path.join(os.path.dirname(path), f".tmp-old-{os.path.basename(path)}-{os.getpid()}")
        os.replace(path, old)
    os.replace(new, path)
    if old is not None:
        remove(old)


def remove(path: str) -> None:
    """Delete a checkpoint: a file, a link, or a sharded checkpoint's folder."""
    try:
        os.unlink(path)  # a file or a link: one system call
    except FileNotFoundError:
        pass
    except (IsADirectoryError, PermissionError):  # a folder (PermissionError on macOS)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            raise


def is_url(path: str) -> bool:
    return path.startswith(("http://", "https://"))
