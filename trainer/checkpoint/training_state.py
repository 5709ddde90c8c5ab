"""Capturing the full training state, and putting it back so that a resumed run is bit-exact.

An epoch's data order is fixed when ``iter(loader)`` runs: the DataLoader draws a base seed
from the global torch RNG (or the loader's generator) and RandomSampler draws its seed at
the first ``next``. So a checkpoint keeps, per rank, the RNG as it was just before that
``iter`` (to re-create the order) and the RNG at the save (to continue dropout and the like
exactly). A mid-epoch resume hands the batch pipeline (``trainer/data/pipeline.py``) a
:class:`~trainer.data.pipeline.StartPoint` with both, which re-creates the order, skips the
consumed batches at the sampler level (their data is never loaded), then restores the
save-time RNG; and it puts back the values logged so far in the epoch (their means feed
schedulers and checkpoint monitors).
"""

from __future__ import annotations

import copy
import logging
import warnings
from typing import TYPE_CHECKING, Any, Callable


from trainer._version import __version__
from trainer.checkpoint import files as ckpt_io
from trainer.data.rng import generator_states, loader_state, rng_state
from trainer.checkpoint import layout
from trainer.checkpoint.files import CheckpointError
from trainer.checkpoint.paths import load_good
from trainer.data.pipeline import StartPoint
from trainer.core.exceptions import misconfigured
from trainer.core.hparams import checkpoint_hparams, hparams_type, pickled_hparams
from trainer.core.module import TrainModule
from trainer.checkpoint.state_dicts import check_optimizers_fit, check_weights_fit, key_mismatch, optimizer_class

if TYPE_CHECKING:
    from trainer.loops.run import Run
    from trainer.trainer import Trainer

log = logging.getLogger("trainer")
CAPTURE_FORMAT = "steadytrainer/1"  # what capture() returns; the file's layout is layout.FILE_FORMAT


class Resume:
    """The loaded checkpoint's loop position and RNG, applied at the first epoch it affects."""

    def __init__(self, ckpt: dict[str, Any] | None = None, rank: int = 0, world_size: int = 1) -> None:
        self.pending = ckpt is not None
        self.rank = rank
        if ckpt is None:
            return
        ours = layout.ours(ckpt)
        loop = ours["loop"]
        saved_world = loop.get("world_size", world_size)  # a Lightning file's batch count is per rank
        self.epoch, self.batch = loop["epoch"], _batch_position(loop, world_size)
        self.val_pending = bool(loop.get("val_pending")) and self.batch > 0  # the validation after the saved batch
        same_world = saved_world == world_size and len(ours.get("rng", [])) == world_size
        # Across a change of world size (or from a Lightning file) the RNG streams cannot line up;
        # weights and steps still carry over.
        self.rng = ours["rng"][rank] if same_world else None
        self.train_metrics = ours.get("train_metrics", [None] * world_size)[rank] if same_world else None
        starts = ours.get("epoch_start") or [None]
        self.epoch_start = starts[rank] if same_world else None
        # The DistributedSampler's seed is the same on every rank, so any rank's record will do.
        self.sampler_state = ((starts[rank] if same_world else starts[0]) or {}).get("sampler")

    # --- loading -----------------------------------------------------------------------
    @classmethod
    def load(cls, trainer: Trainer, run: Run, loaded: tuple[str, dict[str, Any]] | None) -> "Resume":
        """Restore everything from ``loaded``, what :func:`read_for_fit` returned, into the fit's
        ``run`` and the trainer's counters and callbacks."""
        run.epoch_start = run.epoch_loader = None  # nothing from an earlier fit leaks in
        if loaded is None:
            return cls()
        path, ckpt = loaded
        strategy = trainer.strategy
        restore(trainer, run, ckpt)
        if strategy.is_global_zero:
            log.info("Resumed from %s at epoch %d, step %d.", path, trainer.current_epoch, trainer.global_step)
            finished = nothing_left(trainer, path)
            if finished is not None:
                log.info("%s", finished)
            saved_world = layout.ours(ckpt)["loop"].get("world_size")
            if saved_world is None:
                log.info(
                    "The checkpoint was written by Lightning: weights, optimizer, schedulers and position carry "
                    "over, but it holds no RNG states, so the data order and random numbers differ from an "
                    "uninterrupted run."
                )
            elif saved_world != strategy.world_size:
                log.info(
                    "The checkpoint was written with world size %d, this run has %d: weights, optimizer and "
                    "step carry over, but the data order and random numbers will differ from an "
                    "uninterrupted run.", saved_world, strategy.world_size,
                )
        return cls(ckpt, strategy.global_rank, strategy.world_size)

    def start_point(self, trainer: Trainer, run: Run, validate: Callable[[], Any] | None = None) -> StartPoint | None:
        """Where the current epoch's batches start: None unless this is the epoch the checkpoint
        was saved in (then only once). Its logged values so far come back here. A checkpoint saved
        before the validation that came next (``val_pending``) resumes with that validation
        (``validate``), once its RNG is back and before the next batch: as it ran."""
        if not self.pending:
            return None
        self.pending = False
        seed = (self.sampler_state or {}).get("seed")
        if self.rng is None:  # another world size: no exact RNG to put back
            return StartPoint(self.batch, sampler_seed=seed)
        if self.batch > 0 and self.train_metrics is not None and run.train_sink is not None:
            run.train_sink.load_state_dict(self.train_metrics, trainer.strategy.root_device)
        then = validate if self.val_pending else None
        return StartPoint(self.batch, self.epoch_start, self.rng, seed, then)


def nothing_left(trainer: Trainer, path: str) -> str | None:
    """The line that says a resumed fit has nothing to train (its checkpoint already reached
    max_epochs or max_steps, and fit then does nothing, as Lightning's does); None otherwise."""
    state = trainer.state
    for name, limit, done, unit in (
        ("max_epochs", trainer.max_epochs, state.current_epoch, "epoch(s)"),
        ("max_steps", trainer.max_steps, state.global_step, "step(s)"),
    ):
        if limit is not None and limit >= 0 and done >= limit:
            return (
                f"`Trainer.fit` stopped: `{name}={limit}` reached. "
                f"The checkpoint {path} had already trained {done} {unit}, "
                f"so this fit trains nothing. To train longer, raise the limit and resume from it: "
                f"Trainer({name}={max(2 * limit, done + 1)}, ...).fit(model, ckpt_path=...)."
            )
    return None


def _batch_position(loop: dict[str, Any], world_size: int) -> int:
    """Batches consumed in the epoch, in this run's batches (each rank's share scales with 1/world)."""
    saved_world = loop.get("world_size", world_size)
    return loop["batch_in_epoch"] * saved_world // world_size


def read_for_fit(trainer: Trainer, path: str | None) -> tuple[str, dict[str, Any]] | None:
    """The checkpoint fit resumes from (``path``, the file ``paths.resolve_ckpt_path`` chose), with
    the DataModule's state already put back: as in Lightning, before its loaders are made."""
    if path is None:
        return None
    ckpt = load_good(path)
    _load_datamodule(trainer.datamodule, ckpt)
    return path, ckpt


def restore(trainer: Trainer, run: Run, ckpt: dict[str, Any]) -> None:
    """Put a checkpoint back, in Lightning's order: the model (its ``on_load_checkpoint`` first),
    the callbacks (every ``on_load_checkpoint``, then every ``load_state_dict``), then the
    scaler, the counters, the optimizers and the schedulers. (The DataModule's state came back
    before its loaders were made: :func:`read_for_fit`.)"""
    opt, strategy = run.opt, trainer.strategy
    check_weights_fit(ckpt, strategy.module)
    load_model(strategy, ckpt, opt.optimizers)
    for cb in trainer.callbacks:  # the model's hook ran before its weights were loaded
        cb.on_load_checkpoint(trainer, run.module, ckpt)
    states = ckpt.get("callbacks", {})
    given = {cb.state_key for cb in trainer.callbacks}
    given |= {getattr(cb, "legacy_state_key", None) for cb in trainer.callbacks}
    missing = [key for key, state in states.items() if state and key not in given]
    if missing and trainer.is_global_zero:
        warnings.warn(
            "Be aware that when using `ckpt_path`, callbacks used to create the checkpoint need to be provided during "
            f"`Trainer` instantiation. Please add the following callbacks: {missing}.", stacklevel=2,
        )
    for cb in trainer.callbacks:  # before the optimizers: BaseFinetuning puts back the param groups it added
        key = cb.state_key if cb.state_key in states else getattr(cb, "legacy_state_key", None)  # an older file's key
        if states.get(key):
            cb.load_state_dict(copy.deepcopy(states[key]))
            if getattr(type(cb), "restore_param_groups", None) is not None:  # (a Mock(spec=Callback) has none)
                cb.restore_param_groups(trainer)
    run.precision.load_state_dict(layout.scaler_state(ckpt))
    ours = layout.ours(ckpt)
    loop = ours["loop"]
    trainer.state.global_step = loop["global_step"]
    trainer.state.batches_stepped = loop.get("batches_stepped")  # manual optimization's (an older file: global_step)
    trainer.state.current_epoch = loop["epoch"]
    if trainer.max_epochs not in (None, -1) and trainer.current_epoch > trainer.max_epochs:
        raise misconfigured("Raise max_epochs to train on from it, or evaluate it with validate/test(ckpt_path=...).",
                            f"You restored a checkpoint with current_epoch={trainer.current_epoch}, but you have set "
                            f"Trainer(max_epochs={trainer.max_epochs}).")
    trainer.state.batch_in_epoch = _batch_position(loop, trainer.strategy.world_size)
    if strategy.lightning_restore_optimizer:  # else the strategy restores them itself (Lightning's switch)
        check_optimizers_fit(ckpt, opt.optimizers)  # after BaseFinetuning put its param groups back
        if "sharded" not in ours:  # a sharded folder's optimizer states were read with the weights
            _check_count("optimizer", len(opt.optimizers), ckpt, "optimizer_states")
            strategy.load_optimizer_state_dict(ckpt)
        _check_count("scheduler", len(opt.schedulers), ckpt, "lr_schedulers")
        for config, state in zip(opt.schedulers, ckpt.get("lr_schedulers") or []):
            config.scheduler.load_state_dict(state)
    run.callback_metrics.update(ours.get("metrics", {}))


def _load_datamodule(datamodule: Any, ckpt: dict[str, Any]) -> None:
    """The DataModule's ``load_state_dict``, with what the file keeps under its class's name."""
    if datamodule is None:
        return
    state = ckpt.get(type(datamodule).__qualname__, layout.ours(ckpt).get("datamodule"))  # 0.1 files: unnamed
    if state is not None:
        datamodule.load_state_dict(state)


def load_model(strategy: Any, ckpt: dict[str, Any], optimizers: list[Any] = ()) -> None:
    """The model's ``on_load_checkpoint`` hook, then its weights (through ``strategy``, which may
    shard them), all keys matching unless the model sets ``strict_loading = False``. From a
    sharded folder every rank reads its shards, and the ``optimizers``' states with them."""
    module = strategy.module
    if isinstance(module, TrainModule):  # first: the model may read or adapt what it saved
        module.on_load_checkpoint(ckpt)
    sharded = layout.ours(ckpt).get("sharded")
    if sharded is not None:
        strategy.load_sharded_checkpoint(sharded, list(optimizers))
        return
    strict = getattr(module, "strict_loading", True)
    missing, unexpected = key_mismatch(module, ckpt["state_dict"])
    if strict and (missing or unexpected):
        raise CheckpointError(
            f"The checkpoint does not fit {type(module).__name__}: missing keys {missing or 'none'}, "
            f"unexpected keys {unexpected or 'none'}. Was it saved from another model? (Set "
            f"{type(module).__name__}.strict_loading = False to load the keys that match.)"
        )
    try:
        strategy.load_module_state_dict(ckpt["state_dict"], strict=strict)
    except RuntimeError as err:  # same keys, other shapes
        raise CheckpointError(f"The checkpoint does not fit {type(module).__name__}: {err}") from None


def evaluate_checkpoint(trainer: Trainer, run: Run, path: str | None) -> None:
    """Load the weights of ``path`` (the file :func:`~trainer.checkpoint.paths.resolve_ckpt_path`
    chose, or None) for validate, test or predict; ``run.ckpt_path`` is the file. The Trainer's
    counters stay as they are (Lightning's: a new Trainer evaluates, and logs, at step 0)."""
    run.ckpt_path = path
    if path is None:  # the model as it is, as Lightning does
        return
    strategy = trainer.strategy
    ckpt = ckpt_io.load(path)
    load_model(strategy, ckpt)
    _load_datamodule(trainer.datamodule, ckpt)
    if strategy.is_global_zero:
        loop = layout.ours(ckpt)["loop"]
        log.info("Evaluating %s (step %d, epoch %d).", path, loop.get("global_step", 0), loop.get("epoch", 0))


def _check_count(kind: str, count: int, ckpt: dict[str, Any], key: str) -> None:
    """The checkpoint's optimizer (or scheduler) states are as many as ``configure_optimizers`` returns."""
    states = ckpt.get(key) or []
    if states and len(states) != count:
        raise ValueError(
            f"The checkpoint holds {len(states)} {kind} state(s), and configure_optimizers() now returns "
            f"{count} {kind}(s). Resume with the same optimizers and schedulers it was trained with."
        )


def capture(trainer: Trainer, run: Run, tensors: bool = True) -> dict[str, Any]:
    """The full state: the trainer's counters, callbacks and options, and the ``run``'s
    optimizers, precision, loader position and metrics. Every rank must call it (RNG states
    are gathered to all ranks). ``tensors=False`` leaves out the model and the optimizers (a
    sharded checkpoint's strategy writes those itself)."""
    strategy, state, opt = trainer.strategy, trainer.state, run.opt
    if run.epoch_complete:
        epoch, batch = state.current_epoch + 1, 0
    else:
        epoch, batch = state.current_epoch, state.batch_in_epoch
    # During a stop's own validation: the state from before it, which the validation puts back when it ends.
    local_rng = dict(run.training_rng) if run.training_rng is not None else rng_state()
    local_rng["loader"] = generator_states(run.epoch_loader)  # a DataLoader(generator=g)
    local_rng["loader_state"] = loader_state(run.epoch_loader)  # a Stateful loader's own position
    rng = strategy.gather_objects(local_rng)
    start = run.epoch_start
    if batch == 0 and start:  # the next epoch draws from "rng"; only a DistributedSampler's seed carries over
        start = {"sampler": start["sampler"]} if "sampler" in start else None
    epoch_start = strategy.gather_objects(start)
    # Mid-epoch, the epoch's logged values so far (per rank): the resumed epoch's means need them.
    sink = run.train_sink if batch > 0 else None
    train_metrics = strategy.gather_objects(None if sink is None else sink.state_dict())
    module = run.module
    hparams, left_out = checkpoint_hparams(module)
    weights = {
        "model": strategy.module_state_dict(),
        "optimizer_states": [] if opt is None else [strategy.optimizer_state_dict(o) for o in opt.optimizers],
    } if tensors else {}
    weights["optimizer_classes"] = [] if opt is None else [optimizer_class(o) for o in opt.optimizers]
    return {
        "format": CAPTURE_FORMAT,
        "version": __version__,
        **weights,
        "lr_schedulers": [] if opt is None else [s.scheduler.state_dict() for s in opt.schedulers],
        "precision": run.precision.state_dict(),
        # Lightning's: non-empty
        "callbacks": {cb.state_key: kept for cb in trainer.callbacks if (kept := cb.state_dict())},
        "loop": {
            "epoch": epoch, "batch_in_epoch": batch, "global_step": state.global_step,
            **({} if state.batches_stepped is None else {"batches_stepped": state.batches_stepped}),
            "world_size": strategy.world_size,
            # for Lightning's "epoch" and "loops": its current_epoch, its optimization, the epoch's length
            "current_epoch": state.current_epoch, "automatic": opt is None or opt.automatic,
            "batches": trainer.num_training_batches,
            **({"val_pending": True} if run.val_pending else {}),  # its resume runs the validation after this batch
        },
        "metrics": dict(run.callback_metrics),
        "rng": rng,
        "epoch_start": epoch_start,
        "train_metrics": train_metrics,
        "strategy": strategy.name,
        "hparams": hparams,  # the plain ones: weights_only=True loads them
        "hparams_name": getattr(module, "_hparams_name", None),
        "hparams_type": hparams_type(module),  # "DictConfig": load_from_checkpoint gives an OmegaConf config back
        "hparams_left_out": left_out,  # load_from_checkpoint asks for these
        "hparams_pickled": pickled_hparams(module, left_out),  # unless it is given weights_only=False
        **_datamodule_state(run.datamodule),
        "trainer": ckpt_io.plain(trainer.hparams()),
    }


def _datamodule_state(datamodule: Any) -> dict[str, Any]:
    """A DataModule's ``state_dict()`` and plain hyperparameters, when fit has one."""
    if datamodule is None:
        return {}
    hparams, left_out = checkpoint_hparams(datamodule)
    return {
        "datamodule": datamodule.state_dict(), "datamodule_name": type(datamodule).__qualname__,
        "datamodule_hparams": hparams, "datamodule_hparams_name": getattr(datamodule, "_hparams_name", None),
        "datamodule_hparams_left_out": left_out, "datamodule_hparams_type": hparams_type(datamodule),
    }
