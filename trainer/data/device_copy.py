"""Batches copied to a CUDA device on a side stream, while the GPU runs the step before.

A hand-written loop's ``x.to("cuda")`` copies from pageable memory: the CPU waits for the
copy, and the copy, on the compute stream, waits for every kernel queued before it. So the
CPU cannot fetch the next batch while the GPU computes, and the GPU idles while it copies.

Here each batch, as soon as the loader gives it, is put in pinned memory (unless the loader
pinned it) and copied with ``non_blocking=True`` on a stream of its own, which runs beside
the compute stream's kernels of the step before. The compute stream then waits for that
copy (an event, not the CPU), and each copied tensor is marked as used on the compute
stream (``record_stream``), so that the caching allocator does not give its memory to the
copy stream's next batch before the step that reads it has run. The pinned host buffer is
kept from reuse until its copy has finished by torch's pinned-memory allocator itself.

The loader is read in the same order and at the same points of the loop as without this
(the batch after the current one is fetched only once the current step has been queued),
so the random draws a dataset makes, and the batches, are the same; the values copied are
the same bytes. On the CPU, and for strategies that move batches themselves (``dp``
splits each batch on the CPU first), the batches pass through untouched.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

import torch

from trainer.data.batches import apply_to_tensors


def copied_ahead(batches: Iterable[Any], device: torch.device) -> Iterator[Any]:
    """``batches`` with every CPU tensor on ``device``, each copy overlapping the work queued before it."""
    copy_stream = torch.cuda.Stream(device)
    compute = torch.cuda.current_stream(device)

    def copy(t: torch.Tensor) -> torch.Tensor:
        if not t.is_cpu:
            return t
        host = t if t.is_pinned() else t.pin_memory()
        moved = host.to(device, non_blocking=True)
        moved.record_stream(compute)  # allocated for the copy stream, read on the compute stream
        return moved

    for batch in batches:
        with torch.cuda.stream(copy_stream):
            moved = apply_to_tensors(batch, copy)
        compute.wait_stream(copy_stream)  # the step's kernels start once its batch has arrived
        yield moved
