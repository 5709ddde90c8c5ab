"""Capturing the full training state, and putting it back so that a resumed run is bit-exact.

An epoch's data order is fixed when ``iter(loader)`` runs: the DataLoader draws a base seed
from the global torch RNG (or the loader's generator) and RandomSampler draws its seed at
the first ``next``. So a checkpoint keeps, per rank, the RNG as it was just before that
``iter`` (to re-create the order) and the RNG at the save (to continue dropout and the like
exactly). A mid-epoch resume re-creates the order, skips the consumed batches at the
sampler level (their data is never loaded), then restores the save-time RNG.
"""

from __future__ import annotations

import glob
import logging
import os
import warnings
from typing import TYPE_CHECKING, Any, Iterator

import torch

from . import checkpoint as ckpt_io
from .checkpoint import CheckpointError
from .data import SkipBatches, rebuild_loader

if TYPE_CHECKING:
    from .trainer import Trainer

log = logging.getLogger("trainer")
FORMAT = "steadytrainer/1"


class Resume:
    """The loaded checkpoint's loop position and RNG, applied at the first epoch it affects."""

    def __init__(self, ckpt: dict[str, Any] | None = None, rank: int = 0) -> None:
        self.pending = ckpt is not None
        if ckpt is None:
            return
        loop = ckpt["loop"]
        self.epoch, self.batch = loop["epoch"], loop["batch_in_epoch"]
        same_world = len(ckpt.get("rng", [])) == loop.get("world_size", -1) and rank < len(ckpt["rng"])
        # Across a change of world size the RNG streams cannot line up; weights and steps still carry over.
        self.rng = ckpt["rng"][rank] if same_world else None
        self.epoch_start = ckpt["epoch_start"][rank] if same_world else None

    # --- loading -----------------------------------------------------------------------
    @classmethod
    def load(cls, trainer: Trainer, path: str | None) -> "Resume":
        """Restore everything from ``path`` (already resolved by :func:`resolve_path`)."""
        if path is None:
            return cls()
        ckpt = _load_good(path)
        restore(trainer, ckpt)
        log.info("Resumed from %s at epoch %d, step %d.", path, trainer.current_epoch, trainer.global_step)
        return cls(ckpt, trainer.strategy.global_rank)

    def batches(self, trainer: Trainer, loader: Any) -> Iterator[Any]:
        """The iterator for the current epoch; the only place that calls ``iter(loader)``."""
        epoch = trainer.state.current_epoch
        for owner in (getattr(loader, "sampler", None), getattr(loader, "batch_sampler", None)):
            if hasattr(owner, "set_epoch"):
                owner.set_epoch(epoch)
        if not self.pending:
            trainer._epoch_start = ckpt_io.epoch_start_state(loader)
            return iter(loader)
        self.pending = False
        if self.rng is None:  # another world size: no exact RNG to put back
            trainer._epoch_start = ckpt_io.epoch_start_state(loader)
            return _skip_by_iterating(iter(loader), self.batch)
        if self.batch == 0:
            ckpt_io.set_rng_state(self.rng)
            trainer._epoch_start = ckpt_io.epoch_start_state(loader)
            return iter(loader)
        ckpt_io.set_epoch_start_state(loader, self.epoch_start)
        trainer._epoch_start = self.epoch_start
        rng = self.rng
        if getattr(loader, "batch_sampler", None) is None:
            warnings.warn("The loader has no batch sampler; skipping consumed batches by loading them.", stacklevel=2)
            return _skip_by_iterating(iter(loader), self.batch, after=lambda: ckpt_io.set_rng_state(rng))
        skipping = SkipBatches(loader.batch_sampler, self.batch, after_skip=lambda: ckpt_io.set_rng_state(rng))
        return iter(rebuild_loader(loader, batch_sampler=skipping))


def _skip_by_iterating(it: Iterator[Any], n: int, after: Any = None) -> Iterator[Any]:
    for _ in range(n):
        next(it, None)
    if after is not None:
        after()
    return it


def restore(trainer: Trainer, ckpt: dict[str, Any]) -> None:
    """Put a checkpoint's model, optimizer, scheduler, scaler, callbacks and counters back."""
    module = trainer.strategy.module
    missing, unexpected = _key_mismatch(module, ckpt["model"])
    if missing or unexpected:
        raise CheckpointError(
            f"The checkpoint does not fit {type(module).__name__}: missing keys {missing or 'none'}, "
            f"unexpected keys {unexpected or 'none'}. Was it saved from another model?"
        )
    module.load_state_dict(ckpt["model"])
    opt = trainer._opt
    if ckpt.get("optimizer") is not None:
        opt.optimizer.load_state_dict(ckpt["optimizer"])
    if opt.scheduler is not None and ckpt.get("lr_scheduler") is not None:
        opt.scheduler.load_state_dict(ckpt["lr_scheduler"])
    trainer._precision.load_state_dict(ckpt.get("precision", {}))
    states = ckpt.get("callbacks", {})
    for cb in trainer.callbacks:
        if cb.state_key in states:
            cb.load_state_dict(states[cb.state_key])
    loop = ckpt["loop"]
    trainer.state.global_step = loop["global_step"]
    trainer.state.current_epoch = loop["epoch"]
    trainer.state.batch_in_epoch = loop["batch_in_epoch"]
    trainer.callback_metrics.update(ckpt.get("metrics", {}))


def _key_mismatch(module: torch.nn.Module, state: dict[str, Any]) -> tuple[list[str], list[str]]:
    own = set(module.state_dict())
    return sorted(own - set(state)), sorted(set(state) - own)


def capture(trainer: Trainer) -> dict[str, Any]:
    """The full state. Every rank must call it (RNG states are gathered to all ranks)."""
    from . import __version__

    strategy, state, opt = trainer.strategy, trainer.state, trainer._opt
    if trainer._epoch_complete:
        epoch, batch = state.current_epoch + 1, 0
    else:
        epoch, batch = state.current_epoch, state.batch_in_epoch
    rng = strategy.gather_objects(ckpt_io.rng_state())
    epoch_start = strategy.gather_objects(trainer._epoch_start)
    module = trainer.module
    return {
        "format": FORMAT,
        "version": __version__,
        "model": strategy.module_state_dict(),
        "optimizer": None if opt is None else opt.optimizer.state_dict(),
        "lr_scheduler": None if opt is None or opt.scheduler is None else opt.scheduler.state_dict(),
        "precision": trainer._precision.state_dict(),
        "loop": {
            "epoch": epoch, "batch_in_epoch": batch, "global_step": state.global_step,
            "world_size": strategy.world_size,
        },
        "callbacks": {cb.state_key: cb.state_dict() for cb in trainer.callbacks},
        "metrics": dict(trainer.callback_metrics),
        "rng": rng,
        "epoch_start": epoch_start,
        "strategy": strategy.name,
        "hparams": ckpt_io.plain(getattr(module, "hparams", {})),
        "trainer": ckpt_io.plain(trainer.hparams()),
    }


def resolve_path(trainer: Trainer, ckpt_path: Any) -> str | None:
    """``"last"`` -> the newest good checkpoint (rank 0 looks, every rank gets its answer)."""
    if ckpt_path is None:
        return None
    path = os.fspath(ckpt_path)
    if path != "last":
        return path
    strategy = trainer.strategy
    path = strategy.broadcast_object(_find_last(trainer) if strategy.is_global_zero else None)
    if path is None and strategy.is_global_zero:
        log.info("ckpt_path='last': no checkpoint found in %s; starting from scratch.", _search_dirs(trainer))
    return path


def _search_dirs(trainer: Trainer) -> list[str]:
    cb = trainer.checkpoint_callback
    if cb is not None and cb.dirpath_given is not None:
        return [cb.dirpath_given]
    if trainer.log_dir is None:
        return [os.path.join(os.getcwd(), "checkpoints")]
    return sorted(glob.glob(os.path.join(trainer.log_dir, trainer.name, "version_*", "checkpoints")))


def _find_last(trainer: Trainer) -> str | None:
    """The newest readable checkpoint; a corrupt newer one is skipped with a warning."""
    files = [f for d in _search_dirs(trainer) for f in glob.glob(os.path.join(d, "*.ckpt"))]
    files.sort(key=lambda f: (os.path.getmtime(f), os.path.basename(f) == "last.ckpt"), reverse=True)
    for f in files:
        try:
            ckpt_io.load(f)
        except CheckpointError as err:
            warnings.warn(f"Skipping checkpoint {f}: {err}", stacklevel=3)
            continue
        return f
    return None


def _load_good(path: str) -> dict[str, Any]:
    ckpt = ckpt_io.load(path)
    if "loop" not in ckpt:
        raise CheckpointError(
            f"{path!r} holds model weights but no training state, so fit cannot resume from it. "
            "Load the weights with model.load_state_dict(torch.load(path, weights_only=True)['model'])."
        )
    return ckpt
