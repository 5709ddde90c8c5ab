"""This Trainer side by side with Lightning, Accelerate and Ignite, each against a hand-written loop.

    python benchmarks/peers.py                     # tiny MLP, MLP of width 512, the LSTM; every installed peer
    python benchmarks/peers.py --quick             # a smoke run (few reps and steps; numbers are rough)
    python benchmarks/peers.py --workloads lstm --reps 9 --markdown

The peers are never dependencies. Install them for this benchmark (keeping torch as it is):

    pip install lightning accelerate pytorch-ignite

A peer that is not installed is skipped with a line saying so.

The workloads are benchmarks/_workloads.py's: "tiny" (MLP 32->64->64->10, batch 32, 300 steps)
and "medium" (width 512, 200 steps), cross-entropy and SGD with momentum; "lstm", Lightning's
parity workload (LSTM 10->20 and Linear 20->5 on 300 sequences of 100 x 10, batch 30, MSE,
Adam, 4 epochs). Every side trains the same net from the same seed on the same batches in the
same order, in this process, with one thread; each runner (benchmarks/overhead.py) is written
once for all workloads. This Trainer and Lightning run with their defaults on (progress bar
into a null terminal, their logger into a temp dir, the epoch-end checkpoint) and log the loss
every step with ``prog_bar=True``; Accelerate and Ignite run their plain loops.

Besides the peers, a "floor" row: the raw loop's model, loss and optimizer over its very
batches, listed before the clock starts (no loader, no framework), which no loop's step beats.

Two figures per side, both over the raw loop's:

- per step: benchmarks/overhead.py's ``compare``. Each side reads the clock after every step;
  per step index the median over the interleaved reps, then the mean over the steps; the 90%
  interval from resampling the reps. The steady-state cost of the loop.
- whole run: the wall time from building the model (and the trainer) to the end of training,
  each rep's ratio to that rep's raw run, then the median. What a user waits for, set-up and
  tear-down included.

"weights" compares each side's final weights with the raw loop's on every rep: ``identical``
(``torch.equal``), ``allclose`` (rtol 1e-5, atol 1e-6) or ``differ`` (the largest difference).
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import tempfile
import time
from typing import Callable

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [p for p in (os.path.dirname(_HERE), _HERE) if p not in sys.path[:2]]

import torch  # noqa: E402

from _workloads import WORKLOADS, Workload, workload, workload_names  # noqa: E402
from overhead import PEERS, Row, Timed, compare, installed_peers  # noqa: E402

DEFAULT_WORKLOADS = ("tiny", "medium", "lstm")
MIN_REPS = 7


def skipped_lines(missing: list[str]) -> list[str]:
    return [f"{module} not installed, skipped (pip install {PEERS[module][0]})" for module in missing]


def plan(names: list[str], quick: bool, reps: int | None) -> list[Workload]:
    wls = []
    for name in names:
        wl = WORKLOADS[name]
        if quick:
            wl = workload(name, reps=2, steps=min(wl.steps, 60), epochs=min(wl.epochs, 2))
        wls.append(workload(wl.name, steps=wl.steps, epochs=wl.epochs, reps=reps or (wl.reps if quick else max(wl.reps, MIN_REPS))))
    return wls


def rows_for(wl: Workload, log_dir: str, peers: dict[str, Callable[[Workload, str], Timed]]) -> list[Row]:
    """The raw loop's row (its own figures, ratio 1), then each side's."""
    rows = compare(wl, log_dir, peers)
    first = rows[0]
    raw = Row(wl.label, "raw", first.raw_s, first.raw_s, 1.0, 1.0, "-", 0.0, 1.0,
              {"raw_wall_s": first.extra["raw_wall_s"], "wall_s": first.extra["raw_wall_s"]})
    return [raw, *rows]


HEADER = f"{'workload':<42} {'side':<18} {'ms/step':>8} {'per step [90% CI]':>23} {'whole run ms':>12} {'ratio':>6}  weights"


def line(row: Row, first: bool) -> str:
    label = row.label if first else ""
    per_step = f"{row.ratio:.3f} [{row.lo:.3f}, {row.hi:.3f}]" if row.side != "raw" else "1"
    whole = f"{row.whole:.3f}" if row.side != "raw" else "1"
    return (f"{label:<42} {row.side:<18} {row.side_s * 1e3:>8.3f} {per_step:>23} "
            f"{row.extra['wall_s'] * 1e3:>12.1f} {whole:>6}  {row.weights}")


def markdown(rows: list[Row]) -> str:
    out = ["| Workload | Side | ms per step | Per step, ÷ raw [90% CI] | Whole run, ms | Whole run, ÷ raw | Final weights vs raw |",
           "|---|---|---:|---:|---:|---:|---|"]
    for row in rows:
        if row.side == "raw":
            out.append(f"| {row.label} | raw loop | {row.side_s * 1e3:.3f} | 1 | {row.extra['wall_s'] * 1e3:.1f} | 1 | |")
        else:
            out.append(f"| | {row.side} | {row.side_s * 1e3:.3f} | {row.ratio:.3f} [{row.lo:.3f}, {row.hi:.3f}] | "
                       f"{row.extra['wall_s'] * 1e3:.1f} | {row.whole:.3f} | {row.weights} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default=",".join(DEFAULT_WORKLOADS), help="comma-separated: " + ",".join(WORKLOADS))
    parser.add_argument("--quick", action="store_true", help="2 reps, at most 60 steps and 2 epochs: a smoke run")
    parser.add_argument("--reps", type=int, help=f"timed reps per side, interleaved (default: per workload, at least {MIN_REPS})")
    parser.add_argument("--markdown", action="store_true", help="also print the table as Markdown (for the README)")
    args = parser.parse_args(argv)
    names = workload_names(parser, args.workloads)
    torch.set_num_threads(1)
    logging.getLogger("trainer").setLevel(logging.WARNING)  # the one-line run summary, per fit
    peers, missing = installed_peers()  # {"lightning 2.6.6": its runner, ...}: the side names carry the versions
    wls = plan(names, args.quick, args.reps)
    print("This Trainer, Lightning, Accelerate and Ignite against a hand-written loop; 1 thread, wall clock", flush=True)
    print(f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, {platform.system()}, Python {platform.python_version()}, "
          f"torch {torch.__version__}" + "".join(f", {v}" for v in peers), flush=True)
    for skip in skipped_lines(missing):
        print(skip, flush=True)
    print("reps (interleaved, after one warm-up rep of each side): " + ", ".join(f"{wl.name} {wl.reps}" for wl in wls))
    print(f"\n{HEADER}", flush=True)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as log_dir:
        for wl in wls:
            for i, row in enumerate(rows_for(wl, log_dir, peers)):
                rows.append(row)
                print(line(row, i == 0), flush=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"\nper step: mean over steps of the median over reps; whole run: from building the model to the last "
          f"step, median of each rep's ratio; load avg {load:.1f}")
    if args.markdown:
        print("\n" + markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
