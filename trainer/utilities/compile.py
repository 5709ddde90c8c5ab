"""Lightning's ``utilities.compile``: a ``torch.compile``d module trained as the module it wraps.

``torch.compile(model)`` returns an ``OptimizedModule`` that wraps the model without being a
``TrainModule``. ``fit``, ``validate``, ``test`` and ``predict`` take it as Lightning does: they
train the original module (``trainer.lightning_module`` is it, and its checkpoints hold its own
keys), with ``forward`` and the step methods replaced by compiled ones (``from_compiled``).
``to_uncompiled`` puts the original methods back.
"""

from __future__ import annotations

from typing import Any

from trainer.core.module import TrainModule

_STEPS = ("forward", "training_step", "validation_step", "test_step", "predict_step")


def _is_optimized_module(model: Any) -> bool:
    # by name, so that deciding costs no import of torch._dynamo (over a second) for a plain model
    return type(model).__name__ == "OptimizedModule" and hasattr(model, "_orig_mod")


def from_compiled(model: Any) -> TrainModule:
    """The ``TrainModule`` inside ``torch.compile(module)``, its forward and step methods compiled with
    the same settings; ``module._compiler_ctx`` keeps what ``to_uncompiled`` needs to undo it."""
    if not _is_optimized_module(model):
        raise ValueError(f"`model` is required to be a `OptimizedModule`. Found a `{type(model).__name__}` instead.")
    original = model._orig_mod
    if not isinstance(original, TrainModule):
        raise ValueError(
            f"`model` is expected to be a compiled LightningModule. Found a `{type(original).__name__}` instead: "
            "compile a trainer.TrainModule (torch.compile(MyModule())), or pass the module and Trainer(compile=True)."
        )
    if original._compiler_ctx is not None:  # compiled by an earlier stage (fit, then validate): keep the originals
        return original
    ctx = {"compiler": "dynamo", "dynamo_ctx": model.dynamo_ctx}
    for name in _STEPS:
        ctx[f"original_{name}"] = method = getattr(original, name, None)
        if method is not None:  # a module without validation_step (say) has none to compile
            setattr(original, name, model.dynamo_ctx(method))
    original._compiler_ctx = ctx
    return original


def to_uncompiled(model: Any) -> TrainModule:
    """The module ``from_compiled`` made (or the one inside ``torch.compile(module)``) with its own
    forward and step methods back, in place."""
    if _is_optimized_module(model):
        original = model._orig_mod
        if not isinstance(original, TrainModule):
            raise TypeError(
                f"Unexpected error, the wrapped model should be a LightningModule, found {type(model).__name__}"
            )
    elif isinstance(model, TrainModule):
        if model._compiler_ctx is None:
            raise ValueError(
                "`model` is required to be a compiled LightningModule. Found a non-compiled LightningModule instead."
            )
        original = model
    else:
        raise ValueError("`model` must either be an instance of OptimizedModule or LightningModule")
    ctx = original._compiler_ctx
    if ctx is not None:
        for name in _STEPS:
            if ctx[f"original_{name}"] is not None:
                setattr(original, name, ctx[f"original_{name}"])
        original._compiler_ctx = None
    return original


def unwrap_compiled(model: Any) -> Any:
    """What a stage runs: the module inside ``torch.compile(module)``, compiled as ``from_compiled`` does;
    anything else as it is (the stage's own checks then say what is wrong with it)."""
    return from_compiled(model) if _is_optimized_module(model) else model
