"""A model's summary: its layers, their parameters, modes, FLOPs and shapes (Lightning's ``ModelSummary``).

``summarize(model)`` returns a :class:`ModelSummary`, whose ``str`` is the table the
``callbacks.ModelSummary`` callback prints when fit starts; its properties (``layer_names``,
``param_nums``, ``in_sizes``, ``total_parameters``, ``model_size``, ...) are the numbers in it.
It is Lightning's ``lightning.pytorch.utilities.model_summary``, with its names.
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections import OrderedDict
from typing import Any

import torch
from torch import nn

__all__ = [
    "LEFTOVER_PARAMS_NAME", "NOT_APPLICABLE", "UNKNOWN_SIZE", "LayerSummary", "ModelSummary",
    "get_human_readable_count", "parse_batch_shape", "summarize",
]

PARAMETER_NUM_UNITS = [" ", "K", "M", "B", "T"]
UNKNOWN_SIZE = "?"  # a layer the example input never reached, or an input without a shape
LEFTOVER_PARAMS_NAME = "other params"  # the row of parameters that belong to no submodule
NOT_APPLICABLE = "n/a"
# Bits per parameter for the size column; a mixed precision keeps 32-bit weights, so it says so.
_PRECISION_BITS = {
    "64": 64, "32": 32, "16": 16, "bf16": 16, "16-true": 16, "bf16-true": 16, "32-true": 32, "64-true": 64,
}


class LayerSummary:
    """One row: a submodule's type, parameter count and mode, and the input and output shapes of
    its first call (recorded by a forward hook, which removes itself)."""

    def __init__(self, module: nn.Module) -> None:
        self._module = module
        self._in_size: str | list | None = None
        self._out_size: str | list | None = None
        self._hook_handle = None
        if not isinstance(module, torch.jit.ScriptModule):  # a scripted module takes no hooks
            self._hook_handle = module.register_forward_hook(self._record, with_kwargs=True)

    def _record(self, module: nn.Module, args: Any, kwargs: Any, out: Any) -> None:
        inputs = (*args, *kwargs.values()) if kwargs else args
        self._in_size = parse_batch_shape(inputs[0] if len(inputs) == 1 else inputs)
        self._out_size = parse_batch_shape(out)
        self.detach_hook()  # a module called again (a recurrent one) keeps its first shapes

    def __del__(self) -> None:
        self.detach_hook()

    def detach_hook(self) -> None:
        if self._hook_handle is not None:
            self._hook_handle.remove()
            self._hook_handle = None

    @property
    def in_size(self) -> str | list:
        return self._in_size or UNKNOWN_SIZE

    @property
    def out_size(self) -> str | list:
        return self._out_size or UNKNOWN_SIZE

    @property
    def layer_type(self) -> str:
        return type(self._module).__name__

    @property
    def num_parameters(self) -> int:
        return sum(_numel(p) for p in self._module.parameters())

    @property
    def training(self) -> bool:
        return self._module.training


class ModelSummary:
    """The layers of ``model`` down to ``max_depth`` (1: its children, -1: every submodule, 0:
    none, only the totals). With ``model.example_input_array`` set, one forward pass (in eval
    mode, without gradients; every module's mode is put back after) records each layer's
    input and output shapes and its FLOPs; a layer the pass never reaches shows ``?``.
    Parameters that belong to no submodule get an ``other params`` row. ``forward=False`` (ours)
    skips that pass: the callback does so when the strategy shards the parameters, since a
    forward on rank 0 alone would wait for the other ranks. ``precision`` (ours): the strategy's
    precision, whose autocast that pass runs under (by default the model's Trainer's).
    """

    def __init__(self, model: nn.Module, max_depth: int = 1, *, forward: bool = True, precision: Any = None) -> None:
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < -1:
            raise ValueError(f"`max_depth` can be -1, 0 or > 0, got {max_depth}.")
        from torch.utils.flop_counter import FlopCounterMode  # only when a summary is made

        self._model = model
        self._max_depth = max_depth
        self._precision = precision  # the example's forward runs under its autocast (the ModelSummary callback's)
        self._forward = forward and getattr(model, "example_input_array", None) is not None
        self._flop_counter = FlopCounterMode(display=False, depth=max_depth + 1)
        self._layer_summary = self.summarize()
        trainer = getattr(model, "_trainer", None)
        precision = None if trainer is None else str(getattr(trainer, "precision", "32-true"))
        if precision is not None and precision not in _PRECISION_BITS:
            warnings.warn(
                f"Precision {precision} is not supported by the model summary. Estimated model size in MB will "
                "not be accurate. Using 32 bits instead (a mixed precision keeps its weights in 32 bits).",
                UserWarning, stacklevel=2,
            )
        self._precision_megabytes = _PRECISION_BITS.get(precision or "32", 32) / 8.0 * 1e-6

    @property
    def max_depth(self) -> int:
        return self._max_depth

    @property
    def named_modules(self) -> list[tuple[str, nn.Module]]:
        if self._max_depth == 0:
            return []
        if self._max_depth == 1:
            return list(self._model.named_children())
        return list(self._model.named_modules())[1:]  # not the model itself

    @property
    def layer_names(self) -> list[str]:
        return list(self._layer_summary)

    @property
    def layer_types(self) -> list[str]:
        return [layer.layer_type for layer in self._layer_summary.values()]

    @property
    def in_sizes(self) -> list:
        return [layer.in_size for layer in self._layer_summary.values()]

    @property
    def out_sizes(self) -> list:
        return [layer.out_size for layer in self._layer_summary.values()]

    @property
    def param_nums(self) -> list[int]:
        return [layer.num_parameters for layer in self._layer_summary.values()]

    @property
    def training_modes(self) -> list[bool]:
        return [layer.training for layer in self._layer_summary.values()]

    @property
    def total_training_modes(self) -> dict[str, int]:
        modes = [m.training for m in self._model.modules()][1:]  # not the model itself
        return {"train": modes.count(True), "eval": modes.count(False)}

    @property
    def total_parameters(self) -> int:
        return sum(_numel(p, warn=True) for p in self._model.parameters())

    @property
    def trainable_parameters(self) -> int:
        return sum(_numel(p) for p in self._model.parameters() if p.requires_grad)

    @property
    def total_layer_params(self) -> int:
        return sum(self.param_nums)

    @property
    def model_size(self) -> float:
        """The parameters' size in MB, at the Trainer's precision (32 bits without a Trainer)."""
        return self.total_parameters * self._precision_megabytes

    @property
    def total_flops(self) -> int:
        return self._flop_counter.get_total_flops()

    @property
    def flop_counts(self) -> dict[str, dict[Any, int]]:
        counts = self._flop_counter.get_flop_counts()
        return {name: counts.get(f"{type(self._model).__name__}.{name}", {}) for name in self.layer_names}

    def summarize(self) -> dict[str, LayerSummary]:
        summary = OrderedDict((name, LayerSummary(module)) for name, module in self.named_modules)
        if self._forward:
            self._forward_example_input()
        for layer in summary.values():
            layer.detach_hook()
        if self._max_depth >= 1:
            for name in [n for n in summary if n.count(".") >= self._max_depth]:
                del summary[name]
        return summary

    def _forward_example_input(self) -> None:
        model = self._model
        example = model.example_input_array
        device = next((p.device for p in model.parameters() if not _lazy(p)), torch.device("cpu"))
        if hasattr(model, "transfer_batch_to_device"):  # the module's own transfer hooks, as a batch gets
            example = model.on_before_batch_transfer(example, 0)
            example = model.transfer_batch_to_device(example, device, 0)
            example = model.on_after_batch_transfer(example, 0)
        modes = {m: m.training for m in model.modules()}
        model.eval()
        trainer = getattr(model, "_trainer", None)  # summarize(model) in a Trainer: its precision, as Lightning's
        precision = self._precision if self._precision is not None or trainer is None else trainer.strategy.precision
        has_autocast = precision is not None and hasattr(precision, "autocast")
        autocast = precision.autocast() if has_autocast else contextlib.nullcontext()
        try:
            with torch.no_grad(), autocast, self._flop_counter:
                if isinstance(example, (list, tuple)):
                    model(*example)
                elif isinstance(example, dict):
                    model(**example)
                else:
                    model(example)
        finally:
            for m, mode in modes.items():
                m.training = mode

    def _get_summary_data(self) -> list[tuple[str, list[str]]]:
        """The table's columns: (header, one string per row)."""
        columns = [
            (" ", [str(i) for i in range(len(self._layer_summary))]),
            ("Name", self.layer_names),
            ("Type", self.layer_types),
            ("Params", [get_human_readable_count(n) for n in self.param_nums]),
            ("Mode", ["train" if mode else "eval" for mode in self.training_modes]),
            ("FLOPs", [get_human_readable_count(sum(c.values())) for c in self.flop_counts.values()]),
        ]
        if self._forward:
            columns.append(("In sizes", [str(x) for x in self.in_sizes]))
            columns.append(("Out sizes", [str(x) for x in self.out_sizes]))
        leftover = self.total_parameters - self.total_layer_params
        if leftover > 0:
            row = {" ": " ", "Name": LEFTOVER_PARAMS_NAME, "Params": get_human_readable_count(leftover)}
            for header, cells in columns:
                cells.append(row.get(header, NOT_APPLICABLE))
        return columns

    def __str__(self) -> str:
        return format_summary_table(
            self.total_parameters, self.trainable_parameters, self.model_size, self.total_training_modes,
            self.total_flops, *self._get_summary_data(),
        )

    def __repr__(self) -> str:
        return str(self)


def summarize(lightning_module: nn.Module, max_depth: int = 1) -> ModelSummary:
    """The :class:`ModelSummary` of ``lightning_module`` down to ``max_depth``."""
    return ModelSummary(lightning_module, max_depth=max_depth)


def parse_batch_shape(batch: Any) -> str | list:
    """A tensor's shape as a list; lists and tuples of them nested alike; ``?`` for anything else."""
    if hasattr(batch, "shape"):
        return list(batch.shape)
    if isinstance(batch, (list, tuple)):
        return [parse_batch_shape(b) for b in batch]
    return UNKNOWN_SIZE


def format_summary_table(
    total_parameters: int, trainable_parameters: int, model_size: float, total_training_modes: dict[str, int],
    total_flops: int, *cols: tuple[str, list[str]],
) -> str:
    """The columns as a table, then the totals, as Lightning prints them."""
    n_rows = len(cols[0][1]) if cols else 0
    widths = [max([len(header)] + [len(str(cell)) for cell in cells]) for header, cells in cols]
    total_width = sum(widths) + 3 * (len(cols) + 1)
    lines = [" | ".join(f"{header:<{w}}" for (header, _), w in zip(cols, widths)), "-" * total_width]
    lines += [" | ".join(f"{str(cells[i]):<{w}}" for (_, cells), w in zip(cols, widths)) for i in range(n_rows)]
    lines.append("-" * total_width)
    totals = [
        (get_human_readable_count(trainable_parameters), "Trainable params"),
        (get_human_readable_count(total_parameters - trainable_parameters), "Non-trainable params"),
        (get_human_readable_count(total_parameters), "Total params"),
        (f"{model_size:,.3f}", "Total estimated model params size (MB)"),
        (total_training_modes["train"], "Modules in train mode"),
        (total_training_modes["eval"], "Modules in eval mode"),
        (get_human_readable_count(total_flops), "Total Flops"),
    ]
    lines += [f"{str(value):<10}{label}" for value, label in totals]
    return "\n".join(lines)


def get_human_readable_count(number: int | float) -> str:
    """123 -> '123  ', 1234 -> '1.2 K', 2e6 -> '2.0 M', 4e14 -> '400 T' (never past trillions)."""
    if number < 0:
        raise ValueError(f"get_human_readable_count(number={number!r}) needs a count >= 0.")
    digits = int(math.floor(math.log10(number)) + 1) if number > 0 else 1
    groups = min(int(math.ceil(digits / 3)), len(PARAMETER_NUM_UNITS))
    number = number * 10 ** (-3 * (groups - 1))
    if groups < 2 or number >= 100:
        return f"{int(number):,d} {PARAMETER_NUM_UNITS[groups - 1]}"
    return f"{number:,.1f} {PARAMETER_NUM_UNITS[groups - 1]}"


def _lazy(p: torch.Tensor) -> bool:
    return isinstance(p, nn.parameter.UninitializedParameter)


def _numel(p: torch.Tensor, warn: bool = False) -> int:
    """A parameter's size; 0 for a lazy one not yet built (said once per count, when ``warn``)."""
    if not _lazy(p):
        return p.numel()
    if warn:
        warnings.warn(
            "The total number of parameters detected may be inaccurate because the model contains an instance of "
            "`UninitializedParameter`. To get an accurate number, set `self.example_input_array` in your "
            "LightningModule (or run one batch through the model first).", UserWarning, stacklevel=3,
        )
    return 0
