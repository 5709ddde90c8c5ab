"""Reading a sharded checkpoint folder (``FSDPStrategy(checkpoint="sharded")``) without running
code from it.

``torch.distributed.checkpoint`` unpickles a folder's ``.metadata`` with plain ``pickle.load``
and its non-tensor entries with ``torch.load(weights_only=False)``: a folder from elsewhere
could run anything. Here ``.metadata`` goes through an unpickler that builds only the classes
that metadata is made of (torch's own dataclasses, sizes, dtypes, paths), and the entries
through ``weights_only=True``. Every sharded read of ours goes through :func:`load_shards` and
:func:`saved_keys`; :func:`check_metadata` refuses a bad folder before anything else is read.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import io
import os
import pickle
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from trainer.checkpoint.files import CheckpointError

METADATA = ".metadata"  # torch.distributed.checkpoint's name; one per rank is "__<rank>.metadata"
_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_ALLOWED = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),  # where each entry's bytes are
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a layout by name: torch.strided
    ("collections", "OrderedDict"),
    *(
        (module, cls) for module in ("pathlib", "pathlib._local")
        for cls in ("Path", "PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath")
    ),
}


class _MetadataUnpickler(pickle.Unpickler):
    """Builds torch.distributed.checkpoint's metadata classes and nothing else."""

    def __init__(self, file: Any, path: str) -> None:
        super().__init__(file)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        if module == _METADATA_MODULE:
            found = getattr(importlib.import_module(module), name, None)
            if isinstance(found, type) and found.__module__ == module and (
                dataclasses.is_dataclass(found) or issubclass(found, enum.Enum)
            ):
                return found
        raise CheckpointError(
            f"Refusing to load {self.path!r}: it holds a pickled {module}.{name}, which is not one of the classes "
            "torch.distributed.checkpoint's metadata is made of, and unpickling it could run code. A sharded "
            "checkpoint's metadata only ever holds those. Load this folder only if you trust where it came from, "
            "with torch.distributed.checkpoint directly."
        )

    def persistent_load(self, pid: Any) -> Any:
        raise CheckpointError(f"Refusing to load {self.path!r}: it holds a persistent id, which metadata never does.")


def read_metadata(path: str) -> Metadata:
    """The ``Metadata`` in the file ``path``, unpickled with only its own classes allowed."""
    try:
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(f, path).load()
    except CheckpointError:
        raise
    except OSError as err:
        raise CheckpointError(f"Cannot read {path!r}: {err.strerror or err}.") from None
    except Exception as err:  # noqa: BLE001 - a damaged pickle fails in many ways
        raise CheckpointError(
            f"{path!r} is not readable metadata (damaged or another kind of file): {type(err).__name__}: {err}"
        ) from None
    if not isinstance(metadata, Metadata):
        raise CheckpointError(
            f"{path!r} is not torch.distributed.checkpoint metadata: it holds a {type(metadata).__name__}."
        )
    return metadata


def check_metadata(folder: str) -> None:
    """Refuse ``folder`` if one of its metadata files holds anything but metadata (before
    torch reads any of it)."""
    names = sorted(n for n in os.listdir(folder) if n.endswith(METADATA))  # ".metadata" is hidden: no glob
    if not names:
        raise CheckpointError(f"{folder!r} is not a complete sharded checkpoint: it has no {METADATA} file.")
    for name in names:
        read_metadata(os.path.join(folder, name))


class _Reader(FileSystemReader):
    """torch's reader, with the metadata read by :func:`read_metadata`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_metadata(os.fspath(self._get_metadata_path(kwargs.get("rank"))))
        if getattr(metadata, "storage_meta", None) is None:  # as torch's own read_metadata does
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _Planner(DefaultLoadPlanner):
    """torch's planner, with the entries that are not tensors (param groups' numbers, ...)
    loaded with ``weights_only=True``."""

    def __init__(self, folder: str) -> None:
        super().__init__()
        self.folder = folder

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        try:
            obj = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as err:
            raise CheckpointError(
                f"Refusing to load the sharded checkpoint {self.folder!r}: its entry {read_item.dest_index.fqn!r} "
                f"holds pickled objects other than tensors and plain values, which could run code ({err})."
            ) from None
        plain = io.BytesIO()
        torch.save(obj, plain)  # what torch's planner reads next: plain values only
        plain.seek(0)
        super().load_bytes(read_item, plain)


def load_shards(state: dict[str, Any], folder: str, **kwargs: Any) -> None:
    """``torch.distributed.checkpoint.load(state, checkpoint_id=folder)``, reading no code."""
    dcp.load(state, checkpoint_id=folder, storage_reader=_Reader(folder), planner=_Planner(folder), **kwargs)


def saved_keys(folder: str) -> set[str]:
    """The keys the folder holds, e.g. ``"optimizer_states.0.state.net.0.weight.exp_avg"``."""
    return set(read_metadata(os.path.join(folder, METADATA)).state_dict_metadata)
