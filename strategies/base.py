"""The Strategy interface. Every default here is what one process on one device needs."""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch
from torch import nn

from trainer.checkpoint.files import save_atomic
from trainer.checkpoint.state_dicts import load_plain_state_dict, optimizer_state_by_position
from trainer.data.batches import move_to_device, on_cpu
from trainer.data.device_copy import copied_ahead

from ._spawn import note_failure
from .precision import Precision


class StepDispatcher(nn.Module):
    """Routes ``forward(step_name, batch, batch_idx)`` to the user's ``*_step`` method.

    Wrappers such as DistributedDataParallel hook their gradient sync into ``forward``, and
    DataParallel replicates whatever ``forward`` runs; this is how a whole ``training_step``
    (forward and loss) goes through them.
    """

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, step_name: str, batch: Any, batch_idx: int, *args: Any) -> Any:
        return getattr(self.module, step_name)(batch, batch_idx, *args)


_NO_SYNC = contextlib.nullcontext()


class Strategy:
    """How batches reach devices, where steps run, and how processes agree.

    A subclass overrides only what differs. The Trainer calls these methods and never asks
    which strategy it has.
    """

    name = "base"
    #: ``Trainer(accelerator=...)`` when one was named: "cpu", "cuda" or "mps"; None ("auto")
    #: runs on CUDA when there is a GPU. Set before ``configure_devices``.
    accelerator: str | None = None
    #: ``Trainer(use_distributed_sampler=False)``: a strategy that shards loaders leaves them as given.
    use_distributed_sampler = True
    #: True when fit/validate/... ran in processes other than the caller's; the caller
    #: then copies rank 0's results back.
    spawned = False
    #: Lightning's ``ddp_spawn`` (its spawning launcher): when a spawned stage fails, the ``on_exception``
    #: hooks run once, in the caller's process, with the error the caller gets; the workers' run only
    #: for ``ddp`` (every rank's own, as Lightning's ``ddp`` runs them in each process).
    on_exception_in_caller = False

    def __init__(self, precision: Precision | None = None) -> None:
        self.root_device = torch.device("cpu")
        self.global_rank = 0
        self.local_rank = 0
        self.world_size = 1
        #: autocast and the gradient scaler: the Trainer's ``precision=`` (full precision if not given)
        self.precision: Precision = Precision() if precision is None else precision
        self.module: nn.Module | None = None  # the user's TrainModule, unwrapped
        # Set by Trainer(sync_batchnorm=True): BatchNorm statistics over all processes' batches.
        self.sync_batchnorm = False
        #: Lightning's: the fit's optimizers, in ``configure_optimizers``' order (set as fit builds them)
        self.optimizers: list[torch.optim.Optimizer] = []

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    @property
    def num_devices(self) -> int:
        """How many devices one batch from the user's loader is spread over in this process."""
        return 1

    def describe(self) -> str:
        """The strategy and where it runs, for the line logged at the start of fit."""
        return f"{self.name} on {self.root_device}"

    def configure_devices(self, devices: str | int | list[int]) -> None:
        """Take ``Trainer(devices=...)`` (already checked by ``normalize_devices``).

        The default is one device: ``"auto"``, ``1`` or ``[index]``.
        """
        count = 1 if devices == "auto" else devices if isinstance(devices, int) else len(devices)
        if count > 1:
            raise ValueError(
                f"devices={devices!r} with strategy={self.name!r}, which runs on one device. "
                "Use strategy='ddp' (one process per device) or strategy='dp', or devices=1."
            )
        if isinstance(devices, list):
            if self.accelerator in ("cpu", "mps"):
                raise ValueError(
                    f"devices={devices!r} lists GPU indices, but accelerator={self.accelerator!r} has none: "
                    "pass devices=1 (or 'auto')."
                )
            check_cuda_indices("devices", devices, devices)
            self.root_device = torch.device("cuda", devices[0])
        elif self.accelerator == "cpu":
            self.root_device = torch.device("cpu")
        elif self.accelerator == "mps":
            self.root_device = torch.device("mps")

    def visible_gpus(self) -> int:
        """The CUDA devices this strategy may use: none under accelerator='cpu' or 'mps'."""
        return torch.cuda.device_count() if self.accelerator in (None, "cuda") else 0

    # --- lifecycle ---------------------------------------------------------------------
    def launch(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run ``fn`` in the process(es) that train. Default: right here."""
        return fn(*args)

    def setup_environment(self) -> None:
        """Join process groups, pick the device. Runs inside each training process."""

    def setup_module(self, module: nn.Module) -> None:
        self.module = module.to(self.root_device)

    @property
    def wrapped_module(self) -> nn.Module | None:
        """The module as this strategy wraps it while a stage runs (``DistributedDataParallel`` under
        ddp), which ``trainer.model`` returns; None (the default) when it runs the module as it is."""
        return None

    def teardown(self) -> None:
        """Undo ``setup_environment`` so that the next fit can start clean."""

    def on_exception(self, exception: BaseException) -> None:
        """Called first when a stage fails, before the ``on_exception`` hooks. In a spawned DDP worker
        it notes the time: the rank that failed first is the one named, not a peer that lost its
        connection while this rank was still cleaning up (a hung loader worker takes seconds)."""
        note_failure()

    # --- data --------------------------------------------------------------------------
    def process_dataloader(self, loader: Any, stage: str) -> Any:
        return loader

    def batch_to_device(self, batch: Any) -> Any:
        return move_to_device(batch, self.root_device)

    def device_batches(self, batches: Iterable[Any]) -> Iterable[Any]:
        """What the loop iterates for one pass over a loader. On a CUDA device, each batch's
        copy there starts on a side stream as soon as it is fetched, beside the GPU's work on
        the step before (trainer/data/device_copy.py); then ``batch_to_device`` has nothing left
        to move. A strategy with a ``batch_to_device`` of its own gets its batches as they are."""
        if self.root_device.type != "cuda" or type(self).batch_to_device is not Strategy.batch_to_device:
            return batches
        return copied_ahead(batches, self.root_device)

    # --- steps -------------------------------------------------------------------------
    def run_step(self, step_name: str, batch: Any, batch_idx: int, *args: Any) -> Any:
        """Run ``module.<step_name>(batch, batch_idx, *args)`` on this strategy's device(s).
        ``args`` is ``(dataloader_idx,)`` for an evaluation step that takes it, else empty."""
        step = getattr(self.module, step_name)
        if self.precision.dtype is None:  # full precision: no autocast region to enter on every step
            return self.step_on_device(step, batch, batch_idx, *args)
        with self.precision.autocast():
            return self.step_on_device(step, batch, batch_idx, *args)

    def step_on_device(self, step: Callable[..., Any], batch: Any, batch_idx: int, *args: Any) -> Any:
        """``step(batch, batch_idx, *args)`` with ``batch`` on this strategy's device (``batch_to_device``):
        the one place where every strategy's ``run_step`` moves a batch (the loop's pipeline,
        trainer/data/pipeline.py, has usually copied it there already, and then nothing moves)."""
        return step(self.batch_to_device(batch), batch_idx, *args)

    def step_runner(self, step_name: str, first_batch: Any) -> Callable[[Any, int], Any]:
        """What the loop calls for each batch of an epoch: ``run_step`` with ``step_name`` bound.

        A strategy that keeps this class's ``run_step`` and ``batch_to_device``, in full
        precision on the CPU, with a first batch already on the CPU, gets the user's step
        method itself: in a training loop each call in between can cost up to a microsecond,
        and here it would do nothing. The rest of that epoch's batches are taken to be on
        the CPU too, as a DataLoader's are (a stray one on a GPU fails in the model, loudly).
        Subclasses override ``run_step``, not this.
        """
        cls, own = type(self), vars(self)
        plain = (
            cls.run_step is Strategy.run_step and cls.batch_to_device is Strategy.batch_to_device
            and "run_step" not in own and "batch_to_device" not in own  # e.g. mock.patch.object
        )
        if plain and self.precision.dtype is None and self.root_device.type == "cpu" and on_cpu(first_batch):
            return getattr(self.module, step_name)
        return functools.partial(self.run_step, step_name)

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def sync_gradients(self, params: list[nn.Parameter]) -> None:
        """Manual optimization, before an optimizer clips or steps: make ``params``' gradients
        what one process with all the processes' batches would hold (their mean). One process:
        nothing to do."""

    def compile(self, options: dict[str, Any]) -> None:
        """``Trainer(compile=...)``: compile the module in place (its ``__call__``, so its
        ``state_dict`` keys stay as they are), after ``setup_module``."""
        self.module.compile(**options)

    def no_backward_sync(self) -> contextlib.AbstractContextManager:
        """Context for an accumulation micro-step whose gradients need no sync yet."""
        return _NO_SYNC

    # --- collectives (identities on one process) ---------------------------------------
    def barrier(self) -> None: ...

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        return obj

    def any_rank(self, flag: bool) -> bool:
        """True on every process if ``flag`` is True on any: for decisions all ranks must share."""
        if self.world_size == 1:
            return flag
        return bool(self.all_reduce_sum(torch.tensor([float(flag)])).item() > 0)

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's ``obj``, in rank order (all ranks receive the list)."""
        return [obj]

    def broadcast_buffers(self) -> None:
        """Before evaluation: every process takes global rank 0's buffers (BatchNorm running
        statistics), so that all evaluate the model a checkpoint holds. One process: nothing."""

    def gather_predictions(self, outputs: list[Any]) -> list[Any] | None:
        """``predict``'s outputs as the caller receives them: every rank's, in rank order, on the
        rank that returns them (global rank 0); None on the others."""
        return outputs

    def reduce_metrics(
        self, parts: dict[str, tuple[torch.Tensor, torch.Tensor]]
    ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Sum each (weighted_sum, weight) pair across processes."""
        return parts

    @contextlib.contextmanager
    def rank_zero_first(self) -> Iterator[None]:
        yield

    # --- checkpoints -------------------------------------------------------------------
    # Every rank calls these (a sharding strategy gathers); what they return matters on rank 0.
    def module_state_dict(self) -> dict[str, torch.Tensor]:
        """The user's module's state dict, with no wrapper's prefix (``module.``): its own keys, as Lightning
        writes them (a submodule the user compiled, ``self.net = torch.compile(self.net)``, keeps ``_orig_mod.``)."""
        return self.module.state_dict()

    def load_module_state_dict(self, state: dict[str, torch.Tensor], strict: bool = True) -> None:
        """Load a full state dict with the bare model's keys (every rank holds all of it);
        ``strict=False`` (the model's ``strict_loading``) loads the keys that match."""
        load_plain_state_dict(self.module, state, strict=strict)

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer's state as the checkpoint holds it: torch's own form, keyed by position."""
        return optimizer.state_dict()

    @property
    def lightning_restore_optimizer(self) -> bool:
        """Lightning's switch: False when the strategy restores the optimizers and schedulers
        itself, and a resumed fit leaves them as ``configure_optimizers`` built them."""
        return True

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        """Lightning's: the checkpoint's ``optimizer_states`` into :attr:`optimizers`, in order."""
        for optimizer, state in zip(self.optimizers, checkpoint.get("optimizer_states") or ()):
            self.load_optimizer_state(optimizer, state)

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Load one optimizer's state keyed by position, or by parameter name (as an fsdp checkpoint holds it)."""
        optimizer.load_state_dict(optimizer_state_by_position(state, optimizer, self.module))

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: str | os.PathLike, storage_options: Any = None
    ) -> None:
        """Lightning's: write ``checkpoint`` (the dict ``trainer.checkpoint_state()`` builds) to
        ``filepath``, on global rank 0, atomically. ``trainer.save_checkpoint`` calls it."""
        if storage_options is not None:
            name = type(self).__name__
            raise TypeError(
                f"`{name}.save_checkpoint(..., storage_options=...)` is not supported because `{name}` does not use "
                "a `CheckpointIO`: checkpoints are local files written with torch.save. Write locally, then copy."
            )
        if self.is_global_zero:
            save_atomic(checkpoint, filepath)

    #: True when each process holds only a shard of the parameters, so that a forward pass on
    #: one rank alone would wait for the others (ModelSummary's example forward is skipped then).
    shards_parameters = False

    #: True when checkpoints are folders that every rank writes its shards into
    #: (``save_sharded_checkpoint``), instead of one file that global rank 0 writes.
    sharded_checkpoints = False

    def save_sharded_checkpoint(self, meta: dict[str, Any] | None, path: str, optimizers: list[Any]) -> None:
        raise NotImplementedError(f"strategy={self.name!r} writes one checkpoint file; it has no sharded format.")

    def load_sharded_checkpoint(self, path: str, optimizers: list[Any]) -> None:
        raise ValueError(
            f"ckpt_path={path!r} is a sharded checkpoint (a folder written by FSDPStrategy(checkpoint='sharded')), "
            f"which strategy={self.name!r} cannot read. Resume or evaluate it under strategy='fsdp' (any number of "
            "processes), or save full checkpoints (the default) to move between strategies."
        )

    def evaluating(self) -> contextlib.AbstractContextManager:
        """Held around each evaluation loader's batches (validation inside fit too), e.g. to
        gather sharded parameters once instead of at every step."""
        return _NO_SYNC


class ParallelStrategy(Strategy):
    """Lightning's base of the strategies that run one model on several devices (``"ddp"``,
    ``"fsdp"``, ``"dp"``), for code that asks ``isinstance(trainer.strategy, ParallelStrategy)``.
    It adds nothing to :class:`Strategy`, whose members every strategy already has."""


def check_cuda_indices(arg: str, value: Any, indices: list[int], cpu_fix: str = "use devices=1 or 'auto'") -> None:
    """Raise a ValueError naming ``arg`` if an index is not a visible CUDA device.

    Indices are relative to ``CUDA_VISIBLE_DEVICES``, as torch's are.
    """
    count = torch.cuda.device_count()
    missing = [i for i in indices if not 0 <= i < count]
    if not missing:
        return
    fix = (f"valid indices are 0..{count - 1} (relative to CUDA_VISIBLE_DEVICES)" if count
           else f"to run on the CPU, {cpu_fix}")
    raise ValueError(
        f"{arg}={value!r}: CUDA device {', '.join(map(str, missing))} does not exist; this machine has "
        f"{count} visible CUDA device(s), so {fix}."
    )


def device_id_list(owner: str, device_ids: Any) -> list[int] | None:
    """A strategy's ``device_ids`` argument as a list (an index may repeat), or None."""
    if device_ids is not None and (
        not isinstance(device_ids, (list, tuple)) or not device_ids
        or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in device_ids)
    ):
        raise ValueError(f"{owner}(device_ids={device_ids!r}) must be a non-empty list of CUDA indices, e.g. [0, 1].")
    return None if device_ids is None else list(device_ids)


def check_given_ids(owner: str, device_ids: list[int], devices: Any) -> None:
    """The strategy's ``device_ids`` choose the devices: ``Trainer(devices=...)`` must stay 'auto'."""
    if devices != "auto":
        raise ValueError(
            f"devices={devices!r} and {owner}(device_ids={device_ids!r}) both choose the devices. "
            "Give only one of them."
        )
    check_cuda_indices(f"{owner}(device_ids)", device_ids, device_ids)
