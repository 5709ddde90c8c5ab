"""Is a checkpoint whole, and is the state worth saving? The zip archive's CRCs, checked before
a file is resumed or loaded; and the weights' and optimizer state's finiteness, checked before
a save (a NaN must not replace the last good model)."""

from __future__ import annotations

import mmap
import os
import struct
import zipfile
import zlib
from typing import TYPE_CHECKING, Callable, Iterator

import torch

from trainer.checkpoint.files import CheckpointError

if TYPE_CHECKING:
    from trainer.trainer import Trainer

_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, then the name's and the extra field's lengths
_LOCAL_SIGNATURE = b"PK\x03\x04"


def damage(path: str | os.PathLike) -> str | None:
    """What is wrong with the zip archive at ``path`` (a checkpoint file torch.save wrote), or
    None if every entry's bytes match the CRC-32 the archive recorded for them.

    torch.load does not check the CRCs, so a flipped bit inside a tensor loads silently. This
    reads the whole file once, through a memory map (no copy; zlib's crc32 runs outside the
    GIL): about what reading the file costs (benchmarks/checkpoint_verify_cost.py).
    """
    try:
        with open(path, "rb") as f, zipfile.ZipFile(f) as archive:
            entries = archive.infolist()
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return "the file is empty"
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                for entry in entries:
                    problem = _entry_damage(archive, entry, data, size)
                    if problem is not None:
                        return problem
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, zlib.error) as err:
        return f"its zip structure is broken ({err})"
    return None


def _entry_damage(archive: zipfile.ZipFile, entry: zipfile.ZipInfo, data: mmap.mmap, size: int) -> str | None:
    if entry.compress_type != zipfile.ZIP_STORED:  # torch.save stores; anything else through zipfile
        with archive.open(entry) as member:
            while member.read(1 << 20):  # raises BadZipFile on a CRC mismatch
                pass
        return None
    start = entry.header_offset
    if start + _LOCAL_HEADER.size > size:
        return f"entry {entry.filename!r} lies past the end of the file"
    signature, name_len, extra_len = _LOCAL_HEADER.unpack_from(data, start)
    if signature != _LOCAL_SIGNATURE:
        return f"entry {entry.filename!r} has no local header where the archive's directory says"
    begin = start + _LOCAL_HEADER.size + name_len + extra_len
    end = begin + entry.compress_size
    if end > size:
        return f"entry {entry.filename!r} lies past the end of the file"
    with memoryview(data)[begin:end] as view:
        crc = zlib.crc32(view)
    if crc != entry.CRC:
        return (
            f"the bytes of entry {entry.filename!r} do not match its CRC-32 "
            f"(stored {entry.CRC:#010x}, read {crc:#010x})"
        )
    return None


def verify(path: str | os.PathLike, label: str | None = None) -> None:
    """Raise a CheckpointError naming ``path`` if its bytes are damaged (see :func:`damage`)."""
    problem = damage(path)
    if problem is not None:
        raise CheckpointError(
            f"{label or repr(os.fspath(path))} is damaged: {problem}. Its contents changed after it was written "
            "(a disk or copy error), so it is not loaded. Use another checkpoint (ckpt_path='last' falls back to "
            "the newest intact one), or a backup of this file."
        )


# --- finite weights ------------------------------------------------------------------------
def refuse_non_finite(trainer: Trainer, what: str) -> None:
    """Raise, on every rank, if the model's weights or the optimizers' state hold a NaN or an
    infinity: saving them would replace the last finite checkpoint (``save_top_k`` deletes
    it, ``last.ckpt`` moves on) with a model that can only produce NaN.

    Every rank must call it (under several processes it is one all-reduce, each rank checking
    its own tensors: fsdp's shards differ). It runs once per save, never per step: a norm per
    tensor, batched per device and dtype, and one read of the result
    (benchmarks/checkpoint_verify_cost.py compares it with the copy every save makes).
    """
    strategy = trainer.strategy
    count = _non_finite_count(_state_tensors(trainer))
    if strategy.world_size > 1:
        count = strategy.all_reduce_sum(count)
    if not count.item():
        return
    first = _first_non_finite(trainer)
    if strategy.world_size > 1:
        first = next((name for name in strategy.gather_objects(first) if name is not None), None)
    raise _refusal(what, trainer.state.global_step, trainer.state.current_epoch, first)


def deferred_refusal(trainer: Trainer, what: str) -> Callable[[dict | None], Callable[[], None] | None]:
    """``refuse_non_finite`` for one process, made on the copies a background save takes, for
    ``background_save.hand_off(check=...)``: called with ``snapshot``'s memo (live storage ->
    its copy), it returns the check of the copies, which the writer thread runs before it writes,
    so the training thread does not read the whole state a second time; called with None (the
    state was serialized at once: small), it checks the live state now."""

    def prepare(memo: dict | None) -> Callable[[], None] | None:
        if memo is None:
            refuse_non_finite(trainer, what)
            return None
        copies: list[tuple[int, torch.Tensor]] = []  # (index among _state_tensors, the copy)
        for i, t in enumerate(_state_tensors(trainer)):
            storage = t.untyped_storage()
            copied = memo.get((storage.device, storage.data_ptr()))
            if copied is not None and _checked(t):  # absent: not in the file (weights_only: no optimizer state)
                copies.append((i, torch.empty(0, dtype=t.dtype).set_(copied, t.storage_offset(), t.size(), t.stride())))
        if not copies:  # no live tensor was copied as it is (a state dict of other tensors): check them now
            refuse_non_finite(trainer, what)
            return None
        step, epoch = trainer.state.global_step, trainer.state.current_epoch

        def check() -> None:
            if not _non_finite_count(t for _, t in copies).item():
                return
            bad = next(i for i, t in copies if not bool(t.isfinite().all()))
            name = next((n for j, (n, _) in enumerate(_named_state_tensors(trainer)) if j == bad), None)
            raise _refusal(what, step, epoch, name)

        return check

    return prepare


def _refusal(what: str, step: int, epoch: int, first: str | None) -> CheckpointError:
    return CheckpointError(
        f"Not saving {what} at step {step} (epoch {epoch}): {first or 'the state'} holds "
        "NaN or infinite values. Training has diverged, and this save would replace the last finite checkpoint "
        "(last.ckpt, and the top k). The files already saved are kept: resume from the newest with "
        "fit(ckpt_path='last'), and lower the learning rate, clip gradients (Trainer(gradient_clip_val=...)) or "
        "skip bad steps (callbacks.NaNGuard()) so that it does not diverge again."
    )


def _named_state_tensors(trainer: Trainer) -> Iterator[tuple[str, torch.Tensor]]:
    """The floating tensors a checkpoint's weights (the parameters) and optimizer state are
    made of, as this process holds them (fsdp: its shards), read from the live objects, not from the
    checkpoint's layout."""
    module = trainer.strategy.module
    if module is not None:  # not the buffers: a causal mask holds -inf by design, and running stats follow the weights
        for name, t in module.named_parameters():
            yield f"the weight {name!r}", t
    names = {id(p): n for n, p in module.named_parameters()} if module is not None else {}
    for i, optimizer in enumerate(trainer.optimizers):
        for param, per_param in optimizer.state.items():
            for key, value in per_param.items():
                if isinstance(value, torch.Tensor):
                    yield f"optimizer {i}'s {key!r} of {names.get(id(param), 'a parameter')!r}", value


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # a DTensor (fsdp): this rank's shard


def _state_tensors(trainer: Trainer) -> Iterator[torch.Tensor]:
    """The tensors of ``_named_state_tensors`` without their names (each save: no strings made)."""
    module = trainer.strategy.module
    if module is not None:
        yield from map(_local, module.parameters())
    for optimizer in trainer.optimizers:
        for per_param in optimizer.state.values():
            yield from (_local(v) for v in per_param.values() if isinstance(v, torch.Tensor))


def _checked(t: torch.Tensor) -> bool:
    return (t.is_floating_point() or t.is_complex()) and t.numel() > 0


def _non_finite_count(tensors: Iterator[torch.Tensor]) -> torch.Tensor:
    """How many of ``tensors`` hold a NaN or an infinity, as a float tensor of one element on
    the CPU. Their 2-norms first, batched per device and dtype (``torch._foreach_norm``, a
    vectorised sum of squares: NaN and inf carry through it); a tensor whose norm is not finite
    is then looked at element by element, since a finite tensor's squares can overflow."""
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for t in tensors:
        if _checked(t):
            groups.setdefault((t.device, t.dtype), []).append(t.detach())
    count = 0
    for group in groups.values():
        finite = torch.stack(torch._foreach_norm(group, 2)).isfinite()
        if not bool(finite.all()):  # one read per device and dtype
            count += sum(not bool(t.isfinite().all()) for t, ok in zip(group, finite.tolist()) if not ok)
    return torch.tensor([float(count)])


def _first_non_finite(trainer: Trainer) -> str | None:
    """The name of this process's first non-finite tensor (slow: only once a save is refused)."""
    for name, t in _named_state_tensors(trainer):
        t = _local(t)
        if _checked(t) and not bool(t.detach().isfinite().all()):
            return name
    return None

