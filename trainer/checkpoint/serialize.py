"""``torch.save`` with less Python per object and per tensor: the same bytes.

A checkpoint is mostly small tensors (a model's parameters and two Adam states for each) and
a few hundred small plain objects (Lightning's loop counters, the options, the RNG states).
``torch.save`` spends most of its time in Python: per object, in the ``persistent_id`` it gives
its pickler (two Python calls and an ``isinstance`` test for every int and string), and per
tensor, in ``Tensor.__reduce_ex__`` and its checks for tensors that are not plain (subclasses,
sparse, quantized, meta, other devices). An epoch-end checkpoint of a small model pays that
on the training thread (benchmarks/fit_cost.py). ``save`` writes the same zip archive with
torch's own writer, through a pickler whose ``persistent_id`` returns at once for the plain
types and otherwise does what torch's does, and which reduces a plain CPU tensor directly, to
what ``__reduce_ex__`` returns for it. The file is byte for byte the one ``torch.save`` writes
(tests/trainer/checkpoint/test_serialize.py compares them). A ``torch.save`` that code has
replaced (a wrapper, a mock that counts the saves) is called instead, as Lightning calls it.
"""

from __future__ import annotations

import collections
import io
import pickle
import sys
import types
from typing import IO, Any

import torch
from torch._utils import _rebuild_tensor_v2

_tensor_metadata = torch._C._get_tensor_metadata
_strided = torch.strided
_TypedStorage = torch.storage.TypedStorage
_OrderedDict = collections.OrderedDict
# The dtypes that torch pickles through _rebuild_tensor_v3 (e.g. the unsigned 16 to 64 bits).
_V3_DTYPES = frozenset(torch.storage._new_dtypes())
# Never a storage: persistent_id answers None for these without a look (most of a checkpoint).
_NOT_STORAGES = frozenset((dict, _OrderedDict, list, tuple, str, int, float, bool, type(None), torch.Tensor))
_serialization = torch.serialization
# torch.save's own pieces that ``save`` writes its archive with; a torch without one of them
# gets torch.save itself (with the faster tensor pickling).
_OWN_ARCHIVE = all(hasattr(_serialization, name) for name in (
    "_open_zipfile_writer", "_get_storage_alignment", "_serialization_tls", "location_tag", "normalize_storage_type",
))
# a torch.save that code replaces (a wrapper, a mock counting saves) is called, as in Lightning
_TORCH_SAVE = torch.save


class _Pickler(pickle.Pickler):
    def __init__(self, file: IO[bytes], protocol: int = _serialization.DEFAULT_PROTOCOL) -> None:
        super().__init__(file, protocol=protocol)
        self.storages: dict[str, torch.UntypedStorage] = {}  # by key, in the order torch writes them
        self._keys: dict[int, str] = {}
        self._dtypes: dict[int, torch.dtype] = {}

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) in _NOT_STORAGES:
            return None
        if isinstance(obj, _TypedStorage):  # what torch.serialization._save's persistent_id does
            storage, dtype, numel = obj._untyped_storage, obj.dtype, obj._size()
            storage_type = getattr(torch, obj._pickle_storage_type())
        elif torch.is_storage(obj):
            storage, dtype, numel = obj, torch.uint8, obj.nbytes()
            storage_type = _serialization.normalize_storage_type(type(obj))
        else:
            return None
        if storage.device.type != "meta" and storage.data_ptr() != 0:
            if self._dtypes.setdefault(storage.data_ptr(), dtype) != dtype:
                raise RuntimeError(
                    "Cannot save multiple tensors or storages that view the same data as different types"
                )
        key = self._keys.setdefault(storage._cdata, str(len(self._keys)))
        fake = getattr(obj, "_fake_device", None)
        self.storages[key] = storage
        location = str(fake) if fake is not None else _serialization.location_tag(storage)
        return ("storage", storage_type, key, location, numel)

    def reducer_override(self, obj: Any) -> Any:
        # What Tensor._reduce_ex_internal returns for a plain CPU tensor, without its
        # branches; anything else takes the usual path.
        if (
            type(obj) is not torch.Tensor or not obj.is_cpu or obj.layout is not _strided or obj.is_quantized
            or obj.dtype in _V3_DTYPES or obj._backward_hooks or _tensor_metadata(obj) or obj.__dict__
        ):
            return NotImplemented
        storage = _TypedStorage(wrap_storage=obj.untyped_storage(), dtype=obj.dtype, _internal=True)
        # A new OrderedDict per tensor, as torch writes it: a loaded tensor's hooks are its own.
        args = (storage, obj.storage_offset(), tuple(obj.size()), obj.stride(), obj.requires_grad, _OrderedDict())
        return _rebuild_tensor_v2, args


# What torch.save(pickle_module=...) reads: a Pickler class (which it subclasses) and a name.
_PICKLE_MODULE = types.SimpleNamespace(Pickler=_Pickler, __name__=__name__)


def save(obj: Any, f: str | IO[bytes]) -> None:
    """``torch.save(obj, f)``, faster for checkpoints of many small objects and tensors."""
    if torch.save is not _TORCH_SAVE or not _OWN_ARCHIVE or _serialization._serialization_tls.skip_data:
        torch.save(obj, f, pickle_module=_PICKLE_MODULE)
        return
    with _serialization._open_zipfile_writer(f) as archive:  # torch.save's records, in its order
        data = io.BytesIO()
        pickler = _Pickler(data)
        pickler.dump(obj)
        value = data.getvalue()
        archive.write_record("data.pkl", value, len(value))
        archive.write_record(".format_version", "1", len("1"))
        alignment = str(_serialization._get_storage_alignment())
        archive.write_record(".storage_alignment", alignment, len(alignment))
        archive.write_record("byteorder", sys.byteorder, len(sys.byteorder))
        for key, storage in pickler.storages.items():
            storage = storage if storage.device.type == "cpu" else storage.cpu()
            archive.write_record(f"data/{key}", storage, storage.nbytes())
