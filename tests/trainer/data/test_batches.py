"""Moving and measuring nested batches; skipping consumed batches without loading them."""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass

import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, IterableDataset, SequentialSampler

from trainer.data.batches import SkipBatches, apply_to_tensors, batch_size, move_to_device, rebuild_loader, uniform_batches


@dataclass
class Pair:
    image: torch.Tensor
    label: torch.Tensor
    name: str = "x"


Point = namedtuple("Point", "x y")


def test_apply_to_tensors_keeps_every_container_type():
    batch = {"a": [torch.ones(2), (torch.zeros(2), "keep")], "b": Pair(torch.ones(3), torch.zeros(3)), "c": Point(torch.ones(1), 5)}
    out = apply_to_tensors(batch, lambda t: t + 1)
    assert isinstance(out["a"], list) and isinstance(out["a"][1], tuple)
    assert torch.equal(out["a"][0], torch.full((2,), 2.0)) and out["a"][1][1] == "keep"
    assert isinstance(out["b"], Pair) and torch.equal(out["b"].label, torch.ones(3)) and out["b"].name == "x"
    assert isinstance(out["c"], Point) and out["c"].y == 5


def test_move_to_device_moves_nested_tensors():
    moved = move_to_device({"x": [torch.ones(2)], "p": Pair(torch.ones(1), torch.ones(1))}, torch.device("cpu"))
    assert moved["x"][0].device.type == "cpu" and moved["p"].image.device.type == "cpu"


def test_batch_size_finds_the_first_tensor():
    assert batch_size((torch.ones(5, 3), torch.ones(5))) == 5
    assert batch_size({"ids": torch.ones(7, 2)}) == 7
    assert batch_size(Pair(torch.ones(4, 1), torch.ones(4))) == 4
    assert batch_size(["no tensors"]) == 1
    # A CombinedLoader(mode="max_size") batch whose first loader has finished: the next loader's batch counts.
    assert batch_size({"a": None, "b": [torch.ones(3, 2)]}) == batch_size([None, torch.ones(3)]) == 3


class CountingDataset(Dataset):
    def __init__(self, n: int) -> None:
        self.n, self.loaded = n, []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        self.loaded.append(i)
        return i


def test_skip_batches_never_loads_the_skipped_data():
    ds = CountingDataset(10)
    sampler = SkipBatches(BatchSampler(SequentialSampler(ds), batch_size=3, drop_last=False), skip=2)
    batches = [b.tolist() for b in DataLoader(ds, batch_sampler=sampler)]
    assert batches == [[6, 7, 8], [9]]
    assert ds.loaded == [6, 7, 8, 9]
    assert len(sampler) == 2


def test_rebuild_loader_keeps_the_settings():
    g = torch.Generator()
    loader = DataLoader(CountingDataset(8), batch_size=4, shuffle=True, drop_last=True, generator=g, collate_fn=list)
    rebuilt = rebuild_loader(loader, sampler=SequentialSampler(range(8)))
    assert rebuilt.batch_size == 4 and rebuilt.drop_last and rebuilt.generator is g and rebuilt.collate_fn is list
    assert list(rebuilt) == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_a_cpu_batch_bound_for_the_cpu_is_passed_through_unchanged():
    x, y = torch.randn(4, 3), torch.arange(4)
    for batch in ([x, y], (x, y), {"x": x, "meta": {"ids": [1, 2], "name": "a"}}, x):
        assert move_to_device(batch, torch.device("cpu")) is batch


def test_batch_size_is_the_first_non_empty_leading_dimension():
    assert batch_size([torch.randn(5, 3), torch.arange(5)]) == 5
    assert batch_size((torch.empty(0, 3), torch.arange(7))) == 7
    assert batch_size([torch.tensor(1.0), torch.arange(2)]) == 1  # a 0-d tensor counts as one
    assert batch_size({"x": [torch.randn(6, 2)]}) == 6
    assert batch_size(["text", 3]) == 1


class Stream(IterableDataset):
    def __iter__(self):
        return iter(torch.arange(10))


def test_a_dataloaders_batch_sizes_are_known_from_its_sampler_and_others_are_not():
    data = torch.arange(10)
    # (size, size of the last batch, index of the last batch)
    assert uniform_batches(DataLoader(data, batch_size=4)) == (4, 2, 2)
    assert uniform_batches(DataLoader(data, batch_size=4, drop_last=True)) == (4, 4, 1)
    assert uniform_batches(DataLoader(data, batch_size=5)) == (5, 5, 1)
    # The batch sizes of these depend on what they yield: they are measured batch by batch.
    assert uniform_batches(DataLoader(data, batch_sampler=[[0, 1], [2, 3, 4]])) is None
    assert uniform_batches(DataLoader(data, batch_size=None)) is None
    assert uniform_batches(DataLoader(Stream(), batch_size=4)) is None
    assert uniform_batches([(data[:4],), (data[4:],)]) is None
    # A collate function of one's own may pack or split samples: measured too.
    assert uniform_batches(DataLoader(data, batch_size=4, collate_fn=lambda items: torch.stack(items))) is None
