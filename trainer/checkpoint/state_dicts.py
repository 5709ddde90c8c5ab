"""State dicts in the form checkpoints hold them: the bare model's keys (no ``_orig_mod.`` from
``torch.compile``), and optimizer states by position (torch's own form) or by parameter name
(``torch.distributed.checkpoint``'s, which fsdp writes), converted either way on load."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from trainer.checkpoint.layout import ours


_COMPILED = "_orig_mod."  # torch.compile(submodule) inserts it into the submodule's keys


def plain_state_dict(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` without ``_orig_mod.`` in its keys: what the uncompiled model's state_dict holds."""
    if not any(_COMPILED in k for k in state):
        return state
    return {k.replace(_COMPILED, ""): v for k, v in state.items()}


def load_plain_state_dict(
    module: torch.nn.Module, state: dict[str, Any], strict: bool = True, assign: bool = False
) -> Any:
    """``module.load_state_dict(state)``, for a ``state`` with plain keys into a module that may
    hold compiled submodules (``self.net = torch.compile(self.net)``), and the other way round."""
    own = {k.replace(_COMPILED, ""): k for k in module.state_dict()}
    state = plain_state_dict(state)
    state = {own.get(k, k): v for k, v in state.items()}
    # assign only when asked: a model's own load_state_dict may not take it
    if assign:
        return module.load_state_dict(state, strict=strict, assign=True)
    return module.load_state_dict(state, strict=strict)


def optimizer_state_by_name(
    state: dict[str, Any], optimizer: torch.optim.Optimizer, module: torch.nn.Module
) -> dict[str, Any]:
    """An optimizer's ``state_dict()`` keyed by parameter name instead of position, as
    ``torch.distributed.checkpoint.state_dict`` writes it (fsdp's checkpoints hold this form)."""
    if not _by_position(state):
        return state
    names = param_names(optimizer, module)
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]
    return {"state": {names[i]: s for i, s in state["state"].items()}, "param_groups": groups}


def optimizer_state_by_position(
    state: dict[str, Any], optimizer: torch.optim.Optimizer, module: torch.nn.Module
) -> dict[str, Any]:
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


def optimizer_class(optimizer: torch.optim.Optimizer) -> str:
    """What a checkpoint records of an optimizer beside its state dict, which does not name it."""
    return f"{type(optimizer).__module__}.{type(optimizer).__qualname__}"


def key_mismatch(module: torch.nn.Module, state: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The keys ``module`` has and ``state`` lacks, and the other way round (plain keys)."""
    own, state = set(plain_state_dict(module.state_dict())), set(plain_state_dict(state))
    return sorted(own - state), sorted(state - own)


def check_weights_fit(ckpt: dict[str, Any], module: torch.nn.Module) -> None:
    """``fit(ckpt_path=...)``: the file's weights are of the kinds of ``module``'s (int64 weights
    were cast into a float model in silence), else a ``ValueError`` naming the first that is not.
    A float of another width (a precision change) loads as ``load_state_dict`` casts it; so does
    any weight ``load_from_checkpoint`` loads, as in Lightning."""
    own = plain_state_dict(module.state_dict())
    for key, saved in plain_state_dict(ckpt.get("state_dict") or {}).items():
        mine = own.get(key)
        if (isinstance(saved, torch.Tensor) and isinstance(mine, torch.Tensor)
                and _kind(saved.dtype) != _kind(mine.dtype)):
            raise ValueError(
                f"The checkpoint's {key!r} is {saved.dtype} and {type(module).__name__}'s is {mine.dtype}: loading "
                "would cast it in silence. Resume with the model it was trained with, or convert the file's weights."
            )


def check_optimizers_fit(ckpt: dict[str, Any], optimizers: list[torch.optim.Optimizer]) -> None:
    """``fit(ckpt_path=...)``: the file's optimizer states are states of ``optimizers`` (same
    class, same param groups), else a ``ValueError`` naming the difference before any is loaded
    (torch's own errors came at the first step, as ``KeyError: 'momentum'``, or were its raw
    ``ValueError`` about param groups)."""
    classes, states = ours(ckpt).get("optimizer_classes") or [], ckpt.get("optimizer_states") or []
    fix = (
        "Resume with the optimizer it was trained with, "
        "or load only the weights (Model.load_from_checkpoint) and train anew."
    )
    for i, opt in enumerate(optimizers):
        name = type(opt).__name__
        if i < len(classes) and classes[i] != optimizer_class(opt):
            raise ValueError(f"The checkpoint's optimizer {i} is {classes[i]}, and configure_optimizers() now returns "
                             f"{name} ({optimizer_class(opt)}): its state does not fit. {fix}")
        if i >= len(states):
            continue
        groups = states[i].get("param_groups", [])
        if len(groups) != len(opt.param_groups):
            raise ValueError(f"The checkpoint's optimizer {i} has {len(groups)} param group(s); {name} now has "
                             f"{len(opt.param_groups)}. {fix}")
        sizes, now = [len(g["params"]) for g in groups], [len(g["params"]) for g in opt.param_groups]
        if sizes != now:
            raise ValueError(
                f"The checkpoint's optimizer {i} has param groups of {sizes} parameters; {name} now holds {now}. {fix}"
            )
        # A file that does not name the class (Lightning's, or one of ours from before): the settings its
        # groups hold tell (Adam's betas and eps, SGD's momentum and dampening); a scheduler adds initial_lr.
        foreign = sorted(
            {k for g in groups for k in g} - {k for g in opt.param_groups for k in g} - {"params", "initial_lr"}
        )
        if not classes and foreign:
            raise ValueError(
                f"The checkpoint's optimizer {i} has settings {foreign}, not {name}'s: it was another optimizer. {fix}"
            )


def _kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    return "complex" if dtype.is_complex else "float" if dtype.is_floating_point else "int"
