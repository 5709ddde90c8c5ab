"""The learning-rate range test (Smith, 2015): train for a few steps while the learning rate
grows from ``min_lr`` to ``max_lr``, record the loss, and suggest the rate where it falls fastest."""

from __future__ import annotations

import logging
import math
import warnings
from typing import TYPE_CHECKING, Any

import torch

from callbacks.base import Callback
from trainer.core.exceptions import MisconfigurationException

from trainer.tuner._search import get_value, holders, leaves_no_trace, quiet_fit, search_trainer, set_value

if TYPE_CHECKING:
    from trainer.trainer import Trainer

log = logging.getLogger("trainer")

MODES = ("exponential", "linear")


class LRFinder:
    """The result of ``Tuner.lr_find``: ``results`` = ``{"lr": [...], "loss": [...]}``, one entry
    per optimizer step, the loss smoothed (exponential moving average, bias-corrected)."""

    def __init__(self, mode: str, min_lr: float, max_lr: float, num_training: int) -> None:
        self.mode, self.lr_min, self.lr_max, self.num_training = mode, min_lr, max_lr, num_training
        self.results: dict[str, list[float]] = {"lr": [], "loss": []}
        self._optimal_idx: int | None = None

    def __repr__(self) -> str:
        return f"LRFinder(mode={self.mode!r}, steps={len(self.results['lr'])}, suggestion={self.suggestion_or_none()})"

    def suggestion_or_none(self) -> float | None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return self.suggestion()

    def suggestion(self, skip_begin: int = 10, skip_end: int = 1) -> float | None:
        """The learning rate where the smoothed loss falls fastest, ignoring the first
        ``skip_begin`` and the last ``skip_end`` steps and any non-finite loss; None (with a
        warning) when fewer than two points are left."""
        lrs, losses = self.results["lr"], self.results["loss"]
        end = len(losses) - skip_end if skip_end > 0 else len(losses)
        points = [(i, lrs[i], losses[i]) for i in range(skip_begin, end) if math.isfinite(losses[i])]
        if len(points) < 2:
            warnings.warn(
                f"lr_find recorded {len(losses)} step(s); after skip_begin={skip_begin} and skip_end={skip_end} "
                f"{len(points)} finite point(s) are left, too few for a suggestion. Raise num_training (or use a "
                "larger dataset), or pass smaller skip_begin/skip_end to suggestion().",
                stacklevel=2,
            )
            self._optimal_idx = None
            return None
        slope = torch.gradient(torch.tensor([p[2] for p in points], dtype=torch.float64))[0]
        best = int(torch.argmin(slope))
        self._optimal_idx = points[best][0]
        return points[best][1]

    def plot(self, suggest: bool = False, show: bool = False, ax: Any = None) -> Any:
        """The loss against the learning rate (log scale for ``mode="exponential"``), with the
        suggestion marked when ``suggest``; a matplotlib figure."""
        try:
            import matplotlib.pyplot as plt
        except ImportError:
            raise ModuleNotFoundError(
                "LRFinder.plot() draws with matplotlib, which is not installed: pip install matplotlib "
                "(the numbers are in lr_finder.results)."
            ) from None
        fig, ax = plt.subplots() if ax is None else (ax.figure, ax)
        ax.plot(self.results["lr"], self.results["loss"])
        if self.mode == "exponential":
            ax.set_xscale("log")
        ax.set_xlabel("Learning rate")
        ax.set_ylabel("Loss")
        if suggest and self.suggestion_or_none() is not None and self._optimal_idx is not None:
            i = self._optimal_idx
            ax.plot(self.results["lr"][i], self.results["loss"][i], markersize=10, marker="o", color="red")
        if show:
            plt.show()
        return fig


class _RangeTest(Callback):
    """Inside the search's fit: sets each step's learning rate and records its loss."""

    def __init__(self, finder: LRFinder, early_stop_threshold: float | None, beta: float = 0.98) -> None:
        self.finder, self.threshold, self.beta = finder, early_stop_threshold, beta
        self._avg, self._best, self._batch_losses, self._lr = 0.0, math.inf, [], finder.lr_min
        self._step = 0

    def lr_at(self, step: int) -> float:
        f = self.finder
        r = step / max(1, f.num_training - 1)
        if f.mode == "linear":
            return f.lr_min + r * (f.lr_max - f.lr_min)
        return f.lr_min * (f.lr_max / f.lr_min) ** r

    def on_train_start(self, trainer: Any, module: Any) -> None:
        count = len(trainer.optimizers)
        if count != 1:  # (several, under manual optimization: the search would step none of them, and never end)
            raise MisconfigurationException(
                f"`model.configure_optimizers()` returned {count}, but learning rate finder only works with single "
                "optimizer. Search with one optimizer, or set each one's learning rate yourself."
            )
        trainer.lr_scheduler_configs.clear()  # the search sets each step's lr (Lightning's); the schedulers wait

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        self._lr = self.lr_at(trainer.global_step)
        for group in trainer.optimizer.param_groups:
            group["lr"] = self._lr

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):
            self._batch_losses.append(float(loss.detach()))
        if trainer.global_step == self._step:  # inside an accumulation group: no step yet
            return
        self._step = trainer.global_step
        if not self._batch_losses:  # training_step returned None: Lightning's NaN, which suggestion() skips
            self.finder.results["lr"].append(self._lr)
            self.finder.results["loss"].append(float("nan"))
            return
        raw = sum(self._batch_losses) / len(self._batch_losses)
        self._batch_losses = []
        self._avg = self.beta * self._avg + (1 - self.beta) * raw
        smoothed = self._avg / (1 - self.beta ** self._step)
        self.finder.results["lr"].append(self._lr)
        self.finder.results["loss"].append(smoothed)
        diverged = self.threshold is not None and self._step > 1 and smoothed > self.threshold * self._best
        if not math.isfinite(smoothed) or diverged:
            trainer.should_stop = True
        self._best = min(self._best, smoothed)

    def state_dict(self) -> dict[str, Any]:  # a spawned search sends rank 0's results back this way
        return {"results": self.finder.results}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.finder.results = state_dict["results"]


def check_lr_find(min_lr: Any, max_lr: Any, num_training: Any, mode: Any, early_stop_threshold: Any) -> None:
    for name, value in (("min_lr", min_lr), ("max_lr", max_lr)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"lr_find({name}={value!r}): a positive number.")
    if isinstance(num_training, bool) or not isinstance(num_training, int) or num_training < 1:
        raise ValueError(f"lr_find(num_training={num_training!r}): the number of steps, an int >= 1.")
    if mode not in MODES:
        raise ValueError(f"lr_find(mode={mode!r}): use 'exponential' (evenly spread on a log scale) or 'linear'.")
    threshold = early_stop_threshold
    positive = not isinstance(threshold, bool) and isinstance(threshold, (int, float)) and threshold > 0
    if threshold is not None and not positive:
        raise ValueError(
            f"lr_find(early_stop_threshold={threshold!r}): a positive number, or None to never stop early."
        )


def lr_attribute(model: Any, datamodule: Any, attr_name: str) -> tuple[str, list[tuple[Any, str]]]:
    names = [attr_name] if attr_name else ["lr", "learning_rate"]
    for name in names:
        places = holders(model, datamodule, name)
        if places:
            return name, places
    wanted = repr(attr_name) if attr_name else "'lr' or 'learning_rate'"
    lightning = (  # Lightning's sentence first, as its tests match it
        f"The attribute name for the learning rate was set to {attr_name}, but could not find this as a field in "
        "`model` or `model.hparams`." if attr_name else "When using the learning rate finder, either `model` or "
        "`model.hparams` should have one of these fields: ('lr', 'learning_rate'). If your model has a different "
        "name for the learning rate, set it with `.lr_find(attr_name=...)`."
    )
    also = " or the DataModule" if datamodule is not None else ""
    raise AttributeError(
        f"{lightning} lr_find(update_attr=True) sets the learning rate it finds on the model, "
        f"but {type(model).__name__} has no attribute {wanted} (nor in its hparams{also}). Set "
        "self.lr in __init__ and read it in configure_optimizers, pass attr_name='your_name', or update_attr=False."
    )


def lr_find(
    trainer: Trainer, model: Any, train_dataloaders: Any = None, val_dataloaders: Any = None, datamodule: Any = None,
    min_lr: float = 1e-8, max_lr: float = 1.0, num_training: int = 100, mode: str = "exponential",
    early_stop_threshold: float | None = 4.0, update_attr: bool = True, attr_name: str = "",
) -> LRFinder | None:
    check_lr_find(min_lr, max_lr, num_training, mode, early_stop_threshold)
    if trainer.fast_dev_run:
        warnings.warn("Skipping learning rate finder since `fast_dev_run` is enabled. "
                      "(A debugging run searches nothing.)", UserWarning, stacklevel=3)
        return None
    name, places = lr_attribute(model, datamodule, attr_name) if update_attr else ("", [])
    finder = LRFinder(mode, float(min_lr), float(max_lr), num_training)
    probe = _RangeTest(finder, early_stop_threshold)
    search = search_trainer(trainer, [probe], num_training)
    with leaves_no_trace(model, train_dataloaders, val_dataloaders, attach=trainer), quiet_fit():
        search.fit(model, train_dataloaders, val_dataloaders, datamodule)
    steps = len(finder.results["lr"])
    if steps < num_training:
        log.info("lr_find stopped after %d of %d steps: the loss diverged (above %s x its best).",
                 steps, num_training, early_stop_threshold)
    lr = finder.suggestion_or_none()
    if update_attr and lr is not None:
        before = get_value(places, name)
        set_value(places, name, lr)
        log.info("lr_find: %s = %.3g (was %r).", name, lr, before)
    elif update_attr:
        log.info("lr_find found no suggestion (%d steps recorded); %s is unchanged.", steps, name)
    return finder
