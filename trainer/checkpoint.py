"""Checkpoint files: atomic writes, safe loads, and the RNG states that make resume exact."""

from __future__ import annotations

import os
import pickle
import random
import tempfile
import zipfile
from typing import Any

import torch


class CheckpointError(ValueError):
    """A checkpoint file is missing, unreadable, unsafe, or does not fit the model."""


def save_atomic(obj: dict[str, Any], path: str | os.PathLike) -> None:
    """Write ``obj`` so that ``path`` is either the old file or the complete new one.

    temp file in the same directory -> flush -> fsync -> os.replace -> fsync the directory.
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    # Hidden, and not named *.ckpt: a write cut short must never pass for a checkpoint.
    fd, tmp = tempfile.mkstemp(prefix=f".tmp-{os.path.basename(path)}-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
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


def load(path: str | os.PathLike, map_location: Any = "cpu") -> dict[str, Any]:
    """Load with ``weights_only=True``: tensors and plain containers only, no code runs."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CheckpointError(f"ckpt_path={path!r} does not exist (or is not a file).")
    require_archive(path, repr(path))
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as err:
        raise CheckpointError(
            f"Refusing to load {path!r}: it holds pickled objects other than tensors and plain "
            f"containers, which could run code. Only weights_only=True loads are allowed. ({err})"
        ) from None
    except Exception as err:  # noqa: BLE001 - torch.load fails on foreign bytes in many ways (KeyError on text)
        raise CheckpointError(
            f"{path!r} is not a readable checkpoint (truncated, corrupt, or another kind of file): "
            f"{type(err).__name__}: {err}"
        ) from None
    if not isinstance(ckpt, dict) or "model" not in ckpt:
        raise CheckpointError(f"{path!r} is not a trainer checkpoint: it has no 'model' entry.")
    return ckpt


def require_archive(path: str, label: str) -> None:
    """torch.save writes a zip archive: anything else is another kind of file, or was cut off
    while being written. Cheap: reads only the end of the file."""
    if not zipfile.is_zipfile(path):
        raise CheckpointError(
            f"{label} is not a checkpoint: torch.save writes a zip archive and this file is not one "
            "(another kind of file, or cut off while being written). Pass a .ckpt file the Trainer wrote, or 'last'."
        )


# --- RNG states ----------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """Every generator a step may draw from, in a form ``weights_only`` loads."""
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {"python": [version, list(internal), gauss], "torch": torch.get_rng_state()}
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = [kind, torch.from_numpy(keys.astype("int64")), pos, has_gauss, cached]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        try:
            import numpy as np
        except ImportError:
            pass
        else:
            kind, keys, pos, has_gauss, cached = state["numpy"]
            np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def loader_generators(loader: Any) -> list[torch.Generator]:
    """The generators that decide a DataLoader's order, besides the global one."""
    found: list[torch.Generator] = []
    for owner in (loader, getattr(loader, "sampler", None), getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
        gen = getattr(owner, "generator", None)
        if isinstance(gen, torch.Generator) and all(gen is not g for g in found):
            found.append(gen)
    return found


def epoch_start_state(loader: Any) -> dict[str, Any]:
    """What re-creates an epoch's data order: the global torch RNG and the loader's generators,
    taken just before ``iter(loader)``."""
    return {"torch": torch.get_rng_state(), "generators": [g.get_state() for g in loader_generators(loader)]}


def set_epoch_start_state(loader: Any, state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    for gen, saved in zip(loader_generators(loader), state["generators"]):
        gen.set_state(saved)


def plain(value: Any) -> Any:
    """Hyperparameters as plain values (weights_only refuses arbitrary objects)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return repr(value)
