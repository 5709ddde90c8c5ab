"""The batch-size search: run a few steps at growing batch sizes until one runs out of memory,
and keep the largest that fit (never beyond the dataset's length)."""

from __future__ import annotations

import logging
import warnings
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader

from trainer.tuner._search import get_value, holders, is_out_of_memory, leaves_no_trace, quiet_fit, search_trainer, set_value

if TYPE_CHECKING:
    from trainer.trainer import Trainer

log = logging.getLogger("trainer")

MODES = ("power", "binsearch")
METHODS = {"fit": "train_dataloader", "validate": "val_dataloader", "test": "test_dataloader", "predict": "predict_dataloader"}


def check_scale(mode: Any, method: Any, steps_per_trial: Any, init_val: Any, max_trials: Any, batch_arg_name: Any) -> None:
    if mode not in MODES:
        raise ValueError(f"scale_batch_size(mode={mode!r}): use 'power' (double until out of memory) or 'binsearch' (then bisect).")
    if method not in METHODS:
        raise ValueError(f"scale_batch_size(method={method!r}): use one of {', '.join(map(repr, METHODS))}.")
    for name, value in (("steps_per_trial", steps_per_trial), ("init_val", init_val), ("max_trials", max_trials)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"scale_batch_size({name}={value!r}): a positive int.")
    if not isinstance(batch_arg_name, str) or not batch_arg_name:
        raise ValueError(f"scale_batch_size(batch_arg_name={batch_arg_name!r}): the name of the batch-size attribute, e.g. 'batch_size'.")


def scale_batch_size(
    trainer: Trainer, model: Any, train_dataloaders: Any = None, val_dataloaders: Any = None, dataloaders: Any = None,
    datamodule: Any = None, method: str = "fit", mode: str = "power", steps_per_trial: int = 3, init_val: int = 2,
    max_trials: int = 25, batch_arg_name: str = "batch_size",
) -> int | None:
    check_scale(mode, method, steps_per_trial, init_val, max_trials, batch_arg_name)
    if train_dataloaders is not None or dataloaders is not None:
        raise ValueError(
            "scale_batch_size rebuilds the loader at each batch size from the model's or the DataModule's "
            f"{METHODS[method]}(), which reads {batch_arg_name!r}; a loader passed in has its batch size fixed. "
            f"Define {METHODS[method]}() (on the model or a DataModule) and pass the model (or datamodule=)."
        )
    if trainer.fast_dev_run:
        warnings.warn("scale_batch_size is skipped with Trainer(fast_dev_run=...): a debugging run searches nothing.", stacklevel=3)
        return None
    places = holders(model, datamodule, batch_arg_name)
    if not places:
        raise ValueError(
            f"scale_batch_size(batch_arg_name={batch_arg_name!r}) sets the batch size on the model or DataModule, and "
            f"neither {type(model).__name__}{' nor ' + type(datamodule).__name__ if datamodule is not None else ''} has an "
            f"attribute {batch_arg_name!r} (nor in its hparams). Set self.{batch_arg_name} in __init__ and use it in "
            f"{METHODS[method]}(), or pass batch_arg_name='your_name'."
        )
    owner = datamodule if datamodule is not None else model
    if not callable(getattr(owner, METHODS[method], None)):
        raise ValueError(f"scale_batch_size(method={method!r}) needs {type(owner).__name__}.{METHODS[method]}() to build the loader.")
    original = get_value(places, batch_arg_name)

    def trial(size: int) -> tuple[bool, int | None]:
        """Whether ``size`` ran ``steps_per_trial`` steps; and the dataset's length if known."""
        set_value(places, batch_arg_name, size)
        loader = getattr(owner, METHODS[method])()
        if isinstance(loader, DataLoader) and loader.batch_size != size:
            raise ValueError(
                f"scale_batch_size set {batch_arg_name}={size}, but {type(owner).__name__}.{METHODS[method]}() built a "
                f"DataLoader with batch_size={loader.batch_size!r}: the loader ignores the attribute. Pass "
                f"batch_size=self.{batch_arg_name} to the DataLoader."
            )
        length = len(loader.dataset) if isinstance(loader, DataLoader) and hasattr(loader.dataset, "__len__") else None
        search = search_trainer(trainer, [], steps_per_trial, method, limit_train=True)
        try:
            with leaves_no_trace(model), quiet_fit():
                if method == "fit":
                    search.fit(model, None, val_dataloaders, datamodule)
                else:
                    getattr(search, method)(model, datamodule=datamodule)
        except Exception as err:  # noqa: BLE001 - only the out-of-memory error is a result
            if not is_out_of_memory(err):
                raise
            del err
            log.info("scale_batch_size: %s=%d ran out of memory.", batch_arg_name, size)
            return False, length
        log.info("scale_batch_size: %s=%d fits.", batch_arg_name, size)
        return True, length

    with leaves_no_trace(model):
        found = _search(trial, mode, init_val, max_trials)
    final = original if found is None else found
    set_value(places, batch_arg_name, final)
    log.info("scale_batch_size: %s = %d (was %r).", batch_arg_name, final, original)
    return found


def _search(trial: Any, mode: str, size: int, max_trials: int) -> int:
    """The largest size that ran: doubling from ``size`` until a trial fails, the dataset's
    length is reached or ``max_trials`` ran (``power``), then bisecting between the last size
    that ran and the first that failed (``binsearch``). A failing first size is halved."""
    low: int | None = None  # the largest size that ran
    high: int | None = None  # the smallest size that failed
    for _ in range(max_trials):
        ok, length = trial(size)
        if length is not None and size > length:
            size = length  # never beyond the dataset: a larger batch is the whole dataset anyway
        if ok:
            low = size
            if length is not None and size >= length:
                break
            if high is None:
                size = size * 2 if length is None else min(size * 2, length)
            elif mode == "power" or high - low <= 1:
                break
            else:
                size = (low + high) // 2
        else:
            high = size
            if low is None:
                if size == 1:
                    raise MemoryError("scale_batch_size: even batch size 1 runs out of memory. Make the model or the inputs smaller.")
                size //= 2
            elif mode == "power" or high - low <= 1:
                break
            else:
                size = (low + high) // 2
    if low is None:
        raise MemoryError(f"scale_batch_size found no batch size that fits in {max_trials} trial(s); the last tried was {high}.")
    return low
