"""What a whole ``fit`` costs, measured Lightning's way, and how long until the first step.

    python benchmarks/fit_cost.py            # 21 pairs of runs of 4 epochs
    python benchmarks/fit_cost.py --quick    # 3 pairs: a smoke run (numbers are rough)
    python benchmarks/fit_cost.py --breakdown  # each default (checkpoint, bar, TensorBoard, summary) off on its own

Lightning's parity benchmark times the Trainer's construction and the whole ``fit`` and divides
by the epochs; this does the same, on its workload (benchmarks/epoch_cost.py: an LSTM(10->20)
and a Linear(20->5) on 300 sequences of 100 x 10, batch 30, MSE, Adam, 4 epochs), 1 thread,
every default on (progress bar into a null terminal, TensorBoard into a temp dir, the epoch
checkpoints, the summary, the sanity check), the bar and summary those of a plain install (tqdm's
and the logged table, also where rich is installed). The raw loop is timed from building its model to
its last step, the Trainer from ``Trainer(...)`` to ``fit`` returning; the runs come in pairs,
raw and Trainer back to back, and the ratio is the median of the pairs' ratios. The weights
must be ``torch.equal``.

Where the Trainer's time goes, per run (medians): building the model and the Trainer (the raw
loop builds the same model); ``fit`` until
``on_fit_start`` (strategy set-up, run folder, loggers); until ``on_train_start`` (the summary,
the sanity check); until the first ``training_step``; and from the last epoch's end until ``fit``
returns (the last checkpoint's wait, the final flush). "Time to the first step" compares
``fit()`` being called (the Trainer already built, as a script has it) with the raw loop's start.
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

from _workloads import LOG_EVERY, SEED, NullTerminal  # noqa: E402
from callbacks import Callback, ModelSummary, ProgressBar  # noqa: E402
from epoch_cost import Parity, make_loader  # noqa: E402
from trainer import Trainer, TrainModule  # noqa: E402

GOAL = 1.03
EPOCHS = 4
PHASES = ("build the model and Trainer", "fit -> on_fit_start", "-> on_train_start", "-> first training_step", "last epoch -> fit returns")


def raw(epochs: int) -> tuple[float, float, torch.nn.Module]:
    """(whole run s, time to the first step s, model)."""
    start = time.perf_counter()
    torch.manual_seed(SEED)
    model = Parity()
    opt = model.configure_optimizers()
    loader, step, first = make_loader(), 0, None
    for _ in range(epochs):
        for x, y in loader:
            if first is None:
                first = time.perf_counter() - start
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            step += 1
            if step % LOG_EVERY == 0:
                loss.item()
    return time.perf_counter() - start, first or 0.0, model


class Marks(Callback):
    """Timestamps of the phases of a fit (appended after the built-in callbacks)."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}

    def on_fit_start(self, trainer: Trainer, module: TrainModule) -> None:
        self.at["fit_start"] = time.perf_counter()

    def on_train_start(self, trainer: Trainer, module: TrainModule) -> None:
        self.at["train_start"] = time.perf_counter()

    def on_train_end(self, trainer: Trainer, module: TrainModule) -> None:
        self.at["train_end"] = time.perf_counter()


class Timed(Parity):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self._first is None:
            self._first = time.perf_counter()
        return super().training_step(batch, batch_idx)


def ours(epochs: int, log_dir: str, **options: Any) -> tuple[float, float, dict[str, float], torch.nn.Module]:
    """(whole run s, time from fit() to the first step s, phases s, model); ``options`` go to the Trainer."""
    start = time.perf_counter()
    torch.manual_seed(SEED)
    model, marks = Timed(), Marks()
    model._first = None
    # The plain install's bar and summary (tqdm's, the logged table) whatever else is installed: with rich the
    # Trainer picks rich's, which print on stdout, and the figures would not compare across machines.
    plain = [ProgressBar()] if options.get("enable_progress_bar", True) else []
    plain += [ModelSummary()] if options.get("enable_model_summary", True) else []
    trainer = Trainer(max_epochs=epochs, log_dir=log_dir, callbacks=[marks, *plain], **options)
    built = time.perf_counter()
    trainer.fit(model, make_loader())
    end = time.perf_counter()
    at = marks.at
    phases = dict(zip(PHASES, (
        built - start, at["fit_start"] - built, at["train_start"] - at["fit_start"],
        model._first - at["train_start"], end - at["train_end"],
    )))
    return end - start, model._first - built, phases, model


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=21, help="timed pairs of runs (default 21: a run is short, and the pairs vary)")
    parser.add_argument("--quick", action="store_true", help="3 pairs: a smoke run")
    parser.add_argument("--breakdown", action="store_true", help="instead: each default turned off on its own (40 reps)")
    args = parser.parse_args(argv)
    reps = 3 if args.quick else args.reps
    torch.set_num_threads(1)
    logging.getLogger("trainer").setLevel(logging.WARNING)
    sys.stderr = NullTerminal()  # the progress bar draws, into nothing
    if args.breakdown:
        return breakdown(3 if args.quick else max(reps, 40))
    ratios, raw_s, our_s, raw_first, our_first, identical = [], [], [], [], [], True
    phases: dict[str, list[float]] = {p: [] for p in PHASES}
    with tempfile.TemporaryDirectory() as log_dir:
        raw(1), ours(1, log_dir)  # warm-up
        for rep in range(reps):
            for side in (("raw", "ours") if rep % 2 == 0 else ("ours", "raw")):
                gc.collect()
                if side == "raw":
                    r_total, r_first, reference = raw(EPOCHS)
                else:
                    o_total, o_first, o_phases, trained = ours(EPOCHS, log_dir)
            raw_s.append(r_total), our_s.append(o_total), raw_first.append(r_first), our_first.append(o_first)
            ratios.append(o_total / r_total)
            for p, v in o_phases.items():
                phases[p].append(v)
            identical &= all(torch.equal(a, b) for a, b in zip(reference.state_dict().values(), trained.state_dict().values()))
    sys.stderr = sys.__stderr__
    ratios.sort()
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    ratio, med = statistics.median(ratios), statistics.median
    print(f"LSTM parity workload, whole fit, {EPOCHS} epochs, 1 thread; {reps} pairs of runs (medians)")
    print(f"raw loop      {med(raw_s) * 1e3 / EPOCHS:8.1f} ms/epoch")
    print(f"trainer       {med(our_s) * 1e3 / EPOCHS:8.1f} ms/epoch  (+{(med(our_s) - med(raw_s)) * 1e3 / EPOCHS:.1f})")
    print(f"ratio         {ratio:8.3f}  [{q1:.3f}, {q3:.3f}]  goal <= {GOAL}: {'met' if ratio <= GOAL and identical else 'missed'}")
    print(f"time to the first step: raw {med(raw_first) * 1e3:.1f} ms, trainer {med(our_first) * 1e3:.1f} ms from fit()")
    print("where the trainer's once-per-fit time goes (ms):")
    for p in PHASES:
        print(f"  {p:30}{med(phases[p]) * 1e3:8.1f}")
    print(f"weights {'identical' if identical else 'DIFFERENT'}; torch {torch.__version__}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}")
    return {"ratio": ratio, "identical": identical}


BREAKDOWN = {
    "every default on": {},
    "without the checkpoint": {"enable_checkpointing": False},
    "without the progress bar": {"enable_progress_bar": False},
    "without TensorBoard": {"logger": False},
    "without the summary": {"enable_model_summary": False},
    "all four off": {"enable_checkpointing": False, "enable_progress_bar": False, "logger": False, "enable_model_summary": False},
}


def breakdown(reps: int) -> dict[str, Any]:
    """Each default turned off on its own: the raw loop and every variant in one process, the
    order rotating each rep; per variant the median of its ratios to the same rep's raw run."""
    sides = ["raw", *BREAKDOWN]
    ratios: dict[str, list[float]] = {name: [] for name in BREAKDOWN}
    with tempfile.TemporaryDirectory() as log_dir:
        raw(1), ours(1, log_dir)  # warm-up
        for rep in range(reps):
            order = sides[rep % len(sides):] + sides[: rep % len(sides)]
            took = {}
            for side in order if rep % 2 == 0 else order[::-1]:
                gc.collect()
                took[side] = raw(EPOCHS)[0] if side == "raw" else ours(EPOCHS, log_dir, **BREAKDOWN[side])[0]
            for name in BREAKDOWN:
                ratios[name].append(took[name] / took["raw"])
    sys.stderr = sys.__stderr__
    print(f"LSTM parity workload, whole fit, {EPOCHS} epochs, 1 thread; {reps} reps; ratio to the raw loop: median [quartiles]")
    for name, values in ratios.items():
        q1, q2, q3 = statistics.quantiles(values, n=4)
        print(f"  {name:28}{statistics.median(values):7.3f}  [{q1:.3f}, {q3:.3f}]")
    print(f"torch {torch.__version__}, {os.cpu_count()} cores, {time.strftime('%Y-%m-%d')}")
    return {name: statistics.median(values) for name, values in ratios.items()}


if __name__ == "__main__":
    main()
