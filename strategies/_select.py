"""Turning ``Trainer(accelerator=..., strategy=..., devices=..., num_nodes=...)`` into a configured Strategy."""

from __future__ import annotations

from typing import Any

import torch

from ._env import launched_env
from .base import Strategy
from .data_parallel import DataParallelStrategy
from .precision import Precision
from .ddp import DDPStrategy
from .single_device import SingleDeviceStrategy

_NAMES = {
    "auto": "auto",
    "single": "single", "single_device": "single",
    "dp": "dp", "data_parallel": "dp",
    "ddp": "ddp",
    "fsdp": "fsdp",
}
_VALID = "'auto', 'single' (or 'single_device'), 'dp' (or 'data_parallel'), 'ddp', 'fsdp', or a Strategy instance"
_CLASSES: dict[str, Any] = {"single": SingleDeviceStrategy, "dp": DataParallelStrategy, "ddp": DDPStrategy}


def _strategy_class(name: str) -> type[Strategy]:
    if name == "fsdp":  # torch.distributed.checkpoint and DTensor take 0.8 s to import: only when asked for
        from .fsdp import FSDPStrategy

        return FSDPStrategy
    return _CLASSES[name]
_DEVICES_HELP = "Use 'auto', -1 (all), a count such as 2, or a list of device indices such as [0, 1]."
_ACCELERATORS = {"auto": None, "cpu": "cpu", "gpu": "cuda", "cuda": "cuda", "mps": "mps"}
_OTHER_ACCELERATORS = {
    "tpu": "TPUs (torch_xla)", "xla": "TPUs (torch_xla)", "hpu": "Habana Gaudi (HPU)", "ipu": "Graphcore IPUs",
}


def resolve_accelerator(accelerator: Any) -> str | None:
    """``Trainer(accelerator=...)`` as "cpu", "cuda" or "mps", or None for "auto" (CUDA when
    there is a GPU, else the CPU). Naming a device that this machine lacks is an error."""
    if not isinstance(accelerator, str):
        raise TypeError(
            f"accelerator={accelerator!r} must be a name: 'auto', 'cpu', 'gpu' (or 'cuda') or 'mps'. "
            "(Lightning's Accelerator objects are not supported: pass the name.)"
        )
    key = accelerator.lower()
    if key in _OTHER_ACCELERATORS:
        raise ValueError(
            f"accelerator={accelerator!r}: {_OTHER_ACCELERATORS[key]} are not supported; this trainer runs on "
            "CUDA GPUs, Apple's MPS or the CPU. Use accelerator='auto', 'gpu' or 'cpu'."
        )
    if key not in _ACCELERATORS:
        raise ValueError(
            f"Unknown accelerator={accelerator!r}. Valid: 'auto', 'cpu', 'gpu' (or 'cuda'), 'mps'."
            + _did_you_mean(key, tuple(_ACCELERATORS))
        )
    chosen = _ACCELERATORS[key]
    if chosen == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"accelerator={accelerator!r} but no CUDA GPU was found (torch.cuda.is_available() is False). "
            "Pass accelerator='cpu' to train on the CPU, or accelerator='auto' to use a GPU when there is one."
        )
    if chosen == "mps" and not torch.backends.mps.is_available():
        raise ValueError(
            f"accelerator={accelerator!r} but Apple's MPS device is not available on this machine. "
            "Pass accelerator='cpu', or accelerator='auto' to use a GPU when there is one."
        )
    return chosen


def normalize_devices(devices: Any) -> str | int | list[int]:
    """``"auto"``, a count >= 1, or a list of distinct indices >= 0; anything else is an error."""
    if isinstance(devices, str):  # Lightning's spellings: "auto", "-1", "2", "0,1"
        text = devices.strip()
        if text in ("auto", "-1"):
            return "auto"
        try:
            parsed = [int(d) for d in text.split(",") if d.strip()] if "," in text else int(text)
        except ValueError:
            raise ValueError(f"devices={devices!r} is not understood. {_DEVICES_HELP}") from None
        try:
            return normalize_devices(parsed)
        except ValueError as err:  # the message shows the value as the user wrote it
            raise ValueError(str(err).replace(f"devices={parsed!r}", f"devices={devices!r}")) from None
    if devices == -1 and not isinstance(devices, bool):  # all of this machine's devices: what "auto" picks
        return "auto"
    if isinstance(devices, bool):  # an int subclass: True would silently mean 1
        raise TypeError(f"devices={devices!r} must be 'auto', a count or a list. {_DEVICES_HELP}")
    if isinstance(devices, int):
        if devices < 1:
            raise ValueError(f"devices={devices!r} must be at least 1. {_DEVICES_HELP}")
        return devices
    if isinstance(devices, (list, tuple)):
        if not devices or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices):
            raise ValueError(f"devices={devices!r}: a list must hold one or more device indices >= 0, e.g. [0, 1].")
        if len(set(devices)) != len(devices):
            raise ValueError(
                f"devices={devices!r} lists a device twice; list each device index once. To share one GPU on "
                "purpose, pass DataParallelStrategy(device_ids=[0, 0]) or "
                "DDPStrategy(backend='gloo', device_ids=[0, 0])."
            )
        return list(devices)
    raise TypeError(f"devices={devices!r} must be 'auto', a count or a list. {_DEVICES_HELP}")


def select_strategy(
    strategy: Any, devices: Any, accelerator: Any = "auto", num_nodes: Any = 1, precision: Precision | None = None,
) -> Strategy:
    """The strategy, built with ``precision`` (full precision if None). A strategy the user
    built gets it too, as Lightning's connector gives its precision plugin to one."""
    devices = normalize_devices(devices)
    kind = resolve_accelerator(accelerator)
    nodes = check_num_nodes(num_nodes)
    if isinstance(strategy, Strategy):
        chosen = strategy
        if precision is not None:
            chosen.precision = precision
    elif isinstance(strategy, str):
        if strategy.startswith(("deepspeed", "xla", "hpu", "single_xla", "single_hpu")):
            raise ValueError(
                f"strategy={strategy!r} is not supported. Use 'ddp' (one process per device) or 'fsdp' (sharded "
                "parameters, gradients and optimizer state, what DeepSpeed's ZeRO stage 3 does)."
            )
        name = _NAMES.get(_LIGHTNING_NAMES.get(strategy, strategy))
        if strategy == "ddp_find_unused_parameters_true":
            name = "ddp_unused"
        elif name is None:
            raise ValueError(f"Unknown strategy {strategy!r}. Valid: {_VALID}.{_did_you_mean(strategy)}")
        if name == "ddp_unused":
            chosen = DDPStrategy(find_unused_parameters=True, precision=precision)
        else:
            chosen = _strategy_class(_auto(devices, kind, nodes) if name == "auto" else name)(precision=precision)
        chosen.on_exception_in_caller = strategy in _CALLER_RUNS_ON_EXCEPTION
    else:
        raise TypeError(f"strategy={strategy!r} must be a name ({_VALID}).")
    if kind == "mps" and chosen.name not in ("single", "base"):
        raise ValueError(
            f"accelerator='mps' runs one process on Apple's GPU; strategy={chosen.name!r} is not supported there. "
            "Use strategy='auto' with devices=1."
        )
    if nodes > 1 and chosen.name not in ("ddp", "fsdp"):
        raise ValueError(f"num_nodes={nodes} needs strategy='ddp' or 'fsdp' (got {chosen.name!r}).")
    chosen.accelerator = kind
    chosen.configure_devices(devices)
    return chosen


# Lightning's strategy names that mean one of ours: its spawn and fork launchers start the
# same kind of worker processes ours does.
_LIGHTNING_NAMES = {
    "ddp_spawn": "ddp", "ddp_fork": "ddp", "ddp_notebook": "ddp", "ddp_find_unused_parameters_false": "ddp",
    "fsdp_cpu_offload": "fsdp",
}
# Those whose Lightning launcher spawns or forks the workers: a failed stage's on_exception hooks run in the caller.
_CALLER_RUNS_ON_EXCEPTION = ("ddp_spawn", "ddp_fork", "ddp_notebook")


def check_num_nodes(num_nodes: Any) -> int:
    """``Trainer(num_nodes=...)``: 1, or the machine count that the launcher on each one started."""
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise ValueError(f"num_nodes={num_nodes!r} must be an int >= 1 (the number of machines).")
    if num_nodes == 1:
        return 1
    env = launched_env()
    if env is None:
        raise ValueError(
            f"num_nodes={num_nodes}: a run on several machines is started by a launcher on each one, e.g. "
            f"`torchrun --nnodes={num_nodes} --nproc-per-node=<gpus> --rdzv-endpoint=<host:port> train.py` or "
            "`srun`; this process was not started by one."
        )
    if env.world_size != num_nodes * env.local_world_size:
        raise ValueError(
            f"num_nodes={num_nodes}, but the launcher started {env.world_size} process(es), {env.local_world_size} "
            f"on this machine ({env.world_size // max(env.local_world_size, 1)} machine(s)). Make them match."
        )
    return num_nodes


def _auto(devices: str | int | list[int], kind: str | None, nodes: int) -> str:
    """A launcher started us: join it. Several devices: one process each. Otherwise one device."""
    if launched_env() is not None or nodes > 1:
        return "ddp"
    if devices == "auto":
        count = torch.cuda.device_count() if kind in (None, "cuda") else 1
    else:
        count = devices if isinstance(devices, int) else len(devices)
    return "ddp" if count >= 2 else "single"


def _did_you_mean(name: str, names: tuple[str, ...] = tuple(_NAMES)) -> str:
    """' Did you mean 'x'?' for the closest name within a few edits, or ''.

    A tie goes to the name of the same length, so 'dpp' suggests 'ddp' rather than 'dp'.
    """
    typed = name.lower()
    ranked = sorted(names, key=lambda n: (_edits(typed, n), len(n) != len(typed)))
    best = ranked[0]
    return f" Did you mean {best!r}?" if _edits(typed, best) <= max(1, len(typed) // 3) else ""


def _edits(a: str, b: str) -> int:
    """Edit distance where swapping two neighbouring letters counts as one edit."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                d[i][j] = min(d[i][j], d[i - 2][j - 2] + 1)
    return d[len(a)][len(b)]
