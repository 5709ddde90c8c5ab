"""TrainModule: a torch.nn.Module that knows how to train itself."""

from __future__ import annotations

import inspect
import os
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from trainer.core.metrics import log_metric

if TYPE_CHECKING:
    from trainer.trainer import Trainer


class TrainModule(nn.Module):
    """Subclass this and define ``training_step`` (and optionally the other steps).

    ``training_step`` returns the loss: a scalar tensor, or a dict with a ``"loss"`` key.
    ``configure_optimizers`` returns an optimizer, ``(optimizer, scheduler)``, or
    ``dict(optimizer=..., lr_scheduler=..., interval="epoch" | "step", monitor=...)``; with
    manual optimization also several: ``[opt1, opt2]``, ``([opts], [schedulers])`` or a list of
    dicts. Leave it out to use ``Trainer(optimizer=lambda params: ...)`` instead.

    ``automatic_optimization = False`` (set it in ``__init__``) hands the steps to
    ``training_step``: ``self.optimizers()``, ``self.manual_backward(loss)``, ``opt.step()``,
    ``opt.zero_grad()`` (trainer/loops/manual.py).
    """

    #: False: training_step runs backward and the optimizer steps itself (trainer/loops/manual.py).
    automatic_optimization = True

    def __init__(self) -> None:
        super().__init__()
        self._trainer: Trainer | None = None
        self.hparams: dict[str, Any] = {}

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        raise NotImplementedError(
            f"{type(self).__name__} has no training_step. Define "
            "`def training_step(self, batch, batch_idx)` returning the loss."
        )

    def predict_step(self, batch: Any, batch_idx: int) -> Any:
        return self(batch)

    def configure_optimizers(self) -> Any:
        return None

    #: ``self.log(name, value, *, prog_bar=False, batch_size=None)``: record a scalar. Inside a
    #: step it is kept per step and as a batch-size-weighted epoch mean (``batch_size``
    #: defaults to the batch's). In an ``on_*_epoch_end`` hook it is one value for the epoch.
    #: A plain function, so that each call is one call.
    log = staticmethod(log_metric)

    def log_dict(self, values: dict[str, Any], *, prog_bar: bool = False, batch_size: int | None = None) -> None:
        """``self.log`` for each name and value of ``values``."""
        if not isinstance(values, dict):
            raise TypeError(f"self.log_dict(values={values!r:.80}) takes a dict of name -> scalar.")
        for name, value in values.items():
            log_metric(name, value, prog_bar=prog_bar, batch_size=batch_size)

    # --- manual optimization (trainer/loops/manual.py) ---------------------------------------
    def optimizers(self) -> Any:
        """The optimizers from configure_optimizers, in its order: one, or a list of several. Under
        manual optimization their ``step()`` also syncs gradients (ddp) and runs the scaler."""
        trainer = self.trainer
        opts = trainer.optimizers if trainer._manual is None else trainer._manual.optimizers
        return opts[0] if len(opts) == 1 else list(opts)

    def lr_schedulers(self) -> Any:
        """The schedulers from configure_optimizers: None, one, or a list. Under manual
        optimization the Trainer steps none of them: call their ``step()`` yourself."""
        scheds = self.trainer.lr_schedulers
        return None if not scheds else scheds[0] if len(scheds) == 1 else list(scheds)

    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """``loss.backward()`` for manual optimization: scaled under ``16-mixed``, outside
        autocast, between the ``on_before_backward``/``on_after_backward`` hooks."""
        from trainer.loops.manual import manual_backward  # the loops sit above the module

        manual_backward(self, loss, *args, **kwargs)

    def clip_gradients(
        self, optimizer: Any, gradient_clip_val: float | None = None, gradient_clip_algorithm: str | None = None
    ) -> torch.Tensor | None:
        """Clip ``optimizer``'s gradients by global norm (default) or by value, after they were
        synced and unscaled; returns the norm before clipping (also ``trainer.grad_norm``)."""
        from trainer.loops.manual import clip_gradients  # the loops sit above the module

        return clip_gradients(self, optimizer, gradient_clip_val, gradient_clip_algorithm)

    def toggle_optimizer(self, optimizer: Any) -> None:
        """Until ``untoggle_optimizer``, only ``optimizer``'s parameters require grad: a backward
        then leaves the other networks' gradients alone (and costs less)."""
        opt = getattr(optimizer, "optimizer", optimizer)
        own = {id(p) for group in opt.param_groups for p in group["params"]}
        saved = {}
        for p in self.parameters():
            saved[p] = p.requires_grad
            if id(p) not in own:
                p.requires_grad_(False)
        self._toggled = saved

    def untoggle_optimizer(self, optimizer: Any) -> None:
        for p, requires_grad in getattr(self, "_toggled", {}).items():
            p.requires_grad_(requires_grad)
        self._toggled = {}

    # --- hooks: the Callback hooks without (trainer, module); each runs before the callbacks'.
    # One the model does not override costs nothing: the loop never calls it.
    def setup(self, stage: str) -> None: ...
    def teardown(self, stage: str) -> None: ...
    def on_fit_start(self) -> None: ...
    def on_fit_end(self) -> None: ...
    def on_exception(self, exception: BaseException) -> None: ...
    def on_train_start(self) -> None: ...
    def on_train_end(self) -> None: ...
    def on_train_epoch_start(self) -> None: ...
    def on_train_epoch_end(self) -> None: ...
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None: ...
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_before_backward(self, loss: torch.Tensor) -> None: ...
    def on_after_backward(self) -> None: ...
    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None: ...
    def on_train_log(self, metrics: dict[str, float]) -> None: ...
    def on_sanity_check_start(self) -> None: ...
    def on_sanity_check_end(self) -> None: ...
    def on_validation_start(self) -> None: ...
    def on_validation_end(self) -> None: ...
    def on_validation_epoch_start(self) -> None: ...
    def on_validation_epoch_end(self) -> None: ...
    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_test_start(self) -> None: ...
    def on_test_end(self) -> None: ...
    def on_test_epoch_start(self) -> None: ...
    def on_test_epoch_end(self) -> None: ...
    def on_test_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_test_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_predict_start(self) -> None: ...
    def on_predict_end(self) -> None: ...
    def on_predict_epoch_start(self) -> None: ...
    def on_predict_epoch_end(self) -> None: ...
    def on_predict_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_predict_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Add to (or change) the checkpoint about to be written; rank 0 only."""

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Read what ``on_save_checkpoint`` added, before the weights are loaded, when fit resumes."""

    def save_hyperparameters(self, **extra: Any) -> None:
        """Record the calling ``__init__``'s arguments (plus ``extra``) in ``self.hparams``.

        They are written to TensorBoard's HParams tab and into every checkpoint.
        """
        frame = inspect.currentframe()
        caller = frame.f_back if frame is not None else None
        if caller is not None:
            info = inspect.getargvalues(caller)
            for name in info.args[1:]:  # skip self
                self.hparams[name] = info.locals[name]
            if info.keywords:
                self.hparams.update(info.locals[info.keywords])
        self.hparams.update(extra)

    @classmethod
    def load_from_checkpoint(
        cls, path: str | os.PathLike, map_location: Any = None, strict: bool = True, **overrides: Any
    ) -> "TrainModule":
        """The model a checkpoint holds, in eval mode: built from the hyperparameters that
        ``save_hyperparameters()`` recorded (``overrides`` replace some), with its weights loaded
        with ``weights_only=True`` (no code in the file runs). ``map_location`` as ``torch.load``'s."""
        from trainer.checkpoint.files import load as load_checkpoint  # checkpoint I/O sits above the module
        from trainer.checkpoint.state_dicts import load_plain_state_dict, load_sharded_model, plain_state_dict

        ckpt = load_checkpoint(path, map_location=map_location)
        hparams = {**ckpt.get("hparams", {}), **overrides}
        try:
            model = cls(**hparams)
        except TypeError as err:
            if ckpt.get("hparams"):
                raise
            raise TypeError(
                f"{cls.__name__}.load_from_checkpoint({os.fspath(path)!r}): the checkpoint holds no "
                f"hyperparameters, and {cls.__name__}() could not be built without them ({err}). Call "
                "self.save_hyperparameters() in __init__ so that checkpoints record them, or pass them "
                f"here: {cls.__name__}.load_from_checkpoint(path, <argument>=...)."
            ) from None
        model.on_load_checkpoint(ckpt)
        if "sharded" in ckpt:  # a folder of shards (fsdp): read whole into this one process
            ckpt["model"] = load_sharded_model(ckpt["sharded"], plain_state_dict(model.state_dict()))
        load_plain_state_dict(model, ckpt["model"], strict=strict)  # into compiled submodules too
        return model.eval()

    @property
    def trainer(self) -> "Trainer":
        if self._trainer is None:
            raise RuntimeError(f"{type(self).__name__} is not attached to a Trainer; call trainer.fit(model, ...).")
        return self._trainer

    @property
    def logger(self) -> Any:
        """The Trainer's first logger (``self.logger.experiment`` is TensorBoard's
        ``SummaryWriter`` by default); None without a Trainer or with ``logger=False``."""
        return None if self._trainer is None else self._trainer.logger

    @property
    def loggers(self) -> list[Any]:
        """All the Trainer's loggers ([] without a Trainer)."""
        return [] if self._trainer is None else self._trainer.loggers

    @property
    def device(self) -> torch.device:
        for p in self.parameters():
            return p.device
        # A DataParallel replica holds its weights as plain tensors, which torch's replicate
        # also lists in _former_parameters; without this, a replica would report the CPU.
        for m in self.modules():
            for t in getattr(m, "_former_parameters", {}).values():
                return t.device
        return torch.device("cpu")

    def __getstate__(self) -> dict[str, Any]:
        # The Trainer holds this module; don't drag it (and its open files) into pickles.
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__.copy()
        state = dict(state)
        state["_trainer"] = None
        return state


def check_model(model: Any, needs_training_step: bool = True) -> None:
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module (subclass trainer.TrainModule); got {type(model).__name__}.")
    if type(model).__name__ == "OptimizedModule" and hasattr(model, "_orig_mod"):
        raise TypeError(
            f"model is torch.compile({type(model._orig_mod).__name__}): its checkpoints would carry '_orig_mod.' "
            "in every key. Pass the model itself and Trainer(compile=True) (or compile=dict(mode=...)): it is "
            "then compiled in place, the way each strategy wants, and its state_dict keys stay the model's."
        )
    if needs_training_step and not callable(getattr(model, "training_step", None)):
        raise TypeError(
            f"{type(model).__name__} has no training_step. Subclass trainer.TrainModule and define "
            "training_step(self, batch, batch_idx)."
        )
    if needs_training_step and isinstance(model, TrainModule) and type(model).training_step is TrainModule.training_step:
        raise TypeError(f"{type(model).__name__} does not define training_step(self, batch, batch_idx).")
