"""What the tracking-service loggers (MLflow, W&B) share: the install hint, hyperparameters made
storable, and the checkpoint files a ``log_model`` logger has not uploaded yet."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import json
import os
from argparse import Namespace
from collections.abc import MutableMapping
from typing import Any

# The ModelCheckpoint options recorded beside an uploaded checkpoint (its metadata), as Lightning's.
CHECKPOINT_OPTIONS = (
    "monitor", "mode", "save_last", "save_top_k", "save_weights_only", "every_n_train_steps", "every_n_epochs",
)


def need(module: str, logger: str, service: str, requirement: str, extra: str) -> None:
    """At construction: the tracking client is importable, or a sentence with the install command."""
    if importlib.util.find_spec(module) is None:
        raise ModuleNotFoundError(
            f"{logger} logs to {service} through the `{module}` package, which is not installed: "
            f'pip install "{requirement}" (or the extra: pip install "steadytrainer[{extra}]").'
        )


def log_model_option(logger: str, value: Any) -> bool | str:
    if value is True or value is False or value == "all":
        return value
    raise ValueError(
        f"{logger}(log_model={value!r}) must be False (no checkpoint uploaded), True (the kept checkpoints, when "
        "training ends; every one at once with save_top_k=-1) or 'all' (each checkpoint as it is saved)."
    )


def flatten(params: MutableMapping[Any, Any], parent: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a/b": 1}``: nested dicts, dataclasses, Namespaces and lists of
    dicts (``dl/0/a``) become one level, as Lightning flattens what MLflow stores."""
    flat: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{parent}/{key}" if parent else str(key)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            value = dataclasses.asdict(value)
        elif isinstance(value, Namespace):
            value = vars(value)
        if isinstance(value, MutableMapping):
            flat.update(flatten(value, name))
        elif isinstance(value, list) and value and all(isinstance(v, MutableMapping) for v in value):
            for i, item in enumerate(value):
                flat.update(flatten(item, f"{name}/{i}"))
        else:
            flat[name] = value
    return flat


def json_ready(params: dict[str, Any]) -> dict[str, Any]:
    """W&B's config takes JSON: a class becomes its name, a callable its result (or its name, as
    Lightning does), and anything else JSON cannot hold its ``str``."""
    return {key: _storable(_called(value)) for key, value in params.items()}


def _called(value: Any) -> Any:
    if inspect.isclass(value):
        return value.__name__
    if callable(value):
        try:
            result = value()
        except Exception:  # a callable that needs arguments: its name (Lightning's)
            return getattr(value, "__name__", None)
        return value.__name__ if callable(result) else result
    return value


def _storable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str, list, dict)):
        return value
    try:
        json.dumps(value)
    except (TypeError, ValueError, OverflowError):
        return str(value)
    return value


def new_checkpoints(callback: Any, uploaded: dict[str, float]) -> list[tuple[float, str, Any]]:
    """The checkpoint files of ``callback`` (its last, best and top k) not uploaded since they
    were last written, oldest first: (modification time, path, score). ``uploaded`` maps the
    paths already uploaded to their modification time then (a rewritten ``last.ckpt`` goes again)."""
    scores: dict[str, Any] = {}
    if getattr(callback, "last_model_path", ""):
        scores[callback.last_model_path] = getattr(callback, "current_score", None)
    if getattr(callback, "best_model_path", ""):
        scores[callback.best_model_path] = getattr(callback, "best_model_score", None)
    scores.update(getattr(callback, "best_k_models", {}) or {})
    found = sorted((os.path.getmtime(p), p, s) for p, s in scores.items() if p and os.path.isfile(p))
    return [(t, p, s) for t, p, s in found if p not in uploaded or uploaded[p] < t]


def checkpoint_metadata(callback: Any, path: str, score: Any, key: str | None = None) -> dict[str, Any]:
    """What is stored beside an uploaded checkpoint: its score, file name and the callback's
    options (under ``key``, the callback's class name by default)."""
    options = {k: getattr(callback, k) for k in CHECKPOINT_OPTIONS if hasattr(callback, k)}
    return {
        "score": score.item() if hasattr(score, "item") else score,
        "original_filename": os.path.basename(path),
        key or type(callback).__name__: options,
    }
