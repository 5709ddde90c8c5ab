"""Trainer(compile=True) against eager on the char_lm transformer: step time, and compile time apart.

    python benchmarks/compile.py             # 3 reps per side, 60 steps each
    python benchmarks/compile.py --quick     # a smoke run (1 rep, 12 steps; numbers are rough)
    python benchmarks/compile.py --device cuda

The model is examples/char_lm.py's tiny GPT (2 layers, 128 wide, 64-character windows, batch
64) on random characters, trained by the Trainer with AdamW. A callback reads the clock at
each training batch's end. The first ``WARMUP`` steps are left out of the step time: on the
compiled side they hold the compile (dynamo's capture and inductor's code generation), which
is reported on its own line as the first steps' time minus as many eager-speed steps. The
step time is the median over the remaining steps of each rep, then the median over reps,
which alternate between the sides. Compiling is lazy: it happens at the first step. Each
compiled rep starts from an empty dynamo cache with inductor's on-disk caches off
(``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1``), so each pays the full, cold compile that a new
model costs; ``--warm-cache`` leaves the disk caches on, as a rerun of the same model finds them.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from typing import Any

if "--warm-cache" not in sys.argv:  # before torch is imported: inductor reads it then
    os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
sys.path[:0] = [p for p in (_ROOT, os.path.join(_ROOT, "examples")) if p not in sys.path[:2]]

import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from callbacks import Callback  # noqa: E402
from char_lm import VOCAB_SIZE, CharLM  # noqa: E402  (examples/char_lm.py)
from trainer import Trainer  # noqa: E402

WARMUP = 3  # steps left out of the step time (the compile happens in the first)


class StepClock(Callback):
    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_start(self, trainer: Any, module: Any) -> None:
        self.times = [time.perf_counter()]

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.times.append(time.perf_counter())


def run(compiled: bool, steps: int, device: str, batch: int, block: int) -> tuple[list[float], float]:
    """One training run: (per-step seconds, its final loss)."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    ids = torch.randint(0, VOCAB_SIZE, (steps * batch, block + 1))
    loader = DataLoader(TensorDataset(ids[:, :-1], ids[:, 1:]), batch_size=batch)
    model = CharLM(block_size=block)
    clock = StepClock()
    trainer = Trainer(
        strategy="single", devices=[0] if device == "cuda" else "auto", max_steps=steps, max_epochs=1,
        compile=compiled, log_dir=None, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0, callbacks=[clock],
    )
    trainer.fit(model, loader)
    step_times = [b - a for a, b in zip(clock.times, clock.times[1:])]
    return step_times, float(trainer.callback_metrics.get("train_loss", float("nan")))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="1 rep of 12 steps: a smoke run")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--warm-cache", action="store_true", help="keep inductor's on-disk caches (a rerun's compile time)")
    args = p.parse_args(argv)
    reps, steps = (1, 12) if args.quick else (args.reps, args.steps)
    logging.getLogger("trainer").setLevel(logging.WARNING)

    step: dict[bool, list[float]] = {False: [], True: []}
    first: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(reps):
        for compiled in (False, True):
            times, _ = run(compiled, steps, args.device, args.batch_size, args.block_size)
            step[compiled].append(statistics.median(times[WARMUP:]))
            first[compiled].append(sum(times[:WARMUP]))
    eager_step, compiled_step = statistics.median(step[False]), statistics.median(step[True])
    compile_s = statistics.median(first[True]) - WARMUP * eager_step
    threads = torch.get_num_threads()
    print(f"char_lm transformer (0.43 M parameters), batch {args.batch_size} x {args.block_size} characters, "
          f"{args.device}, {threads} thread(s), torch {torch.__version__}")
    print(f"{'':12}{'ms/step':>10}{'ratio':>8}")
    print(f"{'eager':12}{eager_step * 1e3:>10.1f}{1.0:>8.3f}")
    print(f"{'compiled':12}{compiled_step * 1e3:>10.1f}{compiled_step / eager_step:>8.3f}")
    print(f"compile time (first {WARMUP} steps minus {WARMUP} eager steps): {compile_s:.1f} s, "
          f"paid back after {compile_s / max(eager_step - compiled_step, 1e-9):.0f} steps"
          if compiled_step < eager_step else f"compile time: {compile_s:.1f} s, not paid back (compiled is not faster)")
    cache = "warm on-disk caches" if args.warm_cache else "cold caches"
    print(f"medians over {reps} rep(s) of {steps} steps; the first {WARMUP} steps of each rep are left out; {cache}")


if __name__ == "__main__":
    main()
