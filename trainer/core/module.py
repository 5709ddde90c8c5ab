"""TrainModule: a torch.nn.Module that knows how to train itself."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from trainer.core.hparams import CHECKPOINT_READER, HyperparametersMixin
from trainer.core.metrics import log_metric
from trainer.core.distributed import all_gather, move_to_device
from trainer.core.export.torchscript import JIT_ACTIVE, to_torchscript

if TYPE_CHECKING:
    from trainer.loops.optimization.manual import ModuleOptimization
    from trainer.trainer import Trainer


class TrainModule(HyperparametersMixin, nn.Module):
    """Subclass this and define ``training_step`` (and optionally the other steps).

    ``training_step`` returns the loss: a scalar tensor, or a dict with a ``"loss"`` key.
    ``configure_optimizers`` returns an optimizer, ``(optimizer, scheduler)``, or
    ``dict(optimizer=..., lr_scheduler=..., interval="epoch" | "step", monitor=...)``; with
    manual optimization also several: ``[opt1, opt2]``, ``([opts], [schedulers])`` or a list of
    dicts. Leave it out to use ``Trainer(optimizer=lambda params: ...)`` instead.

    ``automatic_optimization = False`` (set it in ``__init__``) hands the steps to
    ``training_step``: ``self.optimizers()``, ``self.manual_backward(loss)``, ``opt.step()``,
    ``opt.zero_grad()`` (trainer/loops/optimization/manual.py).
    """

    #: False: training_step runs backward and the optimizer steps itself (trainer/loops/optimization/manual.py).
    automatic_optimization = True
    #: The call's optimization (trainer/loops/optimization/manual.py), handed over with the Trainer when a call starts.
    _optimization = None  # a ModuleOptimization; no annotation: torch.jit.script types annotated class attributes
    #: What ``fit(torch.compile(model))`` compiled (trainer/utilities/compile.py); None when nothing was.
    _compiler_ctx: dict[str, Any] | None = None
    #: Where checkpoints keep the hyperparameters (Lightning's keys).
    CHECKPOINT_HYPER_PARAMS_KEY = "hyper_parameters"
    CHECKPOINT_HYPER_PARAMS_NAME = "hparams_name"
    CHECKPOINT_HYPER_PARAMS_TYPE = "hparams_type"
    #: Properties torch.jit.script leaves out (they read the Trainer, or Python torch.jit cannot compile).
    __jit_unused_properties__ = [
        "example_input_array", "on_gpu", "current_epoch", "global_step", "global_rank", "local_rank", "logger",
        "loggers", "trainer", "strict_loading", "device", "dtype", "hparams", "hparams_initial",
    ]

    def __init__(self) -> None:
        super().__init__()
        self._trainer: Trainer | None = None

    def _calls(self) -> ModuleOptimization:
        if self._optimization is None:
            raise RuntimeError(f"{type(self).__qualname__} is not attached to a `Trainer`. Call trainer.fit first.")
        return self._optimization

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        raise NotImplementedError(
            f"{type(self).__name__} has no training_step. Define "
            "`def training_step(self, batch, batch_idx)` returning the loss."
        )

    def predict_step(self, batch: Any, batch_idx: int = 0, dataloader_idx: int = 0) -> Any:
        """Lightning's default: ``self(batch)``; it takes ``dataloader_idx``, given with several loaders."""
        return self(batch)

    def configure_optimizers(self) -> Any:
        return None

    #: ``self.log(name, value, prog_bar=False, logger=None, on_step=None, on_epoch=None,
    #: reduce_fx="mean", enable_graph=False, sync_dist=False, sync_dist_group=None,
    #: add_dataloader_idx=True, batch_size=None, metric_attribute=None, rank_zero_only=False)``:
    #: record a scalar (or a torchmetrics Metric), as Lightning's. Inside a step it is kept per
    #: step and as a batch-size-weighted epoch mean (``batch_size`` defaults to the batch's). In
    #: an ``on_*_epoch_end`` hook it is one value for the epoch. The keywords are read at a
    #: name's first value (trainer/core/log_options.py). A plain function, so that each call is one call.
    log = staticmethod(log_metric)

    def log_dict(
        self, dictionary: Any, prog_bar: bool = False, logger: bool | None = None, on_step: bool | None = None,
        on_epoch: bool | None = None, reduce_fx: Any = "mean", enable_graph: bool = False, sync_dist: bool = False,
        sync_dist_group: Any = None, add_dataloader_idx: bool = True, batch_size: int | None = None,
        rank_zero_only: bool = False,
    ) -> None:
        """``self.log`` for each name and value of ``dictionary`` (a dict, or a torchmetrics
        MetricCollection: each of its metrics computed at the epoch's end), with the same keywords."""
        if not hasattr(dictionary, "items"):
            raise TypeError(f"self.log_dict({dictionary!r:.80}) takes a dict of name -> value (or a MetricCollection).")
        for name, value in dictionary.items():
            log_metric(
                name, value, prog_bar, logger, on_step, on_epoch, reduce_fx, enable_graph, sync_dist,
                sync_dist_group, add_dataloader_idx, batch_size, None, rank_zero_only,
            )

    # --- manual optimization (trainer/loops/optimization/manual.py) ---------------------------------------
    def optimizers(self, use_pl_optimizer: bool = True) -> Any:
        """The optimizers from configure_optimizers, in its order (one, or a list), each a ``LightningOptimizer``
        whose ``step()`` goes through the Trainer (optimizer.py); ``use_pl_optimizer=False``: unwrapped."""
        optimization = self._optimization
        opts = self.trainer.optimizers if optimization is None else optimization.optimizers(use_pl_optimizer)
        return opts[0] if len(opts) == 1 else list(opts)

    def lr_schedulers(self) -> Any:
        """The schedulers from configure_optimizers: None, one, or a list. Under manual
        optimization the Trainer steps none of them: call their ``step()`` yourself."""
        scheds = self.trainer.lr_schedulers
        return None if not scheds else scheds[0] if len(scheds) == 1 else list(scheds)

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """The backward pass of the step's loss (scaled under ``16-mixed``, divided over an
        accumulation group): ``loss.backward()``. Override it to pass arguments such as
        ``retain_graph=True``; the Trainer then calls yours, under automatic and manual optimization."""
        loss.backward(*args, **kwargs)

    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """``loss.backward()`` for manual optimization: scaled under ``16-mixed``, outside
        autocast, between the ``on_before_backward``/``on_after_backward`` hooks."""
        self._calls().backward(self, loss, *args, **kwargs)

    def clip_gradients(
        self, optimizer: Any, gradient_clip_val: float | None = None, gradient_clip_algorithm: str | None = None
    ) -> torch.Tensor | None:
        """Clip ``optimizer``'s gradients by global norm (default) or by value, after they were
        synced and unscaled; returns the norm before clipping (also ``trainer.grad_norm``)."""
        return self._calls().clip_gradients(self, optimizer, gradient_clip_val, gradient_clip_algorithm)

    def toggle_optimizer(self, optimizer: Any) -> None:
        """Until ``untoggle_optimizer``, the other optimizers' parameters require no grad, so a backward leaves
        their gradients alone (and costs less); as in Lightning, a parameter of no optimizer is left as it is."""
        opt = getattr(optimizer, "optimizer", optimizer)
        own = {id(p) for group in opt.param_groups for p in group["params"]}
        saved = {}
        for o in self._trainer.optimizers if self._trainer is not None else [opt]:
            for p in (p for group in o.param_groups for p in group["params"] if p not in saved):
                saved[p] = p.requires_grad
                p.requires_grad_(saved[p] and id(p) in own)
        self._toggled = saved

    def untoggle_optimizer(self, optimizer: Any) -> None:
        for p, requires_grad in getattr(self, "_toggled", {}).items():
            p.requires_grad_(requires_grad)
        self._toggled = {}

    # --- Lightning's overridable steps: the loops call them only when the model overrides them
    def configure_callbacks(self) -> Any:
        """Callbacks this model needs; they join the Trainer's, and replace one of the same type."""
        return []

    def configure_model(self) -> None:
        """Build layers here, once, before the strategy wraps the model (fsdp shards them as built)."""

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        """Step ``optimizer``; the default runs ``optimizer.step(closure=optimizer_closure)``.
        Override it to warm the learning rate up, or to step only sometimes."""
        optimizer.step(closure=optimizer_closure)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
        optimizer.zero_grad()

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        """Step ``scheduler`` (with ``metric`` when it monitors one): override it for a scheduler
        from outside torch.optim whose ``step`` takes other arguments."""
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric)

    def configure_gradient_clipping(
        self, optimizer: Any, gradient_clip_val: float | None = None, gradient_clip_algorithm: str | None = None
    ) -> None:
        """Clip before each optimizer step; the default clips as the Trainer's options say."""
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Move ``batch`` to ``device``; override it for a batch type the Trainer cannot move."""
        return move_to_device(batch, device)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch

    # --- Lightning's properties and helpers ------------------------------------------------
    @property
    def current_epoch(self) -> int:
        return 0 if self._trainer is None else self._trainer.current_epoch

    @property
    def global_step(self) -> int:
        return 0 if self._trainer is None else self._trainer.global_step

    @property
    def global_rank(self) -> int:
        return 0 if self._trainer is None else self._trainer.global_rank  # the Trainer's, as Lightning reads it

    @property
    def local_rank(self) -> int:
        return 0 if self._trainer is None else self._trainer.local_rank

    @property
    def dtype(self) -> torch.dtype:
        """The floating-point type of the parameters (the default dtype if there are none)."""
        return next((p.dtype for p in self.parameters() if p.is_floating_point()), torch.get_default_dtype())

    @dtype.setter
    def dtype(self, value: torch.dtype) -> None:
        self.to(value)

    @property
    def on_gpu(self) -> bool:
        """True if the model's parameters are on a CUDA device (Lightning's)."""
        return self.device.type == "cuda"

    @property
    def example_input_array(self) -> Any:
        """An input for ``forward``: the model summary shows each layer's input and output shapes from it."""
        return self.__dict__.get("_example_input_array")

    @example_input_array.setter
    def example_input_array(self, value: Any) -> None:
        self.__dict__["_example_input_array"] = value

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on global rank 0 only; through the progress bar's ``print`` while one is
        enabled (under the bar, as Lightning's)."""
        trainer = self._trainer
        if trainer is None:
            print(*args, **kwargs)
            return
        if not trainer.is_global_zero:
            return
        bar = trainer.progress_bar_callback
        if bar is not None and bar.is_enabled:
            bar.print(*args, **kwargs)
        else:
            print(*args, **kwargs)

    def all_gather(self, data: Any, group: Any = None, sync_grads: bool = False) -> Any:
        """Each tensor of ``data`` (a tensor or a dict/list of them) from every process, stacked
        along a new first dimension; on one process, ``data`` unchanged."""
        return all_gather(data, group=group, sync_grads=sync_grads)

    def freeze(self) -> "TrainModule":
        """No gradients for any parameter, and eval mode; returns the module (Lightning's)."""
        for p in self.parameters():
            p.requires_grad_(False)
        return self.eval()

    def unfreeze(self) -> "TrainModule":
        """Gradients for every parameter, and train mode; returns the module."""
        for p in self.parameters():
            p.requires_grad_(True)
        return self.train()

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
    def on_before_zero_grad(self, optimizer: torch.optim.Optimizer) -> None: ...
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

    # Lightning's mode hooks: eval() of trainer.model (the strategy's wrapper too) before an evaluation; after it,
    # each submodule's mode as it was (the loop puts them back) unless the model overrides the *_model_train hook.
    def on_validation_model_eval(self) -> None:
        self.trainer.model.eval()

    def on_validation_model_train(self) -> None:
        self.trainer.model.train()

    def on_test_model_eval(self) -> None:
        self.trainer.model.eval()

    def on_test_model_train(self) -> None:
        self.trainer.model.train()

    def on_predict_model_eval(self) -> None:
        self.trainer.model.eval()

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Add to (or change) the checkpoint about to be written; rank 0 only."""

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Read what ``on_save_checkpoint`` added, before the weights are loaded, when fit resumes."""

    @classmethod
    def load_from_checkpoint(
        cls, checkpoint_path: str | os.PathLike, map_location: Any = None, hparams_file: Any = None,
        strict: bool | None = None, weights_only: bool | None = None, **kwargs: Any,
    ) -> "TrainModule":
        """The model a checkpoint holds, in eval mode: built from the hyperparameters that
        ``save_hyperparameters()`` recorded (``kwargs`` replace or add some: those the checkpoint
        left out, such as a network passed to ``__init__``), then its ``on_load_checkpoint``,
        then its weights, loaded with ``weights_only=True`` (no code in the file runs;
        ``weights_only=False`` is accepted for a file you trust). ``strict`` (None: the model's
        ``strict_loading``) and ``map_location`` as in Lightning; a Lightning checkpoint loads too."""
        return CHECKPOINT_READER[0](cls, checkpoint_path, map_location, hparams_file, strict, weights_only, **kwargs)

    def to_torchscript(
        self, file_path: str | os.PathLike | None = None, method: str | None = "script", example_inputs: Any = None,
        **kwargs: Any,
    ) -> torch.jit.ScriptModule:
        """This module as a TorchScript ``ScriptModule`` in eval mode (``method="script"`` or ``"trace"`` on
        ``example_inputs`` or ``example_input_array``), saved to ``file_path`` if given (trainer/core/export)."""
        return to_torchscript(self, file_path, method, example_inputs, **kwargs)

    @property
    def strict_loading(self) -> bool:
        """Whether resuming (and ``load_from_checkpoint``) requires the checkpoint's keys to match
        the model's exactly (the default); set it False to load the keys that match."""
        return self.__dict__.get("_strict_loading") in (None, True)

    @strict_loading.setter
    def strict_loading(self, value: bool) -> None:
        self.__dict__["_strict_loading"] = value

    @property
    def trainer(self) -> "Trainer":
        if self._trainer is None and not JIT_ACTIVE[0]:
            raise RuntimeError(
                f"{type(self).__qualname__} is not attached to a `Trainer`. Call trainer.fit(model, ...) first."
            )
        return self._trainer

    @trainer.setter
    def trainer(self, trainer: "Trainer | None") -> None:
        """Lightning's: attach (or with None detach) this module and its TrainModule children."""
        for child in self.children():
            if isinstance(child, TrainModule):
                child.trainer = trainer
        self._trainer = trainer

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
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__
        return {**state, "_trainer": None, "_optimization": None}


def overridden(model: Any, name: str) -> bool:
    """Whether ``model`` (a TrainModule) defines its own ``name``: worked out once per run, so a
    Lightning override the model does not make costs nothing per step."""
    base = getattr(TrainModule, name, None)
    return isinstance(model, TrainModule) and base is not None and getattr(type(model), name, base) is not base
