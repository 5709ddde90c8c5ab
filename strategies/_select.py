"""Turning ``Trainer(strategy=..., devices=...)`` into a configured Strategy."""

from __future__ import annotations

from typing import Any

import torch

from trainer._checks import suggest

from ._env import launched_env
from .base import Strategy
from .data_parallel import DataParallelStrategy
from .ddp import DDPStrategy
from .single_device import SingleDeviceStrategy, _check_device_exists

_NAMES = {
    "single": "single", "single_device": "single",
    "dp": "dp", "data_parallel": "dp",
    "ddp": "ddp",
    "auto": "auto",
}


def normalize_devices(devices: Any) -> str | int | list[int]:
    if devices == "auto":
        return "auto"
    if isinstance(devices, bool):
        raise TypeError(f"devices={devices!r} must be 'auto', a count >= 1, or a list of device indices.")
    if isinstance(devices, int):
        if devices < 1:
            raise ValueError(f"devices={devices!r} must be >= 1 (a count), 'auto', or a list of indices like [0, 1].")
        return devices
    if isinstance(devices, (list, tuple)):
        if not devices or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices):
            raise ValueError(f"devices={devices!r}: a list must hold one or more device indices >= 0, e.g. [0, 1].")
        if len(set(devices)) != len(devices):
            raise ValueError(f"devices={devices!r} lists a device twice.")
        return list(devices)
    raise TypeError(f"devices={devices!r} must be 'auto', a count >= 1, or a list of device indices.")


def select_strategy(strategy: Any, devices: Any) -> Strategy:
    devices = normalize_devices(devices)
    if isinstance(strategy, Strategy):
        _configure(strategy, devices)
        return strategy
    if not isinstance(strategy, str):
        raise TypeError(
            f"strategy={strategy!r} must be a name ('auto', 'single', 'dp', 'ddp') or a Strategy instance."
        )
    name = _NAMES.get(strategy)
    if name is None:
        valid = ", ".join(repr(n) for n in ("auto", "single", "dp", "ddp"))
        raise ValueError(f"Unknown strategy {strategy!r}. Valid: {valid}.{suggest(strategy, _NAMES)}")
    if name == "auto":
        if launched_env() is not None or (devices == "auto" and torch.cuda.device_count() >= 2):
            name = "ddp"
        elif isinstance(devices, int) and devices > 1 or isinstance(devices, list) and len(devices) > 1:
            name = "ddp"
        else:
            name = "single"
    chosen = {"single": SingleDeviceStrategy, "dp": DataParallelStrategy, "ddp": DDPStrategy}[name]()
    _configure(chosen, devices)
    return chosen


def _configure(strategy: Strategy, devices: str | int | list[int]) -> None:
    configure = getattr(strategy, "configure_devices", None)
    if configure is not None:
        configure(devices)
        return
    # Single-device strategies (and user strategies without configure_devices) take one device.
    if isinstance(devices, int) and devices > 1 or isinstance(devices, list) and len(devices) > 1:
        raise ValueError(
            f"devices={devices!r} with strategy={strategy.name!r}, which runs on one device. "
            "Use strategy='ddp' (one process per device) or strategy='dp', or devices=1."
        )
    if isinstance(devices, list):
        device = torch.device("cuda", devices[0])
        _check_device_exists("devices", device)
        strategy.root_device = device
