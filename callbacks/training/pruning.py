"""ModelPruning: prune weights during training with ``torch.nn.utils.prune``, as Lightning's callback does."""

from __future__ import annotations

import copy
import inspect
import logging
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
from torch import nn

from trainer.core.distributed import rank_zero_only
from trainer.core.exceptions import misconfigured
from trainer.core.module import TrainModule

from ..base import Callback

if TYPE_CHECKING:
    from trainer import Trainer

log = logging.getLogger("trainer")

_NAMES = ("ln_structured", "l1_unstructured", "random_structured", "random_unstructured")
# torch.nn.utils.prune's function and its BasePruningMethod class, by name (the module is imported on first use)
_FUNCTION_AND_METHOD = {
    "ln_structured": ("ln_structured", "LnStructured"),
    "l1_unstructured": ("l1_unstructured", "L1Unstructured"),
    "random_structured": ("random_structured", "RandomStructured"),
    "random_unstructured": ("random_unstructured", "RandomUnstructured"),
}
# Modules that only hold others: their own weights, if any, are their children's (Lightning's list)
_CONTAINERS = (TrainModule, nn.Sequential, nn.ModuleList, nn.ModuleDict)


def _prune() -> Any:
    import torch.nn.utils.prune as prune  # on first use: `import callbacks` stays cheap

    return prune


class ModelPruning(Callback):
    """Prunes ``parameters_to_prune`` (pairs ``(module, "weight")``; all weights and biases of
    the model when empty) at the end of each training epoch (or of each validation with
    ``prune_on_train_epoch_end=False``), through ``torch.nn.utils.prune``.

    ``pruning_fn`` is one of ``"l1_unstructured"``, ``"random_unstructured"``,
    ``"ln_structured"`` (needs ``pruning_dim`` and ``pruning_norm``), ``"random_structured"``
    (needs ``pruning_dim``), or a ``BasePruningMethod`` subclass (global pruning only); with
    ``use_global_unstructured=False`` also a function ``fn(module, name=..., amount=...)``.
    ``use_global_unstructured`` ranks all the given parameters together
    (``prune.global_unstructured``) instead of each on its own.

    ``amount`` is a fraction (float) or a count (int) of the parameters to prune, or a function
    of the epoch that returns one; ``apply_pruning`` a bool or a function of the epoch (0 or
    False: no pruning that epoch). ``use_lottery_ticket_hypothesis`` (a bool or a function of
    the epoch) resets the weights that remain to their values when fit started (new random
    ones with ``resample_parameters``). ``make_pruning_permanent`` removes the masks when
    training ends, and every checkpoint saved meanwhile holds the pruned weights themselves
    (``weight``, not ``weight_orig`` and ``weight_mask``) so that it loads into the plain model.
    ``verbose=1`` logs the overall sparsity after each pruning to the ``"trainer"`` logger,
    ``verbose=2`` each parameter's too:
    ``Applied `L1Unstructured`. Pruned: 0/1088 (0.00%) -> 544/1088 (50.00%)``.
    """

    PARAMETER_NAMES = ("weight", "bias")

    def __init__(
        self,
        pruning_fn: Callable[..., Any] | str,
        parameters_to_prune: Sequence[tuple[nn.Module, str]] | None = (),
        parameter_names: list[str] | None = None,
        use_global_unstructured: bool = True,
        amount: int | float | Callable[[int], int | float] = 0.5,
        apply_pruning: bool | Callable[[int], bool] = True,
        make_pruning_permanent: bool = True,
        use_lottery_ticket_hypothesis: bool | Callable[[int], bool] = True,
        resample_parameters: bool = False,
        pruning_dim: int | None = None,
        pruning_norm: int | None = None,
        verbose: int = 0,
        prune_on_train_epoch_end: bool = True,
    ) -> None:
        self._use_global_unstructured = use_global_unstructured
        self._parameters_to_prune: Sequence[tuple[nn.Module, str]] = parameters_to_prune or ()
        self._use_lottery_ticket_hypothesis = use_lottery_ticket_hypothesis
        self._resample_parameters = resample_parameters
        self._prune_on_train_epoch_end = prune_on_train_epoch_end
        self._parameter_names = parameter_names or self.PARAMETER_NAMES
        self._global_kwargs: dict[str, Any] = {}
        self._original_layers: dict[int, dict[str, Any]] | None = None
        for name in self._parameter_names:
            if name not in self.PARAMETER_NAMES:
                raise misconfigured(
                    f"ModelPruning(parameter_names={parameter_names!r}): prune 'weight' and/or 'bias'.",
                    f"The provided `parameter_names` name: {name} isn't in {self.PARAMETER_NAMES}",
                )
        self.pruning_fn, self._pruning_method_name = self._resolve(pruning_fn, pruning_dim, pruning_norm)
        if use_global_unstructured and getattr(self.pruning_fn, "PRUNING_TYPE", None) != "unstructured":
            raise misconfigured(
                "Structured pruning ranks each parameter on its own: pass use_global_unstructured=False.",
                'Only the "unstructured" PRUNING_TYPE is supported with `use_global_unstructured=True`.'
                f" Found method {self.pruning_fn} of type {getattr(self.pruning_fn, 'PRUNING_TYPE', None)}.",
            )
        self._apply_pruning = apply_pruning
        self._make_pruning_permanent = make_pruning_permanent
        if isinstance(amount, bool) or not (isinstance(amount, (int, float)) or callable(amount)):
            raise misconfigured(
                f"ModelPruning(amount={amount!r}): give a fraction (0.3), a count (100) or a function of the epoch.",
                "`amount` should be provided and be either an int, a float or Callable function.",
            )
        self.amount = amount
        if verbose not in (0, 1, 2):
            raise misconfigured(
                f"ModelPruning(verbose={verbose!r}): 0 logs nothing, 1 the overall sparsity, 2 each parameter's too.",
                "`verbose` must be any of (0, 1, 2)",
            )
        self._verbose = verbose

    def _resolve(self, fn: Any, dim: int | None, norm: int | None) -> tuple[Any, str]:
        """(what prunes, its name in the log lines): a name becomes prune's class (global) or function."""
        if isinstance(fn, str):
            name = fn.lower()
            if name not in _NAMES:
                raise misconfigured(
                    f"ModelPruning(pruning_fn={fn!r}): valid names are {list(_NAMES)}.",
                    f"The provided `pruning_fn` {name} isn't available in PyTorch's built-in functions:"
                    f" {list(_NAMES)} ",
                )
            kwargs: dict[str, Any] = {}
            if name.endswith("_structured"):
                if dim is None:
                    raise misconfigured(
                        f"ModelPruning(pruning_fn={fn!r}) prunes whole slices: give pruning_dim "
                        "(e.g. 0, the output channels).",
                        "When requesting `structured` pruning, the `pruning_dim` should be provided.",
                    )
                if name == "ln_structured":
                    if norm is None:
                        raise misconfigured(
                            "Give pruning_norm (1 for L1, 2 for L2).",
                            "When requesting `ln_structured` pruning, the `pruning_norm` should be provided.",
                        )
                    kwargs["n"] = norm
                kwargs["dim"] = dim
            function, method = _FUNCTION_AND_METHOD[name]
            if self._use_global_unstructured:
                self._global_kwargs = kwargs
                pruner = getattr(_prune(), method)
                return pruner, pruner.__name__
            function_ = getattr(_prune(), function)
            return _Bound(function_, kwargs), function_.__name__
        if inspect.isclass(fn) and issubclass(fn, _prune().BasePruningMethod):
            if not self._use_global_unstructured:
                raise misconfigured(
                    "A BasePruningMethod prunes all the parameters together: pass use_global_unstructured=True.",
                    "PyTorch `BasePruningMethod` is currently only supported with `use_global_unstructured=True`.",
                )
            return fn, fn.__name__
        if callable(fn) and not inspect.isclass(fn) and not self._use_global_unstructured:
            return fn, getattr(fn, "__name__", type(fn).__name__)  # a function such as prune.l1_unstructured
        raise misconfigured(
            f"ModelPruning(pruning_fn={fn!r}): pass a name, a BasePruningMethod subclass (the class, not an "
            "instance) or, with use_global_unstructured=False, a function fn(module, name=..., amount=...).",
            f"`pruning_fn` is expected to be a str in {list(_NAMES)} or a PyTorch `BasePruningMethod`. Found: {fn}."
            " HINT: if passing a `BasePruningMethod`, pass the class, not an instance",
        )

    # --- what is pruned ------------------------------------------------------------------
    def filter_parameters_to_prune(
        self, parameters_to_prune: Sequence[tuple[nn.Module, str]] = ()
    ) -> Sequence[tuple[nn.Module, str]]:
        """Override to choose which of the parameters found are pruned (all, by default)."""
        return parameters_to_prune

    @staticmethod
    def sanitize_parameters_to_prune(
        pl_module: nn.Module,
        parameters_to_prune: Sequence[tuple[nn.Module, str]] | None = (),
        parameter_names: Sequence[str] = (),
    ) -> Sequence[tuple[nn.Module, str]]:
        """The pairs to prune: those given, checked against the model, or when none are given
        every ``(module, name)`` of the model whose ``name`` (of ``parameter_names``) is an
        ``nn.Parameter``, containers left out."""
        names = parameter_names or ModelPruning.PARAMETER_NAMES
        modules = [m for m in pl_module.modules() if not isinstance(m, _CONTAINERS)]
        if not parameters_to_prune:
            return [(m, p) for p in names for m in modules if isinstance(getattr(m, p, None), nn.Parameter)]
        pairs_ok = isinstance(parameters_to_prune, (list, tuple)) and all(
            isinstance(p, (list, tuple)) and len(p) == 2 and isinstance(p[0], nn.Module) and isinstance(p[1], str)
            for p in parameters_to_prune
        )
        if not pairs_ok:
            raise misconfigured(
                f"ModelPruning(parameters_to_prune={parameters_to_prune!r}): give pairs such as "
                "[(model.fc1, 'weight')].",
                "The provided `parameters_to_prune` should either be list of tuple"
                " with 2 elements: (nn.Module, parameter_name_to_prune) or None",
            )
        missing_modules = [m for m, _ in parameters_to_prune if not any(m is c for c in modules)]
        missing_parameters = [n for m, n in parameters_to_prune if any(m is c for c in modules) and not hasattr(m, n)]
        if missing_modules or missing_parameters:
            raise misconfigured(
                "Give modules of the model being trained, and names they have.",
                "Some provided `parameters_to_prune` don't exist in the model."
                f" Found missing modules: {missing_modules} and missing parameters: {missing_parameters}",
            )
        return parameters_to_prune

    def setup(self, trainer: Trainer, pl_module: TrainModule, stage: str) -> None:
        found = self.sanitize_parameters_to_prune(
            pl_module, self._parameters_to_prune, parameter_names=self._parameter_names
        )
        self._parameters_to_prune = self.filter_parameters_to_prune(found)
        if self._use_lottery_ticket_hypothesis:
            # the weights as fit found them, one copy per module, with the (index, name) pairs it holds
            self._original_layers = {}
            for i, (module, name) in enumerate(self._parameters_to_prune):
                entry = self._original_layers.setdefault(id(module), {"data": copy.deepcopy(module), "names": []})
                entry["names"].append((i, name))

    # --- pruning -------------------------------------------------------------------------
    def apply_pruning(self, amount: int | float) -> None:
        """Prunes ``amount`` of ``parameters_to_prune`` now (more, on top of what is pruned already)."""
        before = [_pruned(m, n) for m, n in self._parameters_to_prune] if self._verbose else []
        if self._use_global_unstructured:
            self._global_kwargs["amount"] = amount
            accepted = set(inspect.signature(self.pruning_fn).parameters) - {"self"}  # its apply()'s keywords
            kwargs = {k: v for k, v in self._global_kwargs.items() if k in accepted}
            _prune().global_unstructured(self._parameters_to_prune, pruning_method=self.pruning_fn, **kwargs)
        else:
            for module, name in self._parameters_to_prune:
                self.pruning_fn(module, name=name, amount=amount)
        if self._verbose:
            self._log_sparsity_stats(before, [_pruned(m, n) for m, n in self._parameters_to_prune], amount=amount)

    def apply_lottery_ticket_hypothesis(self) -> None:
        """Resets the weights left after pruning to their values when fit started (step 4 of
        the lottery ticket algorithm, https://arxiv.org/abs/1803.03635), or to new random ones
        with ``resample_parameters``."""
        if self._original_layers is None:
            return
        for entry in self._original_layers.values():
            original = entry["data"]
            if self._resample_parameters and callable(getattr(original, "reset_parameters", None)):
                original = copy.deepcopy(original)  # the first copy stays for the next reset
                original.reset_parameters()
            for i, name in entry["names"]:
                module = self._parameters_to_prune[i][0]
                # a pruned parameter lives on as `<name>_orig`, which the mask multiplies
                target = getattr(module, name + "_orig", None)
                target = getattr(module, name) if target is None else target
                source = getattr(original, name)
                if isinstance(target, torch.Tensor) and isinstance(source, torch.Tensor):
                    target.data = source.data.to(target.device)

    def make_pruning_permanent(self, module: nn.Module) -> None:
        """Removes the pruning reparametrization from every submodule: ``weight`` becomes a
        plain parameter again, holding the pruned values."""
        method = _prune().BasePruningMethod
        for _, sub in module.named_modules():
            for key, hook in list(sub._forward_pre_hooks.items()):
                if isinstance(hook, method):
                    hook.remove(sub)
                    del sub._forward_pre_hooks[key]

    def _run_pruning(self, epoch: int) -> None:
        prune = self._apply_pruning(epoch) if callable(self._apply_pruning) else self._apply_pruning
        amount = self.amount(epoch) if callable(self.amount) else self.amount
        if not prune or not amount:
            return
        self.apply_pruning(amount)
        lottery = self._use_lottery_ticket_hypothesis
        if lottery(epoch) if callable(lottery) else lottery:
            self.apply_lottery_ticket_hypothesis()

    @rank_zero_only
    def _log_sparsity_stats(
        self, before: list[tuple[int, int]], after: list[tuple[int, int]], amount: int | float = 0
    ) -> None:
        total = sum(size for _, size in after)
        zeros_before, zeros_after = sum(z for z, _ in before), sum(z for z, _ in after)
        log.info(
            f"Applied `{self._pruning_method_name}`. Pruned: {zeros_before}/{total} ({zeros_before / total:.2%}) -> "
            f"{zeros_after}/{total} ({zeros_after / total:.2%})"
        )
        if self._verbose == 2:
            for (module, name), (z0, n0), (z1, n1) in zip(self._parameters_to_prune, before, after):
                log.info(
                    f"Applied `{self._pruning_method_name}` to `{module!r}.{name}` with amount={amount}. Pruned: "
                    f"{z0} ({z0 / n0:.2%}) -> {z1} ({z1 / n1:.2%})"
                )

    # --- hooks ---------------------------------------------------------------------------
    def on_train_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self._prune_on_train_epoch_end:
            self._run_pruning(pl_module.current_epoch)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if not trainer.sanity_checking and not self._prune_on_train_epoch_end:
            self._run_pruning(pl_module.current_epoch)

    def on_train_end(self, trainer: Trainer, pl_module: TrainModule) -> None:
        if self._make_pruning_permanent:
            self.make_pruning_permanent(pl_module)

    def on_save_checkpoint(self, trainer: Trainer, pl_module: TrainModule, checkpoint: dict[str, Any]) -> None:
        if self._make_pruning_permanent:
            # the saved weights are the pruned ones; the model keeps its masks and trains on
            checkpoint["state_dict"] = _permanent_state_dict(pl_module)


class _Bound:
    """A prune function with its ``dim``/``n`` fixed (a class, not a lambda: it pickles to spawned workers)."""

    def __init__(self, function: Callable[..., Any], kwargs: dict[str, Any]) -> None:
        self.function, self.kwargs = function, kwargs

    def __call__(self, module: nn.Module, name: str, amount: int | float) -> Any:
        return self.function(module, name=name, amount=amount, **self.kwargs)


def _pruned(module: nn.Module, name: str) -> tuple[int, int]:
    """(zeros in the mask, its size); (0, 1) for a parameter not pruned yet (Lightning's count)."""
    mask = getattr(module, f"{name}_mask", None)
    if mask is None:
        return 0, 1
    return int((mask == 0).sum().item()), mask.numel()


def _permanent_state_dict(module: nn.Module) -> dict[str, Any]:
    """The module's state dict with each ``<name>_orig``/``<name>_mask`` pair made ``<name>``, on the CPU."""
    state = module.state_dict()
    for name in [k[: -len("_mask")] for k in state if k.endswith("_mask")]:
        orig, mask = state.pop(name + "_orig"), state.pop(name + "_mask")
        state[name] = mask.to(dtype=orig.dtype) * orig
    return {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
