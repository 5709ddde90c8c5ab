"""What an epoch costs on Lightning's own parity workload, against the loop people write by hand.

    python benchmarks/epoch_cost.py              # 20 pairs of runs of 10 epochs
    python benchmarks/epoch_cost.py --breakdown  # also what each default costs
    python benchmarks/epoch_cost.py --quick      # a smoke run (few reps; numbers are rough)

The workload is the one Lightning's parity benchmark trains (its ``ParityModuleRNN`` on
``AverageDataset``): an LSTM(10 -> 20) and a Linear(20 -> 5) on 300 sequences of 100 x 10,
batch 30 (10 batches an epoch), MSE, Adam. Short epochs make what a trainer does once per
epoch (the epoch-end checkpoint, the TensorBoard flush, the progress bar's epoch line) show.

The Trainer runs with every default on: progress bar (into a null terminal), TensorBoard
(into a temp dir), a checkpoint at each epoch's end, the sanity check, and ``self.log(...,
prog_bar=True)`` every step. Both sides read the clock at the start of each epoch (the
Trainer through the first callback's ``on_train_epoch_start``), so an epoch's time spans all
the work until the next epoch starts, epoch-end work included. The first epoch is left out
(one-off set-up, the sanity check). Each run's median epoch; the runs come in pairs, raw and
trainer back to back, and the ratio is the median of the pairs' ratios. The weights must be
``torch.equal``.
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import statistics
import sys
import tempfile
import time
from typing import Any

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [p for p in (os.path.dirname(_HERE), _HERE) if p not in sys.path[:2]]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from _workloads import LOG_EVERY, SEED, WORKLOADS, NullTerminal, ParityNet  # noqa: E402
from callbacks import Callback  # noqa: E402
from trainer import Trainer, TrainModule  # noqa: E402

BUDGET = 1.03  # the Trainer's epoch time over the raw loop's


class Parity(TrainModule, ParityNet):
    """Lightning's ParityModuleRNN."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=0.02)


def make_loader() -> DataLoader:
    """Lightning's AverageDataset (300 sequences), shuffled with a seeded generator."""
    return WORKLOADS["lstm"].make_loader()


def raw(epochs: int) -> tuple[list[float], nn.Module]:
    torch.manual_seed(SEED)
    model = Parity()
    opt = model.configure_optimizers()
    loader, starts, step = make_loader(), [], 0
    for _ in range(epochs):
        starts.append(time.perf_counter())
        for x, y in loader:
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            step += 1
            if step % LOG_EVERY == 0:
                loss.item()
    starts.append(time.perf_counter())
    return starts, model


class EpochClock(Callback):
    def __init__(self) -> None:
        self.starts: list[float] = []

    def on_train_epoch_start(self, trainer: Trainer, module: TrainModule) -> None:
        self.starts.append(time.perf_counter())

    def on_train_end(self, trainer: Trainer, module: TrainModule) -> None:
        self.starts.append(time.perf_counter())


def ours(epochs: int, log_dir: str, **options: Any) -> tuple[list[float], nn.Module]:
    torch.manual_seed(SEED)
    model, clock = Parity(), EpochClock()
    Trainer(max_epochs=epochs, log_dir=log_dir, callbacks=[clock], **options).fit(model, make_loader())
    return clock.starts, model


def per_epoch(starts: list[float]) -> float:
    """One run's median epoch time in seconds, the first epoch left out."""
    return statistics.median(b - a for a, b in zip(starts[1:], starts[2:]))


def paired(reps: int, epochs: int, log_dir: str, **options: Any) -> tuple[list[float], list[float], bool]:
    """``reps`` pairs of runs, raw and trainer back to back (their order alternating), so that
    each ratio compares runs a few hundred ms apart: this VM's speed drifts by 10% over
    seconds, which medians taken over each side separately would turn into the ratio."""
    raw_s, our_s, identical = [], [], True
    for rep in range(reps):
        for side in (("raw", "ours") if rep % 2 == 0 else ("ours", "raw")):
            gc.collect()  # the garbage of the run before is not collected inside this one
            if side == "raw":
                starts, reference = raw(epochs)
                raw_s.append(per_epoch(starts))
            else:
                starts, trained = ours(epochs, log_dir, **options)
                our_s.append(per_epoch(starts))
        identical &= all(torch.equal(a, b) for a, b in zip(reference.state_dict().values(), trained.state_dict().values()))
    return raw_s, our_s, identical


def summary(raw_s: list[float], our_s: list[float]) -> tuple[float, float, float, float, float]:
    """Median ms per epoch of each side, and the median and quartiles of the paired ratios."""
    ratios = sorted(o / r for r, o in zip(raw_s, our_s))
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    return statistics.median(raw_s) * 1e3, statistics.median(our_s) * 1e3, statistics.median(ratios), q1, q3


# Each default turned off on its own: what it costs is the difference to the row with all on.
WITHOUT: dict[str, dict[str, Any]] = {
    "without the epoch checkpoint": {"enable_checkpointing": False},
    "without the progress bar": {"enable_progress_bar": False},
    "without the sanity check": {"num_sanity_val_steps": 0},
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=20, help="timed pairs of runs (default 20)")
    parser.add_argument("--epochs", type=int, default=10, help="epochs per run (default 10)")
    parser.add_argument("--quick", action="store_true", help="3 pairs of 4 epochs: a smoke run")
    parser.add_argument("--breakdown", action="store_true", help="also each default turned off on its own")
    parser.add_argument("--check", action="store_true", help="exit 1 when the budget is missed")
    args = parser.parse_args(argv)
    reps, epochs = (3, 4) if args.quick else (args.reps, args.epochs)
    torch.set_num_threads(1)
    logging.getLogger("trainer").setLevel(logging.WARNING)
    sys.stderr = NullTerminal()  # the progress bar draws, into nothing
    rows = []
    with tempfile.TemporaryDirectory() as log_dir:
        raw(2), ours(2, log_dir)  # warm-up
        raw_s, our_s, identical = paired(reps, epochs, log_dir)
        rows.append(("every default on", *summary(raw_s, our_s)))
        for label, options in (WITHOUT.items() if args.breakdown else ()):
            rows.append((label, *summary(*paired(reps, epochs, log_dir, **options)[:2])))
    sys.stderr = sys.__stderr__
    print("LSTM parity workload (LSTM 10->20, Linear 20->5, 300 x 100 x 10, batch 30, Adam), 1 thread")
    print(f"{reps} pairs of runs x {epochs} epochs; ms per epoch (medians); ratio: median of the pairs' ratios [quartiles]")
    print(f"{'':32}{'raw':>8}{'trainer':>9}{'extra':>8}{'ratio':>8}  {'quartiles':<16}")
    for label, raw_ms, our_ms, ratio, q1, q3 in rows:
        print(f"{label:32}{raw_ms:>8.2f}{our_ms:>9.2f}{our_ms - raw_ms:>8.2f}{ratio:>8.3f}  [{q1:.3f}, {q3:.3f}]")
    ratio = rows[0][3]
    missed = ratio > BUDGET or not identical
    print(f"weights {'identical' if identical else 'DIFFERENT'}; budget {BUDGET}: {'missed' if missed else 'met'}; "
          f"torch {torch.__version__}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
