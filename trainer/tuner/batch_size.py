"""The batch-size search, Lightning's: run a few steps at growing batch sizes until one runs out of
memory, the dataset's length or ``max_val`` is reached, or ``max_trials`` trials ran, and keep
the largest that fit (``binsearch`` then bisects, and takes a ``margin`` off the result)."""

from __future__ import annotations

import logging
import warnings
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader

from trainer.core.exceptions import MisconfigurationException
from trainer.data.loaders import defines
from trainer.loops.run import record_data
from trainer.tuner._search import (
    get_value, holders, is_out_of_memory, leaves_no_trace, quiet_fit, search_trainer, set_value,
)

if TYPE_CHECKING:
    from trainer.trainer import Trainer

log = logging.getLogger("trainer")

MODES = ("power", "binsearch")
METHODS = {
    "fit": "train_dataloader", "validate": "val_dataloader", "test": "test_dataloader", "predict": "predict_dataloader",
}
# Where the loaders of each method are on the Trainer after the search (Lightning leaves them there).
LOADERS = {"validate": "val_dataloaders", "test": "test_dataloaders", "predict": "predict_dataloaders"}


def check_scale(
    mode: Any, method: Any, steps_per_trial: Any, init_val: Any, max_trials: Any, batch_arg_name: Any, margin: Any,
    max_val: Any,
) -> None:
    if mode not in MODES:
        raise ValueError(f"`mode` should be either of {MODES}; scale_batch_size(mode={mode!r}): "
                         "'power' doubles until out of memory, 'binsearch' then bisects.")
    if method not in METHODS:
        raise ValueError(f"method {method!r} is invalid. Should be one of {tuple(METHODS)}.")
    bounds = (("steps_per_trial", steps_per_trial, 1), ("init_val", init_val, 1), ("max_trials", max_trials, 0),
              ("max_val", max_val, 1))
    for name, value, low in bounds:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"scale_batch_size({name}={value!r}): an int >= {low}.")
    if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0.0 <= margin < 1.0:
        raise ValueError(
            f"`margin` should be between 0 and 1. Found margin={margin!r}: the share taken off binsearch's result."
        )
    if not isinstance(batch_arg_name, str) or not batch_arg_name:
        raise ValueError(f"scale_batch_size(batch_arg_name={batch_arg_name!r}): "
                         "the name of the batch-size attribute, e.g. 'batch_size'.")


def check_sources(method: str, train_dataloaders: Any, val_dataloaders: Any, dataloaders: Any) -> None:
    """Lightning's rules: the loaders must come from the model or DataModule, which read the attribute."""
    if method == "fit" and dataloaders is not None:
        raise MisconfigurationException(
            f"In tuner with method {method!r}, `dataloaders` argument should be None, please consider setting "
            "`train_dataloaders` and `val_dataloaders` instead."
        )
    if method != "fit" and (train_dataloaders is not None or val_dataloaders is not None):
        raise MisconfigurationException(
            f"In tuner with `method`={method!r}, `train_dataloaders` and `val_dataloaders` arguments should be None, "
            "please consider setting `dataloaders` instead."
        )
    if train_dataloaders is not None or dataloaders is not None:
        raise MisconfigurationException(
            f"The Batch size finder cannot be used with dataloaders passed directly to `.{method}()`. "
            "Please disable the feature or incorporate the dataloader into your LightningModule or "
            f"LightningDataModule: the search rebuilds the loader from {METHODS[method]}() at each batch size."
        )


def scale_batch_size(
    trainer: Trainer, model: Any, train_dataloaders: Any = None, val_dataloaders: Any = None, dataloaders: Any = None,
    datamodule: Any = None, method: str = "fit", mode: str = "power", steps_per_trial: int = 3, init_val: int = 2,
    max_trials: int = 25, batch_arg_name: str = "batch_size", margin: float = 0.05, max_val: int = 8192,
) -> int | None:
    check_scale(mode, method, steps_per_trial, init_val, max_trials, batch_arg_name, margin, max_val)
    check_sources(method, train_dataloaders, val_dataloaders, dataloaders)
    if trainer.world_size > 1 or (getattr(trainer.strategy, "num_processes", None) or 1) > 1:
        raise MisconfigurationException("The Batch size finder is not supported with distributed strategies.")
    if trainer.fast_dev_run:
        warnings.warn("Skipping batch size scaler since `fast_dev_run` is enabled.", UserWarning, stacklevel=3)
        return None
    owner = datamodule if datamodule is not None else model
    if method != "fit" and callable(getattr(owner, METHODS[method], None)):
        check_one_loader(owner, method)  # first, as Lightning's
    places = holders(model, datamodule, batch_arg_name)
    if not places:
        raise MisconfigurationException(
            f"Field {batch_arg_name} not found in `model`, `datamodule`, nor their `hparams` attributes. Set "
            f"self.{batch_arg_name} in __init__ and use it in {METHODS[method]}(), or pass batch_arg_name='your_name'."
        )
    hparams = getattr(model, "hparams", None)
    if batch_arg_name in vars(model) and isinstance(hparams, dict) and batch_arg_name in hparams:
        warnings.warn(
            f"Field `model.{batch_arg_name}` and `model.hparams.{batch_arg_name}` are mutually exclusive! "
            f"`model.{batch_arg_name}` will be used as the initial batch size for scaling. If this is not the intended "
            "behavior, please remove either one.", UserWarning, stacklevel=3,
        )
    if not callable(getattr(owner, METHODS[method], None)):
        raise MisconfigurationException(
            f"scale_batch_size(method={method!r}) needs {type(owner).__name__}.{METHODS[method]}() to build the loader."
        )
    search = Search(trainer, model, datamodule, method, places, batch_arg_name, steps_per_trial, val_dataloaders)
    with leaves_no_trace(model, attach=trainer):
        size, _ = search.adjust(value=init_val)
        if mode == "power":
            size = _power(search, size, max_trials, max_val)
        else:
            size = _binsearch(search, size, max_trials, margin, max_val)
    log.info("Finished batch size finder, will continue with full run using batch size %d", size)
    search.hand_over(size)
    return size


def check_one_loader(owner: Any, method: str) -> None:
    """Lightning's: one evaluation loader only (its batch size is what the search sets). A loader
    method that needs ``setup`` first is checked by the trial instead."""
    try:
        loaders = getattr(owner, METHODS[method])()
    except Exception:  # noqa: BLE001 - e.g. a DataModule whose datasets setup() makes
        return
    if isinstance(loaders, (list, tuple, dict)) and len(loaders) > 1:
        prefix = "val" if method == "validate" else method
        raise MisconfigurationException(
            f"The Batch size finder cannot be used with multiple {prefix} dataloaders: {type(owner).__name__}."
            f"{METHODS[method]}() returned {len(loaders)}, and the search sets one batch size."
        )


class Search:
    """One search's trials and its attribute: each trial runs ``steps_per_trial`` steps of the
    method on a throwaway copy of the Trainer, with the loader the model or DataModule builds."""

    def __init__(
        self, trainer: Trainer, model: Any, datamodule: Any, method: str, places: list[tuple[Any, str]], name: str,
        steps: int, val_dataloaders: Any,
    ) -> None:
        self.trainer, self.model, self.datamodule, self.method = trainer, model, datamodule, method
        self.places, self.name, self.steps, self.val_dataloaders = places, name, steps, val_dataloaders
        self.length: int | None = None  # the dataset's length, once a trial built the loader
        self.loaders: tuple[Any, Any] = (None, None)  # the last trial's (main loader(s), fit's validation loaders)

    @property
    def value(self) -> int:
        return get_value(self.places, self.name)

    def adjust(
        self, factor: float = 1.0, value: int | None = None, desc: str | None = None, max_val: int = 8192
    ) -> tuple[int, bool]:
        """Lightning's ``_adjust_batch_size``: the next size (``value``, or the current one times
        ``factor``, at most ``max_val``), set on the attribute; unchanged once the current size
        covers the dataset."""
        current = self.value
        if self.length is not None and current >= self.length:
            log.info("The batch size %d is greater or equal than the length of your dataset: %d.", current, self.length)
            return current, False
        new = value if value is not None else int(current * factor)
        if new > max_val:
            if desc:
                log.info("Batch size %d exceeds max_val limit %d, capping at %d", new, max_val, max_val)
            new = max_val
        if desc:
            log.info("Batch size %d %s, trying batch size %d", current, desc, new)
        set_value(self.places, self.name, new)
        return new, new != current

    def trial(self) -> bool:
        """Whether the current size ran; False only for running out of memory."""
        trainer, method, size = self.trainer, self.method, self.value
        run = search_trainer(trainer, [], self.steps, method, limit_train=True)
        try:
            with leaves_no_trace(self.model), quiet_fit():
                if method == "fit":
                    run.fit(self.model, None, self.val_dataloaders, self.datamodule)
                elif method == "predict":
                    run.predict(self.model, datamodule=self.datamodule, return_predictions=False)
                else:
                    getattr(run, method)(self.model, datamodule=self.datamodule, verbose=False)
        except Exception as err:  # noqa: BLE001 - only the out-of-memory error is a result
            if not is_out_of_memory(err):
                raise
            del err
            log.info("scale_batch_size: %s=%d ran out of memory.", self.name, size)
            return False
        loader = run.train_dataloader if method == "fit" else getattr(run, LOADERS[method])
        self.loaders = (loader, run.val_dataloaders if method == "fit" else None)
        if isinstance(loader, DataLoader):
            dataset = loader.dataset
            self.length = len(dataset) if hasattr(dataset, "__len__") else None  # type: ignore[arg-type]
            if loader.batch_size not in (None, size):
                log.info("scale_batch_size: %s=%d, but the loader's batch_size is %r: it does not read the attribute.",
                         self.name, size, loader.batch_size)
        return True

    def hand_over(self, size: int) -> None:
        """After the search, as Lightning leaves it: the size on the attribute, and the Trainer's
        loaders and DataModule those the method would now run with."""
        set_value(self.places, self.name, size)
        owner = self.datamodule if self.datamodule is not None else self.model
        if self.loaders[0] is None:
            record_data(self.trainer, self.datamodule)
            return
        loader = getattr(owner, METHODS[self.method])()
        if self.method == "fit":
            own_val = self.val_dataloaders is None and defines(owner, "val_dataloader")
            val = owner.val_dataloader() if own_val else self.val_dataloaders
            record_data(self.trainer, self.datamodule, train_dataloader=loader, val_dataloaders=val)
        else:
            record_data(self.trainer, self.datamodule, **{LOADERS[self.method]: loader})


def _power(search: Search, size: int, max_trials: int, max_val: int) -> int:
    """Double after each trial that ran; on running out of memory, halve and stop (once one ran)."""
    any_success = False
    for i in range(max_trials):
        if size >= max_val:
            log.info("Reached the maximum batch size limit of %d. Stopping search.", max_val)
            break
        if search.trial():
            if i + 1 >= max_trials:  # the last trial: keep the size that ran, untested doubles are not results
                break
            size, changed = search.adjust(factor=2.0, desc="succeeded")
            if not changed:
                break
            any_success = True
        else:
            size, _ = search.adjust(factor=0.5, desc="failed")
            if any_success:
                break
    return size


def _binsearch(search: Search, size: int, max_trials: int, margin: float, max_val: int) -> int:
    """Double until a trial runs out of memory, then bisect between the last size that ran and the
    first that failed; ``margin`` is then taken off the size found."""
    low, high, count = 1, None, 0
    while True:
        if size >= max_val:
            log.info("Reached the maximum batch size limit of %d. Stopping search.", max_val)
            break
        if search.trial():
            count += 1
            if count >= max_trials:
                break
            low = size
            if high:
                if high - low <= 1:
                    break
                size, changed = search.adjust(value=(high + low) // 2, desc="succeeded", max_val=max_val)
            else:
                size, changed = search.adjust(factor=2.0, desc="succeeded", max_val=max_val)
            if not changed:
                break
        else:
            high = size
            size, _ = search.adjust(value=(high + low) // 2, desc="failed")
            if high - low <= 1:
                break
    if margin > 0:
        reduced = max(1, int(size * (1 - margin)))
        if reduced != size:
            log.info("Applying margin of %s, reducing batch size from %d to %d", f"{margin:.1%}", size, reduced)
            size = reduced
    return size

