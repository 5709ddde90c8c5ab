"""Lightning's ``utilities.parameter_tying``: parameters that several modules share (tied weights)."""

from __future__ import annotations

from torch import nn


def find_shared_parameters(module: nn.Module) -> list[list[str]]:
    """Groups of names under which one parameter appears in ``module`` (only groups of two or more)."""
    names: dict[int, list[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def set_shared_parameters(module: nn.Module, shared_params: list[list[str]]) -> nn.Module:
    """Make each group of names in ``shared_params`` point at the first name's parameter (ties weights
    again, after something such as a device move or sharding has untied them)."""
    for first, *others in shared_params:
        param = module.get_parameter(first)
        for name in others:
            owner, _, leaf = name.rpartition(".")
            setattr(module.get_submodule(owner), leaf, param)
    return module
