"""Bit-exact resume: real jobs killed by real signals, restarted with ``ckpt_path="last"``.

Each job runs ``_resume_script.py`` (a user's script: ``seed_everything(0)`` at the top,
shuffled DataLoader, dropout, momentum, a StepLR scheduler, validation every 3 batches,
``ModelCheckpoint(every_n_train_steps=3)`` and one more for epoch ends) in its own process group. The test waits until
the job reaches a chosen point, kills or signals it there, restarts the same script, and
checks that the final weights, and every checkpoint written on the way, are ``torch.equal``
to an uninterrupted run's.

Single device, 64 samples in batches of 8: 8 steps per epoch, 3 epochs (24 steps); step
checkpoints at 3, 6, 9, ..., epoch checkpoints (``*-end.ckpt``) at 8, 16 and 24. DDP(2): 4
steps per epoch, 5 epochs.

The tests at the end run in-process, with a crash simulated by an exception, for the
subtle cases: accumulation, loader generators, epoch means, DataLoader subclasses, signals.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from callbacks import Callback, ModelCheckpoint
from tests._models import Classifier, dataset, loader, quiet
from tests.conftest import requires_cuda
from trainer import Interrupted, Trainer, seed_everything
from trainer.core.signals import StopSignals
from trainer.checkpoint import layout

SCRIPT = str(Path(__file__).with_name("_resume_script.py"))
DDP = ["--strategy", "ddp", "--devices", "2"]
DDP_EPOCHS = ["--max-epochs", "5"]  # 20 steps: stop requests are agreed at steps 8 and 16
# Workers forked, not spawned, where a kill -9 of the whole job is the point: the same training,
# a quarter of the start-up. The signal tests spawn theirs, as the launching parent forwards signals.
FORK = ["--fork"]


# --- running and stopping jobs ---------------------------------------------------------------
class Job:
    """The script running in ``cwd``, in its own process group (the parent and its DDP workers).

    It starts with SIGINT at its default, as a command typed in a terminal does, whatever this
    pytest inherited (started by a script with ``&``, pytest itself ignores SIGINT), or with
    SIGINT ignored (``sigint_ignored``), as such a background job does.
    """

    def __init__(
        self, args: list[str], cwd: Path, env: dict[str, str], launcher: list[str] | None = None,
        sigint_ignored: bool = False,
    ) -> None:
        self.cwd = cwd
        n = len(list(cwd.glob("job-*.log")))
        self.log_path = cwd / f"job-{n}.log"
        (cwd / "paused").unlink(missing_ok=True)
        env = {**env, "OMP_NUM_THREADS": "1"}  # 2 cores: don't let each rank spin up a thread pool
        sigint = signal.SIG_IGN if sigint_ignored else signal.SIG_DFL
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, *(launcher or []), SCRIPT, *args], cwd=cwd, env=env,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=lambda: signal.signal(signal.SIGINT, sigint),  # in the child, before exec
            )

    @property
    def log(self) -> str:
        return self.log_path.read_text()

    def wait_until_paused(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not (self.cwd / "paused").exists():
            if self.proc.poll() is not None:
                pytest.fail(f"the job exited ({self.proc.returncode}) before reaching its pause point:\n{self.log}")
            if time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"the job did not reach its pause point within {timeout} s:\n{self.log}")
            time.sleep(0.02)

    def kill(self) -> None:
        """``kill -9`` of the whole job, as a scheduler or the OOM killer would."""
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def wait(self, timeout: float = 120) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the job did not finish within {timeout} s:\n{self.log}")


def run(args: list[str], cwd: Path, env: dict[str, str], **kw) -> Job:
    job = Job(args, cwd, env, **kw)
    assert job.wait() == 0, job.log
    return job


def killed_at(args: list[str], where: str, cwd: Path, env: dict[str, str]) -> Job:
    job = Job([*args, "--pause", where], cwd, env)
    job.wait_until_paused()
    job.kill()
    assert job.proc.returncode == -signal.SIGKILL
    return job


def resumed_from(job: Job) -> tuple[str, int, int] | None:
    """(file name, epoch, step) from the job's "Resumed from" line; None if it started fresh."""
    m = re.search(r"Resumed from (\S+) at epoch (\d+), step (\d+)", job.log)
    return None if m is None else (os.path.basename(m.group(1)), int(m.group(2)), int(m.group(3)))


# --- comparing with the uninterrupted run ----------------------------------------------------
@pytest.fixture
def reference(tmp_path_factory, script_env):
    """The uninterrupted run's folder for the given script arguments, run once per test session:
    the pytest-xdist workers share one folder per argument list, and a worker that wants a
    reference another one is running waits for it (a lock file) instead of running it again.
    Start methods train alike, so a multi-process reference always forks its workers
    (``--fork``, faster to start) and serves the tests that spawn theirs too."""
    shared = tmp_path_factory.getbasetemp().parent  # the session's, above each worker's own folder

    def get(args: list[str], launcher: list[str] | None = None) -> Path:
        args = [a for a in args if a != "--fork"]
        if launcher is None and "--devices" in args and args[args.index("--devices") + 1] == "2":
            args.append("--fork")
        key = hashlib.sha1(repr((launcher, args)).encode()).hexdigest()[:12]
        folder = shared / f"reference-{key}"
        with open(shared / f"reference-{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (folder / "final.pt").exists():
                shutil.rmtree(folder, ignore_errors=True)  # a worker that failed midway
                folder.mkdir()
                run(args, folder, script_env, launcher=launcher)
        return folder

    return get


def checkpoints(folder: Path) -> dict[str, str]:
    """Every step/epoch checkpoint under ``folder`` (all run versions), by file name."""
    files = glob.glob(str(folder / "runs" / "lightning_logs" / "version_*" / "checkpoints" / "*.ckpt"))
    return {os.path.basename(f): f for f in files if not f.endswith("last.ckpt")}


def assert_same_training(folder: Path, ref: Path) -> None:
    """The final weights, and every checkpoint, equal the uninterrupted run's bit for bit."""
    final, expected = torch.load(folder / "final.pt"), torch.load(ref / "final.pt")
    assert final.keys() == expected.keys()
    for k in expected:
        assert torch.equal(final[k], expected[k]), f"final weights differ at {k}"
    ours, theirs = checkpoints(folder), checkpoints(ref)
    assert sorted(ours) == sorted(theirs)
    for name in theirs:
        a, b = torch.load(ours[name], weights_only=True), torch.load(theirs[name], weights_only=True)
        for key in ("state_dict", "optimizer_states", "lr_schedulers", "loops", "epoch", "global_step"):
            assert _equal(a[key], b[key]), f"{name}: {key!r} differs from the uninterrupted run's"
        for key in ("loop", "rng", "epoch_start"):
            assert _equal(a["steadytrainer"][key], b["steadytrainer"][key]), f"{name}: our {key!r} differs from the uninterrupted run's"


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


# --- kill -9 ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "where, expected_resume",
    [
        pytest.param("batch_end:2", None, id="before-first-checkpoint"),
        # killed at step 5: the step-3 checkpoint, taken right after a mid-epoch validation
        pytest.param("batch_end:5", ("epoch=0-step=3.ckpt", 0, 3), id="mid-epoch"),
        # killed before epoch 1's first batch: the epoch-0 checkpoint
        pytest.param("batch_start:8", ("epoch=0-step=8-end.ckpt", 1, 8), id="epoch-boundary"),
        pytest.param("batch_end:20", ("epoch=2-step=18.ckpt", 2, 18), id="last-epoch"),
    ],
)
@pytest.mark.slow
def test_kill9_then_restart_is_bit_exact(where, expected_resume, tmp_path, script_env, reference):
    ref = reference([])
    killed_at([], where, tmp_path, script_env)
    job = run([], tmp_path, script_env)

    if expected_resume is None:
        assert "no checkpoint in" in job.log and "starting from scratch" in job.log
    else:
        assert resumed_from(job) == expected_resume
    assert_same_training(tmp_path, ref)


@pytest.mark.slow
def test_ddp_kill9_mid_epoch_then_on_epoch_boundary(tmp_path, script_env, reference):
    args = [*DDP, *DDP_EPOCHS, *FORK]
    ref = reference(args)
    killed_at(args, "batch_end:7", tmp_path, script_env)  # step 6 is 2 batches into epoch 1
    job = Job([*args, "--pause", "batch_start:8"], tmp_path, script_env)  # before epoch 2's first batch
    job.wait_until_paused()
    job.kill()
    assert resumed_from(job)[1:] == (1, 6)
    job = run(args, tmp_path, script_env)

    assert resumed_from(job) == ("epoch=1-step=8-end.ckpt", 2, 8)  # the epoch-end checkpoint: batch 0 of epoch 2
    assert_same_training(tmp_path, ref)


@pytest.mark.slow
def test_fsdp_kill9_mid_epoch_then_restart_is_bit_exact(tmp_path, script_env, reference):
    args = ["--strategy", "fsdp", "--devices", "2", *DDP_EPOCHS, *FORK]
    ref = reference(args)
    killed_at(args, "batch_end:7", tmp_path, script_env)  # step 6 is 2 batches into epoch 1
    job = run(args, tmp_path, script_env)
    assert resumed_from(job)[1:] == (1, 6)
    assert_same_training(tmp_path, ref)  # the full state dict and the by-name optimizer state, every file


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, pause, resumed_at",
    [
        # Two optimizer steps a batch (Lightning's count), 8 batches an epoch: killed after the 4th
        # batch, resumed from the step-6 checkpoint (every 3 steps: after the 3rd batch).
        pytest.param(["--manual"], "batch_end:8", (0, 6), id="single"),
        # 4 batches a rank: killed 1 batch into epoch 1, resumed from epoch 0's end (step 8).
        pytest.param(["--manual", *DDP, *DDP_EPOCHS, *FORK], "batch_end:10", (1, 8), id="ddp"),
    ],
)
def test_kill9_with_two_optimizers_stepped_by_hand_then_restart_is_bit_exact(
    args, pause, resumed_at, tmp_path, script_env, reference,
):
    ref = reference(args)
    killed_at(args, pause, tmp_path, script_env)  # mid-epoch
    job = run(args, tmp_path, script_env)
    assert resumed_from(job)[1:] == resumed_at
    assert len(torch.load(ref / "final.pt")) == 4
    assert_same_training(tmp_path, ref)  # every checkpoint: both optimizers' states and the scheduler's too


@requires_cuda(1)
@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_kill9_on_a_gpu_in_mixed_precision_then_restart_is_bit_exact(precision, tmp_path, script_env, reference):
    # deterministic=True: CUDA kernels (cuBLAS, atomics in backward) may otherwise sum in
    # another order on the rerun, and no resume could be bit-exact then. The checkpoints
    # carry the CUDA RNG (dropout) and, for 16-mixed, the GradScaler's scale.
    args = ["--precision", precision, "--deterministic"]
    ref = reference(args)
    killed_at(args, "batch_end:5", tmp_path, script_env)
    job = run(args, tmp_path, script_env)
    assert "cuda:0" in job.log  # it ran on the GPU
    assert resumed_from(job)[1:] == (0, 3)
    assert_same_training(tmp_path, ref)
    if precision == "16-mixed":
        for path in checkpoints(tmp_path).values():
            assert "MixedPrecision" in torch.load(path, weights_only=True), path  # the GradScaler, where Lightning keeps it


# --- SIGTERM and Ctrl-C ----------------------------------------------------------------------
@pytest.mark.slow
def test_sigterm_saves_last_and_resume_is_bit_exact(tmp_path, script_env, reference):
    ref = reference([])
    job = Job(["--signal-wait", "5"], tmp_path, script_env)
    job.wait_until_paused()
    os.kill(job.proc.pid, signal.SIGTERM)

    assert job.wait() != 0  # a scheduler must see the interruption
    assert "Interrupted: Training stopped by SIGTERM at step 5" in job.log
    last = tmp_path / "runs" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 5  # the very next step boundary
    job = run([], tmp_path, script_env)
    assert resumed_from(job) == ("last.ckpt", 0, 5)
    assert_same_training(tmp_path, ref)


@pytest.mark.slow
def test_ddp_sigterm_then_ctrl_c_then_resume_is_bit_exact(tmp_path, script_env, reference):
    args = [*DDP, *DDP_EPOCHS]
    ref = reference(args)
    last = tmp_path / "runs" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"

    # SIGTERM to the launching process only: it passes it on to both workers.
    job = Job([*args, "--signal-wait", "2"], tmp_path, script_env)
    job.wait_until_paused()
    os.kill(job.proc.pid, signal.SIGTERM)
    assert job.wait() != 0, job.log
    assert "trainer.core.signals.Interrupted: Training stopped by SIGTERM at step 8" in job.log  # ranks agree every 8 steps
    assert "rank 0 stopped by Interrupted" in job.log and "rank 1 stopped by Interrupted" in job.log
    assert "WorkerError" not in job.log
    assert torch.load(last, weights_only=True)["global_step"] == 8

    # Ctrl-C in a terminal: SIGINT to the whole process group (each worker also gets the
    # parent's forwarded copy, which must not count as a second, forcing Ctrl-C). This run
    # also seeds differently: the checkpoint's RNG and DistributedSampler seed must win.
    job = Job([*args, "--signal-wait", "10", "--seed", "1"], tmp_path, script_env)
    job.wait_until_paused()
    os.killpg(job.proc.pid, signal.SIGINT)
    assert job.wait() != 0, job.log
    # Step 8 was epoch 1's last batch: the resumed run starts by finishing that epoch
    # (its validation, its scheduler step) and only then moves on to epoch 2.
    assert resumed_from(job) == ("last.ckpt", 1, 8)
    assert "DistributedSampler's seed is 1 in this run but 0 in the checkpoint" in job.log
    assert "Training stopped by SIGINT at step 16" in job.log
    assert "KeyboardInterrupt" not in job.log and "WorkerError" not in job.log
    assert "rank 0 stopped by Interrupted" in job.log and "rank 1 stopped by Interrupted" in job.log

    job = run([*args, *FORK], tmp_path, script_env)  # no signal this time: forked workers, a quicker start
    assert resumed_from(job) == ("last.ckpt", 3, 16)  # again an epoch's last batch
    assert_same_training(tmp_path, ref)


def sigint_ignored_in(pid: int) -> bool:
    """Whether the process ignores SIGINT: bit 2 (SIGINT's number) of SigIgn in /proc/PID/status."""
    status = Path(f"/proc/{pid}/status").read_text()
    return bool(int(re.search(r"SigIgn:\s*([0-9a-f]+)", status).group(1), 16) >> (signal.SIGINT - 1) & 1)


@pytest.mark.slow
def test_an_ignored_sigint_stays_ignored_and_sigterm_still_saves_and_stops(tmp_path, script_env, reference):
    # A job that a script started with `&` ignores SIGINT: the Ctrl-C a user presses for the
    # foreground command reaches it too (same process group), and must not stop it.
    ref = reference([])
    job = Job(["--go-wait", "5"], tmp_path, script_env, sigint_ignored=True)
    job.wait_until_paused()
    assert sigint_ignored_in(job.proc.pid), "fit replaced the ignored SIGINT with a handler of its own"
    os.killpg(job.proc.pid, signal.SIGINT)  # as the terminal sends it, at step 5
    (tmp_path / "go").touch()
    assert job.wait() == 0, job.log
    assert "Interrupted" not in job.log and "KeyboardInterrupt" not in job.log
    assert "done epoch=3 step=24" in job.log
    assert_same_training(tmp_path, ref)  # every checkpoint, and the final weights, as never signalled
    last = tmp_path / "runs" / "lightning_logs" / "version_0" / "checkpoints" / "last.ckpt"
    assert not last.exists()  # never stopped: no resume point written (save_last is not set)

    # SIGTERM (a scheduler's stop) is caught all the same: last.ckpt at the next step boundary.
    shutil.rmtree(tmp_path / "runs")
    job = Job(["--signal-wait", "5"], tmp_path, script_env, sigint_ignored=True)
    job.wait_until_paused()
    assert sigint_ignored_in(job.proc.pid), "fit replaced the ignored SIGINT with a handler of its own"
    os.kill(job.proc.pid, signal.SIGTERM)
    assert job.wait() != 0, job.log
    assert "Interrupted: Training stopped by SIGTERM at step 5" in job.log
    assert torch.load(last, weights_only=True)["global_step"] == 5


# --- torchrun --max-restarts ---------------------------------------------------------------
@pytest.mark.slow
def test_torchrun_restart_carries_on_from_last_checkpoint(tmp_path, script_env, reference):
    torchrun = ["-m", "torch.distributed.run", "--max-restarts=1", "--standalone", "--nproc_per_node=2"]
    args = ["--strategy", "ddp", "--devices", "auto", *DDP_EPOCHS]
    ref = reference(args, launcher=torchrun)

    job = run([*args, "--crash-once", "7"], tmp_path, script_env, launcher=torchrun)

    assert (tmp_path / "crashed").exists()  # rank 1 did die on the first attempt
    assert resumed_from(job) == ("epoch=1-step=6.ckpt", 1, 6)
    assert_same_training(tmp_path, ref)


# --- in-process: the subtle cases, a crash simulated by an exception ------------------------------
class Crash(Exception):
    pass


class CrashAt(Callback):
    """Raise at ``hook`` when ``global_step == step``: the process state after it is thrown away."""

    def __init__(self, hook: str, step: int) -> None:
        self.hook, self.step = hook, step

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if self.hook == "batch_start" and trainer.global_step == self.step:
            raise Crash

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if self.hook == "batch_end" and trainer.global_step == self.step:
            raise Crash


class OnPlateau(Classifier):
    """Halves the learning rate when the training loss's epoch mean stops improving."""

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.5)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.5, threshold=0.05)
        return {"optimizer": opt, "lr_scheduler": plateau, "monitor": "train_loss"}


def train(
    crash: tuple[str, int] | None = None, loader_cls=DataLoader, generator: bool = False, model_cls=Classifier,
    **trainer_kw,
):
    """What the user's script does, from seed_everything(0) on; returns the final weights."""
    seed_everything(0)
    model = model_cls(dropout=0.5, optimizer="adam")
    g = torch.Generator().manual_seed(5) if generator else None
    train_loader = loader_cls(dataset(64), batch_size=8, shuffle=True, generator=g)
    callbacks = [ModelCheckpoint(dirpath="ck", every_n_train_steps=trainer_kw.pop("every", 3), save_top_k=-1)]
    if crash is not None:
        callbacks.append(CrashAt(*crash))
    options = quiet(max_epochs=trainer_kw.pop("max_epochs", 3), callbacks=callbacks)
    options.update(trainer_kw)
    try:
        Trainer(**options).fit(model, train_loader, loader(32), ckpt_path="last")
    except Crash:
        return None
    return model.state_dict()


def assert_resumes_exactly(*crashes: tuple[str, int], **kw) -> None:
    expected = train(**kw)
    shutil.rmtree("ck")
    for crash in crashes:
        assert train(crash, **kw) is None
    final = train(**kw)
    for k, v in expected.items():
        assert torch.equal(final[k], v), f"{k} differs after resuming from crashes at {crashes}"


def test_resume_with_gradient_accumulation_is_bit_exact():
    # 2 batches per optimizer step, a step checkpoint every 2 steps. The first crash comes
    # before any step checkpoint (only complete accumulation groups may be saved), the
    # second right after resuming (the resumed run must not save in the middle of a group).
    assert_resumes_exactly(("batch_start", 1), ("batch_end", 3), ("batch_start", 3), accumulate_grad_batches=2, every=2)


def test_resume_with_a_loader_generator_is_bit_exact():
    # DataLoader(generator=g) draws the order from g, not the global RNG: g's state is saved too.
    assert_resumes_exactly(("batch_start", 8), ("batch_end", 13), generator=True)


def test_resume_mid_epoch_keeps_the_epochs_logged_values_for_what_monitors_them():
    # The epoch mean of train_loss decides the learning rate: after a mid-epoch resume it
    # must include the batches from before the crash.
    assert_resumes_exactly(("batch_end", 13), model_cls=OnPlateau, max_epochs=4)


class CountingDataset(torch.utils.data.Dataset):
    """Records every index it is asked for."""

    def __init__(self) -> None:
        self.data, self.loaded = dataset(64), []

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i):
        self.loaded.append(i)
        return self.data[i]


def test_a_mid_epoch_resume_never_loads_the_skipped_batches():
    def run(crash=None) -> CountingDataset:
        seed_everything(0)
        data = CountingDataset()
        callbacks = [ModelCheckpoint(dirpath="ck", every_n_train_steps=3)] + ([CrashAt(*crash)] if crash else [])
        try:
            train_loader = DataLoader(data, batch_size=8, shuffle=True)
            Trainer(**quiet(enable_checkpointing=True, max_epochs=1, callbacks=callbacks)).fit(Classifier(), train_loader, ckpt_path="last")
        except Crash:
            pass
        return data

    everything = run().loaded
    shutil.rmtree("ck")
    before = run(("batch_end", 4)).loaded  # crashed after 4 batches; the checkpoint is at 3
    after = run().loaded

    assert len(after) == 64 - 3 * 8  # only the 5 batches not yet trained on
    assert after == everything[3 * 8 :]  # ... in the uninterrupted run's order
    assert before[: 3 * 8] == everything[: 3 * 8]


def test_resume_with_a_dataloader_subclass_skips_by_loading_and_is_bit_exact():
    class MyLoader(DataLoader):
        pass

    with pytest.warns(UserWarning, match="The 3 consumed batches of this MyLoader are loaded again and dropped"):
        assert_resumes_exactly(("batch_end", 4), loader_cls=MyLoader)


def test_a_signal_after_the_last_step_boundary_still_ends_fit_with_interrupted():
    class SignalAtTheEnd(Callback):
        def on_train_end(self, trainer, module):
            os.kill(os.getpid(), signal.SIGTERM)

    with pytest.raises(Interrupted, match="SIGTERM arrived after the last step boundary; training had finished"):
        Trainer(**quiet(max_epochs=1, callbacks=[SignalAtTheEnd()])).fit(Classifier(), loader(32))


def test_sigint_in_process_saves_last_and_a_second_ctrl_c_interrupts_at_once(monkeypatch):
    class CtrlC(Callback):
        def __init__(self, presses: int) -> None:
            self.presses = presses

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.global_step == 2:
                for _ in range(self.presses):
                    os.kill(os.getpid(), signal.SIGINT)  # handled before kill() returns
                    time.sleep(0.06)

    def users_handler(signum, frame):  # the handler fit finds, whatever pytest started with
        raise KeyboardInterrupt

    monkeypatch.setattr(StopSignals, "SIGINT_ECHO_S", 0.05)
    previous = signal.signal(signal.SIGINT, users_handler)
    try:
        with pytest.raises(Interrupted, match="stopped by SIGINT at step 2") as err:
            Trainer(**quiet(max_epochs=3, enable_checkpointing=True, callbacks=[CtrlC(1)])).fit(Classifier(), loader(32))
        assert err.value.signum == signal.SIGINT
        assert torch.load("checkpoints/last.ckpt", weights_only=True)["global_step"] == 2
        assert signal.getsignal(signal.SIGINT) is users_handler  # put back

        with pytest.raises(SystemExit, match="1") as stop:  # Lightning's exit on a KeyboardInterrupt
            Trainer(**quiet(max_epochs=3, callbacks=[CtrlC(2)])).fit(Classifier(), loader(32))
        assert isinstance(stop.value.__context__, KeyboardInterrupt)
        assert signal.getsignal(signal.SIGINT) is users_handler  # put back after a forced stop too
    finally:
        signal.signal(signal.SIGINT, previous)


def test_fit_leaves_an_ignored_sigint_ignored_and_still_stops_on_sigterm():
    class Signal(Callback):
        def __init__(self, sig: int) -> None:
            self.sig = sig

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.global_step == 2:
                os.kill(os.getpid(), self.sig)

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        seed_everything(0)
        model = Classifier()
        Trainer(**quiet(max_epochs=3, callbacks=[Signal(signal.SIGINT)])).fit(model, loader(32))
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        seed_everything(0)
        expected = Classifier()
        Trainer(**quiet(max_epochs=3)).fit(expected, loader(32))
        for k, v in expected.state_dict().items():
            assert torch.equal(model.state_dict()[k], v), f"{k} differs from the run that got no SIGINT"

        with pytest.raises(Interrupted, match="stopped by SIGTERM at step 2"):
            Trainer(**quiet(max_epochs=3, callbacks=[Signal(signal.SIGTERM)])).fit(Classifier(), loader(32))
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


# --- a stop mid-epoch, then resume: the epoch's end happens once --------------------------
class Scheduled(Classifier):
    """Halves the learning rate at every epoch's end: a second epoch end would show in the weights."""

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=self.lr)
        return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)


class Slow(Scheduled):
    def training_step(self, batch, batch_idx):
        time.sleep(0.015)
        return super().training_step(batch, batch_idx)


def _stopped_then_resumed(stop: dict, model_cls=Scheduled) -> None:
    """An uninterrupted 3-epoch run against one stopped mid-epoch (by ``stop``) and resumed."""
    from callbacks import EarlyStopping

    def run(**options):
        seed_everything(0)
        model = model_cls(dropout=0.5, lr=0.01)
        callbacks = [ModelCheckpoint(dirpath="ck", save_top_k=-1), EarlyStopping("val_loss", patience=100)]
        callbacks += options.pop("extra", [])
        trainer = Trainer(**quiet(callbacks=callbacks, **options))
        trainer.fit(model, DataLoader(dataset(64), batch_size=8, shuffle=True), loader(32), ckpt_path="last")
        return trainer, model.state_dict()

    _, expected = run(max_epochs=3)
    shutil.rmtree("ck")
    stopped, _ = run(**stop)
    assert 0 < stopped.state.batch_in_epoch < 8, "the stop must come mid-epoch"
    # written at the stop, into the run's own checkpoints folder: "ck", named here without save_last, gets none
    last = torch.load(os.path.join("checkpoints", "last.ckpt"), weights_only=True)
    assert last["global_step"] == stopped.global_step and not os.path.exists(os.path.join("ck", "last.ckpt"))
    resumed, final = run(max_epochs=3)
    (patience,) = [cb for cb in resumed.callbacks if isinstance(cb, EarlyStopping)]
    assert resumed.global_step == 24 and patience.wait_count <= 3  # 3 validations, each counted once
    for k, v in expected.items():
        assert torch.equal(final[k], v), f"{k} differs after a stop mid-epoch and a resume"


def test_a_timer_stop_mid_epoch_then_resume_is_bit_exact():
    from callbacks import Timer

    _stopped_then_resumed(dict(max_epochs=3, extra=[Timer(duration=0.02)]), model_cls=Slow)


def test_max_steps_mid_epoch_then_resume_with_more_epochs_is_bit_exact():
    _stopped_then_resumed(dict(max_steps=12))


def test_should_stop_mid_epoch_then_resume_is_bit_exact():
    class StopAt(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            trainer.should_stop = trainer.global_step == 11

    _stopped_then_resumed(dict(max_epochs=3, extra=[StopAt()]))

class OwnBatches(torch.utils.data.Sampler):
    """A user's batch sampler class over a sampler it is given (pairs of indices)."""

    def __init__(self, sampler) -> None:
        self.sampler = sampler

    def __iter__(self):
        order = list(self.sampler)
        return iter([order[i : i + 2] for i in range(0, len(order), 2)])

    def __len__(self) -> int:
        return len(self.sampler) // 2


class WithIndex(Classifier):
    def training_step(self, batch, batch_idx):
        return super().training_step(batch[:2], batch_idx)


class Orders(Callback):
    def __init__(self) -> None:
        self.seen: dict[int, list[int]] = {}

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        self.seen.setdefault(trainer.current_epoch, []).extend(batch[2].tolist())


def test_a_distributed_sampler_inside_a_users_batch_sampler_is_told_each_epoch():
    # DDP leaves such a loader alone (it is sharded already); its shuffle must still change per epoch.
    data = torch.utils.data.TensorDataset(torch.zeros(16, 8), torch.zeros(16, dtype=torch.long), torch.arange(16))
    sampler = torch.utils.data.DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0)
    orders = Orders()
    Trainer(**quiet(max_epochs=2, callbacks=[orders])).fit(WithIndex(), DataLoader(data, batch_sampler=OwnBatches(sampler)))
    assert sorted(orders.seen[0]) == sorted(orders.seen[1]) == list(range(16))
    assert orders.seen[0] != orders.seen[1]


# --- which run ckpt_path="last" resumes -------------------------------------------------------
class StartsAt(Callback):
    def __init__(self) -> None:
        self.step: int | None = None

    def on_train_start(self, trainer, module) -> None:
        self.step = trainer.global_step


def fit_named(epochs: int, ckpt_path=None, crash: tuple[str, int] | None = None) -> tuple[Trainer, StartsAt]:
    """A run with TensorBoard folders on (lightning_logs/version_<n>) and the default ModelCheckpoint."""
    start = StartsAt()
    callbacks = [start] + ([CrashAt(*crash)] if crash else [])
    trainer = Trainer(max_epochs=epochs, enable_progress_bar=False, callbacks=callbacks)  # name="lightning_logs", in the working directory
    try:
        trainer.fit(Classifier(), loader(32), ckpt_path=ckpt_path)
    except Crash:
        pass
    return trainer, start


def test_last_never_resumes_an_older_run_when_the_latest_one_saved_nothing():
    fit_named(epochs=2)  # an earlier experiment: version_0, checkpoints up to step 4
    fit_named(epochs=2, crash=("batch_start", 0))  # this experiment: version_1, killed before its first save

    trainer, start = fit_named(epochs=2, ckpt_path="last")  # its restart

    assert start.step == 0  # from scratch: version_0 belongs to another run
    assert trainer.run_dir.endswith(os.path.join("lightning_logs", "version_2"))


def test_last_takes_the_latest_fits_checkpoint_even_when_an_older_runs_file_is_newer_on_disk():
    fit_named(epochs=1)  # version_0: a checkpoint at step 2
    fit_named(epochs=2)  # version_1: a checkpoint at step 4
    later = time.time() + 60
    for path in glob.glob("lightning_logs/version_0/checkpoints/*.ckpt"):
        os.utime(path, (later, later))  # e.g. copied back from a backup
    Trainer(enable_progress_bar=False).validate(Classifier(), loader(16))  # version_2: no fit, no checkpoints

    trainer, start = fit_named(epochs=3, ckpt_path="last")

    assert start.step == 4
    assert trainer.run_dir.endswith(os.path.join("lightning_logs", "version_1"))  # carries on in its own folder


class Batches6:
    """A plain iterable of 6 batches (no sampler to skip at); ``Stateful`` adds Lightning's interface."""

    def __init__(self) -> None:
        x, y = dataset(48).tensors
        self.batches, self.index = list(zip(x.split(8), y.split(8))), 0

    def __iter__(self):
        while self.index < len(self.batches):
            self.index += 1
            yield self.batches[self.index - 1]
        self.index = 0

    def __len__(self) -> int:
        return len(self.batches)


class StatefulBatches6(Batches6):
    def state_dict(self):
        return {"index": self.index}

    def load_state_dict(self, state):
        self.index = state["index"]


@pytest.mark.parametrize("stateful", [False, True])
def test_a_mid_epoch_resume_of_a_plain_iterable_warns_as_lightning_unless_it_is_stateful(tmp_path, stateful):
    from trainer.core.exceptions import PossibleUserWarning

    data = StatefulBatches6() if stateful else Batches6()
    saves = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1)
    Trainer(**quiet(max_epochs=1, callbacks=[saves])).fit(Classifier(), data)
    saved = torch.load(tmp_path / "epoch=0-step=2.ckpt", weights_only=False)

    class Seen(Classifier):
        first: list[float] = []

        def training_step(self, batch, batch_idx):
            self.first.append(float(batch[0][0, 0]))
            return super().training_step(batch, batch_idx)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(**quiet(max_epochs=1)).fit(Seen(), data, ckpt_path=tmp_path / "epoch=0-step=2.ckpt")
    lightnings = [w for w in caught if "resuming from a checkpoint that ended before the epoch ended" in str(w.message)]
    assert [w.category for w in lightnings] == ([] if stateful else [PossibleUserWarning])
    expected = [float(b[0][0, 0]) for b in data.batches]
    if stateful:  # it goes on from the position it saved (what its iterator had handed out by then)
        assert Seen.first == expected[layout.ours(saved)["rng"][0]["loader_state"]["index"]:]
    else:  # the 2 consumed batches drawn again and dropped
        assert Seen.first == expected[2:]


def test_a_resume_at_the_end_of_a_plain_iterables_epoch_does_not_warn(tmp_path):
    saves = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1)
    Trainer(**quiet(max_epochs=1, callbacks=[saves])).fit(Classifier(), Batches6())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(**quiet(max_epochs=1)).fit(Classifier(), Batches6(), ckpt_path=tmp_path / "epoch=0-step=6.ckpt")
    assert not [w for w in caught if "resuming from a checkpoint" in str(w.message)]


def test_a_stateful_loader_resumed_from_a_checkpoint_without_its_state_says_so(tmp_path):
    saves = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=1, save_top_k=-1)
    Trainer(**quiet(max_epochs=1, callbacks=[saves])).fit(Classifier(), Batches6())  # a plain iterable's checkpoint
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Trainer(**quiet(max_epochs=1)).fit(Classifier(), StatefulBatches6(), ckpt_path=tmp_path / "epoch=0-step=2.ckpt")
    messages = [str(w.message) for w in caught]
    assert any("The checkpoint holds no state of this StatefulBatches6" in m for m in messages)
    assert not any("resuming from a checkpoint that ended before" in m for m in messages)
