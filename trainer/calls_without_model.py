"""``trainer.validate()``, ``test()`` and ``predict()`` with no model, after a ``fit``: the
fitted model and its data, and by default the best checkpoint's weights, as in Lightning."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

from trainer.core.distributed import rank_zero_warn
from trainer.core.exceptions import misconfigured
from trainer.data.loaders import LOADER_METHOD, defines

if TYPE_CHECKING:
    from trainer.trainer import Trainer

log = logging.getLogger("trainer")


def fitted_sources(
    trainer: Trainer, stage: str, dataloaders: Any, datamodule: Any, ckpt_path: Any
) -> tuple[Any, Any, Any, Any]:
    """``(model, dataloaders, datamodule, ckpt_path)`` for ``trainer.<stage>(model=None, ...)``.

    The model is the one the last ``fit`` trained. The data, unless given: fit's DataModule, else
    the model's own ``*_dataloader()``, else (for ``validate``) fit's ``val_dataloaders``. The
    weights, unless ``ckpt_path`` says otherwise: the best checkpoint of the Trainer's
    ``ModelCheckpoint`` when it saved one, else the model as fit left it. The log says which.
    """
    fitted = getattr(trainer, "_fitted", None)
    if fitted is None:
        raise misconfigured(  # a TypeError (Lightning's) and a ValueError (ours before)
            f"trainer.{stage}() was called without a model, and this Trainer has not run fit: pass the model, "
            f"trainer.{stage}(model, ...), or call trainer.fit(model, ...) first.",
            f"`Trainer.{stage}()` requires a `LightningModule` when it hasn't been passed in a previous run.",
            type_error=True,
        )
    model, fit_datamodule, fit_val = fitted
    if dataloaders is None and datamodule is None:
        if fit_datamodule is not None:
            datamodule = fit_datamodule
        elif stage == "validate" and not defines(model, LOADER_METHOD["validate"]) and fit_val is not None:
            dataloaders = fit_val
    if ckpt_path is None:
        callback = trainer.checkpoint_callback
        best = getattr(callback, "best_model_path", "") if callback is not None else ""
        if best and os.path.exists(best):
            ckpt_path = "best"  # the stage resolves it (trainer/checkpoint/paths.py)
            weights = f"the best checkpoint's weights ({best})"
            rank_zero_warn(  # Lightning's
                f"`.{stage}(ckpt_path=None)` was called without a model. The best model of the previous `fit` call "
                f"will be used. You can pass `.{stage}(ckpt_path='best')` to use the best model or "
                f"`.{stage}(ckpt_path='last')` to use the last model. "
                "If you pass a value, this warning will be silenced.",
            )
        else:
            weights = "the weights fit left in the model (no best checkpoint was saved)"
    else:
        weights = f"the weights of ckpt_path={os.fspath(ckpt_path)!r}"
    if trainer.is_global_zero:
        log.info(
            "trainer.%s() without a model: using the fitted %s with %s. Pass ckpt_path='last' or a file to choose.",
            stage, type(model).__name__, weights,
        )
    return model, dataloaders, datamodule, ckpt_path
