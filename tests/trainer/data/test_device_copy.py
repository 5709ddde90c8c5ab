"""Batches copied to the GPU ahead, on a side stream: the same batches and weights as a
hand-written loop's ``.to("cuda")``; on the CPU the loop's batches pass through untouched."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from strategies import DataParallelStrategy, SingleDeviceStrategy, Strategy
from tests._models import Classifier, loader, quiet
from tests.conftest import requires_cuda
from trainer import Trainer
from trainer.data.device_copy import copied_ahead


class OwnMove(SingleDeviceStrategy):
    def batch_to_device(self, batch):
        return batch


def test_on_the_cpu_the_batches_pass_through_as_they_are():
    batches = iter([torch.zeros(2)])
    for strategy in (SingleDeviceStrategy("cpu"), Strategy()):
        assert strategy.device_batches(batches) is batches


@requires_cuda(1)
def test_a_strategy_that_moves_batches_its_own_way_gets_them_as_they_are():
    batches = iter([torch.zeros(2)])
    assert OwnMove("cuda:0").device_batches(batches) is batches
    dp = DataParallelStrategy(device_ids=[0, 0])
    dp.configure_devices("auto")  # its device_ids choose the devices
    assert dp.device_batches(batches) is batches  # split on the CPU, then scattered


@requires_cuda(1)
def test_copied_ahead_gives_the_same_batches_on_the_device_and_leaves_device_tensors_alone():
    device = torch.device("cuda", 0)
    on_gpu = torch.arange(3.0, device=device)
    pinned = torch.randn(4, 2).pin_memory()
    source = [(torch.randn(4, 2), {"y": torch.arange(4), "name": "a"}), [pinned, on_gpu], "no tensors"]
    got = list(copied_ahead(iter(source), device))
    assert len(got) == 3 and got[2] == "no tensors"
    (x, rest), (p, g) = got[0], got[1]
    assert x.device == device and torch.equal(x.cpu(), source[0][0])
    assert rest["y"].device == device and torch.equal(rest["y"].cpu(), torch.arange(4)) and rest["name"] == "a"
    assert torch.equal(p.cpu(), pinned) and g is on_gpu


@requires_cuda(1)
def test_many_batches_copied_ahead_while_the_gpu_is_busy_arrive_intact():
    # Each batch holds its index; a slow step (a large matmul) runs on the compute stream while
    # the next copy runs beside it. A batch whose memory were reused too early would show another index.
    device = torch.device("cuda", 0)
    big = torch.randn(2048, 2048, device=device)
    for i, batch in enumerate(copied_ahead((torch.full((256, 256), float(i)) for i in range(50)), device)):
        busy = big @ big  # queued on the compute stream, ahead of reading the batch
        assert batch.min().item() == batch.max().item() == float(i)
        del busy


@requires_cuda(1)
def test_training_on_a_gpu_matches_a_hand_written_loop_that_copies_each_batch():
    torch.manual_seed(0)
    model, by_hand = Classifier(), Classifier()
    by_hand.load_state_dict(model.state_dict())
    Trainer(max_epochs=2, devices=[0], **quiet()).fit(model, loader())

    device = torch.device("cuda", 0)
    by_hand.to(device)
    opt = by_hand.configure_optimizers()
    for _ in range(2):
        for x, y in loader():
            loss = nn.functional.cross_entropy(by_hand(x.to(device)), y.to(device))
            loss.backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(model.state_dict().values(), by_hand.state_dict().values()):
        assert torch.allclose(a.cpu(), b.cpu(), rtol=1e-5, atol=1e-6)


@requires_cuda(1)
def test_a_limited_evaluation_fetches_no_batch_past_its_limit_on_a_gpu():
    fetched = []

    class Counting(TensorDataset):
        def __getitem__(self, i):
            fetched.append(i)
            return super().__getitem__(i)

    data = Counting(torch.randn(40, 8), torch.randint(0, 2, (40,)))
    Trainer(devices=[0], limit_val_batches=2, **quiet()).validate(Classifier(), DataLoader(data, batch_size=4))
    assert sorted(fetched) == list(range(8))
