"""Process-based data parallel: one process per device, gradients all-reduced by DDP."""

from __future__ import annotations

import contextlib
import gc
import itertools
import os
import warnings
from datetime import timedelta
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler, Sampler

from trainer.core.checks import suggest
from trainer.data.batches import apply_to_tensors, rebuild_loader, tensors_as_bytes

from ._env import launched_env
from ._sharding import ContiguousShard, drops_last, sampler_seed, sampler_to_shard
from ._spawn import spawn
from .base import ParallelStrategy, StepDispatcher, check_cuda_indices, check_given_ids, device_id_list
from .precision import Precision

#: How long a collective may wait for a peer before the job fails (torch's NCCL default is 30 min).
DEFAULT_TIMEOUT = timedelta(minutes=5)
_START_METHODS = ("spawn", "forkserver", "fork")
_BACKENDS = ("gloo", "nccl", "mpi", "ucc")


class DDPStrategy(ParallelStrategy):
    """One process per device. Started from a plain script it spawns ``devices`` workers;
    under ``torchrun`` (or SLURM's ``srun``) it joins the processes the launcher started.

    The loader's batch size is per process: the global batch is ``batch_size * world_size``.

    ``device_ids`` places the processes on chosen GPUs, one index per local process, instead
    of ``Trainer(devices=...)``. An index may repeat to put two processes on one GPU; NCCL
    refuses that, so it needs ``backend="gloo"`` (slower: gloo reduces through host memory).
    """

    name = "ddp"

    def __init__(
        self,
        backend: str | None = None,
        start_method: str = "spawn",
        find_unused_parameters: bool = False,
        timeout: timedelta | float = DEFAULT_TIMEOUT,
        device_ids: list[int] | None = None,
        precision: Precision | None = None,
    ) -> None:
        super().__init__(precision)
        self._given_ids = device_id_list("DDPStrategy", device_ids)
        if start_method not in _START_METHODS:
            raise ValueError(f"DDPStrategy(start_method={start_method!r}): valid values are {_START_METHODS}.")
        if backend is not None and not isinstance(backend, str):
            raise TypeError(f"DDPStrategy(backend={backend!r}): use None (auto), 'gloo' or 'nccl'.")
        if backend is not None and backend not in _BACKENDS:
            raise ValueError(
                f"DDPStrategy(backend={backend!r}) is not a torch.distributed backend. "
                f"Valid: None (auto), {', '.join(map(repr, _BACKENDS))}.{suggest(backend, _BACKENDS)}"
            )
        if not isinstance(find_unused_parameters, bool):
            raise TypeError(f"DDPStrategy(find_unused_parameters={find_unused_parameters!r}) must be True or False.")
        self.timeout = _timeout(timeout)
        self.backend = backend
        self.start_method = start_method
        self.find_unused_parameters = find_unused_parameters
        self.num_processes = 1
        self.device_ids: list[int] | None = None  # CUDA indices, one per local rank; None on CPU
        self._owns_group = False
        self._ddp: DistributedDataParallel | None = None
        self._buffers = False  # manual optimization on a module with buffers: rank 0's before each step

    def configure_devices(self, devices: str | int | list[int]) -> None:
        if self._given_ids is not None:
            check_given_ids("DDPStrategy", self._given_ids, devices)
            devices = self._given_ids
            if len(set(devices)) < len(devices) and self._backend(devices) == "nccl":
                raise ValueError(
                    f"DDPStrategy(device_ids={devices!r}) puts two processes on one GPU, which NCCL refuses "
                    "('Duplicate GPU detected'). Pass backend='gloo' to share a GPU, or list each GPU once."
                )
        if isinstance(devices, list) and self.accelerator in ("cpu", "mps"):
            raise ValueError(
                f"devices={devices!r} lists GPU indices, but accelerator={self.accelerator!r} has none: "
                f"pass a count of processes instead, e.g. devices={len(devices)}."
            )
        env = launched_env()
        gpus = self.visible_gpus()
        if env is not None:  # the launcher decided how many processes run here
            count = env.local_world_size if devices == "auto" else devices if isinstance(devices, int) else len(devices)
            if count != env.local_world_size:
                raise ValueError(
                    f"devices={devices!r} but the launcher started {env.local_world_size} process(es) on "
                    "this node. Pass devices='auto' under torchrun or srun, or make them match."
                )
            self.num_processes = env.world_size
            if isinstance(devices, list):
                check_cuda_indices("devices", devices, devices)
                self.device_ids = devices
            elif gpus:
                check_cuda_indices("devices", devices, list(range(env.local_world_size)))
                self.device_ids = list(range(env.local_world_size))
            return
        if devices == "auto":
            self.num_processes = max(gpus, 1)
            self.device_ids = list(range(gpus)) if gpus else None
        elif isinstance(devices, list):
            check_cuda_indices("devices", devices, devices, cpu_fix="use devices=<count> for CPU processes")
            self.num_processes, self.device_ids = len(devices), devices
        else:
            if gpus and devices > gpus:
                raise ValueError(
                    f"devices={devices!r} with strategy='ddp', but only {gpus} CUDA device(s) are visible. "
                    f"Use devices<={gpus}, or accelerator='cpu' to run {devices} CPU processes."
                )
            self.num_processes = devices
            self.device_ids = list(range(devices)) if gpus else None

    def describe(self) -> str:
        where = ", ".join(f"cuda:{i}" for i in self.device_ids) if self.device_ids else "cpu"
        return f"{self.name} ({self._backend()}) on {where}"

    def _backend(self, device_ids: list[int] | None = None) -> str:
        return self.backend or ("nccl" if (device_ids or self.device_ids) else "gloo")

    # --- lifecycle ---------------------------------------------------------------------
    def launch(self, fn: Callable[..., Any], *args: Any) -> Any:
        if dist.is_initialized() or launched_env() is not None:
            return fn(*args)
        self.spawned = True  # set before pickling, so the workers know they were spawned
        return spawn(fn, args, self.num_processes, self.start_method, timeout=self.timeout)

    def setup_environment(self) -> None:
        env = launched_env()
        if env is None and not dist.is_initialized():
            raise RuntimeError("DDPStrategy.setup_environment ran outside a launched process.")
        if env is not None:
            self.global_rank, self.world_size, self.local_rank = env.rank, env.world_size, env.local_rank
        else:  # the user initialised the group; one process per device is still assumed
            self.global_rank, self.world_size = dist.get_rank(), dist.get_world_size()
            self.local_rank = int(os.environ.get("LOCAL_RANK", self.global_rank))
        if self.device_ids:
            self.root_device = torch.device("cuda", self.device_ids[self.local_rank])
            torch.cuda.set_device(self.root_device)
        else:
            self.root_device = torch.device("cpu")
        if not dist.is_initialized():
            dist.init_process_group(
                self._backend(), store=_group_store(self.global_rank, self.world_size, self.timeout),
                rank=self.global_rank, world_size=self.world_size, timeout=self.timeout,
                # Binding the process to its GPU lets NCCL set up eagerly; gloo takes no device.
                device_id=self.root_device if self._backend() == "nccl" else None,
            )
            self._owns_group = True

    def setup_module(self, module: torch.nn.Module) -> None:
        if self.sync_batchnorm:
            if self.root_device.type != "cuda":
                raise ValueError(
                    "sync_batchnorm=True needs CUDA devices: torch's SyncBatchNorm runs only on GPUs. On the "
                    "CPU leave it off; every rank then normalises with its own batch's statistics in training, "
                    "and evaluates with rank 0's running statistics."
                )
            module = torch.nn.SyncBatchNorm.convert_sync_batchnorm(module)  # a TrainModule root: converted in place
        super().setup_module(module)
        if not getattr(module, "automatic_optimization", True):
            # DDP's gradient hooks expect one backward per forward, reaching the parameters the
            # forward used; a manual step runs several backward passes, each reaching some of
            # them. Instead each optimizer's gradients are averaged when it is about to use them
            # (sync_gradients). What DDP's constructor does, done here: start from rank 0's state.
            self._ddp = None
            self._buffers = any(True for _ in self.module.buffers())
            self._start_from_rank_zero(self.module)
            return
        self._ddp = DistributedDataParallel(
            StepDispatcher(self.module),
            device_ids=[self.root_device.index] if self.root_device.type == "cuda" else None,
            find_unused_parameters=self.find_unused_parameters,
        )

    def _start_from_rank_zero(self, module: torch.nn.Module) -> None:
        """What DDP's constructor does: every rank takes global rank 0's parameters and buffers."""
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=0)

    @property
    def wrapped_module(self) -> DistributedDataParallel | None:
        return self._ddp  # None outside setup_module..teardown, and under manual optimization

    @property
    def ddp_module(self) -> DistributedDataParallel:
        """The DistributedDataParallel wrapper, between ``setup_module`` and ``teardown``: for subclasses,
        e.g. to ``register_comm_hook`` right after ``super().setup_module``."""
        if self._ddp is None:
            raise RuntimeError(
                "DDPStrategy.ddp_module exists only after setup_module (inside fit) and before teardown, and not under "
                "manual optimization, where gradients are averaged by sync_gradients instead of DDP's hooks."
            )
        return self._ddp

    def teardown(self) -> None:
        # Free the DDP wrapper (and through it the process group's C++ side) now, while the interpreter is whole. Left
        # to interpreter shutdown, gloo's threads release tensors whose Python owners are already gone, and the worker
        # aborts at exit with SIGABRT ("terminate called without an active exception"); see pytorch/pytorch#179291.
        self._ddp = None
        gc.collect()
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
            _stores.clear()  # the rendezvous store too; the next group gets fresh keys anyway
        self._owns_group = False

    # --- data --------------------------------------------------------------------------
    def process_dataloader(self, loader: Any, stage: str) -> Any:
        """Give each rank its share of the data; the loader's batch size stays per process."""
        if (not self.use_distributed_sampler or not isinstance(loader, DataLoader)
                or isinstance(loader.sampler, DistributedSampler)):
            return loader  # the user shards it, sharded it already, or it is not ours to rebuild
        if isinstance(loader.dataset, IterableDataset):
            if self.is_global_zero:
                warnings.warn(
                    "strategy='ddp' cannot split an IterableDataset: every process reads all of it "
                    "unless the dataset shards itself by torch.distributed.get_rank().", stacklevel=2
                )
            return loader
        drawn_by = sampler_to_shard(loader)
        if drawn_by is None:
            return loader  # the user's own batch sampler over a DistributedSampler: sharded already
        if isinstance(drawn_by, DistributedSampler):  # inside a plain BatchSampler: made the loader's
            return rebuild_loader(loader, sampler=drawn_by)  # sampler, where set_epoch and resume find it
        if stage == "train":
            sampler: Sampler = DistributedSampler(
                loader.dataset, num_replicas=self.world_size, rank=self.global_rank,
                shuffle=isinstance(drawn_by, RandomSampler), drop_last=drops_last(loader),
                # One permutation for all ranks, or their shards would overlap: rank 0's seed.
                seed=self.broadcast_object(sampler_seed()),
            )
        else:  # no padding: metrics and predictions count every sample exactly once
            sampler = ContiguousShard(len(loader.dataset), self.world_size, self.global_rank)
        return rebuild_loader(loader, sampler=sampler)

    # --- steps -------------------------------------------------------------------------
    def run_step(self, step_name: str, batch: Any, batch_idx: int, *args: Any) -> Any:
        if step_name != "training_step" or self._ddp is None:
            # Evaluation needs no gradient sync; calling the module directly also lets ranks
            # hold different numbers of evaluation batches without a collective per step.
            # Manual optimization syncs in sync_gradients; its buffers follow rank 0's, as DDP's do.
            if step_name == "training_step" and self._buffers:
                self.broadcast_buffers()
            return super().run_step(step_name, batch, batch_idx, *args)
        with self.precision.autocast():
            return self.step_on_device(lambda *a: self._ddp(step_name, *a), batch, batch_idx, *args)

    def no_backward_sync(self) -> contextlib.AbstractContextManager:
        return self._ddp.no_sync()

    def sync_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Average ``params``' gradients over the ranks, in buckets of about 25 MB (DDP's size).
        A parameter that got no gradient on some rank counts as zero there; one that got none on
        any rank keeps ``grad=None``, so the optimizer skips it as one process would. Which is
        which costs one small all-reduce, and spares a hang when ranks' backward passes differ."""
        if not params:
            return
        got = torch.tensor([float(p.grad is not None) for p in params], device=self._collective_device())
        dist.all_reduce(got)
        live = [p for p, n in zip(params, got.tolist()) if n > 0]
        for p in live:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        by_type: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
        for p in live:  # one flat buffer needs one dtype and device
            by_type.setdefault((p.grad.dtype, p.grad.device), []).append(p.grad)
        for grads in (bucket for same in by_type.values() for bucket in _buckets(same, _BUCKET_BYTES)):
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)
            flat /= self.world_size
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()

    def compile(self, options: dict[str, Any]) -> None:
        # torch's advice for DDP: compile the wrapper, so that the compiler splits the graph at DDP's buckets and their
        # all-reduces still overlap the backward. Evaluation calls the module itself: compiled in place as well.
        if self._ddp is not None:
            self._ddp.compile(**options)
        self.module.compile(**options)

    # --- collectives -------------------------------------------------------------------
    def barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        # NCCL reduces only CUDA tensors; callers pass small CPU flag tensors.
        device = tensor.device
        tensor = tensor.to(self._collective_device())
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor.to(device)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def gather_objects(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, tensors_as_bytes(obj))  # RNG states, metrics: no torch.save per tensor
        return out

    def broadcast_buffers(self) -> None:
        # Training changes each rank's running statistics with its own batches (DDP broadcasts
        # rank 0's only at the next forward): evaluate with rank 0's, as its checkpoint holds them.
        for buffer in self.module.buffers():
            dist.broadcast(buffer, src=0)

    def gather_predictions(self, outputs: list[Any]) -> list[Any] | None:
        # To rank 0 only, and through the CPU: an all-gather would hold every rank's outputs
        # on every rank, and unpickle CUDA tensors onto the devices they were made on.
        on_cpu = apply_to_tensors(outputs, lambda t: t.detach().cpu())
        parts: list[Any] | None = [None] * self.world_size if self.is_global_zero else None
        dist.gather_object(on_cpu, parts, dst=0)
        return None if parts is None else [o for part in parts for o in part]

    def reduce_metrics(
        self, parts: dict[str, tuple[torch.Tensor, torch.Tensor]]
    ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        # A rank with no evaluation batches logged nothing: agree on the names first.
        names = sorted(set().union(*self.gather_objects(sorted(parts))))
        if not names:
            return {}
        zero = torch.zeros((), dtype=torch.float64)
        flat = torch.stack(
            [v.detach().to("cpu", torch.float64) for n in names for v in parts.get(n, (zero, zero))]
        ).to(self._collective_device())
        # gloo has no AVG reduce: sum (value * weight) and the weights, divide later.
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat = flat.cpu()
        return {n: (flat[2 * i], flat[2 * i + 1]) for i, n in enumerate(names)}

    def _collective_device(self) -> torch.device:
        return self.root_device if self._backend() == "nccl" else torch.device("cpu")

    @contextlib.contextmanager
    def rank_zero_first(self) -> Iterator[None]:
        if not self.is_global_zero:
            self.barrier()
        yield
        if self.is_global_zero:
            self.barrier()


_stores: dict[tuple[str, str, int], dist.Store] = {}
_BUCKET_BYTES = 25 * 2**20
_groups_started = itertools.count()


def _buckets(tensors: list[torch.Tensor], limit: int) -> Iterator[list[torch.Tensor]]:
    """``tensors`` in order, in runs of at least ``limit`` bytes (the last one shorter)."""
    bucket, size = [], 0
    for t in tensors:
        bucket.append(t)
        size += t.numel() * t.element_size()
        if size >= limit:
            yield bucket
            bucket, size = [], 0
    if bucket:
        yield bucket


def _group_store(rank: int, world_size: int, timeout: timedelta) -> dist.Store:
    """A fresh key space, for one process group, on a rendezvous store kept for the process's life.

    torch names the default group's rendezvous keys the same every time, so a second group on the same store (fit after
    fit under torchrun, whose agent keeps the store) can read the first group's stale addresses and hang or be refused
    (pytorch/pytorch#55967). A store made anew each time would instead race for MASTER_PORT. Every rank starts its
    groups in the same order, so the counter agrees across ranks.
    """
    key = (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"], world_size)
    if key not in _stores:
        _stores[key], _, _ = next(dist.rendezvous("env://", rank=rank, world_size=world_size, timeout=timeout))
    # torchrun --max-restarts starts new workers on the same store: their counter starts at 0 again.
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"trainer/{attempt}/{next(_groups_started)}", _stores[key])


def _timeout(value: Any) -> timedelta:
    if isinstance(value, bool) or not isinstance(value, (int, float, timedelta)):
        raise TypeError(f"DDPStrategy(timeout={value!r}): give seconds (a number) or a datetime.timedelta.")
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if not 0 < seconds <= timedelta.max.total_seconds():  # also refuses nan and inf
        raise ValueError(
            f"DDPStrategy(timeout={value!r}) must be a finite time > 0: how long a collective may wait for "
            f"the other ranks before the job fails (default {DEFAULT_TIMEOUT.total_seconds():g} s)."
        )
    return value if isinstance(value, timedelta) else timedelta(seconds=seconds)
