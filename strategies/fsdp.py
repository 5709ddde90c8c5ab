"""Sharded data parallel on PyTorch's FSDP2 (``torch.distributed.fsdp.fully_shard``).

Each process holds a 1/world_size shard of every parameter, its gradient and its optimizer
state. A shard group's full parameters are all-gathered just before its forward (and again
for backward), and its gradients are reduce-scattered right after its backward. Launching,
data sharding and collectives are ddp's: this strategy is a ``DDPStrategy`` that shards the
model instead of replicating it.
"""

import contextlib
import os
import uuid
from datetime import timedelta
from typing import Any, Callable, Iterator

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions, get_model_state_dict, get_optimizer_state_dict, set_model_state_dict, set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffload, CPUOffloadPolicy, FSDPModule, MixedPrecision, MixedPrecisionPolicy, OffloadPolicy, ShardingStrategy,
    fully_shard,
)

from trainer.checkpoint.files import SHARDED_META, replace_folder, save_atomic
from trainer.checkpoint.sharded_read import load_shards, saved_keys
from trainer.checkpoint.state_dicts import (
    optimizer_state_by_name, optimizer_state_by_position, param_names, plain_state_dict,
)

from . import _fsdp_options as lightning_options
from .base import StepDispatcher
from .ddp import DEFAULT_TIMEOUT, DDPStrategy
from .precision import Precision

_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)  # gathered to CPU memory, one tensor at a time


def _repeated_blocks(module: nn.Module) -> set[int]:
    """The default shard groups: children of a ModuleList or Sequential whose class repeats there."""
    found: set[int] = set()
    for container in module.modules():
        if isinstance(container, (nn.ModuleList, nn.Sequential)):
            with_params = [c for c in container.children() if any(True for _ in c.parameters())]
            classes = [type(c) for c in with_params]
            found |= {id(c) for c in with_params if classes.count(type(c)) >= 2}
    return found


class FSDPStrategy(DDPStrategy):
    """One process per device, each holding a shard of the model (FSDP2's ``fully_shard``).

    - ``shard``: which submodules become shard groups (each all-gathered on its own, so only
      one group's full parameters exist at a time): a list of module classes, e.g.
      ``[TransformerBlock]``, or a function ``module -> bool``. The default shards a model's
      repeated blocks: in each ``nn.ModuleList`` or ``nn.Sequential``, every child whose class
      (holding parameters) occurs there at least twice. The root module is always sharded,
      holding whatever no group took.
    - ``reshard_after_forward``: free the gathered parameters after each group's forward
      (less memory, one more all-gather in backward); False keeps them until backward.
    - ``cpu_offload``: keep the parameter shards, gradients and optimizer state in CPU memory
      (CUDA only): the most memory saved, at a large cost in speed. True, False or Lightning's
      ``CPUOffload(offload_params=...)``; the attribute is always a ``CPUOffload``.
    - ``reduce_dtype``: the gradients' dtype in the reduce-scatter under ``precision="bf16-mixed"``
      (default float32; ``torch.bfloat16`` halves the traffic at some cost in accuracy).

    Lightning's options, which name FSDP1's settings, mean the same here (strategies/_fsdp_options.py):
    ``mixed_precision`` (a ``MixedPrecision``, or FSDP2's ``MixedPrecisionPolicy``) instead of the
    one ``precision`` implies; ``sharding_strategy``: ``"FULL_SHARD"`` (the default), ``"SHARD_GRAD_OP"``
    (``reshard_after_forward=False``), ``"NO_SHARD"`` (each process keeps everything, as ``ddp``),
    ``"HYBRID_SHARD"`` with ``device_mesh=(replicas, shard size)``; ``auto_wrap_policy``, a set of
    module classes, is ``shard``; ``state_dict_type`` is ``checkpoint``. Other keywords are kept in
    ``.kwargs``: ``fully_shard``'s own, and FSDP1 options that FSDP2 does by itself
    (``use_orig_params``, default True, and the prefetch options); any other is refused.

    Checkpoints hold the full state dict, gathered to CPU memory on rank 0 one tensor at a
    time, with the bare model's keys; the optimizer state is keyed by parameter name, so it
    loads under any world size, and under ``ddp`` and ``single`` too. ``checkpoint="sharded"``
    writes a folder instead, each rank its own shards (``torch.distributed.checkpoint``), for
    a state too large for one process's memory.
    """

    name = "fsdp"
    shards_parameters = True

    def __init__(
        self,
        shard: list[type[nn.Module]] | Callable[[nn.Module], bool] | None = None,
        reshard_after_forward: bool | None = None,
        cpu_offload: bool | CPUOffload | None = None,
        reduce_dtype: torch.dtype | None = None,
        checkpoint: str = "full",
        backend: str | None = None,
        start_method: str = "spawn",
        timeout: timedelta | float = DEFAULT_TIMEOUT,
        device_ids: list[int] | None = None,
        precision: Precision | None = None,
        mixed_precision: MixedPrecision | MixedPrecisionPolicy | None = None,
        sharding_strategy: ShardingStrategy | str | None = None,
        device_mesh: tuple[int, int] | DeviceMesh | None = None,
        auto_wrap_policy: set[type[nn.Module]] | list[type[nn.Module]] | None = None,
        state_dict_type: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            backend=backend, start_method=start_method, timeout=timeout, device_ids=device_ids, precision=precision,
        )
        shard = lightning_options.shard_of(shard, auto_wrap_policy)
        if state_dict_type is not None and checkpoint != "full" and state_dict_type != checkpoint:
            raise ValueError(
                f"FSDPStrategy(checkpoint={checkpoint!r}, state_dict_type={state_dict_type!r}): state_dict_type is "
                "Lightning's name for checkpoint. Pass one of them."
            )
        checkpoint = state_dict_type if state_dict_type is not None else checkpoint
        if shard is not None and not callable(shard) and not (
            isinstance(shard, (list, tuple)) and all(isinstance(c, type) and issubclass(c, nn.Module) for c in shard)
        ):
            raise TypeError(
                f"FSDPStrategy(shard={shard!r}) must be a list of module classes, e.g. shard=[TransformerBlock], "
                "or a function that takes a module and returns True for those to shard on their own."
            )
        if reduce_dtype is not None and not (isinstance(reduce_dtype, torch.dtype) and reduce_dtype.is_floating_point):
            raise TypeError(
                f"FSDPStrategy(reduce_dtype={reduce_dtype!r}) must be a floating torch.dtype, e.g. torch.float32."
            )
        if checkpoint not in ("full", "sharded"):
            raise ValueError(
                f"FSDPStrategy(checkpoint={checkpoint!r}): 'full' (one file with the full state, the default) or "
                "'sharded' (one folder, each rank writing its shards: for states too large for one process's memory)."
            )
        if reduce_dtype is not None and mixed_precision is not None:
            raise ValueError(
                f"FSDPStrategy(reduce_dtype={reduce_dtype!r}, mixed_precision=...): give the reduce dtype inside "
                "mixed_precision (its reduce_dtype) and drop reduce_dtype."
            )
        self.sharded_checkpoints = checkpoint == "sharded"
        self.shard = tuple(shard) if isinstance(shard, (list, tuple)) else shard
        self.sharding_strategy = lightning_options.sharding_strategy_of(sharding_strategy, reshard_after_forward)
        lightning_options.check_device_mesh(device_mesh, self.sharding_strategy)
        self.reshard_after_forward = lightning_options.reshards(self.sharding_strategy)
        self.cpu_offload = lightning_options.cpu_offload_config(cpu_offload)
        self.reduce_dtype = reduce_dtype
        self.mixed_precision = mixed_precision
        self._mp_policy = lightning_options.mp_policy_of(mixed_precision)
        lightning_options.check_kwargs(kwargs)
        self.kwargs: dict[str, Any] = {"use_orig_params": True, **kwargs}  # FSDP2 always keeps the original params
        if device_mesh is not None:
            self.kwargs["device_mesh"] = device_mesh
        self.mesh: DeviceMesh | None = None
        self._root: Any = None  # the sharded StepDispatcher around the user's module

    # --- the model ---------------------------------------------------------------------
    def setup_module(self, module: nn.Module) -> None:
        if self.sync_batchnorm:
            raise ValueError(
                "sync_batchnorm=True is not supported with strategy='fsdp'. Leave it off, or use strategy='ddp'."
            )
        if self.precision.precision == "16-mixed":
            raise ValueError(
                "precision='16-mixed' with strategy='fsdp': float16 gradients need a sharded gradient scaler, which "
                "this strategy does not have. Use precision='bf16-mixed' (no scaler needed) or '32'."
            )
        if self.cpu_offload.offload_params and self.root_device.type != "cuda":
            raise ValueError(
                "FSDPStrategy(cpu_offload=True) moves shards from GPU to CPU memory; on a CPU run leave it off."
            )
        on_meta = any(t.is_meta for t in [*module.parameters(), *module.buffers()])
        self.module = module if on_meta else module.to(self.root_device)
        self.mesh = self._device_mesh()
        if not on_meta:
            self._start_from_rank_zero(module)
        options: dict[str, Any] = dict(mesh=self.mesh, reshard_after_forward=self.reshard_after_forward)
        options.update({k: v for k, v in self.kwargs.items() if k in lightning_options.PASSED})
        if self._mp_policy is not None:  # the user's, in place of the one precision implies
            options["mp_policy"] = self._mp_policy
        elif self.precision.dtype is not None:  # bf16-mixed: FSDP casts the parameters, no autocast
            options["mp_policy"] = MixedPrecisionPolicy(
                param_dtype=self.precision.dtype, reduce_dtype=self.reduce_dtype or torch.float32
            )
        options["offload_policy"] = CPUOffloadPolicy() if self.cpu_offload.offload_params else OffloadPolicy()
        # Children before parents: a group holds the parameters its shard groups did not take.
        listed = set() if self.shard is not None else _repeated_blocks(module)
        manual = not getattr(module, "automatic_optimization", True)
        if manual:
            # Manual optimization runs backward inside training_step. Inside a sharded root's
            # forward, FSDP would not see those backward passes; so each top-level child becomes
            # a root of its own, whose forward the step calls, and the step runs unwrapped.
            own = [name for name, _ in module.named_parameters(recurse=False)]
            if own:
                raise ValueError(
                    f"strategy='fsdp' with manual optimization shards {type(module).__name__}'s submodules, and "
                    f"{own[:3]} belong to the module itself. Move them into a submodule (e.g. an nn.ParameterDict)."
                )
            listed |= {id(c) for c in module.children() if any(True for _ in c.parameters())}
        for sub in reversed(list(module.modules())):
            if sub is not module and self._shards(sub, listed):
                fully_shard(sub, **options)
        if not manual:
            self._root = fully_shard(StepDispatcher(module), **options)
        if on_meta:
            self._materialize(module)

    def _device_mesh(self) -> DeviceMesh:
        """An explicit mesh of this process group's ranks: the device type decides the backend
        (cuda with NCCL, cpu with gloo); an implicit one can pick gloo for GPU tensors. A 2-D mesh
        (replicas, shard size) makes fully_shard replicate across its rows (HSDP): NO_SHARD is (N, 1)."""
        given = self.kwargs.get("device_mesh")
        if isinstance(given, DeviceMesh):
            return given
        if given is None and self.sharding_strategy != ShardingStrategy.NO_SHARD:
            return init_device_mesh(self.root_device.type, (self.world_size,))
        shape = tuple(given) if given is not None else (self.world_size, 1)
        if shape[0] * shape[1] != self.world_size:
            raise ValueError(
                f"FSDPStrategy(device_mesh={given!r}) spans {shape[0] * shape[1]} processes, but this run has "
                f"{self.world_size}: make the product of (replicas, shard size) the number of processes."
            )
        return init_device_mesh(self.root_device.type, shape, mesh_dim_names=("replicate", "shard"))

    @property
    def mixed_precision_config(self) -> MixedPrecision | MixedPrecisionPolicy | None:
        """Lightning's: the ``mixed_precision`` given, else None (the Trainer's ``precision`` decides)."""
        return self.mixed_precision

    def _shards(self, sub: nn.Module, listed: set[int]) -> bool:
        if id(sub) in listed:
            return True
        if self.shard is None:
            return False
        return isinstance(sub, self.shard) if isinstance(self.shard, tuple) else bool(self.shard(sub))

    def _materialize(self, module: nn.Module) -> None:
        """A model built on the meta device: allocate the shards here, then let each submodule's
        ``reset_parameters()`` initialise its own (on every rank, each drawing its shard)."""
        device = torch.device("cpu") if self.cpu_offload.offload_params else self.root_device
        module.to_empty(device=device)
        with torch.no_grad():
            for sub in module.modules():
                if callable(getattr(sub, "reset_parameters", None)):
                    sub.reset_parameters()
        still = [n for n, t in [*module.named_parameters(), *module.named_buffers()] if t.is_meta]
        if still:
            raise ValueError(
                f"The model was built on the meta device and {still[:3]} stayed there: "
                "give their modules a reset_parameters()."
            )

    def teardown(self) -> None:
        self._root, self.mesh = None, None
        super().teardown()

    # --- steps -------------------------------------------------------------------------
    def run_step(self, step_name: str, batch: Any, batch_idx: int, *args: Any) -> Any:
        # Every step goes through the sharded root, whose forward gathers the parameters. The
        # mixed-precision policy casts them, so no autocast region is needed.
        if self._root is None:  # manual optimization: the step itself calls the sharded submodules
            return self.step_on_device(getattr(self.module, step_name), batch, batch_idx, *args)
        return self.step_on_device(lambda *a: self._root(step_name, *a), batch, batch_idx, *args)

    @contextlib.contextmanager
    def no_backward_sync(self) -> Iterator[None]:
        # Accumulation micro-steps keep their unsharded gradients; the reduce-scatter waits for the last.
        for group in self._groups():
            group.set_requires_gradient_sync(False, recurse=False)
        try:
            yield
        finally:
            for group in self._groups():
                group.set_requires_gradient_sync(True, recurse=False)

    def _groups(self) -> list[FSDPModule]:
        top = self._root if self._root is not None else self.module
        return [m for m in top.modules() if isinstance(m, FSDPModule)]

    def sync_gradients(self, params: list[nn.Parameter]) -> None:
        """Manual optimization: each backward already reduce-scattered its gradients."""

    @contextlib.contextmanager
    def evaluating(self) -> Iterator[None]:
        # Gather every group once and keep it gathered: evaluation steps then need no
        # collective, so ranks whose shards hold different numbers of batches cannot hang.
        groups = self._groups()
        for group in groups:
            group.set_reshard_after_forward(False, recurse=False)
            group.unshard()
        try:
            yield
        finally:
            for group in groups:
                group.reshard()
                group.set_reshard_after_forward(self.reshard_after_forward, recurse=False)

    def compile(self, options: dict[str, Any]) -> None:
        self.module.compile(**options)  # per torch's FSDP2 advice: compile inside the shard groups

    # --- checkpoints -------------------------------------------------------------------
    def module_state_dict(self) -> dict[str, torch.Tensor]:
        return plain_state_dict(get_model_state_dict(self.module, options=_FULL))

    def load_module_state_dict(self, state: dict[str, torch.Tensor], strict: bool = True) -> None:
        options = StateDictOptions(full_state_dict=True, strict=strict)
        set_model_state_dict(self.module, plain_state_dict(state), options=options)

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        if _stateless(optimizer):  # see _stateless: torch's call would first take a step
            return optimizer_state_by_name(optimizer.state_dict(), optimizer, self.module)
        return get_optimizer_state_dict(self.module, optimizer, options=_FULL)

    def save_sharded_checkpoint(self, meta: dict[str, Any] | None, path: str, optimizers: list[Any]) -> None:
        """Every rank writes its shards into a hidden temp folder, global rank 0 adds the rest
        (``meta.pt``), then renames the folder into place: ``path`` is the old checkpoint or the
        complete new one, never a half-written folder."""
        directory, name = os.path.split(os.path.abspath(path))
        tmp = os.path.join(directory, f".tmp-{name}-{uuid.uuid4().hex}") if self.is_global_zero else None
        tmp = self.broadcast_object(tmp)
        dcp.save(self._sharded_state(optimizers), checkpoint_id=tmp)
        if self.is_global_zero:
            save_atomic(meta, os.path.join(tmp, SHARDED_META))
            replace_folder(tmp, path)
        self.barrier()

    def load_sharded_checkpoint(self, path: str, optimizers: list[Any]) -> None:
        """Read this rank's shards of a sharded checkpoint (written under any number of processes)."""
        # The keys the folder holds, e.g. "optimizer_states.0.state.net.0.weight.exp_avg"
        saved = saved_keys(path)
        state = self._sharded_state(optimizers, saved)
        load_shards(state, path)  # no code from the folder runs (trainer/checkpoint/sharded_read.py)
        set_model_state_dict(self.module, state["model"])
        for optimizer, optimizer_state in zip(optimizers, state.get("optimizer_states", [])):
            self._set_optimizer_state(optimizer, optimizer_state, StateDictOptions())

    def _sharded_state(self, optimizers: list[Any], saved: set[str] | None = None) -> dict[str, Any]:
        """What each rank writes, or (``saved``: the keys in the folder) the template it reads into."""
        state: dict[str, Any] = {"model": get_model_state_dict(self.module)}
        if optimizers:  # evaluation reads the model only
            state["optimizer_states"] = [self._sharded_optimizer_state(i, o, saved) for i, o in enumerate(optimizers)]
        return state

    def _sharded_optimizer_state(
        self, index: int, optimizer: torch.optim.Optimizer, saved: set[str] | None
    ) -> dict[str, Any]:
        prefix = f"optimizer_states.{index}.state."
        if (saved is None and _stateless(optimizer)
                or saved is not None and not any(k.startswith(prefix) for k in saved)):
            return optimizer_state_by_name(optimizer.state_dict(), optimizer, self.module)  # param_groups only
        state = get_optimizer_state_dict(self.module, optimizer)
        if saved is not None:  # the template of a fresh optimizer holds every parameter's state; read those saved
            state["state"] = {
                name: {k: v for k, v in per_param.items() if f"{prefix}{name}.{k}" in saved}
                for name, per_param in state["state"].items()
            }
            state["state"] = {name: per_param for name, per_param in state["state"].items() if per_param}
        return state

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        by_name = optimizer_state_by_name(state, optimizer, self.module)  # a ddp or single run's checkpoint too
        self._set_optimizer_state(optimizer, by_name, StateDictOptions(full_state_dict=True))

    def _set_optimizer_state(
        self, optimizer: torch.optim.Optimizer, by_name: dict[str, Any], options: StateDictOptions
    ) -> None:
        """``set_optimizer_state_dict``, but an optimizer comes back with exactly the state it had.

        torch's call first gives every parameter a state (a step with zero gradients), then
        loads what the checkpoint holds over it; a full state with no tensor to shard (SGD
        without momentum) stops it with "Expected device to be set". So a state without
        tensors loads directly, and parameters the checkpoint holds no state for (an Adam
        that had not stepped yet) get none.
        """
        if not any(isinstance(v, torch.Tensor) and v.dim() > 0 for s in by_name["state"].values() for v in s.values()):
            optimizer.load_state_dict(optimizer_state_by_position(by_name, optimizer, self.module))
            return
        set_optimizer_state_dict(self.module, optimizer, by_name, options=options)
        names = param_names(optimizer, self.module)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for name, param in zip(names, params):
            if name not in by_name["state"]:
                optimizer.state.pop(param, None)


def _stateless(optimizer: torch.optim.Optimizer) -> bool:
    """No parameter has a state yet (an Adam before its first step) or ever (SGD without
    momentum). torch's ``get_optimizer_state_dict`` would then take a step with zero gradients
    to create one, which changes how Adam goes on (its step count and bias correction); the
    checkpoint holds the state as it is instead: none, and the param groups."""
    return not any(optimizer.state.values())
