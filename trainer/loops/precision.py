"""Mixed precision: the autocast context and, for float16, the gradient scaler."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from trainer.core.checks import suggest

PRECISIONS = ("32", "bf16-mixed", "16-mixed")
_ALIASES = {"32-true": "32", "bf16": "bf16-mixed", "16": "16-mixed"}


def normalize_precision(value: Any) -> str:
    key = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if isinstance(key, str):
        key = _ALIASES.get(key, key)
        if key in PRECISIONS:
            return key
    valid = ", ".join(repr(p) for p in PRECISIONS)
    raise ValueError(f"Unknown precision={value!r}. Valid: {valid}.{suggest(str(value), PRECISIONS)}")


_FP16_NEEDS_CUDA = (
    "precision='16-mixed' needs a CUDA device, but the run is on {where}. "
    "On a CPU use precision='bf16-mixed' (or '32')."
)


def check_precision_available(precision: str) -> None:
    """Refuse '16-mixed' on a machine without CUDA before any worker process starts."""
    if precision == "16-mixed" and not torch.cuda.is_available():
        raise ValueError(_FP16_NEEDS_CUDA.format(where="a machine without CUDA"))


_FULL_PRECISION = contextlib.nullcontext()  # reusable: entered once per step, so not rebuilt each time


class Precision:
    """Runs steps under autocast and scales float16 losses. ``"32"`` is a no-op."""

    def __init__(self, precision: str, device: torch.device) -> None:
        self.precision = precision
        self.device_type = device.type
        if precision == "16-mixed" and device.type != "cuda":
            raise ValueError(_FP16_NEEDS_CUDA.format(where=repr(device.type)))
        self.dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
        self.scaler = torch.amp.GradScaler("cuda") if precision == "16-mixed" else None

    def autocast(self) -> contextlib.AbstractContextManager:
        # autocast is thread-local: DataParallel replica threads enter this themselves.
        if self.dtype is None:
            return _FULL_PRECISION
        return torch.autocast(self.device_type, dtype=self.dtype)

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """Step the optimizer; the scaler skips the step itself when the gradients hold inf/nan."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()

    def step_only(self, optimizer: torch.optim.Optimizer) -> None:
        """Step without updating the scale: several optimizers step, then one ``update()``."""
        if self.scaler is None:
            optimizer.step()
        else:
            self.scaler.step(optimizer)

    def update(self) -> None:
        if self.scaler is not None:
            self.scaler.update()

    def skip(self) -> None:
        """Drop this step's update. The scaler forgets an ``unscale_`` done for it (update()
        with an explicit scale resets that), or the next step's ``unscale_`` would raise."""
        if self.scaler is not None:
            self.scaler.update(self.scaler.get_scale())

    def state_dict(self) -> dict[str, Any]:
        return {} if self.scaler is None else {"scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
