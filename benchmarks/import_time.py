"""What importing the packages costs above ``import torch``.

    python benchmarks/import_time.py            # 15 interleaved pairs of fresh interpreters
    python benchmarks/import_time.py --reps 5   # fewer

Each rep starts two fresh interpreters back to back: one runs ``import torch``, the other
``import torch`` then ``import trainer, callbacks, strategies, loggers`` and
``from trainer import Trainer`` (what every script and every spawned DDP worker pays). Each
reads its own clock around the imports, so interpreter start-up is left out. The figure is
the median of the pairs' differences; the goal is 0.15 s or less (issue 30).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TORCH = "import time; t = time.perf_counter(); import torch; print(time.perf_counter() - t)"
OURS = (
    "import time; t = time.perf_counter(); import torch; import trainer, callbacks, strategies, loggers; "
    "from trainer import Trainer; print(time.perf_counter() - t)"
)
GOAL_S = 0.15


def timed(code: str) -> float:
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return float(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=15, help="pairs of interpreters (default 15)")
    args = parser.parse_args(argv)
    timed(OURS)  # warm the file cache: the first import of anything reads .pyc files from disk
    pairs = [(timed(TORCH), timed(OURS)) for _ in range(args.reps)]
    torch_s = statistics.median(t for t, _ in pairs)
    extra_s = statistics.median(o - t for t, o in pairs)
    print(f"{args.reps} pairs of fresh interpreters (medians)")
    print(f"import torch                                   {torch_s:6.3f} s")
    print(f"+ trainer, callbacks, strategies, loggers, Trainer  {extra_s:+6.3f} s  (goal <= {GOAL_S:.2f} s: "
          f"{'met' if extra_s <= GOAL_S else 'missed'})")
    return {"torch_s": torch_s, "extra_s": extra_s}


if __name__ == "__main__":
    main()
