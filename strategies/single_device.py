"""One process, one device: the first CUDA GPU if there is one, else the CPU."""

from __future__ import annotations

import torch

from .base import Strategy


def default_device() -> torch.device:
    return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")


class SingleDeviceStrategy(Strategy):
    name = "single"

    def __init__(self, device: torch.device | str | int | None = None) -> None:
        super().__init__()
        if device is None:
            self.root_device = default_device()
        else:
            try:
                self.root_device = torch.device(device)
            except (RuntimeError, TypeError):
                raise ValueError(
                    f"SingleDeviceStrategy(device={device!r}) is not a device. "
                    "Use e.g. 'cpu', 'cuda', 'cuda:1' or torch.device('cuda', 0)."
                ) from None
        _check_device_exists("device", self.root_device)

    def setup_environment(self) -> None:
        if self.root_device.type == "cuda":
            torch.cuda.set_device(self.root_device)


def _check_device_exists(arg: str, device: torch.device) -> None:
    if device.type != "cuda":
        return
    count = torch.cuda.device_count()
    index = device.index or 0
    if index >= count:
        raise ValueError(
            f"{arg}={str(device)!r} does not exist: this machine has {count} visible CUDA device(s)"
            + (f" (valid indices 0..{count - 1})." if count else "; use 'cpu'.")
        )
