"""CombinedLoader: its four modes as Lightning documents them, and fit trained on several loaders
(a dict, list or nested collection of them, or a CombinedLoader), with validation's
``dataloader_idx`` names, ddp shards, overfit_batches and resume."""

from __future__ import annotations

import collections
import copy
import itertools
from typing import NamedTuple

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, RandomSampler, SequentialSampler, TensorDataset

from callbacks import Callback, ModelCheckpoint
from tests._models import Classifier, dataset, loader, quiet
from trainer import Trainer
from trainer.data import CombinedLoader
from trainer.data.fetch import batches


def _two() -> dict[str, DataLoader]:
    return {"a": DataLoader(range(6), batch_size=4), "b": DataLoader(range(15), batch_size=5)}


def _plain(batches) -> list:
    def plain(x):
        if isinstance(x, torch.Tensor):
            return x.tolist()
        if isinstance(x, dict):
            return {k: plain(v) for k, v in x.items()}
        return x
    return [(plain(b), i, d) for b, i, d in batches]


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("min_size", [({"a": [0, 1, 2, 3], "b": [0, 1, 2, 3, 4]}, 0, 0), ({"a": [4, 5], "b": [5, 6, 7, 8, 9]}, 1, 0)]),
        ("max_size_cycle", [
            ({"a": [0, 1, 2, 3], "b": [0, 1, 2, 3, 4]}, 0, 0), ({"a": [4, 5], "b": [5, 6, 7, 8, 9]}, 1, 0),
            ({"a": [0, 1, 2, 3], "b": [10, 11, 12, 13, 14]}, 2, 0),  # "a" started over
        ]),
        ("max_size", [
            ({"a": [0, 1, 2, 3], "b": [0, 1, 2, 3, 4]}, 0, 0), ({"a": [4, 5], "b": [5, 6, 7, 8, 9]}, 1, 0),
            ({"a": None, "b": [10, 11, 12, 13, 14]}, 2, 0),  # "a" is done
        ]),
        ("sequential", [
            ([0, 1, 2, 3], 0, 0), ([4, 5], 1, 0),
            ([0, 1, 2, 3, 4], 0, 1), ([5, 6, 7, 8, 9], 1, 1), ([10, 11, 12, 13, 14], 2, 1),
        ]),
    ],
)
def test_each_mode_gives_lightnings_batches_and_length(mode, expected):
    combined = CombinedLoader(_two(), mode)
    iter(combined)
    assert len(combined) == len(expected)
    assert _plain(combined) == expected
    assert _plain(combined) == expected  # a second pass is the same


def test_length_needs_iter_first_and_limits_cap_each_loader():
    combined = CombinedLoader(_two(), "sequential")
    with pytest.raises(RuntimeError, match=r"Please call `iter\(combined_loader\)` first"):
        len(combined)
    combined.limits = [1, 2]
    iter(combined)
    assert len(combined) == 3
    assert [(i, d) for _, i, d in combined] == [(0, 0), (0, 1), (1, 1)]
    combined.limits = 1  # one number for every loader
    assert combined.limits == [1, 1]
    with pytest.raises(ValueError, match=r"Mismatch in number of limits \(3\) and number of iterables \(2\)"):
        combined.limits = [1, 2, 3]


class Endless(IterableDataset):
    def __iter__(self):
        return itertools.count()


def test_an_unsized_loader_makes_it_unsized_and_the_longest_ends_a_cycle():
    unsized = CombinedLoader([DataLoader(Endless(), batch_size=2), DataLoader(range(4), batch_size=2)], "max_size")
    iter(unsized)
    with pytest.raises(TypeError, match="has no length"):
        len(unsized)
    combined = CombinedLoader(unsized.iterables, "min_size")  # the shortest has a length: so has the pass
    iter(combined)
    assert len(combined) == 2
    assert [b[1].tolist() for b, _, _ in combined] == [[0, 1], [2, 3]]
    mixed = CombinedLoader([DataLoader(range(3)), DataLoader(range(5))], "max_size_cycle")
    assert [[x.item() for x in b] for b, _, _ in mixed.__iter__()] == [[0, 0], [1, 1], [2, 2], [0, 3], [1, 4]]


def test_unknown_mode_is_refused_with_the_choices():
    choices = r"\['min_size', 'max_size_cycle', 'max_size', 'sequential'\]"
    with pytest.raises(ValueError, match=rf"Unsupported mode 'testtt', please select one of: {choices}"):
        CombinedLoader([range(10)], "testtt")


class Pair(NamedTuple):
    first: object
    second: object


def test_collections_keep_their_shape_and_lists_of_numbers_are_one_iterable():
    nested = CombinedLoader({"x": [DataLoader(range(2)), DataLoader(range(2))], "y": Pair(DataLoader(range(2)), [7, 8])})
    assert len(nested.flattened) == 4 and nested.flattened[3] == [7, 8]  # numbers only: one iterable of batches
    batch, _, _ = next(iter(nested))
    assert isinstance(batch["y"], Pair) and batch["y"].second == 7 and [x.item() for x in batch["x"]] == [0, 0]
    assert isinstance(nested.sampler["y"], Pair) and isinstance(nested.sampler["x"][0], SequentialSampler)
    assert nested.sampler["y"].second is None

    ordered = next(iter(CombinedLoader(collections.OrderedDict(b=range(2), a=range(2)))))[0]
    assert type(ordered) is collections.OrderedDict and list(ordered) == ["b", "a"]

    lists = CombinedLoader([[0], [[1], [[2]]]])
    with pytest.raises(ValueError, match=r"Mismatch in flattened length \(1\) and existing length \(3\)"):
        lists.flattened = [2]
    lists.flattened = [[3], [2], [1]]
    assert lists.iterables == [[3], [[2], [[1]]]]


def test_reset_ends_the_pass_and_the_next_starts_afresh():
    combined = CombinedLoader(_two(), "max_size_cycle")
    it = iter(combined)
    next(it)
    combined.reset()
    with pytest.raises(RuntimeError, match="first"):
        len(combined)
    assert len(list(iter(combined))) == 3


# --- fit ------------------------------------------------------------------------------------
class TwoHeads(Classifier):
    """Trains on a batch of each loader: the loss of both."""

    def training_step(self, batch, batch_idx):
        (xa, ya), (xb, yb) = batch["a"], batch["b"]
        return nn.functional.cross_entropy(self(xa), ya) + nn.functional.cross_entropy(self(xb), yb)


def test_fit_on_a_dict_of_loaders_cycles_the_shorter_one_like_a_hand_written_loop():
    torch.manual_seed(0)
    model = TwoHeads()
    reference = copy.deepcopy(model)
    a, b = loader(64, 16), DataLoader(dataset(24, seed=5), batch_size=16)  # 4 batches and 2
    trainer = Trainer(max_epochs=2, **quiet())
    trainer.fit(model, {"a": a, "b": b})
    assert trainer.num_training_batches == 4 and trainer.global_step == 8
    assert trainer.train_dataloader == {"a": a, "b": b}  # Lightning's: the collection given

    optimizer = reference.configure_optimizers()
    for _ in range(2):
        for batch_a, batch_b in zip(a, itertools.chain(b, b)):  # "b" starts over when it runs out
            optimizer.zero_grad()
            reference.training_step({"a": batch_a, "b": batch_b}, 0).backward()
            optimizer.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p, q)


class Shapes(Classifier):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list = []

    def training_step(self, batch, batch_idx):
        self.batches.append(batch)
        first = next(b for b in (batch if isinstance(batch, list) else batch["a_b"]) if b is not None)
        return super().training_step(first, batch_idx)


@pytest.mark.parametrize("mode, batches", [("min_size", 1), ("max_size_cycle", 4), ("max_size", 4)])
def test_fit_takes_a_combined_loader_in_any_mode_but_sequential(mode, batches):
    model = Shapes()
    collection = {"a_b": [loader(64, 16), loader(16, 16)], "c": loader(32, 16)}
    trainer = Trainer(max_epochs=1, **quiet())
    trainer.fit(model, CombinedLoader(collection, mode))
    assert trainer.num_training_batches == batches == len(model.batches)
    last = model.batches[-1]
    assert list(last) == ["a_b", "c"] and len(last["a_b"]) == 2
    assert (last["a_b"][1] is None) == (mode == "max_size")  # a finished loader gives None


def test_a_list_of_training_loaders_gives_a_list_of_batches_and_limits_apply_to_each():
    model = Shapes()
    trainer = Trainer(max_epochs=1, limit_train_batches=0.5, **quiet())
    trainer.fit(model, [loader(128, 16), loader(32, 16)])  # 8 and 2 batches: limits 4 and 1
    assert trainer.num_training_batches == 4 and len(model.batches) == 4
    assert all(isinstance(b, list) and len(b) == 2 for b in model.batches)


def test_sequential_is_refused_for_fit_with_lightnings_message():
    message = r'`FitLoop` does not support the `CombinedLoader\(mode="sequential"\)` mode\. The available modes are: ' \
              r"\['min_size', 'max_size_cycle', 'max_size'\]\. A training step takes a batch of every loader"
    sequential = CombinedLoader([loader(64, 16), loader(32, 16)], "sequential")
    with pytest.raises(ValueError, match=message):
        Trainer(max_epochs=1, **quiet()).fit(Shapes(), sequential)

    class FromHook(Shapes):
        def train_dataloader(self):
            return sequential

    trainer = Trainer(max_epochs=1, **quiet())
    with pytest.raises(ValueError, match=message):
        trainer.fit(FromHook())
    assert trainer.num_training_batches == 6  # Lightning's: counted before the refusal


def test_overfit_batches_puts_every_training_loader_in_order_with_one_warning():
    seen: list = []

    class Overfit(Shapes):
        def training_step(self, batch, batch_idx):
            seen.append([type(dl.sampler) for dl in self.trainer.train_dataloader])
            return super().training_step(batch, batch_idx)

    shuffled = [DataLoader(dataset(32), batch_size=16, sampler=RandomSampler(dataset(32))) for _ in range(2)]
    with pytest.warns(UserWarning, match="You requested to overfit but enabled train dataloader shuffling") as record:
        Trainer(max_epochs=1, overfit_batches=1.0, **quiet()).fit(Overfit(), shuffled)
    assert sum("overfit" in str(w.message) for w in record) == 1
    assert seen and all(kinds == [SequentialSampler, SequentialSampler] for kinds in seen)


def _shuffled(n: int, seed: int) -> DataLoader:
    data = dataset(n, seed=seed)
    return DataLoader(data, batch_size=8, shuffle=True)


def test_a_combined_fit_resumed_at_an_epochs_end_is_bit_exact_and_refused_mid_epoch(tmp_path):
    def fit(max_epochs: int, ckpt_path=None, **options) -> tuple[Classifier, Trainer]:
        torch.manual_seed(0)
        model = TwoHeads(dropout=0.3)
        trainer = Trainer(max_epochs=max_epochs, enable_progress_bar=False, log_dir=None, **options)
        trainer.fit(model, {"a": _shuffled(40, 1), "b": _shuffled(16, 2)}, ckpt_path=ckpt_path)
        return model, trainer

    straight, _ = fit(3, callbacks=[ModelCheckpoint(dirpath=tmp_path / "straight")])
    _, first = fit(1, callbacks=[ModelCheckpoint(dirpath=tmp_path / "resumed")])
    best = first.checkpoint_callback.best_model_path
    resumed, _ = fit(3, ckpt_path=best, callbacks=[ModelCheckpoint(dirpath=tmp_path / "r2")])
    for p, q in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(p, q)

    _, cut = fit(3, max_steps=7, callbacks=[ModelCheckpoint(dirpath=tmp_path / "cut", save_last=True)])  # 5 a epoch
    with pytest.raises(ValueError, match=r"Cannot resume mid-epoch \(after batch 2 of epoch 1\) a fit whose training data is "
                                         r"several loaders \(a CombinedLoader\)"):
        fit(3, ckpt_path=str(tmp_path / "cut" / "last.ckpt"), callbacks=[ModelCheckpoint(dirpath=tmp_path / "r3")])


def test_validation_loaders_in_a_dict_or_a_sequential_combined_loader_log_lightnings_names():
    model = Classifier()
    trainer = Trainer(max_epochs=1, **quiet())
    trainer.fit(model, loader(32), {"clean": loader(32, 16), "noisy": DataLoader(dataset(16, seed=9), batch_size=8)})
    assert {"val_loss/dataloader_idx_0", "val_loss/dataloader_idx_1"} <= set(trainer.callback_metrics)
    assert list(trainer.val_dataloaders) == ["clean", "noisy"]
    as_list = trainer.validate(model, [loader(32, 16), DataLoader(dataset(16, seed=9), batch_size=8)])
    sequential = CombinedLoader([loader(32, 16), DataLoader(dataset(16, seed=9), batch_size=8)], "sequential")
    combined = trainer.validate(model, sequential)
    assert combined == as_list and trainer.num_val_batches == [2, 2]
    nested = trainer.validate(model, {"a": [loader(32, 16), loader(16, 8)], "b": loader(8, 8)}, verbose=False)
    assert [sorted(r) for r in nested] == [[f"val_acc/dataloader_idx_{i}", f"val_loss/dataloader_idx_{i}"] for i in range(3)]
    assert trainer.num_val_batches == [2, 2, 1]  # flattened in order, as Lightning's sequential mode


def test_a_tensor_dataset_loader_inside_keeps_batched_fetching(monkeypatch):
    data = TensorDataset(torch.arange(12.0).reshape(6, 2))
    combined = CombinedLoader([DataLoader(data, batch_size=4), DataLoader(data, batch_size=2)], "max_size_cycle")
    expected = [[b[0].tolist() for b in step] for step, _, _ in iter(combined)]
    samples = []
    original = TensorDataset.__getitem__
    monkeypatch.setattr(TensorDataset, "__getitem__", lambda self, i: samples.append(i) or original(self, i))
    assert [[b[0].tolist() for b in step] for step in batches(combined)] == expected
    assert samples == []  # each batch in one indexing call, not a dataset[i] per sample


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("max_size_cycle", [{"a": 0, "b": 3}, {"a": 1, "b": 4}, {"a": 2, "b": 3}]),
        ("min_size", [{"a": 0, "b": 3}, {"a": 1, "b": 4}]),
        ("max_size", [{"a": 0, "b": 3}, {"a": 1, "b": 4}, {"a": 2, "b": None}]),
    ],
)
def test_evaluation_runs_a_combined_loader_in_another_mode_as_one_loader_of_combined_batches(mode, expected):
    seen: list = []

    class Together(Classifier):
        def validation_step(self, batch, batch_idx):  # no dataloader_idx: one loader
            seen.append(batch)

    trainer = Trainer(**quiet())
    trainer.validate(Together(), CombinedLoader({"a": [0, 1, 2], "b": [3, 4]}, mode), verbose=False)
    assert seen == expected
    assert trainer.num_val_batches == [3, 2]  # each of its loaders' count, as Lightning's
    assert trainer.num_sanity_val_batches == []  # the sanity check is fit's


# --- ddp: module level, so that the spawned workers can unpickle them -----------------------
def _indexed(n: int) -> DataLoader:
    """Sample i is (features, i): a batch says which samples it holds."""
    return DataLoader(TensorDataset(torch.randn(n, 8), torch.arange(n)), batch_size=4, shuffle=True)


class Pairs(Classifier):
    def training_step(self, batch, batch_idx):
        return self(batch["a"][0]).sum() + self(batch["b"][0]).sum()


class SeenPairs(Callback):
    """Each rank's (epoch, rank, loader, sample indices) per training batch, gathered to rank 0."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int, str, list[int]]] = []

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        for key in ("a", "b"):
            self.seen.append((trainer.current_epoch, trainer.global_rank, key, batch[key][1].tolist()))

    def on_train_end(self, trainer, module) -> None:
        self.seen = [s for part in trainer.strategy.gather_objects(self.seen) for s in part]

    def state_dict(self):
        return {"seen": self.seen}

    def load_state_dict(self, state_dict) -> None:
        self.seen = state_dict["seen"]


@pytest.mark.slow
def test_under_ddp_each_training_loader_is_sharded_and_shuffled_anew_each_epoch():
    seen = SeenPairs()
    trainer = Trainer(strategy="ddp", devices=2, max_epochs=2, callbacks=[seen], **quiet())
    trainer.fit(Pairs(), {"a": _indexed(32), "b": _indexed(16)})  # per rank: 16 samples (4 batches) and 8 (2)
    assert trainer.num_training_batches == 4
    for epoch in (0, 1):
        for key, n in (("a", 32), ("b", 16)):
            shards = {r: [i for e, q, k, b in seen.seen if (e, q, k) == (epoch, r, key) for i in b] for r in (0, 1)}
            if key == "b":  # started over once: each rank's shard twice, in the same order
                assert all(shard[:8] == shard[8:] for shard in shards.values())
                shards = {rank: shard[:8] for rank, shard in shards.items()}
            assert sorted(shards[0] + shards[1]) == list(range(n))  # disjoint halves, all of it
    order = {epoch: [i for e, r, k, b in seen.seen if (e, r, k) == (epoch, 0, "a") for i in b] for epoch in (0, 1)}
    assert order[0] != order[1]  # set_epoch reached each loader's DistributedSampler


def test_it_is_importable_where_lightning_users_look_for_it():
    import trainer
    import trainer.data.combined_loader

    assert trainer.CombinedLoader is CombinedLoader is trainer.data.combined_loader.CombinedLoader
    assert "CombinedLoader" in trainer.__all__


def test_predict_takes_a_sequential_combined_loader_only():
    trainer = Trainer(**quiet())
    model = Classifier()
    as_list = trainer.predict(model, [loader(16, 8), loader(8, 8)])
    combined = trainer.predict(model, CombinedLoader([loader(16, 8), loader(8, 8)], "sequential"))
    assert [len(p) for p in combined] == [2, 1]
    assert all(torch.equal(a, b) for got, want in zip(combined, as_list) for a, b in zip(got, want))
    with pytest.raises(ValueError, match=r'`trainer.predict\(\)` only supports the `CombinedLoader\(mode="sequential"\)` '
                                         r"mode. Got mode='min_size'"):
        trainer.predict(model, CombinedLoader([loader(16, 8), loader(8, 8)], "min_size"))
