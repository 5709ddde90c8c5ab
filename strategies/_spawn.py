"""Starting DDP worker processes from a plain ``python script.py`` and bringing results back."""

from __future__ import annotations

import contextlib
import faulthandler
import glob
import logging
import multiprocessing.util
import os
import pickle
import random
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from datetime import timedelta
from multiprocessing.connection import wait
from typing import Any, Callable

import torch
import torch.multiprocessing as mp

from trainer.core.signals import Interrupted
from trainer.core.seed import SEED_ENV

# Seconds a failed run gives the surviving ranks to exit on their own before they are killed.
SHUTDOWN_GRACE_S = 3.0
# A rank still running after the grace period is asked for its Python stack with this signal
# (faulthandler writes it even while the rank is blocked in C code), so a hang says where.
_STACK_SIGNAL = signal.SIGUSR2
_STACK_WAIT_S = 1.0


_WORKER: dict[str, str] = {}  # in a spawned worker: "failed", the file note_failure writes


def note_failure() -> None:
    """In a spawned worker: when this rank's stage first failed, which the parent compares across ranks."""
    path = _WORKER.get("failed")
    if path and not os.path.exists(path):
        with contextlib.suppress(OSError), open(path, "w") as f:
            f.write(repr(time.time()))


class WorkerError(mp.ProcessRaisedException, RuntimeError):
    """A DDP worker failed: its rank (``error_index``) and traceback. torch's exception, as Lightning's ddp_spawn's."""

    def __init__(self, message: str, rank: int, pid: int = -1) -> None:  # no pid: the worker is gone, the rank names it
        super().__init__(message, rank, pid)
        self.rank = rank


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_main_guard() -> None:
    """Refuse to spawn while this process is itself still starting up as a spawned child.

    A spawned child first re-imports the parent's ``__main__`` (multiprocessing marks that
    phase with ``_inheriting``). Unguarded training code would then spawn from every child;
    Python's own check only fires later, with an error that does not say why.
    """
    if getattr(mp.current_process(), "_inheriting", False):
        raise RuntimeError(
            "Trainer.fit with strategy='ddp' was called while a worker process was starting up. "
            "Each worker re-imports your script, so the code that calls fit must sit under "
            "`if __name__ == \"__main__\":`; otherwise every worker would start workers of its own. "
            "Wrap your training code in that guard, or launch with `torchrun`."
        )


def spawn(
    fn: Callable[..., Any], args: tuple, nprocs: int, start_method: str = "spawn", timeout: timedelta | None = None
) -> Any:
    """Run ``fn(*args)`` in ``nprocs`` fresh processes; return what rank 0's ``fn`` returned.

    If any rank fails, the others get ``SHUTDOWN_GRACE_S`` to stop on their own; those still running are then asked for
    their stack and killed. A ``WorkerError`` names the rank that failed first, with its traceback (or signal) and where
    any stuck rank was. ``timeout`` is the collective timeout, only quoted in that message.
    """
    check_main_guard()
    workdir = tempfile.mkdtemp(prefix="trainer-ddp-")
    base_seed = int(torch.randint(0, 2**31 - 1, ()).item())  # follows the caller's seed
    port = free_port()
    try:
        payload = pickle.dumps((fn, args))
    except Exception as err:  # noqa: BLE001 - any pickling failure gets the same advice
        shutil.rmtree(workdir, ignore_errors=True)
        raise TypeError(
            f"strategy='ddp' sends the Trainer, model, loaders and callbacks to {nprocs} worker processes "
            f"by pickling them, and that failed: {err}. Define classes and functions at module level "
            "(a lambda cannot be pickled; use functools.partial, e.g. "
            "optimizer=functools.partial(torch.optim.AdamW, lr=1e-3)), or launch the script with torchrun."
        ) from err
    try:
        context = mp.start_processes(
            _worker, args=(payload, nprocs, port, base_seed, os.environ.get(SEED_ENV), workdir), nprocs=nprocs,
            join=False, start_method=start_method,
        )
        forwarded: dict[int, Any] = {}
        received: list[int] = []  # signals this process got and passed on to the workers
        try:
            forwarded = _forward_signals(context, received)
            _join(context.processes, workdir, timeout, received)
        finally:
            _restore_signals(forwarded)
            for proc in context.processes:  # whatever path we leave by, leave no orphans
                if proc.is_alive():
                    _kill_tree(proc)
                proc.join()
        result_path = os.path.join(workdir, "result.pt")
        if not os.path.exists(result_path):
            return None
        # Written moments ago by our own rank 0 into a private temp dir; multiprocessing
        # itself unpickles data from the same processes, so this adds no new trust.
        return torch.load(result_path, weights_only=False)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _join(procs: list[Any], workdir: str, timeout: timedelta | None, received: list[int]) -> None:
    """Wait for every rank; at the first one that exits non-zero, stop the rest and raise."""
    running = {proc.sentinel: rank for rank, proc in enumerate(procs)}
    while running:
        for sentinel in wait(list(running)):
            rank = running.pop(sentinel)
            procs[rank].join()
            early = procs[rank].exitcode == 0 and not os.path.exists(os.path.join(workdir, f"done-{rank}"))
            if procs[rank].exitcode != 0 or early:
                stuck = _stop_the_rest(procs, workdir)
                if early:  # its peers fail next, losing their connection to it: they are not the cause
                    raise WorkerError(
                        f"DDP rank {rank} (of {len(procs)}) exited with status 0 before its fit finished (os._exit(0) "
                        "in user code, or a library ending the process?). The other ranks were stopped."
                        + _stuck_report(stuck), rank)
                raise _interrupted(workdir, len(procs), procs[rank].exitcode, received) or _worker_error(
                    rank, procs[rank].exitcode, workdir, len(procs), stuck, timeout
                )
    # torch's worker wrapper exits 0 on KeyboardInterrupt; a rank that recorded an error still failed.
    failed = [r for r in range(len(procs)) if os.path.exists(os.path.join(workdir, f"error-{r}.txt"))]
    if failed:
        raise _worker_error(failed[0], 0, workdir, len(procs), {}, timeout)


def _interrupted(workdir: str, nprocs: int, exitcode: int, received: list[int]) -> Interrupted | None:
    """A stop on SIGTERM/SIGINT (rank 0 wrote last.ckpt first) is re-raised here as what it is."""
    for r in range(nprocs):
        signum, _, message = _read(os.path.join(workdir, f"interrupted-{r}.txt")).partition("\n")
        if signum:
            return Interrupted(message, int(signum))
    if exitcode < 0 and received:  # our signal reached the workers before fit could catch it
        name = _signal_name(received[0])
        return Interrupted(f"Training stopped by {name} before it started; no checkpoint was written.", received[0])
    return None


def _stop_the_rest(procs: list[Any], workdir: str) -> dict[int, str]:
    """Give the other ranks a grace period, then record where the stuck ones are and kill them.

    SIGKILL, not SIGTERM: a rank's SIGTERM handler would try to write a checkpoint, which is a collective that cannot
    finish once a peer is gone.
    """
    deadline = time.monotonic() + SHUTDOWN_GRACE_S
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
    alive = [rank for rank, proc in enumerate(procs) if proc.is_alive()]
    # A rank that recorded an error is only slow to exit; the others never got that far.
    stuck = [rank for rank in alive if not os.path.exists(os.path.join(workdir, f"error-{rank}.txt"))]
    for rank in stuck:
        with contextlib.suppress(ProcessLookupError):  # it exited just now
            os.kill(procs[rank].pid, _STACK_SIGNAL)
    deadline = time.monotonic() + _STACK_WAIT_S
    while stuck and time.monotonic() < deadline and not all(_read(_stack_path(workdir, r)) for r in stuck):
        time.sleep(0.05)
    for rank in alive:
        _kill_tree(procs[rank])
    return {rank: _read(_stack_path(workdir, rank)) for rank in stuck}


def _worker(
    local_rank: int, payload: bytes, nprocs: int, port: int, base_seed: int, global_seed: str | None, workdir: str
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(local_rank), LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(nprocs), LOCAL_WORLD_SIZE=str(nprocs), GROUP_RANK="0",
    )
    # Ranks share the machine's cores. Uncapped, each CPU rank uses them all and they fight:
    # 2 ranks on 2 cores ran 100 steps in 39 s instead of 20 s. torchrun sets OMP_NUM_THREADS=1.
    if "OMP_NUM_THREADS" not in os.environ and not torch.cuda.is_available():
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // nprocs))
    # The caller's seed at fit time, even if re-importing the script re-seeded this process.
    if global_seed is None:
        os.environ.pop(SEED_ENV, None)
    else:
        os.environ[SEED_ENV] = global_seed
    open(os.path.join(workdir, f"started-{local_rank}"), "w").close()  # past the script's re-import
    _WORKER["failed"] = os.path.join(workdir, f"failed-{local_rank}.txt")
    _dump_stack_on_request(_stack_path(workdir, local_rank))
    faulthandler.enable(all_threads=True)  # a crash in C code (SIGSEGV, SIGABRT) prints where Python was
    # Each rank draws its own dropout masks, reproducibly from the caller's RNG.
    random.seed(base_seed + local_rank)
    torch.manual_seed(base_seed + local_rank)
    try:
        import numpy as np

        np.random.seed((base_seed + local_rank) % 2**32)
    except ImportError:
        pass
    try:
        fn, args = pickle.loads(payload)
        result = fn(*args)
    except BaseException as err:
        # Timestamped, so the parent can tell the first failure from the ranks it took down.
        failed_at = _read(_WORKER["failed"]) or repr(time.time())  # when the stage failed, before its cleanup
        with open(os.path.join(workdir, f"error-{local_rank}.txt"), "w") as f:
            f.write(f"{failed_at}\n{traceback.format_exc()}")
        if isinstance(err, Interrupted):  # a clean stop: the parent re-raises it as such
            with open(os.path.join(workdir, f"interrupted-{local_rank}.txt"), "w") as f:
                f.write(f"{err.signum}\n{err}")
        _exit(1)
    if local_rank == 0 and result is not None:
        tmp = os.path.join(workdir, "result.pt.tmp")
        torch.save(result, tmp)
        os.replace(tmp, os.path.join(workdir, "result.pt"))
    open(os.path.join(workdir, f"done-{local_rank}"), "w").close()  # a status 0 without it is a failure
    _exit(0)


def _exit(code: int) -> None:
    """End the worker without interpreter shutdown. There, a gloo or autograd thread that still
    releases a tensor wants the GIL as it is torn down, and the process dies with SIGABRT
    ("terminate called without an active exception"), about one exit in twenty on a busy
    2-core machine; destroying the process group first (DDPStrategy.teardown) made it rarer but
    not rare enough. The error (or result) file is written by now; flush what is still buffered.

    multiprocessing's exit finalizers do run (those a normal exit runs first): a semaphore the worker made (tqdm's lock,
    which torch.compile's progress bar creates; a Queue, a Pool) is named, and registered with the launcher's resource
    tracker, until its finalizer unlinks it; skipped, the launcher ends with "resource_tracker: There appear to be N
    leaked semaphore objects to clean up at shutdown"."""
    with contextlib.suppress(Exception):
        multiprocessing.util._run_finalizers(0)  # noqa: SLF001 - no public way to run them without exiting
    for child in multiprocessing.active_children():  # daemonic: DataLoader workers, one hung in __getitem__ among them,
        if child.daemon:  # which the interpreter's exit would have ended; os._exit leaves them holding stdout
            child.kill()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def _dump_stack_on_request(path: str) -> None:
    stack_file = open(path, "w")  # noqa: SIM115 - stays open for the life of the worker
    faulthandler.register(_STACK_SIGNAL, file=stack_file, all_threads=True)


def _worker_error(
    rank: int, exitcode: int, workdir: str, nprocs: int, stuck: dict[int, str], timeout: timedelta | None
) -> WorkerError:
    """The error for the first rank that exited non-zero; a kill is named by its signal, a raise
    by the earliest traceback any rank wrote (the others are usually peers losing their group)."""
    if exitcode < 0:
        # A killed rank is the cause: its peers only fail once they notice it is gone.
        name = _signal_name(-exitcode)
        message = f"DDP rank {rank} (of {nprocs}) was killed by signal {name} (exit code {exitcode})."
        return WorkerError(message + " The other ranks were stopped." + _stuck_report(stuck), rank)
    errors = []
    for r in range(nprocs):
        text = _read(os.path.join(workdir, f"error-{r}.txt"))
        stamp, _, tb = text.partition("\n")
        with contextlib.suppress(ValueError):  # empty or cut off: the rank was killed mid-write
            errors.append((float(stamp), r, tb))
    if errors:
        _, rank, tb = min(errors)
        message = f"DDP rank {rank} (of {nprocs}) failed:\n{tb}"
        code = re.search(r"^SystemExit: ?(.*)$", tb.strip().splitlines()[-1] if tb.strip() else "")
        loader = re.search(r"DataLoader timed out after (\d+) seconds", tb)
        if code is not None:  # sys.exit() inside fit: not a finished fit, whatever the status
            status = code.group(1) or "None"
            message = (f"DDP rank {rank} (of {nprocs}) exited with status {status} before its fit finished "
                       f"(sys.exit({status}) in user code?). The other ranks were stopped. It exited here:\n{tb}")
        elif loader is not None:
            message += (
                f"\nRank {rank}'s DataLoader waited longer than its timeout ({loader.group(1)} s) for a batch from its "
                "worker processes: a worker is stuck in the Dataset's __getitem__ or the collate_fn, or much slower. "
                "Find what it waits on, or raise DataLoader(timeout=...)."
            )
        elif timeout is not None and _is_timeout(tb):
            seconds = f"{timeout.total_seconds():g}"
            message += (
                f"\nRank {rank} waited longer than the collective timeout ({seconds} s, DDPStrategy(timeout=...)) "
                "for the other ranks: one of them is stuck, or much slower outside collectives. "
                "If a long pause on some ranks is expected (e.g. rank 0 evaluating alone), "
                "raise DDPStrategy(timeout=...)."
            )
        return WorkerError(message + _stuck_report(stuck), rank)
    if not os.path.exists(os.path.join(workdir, f"started-{rank}")):
        return WorkerError(
            f"DDP rank {rank} (of {nprocs}) exited with code {exitcode} while starting up, before any "
            "training code ran (its own error is printed above). The usual cause: the script calls fit "
            "at import time. Each worker re-imports the script, so the training code must sit under "
            '`if __name__ == "__main__":`. Wrap it in that guard, or launch with torchrun.', rank
        )
    return WorkerError(
        f"DDP rank {rank} (of {nprocs}) exited with code {exitcode} without raising an exception "
        "(sys.exit or os._exit in user code?)." + _stuck_report(stuck), rank
    )


def _stuck_report(stuck: dict[int, str]) -> str:
    if not stuck:
        return ""
    return "".join(
        f"\nRank {r} was still running {SHUTDOWN_GRACE_S:g} s later and was killed. It was at:\n"
        f"{stack or '(no stack recorded)'}"
        for r, stack in sorted(stuck.items())
    )


def _is_timeout(tb: str) -> bool:
    # gloo: "Timed out waiting 5000ms for recv"; NCCL watchdog: "Watchdog caught collective operation timeout"
    return "Timed out" in tb or "timed out" in tb or "operation timeout" in tb


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` (Linux: /proc; elsewhere none), children first."""
    found: list[int] = []
    for children in glob.glob(f"/proc/{pid}/task/*/children"):
        with contextlib.suppress(OSError, ValueError):
            for kid in map(int, _read(children).split()):
                found += [kid, *_descendants(kid)]
    return found


def _kill_tree(proc: Any) -> None:
    """SIGKILL a rank and what it started (DataLoader workers): killed alone, a worker hung in
    ``__getitem__`` outlives the job, holding its stdout open."""
    below = _descendants(proc.pid) if proc.pid is not None else []
    proc.kill()
    for pid in below:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    proc.join()


def _stack_path(workdir: str, rank: int) -> str:
    return os.path.join(workdir, f"stack-{rank}.txt")


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def _forward_signals(context: Any, received: list[int]) -> dict[int, Any]:
    """Pass SIGTERM/SIGINT on to the workers, which checkpoint and stop at the next step
    (SIGINT only when it is not ignored here, see trainer.core.signals.StopSignals)."""
    if not _in_main_thread():
        return {}

    def forward(signum: int, frame: Any) -> None:
        received.append(signum)
        for proc in context.processes:
            if proc.is_alive() and proc.pid is not None:
                os.kill(proc.pid, signum)

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        if sig == signal.SIGINT and signal.getsignal(sig) is signal.SIG_IGN:
            continue  # ignored, as in the workers (they inherit it): a Ctrl-C is not for this job
        previous[sig] = signal.signal(sig, forward)
    return previous


def _restore_signals(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def _in_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
