"""Batched fetching gives the loader's own batches, element for element, with the same random
draws; and every loader it does not apply to is iterated as it is."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, TensorDataset, default_collate, random_split

from tests._models import Classifier, quiet
from tests.conftest import requires_cuda
from trainer import Trainer
from trainer.data.pipeline import skip as _skip
from trainer.data.fetch import Fetching, batch_fetcher, batches

DATA = TensorDataset(torch.randn(50, 3, dtype=torch.float64), torch.randint(0, 5, (50,)))


def _assert_same(make, skip: int = 0):
    """The batches (and the RNG after the epoch) of ``make()``'s loader, iterated by torch and by us."""
    torch.manual_seed(3)
    expected = list(make())[skip:]
    rng_after = torch.get_rng_state()
    torch.manual_seed(3)
    loader = make()
    assert batch_fetcher(loader) is not None, "the batched path should apply"
    got = list(_skip(loader, skip) if skip else batches(loader))
    assert torch.equal(torch.get_rng_state(), rng_after)
    assert len(got) == len(expected) and len(got) > 0
    for ours, theirs in zip(got, expected):
        assert type(ours) is type(theirs) and len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("make", [
    lambda: DataLoader(DATA, batch_size=8),
    lambda: DataLoader(DATA, batch_size=8, shuffle=True),
    lambda: DataLoader(DATA, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(1), drop_last=True),
    lambda: DataLoader(random_split(DATA, [30, 20], generator=torch.Generator().manual_seed(0))[1], batch_size=7, shuffle=True),
    lambda: DataLoader(DATA, batch_size=8, sampler=DistributedSampler(DATA, num_replicas=2, rank=1, shuffle=True, seed=4)),
    # indexing counts a negative index from the end, as dataset[i] does; index_select refuses it
    lambda: DataLoader(DATA, batch_size=4, sampler=[-1, 3, -50, 7, 0, -2]),
    lambda: DataLoader(torch.utils.data.Subset(DATA, [-1, 4, -3, 2, 9]), batch_size=2),
    lambda: DataLoader(TensorDataset(torch.randn(12, 3, 4, 4).to(memory_format=torch.channels_last)), batch_size=5, shuffle=True),
], ids=["sequential", "random", "generator-drop-last", "random-split-subset", "distributed-sampler",
        "negative-indices", "subset-negative-indices", "channels-last"])
def test_batched_fetching_gives_the_loaders_own_batches(make):
    _assert_same(make)


def test_a_resumed_epoch_skips_at_the_sampler_and_fetches_the_rest_batched():
    _assert_same(lambda: DataLoader(DATA, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(2)), skip=3)


class WithGetItems(Dataset):
    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i):
        return torch.tensor([float(i)]), i

    def __getitems__(self, indices):
        self.calls.append(list(indices))
        return [self[i] for i in indices]


def test_a_dataset_with_getitems_gets_each_batchs_indices_once():
    data = WithGetItems()
    got = list(batches(DataLoader(data, batch_size=4)))
    assert data.calls == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    expected = list(DataLoader(data, batch_size=4))
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(got, expected))


class Plain(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i):
        return torch.tensor([float(i)])


class OwnGetItem(TensorDataset):
    def __getitem__(self, i):
        return tuple(2 * t[i] for t in self.tensors)


class OwnLoader(DataLoader):
    pass


@pytest.mark.parametrize("loader", [
    DataLoader(DATA, batch_size=8, num_workers=1),
    DataLoader(DATA, batch_size=8, collate_fn=lambda samples: default_collate(samples)),
    DataLoader(Plain(), batch_size=4),
    DataLoader(OwnGetItem(torch.arange(8.0)), batch_size=4),
    DataLoader(DATA, batch_size=None),
    OwnLoader(DATA, batch_size=8),
    [torch.zeros(2)],
], ids=["workers", "custom-collate", "no-batched-access", "own-getitem", "no-auto-batching", "loader-subclass", "a-list"])
def test_loaders_it_does_not_apply_to_are_iterated_as_they_are(loader):
    assert batch_fetcher(loader) is None
    assert type(batches(loader)) is type(iter(loader))


def _train(batched: bool) -> Classifier:
    torch.manual_seed(0)
    model = Classifier(features=3, classes=5, dropout=0.3)
    model.double()
    loader = DataLoader(DATA, batch_size=8, shuffle=True)
    Trainer(**quiet(max_epochs=3, batched_fetching=batched)).fit(model, loader, DataLoader(DATA, batch_size=16))
    return model


def test_training_gives_the_same_weights_either_way_and_the_option_turns_it_off(monkeypatch):
    batched = _train(True)
    reads: list[int] = []
    original = TensorDataset.__getitem__
    monkeypatch.setattr(TensorDataset, "__getitem__", lambda self, i: reads.append(i) or original(self, i))
    plain = _train(False)
    assert len(reads) == 3 * 50 + 2 * 16 + 3 * 50  # training, the sanity check (2 batches, no more), each validation
    reads.clear()
    again = _train(True)
    assert reads == []  # batched: no per-sample reads
    for a, b, c in zip(batched.state_dict().values(), plain.state_dict().values(), again.state_dict().values()):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_a_loader_with_its_own_generator_trains_as_a_hand_written_loop_over_epochs():
    """A RandomSampler draws once more from its generator when a pass runs to its end; a loop
    that stopped short of that would shuffle the next epoch differently."""
    def make_loader():
        return DataLoader(DATA, batch_size=10, shuffle=True, generator=torch.Generator().manual_seed(5))

    torch.manual_seed(0)
    model = Classifier(features=3, classes=5).double()
    by_hand = Classifier(features=3, classes=5).double()
    by_hand.load_state_dict(model.state_dict())
    optimizer = by_hand.configure_optimizers()
    loader = make_loader()
    for _ in range(3):
        for x, y in loader:
            torch.nn.functional.cross_entropy(by_hand(x), y).backward()
            optimizer.step()
            optimizer.zero_grad()
    Trainer(**quiet(max_epochs=3)).fit(model, make_loader())
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), by_hand.state_dict().values()))


# --- Trainer(data_on_device=True): the dataset's tensors copied once, indexed on the device ----
# The path runs on any device; the Trainer takes it only on a GPU. Here it is checked on the CPU.
@pytest.mark.parametrize("make", [
    lambda: DataLoader(DATA, batch_size=8, shuffle=True),
    lambda: DataLoader(DATA, batch_size=4, sampler=[-1, 3, -50, 7, 0, -2]),
    lambda: DataLoader(random_split(DATA, [30, 20], generator=torch.Generator().manual_seed(0))[1], batch_size=7, shuffle=True),
    lambda: DataLoader(torch.utils.data.Subset(DATA, [-1, 4, -3, 2, 9]), batch_size=2),
], ids=["random", "negative-indices", "random-split-subset", "subset-negative-indices"])
def test_on_device_fetching_gives_the_loaders_own_batches_from_one_copy_per_stage(make):
    fetching = Fetching(device=torch.device("cpu"))
    torch.manual_seed(3)
    reference = make()
    expected = [list(reference) for _ in range(2)]
    torch.manual_seed(3)
    loader = make()
    got, copies = [], []
    for _ in range(2):  # two epochs of one stage: the tensors are copied at the first only
        got.append(list(batches(loader, fetching)))
        copies.append({key: [id(t) for t in tensors] for key, (_, tensors) in fetching._copies.items()})
    assert copies[0] == copies[1]
    for epoch, expected_epoch in zip(got, expected):
        assert len(epoch) == len(expected_epoch)
        for ours, theirs in zip(epoch, expected_epoch):
            assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(ours, theirs))
    assert len(fetching._copies) == len({id(loader.dataset), id(getattr(loader.dataset, "dataset", loader.dataset))})


def test_on_device_fetching_refuses_an_index_out_of_range_with_an_index_error():
    loader = DataLoader(DATA, batch_size=2, sampler=[0, 50])
    with pytest.raises(IndexError, match="index 50 is out of range for a dataset of 50 samples"):
        list(batches(loader, Fetching(device=torch.device("cpu"))))


def test_a_loader_that_cannot_stay_on_the_device_is_used_as_it_is_with_one_warning():
    loader = DataLoader(DATA, batch_size=8, collate_fn=lambda b: default_collate(b))
    fetching = Fetching(device=torch.device("cpu"))
    with pytest.warns(UserWarning, match=r"data_on_device=True\) .* TensorDataset does not qualify"):
        first = list(batches(loader, fetching))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(list(batches(loader, fetching))) == len(first) == 7  # the next epoch: no second warning


def test_data_on_device_needs_batched_fetching_and_on_the_cpu_changes_nothing():
    with pytest.raises(ValueError, match=r"data_on_device=True .* needs batched_fetching=True"):
        Trainer(data_on_device=True, batched_fetching=False)
    torch.manual_seed(0)
    a, b = Classifier(features=3, classes=5), Classifier(features=3, classes=5)
    b.load_state_dict(a.state_dict())
    for model, on_device in ((a, False), (b, True)):
        model.double()
        Trainer(**quiet(max_epochs=2, data_on_device=on_device)).fit(model, DataLoader(DATA, batch_size=8))
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))


@requires_cuda(1)
def test_data_on_device_on_a_gpu_trains_as_copying_each_batch_does():
    models = []
    for on_device in (False, True):
        torch.manual_seed(0)
        model = Classifier(features=3, classes=5)
        model.double()
        Trainer(**quiet(max_epochs=2, devices=[0], data_on_device=on_device)).fit(
            model, DataLoader(DATA, batch_size=8, shuffle=True), DataLoader(DATA, batch_size=16))
        models.append(model)
    for x, y in zip(models[0].state_dict().values(), models[1].state_dict().values()):
        assert torch.allclose(x.cpu(), y.cpu(), rtol=1e-9, atol=1e-12)


# --- reading ahead: a chunk of small batches fetched at once ------------------------------
def _generator_states(batches_iter, generator):
    """Each batch, with the loader generator's state right after it was taken."""
    return [(batch, generator.get_state()) for batch in batches_iter]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n", [48, 50])  # the last batch full, or short
def test_reading_ahead_gives_the_same_batches_and_the_same_generator_state_after_each_one(n, drop_last):
    data = TensorDataset(torch.randn(n, 3), torch.arange(n))

    def make():
        return DataLoader(data, batch_size=4, shuffle=True, drop_last=drop_last, generator=torch.Generator().manual_seed(5))

    theirs_loader, ours_loader = make(), make()
    assert batch_fetcher(ours_loader).ahead == (64, len(ours_loader)), "the epoch should be read ahead"
    for _ in range(3):  # the next epoch's order comes from the state the last one left
        theirs = _generator_states(iter(theirs_loader), theirs_loader.generator)
        ours = _generator_states(batches(ours_loader), ours_loader.generator)
        assert len(ours) == len(theirs) == len(theirs_loader)
        for (a, state_a), (b, state_b) in zip(ours, theirs):
            assert all(torch.equal(x, y) for x, y in zip(a, b))
            # a checkpoint taken after any batch records what it would without reading ahead
            assert torch.equal(state_a, state_b)


def test_a_dataset_changed_in_place_mid_epoch_gives_its_new_rows_to_the_batches_after():
    x = torch.arange(40.0).unsqueeze(1)
    loader = DataLoader(TensorDataset(x, torch.arange(40)), batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(1))
    assert batch_fetcher(loader).ahead[0] > 1
    seen = []
    for i, (rows, index) in enumerate(batches(loader)):
        seen.append((rows.clone(), index))
        if i == 2:
            x.mul_(-1)  # e.g. a callback relabelling the data
    for i, (rows, index) in enumerate(seen):
        sign = 1 if i <= 2 else -1
        assert torch.equal(rows.squeeze(1), sign * index.float()), i


@pytest.mark.parametrize("sampler_options", [
    dict(shuffle=True, generator=torch.Generator(), batch_size=4),  # read ahead: the reference
    dict(sampler=torch.utils.data.RandomSampler(DATA, replacement=True), batch_size=4),
    dict(sampler=torch.utils.data.RandomSampler(DATA, num_samples=120), batch_size=4),
    dict(sampler=list(range(50)), batch_size=4),
    dict(batch_size=2_000_000 // (3 * 8)),  # a batch of 2 MB: one at a time
], ids=["random", "with-replacement", "more-samples-than-data", "user-sampler", "large-batches"])
def test_samplers_that_may_draw_mid_epoch_and_large_batches_are_fetched_one_batch_at_a_time(sampler_options):
    loader = DataLoader(DATA, **sampler_options)
    ahead, _ = batch_fetcher(loader).ahead
    assert (ahead > 1) == ("shuffle" in sampler_options)
    runs = []
    for iterate in (iter, batches):
        torch.manual_seed(0)
        if loader.generator is not None:
            loader.generator.manual_seed(7)
        runs.append(list(iterate(loader)))
    theirs, ours = runs
    assert len(ours) == len(theirs) and all(torch.equal(a[0], b[0]) for a, b in zip(ours, theirs))
