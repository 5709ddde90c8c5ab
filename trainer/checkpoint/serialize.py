"""``torch.save`` with the common tensor pickled in fewer Python steps: the same bytes.

A checkpoint is mostly small tensors (a model's parameters and two Adam states for each),
and ``torch.save`` spends most of its time in Python per tensor, in ``Tensor.__reduce_ex__``
and the checks it makes for tensors that are not plain (subclasses, sparse, quantized, meta,
other devices). An epoch-end checkpoint of a small model pays that on the training thread
(benchmarks/fit_cost.py). ``save`` gives ``torch.save`` a pickler that reduces a plain CPU
tensor directly, to what ``__reduce_ex__`` returns for it, and leaves every other object,
and every tensor that is not plain, to the usual path. The file is byte for byte the one
``torch.save`` writes (tests/trainer/checkpoint/test_serialize.py compares them).
"""

from __future__ import annotations

import collections
import pickle
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


class _Pickler(pickle.Pickler):
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
        return _rebuild_tensor_v2, (storage, obj.storage_offset(), tuple(obj.size()), obj.stride(), obj.requires_grad, _OrderedDict())


# What torch.save(pickle_module=...) reads: a Pickler class (which it subclasses) and a name.
_PICKLE_MODULE = types.SimpleNamespace(Pickler=_Pickler, __name__=__name__)


def save(obj: Any, f: str | IO[bytes]) -> None:
    """``torch.save(obj, f)``, faster for checkpoints of many small tensors."""
    torch.save(obj, f, pickle_module=_PICKLE_MODULE)
