"""Failing ranks and hangs under real DDP (gloo, 2 spawned ranks): the job stops quickly and says why.

A rank that raises, is killed, hangs outside collectives, produces a NaN loss, or runs out of
data early must never leave the job hanging or processes behind. Each test records the time
of the injected fault, so "stops within 30 s" does not depend on how long workers take to start.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from callbacks import Callback
from strategies import DDPStrategy, WorkerError
from tests._models import Classifier, loader, quiet
from trainer import Trainer

pytestmark = pytest.mark.slow

STOP_WITHIN_S = 30.0
# Workers fork from one warm server that imported torch once (tests/conftest.py's
# FORK_SERVER_PRELOAD), instead of starting two fresh interpreters per test: the failure paths
# under test are the same, and each test is seconds faster.
# (The default start method, spawn, is what tests/strategies/test_ddp.py runs.)
START_METHOD = "forkserver"


class Faulty(Classifier):
    """Injects ``fault`` on rank ``rank`` at batch ``at`` and notes the time in ``out``."""

    def __init__(self, fault: str, out: str, rank: int = 1, at: int = 2) -> None:
        super().__init__()
        self.fault, self.out, self.rank, self.at = fault, out, rank, at

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        if self.trainer.strategy.global_rank != self.rank or batch_idx != self.at:
            return loss
        Path(self.out, "fault_time").write_text(repr(time.time()))
        if self.fault == "raise":
            raise RuntimeError(f"injected failure on rank {self.rank}")
        if self.fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.fault == "hang":
            time.sleep(3600)  # stuck outside any collective
        if self.fault == "nan":
            return loss * float("nan")
        return loss


class Probe(Callback):
    """Each rank writes its pid when it starts, and the exception it ends with, if any."""

    def __init__(self, out: str) -> None:
        self.out = out

    def setup(self, trainer, module, stage):
        Path(self.out, f"pid-{trainer.strategy.global_rank}").write_text(str(os.getpid()))

    def on_exception(self, trainer, module, exception):
        Path(self.out, f"exception-{trainer.strategy.global_rank}").write_text(f"{type(exception).__name__}: {exception}")


class StopOnOneRank(Callback):
    """Sets should_stop on rank 1 only, after global step ``at``."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.strategy.global_rank == 1 and trainer.global_step == self.at:
            trainer.should_stop = True


class Shard:
    """A user's own sharding: rank r gets ``4 - r`` batches (sized or not), so the ranks disagree."""

    def __init__(self, sized: bool) -> None:
        self.sized = sized

    def _count(self) -> int:
        return 4 - int(os.environ.get("RANK", "0"))

    def __iter__(self):
        return iter(list(loader(64, 4))[: self._count()])

    def __len__(self) -> int:
        if not self.sized:
            raise TypeError("no length")
        return self._count()


class CountSteps(Callback):
    """The global step at each epoch end; its state comes back from rank 0 to the caller's copy."""

    def __init__(self) -> None:
        self.per_epoch: list[int] = []

    def on_train_epoch_end(self, trainer, module):
        self.per_epoch.append(trainer.global_step)

    def state_dict(self):
        return {"per_epoch": self.per_epoch}

    def load_state_dict(self, state_dict):
        self.per_epoch = state_dict["per_epoch"]


# --- helpers ---------------------------------------------------------------------------------
def _descendants(pid: int) -> set[int]:
    """Every live process below ``pid``, except multiprocessing's own helpers (the resource
    tracker and the fork server live as long as this process; their children count)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            kids = [int(k) for k in (task / "children").read_text().split()]
        except OSError:  # the thread or process ended meanwhile
            continue
        for kid in kids:
            if not any(helper in _cmdline(kid) for helper in (b"resource_tracker", b"forkserver")):
                found.add(kid)
            found |= _descendants(kid)
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"  # a zombie has exited


def _assert_nothing_left(out: Path, children_before: set[int]) -> None:
    pids = [int(p.read_text()) for p in out.glob("pid-*")]
    assert len(pids) == 2, "both ranks started"
    assert not [p for p in pids if _alive(p)], "a worker outlived the job"
    assert multiprocessing.active_children() == []
    assert _descendants(os.getpid()) <= children_before


def _seconds_since_fault(out: Path) -> float:
    return time.time() - float((out / "fault_time").read_text())


def _fit_ddp(out: Path, model, train=None, timeout: float = 60, **options) -> Trainer:
    options = {"max_steps": 20, **options}
    callbacks = [Probe(str(out)), *options.pop("callbacks", [])]
    strategy = DDPStrategy(timeout=timeout, start_method=START_METHOD)
    trainer = Trainer(strategy=strategy, devices=2, callbacks=callbacks, **quiet(**options))
    trainer.fit(model, train if train is not None else loader(256, 4))
    return trainer


# --- a rank fails (a rank that raises: tests/strategies/test_ddp.py) ----------------------------
def test_a_rank_killed_by_sigkill_is_named_with_its_signal(tmp_path):
    before = _descendants(os.getpid())
    with pytest.raises(WorkerError) as info:
        _fit_ddp(tmp_path, Faulty("kill", str(tmp_path)))
    assert _seconds_since_fault(tmp_path) < STOP_WITHIN_S
    assert info.value.rank == 1
    assert "DDP rank 1 (of 2) was killed by signal SIGKILL" in str(info.value)
    _assert_nothing_left(tmp_path, before)


def test_a_rank_stuck_outside_collectives_fails_the_job_at_the_timeout(tmp_path):
    """Rank 1 sleeps in training_step; rank 0 waits in the gradient all-reduce until
    DDPStrategy(timeout=5) expires, and the error says where rank 1 was stuck."""
    before = _descendants(os.getpid())
    with pytest.raises(WorkerError) as info:
        _fit_ddp(tmp_path, Faulty("hang", str(tmp_path)), timeout=5)
    waited = _seconds_since_fault(tmp_path)
    assert 5 <= waited < STOP_WITHIN_S
    message = str(info.value)
    assert info.value.rank == 0 and "Timed out waiting 5000ms" in message
    assert "collective timeout (5 s, DDPStrategy(timeout=...))" in message
    assert "Rank 1 was still running" in message
    assert "in training_step" in message.split("Rank 1 was still running")[1]  # its stack, from faulthandler
    _assert_nothing_left(tmp_path, before)


def test_a_nan_loss_on_one_rank_stops_every_rank_at_the_same_step(tmp_path):
    with pytest.raises(WorkerError) as info:
        _fit_ddp(tmp_path, Faulty("nan", str(tmp_path), at=3), log_every_n_steps=2)
    assert "FloatingPointError" in str(info.value) and "at step 4" in str(info.value)
    # Rank 0's own loss was finite, yet it took the same decision at the same step.
    decisions = sorted(p.name for p in tmp_path.glob("exception-*"))
    assert decisions == ["exception-0", "exception-1"]
    for rank in (0, 1):
        text = (tmp_path / f"exception-{rank}").read_text()
        assert text.startswith("FloatingPointError") and "at step 4" in text


# --- ranks that disagree on when to stop ------------------------------------------------------
def test_should_stop_on_one_rank_stops_every_rank_and_uneven_data_is_padded(tmp_path):
    """45 samples, batch 2, 2 ranks: DistributedSampler pads to 12 batches each, so epoch 0
    completes on both. Rank 1 alone asks to stop after step 15; the ranks agree every 8 steps,
    so both stop after step 16."""
    count = CountSteps()
    trainer = _fit_ddp(
        tmp_path, Classifier(), train=loader(45, 2), max_steps=None, max_epochs=3, callbacks=[StopOnOneRank(15), count]
    )
    assert trainer.global_step == 16
    assert trainer.current_epoch == 1  # epoch 1 was cut short
    assert count.per_epoch == [12]  # 12 padded batches in epoch 0 on each rank; epoch 1's end never came
    assert not list(tmp_path.glob("exception-*"))


def test_ranks_with_different_sized_loaders_are_refused_before_training(tmp_path):
    with pytest.raises(WorkerError) as info:
        _fit_ddp(tmp_path, Classifier(), train=Shard(sized=True), max_steps=None, max_epochs=2)
    assert "different numbers of training batches per epoch: [4, 3] (by rank)" in str(info.value)
    assert "limit_train_batches<=3" in str(info.value)


def test_unsized_loaders_that_run_out_at_different_times_end_the_epoch_together(tmp_path):
    """Rank 1's iterable yields 3 batches, rank 0's 4: without agreement rank 0 would wait
    forever in its 4th all-reduce. Every epoch ends on both ranks after 3 steps."""
    count = CountSteps()
    trainer = _fit_ddp(tmp_path, Classifier(), train=Shard(sized=False), max_steps=None, max_epochs=2, callbacks=[count])
    assert trainer.global_step == 6 and trainer.current_epoch == 2
    assert count.per_epoch == [3, 6]  # rank 0's callback, sent back to the caller


# --- the true cause, and nothing left behind ----------------------------------------------------
class HangsOnRank1:
    """A dataset whose item 9 never comes: its loader worker hangs in ``__getitem__``. The DistributedSampler
    of an unshuffled loader gives rank 1 the odd items, so only rank 1 asks for it (its second batch)."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i):
        if i == 9:
            time.sleep(3600)
        return loader(64, 1).dataset[i]


class StampsTheFault(Classifier):
    def __init__(self, out: str) -> None:
        super().__init__()
        self.out = out

    def on_train_batch_end(self, outputs, batch, batch_idx):
        Path(self.out, "fault_time").write_text(repr(time.time()))  # the hang comes at the next batch


def test_a_dataloader_timeout_is_named_as_such_and_its_hung_worker_does_not_outlive_the_job(tmp_path):
    before = _descendants(os.getpid())
    # 10 s: long enough that rank 0's worker, slow to start on a loaded machine, never times out first
    hung = DataLoader(HangsOnRank1(), batch_size=4, num_workers=1, timeout=10)
    with pytest.raises(WorkerError) as info:
        _fit_ddp(tmp_path, StampsTheFault(str(tmp_path)), train=hung, timeout=60)
    message = str(info.value)
    assert info.value.rank == 1 and message.startswith("DDP rank 1 (of 2) failed:")
    assert "DataLoader timed out after 10 seconds" in message and "collective timeout" not in message
    assert "Rank 1's DataLoader waited longer than its timeout (10 s) for a batch from its worker processes" in message
    time.sleep(10)
    _assert_nothing_left(tmp_path, before)


class ExitsOnRank1(Classifier):
    def __init__(self, out: str, code: int) -> None:
        super().__init__()
        self.out, self.code = out, code

    def training_step(self, batch, batch_idx):
        if self.trainer.strategy.global_rank == 1 and batch_idx == 2:
            Path(self.out, "fault_time").write_text(repr(time.time()))
            sys.exit(self.code)
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("how", ["sys.exit", "os._exit"])
def test_a_rank_that_exits_with_status_0_mid_fit_is_the_one_named(tmp_path, how):
    before = _descendants(os.getpid())
    model = ExitsOnRank1(str(tmp_path), 0) if how == "sys.exit" else OsExitOnRank1(str(tmp_path), 0)
    with pytest.raises(WorkerError) as info:
        _fit_ddp(tmp_path, model)
    assert _seconds_since_fault(tmp_path) < STOP_WITHIN_S
    message = str(info.value)
    assert info.value.rank == 1, message
    assert message.startswith("DDP rank 1 (of 2) exited with status 0 before its fit finished"), message
    time.sleep(10)
    _assert_nothing_left(tmp_path, before)


class OsExitOnRank1(ExitsOnRank1):
    def training_step(self, batch, batch_idx):
        if self.trainer.strategy.global_rank == 1 and batch_idx == 2:
            Path(self.out, "fault_time").write_text(repr(time.time()))
            os._exit(self.code)
        return super().training_step(batch, batch_idx)


class CountsExceptions(Callback):
    """Counts ``on_exception`` in this process's copy, and notes each call's process in ``out``."""

    def __init__(self, out: str) -> None:
        self.out, self.calls = out, 0

    def on_exception(self, trainer, module, exception):
        self.calls += 1
        Path(self.out, f"on_exception-{os.getpid()}").write_text(type(exception).__name__)


class FailsAtTrainStart(Classifier):
    def on_train_start(self):
        raise RuntimeError("Error during train")


@pytest.mark.usefixtures("ranks_from_the_fork_server")  # ranks fork from a warm server: see tests/conftest.py
@pytest.mark.parametrize("strategy, in_caller", [("ddp_spawn", True), ("ddp", False)])
def test_on_exception_runs_in_the_caller_under_ddp_spawn_and_in_each_rank_under_ddp(tmp_path, strategy, in_caller):
    # Lightning's: its ddp_spawn runs the hooks once, in the caller, with the error it raises (torch's
    # ProcessRaisedException, which WorkerError is); its ddp runs them in each rank's own process.
    counter = CountsExceptions(str(tmp_path))
    trainer = Trainer(strategy=strategy, devices=1, callbacks=[counter], **quiet(max_steps=2))
    with pytest.raises(WorkerError, match="Error during train"):
        trainer.fit(FailsAtTrainStart(), loader(64))
    calls = {p.name.split("-")[1]: p.read_text() for p in tmp_path.glob("on_exception-*")}
    assert counter.calls == (1 if in_caller else 0) and len(calls) == 1
    assert calls == ({str(os.getpid()): "WorkerError"} if in_caller else {next(iter(calls)): "RuntimeError"})
    assert in_caller or str(os.getpid()) not in calls
