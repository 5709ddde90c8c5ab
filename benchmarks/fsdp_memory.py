"""Per-rank memory of parameters, gradients and optimizer state, and step time: ddp against fsdp.

    python benchmarks/fsdp_memory.py            # 2 processes, a 4.2 M-parameter MLP, Adam, 30 steps
    python benchmarks/fsdp_memory.py --quick    # a smoke run (8 steps)

Each rank adds up the bytes of what it holds after training: its parameters (under fsdp its
shards), their gradients (kept with ``zero_grad(set_to_none=False)`` in a callback so that they
can be counted) and the optimizer's state tensors. The model is 4 Linear(1024, 1024) layers
with ReLUs between them, so fsdp (its default rule shards the 4 repeated Linear layers) should
hold about half of ddp's on each of 2 ranks; the ratio is printed. Step time is the median over
the steps after the first 3, read on rank 0; both sides run the same batches on the CPU (gloo).
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [p for p in (os.path.dirname(_HERE),) if p not in sys.path[:1]]

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from callbacks import Callback  # noqa: E402
from trainer import Trainer, TrainModule  # noqa: E402

WIDTH, LAYERS, WARMUP = 1024, 4, 3


class Wide(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(LAYERS):
            layers += [nn.Linear(WIDTH, WIDTH)] + ([nn.ReLU()] if i < LAYERS - 1 else [])
        self.net = nn.Sequential(*layers)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-4)


def _local_bytes(t: torch.Tensor) -> int:
    local = t.to_local() if hasattr(t, "to_local") else t  # a DTensor counts its shard
    return local.numel() * local.element_size()


class Measure(Callback):
    """Step times on rank 0, and each rank's bytes at the end of training, into ``folder``."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.times: list[float] = []

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.times.append(time.perf_counter())

    def on_before_optimizer_step(self, trainer: Any, module: Any, optimizer: Any) -> None:
        self.grads = sum(_local_bytes(p.grad) for p in module.parameters() if p.grad is not None)

    def on_train_end(self, trainer: Any, module: Any) -> None:
        params = sum(_local_bytes(p) for p in module.parameters())
        state = sum(
            _local_bytes(v) for s in trainer.optimizer.state.values() for v in s.values()
            if isinstance(v, torch.Tensor) and v.ndim > 0
        )
        rank = trainer.strategy.global_rank
        steps = [b - a for a, b in zip(self.times, self.times[1:])][WARMUP:]
        with open(os.path.join(self.folder, f"rank{rank}.txt"), "w") as f:
            f.write(f"{params} {self.grads} {state} {statistics.median(steps) if steps else float('nan')}\n")


def run(strategy: str, steps: int, batch: int) -> list[tuple[int, int, int, float]]:
    with tempfile.TemporaryDirectory() as folder:
        g = torch.Generator().manual_seed(0)
        data = TensorDataset(torch.randn(steps * batch * 2, WIDTH, generator=g), torch.randn(steps * batch * 2, WIDTH, generator=g))
        torch.manual_seed(0)
        Trainer(
            strategy=strategy, devices=2, max_steps=steps, max_epochs=1, log_dir=None, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, callbacks=[Measure(folder)],
        ).fit(Wide(), DataLoader(data, batch_size=batch))
        rows = []
        for rank in range(2):
            with open(os.path.join(folder, f"rank{rank}.txt")) as f:
                p, gr, s, t = f.read().split()
            rows.append((int(p), int(gr), int(s), float(t)))
        return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="8 steps: a smoke run")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--batch-size", type=int, default=32, help="per process")
    args = p.parse_args(argv)
    steps = 8 if args.quick else args.steps
    logging.getLogger("trainer").setLevel(logging.WARNING)
    results = {name: run(name, steps, args.batch_size) for name in ("ddp", "fsdp")}
    n = sum(p.numel() for p in Wide().parameters())
    mb = 2**20
    print(f"MLP {LAYERS} x Linear({WIDTH}, {WIDTH}) = {n / 1e6:.1f} M parameters, Adam, 2 processes (gloo, CPU), "
          f"batch {args.batch_size} per process, torch {torch.__version__}")
    print(f"{'':6}{'rank':>5}{'params MB':>11}{'grads MB':>10}{'optim MB':>10}{'total MB':>10}{'ms/step':>9}")
    totals = {}
    for name, rows in results.items():
        for rank, (params, grads, state, step) in enumerate(rows):
            total = params + grads + state
            totals.setdefault(name, []).append(total)
            print(f"{name:6}{rank:>5}{params / mb:>11.1f}{grads / mb:>10.1f}{state / mb:>10.1f}{total / mb:>10.1f}"
                  f"{step * 1e3 if rank == 0 else float('nan'):>9.1f}")
    ratio = max(totals["fsdp"]) / max(totals["ddp"])
    speed = results["fsdp"][0][3] / results["ddp"][0][3]
    print(f"fsdp / ddp per-rank memory (largest rank): {ratio:.3f}  (1/2 = 0.500 is an even split); step time: {speed:.3f}")


if __name__ == "__main__":
    main()
