"""Lightning's ``utilities.memory``: tensors out of the autograd graph (and off the GPU)."""

from __future__ import annotations

from typing import Any

import torch


def recursive_detach(in_dict: Any, to_cpu: bool = False) -> Any:
    """``in_dict`` with every tensor in it (nested dicts, lists, tuples and namedtuples too) detached, and moved
    to the CPU with ``to_cpu=True``; other values are returned as they are."""
    if isinstance(in_dict, torch.Tensor):
        out = in_dict.detach()
        return out.cpu() if to_cpu else out
    if isinstance(in_dict, dict):
        return type(in_dict)({k: recursive_detach(v, to_cpu) for k, v in in_dict.items()})
    if isinstance(in_dict, tuple) and hasattr(in_dict, "_fields"):  # a namedtuple takes its fields one by one
        return type(in_dict)(*(recursive_detach(v, to_cpu) for v in in_dict))
    if isinstance(in_dict, (list, tuple)):
        return type(in_dict)(recursive_detach(v, to_cpu) for v in in_dict)
    return in_dict
