"""The checkpoint file's layout: Lightning's keys, and what only we keep under one key of ours.

A file is Lightning's (``_CheckpointConnector.dump_checkpoint``): ``epoch``, ``global_step``,
``pytorch-lightning_version``, ``state_dict``, ``loops``, ``callbacks``, ``optimizer_states``,
``lr_schedulers``, the scaler under ``MixedPrecision``, the hyperparameters, the DataModule's
state under its class's name, and what ``on_save_checkpoint`` adds. What Lightning has no
place for (the RNG states, the batch position of an exact mid-epoch resume, the strategy, the
Trainer's options) sits under ``KEY``, which Lightning ignores.

``to_file`` lays out what ``resume.capture`` took; ``read`` takes any file this project loads
(this layout, one Lightning wrote, one of ours from 0.1) and returns it in this layout, with
``KEY`` filled as far as the file tells. Nowhere else knows where a value sits in the file.
"""

from __future__ import annotations

import math
from typing import Any

#: The Lightning release whose layout the file follows (our own version is in ``KEY``).
LIGHTNING_VERSION = "2.6.5"
KEY = "steadytrainer"
FILE_FORMAT = "steadytrainer/2"  # the checkpoint file's layout (capture()'s state in memory: resume.CAPTURE_FORMAT)
#: Lightning's precision plugin for "16-mixed" keeps the GradScaler's state under its class's name.
SCALER = "MixedPrecision"
#: What a weights-only file leaves out (Lightning's ``dump_checkpoint(weights_only=True)``), and of ours.
_TRAINING_KEYS = ("callbacks", "optimizer_states", "lr_schedulers", SCALER)
_OUR_TRAINING_KEYS = ("rng", "epoch_start", "train_metrics", "optimizer_classes")


def to_file(state: dict[str, Any]) -> dict[str, Any]:
    """The file's dict for ``state`` (what ``capture`` returns; an 0.1 file has the same keys)."""
    loop = state.get("loop") or {}
    step = loop.get("global_step", 0)
    file: dict[str, Any] = {
        "epoch": loop.get("current_epoch", loop.get("epoch", 0)),
        "global_step": step,
        "pytorch-lightning_version": LIGHTNING_VERSION,
    }
    if "model" in state:  # a sharded checkpoint's shards hold the weights and optimizer states
        file["state_dict"] = state["model"]
    file["loops"] = lightning_loops(
        loop.get("epoch", 0), loop.get("batch_in_epoch", 0), step, loop.get("batches", math.inf),
        loop.get("automatic", True), loop.get("batches_stepped"),
    )
    # 0.1's save_checkpoint(weights_only=True) kept no loop
    weights_only = bool(state.get("weights_only")) or "loop" not in state
    if not weights_only:
        file["callbacks"] = {k: v for k, v in state.get("callbacks", {}).items() if v}  # Lightning keeps non-empty ones
        optimizers = state.get("optimizer_states")
        if optimizers is None and state.get("optimizer") is not None:  # 0.1.0 kept one, singular
            optimizers = [state["optimizer"]]
        if optimizers is not None or "model" in state:
            file["optimizer_states"] = optimizers or []
        schedulers = state.get("lr_schedulers")
        if schedulers is None:
            schedulers = [] if state.get("lr_scheduler") is None else [state["lr_scheduler"]]
        file["lr_schedulers"] = schedulers
        scaler = (state.get("precision") or {}).get("scaler")
        if scaler:
            file[SCALER] = scaler
    _hparams(file, "", state.get("hparams"), state.get("hparams_name"), state.get("hparams_left_out"))
    _hparams(
        file, "datamodule_", state.get("datamodule_hparams"), state.get("datamodule_hparams_name"),
        state.get("datamodule_hparams_left_out"),
    )
    datamodule, name = state.get("datamodule"), state.get("datamodule_name")
    if datamodule and name:
        file[name] = datamodule
    ours = {
        "format": FILE_FORMAT,
        "version": state.get("version"),
        "weights_only": weights_only,
        "loop": {
            k: loop[k]
            for k in ("epoch", "batch_in_epoch", "global_step", "batches_stepped", "world_size", "val_pending")
            if k in loop
        },
        "metrics": state.get("metrics", {}),
        "strategy": state.get("strategy"),
        "trainer": state.get("trainer", {}),
        "hparams_left_out": state.get("hparams_left_out", []),
        "hparams_pickled": state.get("hparams_pickled") or {},  # bytes: loaded only with weights_only=False
        # the hyperparameters' type where not a dict (an OmegaConf config): Lightning pickles the class there
        **{k: state[k] for k in ("hparams_type", "datamodule_hparams_type") if state.get(k)},
    }
    if not weights_only:
        ours.update({k: state[k] for k in _OUR_TRAINING_KEYS if k in state})
    if datamodule and not name:  # an 0.1 file did not name the DataModule's class
        ours["datamodule"] = datamodule
    file[KEY] = ours
    return file


def _hparams(file: dict[str, Any], prefix: str, kept: Any, name: Any, left_out: Any) -> None:
    """Lightning writes a name and the hyperparameters when the object has any."""
    if kept or left_out:
        file[f"{prefix}hparams_name"] = name
        file[f"{prefix}hyper_parameters"] = dict(kept or {})


def weights_only(file: dict[str, Any]) -> dict[str, Any]:
    """``file`` without the training state (Lightning's ``save_weights_only``): what the model's
    weights, hyperparameters and counters need; ``fit`` refuses to resume from it."""
    cut = {k: v for k, v in file.items() if k not in _TRAINING_KEYS}
    ours = {k: v for k, v in file.get(KEY, {}).items() if k not in _OUR_TRAINING_KEYS}
    ours["weights_only"] = True
    cut[KEY] = ours
    return cut


def read(ckpt: dict[str, Any]) -> dict[str, Any]:
    """``ckpt`` as loaded, in this layout: ours as it is, an 0.1 file of ours converted, and a
    Lightning file given ``KEY`` with the position its ``loops`` tell (and no RNG states)."""
    if KEY in ckpt:
        return ckpt
    if "loop" in ckpt or ("model" in ckpt and "state_dict" not in ckpt):  # ours, from 0.1: "model", "hparams", "loop"
        return to_file(ckpt)
    step = ckpt.get("global_step", 0)
    epoch, batch = loop_position(ckpt.get("loops"), ckpt.get("epoch", 0))
    stepped = batches_stepped(ckpt.get("loops"))
    ckpt[KEY] = {
        "format": None,  # written by Lightning
        "version": ckpt.get("pytorch-lightning_version"),
        "weights_only": "optimizer_states" not in ckpt,
        "loop": {
            "epoch": epoch, "batch_in_epoch": batch, "global_step": step,
            **({} if stepped is None else {"batches_stepped": stepped}),
        },
        "metrics": {},
        "hparams_left_out": [],
    }
    return ckpt


def ours(ckpt: dict[str, Any]) -> dict[str, Any]:
    """What only this project keeps (``read`` has filled it for any file)."""
    return ckpt[KEY]


def is_weights_only(ckpt: dict[str, Any]) -> bool:
    return bool(ckpt[KEY].get("weights_only"))


def scaler_state(ckpt: dict[str, Any]) -> dict[str, Any]:
    """What ``Precision.load_state_dict`` takes: the GradScaler's state, where Lightning puts it."""
    if SCALER in ckpt:
        return {"scaler": ckpt[SCALER]}
    if "native_amp_scaling_state" in ckpt:  # Lightning before 1.6
        return {"scaler": ckpt["native_amp_scaling_state"]}
    return {}


# --- Lightning's loop progress ------------------------------------------------------------------
def loop_position(loops: dict[str, Any] | None, epoch: int) -> tuple[int, int]:
    """(the epoch to run next, the batches of it already trained) from Lightning's ``loops``:
    an epoch whose batches all ran (``processed`` caught up with ``started``) is done, and the
    next starts at batch 0; else the run stopped after ``processed`` batches of it. Without
    ``loops`` (Lightning before 1.6), the file's ``epoch`` at batch 0."""
    fit = (loops or {}).get("fit_loop")
    if not fit or "epoch_progress" not in fit:
        return int(epoch), 0
    epochs = fit["epoch_progress"]["current"]
    done = int(epochs["processed"])
    if epochs["started"] > epochs["processed"]:
        return done, int(fit["epoch_loop.batch_progress"]["current"]["processed"])
    return done, 0


def batches_stepped(loops: dict[str, Any] | None) -> int | None:
    """A manual-optimization file's logging step (Lightning's ``_batches_that_stepped``, which
    Lightning raises by one when it resumes a file saved before its batch completed, as in
    ``on_train_batch_end``); None for automatic optimization's, where it is ``global_step``."""
    fit = (loops or {}).get("fit_loop") or {}
    manual = fit.get("epoch_loop.manual_optimization.optim_step_progress", {}).get("total", {}).get("completed", 0)
    stepped = fit.get("epoch_loop.state_dict", {}).get("_batches_that_stepped")
    if not manual or stepped is None:
        return None
    batches = fit.get("epoch_loop.batch_progress", {}).get("total", {})
    return int(stepped) + (1 if batches.get("completed", 0) < batches.get("processed", 0) else 0)


def lightning_loops(
    epoch: int, batch: int, step: int, batches: float, automatic: bool, stepped: int | None = None,
) -> dict[str, Any]:
    """Lightning's ``loops`` entry for a run ``batch`` batches into ``epoch`` after ``step``
    optimizer steps (and ``stepped`` batches that stepped, under manual optimization; else
    ``step``), in the form Lightning itself writes at that point: at an epoch's end (batch 0 of
    the next) that of a finished fit, mid-epoch that of a save at a batch's end. Lightning
    resumes it at the same epoch and step; mid-epoch it runs the epoch's remaining batches."""
    stepped = step if stepped is None else stepped
    per_epoch = int(batches) if batches != math.inf else 0
    total = epoch * per_epoch + batch  # batches trained in all (a guess with an unsized loader)
    if batch == 0:
        epochs = _progress(epoch, epoch, epoch, epoch)
        current = per_epoch if epoch else 0
        batch_progress = {
            "total": _progress(total, total, total, total), "current": _progress(current, current, current, current),
            "is_last_batch": bool(epoch and per_epoch),
        }
    else:  # saved at a batch's end: Lightning counts that batch as not yet completed
        epochs = _progress(epoch + 1, epoch + 1, epoch, epoch)
        batch_progress = {
            "total": _progress(total, total, total, total - 1), "current": _progress(batch, batch, batch, batch - 1),
            "is_last_batch": batch == per_epoch,
        }
        stepped = max(stepped - 1, 0)  # Lightning adds the batch that stepped when it restarts
    auto, manual = (step, 0) if automatic else (0, step)
    fit_loop = {
        "state_dict": {},
        "epoch_loop.state_dict": {"_batches_that_stepped": stepped},
        "epoch_loop.batch_progress": batch_progress,
        "epoch_loop.scheduler_progress": {"total": _steps(0), "current": _steps(0)},
        "epoch_loop.automatic_optimization.state_dict": {},
        "epoch_loop.automatic_optimization.optim_progress": {"optimizer": {
            "step": {"total": _steps(auto), "current": _steps(0)},
            "zero_grad": {"total": _zero_grads(auto), "current": _zero_grads(0)},
        }},
        "epoch_loop.manual_optimization.state_dict": {},
        "epoch_loop.manual_optimization.optim_step_progress": {"total": _steps(manual), "current": _steps(0)},
        "epoch_loop.val_loop.state_dict": {},
        "epoch_loop.val_loop.batch_progress": _batches(is_last_batch=False),
        "epoch_progress": {"total": epochs, "current": dict(epochs)},
    }
    return {
        "fit_loop": fit_loop,
        "validate_loop": {"state_dict": {}, "batch_progress": _batches(is_last_batch=False)},
        "test_loop": {"state_dict": {}, "batch_progress": _batches(is_last_batch=False)},
        "predict_loop": {"state_dict": {}, "batch_progress": _batches()},
    }


def _progress(ready: int, started: int, processed: int, completed: int) -> dict[str, int]:
    return {"ready": ready, "started": started, "processed": processed, "completed": completed}


def _steps(n: int) -> dict[str, int]:
    return {"ready": n, "completed": n}


def _zero_grads(n: int) -> dict[str, int]:
    return {"ready": n, "started": n, "completed": n}


def _batches(**extra: Any) -> dict[str, Any]:
    return {"total": _progress(0, 0, 0, 0), "current": _progress(0, 0, 0, 0), **extra}


# --- numbers --------------------------------------------------------------------------------
def python_numbers(file: dict[str, Any]) -> dict[str, Any]:
    """``file`` with numpy numbers as Python's (``torch.load(weights_only=True)`` refuses
    numpy's): a scheduler built with numpy puts them in param groups and scheduler states.
    The weights and optimizer moments (tensors) are not walked."""
    out = {}
    for key, value in file.items():
        if key == "state_dict":
            out[key] = value
        elif key == "optimizer_states" and isinstance(value, list):
            out[key] = [
                {**s, "param_groups": _plain(s["param_groups"])} if isinstance(s, dict) and "param_groups" in s
                else _plain(s)
                for s in value
            ]
        else:
            out[key] = _plain(value)
    return out


# Values ``_plain`` keeps as they are without a call each: most of a checkpoint's leaves.
_KEPT = frozenset((int, float, str, bool, type(None)))


def _plain(value: Any) -> Any:
    kind = type(value)
    if kind is dict:
        return {k: v if type(v) in _KEPT else _plain(v) for k, v in value.items()}
    if kind is list:
        return [v if type(v) in _KEPT else _plain(v) for v in value]
    if kind is tuple:
        return tuple([v if type(v) in _KEPT else _plain(v) for v in value])
    if kind.__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        return value.item()  # np.float64(0.1) -> 0.1
    return value
