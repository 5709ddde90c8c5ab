"""How much training time a checkpoint save of a big model costs the loop.

    python benchmarks/checkpoint_stall.py                 # models of 100 MB and 1000 MB
    python benchmarks/checkpoint_stall.py --mb 5 --reps 2  # a smoke run (numbers are rough)

Each model is a stack of 8 square Linear layers, sized so that its checkpoint (the weights and
Adam's two moments) is about ``--mb`` MiB, trained with Adam on batches of 16. A run trains
``(saves + 1) * every - 1`` steps and saves at steps ``every, 2 * every, ...``; the clock runs
from the second step's start to the last step's end (the first step makes Adam's state), so
each save has ``every - 1`` steps after it in which a background write goes on, and a save that
waits for the previous write pays that too. The savers:

- floor: ``clone()`` of every tensor of the model's and the optimizer's state dicts, kept until
  the next save. Any saver that lets training go on while it writes must take a copy like this.
- ours: ``ModelCheckpoint(every_n_train_steps=every)`` in our ``Trainer``, as a user runs it.
- Lightning: Lightning 2.6's default ``ModelCheckpoint(every_n_train_steps=every)`` in its own
  ``Trainer`` (it waits for ``torch.save``). Skipped with a line when lightning is missing.
- DCP: ``torch.distributed.checkpoint.async_save`` of ``{"model", "optim"}`` state dicts on a
  one-rank gloo group, with process-based staging where this torch has it; the previous save's
  future is waited for before the next, as its docs do.

The floor and DCP run in our Trainer as callbacks. Every saver's run is paired with a run of the
same Trainer without saves, in the same rep, and the reps interleave the sides (the order turns
each rep). Training time lost per save = (window with saves - window without) / saves, the
median over reps. The floor is never taken below the median time of its clone alone, which the
loop waits for. The last line is the worst ratio of ours to the floor over the sizes.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from typing import Any, Callable, ClassVar

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [p for p in (os.path.dirname(_HERE), _HERE) if p not in sys.path[:2]]

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from callbacks import Callback, ModelCheckpoint  # noqa: E402
from trainer import Trainer, TrainModule  # noqa: E402

SCRATCH = os.path.join(_HERE, ".scratch")  # on the checkout's disk (git ignores it): fsync is part of a save
LAYERS, BATCH = 8, 16


def make_net(mb: float) -> nn.Sequential:
    width = max(8, int((mb * 2**20 / 4 / 3 / LAYERS) ** 0.5))  # LAYERS width x width weights, three copies (Adam)
    layers: list[nn.Module] = []
    for _ in range(LAYERS):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def make_loader(net: nn.Sequential, steps: int) -> DataLoader:
    width = net[0].in_features
    data = TensorDataset(torch.randn(steps * BATCH, width), torch.randn(steps * BATCH, width))
    return DataLoader(data, batch_size=BATCH)


class Net(TrainModule):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-4)


def window_timer(base: type) -> Any:
    """A callback (of ``base``: ours or Lightning's) that times from the second step's start to
    the last step's end."""

    class WindowTimer(base):
        def __init__(self) -> None:
            self.start = self.end = 0.0

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if trainer.global_step == 1:
                self.start = time.perf_counter()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.end = time.perf_counter()

    return WindowTimer()


class CloneFloor(Callback):
    """Clones every tensor of the model's and the optimizer's state; keeps the copy until the next."""

    seconds: ClassVar[list[float]] = []  # every clone's own time, across runs

    def __init__(self, every: int) -> None:
        self.every, self.copy = every, None

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step % self.every == 0:
            self.copy = None
            start = time.perf_counter()
            state = {"model": module.state_dict(), "optim": trainer.optimizers[0].state_dict()}
            self.copy = _clone_tensors(state)
            CloneFloor.seconds.append(time.perf_counter() - start)


def _clone_tensors(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, dict):
        return {k: _clone_tensors(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_clone_tensors(v) for v in x)
    return x


def dcp_process_staging() -> Any:
    """``AsyncCheckpointerType.PROCESS`` where this torch has it, else None (thread staging)."""
    from torch.distributed.checkpoint import state_dict_saver

    kind = getattr(state_dict_saver, "AsyncCheckpointerType", None)
    return getattr(kind, "PROCESS", None)


class DCPAsyncSave(Callback):
    """``torch.distributed.checkpoint.async_save`` every ``every`` steps, into ``folder``."""

    def __init__(self, every: int, folder: str) -> None:
        self.every, self.folder, self.pending = every, folder, None

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step % self.every:
            return
        from torch.distributed.checkpoint import async_save

        self._wait()
        state = {"model": module.state_dict(), "optim": trainer.optimizers[0].state_dict()}
        kind = dcp_process_staging()
        options = {} if kind is None else {"async_checkpointer_type": kind}
        path = os.path.join(self.folder, f"step-{trainer.global_step}")
        self.pending = async_save(state, checkpoint_id=path, **options)

    def on_train_end(self, trainer, module):
        self._wait()

    def _wait(self) -> None:
        if self.pending is not None:
            result = getattr(self.pending, "upload_completion", self.pending)  # AsyncSaveResponse or a Future
            result.result()
            self.pending = None


def run_ours(net: nn.Module, steps: int, folder: str, saver: Callable[[str], Callback] | None) -> float:
    timer = window_timer(Callback)
    callbacks = [timer] + ([saver(folder)] if saver else [])
    trainer = Trainer(
        max_steps=steps, logger=False, enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=10**9,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks), callbacks=callbacks,
        default_root_dir=folder,
    )
    trainer.fit(Net(net), make_loader(net, steps))
    return timer.end - timer.start


def run_lightning(net: nn.Module, steps: int, folder: str, every: int | None) -> float:
    import lightning.pytorch as L

    class LitNet(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.Adam(self.parameters(), lr=1e-4)

    timer = window_timer(L.Callback)
    callbacks = [timer] + ([L.callbacks.ModelCheckpoint(dirpath=folder, every_n_train_steps=every)] if every else [])
    trainer = L.Trainer(
        accelerator="cpu", devices=1, max_steps=steps, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=bool(every), callbacks=callbacks, default_root_dir=folder,
    )
    trainer.fit(LitNet(), make_loader(net, steps))
    return timer.end - timer.start


def start_gloo() -> None:
    import torch.distributed as dist

    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        dist.init_process_group("gloo", rank=0, world_size=1)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sides(every: int, lightning: bool) -> dict[str, tuple[str, Callable[[nn.Module, int, str], float]]]:
    """name -> (the name of its run without saves, the run)."""
    def ours(saver: Callable[[str], Callback] | None) -> Callable[[nn.Module, int, str], float]:
        return lambda net, steps, folder: run_ours(net, steps, folder, saver)

    def lightnings(every_n: int | None) -> Callable[[nn.Module, int, str], float]:
        return lambda net, steps, folder: run_lightning(net, steps, folder, every_n)

    out = {
        "none (ours)": ("", ours(None)),
        "floor: clone()": ("none (ours)", ours(lambda _: CloneFloor(every))),
        "ours: ModelCheckpoint": ("none (ours)", ours(lambda f: ModelCheckpoint(dirpath=f, every_n_train_steps=every))),
        "DCP async_save": ("none (ours)", ours(lambda f: DCPAsyncSave(every, f))),
    }
    if lightning:
        out["none (Lightning)"] = ("", lightnings(None))
        out["Lightning ModelCheckpoint"] = ("none (Lightning)", lightnings(every))
    return out


def measure(mb: float, every: int, saves: int, reps: int, lightning: bool) -> tuple[dict[str, float], float, float]:
    """({saver: training time lost per save}, step seconds, checkpoint MiB) for a model of ``mb``."""
    torch.manual_seed(0)
    net = make_net(mb)
    mib = 3 * sum(p.numel() * p.element_size() for p in net.parameters()) / 2**20
    steps = (saves + 1) * every - 1
    runs = sides(every, lightning)
    times: dict[str, list[float]] = {name: [] for name in runs}
    os.makedirs(SCRATCH, exist_ok=True)
    names = list(runs)
    for rep in range(reps + 1):  # rep 0 warms up
        turn = rep % len(names)
        for name in names[turn:] + names[:turn]:
            gc.collect()
            folder = tempfile.mkdtemp(dir=SCRATCH)
            try:
                seconds = runs[name][1](net, steps, folder)
            finally:
                shutil.rmtree(folder, ignore_errors=True)
            if rep:
                times[name].append(seconds)
    lost = {
        name: statistics.median((w - b) / saves for w, b in zip(times[name], times[base]))
        for name, (base, _) in runs.items() if base
    }
    # The loop waits for the whole clone and nothing else, so the floor costs at least that: on a
    # noisy machine the difference of two windows can come out lower (or below zero).
    lost["floor: clone()"] = max(lost["floor: clone()"], statistics.median(CloneFloor.seconds))
    CloneFloor.seconds.clear()
    return lost, statistics.median(times["none (ours)"]) / (steps - 1), mib


def machine() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{os.cpu_count()} cores, {torch.get_num_threads()} threads, torch {torch.__version__}, Python "
        f"{platform.python_version()}, {platform.system()}, {datetime.date.today().isoformat()}, load avg {load:.1f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, nargs="+", default=[100.0, 1000.0], help="checkpoint sizes, in MiB")
    parser.add_argument("--every", type=int, default=10, help="steps between saves")
    parser.add_argument("--saves", type=int, default=3, help="saves per run")
    parser.add_argument("--reps", type=int, default=5, help="interleaved reps (after one warm-up)")
    args = parser.parse_args(argv)
    if args.every < 2 or args.saves < 1 or args.reps < 1:
        parser.error(
            f"--every must be 2 or more, --saves and --reps 1 or more; got {args.every!r}, {args.saves!r}, "
            f"{args.reps!r}"
        )
    warnings.filterwarnings("ignore")
    try:
        import lightning  # noqa: F401

        lightning_version: str | None = lightning.__version__
    except ImportError:
        lightning_version = None
    for name in ("lightning.pytorch", "lightning.fabric", "trainer"):  # after the import, which sets its own levels
        logging.getLogger(name).setLevel(logging.ERROR)
    start_gloo()
    no_process = dcp_process_staging() is None
    staging = "thread staging (no process staging in this torch)" if no_process else "process staging"
    print(machine())
    print(f"{LAYERS} Linear layers + Adam, batch {BATCH}, a save every {args.every} steps, {args.saves} saves a run, "
          f"medians of {args.reps} interleaved reps; DCP async_save with {staging}")
    if lightning_version is None:
        print("lightning not installed: its row is skipped (pip install lightning)")
    ratios: list[float] = []
    for mb in args.mb:
        lost, step_s, mib = measure(mb, args.every, args.saves, args.reps, lightning_version is not None)
        floor = lost["floor: clone()"]
        print(f"\ncheckpoint {mib:.1f} MiB, step {step_s * 1e3:.1f} ms without saves")
        print(f"  {'saver':<34} {'lost/save ms':>13} {'x floor':>8} {'x step':>7}")
        for name, seconds in lost.items():
            label = f"Lightning {lightning_version} ModelCheckpoint" if name.startswith("Lightning") else name
            print(f"  {label:<34} {seconds * 1e3:13.1f} {seconds / floor:8.2f} {seconds / step_s:7.2f}")
        ratios.append(lost["ours: ModelCheckpoint"] / floor)
    print("\nlost/save: training time one save costs the loop (with saves - without, per save); x step: in steps")
    print(f"worst stall ratio ours/floor: {max(ratios):.2f}")
    import torch.distributed as dist

    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
