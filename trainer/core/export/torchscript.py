"""``TrainModule.to_torchscript``: the module compiled (``torch.jit.script``) or traced (``torch.jit.trace``)
into a ``ScriptModule`` that runs, and loads with ``torch.jit.load``, without Python's class or this package.

As Lightning's, it scripts (or traces) the module in eval mode, puts its own mode back afterwards,
moves the trace's inputs with the module's batch-transfer hooks, and warns that TorchScript is
deprecated in torch (Lightning deprecates the method from its v2.7; ``torch.export.export`` is the successor).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import IO, TYPE_CHECKING, Any, Iterator

import torch

from trainer.core.exceptions import LightningDeprecationWarning

if TYPE_CHECKING:
    from trainer.core.module import TrainModule

#: True while torch.jit compiles or traces a module: it reads every attribute, and a TrainModule's
#: ``trainer`` is then None where no Trainer is attached, rather than an error (Lightning's ``_jit_is_scripting``).
JIT_ACTIVE = [False]

_DEPRECATION = (
    "`to_torchscript` has been deprecated in v2.7 and will be removed in v2.8 of Lightning, as TorchScript is "
    "deprecated in PyTorch; here it works for as long as torch.jit does. Use `torch.export.export()` for exporting "
    "instead: https://pytorch.org/docs/stable/export.html"
)


@contextlib.contextmanager
def jit_tracing() -> Iterator[None]:
    """Within: ``module.trainer`` is None on a module no Trainer has (torch.jit and TensorBoard's graph read it)."""
    before = JIT_ACTIVE[0]
    JIT_ACTIVE[0] = True
    try:
        yield
    finally:
        JIT_ACTIVE[0] = before


def to_torchscript(
    module: TrainModule, file_path: str | os.PathLike | IO[bytes] | None = None, method: str | None = "script",
    example_inputs: Any = None, **kwargs: Any,
) -> torch.jit.ScriptModule:
    """``module`` as a ``ScriptModule`` (in eval mode), also saved to ``file_path`` when one is given; ``kwargs`` go
    to ``torch.jit.script`` or ``torch.jit.trace``. ``method="trace"`` runs ``forward`` on ``example_inputs``
    (default: ``module.example_input_array``), moved to the module's device as a batch is."""
    warnings.warn(_DEPRECATION, LightningDeprecationWarning, stacklevel=3)
    if method not in ("script", "trace"):
        raise ValueError(
            f"The 'method' parameter only supports 'script' or 'trace', but value given was: {method!r}. "
            "Use method='script' to compile forward's code, or method='trace' to record one run of it."
        )
    if method == "trace" and example_inputs is None:
        example_inputs = module.example_input_array
        if example_inputs is None:
            raise ValueError(
                "Choosing method=`trace` requires either `example_inputs` or `model.example_input_array` to be "
                f"defined. {type(module).__name__} has neither: pass example_inputs=torch.randn(...) "
                "shaped like one batch, or set self.example_input_array in __init__."
            )
    training = module.training
    try:
        with torch.no_grad(), jit_tracing():
            if method == "script":
                scripted = torch.jit.script(module.eval(), **kwargs)
            else:
                if kwargs.get("check_inputs") is not None:
                    kwargs["check_inputs"] = _to_device(module, kwargs["check_inputs"])
                scripted = torch.jit.trace(module.eval(), example_inputs=_to_device(module, example_inputs), **kwargs)
    finally:
        module.train(training)
    if file_path is not None:
        torch.jit.save(scripted, file_path)
    return scripted


def _to_device(module: TrainModule, batch: Any) -> Any:
    """``batch`` through the module's batch-transfer hooks, as a loader's batch goes (loader index 0)."""
    batch = module.on_before_batch_transfer(batch, 0)
    batch = module.transfer_batch_to_device(batch, module.device, 0)
    return module.on_after_batch_transfer(batch, 0)
