"""DataParallel done right: one process, several GPUs, the whole step inside each replica.

Classic ``nn.DataParallel`` runs only ``forward`` in the replicas and gathers every output
onto GPU 0, where the loss is computed: GPU 0 holds all the activations' outputs and runs
out of memory first, and the saved state dict carries ``module.`` prefixes. Here each
replica runs the user's whole ``training_step`` (forward and loss) on its chunk; only the
scalar losses travel, combined as a mean weighted by chunk size, so the loss and the
gradients equal the single-device ones. The user's module is never wrapped, so its
``state_dict()`` has no prefixes.
"""

from __future__ import annotations

import dataclasses
import threading
import warnings
from typing import Any, Iterable

import torch
from torch.nn.parallel import replicate

from trainer.core.checks import user_stacklevel
from trainer.data.batches import apply_to_tensors, move_to_device
from trainer.core.metrics import MetricSink, current_sink, set_sink

from .base import ParallelStrategy, StepDispatcher, check_cuda_indices, check_given_ids, device_id_list
from .precision import Precision


def split_batch(batch: Any, n: int) -> list[tuple[Any, int]]:
    """Split along dim 0 into at most ``n`` balanced, non-empty chunks: ``[(chunk, size), ...]``.

    The batch size is dim 0 of the first tensor that has a dim 0. Tensors of that length are
    sliced, and so are lists of that length holding only plain values (the strings that
    ``default_collate`` leaves as a list, one per sample); everything else (scalars, strings,
    tensors of another length) goes whole to every chunk. A batch smaller than ``n`` gives
    fewer chunks, one sample each.
    """
    total = _batch_len(batch)
    if total is None:
        return [(batch, 1)]
    sizes = [total // n + (1 if i < total % n else 0) for i in range(n)]
    chunks, start = [], 0
    for size in sizes:
        if size == 0:
            break
        stop = start + size
        chunk = _slice(batch, start, stop, total)
        chunks.append((chunk, size))
        start = stop
    return chunks


def _slice(batch: Any, start: int, stop: int, total: int) -> Any:
    """``batch`` cut to samples ``start:stop`` (``apply_to_tensors``'s walk, plain lists included)."""
    if isinstance(batch, torch.Tensor):
        return batch[start:stop] if batch.ndim and batch.shape[0] == total else batch
    if _plain_list(batch):
        return batch[start:stop] if len(batch) == total else batch
    if isinstance(batch, dict):
        return type(batch)((k, _slice(v, start, stop, total)) for k, v in batch.items())
    if isinstance(batch, (list, tuple)):
        out = [_slice(x, start, stop, total) for x in batch]
        if hasattr(batch, "_fields"):  # namedtuple
            return type(batch)(*out)
        return type(batch)(out) if isinstance(batch, list) else tuple(out)
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        fields = [f.name for f in dataclasses.fields(batch) if f.init]
        changes = {name: _slice(getattr(batch, name), start, stop, total) for name in fields}
        return dataclasses.replace(batch, **changes)
    return batch


def _plain_list(value: Any) -> bool:
    """A list of plain values (strings, numbers, None): per-sample data when it is a batch long."""
    return type(value) is list and all(x is None or isinstance(x, (str, bytes, int, float)) for x in value)


def _batch_len(batch: Any) -> int | None:
    found: list[int] = []

    def first_dim(t: torch.Tensor) -> torch.Tensor:
        if t.ndim and not found:
            found.append(t.shape[0])
        return t

    apply_to_tensors(batch, first_dim)  # visits tensors in the batch's own order
    return found[0] if found else None


def combine_outputs(outputs: list[Any], weights: list[int], device: torch.device, *, training: bool = False) -> Any:
    """Merge per-replica outputs into what one device would have returned for the whole batch.

    ``weights`` are the chunk sizes. Per leaf:
    - a tensor of one element whose dim 0 is not its chunk's size (a loss, of shape ``()``
      or ``(1,)``) is a per-chunk value: floats by the mean weighted by chunk size (the weighted mean of per-chunk mean
      losses is the mean over the whole batch, so the loss and its gradients equal one
      device's), integers (counts) by their sum; the shape is kept;
    - any other tensor is concatenated along dim 0, in replica order, so predictions keep
      the batch's order;
    - a list whose length is its chunk's size and that holds plain values (strings, numbers),
      or lists and tuples of different lengths across replicas, hold one entry per sample:
      concatenated;
    - other containers are merged entry by entry; anything else gives one entry per replica.

    When every chunk is one sample, a one-element tensor could be either; ``training=True``
    (training_step's output) reads it as the loss, otherwise as one sample's row.
    """
    first = outputs[0]
    if isinstance(first, torch.Tensor):
        return _combine_tensors(outputs, weights, device, training)
    if isinstance(first, dict):
        return type(first)(
            (k, combine_outputs([o[k] for o in outputs], weights, device, training=training)) for k in first
        )
    if isinstance(first, (list, tuple)):
        lengths = [len(o) for o in outputs]
        if not hasattr(first, "_fields") and (
            len(set(lengths)) > 1 or (lengths == list(weights) and all(_plain_list(o) for o in outputs))
        ):  # one entry per sample: a structure would have the same length in every replica
            return type(first)(x for o in outputs for x in o)
        merged = [
            combine_outputs([o[i] for o in outputs], weights, device, training=training) for i in range(len(first))
        ]
        return type(first)(*merged) if hasattr(first, "_fields") else type(first)(merged)
    if dataclasses.is_dataclass(first) and not isinstance(first, type):
        return dataclasses.replace(first, **{
            f.name: combine_outputs([getattr(o, f.name) for o in outputs], weights, device, training=training)
            for f in dataclasses.fields(first) if f.init
        })
    return list(outputs)  # anything else: one entry per replica


def _combine_tensors(
    outputs: list[torch.Tensor], weights: list[int], device: torch.device, training: bool
) -> torch.Tensor:
    one_element = all(o.numel() == 1 for o in outputs)
    if not one_element or (
        all(o.ndim and o.shape[0] == w for o, w in zip(outputs, weights)) and not training  # one row per sample
    ):
        return torch.cat([o.to(device) for o in outputs], dim=0)
    first = outputs[0]
    if not first.is_floating_point() and not first.is_complex():
        return sum(o.to(device) for o in outputs)  # counts add up, as one device counts the whole batch
    total = float(sum(weights))
    return sum(o.to(device) * (w / total) for o, w in zip(outputs, weights))


class DataParallelStrategy(ParallelStrategy):
    """``strategy="dp"``: the loader's batch is the global batch, split across ``device_ids``.

    An index may repeat: ``device_ids=[0, 0]`` runs two replicas on one GPU, through the whole
    path (split, replicate, one thread per replica, combine, backward). It is no faster than
    one device; it is how this strategy is tested on a one-GPU machine.
    """

    name = "dp"

    def __init__(
        self, device_ids: list[int] | None = None, output_device: int | None = None, precision: Precision | None = None,
    ) -> None:
        super().__init__(precision)
        if output_device is not None and (isinstance(output_device, bool) or not isinstance(output_device, int)):
            raise TypeError(f"DataParallelStrategy(output_device={output_device!r}) must be a CUDA index or None.")
        self.device_ids = device_id_list("DataParallelStrategy", device_ids)
        self.output_device = output_device
        self._dispatcher: StepDispatcher | None = None

    def configure_devices(self, devices: str | int | list[int]) -> None:
        gpus = self.visible_gpus()
        if self.device_ids is not None:
            check_given_ids("DataParallelStrategy", self.device_ids, devices)
        elif isinstance(devices, list):
            check_cuda_indices("devices", devices, devices)
            self.device_ids = devices
        elif devices == "auto" or gpus < 2:
            self.device_ids = list(range(gpus))
        elif devices > gpus:
            raise ValueError(
                f"devices={devices!r} with strategy='dp', but only {gpus} CUDA devices are visible. "
                f"Use devices={gpus} (or 'auto')."
            )
        else:
            self.device_ids = list(range(devices))
        if self.output_device is not None:
            check_cuda_indices("DataParallelStrategy(output_device)", self.output_device, [self.output_device])
        if len(self.device_ids) < 2:
            # Warned here, while the Trainer is built: once, and never per fit or per step.
            where = f"cuda:{self.device_ids[0]}" if self.device_ids else "cpu"
            warnings.warn(
                f"strategy='dp' needs 2 or more GPUs, but devices={devices!r} gives it {len(self.device_ids)} "
                f"({gpus} visible); running on the single device {where} instead.",
                stacklevel=user_stacklevel(),  # the line that built the Trainer
            )
            self.output_device = None
        self.root_device = torch.device("cuda", self.device_ids[0]) if self.device_ids else torch.device("cpu")
        if self.output_device is None:
            self.output_device = self.device_ids[0] if self.device_ids else None

    @property
    def num_devices(self) -> int:
        return max(len(self.device_ids or ()), 1)

    def describe(self) -> str:
        if self.num_devices < 2:
            return f"dp (fallback to one device) on {self.root_device}"
        return "dp on " + ", ".join(f"cuda:{i}" for i in self.device_ids)

    def setup_environment(self) -> None:
        if self.root_device.type == "cuda":
            torch.cuda.set_device(self.root_device)

    def setup_module(self, module: torch.nn.Module) -> None:
        if self.num_devices > 1 and not getattr(module, "automatic_optimization", True):
            raise ValueError(
                f"strategy='dp' with manual optimization ({type(module).__name__}.automatic_optimization = False): "
                "dp runs training_step in one replica per GPU and combines their losses, while manual "
                "optimization steps inside training_step, which needs one copy of the model. "
                "Use strategy='ddp' (one process per GPU), or devices=1."
            )
        super().setup_module(module)
        self._dispatcher = StepDispatcher(self.module)

    def device_batches(self, batches: Iterable[Any]) -> Iterable[Any]:
        # Several GPUs: each batch is split on the CPU, then each part copied to its GPU.
        return super().device_batches(batches) if self.num_devices < 2 else batches

    def run_step(self, step_name: str, batch: Any, batch_idx: int, *args: Any) -> Any:
        if self.num_devices < 2:
            return super().run_step(step_name, batch, batch_idx, *args)
        chunks = split_batch(batch, self.num_devices)
        devices = [torch.device("cuda", i) for i in self.device_ids[: len(chunks)]]
        inputs = [move_to_device(chunk, d) for (chunk, _), d in zip(chunks, devices)]
        weights = [size for _, size in chunks]
        replicas = replicate(self._dispatcher, devices, detach=not torch.is_grad_enabled())
        outputs, sinks = self._run_replicas(replicas, inputs, devices, weights, step_name, (batch_idx, *args))
        parent = current_sink()
        if parent is not None:
            parent.merge_replicas(sinks)
        output_device = torch.device("cuda", self.output_device)
        return combine_outputs(outputs, weights, output_device, training=step_name == "training_step")

    def _run_replicas(self, replicas, inputs, devices, weights, step_name, step_args):  # noqa: ANN001
        n = len(replicas)
        outputs: list[Any] = [None] * n
        sinks = [MetricSink() for _ in range(n)]
        errors: list[BaseException | None] = [None] * n
        grad_enabled = torch.is_grad_enabled()  # grad mode and autocast are thread-local

        def work(i: int) -> None:
            previous = set_sink(sinks[i])
            sinks[i].batch_size = weights[i]
            try:
                with torch.cuda.device(devices[i]), torch.set_grad_enabled(grad_enabled), self.precision.autocast():
                    outputs[i] = replicas[i](step_name, inputs[i], *step_args)
            except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
                errors[i] = err
            finally:
                set_sink(previous)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(1, n)]
        for t in threads:
            t.start()
        work(0)  # the caller's thread takes the first replica
        for t in threads:
            t.join()
        for i, err in enumerate(errors):
            if err is not None:
                raise RuntimeError(f"{step_name} failed in the DataParallel replica on {devices[i]}") from err
        return outputs, sinks
