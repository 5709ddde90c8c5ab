"""Shared fixtures: every test starts in its own folder, with no process group and no launcher env."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os

import pytest
import torch
import torch.distributed as dist

_LAUNCHER_ENV = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
    "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", "TRAINER_GLOBAL_SEED", "TRAINER_SPAWNED_WORKER",
)

# pytest-xdist's workers share the machine's cores: each worker's torch, and the scripts its tests
# start, get their share of them. Left at torch's default (every core), two workers' OpenMP
# threads wait on each other's: examples/gan.py's 2,560 small steps took 59 s instead of 4 beside another such run.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
if _WORKERS > 1:
    _THREADS = max(1, (os.cpu_count() or 1) // _WORKERS)
    torch.set_num_threads(_THREADS)
    os.environ.setdefault("OMP_NUM_THREADS", str(_THREADS))


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    """Run in a temp dir (default log_dir='runs' lands there) with a clean environment."""
    monkeypatch.chdir(tmp_path)
    for name in _LAUNCHER_ENV:
        monkeypatch.delenv(name, raising=False)
    rng = torch.get_rng_state()
    yield
    torch.set_rng_state(rng)
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def requires_cuda(n: int = 1):
    """Mark a test that needs ``n`` CUDA devices: ``pytest -m cuda`` selects it, and it is
    skipped cleanly without them."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    skip = pytest.mark.skipif(count < n, reason=f"needs {n} CUDA device(s), found {count}")

    def mark(test):
        return pytest.mark.cuda(skip(test))

    return mark


# What the fork server imports once per pytest worker, before it forks any rank: torch, and what
# DDP's and FSDP's wrappers import on first use (torch._dynamo alone is over a second a rank).
# Only installed packages: Python 3.11's fork server ignores the caller's sys.path, so it could
# import another checkout's trainer; the ranks import ours after they start.
FORK_SERVER_PRELOAD = ["torch", "torch._dynamo", "torch.distributed.fsdp"]
multiprocessing.get_context("forkserver").set_forkserver_preload(FORK_SERVER_PRELOAD)


def _in_the_callers_environment(caller: int, environ: dict[str, str], fn, *args):
    """In a rank: what a spawned rank inherits from the process that called fit, ``caller``.
    Its environment, except the launcher variables the rank's start-up has just set (its rank,
    the rendezvous, the seed); and its stdout and stderr as they are now (pytest's capture),
    where the fork server's are the ones of the test that started it."""
    own = {k: os.environ[k] for k in _LAUNCHER_ENV if k in os.environ}
    os.environ.clear()
    os.environ.update({k: v for k, v in environ.items() if k not in _LAUNCHER_ENV}, **own)
    for fd in (1, 2):
        try:
            target = os.open(f"/proc/{caller}/fd/{fd}", os.O_WRONLY | os.O_APPEND)
        except OSError:  # a socket cannot be opened again by its path: keep the server's
            continue
        os.dup2(target, fd)
        os.close(target)
    return fn(*args)


@contextlib.contextmanager
def ranks_forked_from_the_server():
    """While it is open, strategy="ddp"/"fsdp" fits in this process start their ranks from
    multiprocessing's fork server, warm with FORK_SERVER_PRELOAD, instead of spawning fresh
    interpreters that import torch each time: about 3 s less per fit on 2 cores. The rest is as
    under spawn, the default: each rank starts with none of this process's state, unpickles the
    Trainer, model, loaders and callbacks, imports the tests' modules and ours, and gets the
    caller's environment. tests/strategies/test_ddp.py runs the default start method itself."""
    import strategies.ddp

    spawn = strategies.ddp.spawn

    def from_the_fork_server(fn, args, nprocs, start_method="spawn", timeout=None):
        if start_method == "spawn":
            fn, args, start_method = _in_the_callers_environment, (os.getpid(), dict(os.environ), fn, *args), "forkserver"
        return spawn(fn, args, nprocs, start_method, timeout=timeout)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(strategies.ddp, "spawn", from_the_fork_server)
        yield


@pytest.fixture
def ranks_from_the_fork_server():
    """:func:`ranks_forked_from_the_server` for the test."""
    with ranks_forked_from_the_server():
        yield


@pytest.fixture
def repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def script_environment(repo_root: str, folder) -> dict[str, str]:
    """Environment for subprocesses that run scripts: this checkout's packages come first, and
    their temporary files (a DDP launcher's work folder, which a test that kills it with -9
    leaves behind) go under ``folder``, the test's own."""
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_ENV}
    env["PYTHONPATH"] = repo_root + os.pathsep + env.get("PYTHONPATH", "")
    (folder / "tmp").mkdir(exist_ok=True)
    env["TMPDIR"] = str(folder / "tmp")
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def script_env(repo_root, tmp_path) -> dict[str, str]:
    """:func:`script_environment` for the test's ``tmp_path``."""
    return script_environment(repo_root, tmp_path)


@pytest.fixture
def trainer_log():
    """Lines the "trainer" logger writes (it does not propagate, so caplog misses them)."""
    lines: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: lines.append(record.getMessage())
    logger = logging.getLogger("trainer")
    logger.addHandler(handler)
    yield lines
    logger.removeHandler(handler)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """With workers (``-n auto``), the slow tests first, in collection order: each worker ends
    on short tests, and neither sits idle while the other runs a long one to the end."""
    if getattr(config.option, "numprocesses", None):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)
