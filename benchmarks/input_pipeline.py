"""Getting batches onto a GPU: the hand-written loop's ``.to(device)`` against the Trainer's
copies on a side stream and against ``Trainer(data_on_device=True)``.

    python benchmarks/input_pipeline.py                      # on cuda:0
    python benchmarks/input_pipeline.py --quick              # a smoke run, rough numbers
    python benchmarks/input_pipeline.py --device cpu --quick # the script's logic, on a CPU

The workload makes the copy matter: an MLP (3x32x32 -> 1024 -> 1024 -> 10) on 16,384 random
"images" in a ``TensorDataset`` (192 MiB in fp32), batch 512 (6 MiB a batch), SGD, shuffled
by a seeded generator. Four sides train the same model from the same weights on the same
batches, reps alternating after a warm-up rep each:

- **raw**: ``for x, y in loader: x, y = x.to(device), y.to(device); ...`` (pageable memory:
  the CPU waits for each copy, and each copy waits for the step before it);
- **raw, pinned**: the same with ``DataLoader(pin_memory=True)`` and ``non_blocking=True``,
  the best a hand-written loop usually does;
- **trainer**: ``Trainer`` with its defaults but no progress bar, logger or checkpoints
  (batched fetching, the copy on a side stream);
- **trainer, on device**: the same with ``data_on_device=True`` (the dataset copied to the
  GPU once, each batch indexed there).

A rep's clock starts after step ``WARM`` and stops after its last step, each read after
``torch.cuda.synchronize()``. Steps per second is the median over reps; the ratio is raw time
over each side's (above 1: faster than the raw loop). Weights are compared with the raw
loop's (on a GPU: close, kernels may sum in another order; on the CPU: equal).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import logging
import os
import statistics
import sys
import time
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [p for p in (os.path.dirname(_HERE), _HERE) if p not in sys.path[:2]]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from _workloads import NullTerminal  # noqa: E402
from gpu import WARM, Clock, machine, sync  # noqa: E402
from trainer import Trainer, TrainModule  # noqa: E402

class MLP(TrainModule):
    def __init__(self, features: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(self(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Config:
    def __init__(self, quick: bool, device: torch.device, reps: int | None) -> None:
        small = device.type == "cpu"
        self.shape = (3, 8, 8) if small else (3, 32, 32)
        self.samples, self.batch = (1024, 64) if small else (16_384, 512)
        self.hidden = 64 if small else 1024
        self.steps = 24 if small or quick else 160  # per rep: past an epoch (16 batches here, 32 on a GPU)
        self.reps = reps or (2 if quick else 7)
        g = torch.Generator().manual_seed(0)
        self.data = TensorDataset(torch.randn(self.samples, *self.shape, generator=g), torch.randint(0, 10, (self.samples,), generator=g))
        torch.manual_seed(0)
        self.initial = {k: v.clone() for k, v in self.model().state_dict().items()}

    def model(self) -> MLP:
        m = MLP(int(torch.tensor(self.shape).prod()), self.hidden)
        if hasattr(self, "initial"):
            m.load_state_dict(self.initial)
        return m

    def loader(self, pin: bool = False) -> DataLoader:
        return DataLoader(self.data, batch_size=self.batch, shuffle=True, drop_last=True, pin_memory=pin,
                          generator=torch.Generator().manual_seed(1))


def raw(cfg: Config, device: torch.device, pinned: bool) -> tuple[float, nn.Module]:
    model = cfg.model().to(device)
    opt = model.configure_optimizers()
    step, started, loader = 0, None, cfg.loader(pin=pinned and device.type == "cuda")
    while step < cfg.steps:
        for x, y in loader:
            x, y = x.to(device, non_blocking=pinned), y.to(device, non_blocking=pinned)
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
            step += 1
            if step == WARM:
                sync(device)
                started = time.perf_counter()
            if step == cfg.steps:
                break
    sync(device)
    return time.perf_counter() - started, model


def ours(cfg: Config, device: torch.device, on_device: bool) -> tuple[float, nn.Module]:
    model, clock = cfg.model(), Clock(device)
    trainer = Trainer(
        devices=[0] if device.type == "cuda" else 1, max_steps=cfg.steps, data_on_device=on_device,
        enable_progress_bar=False, log_dir=None, enable_checkpointing=False, enable_model_summary=False,
        num_sanity_val_steps=0, callbacks=[clock],
    )
    with contextlib.redirect_stderr(NullTerminal()):
        trainer.fit(model, cfg.loader())
    return clock.stopped - clock.started, model


SIDES = {
    "raw": lambda cfg, d: raw(cfg, d, pinned=False),
    "raw, pinned": lambda cfg, d: raw(cfg, d, pinned=True),
    "trainer": lambda cfg, d: ours(cfg, d, on_device=False),
    "trainer, on device": lambda cfg, d: ours(cfg, d, on_device=True),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few steps and reps: a smoke run, rough numbers")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a tiny model, to check the script")
    parser.add_argument("--reps", type=int, help="timed reps per side (default 7, or 2 with --quick)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device is visible; use --device cpu to check the script on a CPU")
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    logging.getLogger("trainer").setLevel(logging.WARNING)
    cfg = Config(args.quick, device, args.reps)
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    models: dict[str, nn.Module] = {}
    for side, run in SIDES.items():  # warm-up
        run(cfg, device)
    for rep in range(cfg.reps):
        for side in (list(SIDES) if rep % 2 == 0 else list(reversed(SIDES))):
            seconds, models[side] = SIDES[side](cfg, device)
            times[side].append(seconds)
    steps = cfg.steps - WARM
    print(f"input pipeline, {datetime.date.today().isoformat()}: {machine(device)}")
    mib = cfg.batch * torch.tensor(cfg.shape).prod().item() * 4 / 2**20
    print(f"MLP on {cfg.samples} x {cfg.shape} fp32, batch {cfg.batch} ({mib:.2f} MiB), {steps} timed steps x {cfg.reps} reps")
    print(f"  {'side':22}{'steps/s':>10}{'ratio':>8}  max |w - raw w|")
    raw_s = statistics.median(times["raw"])
    reference = models["raw"].state_dict()
    for side, ts in times.items():
        s = statistics.median(ts)
        diff = max((v.cpu() - reference[k].cpu()).abs().max().item() for k, v in models[side].state_dict().items())
        print(f"  {side:22}{steps / s:>10.1f}{raw_s / s:>8.3f}  {diff:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
