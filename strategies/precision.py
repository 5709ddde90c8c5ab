"""Precision: mixed (the autocast context and, for float16, the gradient scaler) or "true"
(the model's parameters and the batches' floating-point tensors in one dtype)."""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterable, Iterator

import torch

from trainer.core.checks import suggest
from trainer.data.batches import apply_to_tensors

# Lightning's names; the short spellings (32, "16", "bf16", 64, ...) mean the same as theirs.
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true", "64-true")
_ALIASES = {"32": "32-true", "bf16": "bf16-mixed", "16": "16-mixed", "64": "64-true"}
_TRUE_DTYPES = {"bf16-true": torch.bfloat16, "16-true": torch.float16, "64-true": torch.float64}
_CONVERT = {torch.bfloat16: "bfloat16", torch.float16: "half", torch.float64: "double"}
_NOT_SUPPORTED = ("transformer-engine", "transformer-engine-float16", "16-mixed-deepspeed")


def normalize_precision(value: Any) -> str:
    """Any of Lightning's spellings (32, "32", "32-true", 16, "16-mixed", "bf16", ...) as its
    full name, which is what ``trainer.precision`` reads, as in Lightning."""
    key = str(value) if isinstance(value, int) and not isinstance(value, bool) else value
    if isinstance(key, str):
        key = _ALIASES.get(key, key)
        if key in PRECISIONS:
            return key
        if key in _NOT_SUPPORTED or key.startswith("nf4") or key.startswith("int8"):
            raise ValueError(
                f"precision={value!r} (a Lightning plugin's precision) is not supported. Use '32-true', "
                "'bf16-mixed', '16-mixed' (CUDA), or a true precision: 'bf16-true', '16-true', '64-true'."
            )
    valid = ", ".join(repr(p) for p in PRECISIONS)
    raise ValueError(
        f"Unknown precision={value!r}. Valid: {valid} (or Lightning's short spellings 32, 16, 'bf16', 64)."
        f"{suggest(str(value), PRECISIONS)}"
    )


_FP16_NEEDS_CUDA = (
    "precision='16-mixed' needs a CUDA device, but the run is on {where}. "
    "On a CPU use precision='bf16-mixed' (or '32')."
)


def check_precision_available(precision: str) -> None:
    """Refuse '16-mixed' on a machine without CUDA before any worker process starts."""
    if precision == "16-mixed" and not torch.cuda.is_available():
        raise ValueError(_FP16_NEEDS_CUDA.format(where="a machine without CUDA"))


_FULL_PRECISION = contextlib.nullcontext()  # reusable: entered once per step, so not rebuilt each time


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Tensors a step creates without a dtype (``torch.zeros(n)``) get ``dtype``, as Lightning's
    true precisions do; the previous default comes back after the step. The default dtype is
    the process's, not the thread's: DataParallel's replica threads leave it alone."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


class _EmptyInit(torch.overrides.TorchFunctionMode):
    """``init_module(empty_init=True)``: ``torch.nn.init`` functions return their tensor as it is,
    so that a model about to get a checkpoint's weights skips initializing them."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__module__", None) == "torch.nn.init":
            return kwargs["tensor"] if "tensor" in kwargs else args[0]
        return func(*args, **kwargs)


@contextlib.contextmanager
def init_context(precision: str, device: torch.device, empty_init: bool | None) -> Iterator[None]:
    """Lightning's ``trainer.init_module()``: tensors made inside are made on ``device``, in a true
    precision's dtype ("bf16-true", "16-true", "64-true"), and with ``empty_init=True`` left
    uninitialized."""
    dtype = _TRUE_DTYPES.get(normalize_precision(precision))
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.device(device))
        if dtype is not None:
            stack.enter_context(_default_dtype(dtype))
        if empty_init:
            stack.enter_context(_EmptyInit())
        yield


class Precision:
    """Runs steps under autocast and scales float16 losses. ``"32-true"`` is a no-op.

    A true precision ("bf16-true", "16-true", "64-true") converts the model once
    (``convert_module``) and each batch's floating-point tensors as they are loaded
    (``convert_batches``), and runs steps with that default dtype.
    """

    def __init__(self, precision: str = "32-true", device: torch.device | None = None) -> None:
        self.precision = precision = normalize_precision(precision)
        #: the dtype that steps run in; None for full precision (no context entered per step)
        self.dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
        self.param_dtype = _TRUE_DTYPES.get(precision)  # a true precision's dtype, else None
        if self.param_dtype is not None:
            self.dtype = self.param_dtype
        self.device_type = "cpu"
        self.scaler: torch.amp.GradScaler | None = None
        if device is not None:
            self.setup(device)

    def setup(self, device: torch.device) -> None:
        """Bind the device that a stage runs on in this process, once it is known (ddp picks
        each rank's in ``setup_environment``): autocast's device type and, for "16-mixed", a
        fresh gradient scaler for the stage."""
        if self.precision == "16-mixed" and device.type != "cuda":
            raise ValueError(_FP16_NEEDS_CUDA.format(where=repr(device.type)))
        self.device_type = device.type
        self.scaler = torch.amp.GradScaler("cuda") if self.precision == "16-mixed" else None

    def autocast(self) -> contextlib.AbstractContextManager:
        # autocast is thread-local: DataParallel replica threads enter this themselves.
        if self.dtype is None:
            return _FULL_PRECISION
        if self.param_dtype is not None:
            return _default_dtype(self.param_dtype)
        return torch.autocast(self.device_type, dtype=self.dtype)

    def module_init_context(self) -> contextlib.AbstractContextManager:
        """Lightning's: what ``configure_model`` builds under a true precision is made in its dtype."""
        return contextlib.nullcontext() if self.param_dtype is None else _default_dtype(self.param_dtype)

    def convert_module(self, module: torch.nn.Module) -> None:
        """A true precision: the parameters and floating-point buffers in its dtype (in place). Complex
        buffers are left as they are (``module.to(torch.float64)`` would drop their imaginary part)."""
        if self.param_dtype is not None:
            getattr(module, _CONVERT[self.param_dtype])()  # .double(), .half(), .bfloat16(): floating tensors only

    def convert_batches(self, batches: Iterable[Any]) -> Iterable[Any]:
        """A true precision: each batch's floating-point tensors in its dtype; else ``batches`` as they are.
        Called once per pass over a loader, so full and mixed precision cost nothing per batch."""
        if self.param_dtype is None:
            return batches
        dtype = self.param_dtype

        def cast(t: torch.Tensor) -> torch.Tensor:
            return t.to(dtype) if t.is_floating_point() else t

        return (apply_to_tensors(batch, cast) for batch in batches)

    # The gradient scaler's whole use, here only (Lightning Fabric's Precision: pre_backward,
    # optimizer_step, unscale_gradients): the loops call these and never the scaler itself.
    @property
    def scaling(self) -> bool:
        """Whether float16's gradient scaler scales the losses ("16-mixed"): then backward, the
        unscale and the step must go through this object; otherwise they are the plain ones."""
        return self.scaler is not None

    def pre_backward(self, tensor: torch.Tensor) -> torch.Tensor:
        """The loss that backward gets: multiplied by the scale under "16-mixed", else ``tensor``."""
        return tensor if self.scaler is None else self.scaler.scale(tensor)

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide ``optimizer``'s gradients by the scale (once per step), so that hooks and clipping see true ones."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        """Step the optimizer, then update the scale; the scaler skips the step itself when the
        gradients hold inf/nan."""
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)
        self.scaler.update()

    def step_only(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> Any:
        """Step without updating the scale: several optimizers step, then one ``update()``.
        ``kwargs`` go to the optimizer's ``step`` (``opt.step(optim="sgd")`` under manual optimization);
        returns what that ``step`` returned (None where the scaler skipped it)."""
        if self.scaler is None:
            return optimizer.step(**kwargs)
        return self.scaler.step(optimizer, **kwargs)

    def update(self) -> None:
        """Update the scale after the steps of one round (manual optimization: once per batch)."""
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
