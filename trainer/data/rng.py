"""RNG snapshots: every generator a step may draw from (Python's, numpy's, torch's, CUDA's) and
those that decide a loader's order (its generators, a DistributedSampler's seed and epoch),
taken and put back. Checkpoints record them; the sanity check and the Tuner put them back."""

from __future__ import annotations

import random
from typing import Any

import torch

from trainer.data.combined_loader import CombinedLoader


def rng_state() -> dict[str, Any]:
    """Every generator a step may draw from, in a form ``weights_only`` loads."""
    version, internal, gauss = random.getstate()
    try:
        import numpy as np
    except ImportError:
        np = None
    # The 625 words as one tensor, not 625 ints: torch.save calls back into Python per object.
    # Through numpy when it is there: 4x faster than torch.tensor(tuple), at every save.
    if np is None:
        words = torch.tensor(internal, dtype=torch.int64)
    else:
        words = torch.from_numpy(np.array(internal, dtype=np.int64))
    state: dict[str, Any] = {"python": [version, words, gauss], "torch": torch.get_rng_state()}
    if np is not None:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = [kind, torch.from_numpy(keys.astype("int64")), pos, has_gauss, cached]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, words, gauss = state["python"]
    random.setstate((version, tuple(words.tolist()), gauss))
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        try:
            import numpy as np
        except ImportError:
            pass
        else:
            kind, keys, pos, has_gauss, cached = state["numpy"]
            np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def loader_generators(loader: Any) -> list[torch.Generator]:
    """The generators that decide a DataLoader's order (each of a CombinedLoader's), besides the global one."""
    found: list[torch.Generator] = []
    if isinstance(loader, CombinedLoader):
        for one in loader.flattened:
            found += [g for g in loader_generators(one) if all(g is not f for f in found)]
        return found
    batch_sampler = getattr(loader, "batch_sampler", None)
    for owner in (loader, getattr(loader, "sampler", None), getattr(batch_sampler, "sampler", None)):
        gen = getattr(owner, "generator", None)
        if isinstance(gen, torch.Generator) and all(gen is not g for g in found):
            found.append(gen)
    return found


def generator_states(loader: Any) -> list[torch.Tensor]:
    return [g.get_state() for g in loader_generators(loader)] if loader is not None else []


def set_generator_states(loader: Any, states: list[torch.Tensor]) -> None:
    for gen, saved in zip(loader_generators(loader), states):
        gen.set_state(saved)


def seeded_sampler(loader: Any) -> Any:
    """The loader's sampler if it shuffles by ``seed + epoch`` (DistributedSampler does), else None."""
    sampler = getattr(loader, "sampler", None)
    return sampler if isinstance(getattr(sampler, "seed", None), int) and hasattr(sampler, "epoch") else None


def epoch_start_state(loader: Any) -> dict[str, Any]:
    """What re-creates an epoch's data order, taken just before ``iter(loader)``: the global
    torch RNG, the loader's generators, and a DistributedSampler's seed and epoch."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "generators": generator_states(loader)}
    sampler = seeded_sampler(loader)
    if sampler is not None:
        state["sampler"] = {"seed": sampler.seed, "epoch": sampler.epoch}
    return state


def set_epoch_start_state(loader: Any, state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    set_generator_states(loader, state["generators"])


def set_epoch(loader: Any, epoch: int) -> None:
    """``set_epoch(epoch)`` on whatever shuffles per epoch: the loader's sampler, its batch sampler
    (a DistributedSampler inside a user's own batch sampler, which DDP leaves alone) and that
    one's sampler; each of a CombinedLoader's loaders."""
    done: list[Any] = []
    for one in loader.flattened if isinstance(loader, CombinedLoader) else (loader,):
        batch_sampler = getattr(one, "batch_sampler", None)
        for owner in (getattr(one, "sampler", None), batch_sampler, getattr(batch_sampler, "sampler", None)):
            if hasattr(owner, "set_epoch") and all(owner is not d for d in done):  # once each (a loader's sampler
                owner.set_epoch(epoch)  # is its batch sampler's too)
                done.append(owner)


def check_resumable(loader: Any, batch: int, epoch: int) -> None:
    """A CombinedLoader resumes at an epoch's start only. Its shorter loaders start over
    mid-epoch, drawing their new order from the RNG as the training steps left it: skipping
    the consumed batches without those steps cannot draw the same order, so a mid-epoch
    resume is refused rather than made approximately."""
    if batch and isinstance(loader, CombinedLoader):
        raise ValueError(
            f"Cannot resume mid-epoch (after batch {batch} of epoch {epoch}) a fit whose training data is several "
            "loaders (a CombinedLoader): its position cannot be restored exactly, and an approximate resume would "
            "train on other batches than the interrupted run. Resume from a checkpoint saved at an epoch's end "
            "(ModelCheckpoint's default), or join the datasets into one loader (torch.utils.data.ConcatDataset), "
            "whose mid-epoch resume is exact."
        )


def loader_state(loader: Any) -> Any:
    """A Lightning ``Stateful`` loader's own position (``state_dict()``, which ``load_state_dict``
    takes back): None for any other loader, which a mid-epoch resume skips into instead."""
    return loader.state_dict() if stateful(loader) else None


def stateful(loader: Any) -> bool:
    """Whether ``loader`` has Lightning's ``Stateful`` interface (``state_dict``/``load_state_dict``)."""
    return callable(getattr(loader, "state_dict", None)) and callable(getattr(loader, "load_state_dict", None))
