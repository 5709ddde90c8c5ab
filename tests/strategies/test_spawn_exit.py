"""A ddp run ends cleanly: no "resource_tracker: There appear to be N leaked semaphore objects".

The workers end with ``os._exit`` (see ``strategies._spawn._exit``), which skips the
finalizers that unlink the named semaphores a worker made; the launcher's resource tracker
then reports them at its shutdown. torch.compile's inductor makes one in every rank (its
progress bar's tqdm lock), and so does any tqdm bar in a rank.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = str(Path(__file__).with_name("_exit_script.py"))
_NO_COMPILER = not any(shutil.which(c) for c in ("g++", "c++", "clang++"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [
        pytest.param(["--lock"], id="without-compile"),
        # Inductor, on CPU: it needs a C++ compiler. backend="eager" makes no lock, so it cannot tell.
        pytest.param(["--compile"], id="compile", marks=pytest.mark.skipif(_NO_COMPILER, reason="inductor needs a C++ compiler")),
    ],
)
def test_a_ddp_run_leaks_no_semaphores(args, tmp_path, script_env):
    done = subprocess.run(
        [sys.executable, SCRIPT, *args], cwd=tmp_path, env={**script_env, "OMP_NUM_THREADS": "1"},
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "done step=2" in done.stdout
    assert "resource_tracker" not in done.stderr and "leaked" not in done.stderr, done.stderr
