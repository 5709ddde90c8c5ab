"""Checkpoints written while training goes on: a consistent copy of the state taken at the
save (``snapshot``, or the bytes themselves for a small one: ``freeze``), then one writer
thread that puts it on disk (``BackgroundWriter``), handed the job through
``Trainer.save_checkpoint`` (``hand_off``)."""

from __future__ import annotations

import collections
import contextlib
import io
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterator

import torch

from trainer.checkpoint import serialize
from trainer.checkpoint.files import Encoded, plain_size
from trainer.data.batches import apply_to_tensors


def snapshot(obj: Any, spares: dict[int, list[torch.UntypedStorage]] | None = None,
             memo: dict[tuple[torch.device, int], torch.UntypedStorage] | None = None) -> Any:
    """``obj`` with every tensor copied to the CPU, so that training can go on changing the
    originals while the copy is written. Tensors that share memory (tied weights, a view of
    a weight) still do.

    A tensor that is the whole of its memory, as parameters and optimizer states are, is
    copied with one ``clone()``: copying its storage and viewing into the copy, which the
    other tensors need, costs about 7x more, and an epoch-end checkpoint of a small model
    paid that on the training thread (benchmarks/epoch_cost.py).

    ``spares`` (CPU storages by size, the previous snapshot's, which nothing reads any more) are
    copied into instead of new memory: fresh memory costs the training thread a page fault and
    the kernel's zeroing of every page before the copy itself (benchmarks/checkpoint_stall.py).
    ``memo`` receives each live storage's copy, by (device, address).
    """
    copies: dict[tuple[torch.device, int], torch.UntypedStorage] = {} if memo is None else memo
    free = spares or {}

    def copy(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        key = (storage.device, storage.data_ptr())
        copied = copies.get(key)
        if copied is None:
            kept = free.get(storage.nbytes())
            spare = kept.pop() if kept else None
            if (t.is_cpu and t.storage_offset() == 0 and t.is_contiguous()
                    and t.numel() * t.element_size() == storage.nbytes()):
                if spare is None:
                    clone = t.detach().clone()
                    copies[key] = clone.untyped_storage()
                    return clone
                copies[key] = spare
                return torch.empty(0, dtype=t.dtype).set_(spare, 0, t.size(), t.stride()).copy_(t.detach())
            if spare is not None:
                copied = copies[key] = spare.copy_(storage)
            else:
                copied = copies[key] = storage.clone() if storage.device.type == "cpu" else storage.cpu()
        return torch.empty(0, dtype=t.dtype).set_(copied, t.storage_offset(), t.size(), t.stride())

    tensor, plain = torch.Tensor, (str, int, float, bool, type(None))

    def walk(x: Any) -> Any:  # the usual containers by exact type; anything else the general way
        kind = type(x)
        if kind is dict or kind is collections.OrderedDict:  # a state_dict is an OrderedDict
            return kind((k, walk(v)) for k, v in x.items())
        if kind is list:
            return [walk(v) for v in x]
        if kind is tuple:
            return tuple(walk(v) for v in x)
        if kind is tensor or kind is torch.nn.Parameter:
            return copy(x)
        return x if kind in plain else apply_to_tensors(x, copy)

    return walk(obj)


# Up to this many bytes of tensors, ``freeze`` serializes a checkpoint on the training thread.
SERIALIZE_INLINE_MAX = 16 << 20


def freeze(obj: dict[str, Any], spares: dict[int, list[torch.UntypedStorage]] | None = None,
           memo: dict[tuple[torch.device, int], torch.UntypedStorage] | None = None) -> dict[str, Any] | Encoded:
    """``obj`` as it is now, for ``save_atomic`` to write while training changes the live
    tensors: serialized now if it is small, plain and on the CPU; else a ``snapshot``.

    A background write of a small checkpoint is mostly pickling, which holds the GIL: the
    writer thread and the training thread then hand the GIL back and forth, and training
    loses more than the pickling time. Serialized here (no copy first: the bytes are the
    copy), what is left for the writer (write, fsync, rename) waits outside the GIL
    (benchmarks/epoch_cost.py). A large checkpoint is copied instead, so that its bytes
    never sit in memory beside the copies of its tensors (``spares`` and ``memo``: ``snapshot``'s).
    """
    size = plain_size(obj, cpu_only=True)
    if size is None or size > SERIALIZE_INLINE_MAX:  # not plain: save_atomic loads the file back to check
        return snapshot(obj, spares, memo)
    buffer = io.BytesIO()
    serialize.save(obj, buffer)
    return Encoded(buffer.getbuffer())


class BackgroundWriter:
    """Runs checkpoint writes on a writer thread, one at a time, in order.

    ``submit`` first waits for the write before it, so at most one snapshot waits in memory,
    and a write that failed (a full disk) raises its error there, at the next save, or at
    ``wait()``. Each write is still atomic (``save_atomic``): a file is complete or absent.

    The thread is the process's (``_shared_pool``), started at the first write and kept for
    the next fits: starting a thread takes about 1 ms on this project's 2-core VM, which a
    short fit paid on its training thread (benchmarks/fit_cost.py). It is not a daemon, so the
    interpreter waits for a write in flight before it exits.
    """

    def __init__(self) -> None:
        self._pending: Future | None = None
        self._copies: list[torch.UntypedStorage] = []  # the last snapshot's memory, for the next to reuse

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        self.wait()
        self._pending = _shared_pool().submit(fn, *args)

    def keep(self, copies: list[torch.UntypedStorage]) -> None:
        """The CPU storages of the snapshot just submitted: once it is written, the next
        snapshot copies into them (``spares``). As the floor's copy, they stay until then."""
        self._copies = [c for c in copies if c.device.type == "cpu"]

    def spares(self) -> dict[int, list[torch.UntypedStorage]]:
        """The last snapshot's storages by size, now that its write is over (none while in flight)."""
        if self.in_flight:
            return {}
        out: dict[int, list[torch.UntypedStorage]] = {}
        for storage in self._copies:
            out.setdefault(storage.nbytes(), []).append(storage)
        self._copies = []
        return out

    @property
    def in_flight(self) -> bool:
        """A write was handed over and has not finished."""
        return self._pending is not None and not self._pending.done()

    def wait(self) -> None:
        """Block until the last write is on disk; raise its error if it failed."""
        error = self.error()
        if error is not None:
            raise error

    def error(self, release: bool = False) -> BaseException | None:
        """Block until the last write is on disk; return its error if it failed (once). With
        ``release`` (a fit's end), free the copies kept for the next snapshot too."""
        if release:
            self._copies = []
        pending, self._pending = self._pending, None
        return None if pending is None else pending.exception()

    def __getstate__(self) -> dict[str, Any]:
        return {}  # a copy (e.g. in a spawned DDP worker) starts with nothing pending

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _shared_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
        return _pool


def wait_for_writes() -> None:
    """Block until every write handed to this process's writer thread so far has ended (their
    errors stay with their writers, for their ``wait``). The thread takes jobs in order, so an
    empty job put behind them ends after they have."""
    with _pool_lock:
        pool = _pool
    if pool is None:
        return
    try:
        pool.submit(int).result()
    except RuntimeError:  # the interpreter is shutting the pool down: it waits for the writes itself
        return


def _forget_pool() -> None:
    """In a forked child: the parent's thread is not there; a write there starts its own."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


class HandOff:
    """A write for ``Trainer.save_checkpoint`` to give to a writer thread (see ``hand_off``)."""

    def __init__(self, writer: BackgroundWriter, fn: Callable[..., None], args: tuple[Any, ...],
                 check: Callable[[dict | None], Callable[[], None] | None] | None = None) -> None:
        self.writer, self.fn, self.args, self.check = writer, fn, args, check
        self.taken = False

    def submit(self, checkpoint: dict[str, Any], path: str) -> None:
        memo: dict[tuple[torch.device, int], torch.UntypedStorage] = {}
        frozen = freeze(checkpoint, self.writer.spares(), memo)
        # ``check`` (the finiteness of the state) runs now on bytes already made, or returns the
        # check of the copies, which the writer thread runs before it writes anything.
        deferred = None if self.check is None else self.check(None if isinstance(frozen, Encoded) else memo)
        self.writer.submit(_write_checked, deferred, self.fn, frozen, path, *self.args)
        self.writer.keep(list(memo.values()))


def _write_checked(check: Callable[[], None] | None, fn: Callable[..., None], *args: Any) -> None:
    if check is not None:
        check()
    fn(*args)


_handoff = threading.local()


@contextlib.contextmanager
def hand_off(
    writer: BackgroundWriter, fn: Callable[..., None], *args: Any,
    check: Callable[[dict | None], Callable[[], None] | None] | None = None,
) -> Iterator[HandOff]:
    """Within: ``Trainer.save_checkpoint`` (its first call, on this thread) gives the state it
    takes to ``writer``, which runs ``fn(frozen_state, path, *args)`` on its thread, instead of
    writing it itself. So ModelCheckpoint saves through ``trainer.save_checkpoint(path,
    weights_only)``, Lightning's call, which code that wraps or replaces it sees, and still
    writes in the background. ``.taken`` says whether save_checkpoint took the job. ``check``:
    see ``integrity.deferred_refusal``."""
    job = _handoff.job = HandOff(writer, fn, args, check)
    try:
        yield job
    finally:
        _handoff.job = None


def take_hand_off() -> HandOff | None:
    """The job of the ``hand_off`` around this call, once (None outside one)."""
    job = getattr(_handoff, "job", None)
    if job is not None:
        _handoff.job, job.taken = None, True
    return job
