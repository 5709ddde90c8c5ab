"""What the checkpoint checks cost, next to what they sit beside.

    python benchmarks/checkpoint_verify_cost.py [--mb 100] [--reps 5]

It trains a model of two wide Linear layers under Adam for one step, so that its checkpoint
(weights and Adam's two moments) is about ``--mb`` MiB, saves it with ``trainer.save_checkpoint``,
and times, as medians of ``--reps``:

- the CRC check a resume or a load makes (``trainer.checkpoint.integrity.damage``), against
  reading the file's bytes and against the ``torch.load`` that follows it anyway. It runs once
  per resume or load, never during training.
- the finite check a save makes (``refuse_non_finite``: the weights and optimizer state),
  against the copy of the state that every save takes on the training thread. It runs once
  per save, never per step.

The file is read from the page cache (it was just written): this is the CPU's share. From a
cold disk, reading the bytes costs the same to the check and to ``torch.load``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from trainer import Trainer, TrainModule  # noqa: E402
from trainer.checkpoint.integrity import damage, refuse_non_finite  # noqa: E402

SCRATCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".scratch")  # git ignores it


class Wide(TrainModule):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def median_time(fn: Callable[[], object], reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=100.0, help="checkpoint size to aim for, in MiB")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    width = max(8, int((args.mb * 2**20 / 4 / 3) ** 0.5))  # width x width weights, three copies (Adam)
    os.makedirs(SCRATCH, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=SCRATCH) as folder:
        trainer = Trainer(max_steps=1, log_dir=None, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        data = TensorDataset(torch.randn(8, width), torch.randint(0, 2, (8,)))
        trainer.fit(Wide(width), DataLoader(data, batch_size=8))
        path = os.path.join(folder, "state.ckpt")
        trainer.save_checkpoint(path)
        size = os.path.getsize(path)

        def read() -> None:
            with open(path, "rb") as f:
                while f.read(1 << 24):
                    pass

        assert damage(path) is None
        read_s = median_time(read, args.reps)
        check_s = median_time(lambda: damage(path), args.reps)
        load_s = median_time(lambda: torch.load(path, map_location="cpu", weights_only=True), args.reps)
        finite_s = median_time(lambda: refuse_non_finite(trainer, "the benchmark's state"), args.reps)
        copy_s = median_time(lambda: trainer.checkpoint_state(copy=True), args.reps)
    print(f"checkpoint {size / 2**20:.1f} MiB (Linear {width}x{width} and Adam), medians of {args.reps}")
    print(f"read the file        {read_s * 1e3:8.1f} ms")
    print(f"CRC check            {check_s * 1e3:8.1f} ms   {check_s / read_s:5.2f} x the read, {check_s / load_s:5.2f} x torch.load")
    print(f"torch.load           {load_s * 1e3:8.1f} ms")
    print(f"finite check         {finite_s * 1e3:8.1f} ms   {finite_s / copy_s:5.2f} x the save's copy")
    print(f"the save's copy      {copy_s * 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
