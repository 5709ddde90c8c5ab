"""Capturing the full training state, and putting it back so that a resumed run is bit-exact.

An epoch's data order is fixed when ``iter(loader)`` runs: the DataLoader draws a base seed
from the global torch RNG (or the loader's generator) and RandomSampler draws its seed at
the first ``next``. So a checkpoint keeps, per rank, the RNG as it was just before that
``iter`` (to re-create the order) and the RNG at the save (to continue dropout and the like
exactly). A mid-epoch resume re-creates the order, skips the consumed batches at the
sampler level (their data is never loaded), then restores the save-time RNG, and puts back
the values logged so far in the epoch (its means feed schedulers and checkpoint monitors).
"""

from __future__ import annotations

import glob
import logging
import os
import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch

from trainer._version import __version__
from trainer.checkpoint import files as ckpt_io
from trainer.checkpoint.files import CheckpointError
from trainer.data.batches import SkipBatches, rebuild_loader
from trainer.data.fetch import Fetching, batches
from trainer.core.hparams import checkpoint_hparams
from trainer.core.module import TrainModule
from trainer.checkpoint.state_dicts import plain_state_dict

if TYPE_CHECKING:
    from trainer.trainer import Trainer

log = logging.getLogger("trainer")
FORMAT = "steadytrainer/1"
LAST = "last.ckpt"


class Resume:
    """The loaded checkpoint's loop position and RNG, applied at the first epoch it affects."""

    def __init__(self, ckpt: dict[str, Any] | None = None, rank: int = 0, world_size: int = 1) -> None:
        self.pending = ckpt is not None
        self.rank = rank
        if ckpt is None:
            return
        loop = ckpt["loop"]
        saved_world = loop.get("world_size", 1)
        self.epoch, self.batch = loop["epoch"], _batch_position(loop, world_size)
        same_world = saved_world == world_size and len(ckpt.get("rng", [])) == world_size
        # Across a change of world size the RNG streams cannot line up; weights and steps still carry over.
        self.rng = ckpt["rng"][rank] if same_world else None
        self.train_metrics = ckpt.get("train_metrics", [None] * world_size)[rank] if same_world else None
        starts = ckpt.get("epoch_start") or [None]
        self.epoch_start = starts[rank] if same_world else None
        # The DistributedSampler's seed is the same on every rank, so any rank's record will do.
        self.sampler_state = ((starts[rank] if same_world else starts[0]) or {}).get("sampler")

    # --- loading -----------------------------------------------------------------------
    @classmethod
    def load(cls, trainer: Trainer, path: str | None) -> "Resume":
        """Restore everything from ``path`` (already resolved by :func:`resolve_path`)."""
        trainer._epoch_start = trainer._epoch_loader = None  # nothing from an earlier fit leaks in
        if path is None:
            return cls()
        ckpt = _load_good(path)
        strategy = trainer.strategy
        restore(trainer, ckpt)
        if strategy.is_global_zero:
            log.info("Resumed from %s at epoch %d, step %d.", path, trainer.current_epoch, trainer.global_step)
            if ckpt["loop"].get("world_size", 1) != strategy.world_size:
                log.info(
                    "The checkpoint was written with world size %d, this run has %d: weights, optimizer and "
                    "step carry over, but the data order and random numbers will differ from an "
                    "uninterrupted run.", ckpt["loop"].get("world_size", 1), strategy.world_size,
                )
        return cls(ckpt, strategy.global_rank, strategy.world_size)

    def batches(self, trainer: Trainer, loader: Any) -> Iterator[Any]:
        """The iterator for the current epoch; the only place that calls ``iter(loader)``."""
        epoch = trainer.state.current_epoch
        if self.pending:
            self._restore_sampler_seed(loader)
        batch_sampler = getattr(loader, "batch_sampler", None)
        # A DistributedSampler inside a user's own batch sampler (DDP leaves those alone) shuffles per epoch too.
        for owner in (getattr(loader, "sampler", None), batch_sampler, getattr(batch_sampler, "sampler", None)):
            if hasattr(owner, "set_epoch"):
                owner.set_epoch(epoch)
        trainer._epoch_loader = loader  # checkpoints record its generators
        if not self.pending:
            trainer._epoch_start = ckpt_io.epoch_start_state(loader)
            return batches(loader, trainer._fetching)
        self.pending = False
        if self.rng is None:  # another world size: no exact RNG to put back
            trainer._epoch_start = ckpt_io.epoch_start_state(loader)
            return _skip(loader, self.batch, fetch=trainer._fetching)
        rng = self.rng

        def put_back_rng() -> None:
            ckpt_io.set_rng_state(rng)
            ckpt_io.set_generator_states(loader, rng.get("loader", []))

        if self.batch == 0:
            put_back_rng()
            trainer._epoch_start = ckpt_io.epoch_start_state(loader)
            return batches(loader, trainer._fetching)
        if self.train_metrics is not None and trainer._train_sink is not None:
            trainer._train_sink.load_state_dict(self.train_metrics, trainer.strategy.root_device)
        # Re-create the interrupted epoch's order, skip what it consumed, then continue its RNG.
        ckpt_io.set_epoch_start_state(loader, self.epoch_start)
        trainer._epoch_start = self.epoch_start
        return _skip(loader, self.batch, after=put_back_rng, fetch=trainer._fetching)

    def _restore_sampler_seed(self, loader: Any) -> None:
        """A DistributedSampler shuffles by seed + epoch: use the checkpoint's seed, whatever this run set."""
        sampler = ckpt_io.seeded_sampler(loader)
        if sampler is None or not self.sampler_state:
            return
        seed = self.sampler_state["seed"]
        if sampler.seed != seed and self.rank == 0:
            log.warning(
                "The DistributedSampler's seed is %d in this run but %d in the checkpoint; using %d so "
                "that the resumed run sees the same data order.", sampler.seed, seed, seed,
            )
        sampler.seed = seed


def _batch_position(loop: dict[str, Any], world_size: int) -> int:
    """Batches consumed in the epoch, in this run's batches (each rank's share scales with 1/world)."""
    saved_world = loop.get("world_size", 1)
    return loop["batch_in_epoch"] * saved_world // world_size


def _skip(loader: Any, n: int, after: Callable[[], None] | None = None, fetch: bool | Fetching = True) -> Iterator[Any]:
    """``iter(loader)`` without its first ``n`` batches, skipped at the batch sampler so that
    their data is never loaded. ``after`` runs once the sampler has drawn its order."""
    if n == 0:
        it = batches(loader, fetch)
        if after is not None:
            after()
        return it
    stream = isinstance(getattr(loader, "dataset", None), torch.utils.data.IterableDataset)
    if getattr(loader, "batch_sampler", None) is not None and not stream:
        try:
            return batches(rebuild_loader(loader, batch_sampler=SkipBatches(loader.batch_sampler, n, after_skip=after)), fetch)
        except TypeError:  # a DataLoader subclass we cannot re-create
            pass
    if stream:  # its order is the dataset's own: the same batches come again, and are dropped
        log.info("Resuming mid-epoch: drawing the %d consumed batches of the IterableDataset again, and dropping them.", n)
    else:
        warnings.warn(
            f"Resuming mid-epoch: cannot skip the {n} consumed batches at the sampler of this "
            f"{type(loader).__name__}, so they are loaded and dropped. Use a plain torch DataLoader to avoid that.",
            stacklevel=3,
        )
    it = iter(loader)
    for _ in range(n):
        next(it, None)
    if after is not None:
        after()
    return it


def restore(trainer: Trainer, ckpt: dict[str, Any]) -> None:
    """Put a checkpoint's model, optimizer, scheduler, scaler, callbacks and counters back."""
    opt, strategy = trainer._opt, trainer.strategy
    load_model(strategy, ckpt, opt.optimizers)
    states = ckpt.get("callbacks", {})
    for cb in trainer.callbacks:  # before the optimizers: BaseFinetuning puts back the param groups it added
        key = cb.state_key if cb.state_key in states else getattr(cb, "legacy_state_key", None)  # an older file's key
        if key in states:
            cb.load_state_dict(states[key])
            getattr(cb, "_restore_param_groups", lambda trainer: None)(trainer)
    if "sharded" not in ckpt:  # a sharded folder's optimizer states were read with the weights
        _load_states("optimizer", opt.optimizers, ckpt, "optimizer_states", "optimizer", strategy.load_optimizer_state_dict)
    _load_states(
        "scheduler", [s.scheduler for s in opt.schedulers], ckpt, "lr_schedulers", "lr_scheduler",
        lambda sched, state: sched.load_state_dict(state),
    )
    trainer._precision.load_state_dict(ckpt.get("precision", {}))
    datamodule = trainer.datamodule
    if datamodule is not None and "datamodule" in ckpt:
        datamodule.load_state_dict(ckpt["datamodule"])
    loop = ckpt["loop"]
    trainer.state.global_step = loop["global_step"]
    trainer.state.current_epoch = loop["epoch"]
    trainer.state.batch_in_epoch = _batch_position(loop, trainer.strategy.world_size)
    trainer.callback_metrics.update(ckpt.get("metrics", {}))


def load_model(strategy: Any, ckpt: dict[str, Any], optimizers: list[Any] = ()) -> None:
    """The model's ``on_load_checkpoint`` hook, then its weights (through ``strategy``, which may
    shard them), all keys matching. From a sharded folder every rank reads its shards, and the
    ``optimizers``' states with them."""
    module = strategy.module
    if isinstance(module, TrainModule):  # first: the model may read or adapt what it saved
        module.on_load_checkpoint(ckpt)
    if "sharded" in ckpt:
        strategy.load_sharded_checkpoint(ckpt["sharded"], list(optimizers))
        return
    missing, unexpected = _key_mismatch(module, plain_state_dict(ckpt["model"]))
    if missing or unexpected:
        raise CheckpointError(
            f"The checkpoint does not fit {type(module).__name__}: missing keys {missing or 'none'}, "
            f"unexpected keys {unexpected or 'none'}. Was it saved from another model?"
        )
    try:
        strategy.load_module_state_dict(ckpt["model"])
    except RuntimeError as err:  # same keys, other shapes
        raise CheckpointError(f"The checkpoint does not fit {type(module).__name__}: {err}") from None


def best_checkpoint(callback: Any) -> str:
    """``ckpt_path="best"`` for evaluation: the checkpoint callback's best file."""
    if callback is None:
        raise ValueError(
            "ckpt_path='best' needs the ModelCheckpoint callback that ranked the checkpoints, and this Trainer "
            "has none (enable_checkpointing=False). Pass the file's path, or 'last'."
        )
    if not callback.best_model_path:
        raise ValueError(
            "ckpt_path='best': no checkpoint has been saved by this Trainer's ModelCheckpoint yet. Run "
            "trainer.fit(...) first, or pass a checkpoint's path, or 'last'."
        )
    return callback.best_model_path


def evaluate_checkpoint(trainer: Trainer, ckpt_path: Any) -> tuple[int, int] | None:
    """Load the weights of ``ckpt_path`` ("last" or a file) for validate, test or predict, and
    move the counters to its step and epoch (where evaluation logs). Returns the counters to
    put back after; None without a checkpoint."""
    if ckpt_path is None:
        return None
    path = os.fspath(ckpt_path)
    strategy = trainer.strategy
    if path == "last":
        folder, found = _last_checkpoint(trainer)
        if found is None:
            where = folder or f"{_runs_base(trainer)[0]} (no fit of that name with checkpoints)"
            raise ValueError(f"ckpt_path='last': no checkpoint found in {where}. Pass a checkpoint's path instead.")
        path = found
    ckpt = ckpt_io.load(path)
    load_model(strategy, ckpt)
    state, before = trainer.state, (trainer.state.global_step, trainer.state.current_epoch)
    loop = ckpt.get("loop", {})
    state.global_step, state.current_epoch = loop.get("global_step", 0), loop.get("epoch", 0)
    if strategy.is_global_zero:
        log.info("Evaluating %s (step %d, epoch %d).", path, state.global_step, state.current_epoch)
    return before


def _load_states(
    kind: str, objects: list[Any], ckpt: dict[str, Any], key: str, old_key: str, load: Callable[[Any, Any], None]
) -> None:
    """Load each optimizer's (or scheduler's) state; 0.1.0 files kept one under ``old_key``."""
    states = ckpt.get(key)
    if states is None:
        states = [] if ckpt.get(old_key) is None else [ckpt[old_key]]
    if states and len(states) != len(objects):
        raise ValueError(
            f"The checkpoint holds {len(states)} {kind} state(s), and configure_optimizers() now returns "
            f"{len(objects)} {kind}(s). Resume with the same optimizers and schedulers it was trained with."
        )
    for obj, state in zip(objects, states):
        load(obj, state)


def _key_mismatch(module: torch.nn.Module, state: dict[str, Any]) -> tuple[list[str], list[str]]:
    own = set(plain_state_dict(module.state_dict()))
    return sorted(own - set(state)), sorted(set(state) - own)


def capture(trainer: Trainer, tensors: bool = True) -> dict[str, Any]:
    """The full state. Every rank must call it (RNG states are gathered to all ranks).
    ``tensors=False`` leaves out the model and the optimizers (a sharded checkpoint's strategy
    writes those itself)."""
    strategy, state, opt = trainer.strategy, trainer.state, trainer._opt
    if trainer._epoch_complete:
        epoch, batch = state.current_epoch + 1, 0
    else:
        epoch, batch = state.current_epoch, state.batch_in_epoch
    local_rng = ckpt_io.rng_state()
    local_rng["loader"] = ckpt_io.generator_states(trainer._epoch_loader)  # a DataLoader(generator=g)
    rng = strategy.gather_objects(local_rng)
    start = trainer._epoch_start
    if batch == 0 and start:  # the next epoch draws from "rng"; only a DistributedSampler's seed carries over
        start = {"sampler": start["sampler"]} if "sampler" in start else None
    epoch_start = strategy.gather_objects(start)
    # Mid-epoch, the epoch's logged values so far (per rank): the resumed epoch's means need them.
    sink = trainer._train_sink if batch > 0 else None
    train_metrics = strategy.gather_objects(None if sink is None else sink.state_dict())
    module = trainer.module
    hparams, left_out = checkpoint_hparams(module)
    weights = {
        "model": strategy.module_state_dict(),
        "optimizer_states": [] if opt is None else [strategy.optimizer_state_dict(o) for o in opt.optimizers],
    } if tensors else {}
    return {
        "format": FORMAT,
        "version": __version__,
        **weights,
        "lr_schedulers": [] if opt is None else [s.scheduler.state_dict() for s in opt.schedulers],
        "precision": trainer._precision.state_dict(),
        "callbacks": {cb.state_key: cb.state_dict() for cb in trainer.callbacks},
        "loop": {
            "epoch": epoch, "batch_in_epoch": batch, "global_step": state.global_step,
            "world_size": strategy.world_size,
        },
        "metrics": dict(trainer.callback_metrics),
        "rng": rng,
        "epoch_start": epoch_start,
        "train_metrics": train_metrics,
        "strategy": strategy.name,
        "hparams": hparams,  # the plain ones: weights_only=True loads them
        "hparams_left_out": left_out,  # load_from_checkpoint asks for these
        **_datamodule_state(trainer.datamodule),
        "trainer": ckpt_io.plain(trainer.hparams()),
    }


def _datamodule_state(datamodule: Any) -> dict[str, Any]:
    """A DataModule's ``state_dict()`` and plain hyperparameters, when fit has one."""
    if datamodule is None:
        return {}
    return {"datamodule": datamodule.state_dict(), "datamodule_hparams": checkpoint_hparams(datamodule)[0]}


def resolve_path(trainer: Trainer, ckpt_path: Any) -> str | None:
    """``"last"`` -> the newest good checkpoint of the folder :func:`_search_folder` picks (rank 0
    looks, every rank gets its answer)."""
    if ckpt_path is None:
        return None
    path = os.fspath(ckpt_path)
    if path != "last":
        return path
    strategy = trainer.strategy
    folder, path = _last_checkpoint(trainer)
    if path is None and strategy.is_global_zero:
        if folder is None:
            where = f"no earlier fit in {_runs_base(trainer)[0]}"
        else:
            where = f"no checkpoint in {folder}"
        log.info("ckpt_path='last': %s; starting from scratch.", where)
    return path


def _last_checkpoint(trainer: Trainer) -> tuple[str | None, str | None]:
    """(the folder searched, the newest good checkpoint in it): rank 0 looks, every rank gets
    the path (the folder only on rank 0, for its messages)."""
    strategy = trainer.strategy
    folder = _search_folder(trainer) if strategy.is_global_zero else None
    return folder, strategy.broadcast_object(_find_last(folder) if folder is not None else None)


def _search_folder(trainer: Trainer) -> str | None:
    """Where ``"last"`` looks: the ModelCheckpoint's ``dirpath`` when given; else, without a
    logger, ``<log_dir>/checkpoints`` (``./checkpoints`` with ``log_dir=None``); else the
    checkpoints of the first logger's latest fit only: its fixed version's folder, or the
    newest ``<save_dir>/<name>/version_<n>`` with a ``checkpoints`` folder (None if none).

    Never any older version: with the default ``name="default"`` they belong to other runs,
    and the latest fit, killed before its first save, must start afresh, not resume one of them.
    """
    cb = trainer.checkpoint_callback
    if cb is not None and cb.dirpath_given is not None:
        return cb.dirpath_given
    base, fixed = _runs_base(trainer)
    if base is None:
        return os.path.join(os.path.abspath(trainer.default_root_dir or os.getcwd()), "checkpoints")
    if fixed is not None:
        folder = os.path.join(base, fixed, "checkpoints")
        return folder if os.path.isdir(folder) else None
    try:
        names = os.listdir(base)
    except OSError:  # no run of this name yet
        return None
    # A fit with checkpointing makes its version's checkpoints folder at its start; validate and test make none.
    fits = [
        int(d[8:]) for d in names
        if d.startswith("version_") and d[8:].isdigit() and os.path.isdir(os.path.join(base, d, "checkpoints"))
    ]
    return os.path.join(base, f"version_{max(fits)}", "checkpoints") if fits else None


def _runs_base(trainer: Trainer) -> tuple[str | None, str | None]:
    """(the first logger's ``<save_dir>/<name>``, its fixed version folder or None), or (None, None)."""
    if not trainer.loggers:
        return None, None
    first = trainer.loggers[0]
    base = os.path.join(first.save_dir or trainer.default_root_dir or os.getcwd(), first.name or "")
    version = getattr(first, "_version", None) if getattr(first, "_fixed_version", False) else None
    return base, None if version is None else (version if isinstance(version, str) else f"version_{version}")


def _find_last(folder: str) -> str | None:
    """The newest checkpoint in ``folder`` that loads safely; a corrupt, truncated or refused
    newer file is skipped with a warning that names it."""
    # Temp files of unfinished saves start with "." and never match.
    files = [f for f in glob.glob(os.path.join(glob.escape(folder), "*.ckpt")) if os.path.exists(f)]  # no dangling link
    # Newest first; last.ckpt is a hard link to the newest top-k file, so it wins their tie.
    files.sort(key=lambda f: (os.stat(f).st_mtime_ns, os.path.basename(f) == LAST), reverse=True)
    for f in files:
        try:
            _load_good(f, mmap=True)  # mapped, not read: checks the structure cheaply
        except CheckpointError as err:
            warnings.warn(f"ckpt_path='last': skipping {f}: {err}", stacklevel=3)
            continue
        return f
    return None


def _load_good(path: str, mmap: bool = False) -> dict[str, Any]:
    ckpt = ckpt_io.load(path, mmap=mmap)
    if ckpt.get("weights_only"):
        raise CheckpointError(
            f"{path!r} holds the model's weights only (ModelCheckpoint(save_weights_only=True)), no optimizer or "
            "loop state, so fit cannot resume from it. Evaluate it with test(ckpt_path=...), or resume from a "
            "file saved with save_weights_only=False."
        )
    if "loop" not in ckpt:
        raise CheckpointError(
            f"{path!r} holds model weights but no training state, so fit cannot resume from it. "
            "Load the weights with model.load_state_dict(torch.load(path, weights_only=True)['model'])."
        )
    return ckpt
