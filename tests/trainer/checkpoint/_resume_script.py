"""A user's training script for the resume tests: run it, kill it, run it again unchanged.

It does what the issue asks of the user and nothing more: ``seed_everything(0)`` at the
top, a shuffled DataLoader, dropout, and ``fit(..., ckpt_path="last")``. The test-only part
is ``--pause HOOK:STEP[:NTH]`` (write ``paused`` and sleep there, the NTH time the hook
sees that step, so the test can kill the job at a known point), ``--signal-wait STEP``
(write ``paused`` and wait there until a signal has arrived), ``--go-wait STEP`` (write
``paused`` and wait there until the file ``go`` exists) and ``--crash-once STEP`` (rank 1 dies
at that step unless ``crashed`` exists).
The final weights go to ``final.pt``.

``--crashes STEP:NTH,...`` runs the whole story in this one process, for the cases that need
no real kill: the uninterrupted run in ``straight/``, then in ``crashed/`` one run per crash
(an exception raised on every rank at the NTH batch end with ``global_step == STEP``, which
throws the run's state away as a kill would), each restarted from ``last``, then the run to
the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback, ModelCheckpoint
from strategies import DDPStrategy, FSDPStrategy
from trainer import Trainer, TrainModule, seed_everything

seed_everything(0)


class Net(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
        return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)


class AdamGroups(Net):
    """``--optimizer adam-groups``: Adam over two param groups (their own learning rates) with a
    scheduler stepped at every optimizer step."""

    def configure_optimizers(self):
        groups = [{"params": self.net[0].parameters()}, {"params": self.net[3].parameters(), "lr": 0.003}]
        opt = torch.optim.Adam(groups, lr=0.01)
        schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.8**step)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class PlainSGD(Net):
    """``--optimizer sgd``: SGD without momentum, which keeps no state at all."""

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class SkipFirstSteps(Callback):
    """``--skip-first N``: the first N updates are dropped (as NaNGuard(action="skip") drops a
    bad one), so an Adam has no state yet at a checkpoint taken before step N + 1."""

    def __init__(self, n: int) -> None:
        self.n = n

    def on_before_optimizer_step(self, trainer, module, optimizer):
        if trainer.global_step < self.n:
            trainer.skip_optimizer_step()


class ManualNet(Net):
    """The same network, stepped by hand with two optimizers (``--manual``): the body's SGD with
    its scheduler, stepped by the module at each epoch's end, and the head's Adam."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss)
        opts = self.optimizers()
        for opt in opts:
            opt.zero_grad()
        self.manual_backward(loss)
        for opt in opts:
            opt.step()
        return loss

    def on_train_epoch_end(self):
        self.lr_schedulers().step()

    def configure_optimizers(self):
        body = torch.optim.SGD(self.net[0].parameters(), lr=0.1, momentum=0.9)
        head = torch.optim.Adam(self.net[3].parameters(), lr=0.01)
        return [body, head], [torch.optim.lr_scheduler.StepLR(body, step_size=1, gamma=0.7)]


class Pause(Callback):
    """At ``hook`` with ``global_step == step``, the ``nth`` time (every rank): write ``paused``
    and wait to be killed. With accumulation, ``batch_end:3:2`` is the first micro-batch after
    step 3: the middle of an accumulation group."""

    def __init__(self, where: str) -> None:
        self.hook, step, *nth = where.split(":")
        self.step, self.nth = int(step), int(nth[0]) if nth else 1

    def _maybe(self, trainer: Trainer, hook: str) -> None:
        if hook == self.hook and trainer.global_step == self.step:
            self.nth -= 1
        if hook == self.hook and trainer.global_step == self.step and self.nth == 0:
            for cb in trainer.callbacks:  # test-only peek: the saves before the pause are on disk
                if isinstance(cb, ModelCheckpoint):
                    cb._writer.error()
            if trainer.is_global_zero:
                with open("paused", "w") as f:
                    f.write(str(os.getpid()))
            time.sleep(120)

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self._maybe(trainer, "batch_start")

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self._maybe(trainer, "batch_end")

    def on_validation_start(self, trainer, module):
        self._maybe(trainer, "val_start")


class WaitForSignal(Callback):
    """At the batch end of ``step`` (every rank): write ``paused``, then wait until this rank's
    stop handler has seen SIGTERM/SIGINT, so that the test knows where the signal landed."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step != self.step:
            return
        if trainer.is_global_zero:
            with open("paused", "w") as f:
                f.write(str(os.getpid()))
        deadline = time.monotonic() + 60
        while trainer._current_run().signals.received is None and time.monotonic() < deadline:  # test-only peek
            time.sleep(0.01)

    def on_exception(self, trainer, module, exception):
        print(f"rank {trainer.strategy.global_rank} stopped by {type(exception).__name__}", flush=True)


class WaitForGo(Callback):
    """At the batch end of ``step``: write ``paused``, then wait until the file ``go`` exists, so
    that a signal the test sends in between lands there, whatever this process does with it."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step != self.step:
            return
        with open("paused", "w") as f:
            f.write(str(os.getpid()))
        deadline = time.monotonic() + 60
        while not os.path.exists("go") and time.monotonic() < deadline:
            time.sleep(0.01)


class CrashOnce(Callback):
    """Rank 1 dies at ``step`` on the first attempt only (the ``crashed`` file remembers)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.step and trainer.strategy.global_rank == 1 and not os.path.exists("crashed"):
            open("crashed", "w").close()
            os._exit(3)


class Crash(Exception):
    pass


class CrashAt(Callback):
    def __init__(self, where: str) -> None:
        step, nth = where.split(":")
        self.step, self.nth = int(step), int(nth)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            self.nth -= 1
            if self.nth == 0:
                raise Crash(f"crashed at step {self.step}")


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--strategy", default="single")
    p.add_argument("--devices", default="1")
    p.add_argument("--max-epochs", type=int, default=3)
    p.add_argument("--every", type=int, default=3, help="ModelCheckpoint(every_n_train_steps=...)")
    p.add_argument("--seed", type=int, default=None, help="re-seed differently after the import-time seed")
    p.add_argument("--pause", default=None)
    p.add_argument("--signal-wait", type=int, default=None)
    p.add_argument("--go-wait", type=int, default=None)
    p.add_argument("--crash-once", type=int, default=None)
    p.add_argument("--precision", default="32")
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--manual", action="store_true", help="ManualNet: two optimizers stepped by hand")
    p.add_argument("--optimizer", default="momentum", choices=["momentum", "sgd", "adam-groups"])
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--skip-first", type=int, default=0)
    p.add_argument("--sharded", action="store_true", help="FSDPStrategy(checkpoint='sharded')")
    p.add_argument("--fork", action="store_true", help="workers forked, not spawned (faster to start)")
    p.add_argument("--crashes", default=None, help="STEP:NTH,...: crash and restart in this process")
    args = p.parse_args(argv)
    if args.crashes is None:
        fit(args, ".")
        return
    fit(args, "straight")
    for where in args.crashes.split(","):
        try:
            fit(args, "crashed", CrashAt(where))
        except Exception as err:  # noqa: BLE001 - under ddp the workers' Crash comes back as a WorkerError
            if "crashed at step" not in str(err):
                raise
        else:
            raise RuntimeError(f"the run did not reach its crash at {where}")
    fit(args, "crashed")


def fit(args: argparse.Namespace, folder: str, crash: Callback | None = None) -> None:
    if args.crashes is not None:
        seed_everything(0)  # what a fresh process would start from
    if args.seed is not None:
        seed_everything(args.seed)

    g = torch.Generator().manual_seed(1)  # the data itself is fixed; only its order is shuffled
    x, y = torch.randn(96, 8, generator=g), torch.randint(0, 2, (96,), generator=g)
    train = DataLoader(TensorDataset(x[:64], y[:64]), batch_size=8, shuffle=True)
    val = DataLoader(TensorDataset(x[64:], y[64:]), batch_size=16)
    # save_top_k=-1 keeps every file, so a test can compare each one with the uninterrupted run's.
    # One trigger per ModelCheckpoint (as in Lightning): every few steps, and every epoch's end.
    callbacks: list[Callback] = [
        ModelCheckpoint(every_n_train_steps=args.every, save_top_k=-1),
        ModelCheckpoint(filename="{epoch}-{step}-end", every_n_epochs=1, save_top_k=-1, save_on_train_epoch_end=True),
    ]
    if args.pause:
        callbacks.append(Pause(args.pause))  # after ModelCheckpoint: a pause at batch_end follows the save
    if args.signal_wait is not None:
        callbacks.append(WaitForSignal(args.signal_wait))
    if args.go_wait is not None:
        callbacks.append(WaitForGo(args.go_wait))
    if args.crash_once is not None:
        callbacks.append(CrashOnce(args.crash_once))
    if args.skip_first:
        callbacks.append(SkipFirstSteps(args.skip_first))
    if crash is not None:
        callbacks.append(crash)
    model = ManualNet() if args.manual else {"momentum": Net, "sgd": PlainSGD, "adam-groups": AdamGroups}[args.optimizer]()
    strategy: Any = args.strategy
    if args.sharded or args.fork:
        options = {"start_method": "fork" if args.fork else "spawn"}
        if args.sharded:
            options["checkpoint"] = "sharded"
        strategy = {"ddp": DDPStrategy, "fsdp": FSDPStrategy}[args.strategy](**options)
    trainer = Trainer(
        strategy=strategy, devices=int(args.devices) if args.devices.isdigit() else args.devices,
        max_epochs=args.max_epochs, val_check_interval=3, enable_progress_bar=False, callbacks=callbacks,
        precision=args.precision, deterministic=args.deterministic, accumulate_grad_batches=args.accumulate,
        log_dir=os.path.join(folder, "runs") if folder != "." else "runs",
    )
    trainer.fit(model, train, val, ckpt_path="last")
    if trainer.is_global_zero:
        torch.save(model.state_dict(), os.path.join(folder, "final.pt"))
        print(f"done epoch={trainer.current_epoch} step={trainer.global_step}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
