"""Lightning's Trainer arguments that this Trainer does not take, each answered with a sentence
saying what to do instead; any other unknown name is a typo, answered with the closest valid one.
Also Lightning's other way to give an argument: a ``PL_TRAINER_<ARGUMENT>`` environment variable."""

from __future__ import annotations

import ast
import functools
import inspect
import os
from typing import Any, Callable, Iterable

from trainer.core.checks import suggest


# Lightning's arguments (2.x, and the 1.x ones scripts still carry) that this Trainer does not take.
UNSUPPORTED = {
    "plugins": "precision is chosen with precision=..., the cluster "
               "environment is read from torchrun's or SLURM's variables, and checkpoint I/O is built in. Remove it.",
    "model_registry": "there is no model registry upload. Remove it, and upload the "
                      "checkpoint (trainer.checkpoint_callback.best_model_path) yourself.",
    "enable_autolog_hparams": "the module's hyperparameters and the Trainer's options are always recorded, in "
                              "each checkpoint and in TensorBoard's HParams tab. Remove it.",
    "gpus": "Lightning 2 replaced it: pass accelerator='gpu', devices=N.",
    "tpu_cores": "there is no TPU support; train on GPUs (accelerator='gpu') or the CPU.",
    "ipus": "there is no Graphcore IPU support; train on GPUs (accelerator='gpu') or the CPU.",
    "hpus": "there is no Habana Gaudi (HPU) support; train on GPUs (accelerator='gpu') or the CPU.",
    "num_processes": "Lightning 2 replaced it: pass accelerator='cpu', devices=N (N processes).",
    "auto_select_gpus": "Lightning 2 removed it: devices=N takes the first N visible GPUs; choose others with "
                        "CUDA_VISIBLE_DEVICES.",
    "auto_lr_find": "Lightning 2 moved it to its Tuner: Tuner(trainer).lr_find(model), or "
                    "callbacks=[LearningRateFinder()].",
    "auto_scale_batch_size": "Lightning 2 moved it to its Tuner: Tuner(trainer).scale_batch_size(model), or "
                             "callbacks=[BatchSizeFinder()].",
    "track_grad_norm": "Lightning 2 removed it: the gradient norm is trainer.grad_norm when "
                       "gradient_clip_val is set; or log your own from on_before_optimizer_step.",
    "resume_from_checkpoint": "Lightning 2 replaced it: pass trainer.fit(model, ..., ckpt_path=path) "
                              "(or ckpt_path='last').",
    "replace_sampler_ddp": "Lightning 2 renamed it: use_distributed_sampler=...",
    "amp_backend": "mixed precision is always torch.autocast: pass precision='16-mixed' or 'bf16-mixed'.",
    "amp_level": "apex is not supported: pass precision='16-mixed' or 'bf16-mixed'.",
    "move_metrics_to_cpu": "logged values are kept on the device and read once per logging step. Remove it.",
    "multiple_trainloader_mode": "one training loader per fit: combine several yourself, e.g. zip them in a "
                                 "generator or an IterableDataset.",
    "weights_save_path": "Lightning 2 removed it: pass default_root_dir=... or ModelCheckpoint(dirpath=...).",
    "flush_logs_every_n_steps": "Lightning 2 removed it: TensorBoard files are flushed by the logger. Remove it.",
    "progress_bar_refresh_rate": "Lightning 2 removed it: pass callbacks=[ProgressBar(refresh_s=...)], or "
                                 "enable_progress_bar=False.",
    "checkpoint_callback": "Lightning 2 renamed it: enable_checkpointing=...",
    "stochastic_weight_avg": "Lightning 2 removed it; use torch.optim.swa_utils in your module.",
    "terminate_on_nan": "Lightning 2 removed it: a NaN/Inf loss always stops fit (checked every "
                        "log_every_n_steps steps); callbacks.NaNGuard skips such steps instead.",
    "prepare_data_per_node": "it is the DataModule's (and the module's) attribute, not the Trainer's.",
    "weights_summary": "Lightning 2 replaced it: enable_model_summary=... or callbacks=[ModelSummary(max_depth=...)].",
    "log_gpu_memory": "Lightning 2 removed it; log torch.cuda.max_memory_allocated() yourself.",
    "process_position": "Lightning 2 removed it: there is one progress bar per run. Remove it.",
    "reload_dataloaders_every_epoch": "Lightning 2 replaced it: reload_dataloaders_every_n_epochs=1.",
    "distributed_backend": "Lightning 2 replaced it: strategy='ddp' (or 'fsdp', 'dp').",
    "accelerator_connector": "not an argument: pass accelerator=..., devices=..., strategy=...",
    "truncated_bptt_steps": "Lightning 2 removed it: split the sequence in training_step yourself.",
    "val_percent_check": "Lightning 2 replaced it: limit_val_batches=...",
    "train_percent_check": "Lightning 2 replaced it: limit_train_batches=...",
    "test_percent_check": "Lightning 2 replaced it: limit_test_batches=...",
}
# Passing one of these with Lightning's default value changes nothing, so it is accepted.
_HARMLESS = {"plugins": (None, []), "model_registry": (None,), "enable_autolog_hparams": (True,)}
_IGNORED = ("suggest_integrations",)  # Lightning's tips about its own integrations: there are none to show


def check_names(unknown: dict[str, Any], valid: Iterable[str]) -> None:
    """Arguments ``Trainer.__init__`` does not name: Lightning's that it does not take, or a typo."""
    for name, value in unknown.items():
        if name in _IGNORED or (name in _HARMLESS and any(value is v or value == v for v in _HARMLESS[name])):
            continue
        if name in UNSUPPORTED:
            raise TypeError(f"Trainer({name}={value!r}) is not supported: {UNSUPPORTED[name]}")
        hint = suggest(name, valid) or " See docs/trainer-arguments.md for the arguments Trainer takes."
        raise TypeError(f"Trainer.__init__() got an unexpected keyword argument {name!r}.{hint}")  # Python's own words


def env_defaults(cls: type) -> dict[str, Any]:
    """Lightning's ``PL_<CLASS>_<ARGUMENT>`` variables (``PL_TRAINER_MAX_EPOCHS=3``) for the
    arguments of ``cls``: each value read as a Python literal (``3``, ``False``, ``[0, 1]``), else
    as the string it is (``PL_TRAINER_ACCELERATOR=cpu``); an empty one is not set."""
    values = {}
    for name, parameter in inspect.signature(cls).parameters.items():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        value: Any = os.environ.get(f"PL_{cls.__name__.upper()}_{name.upper()}")
        if value:
            try:
                value = ast.literal_eval(value)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                pass  # not a literal: the string itself
            values[name] = value
    return values


def defaults_from_env_vars(init: Callable[..., None]) -> Callable[..., None]:
    """Wraps ``__init__``: the environment's values (:func:`env_defaults`) for the arguments not
    passed, as Lightning's ``_defaults_from_env_vars``; an argument passed wins."""

    @functools.wraps(init)
    def insert_env_defaults(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **{**env_defaults(type(self)), **kwargs})

    return insert_env_defaults


def named_signature(init: Callable[..., None]) -> Callable[..., None]:
    """Gives ``init`` the signature that ``help()``, editors and the command line read: its named
    arguments, as Lightning's ``Trainer.__init__`` has, without the ``**unknown`` that only turns
    Lightning's arguments we do not take, and typos, into a sentence (:func:`check_names`)."""
    signature = inspect.signature(init)
    named = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    init.__signature__ = signature.replace(parameters=named)  # type: ignore[attr-defined]
    return init
