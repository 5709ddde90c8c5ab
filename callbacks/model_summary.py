"""ModelSummary: what the model holds, printed once at the start of fit."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from torch import nn

from trainer.core.checks import positive_int

from .base import Callback

if TYPE_CHECKING:
    from trainer import Trainer, TrainModule

log = logging.getLogger("trainer")


class ModelSummary(Callback):
    """On global rank 0 at ``on_fit_start``: the parameters of each submodule down to
    ``max_depth`` (1: the top-level ones, -1: all, 0: no table), then the trainable and frozen
    counts and their size in MB. With ``model.example_input_array`` set, one forward pass (in
    eval mode, without gradients) adds each row's input and output shapes. On by default;
    ``Trainer(enable_model_summary=False)`` turns it off. A parameter shared by two submodules
    is counted once in the totals; a lazy one not yet built counts 0.
    """

    def __init__(self, max_depth: int = 1) -> None:
        self.max_depth = positive_int("ModelSummary(max_depth)", max_depth, minimum=-1)

    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        if trainer.is_global_zero:
            # Not when parameters are sharded (fsdp): a forward pass on rank 0 alone would wait for the other ranks.
            example = None if trainer.strategy.shards_parameters else getattr(module, "example_input_array", None)
            log.info("%s", summarize(module, self.max_depth, example))


def summarize(model: nn.Module, max_depth: int = 1, example_input: Any = None) -> str:
    """The summary table as text."""
    subs = _submodules(model, max_depth)
    shapes = _shapes(model, subs, example_input) if example_input is not None else None
    rows = [("", "Name", "Type", "Params", "Trainable") + (("In sizes", "Out sizes") if shapes else ())]
    for i, (name, sub) in enumerate(subs):
        total, trainable = _count(sub.parameters())
        rows.append((str(i), name, type(sub).__name__, _human(total), _human(trainable)) + (shapes[name] if shapes else ()))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    if len(rows) == 1:  # max_depth=0: the totals only
        lines = []
    total, trainable = _count(model.parameters())
    size_mb = sum(p.numel() * p.element_size() for p in _unique(model.parameters()) if not _lazy(p)) / 1e6
    head = f"{type(model).__name__}:"
    lines = [head, *lines, ""]
    lines += [
        f"{_human(trainable):>8}  trainable parameters",
        f"{_human(total - trainable):>8}  frozen parameters",
        f"{_human(total):>8}  total parameters",
        f"{size_mb:>8.3f}  MB of parameters",
    ]
    return "\n".join(lines)


def _shapes(model: nn.Module, subs: list[tuple[str, nn.Module]], example: Any) -> dict[str, tuple[str, str]]:
    """Each row's (input, output) shapes from one forward pass over ``example``."""
    import torch

    from trainer.data.batches import move_to_device

    seen = {name: ("?", "?") for name, _ in subs}

    def record(name: str) -> Any:
        def hook(mod: nn.Module, args: Any, output: Any) -> None:
            seen[name] = (_shape(args[0] if len(args) == 1 else args), _shape(output))
        return hook

    handles = [sub.register_forward_hook(record(name)) for name, sub in subs]
    training = model.training
    try:
        device = next((p.device for p in model.parameters() if not _lazy(p)), torch.device("cpu"))
        example = move_to_device(example, device)
        model.eval()
        with torch.no_grad():
            model(*example) if isinstance(example, tuple) else model(**example) if isinstance(example, dict) else model(example)
    finally:
        model.train(training)
        for h in handles:
            h.remove()
    return seen


def _shape(value: Any) -> str:
    if hasattr(value, "shape"):
        return str(list(value.shape))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_shape(v) for v in value) + "]"
    return "?"


def _submodules(model: nn.Module, max_depth: int) -> list[tuple[str, nn.Module]]:
    return [(name, m) for name, m in model.named_modules() if name and (max_depth < 0 or name.count(".") < max_depth)]


def _unique(params):  # noqa: ANN001, ANN202
    seen: set[int] = set()
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            yield p


def _lazy(p: nn.Parameter) -> bool:
    return isinstance(p, nn.parameter.UninitializedParameter)


def _count(params) -> tuple[int, int]:  # noqa: ANN001
    total = trainable = 0
    for p in _unique(params):
        n = 0 if _lazy(p) else p.numel()
        total += n
        trainable += n if p.requires_grad else 0
    return total, trainable


def _human(n: int) -> str:
    """1234 -> '1.2 K', 3_400_000 -> '3.4 M' (as Lightning prints them)."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return str(n)
