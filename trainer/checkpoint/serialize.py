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

A big model's checkpoint is the other way round: a few large tensors, and most of torch.save's
time goes to the CRC-32 of every record, which torch's zip writer computes with miniz's own
code, several times slower than zlib's. For a checkpoint of large tensors, ``save`` tells the
writer not to compute them and fills them in as the bytes go by (``_CrcFiller``), with
``zlib.crc32`` outside the GIL: the same bytes, which torch.load, zipfile and
``integrity.verify`` check.
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import struct
import sys
import types
import zlib
from typing import IO, Any

import torch
from torch._utils import _rebuild_tensor_v2

_tensor_metadata = torch._C._get_tensor_metadata
_strided = torch.strided
_TypedStorage = torch.storage.TypedStorage
_OrderedDict = collections.OrderedDict
# The dtypes that torch pickles through _rebuild_tensor_v3 (e.g. the unsigned 16 to 64 bits).
_V3_DTYPES = frozenset(torch.storage._new_dtypes())
# Never a storage: persistent_id answers None for these without a look (most of a checkpoint). The
# answer depends on the type alone, so each other type found not to be one joins them (torch.Size,
# torch.dtype, the functions that rebuild tensors): one set lookup per object after the first.
_NOT_STORAGES = {dict, _OrderedDict, list, tuple, str, int, float, bool, type(None), torch.Tensor}
_serialization = torch.serialization
# torch.save's own pieces that ``save`` writes its archive with; a torch without one of them
# gets torch.save itself (with the faster tensor pickling).
_OWN_ARCHIVE = all(hasattr(_serialization, name) for name in (
    "_open_zipfile_writer", "_get_storage_alignment", "_serialization_tls", "location_tag", "normalize_storage_type",
))
# a torch.save that code replaces (a wrapper, a mock counting saves) is called, as in Lightning
_TORCH_SAVE = torch.save


class _Storage:
    """What ``reducer_override`` pickles for a plain CPU tensor's storage in place of the
    ``TypedStorage`` torch's reduction makes: ``persistent_id`` writes for it the id torch's
    writes for that ``TypedStorage``, without building one (two Python calls and its checks) or
    asking it its size and type (five more), per tensor of every checkpoint."""

    __slots__ = ("dtype", "storage")

    def __init__(self, storage: torch.UntypedStorage, dtype: torch.dtype) -> None:
        self.storage, self.dtype = storage, dtype


# dtype -> (the storage class torch's persistent id names, the element size), as TypedStorage says.
_STORAGE_INFO: dict[torch.dtype, tuple[Any, int]] = {}


def _storage_info(storage: torch.UntypedStorage, dtype: torch.dtype) -> tuple[Any, int]:
    typed = _TypedStorage(wrap_storage=storage, dtype=dtype, _internal=True)
    info = _STORAGE_INFO[dtype] = (getattr(torch, typed._pickle_storage_type()), typed._element_size())
    return info


class _Pickler(pickle.Pickler):
    def __init__(self, file: IO[bytes], protocol: int = _serialization.DEFAULT_PROTOCOL) -> None:
        super().__init__(file, protocol=protocol)
        self.storages: dict[str, torch.UntypedStorage] = {}  # by key, in the order torch writes them
        self._keys: dict[int, str] = {}
        self._dtypes: dict[int, torch.dtype] = {}
        # torch.save(pickle_module=...) subclasses this with its own persistent_id, which knows no _Storage
        self._marks = type(self).persistent_id is _OUR_PERSISTENT_ID

    def persistent_id(self, obj: Any) -> Any:
        kind = type(obj)
        if kind in _NOT_STORAGES:
            return None
        if kind is _Storage:  # a plain CPU tensor's (reducer_override): what follows, for its TypedStorage
            storage, dtype = obj.storage, obj.dtype
            storage_type, element_size = _STORAGE_INFO.get(dtype) or _storage_info(storage, dtype)
            numel, fake = storage.nbytes() // element_size, None
        elif isinstance(obj, _TypedStorage):  # what torch.serialization._save's persistent_id does
            storage, dtype, numel = obj._untyped_storage, obj.dtype, obj._size()
            storage_type = getattr(torch, obj._pickle_storage_type())
            fake = getattr(obj, "_fake_device", None)
        elif torch.is_storage(obj):
            storage, dtype, numel = obj, torch.uint8, obj.nbytes()
            storage_type = _serialization.normalize_storage_type(type(obj))
            fake = getattr(obj, "_fake_device", None)
        else:
            _NOT_STORAGES.add(kind)
            return None
        if storage.device.type != "meta" and storage.data_ptr() != 0:
            if self._dtypes.setdefault(storage.data_ptr(), dtype) != dtype:
                raise RuntimeError(
                    "Cannot save multiple tensors or storages that view the same data as different types"
                )
        key = self._keys.setdefault(storage._cdata, str(len(self._keys)))
        self.storages[key] = storage
        location = str(fake) if fake is not None else _serialization.location_tag(storage)
        return ("storage", storage_type, key, location, numel)

    def reducer_override(self, obj: Any) -> Any:
        # What Tensor._reduce_ex_internal returns for a plain CPU tensor, without its
        # branches; anything else takes the usual path.
        if type(obj) is _OrderedDict and not obj and not obj.__dict__:
            # Each tensor's empty hooks: what OrderedDict.__reduce_ex__ returns for one, without its
            # look for slots (a Python call, copyreg's, every time: it cannot cache them on a built-in type).
            return _OrderedDict, (), None, None, iter(())
        if (
            type(obj) is not torch.Tensor or not obj.is_cpu or obj.layout is not _strided or obj.is_quantized
            or obj.dtype in _V3_DTYPES or obj._backward_hooks or _tensor_metadata(obj) or obj.__dict__
        ):
            return NotImplemented
        if self._marks:
            storage: Any = _Storage(obj.untyped_storage(), obj.dtype)
        else:
            storage = _TypedStorage(wrap_storage=obj.untyped_storage(), dtype=obj.dtype, _internal=True)
        # A new OrderedDict per tensor, as torch writes it: a loaded tensor's hooks are its own.
        args = (storage, obj.storage_offset(), tuple(obj.size()), obj.stride(), obj.requires_grad, _OrderedDict())
        return _rebuild_tensor_v2, args


_OUR_PERSISTENT_ID = _Pickler.persistent_id


# What torch.save(pickle_module=...) reads: a Pickler class (which it subclasses) and a name.
_PICKLE_MODULE = types.SimpleNamespace(Pickler=_Pickler, __name__=__name__)


def save(obj: Any, f: str | IO[bytes]) -> None:
    """``torch.save(obj, f)``, faster for checkpoints of many small objects and tensors; for one of
    large tensors, with their CRC-32s computed by zlib outside the GIL (``_CrcFiller``). A file
    object always gets the CRC-32s, which ``integrity.verify`` checks, whatever torch's
    process-wide ``config.save.compute_crc32`` says."""
    if torch.save is not _TORCH_SAVE or not _OWN_ARCHIVE or _serialization._serialization_tls.skip_data:
        torch.save(obj, f, pickle_module=_PICKLE_MODULE)
        return
    data = io.BytesIO()  # pickled before the archive is opened: the same bytes, and none written if it fails
    pickler = _Pickler(data)
    pickler.dump(obj)
    records = (data.getvalue(), pickler.storages)
    if isinstance(f, (str, os.PathLike)):  # torch names the archive in a file after the file: its writer
        _write_records(_serialization._open_zipfile_writer(f), *records)
        return
    seekable = getattr(f, "seekable", None)
    if seekable is not None and seekable() and _worth_filling(pickler.storages):
        start, filler = f.tell(), _CrcFiller(f)
        _write_records(_Archive(filler, compute_crc32=False), *records)
        if filler.ended and filler.confused is None:
            return
        f.seek(start)  # a zip layout the filler does not know (a later torch): again, with torch's CRCs
        f.truncate()
    _write_records(_Archive(f, compute_crc32=True), *records)


# The filler costs some Python per record and saves most of the CRC's time per byte: it is used
# where the tensors hold at least this many bytes per record on average.
FILL_MIN_RECORD_BYTES = 64 << 10


def _worth_filling(storages: dict[str, torch.UntypedStorage]) -> bool:
    return sum(s.nbytes() for s in storages.values()) >= FILL_MIN_RECORD_BYTES * (len(storages) + 6)


def _write_records(opened: Any, pickled: bytes, storages: dict[str, torch.UntypedStorage]) -> None:
    with opened as archive:  # torch.save's records, in its order
        archive.write_record("data.pkl", pickled, len(pickled))
        archive.write_record(".format_version", "1", len("1"))
        alignment = str(_serialization._get_storage_alignment())
        archive.write_record(".storage_alignment", alignment, len(alignment))
        archive.write_record("byteorder", sys.byteorder, len(sys.byteorder))
        for key, storage in storages.items():
            storage = storage if storage.device.type == "cpu" else storage.cpu()
            archive.write_record(f"data/{key}", storage, storage.nbytes())


class _Archive:
    """torch's zip writer over the file ``out``, as torch.save opens it for a buffer, but told itself
    whether to compute the CRC-32s: torch's ``config.save.compute_crc32`` is the whole process's,
    and a ``torch.save`` on the training thread meanwhile would follow a change to it."""

    def __init__(self, out: Any, compute_crc32: bool) -> None:
        self.out = out
        alignment = _serialization._get_storage_alignment()
        try:
            self.writer = torch._C.PyTorchFileWriter(out, compute_crc32, alignment)
        except TypeError:  # a torch whose writer takes no such options: its own (a filler then refills its CRCs)
            self.writer = _serialization._open_zipfile_writer(out).file_like

    def __enter__(self) -> Any:
        return self.writer

    def __exit__(self, *exc: object) -> None:
        self.writer.write_end_of_file()  # as torch's opener does, on an error too
        self.out.flush()


_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")  # signature, versions, flags, method, time, date, crc, sizes, lengths
_CENTRAL_HEADER = struct.Struct("<4s12xI8xHHH12x")  # signature, crc, the name's, extra's and comment's lengths
_LOCAL, _DESCRIPTOR, _CENTRAL = b"PK\x03\x04", b"PK\x07\x08", b"PK\x01\x02"
_HAS_DESCRIPTOR = 0x08  # flag bit 3: the CRC and sizes follow the data
_ID_RECORD = b"/.data/serialization_id"
_MASK64 = (1 << 64) - 1


def _hash_combine(seed: int, value: int) -> int:
    """c10::hash_combine on 64 bits: how torch folds each record's CRC into the archive's serialization id."""
    return seed ^ ((value + 0x9E3779B9 + (seed << 6) + (seed >> 2)) & _MASK64)


class _CrcFiller:
    """A file for torch's zip writer, told not to compute CRC-32s, that passes what it writes on to
    ``out`` with the CRC-32s filled in: the bytes torch.save writes.

    torch computes them with miniz's own CRC-32, several times slower than zlib's; ``zlib.crc32``
    here reads the bytes the writer hands over (a tensor's own memory) outside the GIL (it releases
    it above 5 KiB). torch writes each record as a local header, its name, its extra field, its
    data (one write for a tensor), then, for a record with data, a data descriptor holding the
    CRC, which is filled in on its way; the central directory (one write, at the end) repeats
    every record's CRC, filled in too; and the record ``.data/serialization_id`` ends with 20
    digits of torch's fold of the descriptors' CRCs (``_hash_combine``; with its quirk: any write
    of 8 bytes or more that starts like a descriptor is folded in), rewritten before its own CRC
    is taken.

    The state is the method ``write`` is bound to: torch's writer looks ``write`` up for every
    write, so each one costs one Python call, and what follows the central directory goes straight
    to ``out.write``. Anything unexpected (a layout from a later torch) sets ``confused`` to what
    was seen and passes the rest on as it is, for ``save`` to write the archive again with
    torch's CRCs.
    """

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.confused: str | None = None
        self.ended = False  # the central directory went by
        self._names: list[bytes] = []  # the records, in order
        self._crcs: list[int] = []  # and their CRC-32s
        self._fold = 0  # torch's fold of the descriptors' CRCs, for the serialization id
        self._name = bytearray()  # the current record's name, as it comes
        self._name_left = self._extra_left = 0  # bytes of the current local header's name and extra field to come
        self._has_descriptor = False
        self._crc = self._size = 0  # of the current record's data so far
        self.write = self._header

    def flush(self) -> None:
        self.out.flush()

    def _confuse(self, data: memoryview | bytes, what: str) -> int:
        self.confused, self.write = what, self.out.write
        return self.out.write(data)

    def _header(self, data: memoryview) -> int:
        """A record's local header, or the central directory."""
        if data[:4] == _CENTRAL:
            self.ended, self.write = True, self.out.write
            return self.out.write(self._central_directory(data))
        if data[:4] != _LOCAL or len(data) != _LOCAL_HEADER.size:
            return self._confuse(data, f"a write of {len(data)} bytes where a local header was due")
        _, _, flags, _, _, _, crc, packed, size, name_len, extra_len = _LOCAL_HEADER.unpack(data)
        if not name_len:
            return self._confuse(data, "a record without a name")
        self._name_left, self._extra_left, self._name = name_len, extra_len, bytearray()
        self._crc = self._size = 0
        self._has_descriptor = bool(flags & _HAS_DESCRIPTOR)
        if not self._has_descriptor:  # an empty record: its CRC (0) and sizes are in the header
            if crc or packed or size:
                return self._confuse(data, f"a record with data but no data descriptor (flags {flags:#x})")
            self._crcs.append(0)
        self.write = self._name_and_extra
        return self.out.write(data)

    def _name_and_extra(self, data: memoryview) -> int:
        """The bytes of the record's name and extra field (the padding that aligns its data)."""
        if len(data) > self._name_left + self._extra_left:
            return self._confuse(data, "a name and extra field longer than their header says")
        name = data[:self._name_left]
        if name:
            self._name += name
            self._name_left -= len(name)
            if not self._name_left:
                self._names.append(bytes(self._name))
        self._extra_left -= len(data) - len(name)
        if not self._name_left and not self._extra_left:
            self.write = self._header if not self._has_descriptor else (
                self._serialization_id if self._name.endswith(_ID_RECORD) else self._data)
        return self.out.write(data)

    def _data(self, data: memoryview) -> int:
        """The record's data, or, after it, its data descriptor."""
        size = len(data)
        if self._size and (size == 16 or size == 24) and data[:4] == _DESCRIPTOR:  # (an empty record has none)
            fields = struct.unpack("<4sIII" if size == 16 else "<4sIQQ", data)
            if fields[2] == fields[3] == self._size:  # the descriptor of the data written
                descriptor = bytearray(data)
                struct.pack_into("<I", descriptor, 4, self._crc)
                self._fold = _hash_combine(self._fold, self._crc)
                self._crcs.append(self._crc)
                self.write = self._header
                return self.out.write(descriptor)
        if size >= 8 and data[:4] == _DESCRIPTOR:  # torch folds in any write that starts like one
            self._fold = _hash_combine(self._fold, struct.unpack_from("<I", data, 4)[0])
        self._crc = zlib.crc32(data, self._crc)  # outside the GIL, above 5 KiB
        self._size += size
        return self.out.write(data)

    def _serialization_id(self, data: memoryview) -> int:
        """The 40 digits of ``.data/serialization_id``: the last 20 are the fold of the CRCs."""
        text = bytes(data)
        if len(text) != 40 or not text.isdigit():
            return self._confuse(data, f"a serialization id {text!r}, not 40 digits")
        self.write = self._data
        return self._data(text[:20] + b"%020d" % self._fold)

    def _central_directory(self, data: memoryview) -> bytearray:
        directory = bytearray(data)
        if len(self._names) != len(self._crcs):
            self.confused = f"{len(self._names)} records named and {len(self._crcs)} ended"
            return directory
        offset = 0
        for name, crc in zip(self._names, self._crcs):
            if directory[offset:offset + 4] != _CENTRAL:
                self.confused = f"a central directory with fewer entries than the {len(self._names)} records"
                return directory
            _, _, name_len, extra_len, comment_len = _CENTRAL_HEADER.unpack_from(directory, offset)
            start = offset + _CENTRAL_HEADER.size
            if directory[start:start + name_len] != name:
                self.confused = f"a central directory entry {bytes(directory[start:start + name_len])!r} for {name!r}"
                return directory
            struct.pack_into("<I", directory, offset + 16, crc)
            offset = start + name_len + extra_len + comment_len
        if directory[offset:offset + 4] == _CENTRAL:
            self.confused = f"a central directory with more entries than the {len(self._names)} records"
        return directory
