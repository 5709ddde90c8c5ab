"""One process, one device: the first CUDA GPU if there is one, else the CPU."""

from __future__ import annotations

import torch

from .base import Strategy, check_cuda_indices
from .precision import Precision


def default_device() -> torch.device:
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


class SingleDeviceStrategy(Strategy):
    name = "single"

    def __init__(self, device: torch.device | str | int | None = None, precision: Precision | None = None) -> None:
        super().__init__(precision)
        self._device_given = device is not None
        if device is None:
            self.root_device = default_device()
            return
        try:
            self.root_device = torch.device(device)
        except (RuntimeError, TypeError):
            raise ValueError(
                f"SingleDeviceStrategy(device={device!r}) is not a device. "
                "Use e.g. 'cpu', 'cuda', 'cuda:1' or torch.device('cuda', 0)."
            ) from None
        if self.root_device.type == "cuda":
            check_cuda_indices(
                "SingleDeviceStrategy(device)", device, [self.root_device.index or 0], cpu_fix="use device='cpu'"
            )

    def configure_devices(self, devices: str | int | list[int]) -> None:
        if self._device_given and isinstance(devices, list):
            raise ValueError(
                f"devices={devices!r} and SingleDeviceStrategy(device={str(self.root_device)!r}) both choose "
                "the device. Give only one of them."
            )
        if self._device_given and isinstance(devices, int) and devices > 1:
            raise ValueError(
                f"devices={devices!r} asks for {devices} devices, but SingleDeviceStrategy(device="
                f"{str(self.root_device)!r}) runs on one. Pass devices=1, or strategy='ddp' for {devices} processes."
            )
        if self._device_given:
            if self.accelerator is not None and self.root_device.type != self.accelerator:
                raise ValueError(
                    f"accelerator={self.accelerator!r} and SingleDeviceStrategy(device={str(self.root_device)!r}) "
                    "disagree. Give only one of them, or make them match."
                )
            return
        super().configure_devices(devices)

    def setup_environment(self) -> None:
        if self.root_device.type == "cuda":
            torch.cuda.set_device(self.root_device)
