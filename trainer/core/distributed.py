"""Running on several processes and devices: what only global rank 0 does (Lightning's ``rank_zero_only``,
``rank_zero_info``, ``rank_zero_debug``, ``rank_zero_warn``; import them from ``trainer``), what a module
gathers from every process (its ``all_gather``), and nested tensors moved to a device (the default
``transfer_batch_to_device`` of the module and the DataModule, and the data room's)."""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import warnings
from typing import Any, Callable, TypeVar

import torch

log = logging.getLogger("trainer")
T = TypeVar("T")


def _rank_from_env() -> int:
    for name in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        value = os.environ.get(name)
        if value is not None and value.isdigit():
            return int(value)
    return 0


def rank_zero_only(fn: Callable[..., T]) -> Callable[..., T | None]:
    """Decorator: ``fn`` runs on global rank 0 only (elsewhere it returns None).

    ``rank_zero_only.rank`` is this process's global rank: read from the launcher's
    environment at import, then set by the Trainer in each process it runs in.
    """

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> T | None:
        if rank_zero_only.rank == 0:
            return fn(*args, **kwargs)
        return None

    return wrapped


rank_zero_only.rank = _rank_from_env()  # type: ignore[attr-defined]


@rank_zero_only
def rank_zero_info(*args: Any, stacklevel: int = 2, **kwargs: Any) -> None:
    """``logging.info`` on the "trainer" logger, on global rank 0 only."""
    log.info(*args, stacklevel=stacklevel, **kwargs)


@rank_zero_only
def rank_zero_debug(*args: Any, stacklevel: int = 2, **kwargs: Any) -> None:
    log.debug(*args, stacklevel=stacklevel, **kwargs)


@rank_zero_only
def rank_zero_warn(
    message: str | Warning, category: type[Warning] = UserWarning, stacklevel: int = 4, **kwargs: Any
) -> None:
    """``warnings.warn`` on global rank 0 only."""
    warnings.warn(message, category, stacklevel=stacklevel, **kwargs)


def all_gather(data: Any, group: Any = None, sync_grads: bool = False) -> Any:
    """Each tensor of ``data`` (a tensor, or a dict, list or tuple of them) from every process,
    stacked along a new first dimension of size world size; on one process, ``data`` as it is.
    ``sync_grads=True`` lets gradients flow back through the gather."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
        return data

    def gather(t: torch.Tensor) -> torch.Tensor:
        t = t.contiguous()
        if sync_grads:
            from torch.distributed.nn.functional import all_gather as differentiable

            return torch.stack(differentiable(t, group=group or dist.group.WORLD))
        out = [torch.empty_like(t) for _ in range(dist.get_world_size(group))]
        dist.all_gather(out, t, group=group)
        return torch.stack(out)

    def walk(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            return gather(x)
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            on_gpu = dist.get_backend(group) == "nccl"
            return gather(torch.tensor(x, device=torch.cuda.current_device() if on_gpu else "cpu"))
        if isinstance(x, dict):
            return type(x)((k, walk(v)) for k, v in x.items())
        if isinstance(x, (list, tuple)):
            return type(x)(walk(v) for v in x) if not hasattr(x, "_fields") else type(x)(*(walk(v) for v in x))
        return x

    return walk(data)


def apply_to_tensors(data: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """Apply ``fn`` to every tensor in nested tuples, lists, dicts and dataclasses."""
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, (list, tuple)):
        out = [apply_to_tensors(x, fn) for x in data]
        if hasattr(data, "_fields"):  # namedtuple
            return type(data)(*out)
        return type(data)(out) if isinstance(data, list) else tuple(out)
    if isinstance(data, dict):
        return type(data)((k, apply_to_tensors(v, fn)) for k, v in data.items())
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        changes = {f.name: apply_to_tensors(getattr(data, f.name), fn) for f in dataclasses.fields(data) if f.init}
        return dataclasses.replace(data, **changes)
    return data


def move_to_device(batch: Any, device: torch.device) -> Any:
    """``batch`` with every tensor on ``device``; a CPU batch bound for the CPU comes back as is."""
    if device.type == "cpu" and on_cpu(batch):
        return batch  # each .to() would return its input: skip rebuilding the containers every step
    # non_blocking only helps from pinned memory; harmless otherwise.
    non_blocking = device.type == "cuda"
    return apply_to_tensors(batch, lambda t: t.to(device, non_blocking=non_blocking))


def on_cpu(data: Any) -> bool:
    """True if no tensor in ``data`` (plain lists, tuples and dicts of them) is off the CPU.
    False for anything else, which then takes the general path."""
    if type(data) is list or type(data) is tuple:  # the usual batch first: this runs every step
        for x in data:
            if not (x.is_cpu if isinstance(x, torch.Tensor) else on_cpu(x)):
                return False
        return True
    if isinstance(data, torch.Tensor):
        return data.is_cpu
    if type(data) is dict:
        return all(on_cpu(x) for x in data.values())
    return isinstance(data, (int, float, str, bytes)) or data is None


def tensors_as_bytes(data: Any) -> Any:
    """``data`` for a collective that pickles it (``all_gather_object``): each plain tensor
    pickled as its raw bytes, and unpickled as the same tensor on the other side. Pickling a
    tensor goes through ``torch.save``, which a user's code may wrap or count (as Lightning's
    tests count a checkpoint's saves); and raw bytes pickle faster."""
    return apply_to_tensors(data, lambda t: _TensorBytes(t) if _plain(t) else t)


def _plain(t: torch.Tensor) -> bool:
    return t.layout is torch.strided and not t.requires_grad and not t.is_quantized and t.device.type != "meta"


class _TensorBytes:
    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        t = self.tensor.detach()
        raw = t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        return _tensor_from_bytes, (raw, str(t.dtype).removeprefix("torch."), tuple(t.shape), str(t.device))


def _tensor_from_bytes(raw: bytes, dtype: str, shape: tuple[int, ...], device: str) -> torch.Tensor:
    kind = getattr(torch, dtype)
    flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
    return flat.view(kind).reshape(shape).to(device)
