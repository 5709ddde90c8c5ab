"""What the Trainer costs per step, against the loop people write by hand.

    python benchmarks/overhead.py                 # the three workloads, peak RSS, checkpoint stall
    python benchmarks/overhead.py --ddp           # also DDP(2) on gloo vs a hand-written DDP loop
    python benchmarks/overhead.py --peers         # also Lightning/Accelerate/Ignite, when installed
    python benchmarks/overhead.py --quick         # a smoke run (few reps; numbers are rough)

Both sides run in this process with ``torch.set_num_threads(1)``, the same model, data,
order, optimizer (SGD, momentum 0.9) and seed. The Trainer runs with all its defaults on: the
progress bar, TensorBoard (into a temp dir), a checkpoint at the end of each epoch, and the
model calls ``self.log(..., prog_bar=True)`` every step. The raw loop is the one in
pytorch/examples' mnist/main.py: it moves each batch with ``.to(device)``, steps, and reads
its loss every ``log_every_n_steps`` (50), where that script prints it.

How a step is timed, and why:

- Each side reads the clock after every step: the raw loop inline, the Trainer through a
  callback appended after the built-in ones, so one step's time spans everything the loop
  does between two step ends (data, hooks, the step, progress bar, TensorBoard, checkpoint
  checks). The first step (``iter()`` of the loader) and whatever ``fit`` does before and
  after the steps (the one-off setup: run folder, TensorBoard writer, the epoch-end
  checkpoint) are left out of the per-step cost and reported on their own ("one-off ms").
- Reps alternate between the sides (raw, Trainer, Trainer, raw, ...) after one warm-up rep
  of each, so a slow spell on a shared machine hits both.
- Per step index, take the median across reps, then the mean over the step indices. Noise
  from other processes lands on random (rep, step) cells and the median drops it; work the
  loop does on a cadence (a TensorBoard write every 50 steps, the metric buffer folded every
  256) lands on the same step in every rep, survives the median, and is paid for in the mean.
  This is also why it is not the plain median step time, which would hide that work.
- The ratio's 90% interval comes from resampling the reps (paired, 200 times). It shows
  the measurement noise; it does not widen for effects that hit every rep alike.

The floor runs the raw loop's model, loss and optimizer over its very batches, listed before
the clock starts: no loader, no ``.to()``, no framework. "trainer / floor" is what the
Trainer's step costs over the step itself.

"weights" compares the final weights with ``torch.equal`` on every rep (``allclose`` for
DDP). Peak RSS is the high-water mark (VmHWM) of a fresh process that runs one rep of one side.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import importlib.util
import io
import logging
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any, Callable

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
# Measure this checkout, not whichever copy of the packages is installed.
sys.path[:0] = [p for p in (_ROOT, _HERE) if p not in sys.path[:2]]

import torch  # noqa: E402
from torch import nn  # noqa: E402

import _workloads  # noqa: E402
from _workloads import (  # noqa: E402
    DDP_WORKLOADS, WORKLOADS, NullTerminal, ParityNet, Workload, build_net, floor_loop, peak_rss_kib, raw_ddp_worker, raw_loop,
    workload, workload_names,
)
from callbacks import Callback, ModelCheckpoint  # noqa: E402
from trainer import Trainer, TrainModule  # noqa: E402

BUDGET_RATIO = {"tiny": 0.80, "medium": 0.92, "conv": 1.00}  # per step, against the hand-written loop
BUDGET_FLOOR = {"tiny": 1.10}  # per step, against the floor (the step alone, its batches cut beforehand)
BUDGET_RSS = 1.05
# tensorboard's file layer imports boto3 (for s3:// paths) whenever it is installed.
_OPTIONAL_IMPORTS = ("boto3",)

Timed = tuple[list[float], nn.Module]  # clock after each step, and the trained net


class BenchSteps(TrainModule):
    """The raw loop's net itself (its layers, built after the same seed), as a TrainModule that
    trains with the workload's loss and optimizer and logs its loss every step.

    Both sides then call the model the same way (``self(x)`` here, ``net(x)`` there); a
    wrapper with ``self.net(x)`` would charge the Trainer for an attribute lookup
    (``nn.Module.__getattr__``) that is the model's cost, not the loop's.
    """

    def __init__(self, wl: Workload) -> None:
        super().__init__()
        for name, layer in build_net(wl).named_children():
            self.add_module(name, layer)
        self.wl, self.loss_fn = wl, wl.loss_fn

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = self.loss_fn(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return self.wl.make_optimizer(self.parameters())


class BenchModule(BenchSteps, nn.Sequential):
    """The MLP and conv workloads (an ``nn.Sequential``)."""


class BenchParity(BenchSteps, ParityNet):
    """The LSTM workload."""


def bench_module(wl: Workload) -> BenchSteps:
    return BenchParity(wl) if wl.kind == "lstm" else BenchModule(wl)


class StepTimer(Callback):
    """The clock after each training step. Rank 0's readings come back from DDP workers
    through ``state_dict``, like any callback's state."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.times: list[float] = []

    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        torch.set_num_threads(1)  # DDP workers are fresh processes
        self.times = []

    def on_train_batch_end(self, trainer: Trainer, module: TrainModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.times.append(self.clock())

    def state_dict(self) -> dict[str, Any]:
        return {"times": self.times}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.times = state_dict["times"]


class Quiet(Callback):
    """Silences a spawned DDP worker (the parent's logging and stderr settings do not reach
    it): the trainer's info line, and the progress bar as in this process."""

    def setup(self, trainer: Trainer, module: TrainModule, stage: str) -> None:
        logging.getLogger("trainer").setLevel(logging.WARNING)
        sys.stderr = NullTerminal()


def run_trainer(wl: Workload, log_dir: str, *, extra: list[Callback] | None = None, **options: Any) -> Timed:
    model = bench_module(wl)
    world = 2 if options.get("strategy") == "ddp" else 1
    timer = StepTimer(_workloads.CLOCK if world == 1 else time.perf_counter)  # DDP: waits are the cost
    if world > 1:
        extra = [Quiet(), *(extra or [])]  # first, so that it runs before the progress bar's setup
    trainer = Trainer(max_epochs=wl.epochs, log_dir=log_dir, callbacks=extra, **options)
    trainer.callbacks.append(timer)  # after the built-ins: a step's time includes their work
    with contextlib.redirect_stderr(NullTerminal()):
        trainer.fit(model, wl.make_loader(wl.make_dataset(world)))
    return timer.times, model


# --- peers (never dependencies; each runs only when installed) ------------------------------
def run_lightning(wl: Workload, log_dir: str) -> Timed:
    import lightning as L

    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # its info lines, per fit, go to the real stderr

    class LitModule(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net, self.loss_fn = build_net(wl), wl.loss_fn

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = self.loss_fn(self.net(x), y)
            self.log("train_loss", loss, prog_bar=True)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return wl.make_optimizer(self.parameters())

    class LitTimer(L.Callback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            self.times.append(_workloads.CLOCK())

    model, timer = LitModule(), LitTimer()
    trainer = L.Trainer(max_epochs=wl.epochs, accelerator="cpu", devices=1, default_root_dir=log_dir, callbacks=[timer])
    with contextlib.redirect_stderr(NullTerminal()), contextlib.redirect_stdout(io.StringIO()):
        trainer.fit(model, wl.make_loader())
    return timer.times, model.net


def run_accelerate(wl: Workload, log_dir: str) -> Timed:
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    net = build_net(wl)
    model, opt, loader = accelerator.prepare(net, wl.make_optimizer(net.parameters()), wl.make_loader())
    loss_fn, times = wl.loss_fn, []
    for _ in range(wl.epochs):
        for x, y in loader:
            loss = loss_fn(model(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            times.append(_workloads.CLOCK())
    return times, accelerator.unwrap_model(model)


def run_ignite(wl: Workload, log_dir: str) -> Timed:
    from ignite.engine import Events, create_supervised_trainer

    net = build_net(wl)
    engine = create_supervised_trainer(net, wl.make_optimizer(net.parameters()), wl.loss_fn)
    times: list[float] = []
    engine.add_event_handler(Events.ITERATION_COMPLETED, lambda _: times.append(_workloads.CLOCK()))
    engine.run(wl.make_loader(), max_epochs=wl.epochs)
    return times, net


PEERS: dict[str, tuple[str, Callable[[Workload, str], Timed]]] = {
    "lightning": ("lightning", run_lightning),
    "accelerate": ("accelerate", run_accelerate),
    "ignite": ("pytorch-ignite", run_ignite),
}


def installed_peers() -> tuple[dict[str, Callable[[Workload, str], Timed]], list[str]]:
    found, missing = {}, []
    for module, (dist_name, fn) in PEERS.items():
        if importlib.util.find_spec(module) is None:
            missing.append(module)
            continue
        from importlib.metadata import PackageNotFoundError, version

        try:
            found[f"{module} {version(dist_name)}"] = fn
        except PackageNotFoundError:
            found[module] = fn
    return found, missing


# --- statistics ----------------------------------------------------------------------------
def durations(reps: list[list[float]]) -> torch.Tensor:
    """(reps, steps - 1) seconds per step; step 0 (``iter()`` of the loader) is left out."""
    n = min(len(r) for r in reps)
    t = torch.tensor([r[:n] for r in reps], dtype=torch.float64)
    return t[:, 1:] - t[:, :-1]


def per_step(d: torch.Tensor) -> float:
    """Mean over step indices of the median across reps (see the module docstring)."""
    return d.quantile(0.5, dim=0).mean().item()


def ratio_interval(raw: torch.Tensor, other: torch.Tensor, draws: int = 200) -> tuple[float, float]:
    g = torch.Generator().manual_seed(0)
    picks = torch.randint(0, raw.shape[0], (draws, raw.shape[0]), generator=g)
    ratios = torch.tensor([per_step(other[p]) / per_step(raw[p]) for p in picks], dtype=torch.float64)
    lo, hi = ratios.quantile(torch.tensor([0.05, 0.95], dtype=torch.float64)).tolist()
    return lo, hi


def same_weights(a: nn.Module, b: nn.Module, exact: bool = True) -> tuple[bool, float]:
    sa, sb = a.state_dict(), b.state_dict()
    diff = max((sa[k] - sb[k]).abs().max().item() for k in sa)
    if exact:
        return all(torch.equal(sa[k], sb[k]) for k in sa), diff
    return all(torch.allclose(sa[k], sb[k], rtol=1e-5, atol=1e-6) for k in sa), diff


@dataclass
class Row:
    label: str
    side: str
    raw_s: float
    side_s: float
    lo: float
    hi: float
    weights: str
    oneoff_ms: float
    whole: float = float("nan")  # the whole run (building the model to the last step) over the raw loop's
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        return self.side_s / self.raw_s


# --- single process ------------------------------------------------------------------------
def compare(wl: Workload, log_dir: str, peers: dict[str, Callable[[Workload, str], Timed]]) -> list[Row]:
    sides: dict[str, Callable[[], Timed]] = {
        "raw": lambda: raw_loop(wl),
        "floor": lambda: floor_loop(wl),
        "trainer": lambda: run_trainer(wl, log_dir),
    }
    for name, fn in peers.items():
        sides[name] = lambda fn=fn: fn(wl, log_dir)
    times: dict[str, list[list[float]]] = {s: [] for s in sides}
    oneoff: dict[str, list[float]] = {s: [] for s in sides}
    walls: dict[str, list[float]] = {s: [] for s in sides}
    weights: dict[str, list[tuple[bool, bool, float]]] = {s: [] for s in sides if s != "raw"}
    names = list(sides)
    for rep in range(-1, wl.reps):  # rep -1 warms up: imports, allocator, first writer
        order = names[rep % len(names):] + names[: rep % len(names)]
        if rep % 2:
            order.reverse()
        nets = {}
        if rep == 0:  # what the warm-up imported and built lives on: later collections skip it
            gc.collect()
            gc.freeze()
        for side in order:
            gc.collect()  # the previous run's garbage is collected now, not during our steps
            t0 = _workloads.CLOCK()
            steps, nets[side] = sides[side]()
            wall = _workloads.CLOCK() - t0
            if rep >= 0:
                times[side].append(steps)
                walls[side].append(wall)
                oneoff[side].append(wall - (steps[-1] - steps[0]))
        if rep >= 0:
            for side in weights:
                equal, diff = same_weights(nets["raw"], nets[side])
                weights[side].append((equal, equal or same_weights(nets["raw"], nets[side], exact=False)[0], diff))
    raw_d = durations(times["raw"])
    raw_s = per_step(raw_d)
    rows = []
    for side in names[1:]:
        d = durations(times[side])
        lo, hi = ratio_interval(raw_d, d)
        extra_ms = (statistics.median(oneoff[side]) - statistics.median(oneoff["raw"])) * 1e3
        # Whole runs: each rep's ratio (its runs were a few seconds apart at most), then the median.
        whole = statistics.median(w / r for w, r in zip(walls[side], walls["raw"]))
        row = Row(wl.label, side, raw_s, per_step(d), lo, hi, weights_verdict(weights[side]), extra_ms, whole)
        row.extra = {"raw_wall_s": statistics.median(walls["raw"]), "wall_s": statistics.median(walls[side])}
        rows.append(row)
    return rows


def weights_verdict(checks: list[tuple[bool, bool, float]]) -> str:
    """(torch.equal, allclose, max difference) of each rep -> identical, allclose or differ (max)."""
    if all(equal for equal, _, _ in checks):
        return "identical"
    if all(close for _, close, _ in checks):
        return "allclose"
    return f"differ ({max(diff for _, _, diff in checks):.1e})"


# --- DDP -----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_raw_ddp(wl: Workload, workdir: str, probe: bool) -> dict[str, Any]:
    import torch.multiprocessing as mp

    out = os.path.join(workdir, "raw-ddp.pt")
    mp.start_processes(raw_ddp_worker, args=(2, free_port(), wl, out, probe), nprocs=2, start_method="spawn")
    result = torch.load(out, weights_only=False)  # our own worker wrote it a moment ago
    os.remove(out)
    return result


def _retry_once(run: Callable[[], Any]) -> Any:
    """A spawned run can fail for reasons outside it on a shared machine (another job taking
    the rendezvous port between its pick and its bind): say so, and try once more."""
    try:
        return run()
    except Exception as err:  # noqa: BLE001 - reported, then retried; a second failure propagates
        print(f"    (a DDP run failed, retrying once: {str(err).splitlines()[0]})", flush=True)
        return run()


def compare_ddp(wl: Workload, log_dir: str) -> Row:
    """Trainer(strategy="ddp", devices=2) against a hand-written DDP loop, both on gloo with
    one thread per process; plus one process of each, for the throughput of two."""
    raw_t, tr_t, one_raw_t, one_tr_t, checks, probes = [], [], [], [], [], []
    for rep in range(wl.reps):
        gc.collect()
        result = _retry_once(lambda: run_raw_ddp(wl, log_dir, probe=rep == wl.reps - 1))
        raw_t.append(result["times"])
        if "allreduce_s" in result:
            probes.append(result)
        gc.collect()
        steps, net = _retry_once(lambda: run_trainer(wl, log_dir, strategy="ddp", devices=2))
        tr_t.append(steps)
        raw_net = build_net(wl)
        raw_net.load_state_dict(result["state"])
        equal, diff = same_weights(raw_net, net)
        checks.append((equal, equal or same_weights(raw_net, net, exact=False)[0], diff))
        gc.collect()
        one_raw_t.append(raw_loop(wl)[0])
        gc.collect()
        one_tr_t.append(run_trainer(wl, log_dir)[0])
    raw_d, tr_d = durations(raw_t), durations(tr_t)
    lo, hi = ratio_interval(raw_d, tr_d)
    verdict = weights_verdict(checks)
    row = Row(wl.label, "trainer ddp(2)", per_step(raw_d), per_step(tr_d), lo, hi, verdict, float("nan"))
    row.extra = {
        "one_raw_s": per_step(durations(one_raw_t)),
        "one_trainer_s": per_step(durations(one_tr_t)),
        **(probes[-1] if probes else {}),
    }
    return row


# --- peak RSS ------------------------------------------------------------------------------
def peak_rss(side: str, name: str, block: tuple[str, ...] = ()) -> tuple[list[str], int]:
    """Peak RSS (KiB) of a fresh process that runs one rep of one side, and which of
    ``_OPTIONAL_IMPORTS`` it loaded. ``block`` makes modules unimportable, as if not installed."""
    where = "_workloads" if side == "raw" else "overhead"
    code = (
        f"import sys; sys.path[:0] = [{_ROOT!r}, {_HERE!r}]; "
        + "".join(f"sys.modules[{m!r}] = None; " for m in block)
        + f"from {where} import rss_child; rss_child({name!r})"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=_ROOT)
    loaded, kib = out.stdout.split()[-2:]
    return ([] if loaded == "-" else loaded.split(",")), int(kib)


def rss_child(name: str) -> None:
    """In a fresh process: one Trainer run of the workload, then print the peak RSS in KiB."""
    torch.set_num_threads(1)
    logging.getLogger("trainer").setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as log_dir:
        run_trainer(WORKLOADS[name], log_dir)
    loaded = [m for m in _OPTIONAL_IMPORTS if sys.modules.get(m) is not None]
    print(",".join(loaded) or "-", peak_rss_kib())


# --- checkpoint stall ----------------------------------------------------------------------
CKPT_EVERY = 25  # steps between saves: the writer has that long to finish one (a few ms here)


def checkpoint_stall(wl: Workload, log_dir: str, every: int, reps: int) -> tuple[float, float, float]:
    """(step, time a write takes on the writer thread, training time lost per save), in seconds.

    Saves happen in the background, so their cost is not on one step: whatever the loop pays
    (copying the state, the writer thread's share of the interpreter) lands on the steps
    around it. So: reps of the Trainer with and without step checkpoints, interleaved; the
    mean step of each; the difference times ``every`` is the training time one save costs.
    """
    from trainer.checkpoint import files as ckpt_io

    writes: list[float] = []
    real_save_atomic = ckpt_io.save_atomic

    def timed_save_atomic(obj: dict[str, Any], path: str) -> None:
        t0 = time.perf_counter()
        real_save_atomic(obj, path)
        writes.append(time.perf_counter() - t0)

    with_saves, without = [], []
    ckpt_io.save_atomic = timed_save_atomic
    try:
        for rep in range(reps + 1):  # rep 0 warms up
            with tempfile.TemporaryDirectory() as ckpt_dir:
                ckpt = ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=every, every_n_epochs=None)
                sides = [(with_saves, [ckpt]), (without, None)]
                for out, extra in sides if rep % 2 else sides[::-1]:
                    gc.collect()
                    steps, _ = run_trainer(wl, log_dir, extra=extra)
                    if rep:
                        out.append(durations([steps])[0].mean().item())
    finally:
        ckpt_io.save_atomic = real_save_atomic
    step_s = statistics.median(without)
    lost = (statistics.median(with_saves) - step_s) * every
    return step_s, statistics.median(writes), max(lost, 0.0)


# --- profile -------------------------------------------------------------------------------
def profile(wl: Workload, log_dir: str, top: int = 15) -> None:
    """cProfile one long Trainer fit; print the top items by own time, per step.

    cProfile charges every Python call extra, so it overstates the Trainer's Python-level
    work next to torch's C++; read the ranking, and use the table for the cost.
    """
    import cProfile
    import pstats

    wl = workload(wl.name, steps=wl.steps * 10)
    run_trainer(wl, log_dir)  # warm-up
    prof = cProfile.Profile()
    prof.enable()
    run_trainer(wl, log_dir)
    prof.disable()
    stats = pstats.Stats(prof).stats  # {(file, line, func): (calls, ncalls, own, cumulative, callers)}
    own = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)
    mine = [kv for kv in own if any(f"{os.sep}{pkg}{os.sep}" in kv[0][0] for pkg in ("trainer", "callbacks", "strategies"))]
    for title, items in (("all code", own), ("trainer, callbacks, strategies", mine)):
        print(f"\ncProfile, {wl.label}, {wl.steps} steps: top {top} by own time ({title})")
        print(f"{'us/step own':>12} {'us/step cum':>12} {'calls/step':>10}  function")
        for (file, line, func), (_, ncalls, tottime, cumtime, _) in items[:top]:
            where = os.path.relpath(file, _ROOT) if file.startswith(_ROOT) else os.path.basename(file)
            print(f"{tottime / wl.steps * 1e6:>12.2f} {cumtime / wl.steps * 1e6:>12.2f} {ncalls / wl.steps:>10.2f}  {where}:{line}({func})")


# --- report --------------------------------------------------------------------------------
def machine() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{os.cpu_count()} cores, torch {torch.__version__}, Python {platform.python_version()}, "
        f"{platform.system()}, {datetime.date.today().isoformat()}, load avg {load:.1f}"
    )


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def report_overhead(wls: list[Workload], log_dir: str, peers: dict[str, Callable[[Workload, str], Timed]]) -> list[Row]:
    print(f"\n{'workload':<46} {'side':<10} {'raw ms/step':>11} {'side ms/step':>12} {'ratio [90% CI]':>22}  {'weights':<10} {'one-off ms':>10}")
    rows = []
    for wl in wls:
        compared = {row.side: row for row in compare(wl, log_dir, peers)}
        for row in compared.values():
            rows.append(row)
            print(
                f"{row.label:<46} {row.side:<10} {ms(row.raw_s):>11} {ms(row.side_s):>12} "
                f"{row.ratio:>7.3f} [{row.lo:.3f}, {row.hi:.3f}]  {row.weights:<10} {row.oneoff_ms:>10.1f}",
                flush=True,
            )
        floor, ours = compared["floor"], compared["trainer"]
        ours.extra["over_floor"] = ours.side_s / floor.side_s
        print(f"{'':<46} trainer / floor = {ours.extra['over_floor']:.3f} ({(ours.side_s - floor.side_s) * 1e6:+.0f} µs a step)", flush=True)
    return rows


def report_rss(wls: list[Workload]) -> float:
    """Prints peak RSS per workload; returns the worst Trainer/raw ratio."""
    print(f"\n{'peak RSS (fresh process, one rep)':<46} {'raw MiB':>8} {'trainer MiB':>12} {'ratio':>6}")
    worst = 0.0
    for wl in wls:
        _, raw = peak_rss("raw", wl.name)
        loaded, trainer = peak_rss("trainer", wl.name)
        line = f"{wl.label:<46} {raw / 1024:>8.1f} {trainer / 1024:>12.1f} {trainer / raw:>6.3f}"
        if loaded:  # not ours to import, but it lands in the process: show both
            _, without = peak_rss("trainer", wl.name, block=tuple(loaded))
            line += f"  (tensorboard imported {', '.join(loaded)}; without it {without / 1024:.1f} MiB, {without / raw:.3f})"
        worst = max(worst, trainer / raw)
        print(line, flush=True)
    return worst


def report_checkpoint_stall(wls: list[Workload], log_dir: str, quick: bool, every: int = CKPT_EVERY) -> None:
    title = f"ModelCheckpoint(every_n_train_steps={every})"
    print(f"\n{title:<46} {'step ms':>8} {'write ms':>9} {'lost/save ms':>13} {'lost/step':>10}")
    for wl in wls:
        step_s, write_s, lost_s = checkpoint_stall(wl, log_dir, every, reps=2 if quick else 5)
        print(f"{wl.label:<46} {ms(step_s):>8} {ms(write_s):>9} {ms(lost_s):>13} {lost_s / step_s:>10.2f}", flush=True)
    print("    write: on the writer thread, while training goes on; lost: extra training time per save "
          "(budget: one step)", flush=True)


def report_ddp(wls: list[Workload], log_dir: str, quick: bool) -> None:
    print(
        f"\n{'DDP, 2 processes on gloo, 1 thread each':<46} {'raw ms/step':>11} {'trainer':>8} {'ratio [90% CI]':>22}  "
        f"{'weights':<9} {'1 process raw/trainer ms':>24} {'throughput of 2, raw/trainer':>29}"
    )
    for wl in wls:
        if wl.name not in DDP_WORKLOADS:
            continue
        # Each rep spawns processes (seconds): fewer reps.
        row = compare_ddp(workload(wl.name, reps=2 if quick else 3, steps=wl.steps), log_dir)
        x = row.extra
        print(
            f"{row.label:<46} {ms(row.raw_s):>11} {ms(row.side_s):>8} {row.ratio:>7.3f} [{row.lo:.3f}, {row.hi:.3f}]  "
            f"{row.weights:<9} {ms(x['one_raw_s']) + ' / ' + ms(x['one_trainer_s']):>24} "
            f"{2 * x['one_raw_s'] / row.raw_s:>21.2f}x / {2 * x['one_trainer_s'] / row.side_s:.2f}x",
            flush=True,
        )
        at_sync = row.raw_s - x["nosync_step_s"]
        print(
            f"    raw DDP step {ms(row.raw_s)} ms = {ms(x['nosync_step_s'])} computing (no_sync, both processes "
            f"running; one process alone: {ms(x['one_raw_s'])}) + {ms(at_sync)} at the gradient all-reduce. Alone, "
            f"an all-reduce of the {x['grad_numel']:,} grads takes {ms(x['allreduce_s'])} when both ranks are ready "
            f"(gloo), but its median is {ms(x['allreduce_median_s'])}: the rest is waiting for the other rank",
            flush=True,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="tiny,medium,conv", help="comma-separated: " + ",".join(WORKLOADS))
    parser.add_argument("--ddp", action="store_true", help="also strategy='ddp', devices=2 against a raw DDP loop")
    parser.add_argument("--peers", action="store_true", help="also lightning/accelerate/ignite when installed")
    parser.add_argument("--quick", action="store_true", help="few reps and steps: a smoke run, rough numbers")
    parser.add_argument("--reps", type=int, help="timed reps per side (default: per workload)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="step clock: wall (default) or this process's CPU time (steadier on a busy machine)")
    parser.add_argument("--no-rss", action="store_true", help="skip the peak-RSS subprocesses")
    parser.add_argument("--no-ckpt", action="store_true", help="skip the step-checkpoint stall measurement")
    parser.add_argument("--profile", action="store_true", help="cProfile the Trainer on the first workload, then exit")
    parser.add_argument("--check", action="store_true", help="exit 1 when a budget is missed")
    args = parser.parse_args(argv)
    names = workload_names(parser, args.workloads)
    torch.set_num_threads(1)
    logging.getLogger("trainer").setLevel(logging.WARNING)  # the one-line run summary, per fit
    _workloads.CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    wls = [WORKLOADS[n] for n in names]
    if args.quick:
        wls = [workload(wl.name, reps=3, steps=min(wl.steps, 60)) for wl in wls]
    if args.reps:
        wls = [workload(wl.name, reps=args.reps, steps=wl.steps) for wl in wls]
    with tempfile.TemporaryDirectory() as log_dir:
        if args.profile:
            profile(wls[0], log_dir)
            return 0
        print(f"Trainer overhead vs a hand-written loop, 1 thread per process, {args.clock} clock", flush=True)
        peers, missing = installed_peers() if args.peers else ({}, [])
        if missing:
            print(f"peers not installed, skipped: {', '.join(missing)}")
        rows = report_overhead(wls, log_dir, peers)
        rss = 0.0 if args.no_rss else report_rss(wls)
        if not args.no_ckpt:
            report_checkpoint_stall(wls, log_dir, args.quick)
        if args.ddp:
            report_ddp(wls, log_dir, args.quick)
    ours = [r for r in rows if r.side == "trainer"]
    worst = max(ours, key=lambda r: r.ratio)
    tiny = next((r for r in ours if r.label.startswith("tiny")), None)
    missed = [r.label for r in ours if r.weights != "identical"]
    if tiny is None:
        missed.append("tiny not run, so the step budget was not checked")
    for r in ours:
        budget = BUDGET_RATIO.get(r.label.split()[0])
        if budget is not None and r.ratio > budget:
            missed.append(f"{r.label.split()[0]} ratio {r.ratio:.3f} > {budget}")
        budget = BUDGET_FLOOR.get(r.label.split()[0])
        if budget is not None and r.extra["over_floor"] > budget:
            missed.append(f"{r.label.split()[0]} {r.extra['over_floor']:.3f}x the floor > {budget}")
    if rss > BUDGET_RSS:
        missed.append(f"peak RSS ratio {rss:.3f} > {BUDGET_RSS}")
    verdict = "budget met" if not missed else "budget missed: " + "; ".join(missed)
    print(f"\nworst ratio {worst.ratio:.3f} ({worst.label}); {verdict}; {machine()}")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
