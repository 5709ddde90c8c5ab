"""The benchmark's workloads and the hand-written loops the Trainer is measured against.

torch only: the raw loops must not import the trainer, so that a raw child process's peak
RSS is what a hand-written script costs.
"""

from __future__ import annotations

import gc
import io
import os
import time
from dataclasses import dataclass, replace
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

SEED = 0
CLOCK: Callable[[], float] = time.perf_counter  # the single-process step clock; --clock cpu swaps it
LOG_EVERY = 50  # the Trainer's default log_every_n_steps; the raw loop reads the loss as often


class ParityNet(nn.Module):
    """The network of Lightning's parity benchmark (its ``ParityModuleRNN``): an LSTM(10 -> hidden)
    and a Linear(hidden -> 5) on every time step's output."""

    def __init__(self, hidden: int = 20) -> None:
        super().__init__()
        self.rnn = nn.LSTM(10, hidden, batch_first=True)
        self.linear_out = nn.Linear(hidden, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq, _ = self.rnn(x)
        return self.linear_out(seq)


@dataclass(frozen=True)
class Workload:
    """A model, its data, loss and optimizer. "mlp" and "conv": cross-entropy on 10 classes,
    SGD with momentum; "lstm": Lightning's parity workload, MSE and Adam."""

    name: str
    kind: str  # "mlp", "conv" or "lstm"
    hidden: int  # MLP width, the conv net's first channel count, or the LSTM's hidden size
    batch_size: int
    steps: int  # optimizer steps per epoch
    reps: int  # timed reps of each side, interleaved
    epochs: int = 1  # epochs per rep

    @property
    def label(self) -> str:
        if self.kind == "mlp":
            return f"{self.name} MLP (hidden {self.hidden}, batch {self.batch_size})"
        if self.kind == "lstm":
            return f"{self.name} (LSTM 10->{self.hidden}->5, batch {self.batch_size}, {self.epochs} epochs)"
        return f"{self.name} net (2 conv + linear, 3x32x32, batch {self.batch_size})"

    @property
    def loss_fn(self) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        return F.mse_loss if self.kind == "lstm" else F.cross_entropy

    def make_optimizer(self, params: Any) -> torch.optim.Optimizer:
        if self.kind == "lstm":
            return torch.optim.Adam(params, lr=0.02)
        return torch.optim.SGD(params, lr=0.01, momentum=0.9)

    def make_net(self) -> nn.Module:
        if self.kind == "lstm":
            return ParityNet(self.hidden)
        if self.kind == "mlp":
            h = self.hidden
            return nn.Sequential(nn.Linear(32, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 10))
        c = self.hidden
        return nn.Sequential(
            nn.Conv2d(3, c, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c, 2 * c, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(2 * c * 8 * 8, 10),
        )

    def make_dataset(self, world_size: int = 1) -> TensorDataset:
        """Exactly ``steps`` batches per process."""
        n = self.steps * self.batch_size * world_size
        g = torch.Generator().manual_seed(SEED + 1)
        if self.kind == "lstm":  # Lightning's AverageDataset: the input's two halves added, one rolled
            x = torch.randn(n, 100, 10, generator=g)
            top, bottom = x.chunk(2, -1)
            return TensorDataset(x, top + bottom.roll(shifts=1, dims=-1))
        shape = (n, 32) if self.kind == "mlp" else (n, 3, 32, 32)
        return TensorDataset(torch.randn(*shape, generator=g), torch.randint(0, 10, (n,), generator=g))

    def make_loader(self, dataset: TensorDataset | None = None) -> DataLoader:
        # Shuffled with its own generator, so both sides see the same order every rep.
        g = torch.Generator().manual_seed(SEED + 2)
        return DataLoader(dataset or self.make_dataset(), batch_size=self.batch_size, shuffle=True, generator=g)


WORKLOADS = {
    "tiny": Workload("tiny", "mlp", 64, 32, steps=300, reps=25),
    "medium": Workload("medium", "mlp", 512, 32, steps=200, reps=11),
    "conv": Workload("conv", "conv", 16, 32, steps=60, reps=7),
    # 300 sequences of 100 x 10 (10 batches an epoch), 4 epochs: benchmarks/fit_cost.py's run
    "lstm": Workload("lstm", "lstm", 20, 30, steps=10, reps=11, epochs=4),
}
DDP_WORKLOADS = ("tiny", "medium", "conv")  # overhead-bound, a larger MLP, compute-bound


def workload(name: str, **changes: Any) -> Workload:
    return replace(WORKLOADS[name], **changes)


def workload_names(parser: Any, text: str) -> list[str]:
    """The names in ``--workloads a,b``; an unknown one is the parser's error, with the choices."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; choose from {sorted(WORKLOADS)}")
    return names


def build_net(wl: Workload) -> nn.Module:
    torch.manual_seed(SEED)  # the Trainer side builds its module's net after the same seed
    return wl.make_net()


def raw_loop(wl: Workload) -> tuple[list[float], nn.Module]:
    """The loop people write by hand. Returns the clock after each step, and the net."""
    net = build_net(wl)
    opt = wl.make_optimizer(net.parameters())
    loss_fn, loader = wl.loss_fn, wl.make_loader()
    device = torch.device("cpu")
    tick, times = _ticker(CLOCK)
    for epoch in range(wl.epochs):
        for step, (x, y) in enumerate(loader, epoch * wl.steps):
            x, y = x.to(device), y.to(device)  # as in pytorch/examples' mnist/main.py
            loss = loss_fn(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if (step + 1) % LOG_EVERY == 0:
                loss.item()  # where a hand-written loop prints its loss
            tick()
    return times, net


def floor_loop(wl: Workload) -> tuple[list[float], nn.Module]:
    """The floor: the raw loop's model, loss and optimizer over its very batches, cut before the
    clock starts (no loader, no device copy, no framework). No loop's step costs less."""
    net = build_net(wl)
    opt = wl.make_optimizer(net.parameters())
    loss_fn, loader = wl.loss_fn, wl.make_loader()
    epochs = [list(loader) for _ in range(wl.epochs)]  # each epoch's order, drawn as the raw loop draws it
    tick, times = _ticker(CLOCK)
    for epoch, batches in enumerate(epochs):
        for step, (x, y) in enumerate(batches, epoch * wl.steps):
            loss = loss_fn(net(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if (step + 1) % LOG_EVERY == 0:
                loss.item()
            tick()
    return times, net


def _ticker(clock: Callable[[], float]) -> tuple[Callable[[], None], list[float]]:
    """A clock reading behind one Python call, as the Trainer's timing callback is: both
    sides pay the same for being measured."""
    times: list[float] = []

    def tick() -> None:
        times.append(clock())

    return tick, times


def raw_ddp_worker(rank: int, world_size: int, port: int, wl: Workload, out_path: str, probe: bool) -> None:
    """One rank of a hand-written DDP loop on gloo (spawned by torch.multiprocessing).

    Rank 0 saves its step clock and final weights to ``out_path``. With ``probe``, it then
    measures what the DDP step is made of: the gloo all-reduce of all gradients on its own,
    and the same step under ``no_sync()`` (compute only, both processes running).
    """
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        result = _raw_ddp_run(wl, world_size, rank, probe)
        if rank == 0:
            torch.save(result, out_path)
    finally:
        # The DDP wrapper died with _raw_ddp_run's frame; destroying the group under a live
        # one aborts the process at exit ("terminate called without an active exception").
        gc.collect()
        torch.distributed.destroy_process_group()


def _raw_ddp_run(wl: Workload, world_size: int, rank: int, probe: bool) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DistributedSampler

    net = build_net(wl)
    model = DistributedDataParallel(net)
    opt, loss_fn = wl.make_optimizer(model.parameters()), wl.loss_fn
    dataset = wl.make_dataset(world_size)
    # What DDPStrategy does to a shuffled loader: a DistributedSampler with seed 0.
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    sampler.set_epoch(0)
    loader = DataLoader(dataset, batch_size=wl.batch_size, sampler=sampler)
    device = torch.device("cpu")
    clock, times = time.perf_counter, []
    for step, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if (step + 1) % LOG_EVERY == 0:
            loss.item()
        times.append(clock())
    result: dict[str, Any] = {"times": times, "state": {k: v.clone() for k, v in net.state_dict().items()}}
    if probe:
        result.update(_probe(model, opt, loader, net, loss_fn))
    return result


def _probe(
    model: nn.Module, opt: torch.optim.Optimizer, loader: DataLoader, net: nn.Module, loss_fn: Callable[..., torch.Tensor],
) -> dict[str, Any]:
    import statistics

    flat = torch.zeros(sum(p.numel() for p in net.parameters()))
    torch.distributed.barrier()
    for _ in range(50):  # the first few dozen after the ranks drifted apart are slower: not the steady cost
        torch.distributed.all_reduce(flat)
    reduce_s = []
    for _ in range(30):
        t0 = time.perf_counter()
        torch.distributed.all_reduce(flat)
        reduce_s.append(time.perf_counter() - t0)
    nosync_s = []
    t0 = time.perf_counter()
    with model.no_sync():  # the ranks drift apart from here on; the weights were saved above
        for x, y in loader:
            loss_fn(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            t1 = time.perf_counter()
            nosync_s.append(t1 - t0)
            t0 = t1
    return {
        "allreduce_s": sorted(reduce_s)[len(reduce_s) // 10],  # the transfer itself, both ranks ready
        "allreduce_median_s": statistics.median(reduce_s),
        "nosync_step_s": statistics.median(nosync_s[1:]),
        "grad_numel": flat.numel(),
    }


def peak_rss_kib() -> int:
    """This process's peak RSS in KiB.

    Linux's VmHWM rather than ru_maxrss: ru_maxrss keeps the parent's peak across fork+exec,
    so a child started by this (large) benchmark process would report the benchmark's peak.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux


def rss_child(name: str) -> None:
    """In a fresh process: one raw run of the workload, then print the peak RSS in KiB
    (after a "-": the raw loop loads none of the trainer's optional imports)."""
    torch.set_num_threads(1)
    raw_loop(WORKLOADS[name])
    print("-", peak_rss_kib())


class NullTerminal(io.TextIOBase):
    """A terminal that drops its output: the progress bar takes its costlier tqdm path, and
    this script's table stays readable."""

    def isatty(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        return len(text)
