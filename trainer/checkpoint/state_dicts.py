"""State dicts in the form checkpoints hold them: the bare model's keys (no ``_orig_mod.`` from
``torch.compile``), and optimizer states by position (torch's own form) or by parameter name
(``torch.distributed.checkpoint``'s, which fsdp writes), converted either way on load."""

from __future__ import annotations

import warnings
from typing import Any

import torch


_COMPILED = "_orig_mod."  # torch.compile(submodule) inserts it into the submodule's keys


def plain_state_dict(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` without ``_orig_mod.`` in its keys: what the uncompiled model's state_dict holds."""
    if not any(_COMPILED in k for k in state):
        return state
    return {k.replace(_COMPILED, ""): v for k, v in state.items()}


def load_plain_state_dict(module: torch.nn.Module, state: dict[str, Any], strict: bool = True, assign: bool = False) -> Any:
    """``module.load_state_dict(state)``, for a ``state`` with plain keys into a module that may
    hold compiled submodules (``self.net = torch.compile(self.net)``), and the other way round."""
    own = {k.replace(_COMPILED, ""): k for k in module.state_dict()}
    state = plain_state_dict(state)
    state = {own.get(k, k): v for k, v in state.items()}
    # assign only when asked: a model's own load_state_dict may not take it
    return module.load_state_dict(state, strict=strict, assign=True) if assign else module.load_state_dict(state, strict=strict)


def optimizer_state_by_name(state: dict[str, Any], optimizer: torch.optim.Optimizer, module: torch.nn.Module) -> dict[str, Any]:
    """An optimizer's ``state_dict()`` keyed by parameter name instead of position, as
    ``torch.distributed.checkpoint.state_dict`` writes it (fsdp's checkpoints hold this form)."""
    if not _by_position(state):
        return state
    names = param_names(optimizer, module)
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]
    return {"state": {names[i]: s for i, s in state["state"].items()}, "param_groups": groups}


def optimizer_state_by_position(state: dict[str, Any], optimizer: torch.optim.Optimizer, module: torch.nn.Module) -> dict[str, Any]:
    """The other way: a name-keyed optimizer state as ``optimizer.load_state_dict`` takes it."""
    if _by_position(state):
        return state
    positions = {name: i for i, name in enumerate(param_names(optimizer, module))}
    missing = [n for g in state["param_groups"] for n in g["params"] if n not in positions]
    if missing:
        raise ValueError(
            f"The checkpoint's optimizer state names parameters this optimizer does not hold: {missing[:3]}. "
            "Resume with the model and configure_optimizers() it was trained with."
        )
    groups = [{**g, "params": [positions[n] for n in g["params"]]} for g in state["param_groups"]]
    return {"state": {positions[n]: s for n, s in state["state"].items()}, "param_groups": groups}


def _by_position(state: dict[str, Any]) -> bool:
    return all(isinstance(i, int) for g in state.get("param_groups", []) for i in g["params"])


def param_names(optimizer: torch.optim.Optimizer, module: torch.nn.Module) -> list[str]:
    """The optimizer's parameters' names in the model, in the optimizer's order."""
    by_id = {id(p): name.replace(_COMPILED, "") for name, p in module.named_parameters()}
    params = [p for group in optimizer.param_groups for p in group["params"]]
    unnamed = [tuple(p.shape) for p in params if id(p) not in by_id]
    if unnamed:
        raise ValueError(f"The optimizer holds parameters that are not the model's (shapes {unnamed[:3]}).")
    return [by_id[id(p)] for p in params]


def load_sharded_model(path: str, template: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The model of a sharded checkpoint folder, whole, in this one process (no process group):
    ``template`` (the bare model's state dict) gives the keys, shapes and dtypes to read into."""
    from trainer.checkpoint.sharded_read import load_shards  # only for sharded folders: imports DCP

    state = {"model": {k: torch.empty_like(v, device="cpu") for k, v in template.items()}}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        load_shards(state, path, no_dist=True)
    return state["model"]
