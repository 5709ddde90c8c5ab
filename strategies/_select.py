"""Turning ``Trainer(strategy=..., devices=...)`` into a configured Strategy."""

from __future__ import annotations

from typing import Any

import torch

from ._env import launched_env
from .base import Strategy
from .data_parallel import DataParallelStrategy
from .ddp import DDPStrategy
from .fsdp import FSDPStrategy
from .single_device import SingleDeviceStrategy

_NAMES = {
    "auto": "auto",
    "single": "single", "single_device": "single",
    "dp": "dp", "data_parallel": "dp",
    "ddp": "ddp",
    "fsdp": "fsdp",
}
_VALID = "'auto', 'single' (or 'single_device'), 'dp' (or 'data_parallel'), 'ddp', 'fsdp', or a Strategy instance"
_CLASSES = {"single": SingleDeviceStrategy, "dp": DataParallelStrategy, "ddp": DDPStrategy, "fsdp": FSDPStrategy}
_DEVICES_HELP = "Use 'auto', a count such as 2, or a list of device indices such as [0, 1]."


def normalize_devices(devices: Any) -> str | int | list[int]:
    """``"auto"``, a count >= 1, or a list of distinct indices >= 0; anything else is an error."""
    if isinstance(devices, str):
        if devices == "auto":
            return "auto"
        raise ValueError(f"devices={devices!r} is not understood. {_DEVICES_HELP}")
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
                "purpose, pass DataParallelStrategy(device_ids=[0, 0]) or DDPStrategy(backend='gloo', device_ids=[0, 0])."
            )
        return list(devices)
    raise TypeError(f"devices={devices!r} must be 'auto', a count or a list. {_DEVICES_HELP}")


def select_strategy(strategy: Any, devices: Any) -> Strategy:
    devices = normalize_devices(devices)
    if isinstance(strategy, Strategy):
        chosen = strategy
    elif isinstance(strategy, str):
        name = _NAMES.get(strategy)
        if name is None:
            raise ValueError(f"Unknown strategy {strategy!r}. Valid: {_VALID}.{_did_you_mean(strategy)}")
        chosen = _CLASSES[_auto(devices) if name == "auto" else name]()
    else:
        raise TypeError(f"strategy={strategy!r} must be a name ({_VALID}).")
    chosen.configure_devices(devices)
    return chosen


def _auto(devices: str | int | list[int]) -> str:
    """A launcher started us: join it. Several devices: one process each. Otherwise one device."""
    if launched_env() is not None:
        return "ddp"
    count = torch.cuda.device_count() if devices == "auto" else devices if isinstance(devices, int) else len(devices)
    return "ddp" if count >= 2 else "single"


def _did_you_mean(name: str) -> str:
    """' Did you mean 'x'?' for the closest name within a few edits, or ''.

    A tie goes to the name of the same length, so 'dpp' suggests 'ddp' rather than 'dp'.
    """
    typed = name.lower()
    ranked = sorted(_NAMES, key=lambda n: (_edits(typed, n), len(n) != len(typed)))
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
