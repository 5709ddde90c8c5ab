"""Starting DDP worker processes from a plain ``python script.py`` and bringing results back."""

from __future__ import annotations

import os
import pickle
import random
import shutil
import signal
import socket
import tempfile
import time
import traceback
from typing import Any, Callable

import torch
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException, ProcessExitedException

from trainer._signals import Interrupted
from trainer.seed import SEED_ENV

# Seconds a failed run gives the surviving ranks to exit on their own, then again after
# SIGTERM before SIGKILL. torch's default is 30 s each.
SHUTDOWN_GRACE_S = 3.0


class WorkerError(RuntimeError):
    """A DDP worker process failed; the message carries its rank and traceback (or signal)."""

    def __init__(self, message: str, rank: int) -> None:
        super().__init__(message)
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


def spawn(fn: Callable[..., Any], args: tuple, nprocs: int, start_method: str = "spawn") -> Any:
    """Run ``fn(*args)`` in ``nprocs`` fresh processes; return what rank 0's ``fn`` returned.

    If any rank fails, the others get ``SHUTDOWN_GRACE_S`` to stop, then SIGTERM, then
    SIGKILL, and a ``WorkerError`` names the rank that failed first, with its traceback.
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
        received: list[int] = []  # signals this process got and passed on to the workers
        forwarded = _forward_signals(context, received)
        try:
            while not context.join(grace_period=SHUTDOWN_GRACE_S):
                pass
        except ProcessException as err:
            raise _worker_error(err, workdir, nprocs, received) from None
        finally:
            _restore_signals(forwarded)
            for proc in context.processes:  # whatever path we leave by, leave no orphans
                if proc.is_alive():
                    proc.kill()
                    proc.join()
        result_path = os.path.join(workdir, "result.pt")
        if not os.path.exists(result_path):
            return None
        # Written moments ago by our own rank 0 into a private temp dir; multiprocessing
        # itself unpickles data from the same processes, so this adds no new trust.
        return torch.load(result_path, weights_only=False)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _worker(
    local_rank: int, payload: bytes, nprocs: int, port: int, base_seed: int, global_seed: str | None, workdir: str
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(local_rank), LOCAL_RANK=str(local_rank),
        WORLD_SIZE=str(nprocs), LOCAL_WORLD_SIZE=str(nprocs), GROUP_RANK="0",
    )
    # The caller's seed at fit time, even if re-importing the script re-seeded this process.
    if global_seed is None:
        os.environ.pop(SEED_ENV, None)
    else:
        os.environ[SEED_ENV] = global_seed
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
        with open(os.path.join(workdir, f"error-{local_rank}.txt"), "w") as f:
            f.write(f"{time.time()}\n{traceback.format_exc()}")
        if isinstance(err, Interrupted):  # a clean stop: the parent re-raises it as such
            with open(os.path.join(workdir, f"interrupted-{local_rank}.txt"), "w") as f:
                f.write(f"{err.signum}\n{err}")
        raise
    if local_rank == 0 and result is not None:
        tmp = os.path.join(workdir, "result.pt.tmp")
        torch.save(result, tmp)
        os.replace(tmp, os.path.join(workdir, "result.pt"))


def _worker_error(err: ProcessException, workdir: str, nprocs: int, received: list[int]) -> Exception:
    rank = err.error_index  # the first process the parent saw exit non-zero
    stopped = _interrupted(workdir, nprocs)
    if stopped is not None:
        return stopped
    if isinstance(err, ProcessExitedException) and err.signal_name and received:
        # The workers got our signal before fit could catch it (still starting up).
        return Interrupted(
            f"Training stopped by {signal.Signals(received[0]).name} before it started; no checkpoint was written.",
            received[0],
        )
    if isinstance(err, ProcessExitedException) and err.signal_name:
        # A killed rank is the cause: its peers only fail once they notice it is gone.
        return WorkerError(
            f"DDP rank {rank} (of {nprocs}) was killed by signal {err.signal_name} "
            f"(exit code {err.exit_code}). The other ranks were stopped.", rank
        )
    errors = []
    for r in range(nprocs):
        path = os.path.join(workdir, f"error-{r}.txt")
        if os.path.exists(path):
            with open(path) as f:
                stamp, _, tb = f.read().partition("\n")
            errors.append((float(stamp), r, tb))
    if errors:  # the earliest raise is the cause; later ones are peers losing their group
        _, rank, tb = min(errors)
        return WorkerError(f"DDP rank {rank} (of {nprocs}) failed:\n{tb}", rank)
    return WorkerError(
        f"DDP rank {rank} (of {nprocs}) exited with code {getattr(err, 'exit_code', '?')} before "
        "reporting an error. If it died while starting up, check that the script's training code "
        "is under `if __name__ == \"__main__\":` (workers re-import the script).", rank
    )


def _interrupted(workdir: str, nprocs: int) -> Interrupted | None:
    """The workers stopped cleanly on a signal (rank 0 wrote last.ckpt): re-raise that here."""
    for r in range(nprocs):
        path = os.path.join(workdir, f"interrupted-{r}.txt")
        if os.path.exists(path):
            with open(path) as f:
                signum, _, message = f.read().partition("\n")
            return Interrupted(message, int(signum))
    return None


def _forward_signals(context: Any, received: list[int]) -> dict[int, Any]:
    """Pass SIGTERM/SIGINT on to the workers, which checkpoint and stop at the next step."""
    if not _in_main_thread():
        return {}

    def forward(signum: int, frame: Any) -> None:
        received.append(signum)
        for proc in context.processes:
            if proc.is_alive() and proc.pid is not None:
                os.kill(proc.pid, signum)

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.signal(sig, forward)
    return previous


def _restore_signals(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def _in_main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()
