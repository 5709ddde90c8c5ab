"""Where a stage's loaders come from, and several evaluation loaders held as one.

A stage's data comes from exactly one place: the loaders passed to ``fit``/``validate``/...,
a :class:`DataModule`, or the model's own ``train_dataloader()`` (and friends). Validation,
test and predict take one loader, or several as a list, tuple or dict: :class:`Loaders`.
fit takes several too, combined into batches of each (:func:`train_combined`).
"""

from __future__ import annotations

import inspect
import math
import multiprocessing
import warnings
from typing import TYPE_CHECKING, Any, Callable, Iterator

import torch
from torch.utils.data import DataLoader, SequentialSampler

from trainer.data.batches import loader_length, rebuild_loader
from trainer.data.combined_loader import MODES, CombinedLoader, is_leaf
from trainer.core.datamodule import DataModule
from trainer.core.module import TrainModule

if TYPE_CHECKING:
    from strategies import Strategy


# The loader method that serves each stage, on a DataModule or on the model.
LOADER_METHOD = {
    "train": "train_dataloader", "validate": "val_dataloader", "test": "test_dataloader",
    "predict": "predict_dataloader",
}


def defines(owner: Any, method: str) -> bool:
    """Whether ``owner`` (a DataModule or a model) defines ``method`` itself."""
    base = DataModule if isinstance(owner, DataModule) else TrainModule
    on_instance = getattr(owner, "__dict__", {})
    if method in on_instance:  # set on the instance: a loader method (DataModule.from_datasets), or None to undefine it
        return callable(on_instance[method])
    own = getattr(type(owner), method, None)
    return callable(own) and own is not getattr(base, method, None)


def check_sources(stage: str, model: Any, given: dict[str, Any], datamodule: Any) -> None:
    """Before any process starts: the data comes from one place, and that place has it.

    ``given`` maps the argument names (``train_dataloaders``, ``val_dataloaders`` or
    ``dataloaders``) to what was passed.
    """
    passed = [name for name, value in given.items() if value is not None]
    if datamodule is not None:
        if not isinstance(datamodule, DataModule):
            raise TypeError(
                f"datamodule={datamodule!r:.80} must be a trainer.DataModule "
                "(subclass it and define its loader methods)."
            )
        if passed:
            raise ValueError(
                f"Both {' and '.join(passed)} and datamodule= were given: the data must come from one place. "
                f"Drop datamodule= to use the loaders, or drop {' and '.join(passed)} to use the DataModule's."
            )
    first = next(iter(given))
    if given[first] is not None:
        return
    method = LOADER_METHOD["train" if stage == "fit" else stage]
    owner = datamodule if datamodule is not None else model
    if not defines(owner, method):
        where = (
            f"the DataModule {type(datamodule).__name__} does not define {method}()" if datamodule is not None
            else f"no datamodule= was given and {type(model).__name__} does not define {method}()"
        )
        raise TypeError(  # Lightning's words, then ours
            f"An invalid dataloader was passed to `Trainer.{stage}({first}=...)`. Found None. Either pass the "
            f"dataloader to the `.{stage}()` method OR implement `def {method}(self):` in your "
            f"LightningModule/LightningDataModule. trainer.{stage}() has no data: {first}=None, and {where}."
        )


def prepare(strategy: Strategy, model: Any, datamodule: Any) -> None:
    """``prepare_data`` of the DataModule and the model: on each machine's local rank 0 (or
    global rank 0 with ``prepare_data_per_node=False``) while the other processes wait."""
    for owner in (datamodule, model):
        if owner is None or not defines(owner, "prepare_data"):
            continue
        per_node = getattr(owner, "prepare_data_per_node", True)
        if (strategy.local_rank if per_node else strategy.global_rank) == 0:
            owner.prepare_data()
        strategy.barrier()


def stage_loader(stage: str, given: Any, model: Any, datamodule: Any, *, checked: bool = False) -> Any:
    """The loader(s) for ``stage`` ("train", "validate", "test", "predict"): those given, else the
    DataModule's, else the model's; None if none of them has any. ``checked``: what a loader
    method returned is checked (:func:`check_loaders`), and an error names the method."""
    if given is not None:
        return given
    method = LOADER_METHOD[stage]
    owner = datamodule if datamodule is not None else model
    if not defines(owner, method):
        return None
    found = getattr(owner, method)()
    name, where = f"{type(owner).__name__}.{method}()", f"returned from `{type(owner).__name__}.{method}()`"
    if checked and stage == "train":
        check_train_loader(found, name=name, where=where, any_mode=True)  # sequential: refused once counted
    elif checked:
        check_loaders(found, name=name, where=where)
    return found


def is_several(loaders: Any) -> bool:
    """A list, tuple or dict of loaders (DataLoaders, or iterables that are not tensors or
    containers themselves): several loaders, not one loader that is a list of batches."""
    if isinstance(loaders, dict):
        items = list(loaders.values())
    elif type(loaders) in (list, tuple):
        items = list(loaders)
    else:
        return False
    return bool(items) and all(_one_loader(x) for x in items)


def _one_loader(x: Any) -> bool:
    """An iterable that is one loader: not a tensor nor a string, and a list, tuple or dict only
    when it holds numbers and strings alone (its items are the batches, as in Lightning)."""
    if isinstance(x, (list, tuple, dict)):
        return bool(x) and is_leaf(x)
    return hasattr(x, "__iter__") and not isinstance(x, (torch.Tensor, str, bytes))


def check_loaders(loaders: Any, *, name: str, where: str) -> None:
    """One loader or several, each checked (named by its index or key). ``name`` is the argument
    (``val_dataloaders``) or the method that made them; ``where`` says how they came, in
    Lightning's words ("passed to `Trainer.validate(dataloaders=...)`")."""
    if not is_several(loaders):
        check_loader(loaders, name=name, where=where)
        return
    for key, loader in (loaders.items() if isinstance(loaders, dict) else enumerate(loaders)):
        check_loader(loader, name=f"{name}[{key!r}]", where=where)


def train_combined(loader: Any, mode: str = "max_size_cycle") -> CombinedLoader | None:
    """fit's training data as a CombinedLoader: the one given, or several loaders (a dict, list
    or tuple of them, nested as deep as you like) combined in ``max_size_cycle`` mode, as
    Lightning's fit does (evaluation's nested ones: ``sequential``); None for one loader."""
    if isinstance(loader, CombinedLoader) or not isinstance(loader, (dict, list, tuple)):
        return loader if isinstance(loader, CombinedLoader) else None
    combined = CombinedLoader(loader, mode)
    if not combined.flattened or not all(_one_loader(x) for x in combined.flattened):
        return None  # one loader that is a list of batches
    return combined


def check_train_mode(combined: CombinedLoader) -> None:
    """``sequential`` is refused for training (Lightning's message): a training step takes a batch of every loader."""
    if combined.mode == "sequential":
        raise ValueError(
            '`FitLoop` does not support the `CombinedLoader(mode="sequential")` mode. The available modes are: '
            f"{[m for m in MODES if m != 'sequential']}. A training step takes a batch of every loader; to train on "
            "the loaders one after another, join their datasets into one loader (torch.utils.data.ConcatDataset)."
        )


def check_predict_mode(loader: Any) -> None:
    """Prediction keeps each loader's outputs apart: a CombinedLoader must be ``sequential`` (Lightning's message)."""
    if isinstance(loader, CombinedLoader) and loader.mode != "sequential":
        raise ValueError(
            '`trainer.predict()` only supports the `CombinedLoader(mode="sequential")` mode. '
            f"Got mode={loader.mode!r}: pass the loaders as a list or dict, "
            "or CombinedLoader(..., mode=\"sequential\")."
        )


def check_train_loader(
    loader: Any, *, name: str = "train_dataloaders", where: str = "passed to `Trainer.fit(train_dataloaders=...)`",
    any_mode: bool = False,
) -> None:
    """The training loader, or each of several (named by their place in the flattened
    collection); a sequential CombinedLoader is refused unless ``any_mode``."""
    combined = train_combined(loader)
    if combined is None:
        check_loader(loader, name=name, where=where)
        return
    if not any_mode:
        check_train_mode(combined)
    for i, one in enumerate(combined.flattened):
        check_loader(one, name=f"{name}[{i}]", where=where)


def check_loader(loader: Any, *, name: str, where: str) -> None:
    """One loader: iterable, with batches. A list, tuple or dict that is one loader of batches
    holds nothing that cannot be iterated, or Lightning would take it for loaders that are not."""
    leaves = CombinedLoader(loader).flattened if isinstance(loader, (dict, list, tuple)) else [loader]
    for leaf in leaves:
        # A str is iterable too: its "batches" would be characters.
        if not hasattr(leaf, "__iter__") or isinstance(leaf, (str, bytes, type)):
            what = "is not iterable" if leaf is loader else f"holds {leaf!r:.80}, which is not iterable"
            raise TypeError(
                f"An invalid dataloader was {where}. Found {leaf!r:.80}. {name}={loader!r:.80} {what}; pass a "
                "torch.utils.data.DataLoader, or a list or dict of them."
            )
    if loader_length(loader) == 0:
        raise ValueError(f"{name} is empty (len 0). Check the dataset size, batch_size and drop_last.")


class Loaders:
    """One evaluation loader, or several given as a list, tuple or dict, or a
    ``CombinedLoader(mode="sequential")``.

    With several (two or more), what ``self.log`` records in a step is kept apart per loader
    with Lightning's suffix ``/dataloader_idx_N`` (a dict's loaders are numbered in its order).
    Predictions come back as one list per loader (a dict's too, in its order), as in Lightning. A
    list or dict of one loader is one loader, as in Lightning: no suffix, no ``dataloader_idx``.
    A CombinedLoader in another mode is one loader whose batches hold a batch of each.
    """

    def __init__(self, given: Any) -> None:
        if isinstance(given, (dict, list, tuple)) and not is_several(given):  # nested: {"a": [loader, loader], ...}
            nested = train_combined(given, "sequential")
            given = nested if nested is not None and len(nested.flattened) > 1 else given
        self.combined = given if isinstance(given, CombinedLoader) and given.mode == "sequential" else None
        if self.combined is not None:
            self.kind, self.loaders = "list", list(self.combined.flattened)
            self.keys = list(range(len(self.loaders)))
            return
        several = is_several(given)
        self.kind = ("dict" if isinstance(given, dict) else "list") if several else "one"
        if self.kind == "dict":
            self.keys, self.loaders = list(given), list(given.values())
        elif self.kind == "list":
            self.keys, self.loaders = list(range(len(given))), list(given)
        else:
            self.keys, self.loaders = [0], [given]

    @property
    def several(self) -> bool:
        return len(self.loaders) > 1

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loaders)

    def __len__(self) -> int:
        return len(self.loaders)

    def _together(self) -> CombinedLoader | None:
        """A CombinedLoader in another mode than sequential: one loader whose batches hold a batch of each."""
        only = self.loaders[0] if len(self.loaders) == 1 else None
        return only if isinstance(only, CombinedLoader) and only.mode != "sequential" else None

    def each(self) -> list[Any]:
        """Every loader, those inside a CombinedLoader too."""
        together = self._together()
        return list(together.flattened) if together is not None else list(self.loaders)

    def counts(self, count: Callable[[int | None], int | float]) -> tuple[list[int | float], list[int | float]]:
        """(how many batches each loader runs, the counts Lightning publishes as ``num_val_batches``
        and friends), from ``count`` of a loader's length. A CombinedLoader in another mode than
        sequential runs as one loader, its length from each of its loaders' counts."""
        together = self._together()
        if together is None:
            runs = [count(n) for n in self.lengths()]
            return runs, runs
        together.limits = [count(loader_length(x)) for x in together.flattened]
        n = loader_length(together)
        return [math.inf if n is None else n], list(together.limits)

    def map(self, fn: Callable[[Any], Any]) -> "Loaders":
        together = self._together()
        if together is not None:  # its loaders, each prepared as one would be
            together.flattened = [fn(x) for x in together.flattened]
            return self
        out = Loaders.__new__(Loaders)
        out.kind, out.keys, out.loaders = self.kind, list(self.keys), [fn(x) for x in self.loaders]
        out.combined = self.combined
        if out.combined is not None and len(out.loaders) == len(out.combined.flattened):
            out.combined.flattened = list(out.loaders)  # as Lightning: the CombinedLoader holds the prepared loaders
        return out

    def suffix(self, i: int) -> str:
        return f"/dataloader_idx_{i}" if self.several else ""

    def pack(self, values: list[Any]) -> Any:
        """Per-loader ``values`` in the shape the loaders came in."""
        if self.kind == "one":
            return values[0]
        return dict(zip(self.keys, values)) if self.kind == "dict" else list(values)

    def as_given(self) -> Any:
        """The loader, or the list or dict of them (a CombinedLoader's collection)."""
        combined = self.combined if self.combined is not None else self._together()
        return combined.iterables if combined is not None else self.pack(self.loaders)

    def lengths(self) -> list[int | None]:
        return [loader_length(x) for x in self.loaders]


def check_dataloader_idx(model: Any, prefix: str, hooks: tuple[str, ...], several: bool) -> None:
    """Lightning's rule, checked before a stage's first batch: the steps and batch hooks get
    ``dataloader_idx`` exactly when there are several loaders, so with several each of the
    model's ``hooks`` must take it (by that name, or ``*args``), and with one it must not
    require it. ``prefix`` is ``val``, ``test`` or ``predict``."""
    for hook in hooks:
        fn = getattr(model, hook, None)
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):
            continue
        named = params.get("dataloader_idx")
        present = named is not None or any(p.kind is p.VAR_POSITIONAL for p in params.values())
        if several and not present:
            raise RuntimeError(
                f"You provided multiple `{prefix}_dataloader`, but no `dataloader_idx` argument in "
                f"`{type(model).__name__}.{hook}()`. Try adding `dataloader_idx=0` to its signature."
            )
        if not several and named is not None and named.default is inspect.Parameter.empty:
            raise RuntimeError(
                f"You provided only a single `{prefix}_dataloader`, but have included `dataloader_idx` in "
                f"`{type(model).__name__}.{hook}()`. Either remove the argument or give it a default value i.e. "
                "`dataloader_idx=0`."
            )


def warn_spawned_workers(loaders: list[Any], name: str) -> None:
    """Lightning's advice for a loader whose workers start by spawning (the ``spawn`` start
    method, e.g. under ``strategy="ddp_spawn"``): each epoch starts them anew, importing the
    script each time, unless they persist."""
    for loader in loaders:
        if not isinstance(loader, DataLoader) or loader.num_workers == 0 or loader.persistent_workers:
            continue
        context = loader.multiprocessing_context
        method = context.get_start_method() if context is not None else multiprocessing.get_start_method()
        if method == "spawn":
            warnings.warn(
                f"Consider setting `persistent_workers=True` in '{name}' to speed up the dataloader worker "
                f"initialization: its {loader.num_workers} worker(s) start by spawning, anew each epoch.",
                UserWarning, stacklevel=3,
            )
            return


def overfit_loader(loader: Any, prefix: str, n: int | float) -> Any:
    """``overfit_batches``, as Lightning 2 does it, for the training loader and each validation
    loader: every epoch trains and validates on the same first ``n`` batches of each (the limits
    are set to ``n``). A loader that shuffles, or samples otherwise, is rebuilt with a
    ``SequentialSampler``, with Lightning's warning."""
    return overfit_loaders([loader], prefix, n)[0]


def overfit_loaders(loaders: list[Any], prefix: str, n: int | float) -> list[Any]:
    """``overfit_batches`` for several loaders (fit's, combined): one warning for those that shuffle."""
    if all(isinstance(getattr(dl, "sampler", SequentialSampler([])), SequentialSampler) for dl in loaders):
        return loaders
    warnings.warn(
        f"You requested to overfit but enabled {prefix} dataloader shuffling. "
        f"We are turning off the {prefix} dataloader shuffling for you "
        f"(overfit_batches={n!r}: every epoch sees the same first batches).", UserWarning, stacklevel=3,
    )
    return [
        rebuild_loader(dl, sampler=SequentialSampler(dl.dataset)) if isinstance(dl, DataLoader) else dl
        for dl in loaders
    ]
