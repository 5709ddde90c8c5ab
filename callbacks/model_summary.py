"""ModelSummary: what the model holds, printed once at the start of fit."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from torch import nn

from trainer.core.checks import positive_int

from .base import Callback

if TYPE_CHECKING:
    from trainer import Trainer, TrainModule

log = logging.getLogger("trainer")


class ModelSummary(Callback):
    """On global rank 0 at ``on_fit_start``: the parameters of each submodule down to
    ``max_depth`` (1: the top-level ones), then the trainable and frozen counts and their size
    in MB. On by default; ``Trainer(enable_model_summary=False)`` turns it off. A parameter
    shared by two submodules is counted once in the totals; a lazy one not yet built counts 0.
    """

    def __init__(self, max_depth: int = 1) -> None:
        self.max_depth = positive_int("ModelSummary(max_depth)", max_depth)

    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        if trainer.is_global_zero:
            log.info("%s", summarize(module, self.max_depth))


def summarize(model: nn.Module, max_depth: int = 1) -> str:
    """The summary table as text."""
    subs = _submodules(model, max_depth)
    shapes = _shapes(model, subs)  # with an example_input_array: each layer's input and output shapes
    rows = [("", "Name", "Type", "Params", "Trainable") + (("In sizes", "Out sizes") if shapes else ())]
    for i, (name, sub) in enumerate(subs):
        total, trainable = _count(sub.parameters())
        row = (str(i), name, type(sub).__name__, _human(total), _human(trainable))
        rows.append(row + (shapes.get(name, ("?", "?")) if shapes else ()))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "-" * len(lines[0]))
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


def _shapes(model: nn.Module, subs: list[tuple[str, nn.Module]]) -> dict[str, tuple[str, str]]:
    """Run ``model.example_input_array`` through the model (eval mode, no grad, the RNG put back)
    and note each submodule's input and output shapes; {} without an example."""
    example = getattr(model, "example_input_array", None)
    if example is None:
        return {}
    import torch

    def shape(x: object) -> str:
        if isinstance(x, torch.Tensor):
            return str(list(x.shape))
        if isinstance(x, (list, tuple)):
            return str([list(t.shape) if isinstance(t, torch.Tensor) else "?" for t in x]) if len(x) != 1 else shape(x[0])
        return "?"

    shapes: dict[str, tuple[str, str]] = {}

    def noter(name: str):  # noqa: ANN202
        def note(module: nn.Module, inputs: object, output: object) -> None:  # returns None: the output stays
            shapes.setdefault(name, (shape(inputs), shape(output)))

        return note

    handles = [sub.register_forward_hook(noter(name)) for name, sub in subs]
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    moved = example.to(device) if isinstance(example, torch.Tensor) else example
    modes, rng = [m.training for m in model.modules()], torch.get_rng_state()
    model.eval()
    try:
        with torch.no_grad():
            out = model(**moved) if isinstance(moved, dict) else model(*moved) if isinstance(moved, (list, tuple)) else model(moved)
        shapes[""] = (shape(moved), shape(out))
    except Exception as err:  # noqa: BLE001 - a summary must not stop training
        log.info("ModelSummary: the example_input_array did not run through the model (%s); shapes left out.", err)
        return {}
    finally:
        for h in handles:
            h.remove()
        for m, mode in zip(model.modules(), modes):
            m.training = mode
        torch.set_rng_state(rng)
    return shapes


def _submodules(model: nn.Module, max_depth: int) -> list[tuple[str, nn.Module]]:
    return [(name, m) for name, m in model.named_modules() if name and name.count(".") < max_depth]


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
