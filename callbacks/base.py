"""The Callback base class (every hook is a no-op until a subclass overrides it), and LambdaCallback."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

from trainer.core.checks import suggest

if TYPE_CHECKING:
    import torch

    from trainer import Trainer, TrainModule


class Callback:
    """Hooks into the loop. Each hook takes ``(trainer, module, ...)``.

    The call order is the one in ``trainer.loops.fit.FitLoop``'s docstring. Callbacks run in the order
    the user gave them, then the built-ins (progress bar, TensorBoard, checkpoints), with no
    reordering by type; a built-in the user passed configured replaces the default one. Only
    the hooks a callback overrides (in its class, or as an instance attribute, as
    ``LambdaCallback`` does) and ``wants`` for the run are ever called, so an unused hook
    costs nothing per step.
    ``state_dict``/``load_state_dict`` ride in checkpoints under ``state_key``; under DDP,
    rank 0's state is loaded back into the caller's callbacks after fit.

    Its public members are Lightning's hooks, ``state_key``, ``state_dict`` and ``load_state_dict``,
    and nothing else: code that wraps each public member (Lightning's ``LambdaCallback`` test does)
    keeps working. One hook of ours is not on this class, since Lightning has none such:
    ``on_train_log(trainer, pl_module, metrics)``, called where a subclass defines it, every
    ``log_every_n_steps`` optimizer steps with the values that step's ``training_step`` logged, as
    floats (where the Trainer writes the loggers' training rows). The Trainer asks a callback for more
    only through public methods that a subclass may define, looked up on its class (none on this one):
    ``wants_hook(hook)`` (False: skip a hook for this run; ``ModelCheckpoint``, ``LearningRateMonitor``),
    ``wait_for_saves(trainer)``
    (files written in the background are on disk; ``ModelCheckpoint``), ``restore_param_groups(trainer)``
    (a resumed fit's optimizer groups; ``BaseFinetuning``) and ``tune_before_stage(tuner, stage, ...)``
    (a search before a stage; ``BatchSizeFinder``, ``LearningRateFinder``).
    """

    @property
    def state_key(self) -> str:
        """The key of this callback's ``state_dict`` in checkpoints. A callback that may be
        given twice with different arguments builds it with ``_generate_state_key``."""
        return type(self).__name__

    def _generate_state_key(self, **kwargs: Any) -> str:
        """``MyCallback{'monitor': 'val_loss'}``: Lightning's form of a key told apart by arguments."""
        return f"{type(self).__qualname__}{kwargs!r}"

    # --- whole run ---------------------------------------------------------------------
    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None: ...
    def teardown(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None: ...
    def on_fit_start(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_fit_end(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_exception(self, trainer: Trainer, pl_module: TrainModule, exception: BaseException) -> None: ...

    # --- training ----------------------------------------------------------------------
    def on_train_start(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_train_end(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_train_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_train_batch_start(self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int) -> None: ...
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None: ...
    def on_before_backward(self, trainer: Trainer, pl_module: TrainModule, loss: torch.Tensor) -> None: ...
    def on_after_backward(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: TrainModule, optimizer: torch.optim.Optimizer
    ) -> None: ...
    def on_before_zero_grad(
        self, trainer: Trainer, pl_module: TrainModule, optimizer: torch.optim.Optimizer
    ) -> None: ...
    # --- validation / test / predict ---------------------------------------------------
    def on_sanity_check_start(self, trainer: Trainer, pl_module: TrainModule) -> None:
        """Before fit's sanity check (``num_sanity_val_steps``), whose validation hooks go to
        the model only: a callback never sees a sanity run as a validation."""

    def on_sanity_check_end(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_validation_start(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_validation_end(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_validation_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_validation_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None: ...
    def on_validation_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None: ...
    def on_test_start(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_test_end(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_test_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_test_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_test_batch_start(
        self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None: ...
    def on_test_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None: ...
    def on_predict_start(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_predict_end(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_predict_epoch_start(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_predict_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None: ...
    def on_predict_batch_start(
        self, trainer: Trainer, pl_module: TrainModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None: ...
    def on_predict_batch_end(
        self, trainer: Trainer, pl_module: TrainModule, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None: ...

    # --- checkpoints -------------------------------------------------------------------
    def on_save_checkpoint(self, trainer: Trainer, pl_module: TrainModule, checkpoint: dict[str, Any]) -> None:
        """Add to (or change) the checkpoint about to be written (global rank 0), after every
        callback's ``state_dict()`` was taken and before the model's own hook."""

    def on_load_checkpoint(self, trainer: Trainer, pl_module: TrainModule, checkpoint: dict[str, Any]) -> None:
        """When fit resumes: read the loaded checkpoint, after the model's weights were loaded and
        before any callback's ``load_state_dict``."""

    def state_dict(self) -> dict[str, Any]:
        """What checkpoints keep of this callback, under ``state_key`` (none if empty)."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take back what ``state_dict`` returned, when fit resumes from a checkpoint."""


# Lightning's hooks, then ours (defined by the callbacks that want it, not by the base class).
HOOKS = tuple(
    name for name in vars(Callback) if name.startswith("on_") or name in ("setup", "teardown")
) + ("on_train_log",)


class LambdaCallback(Callback):
    """Each keyword names a hook; its function gets the hook's arguments.

    Example: ``LambdaCallback(on_train_epoch_end=lambda trainer, module: print(trainer.current_epoch))``.
    Only the hooks given are ever called. Under ``strategy="ddp"`` (spawned workers) the
    functions are pickled, so give module-level functions rather than lambdas there.
    """

    def __init__(self, **hooks: Callable[..., Any]) -> None:
        for name, fn in hooks.items():
            if name not in HOOKS:
                raise TypeError(
                    f"LambdaCallback got an unknown hook {name!r}.{suggest(name, HOOKS)} "
                    f"Valid hooks: {', '.join(HOOKS)}."
                )
            if not callable(fn):
                raise TypeError(
                    f"LambdaCallback({name}={fn!r}): the value must be a function that takes the hook's "
                    f"arguments, e.g. {name}=lambda trainer, module, *args: ..."
                )
            # An instance attribute: the Trainer's hook table counts it as an override.
            setattr(self, name, fn)
