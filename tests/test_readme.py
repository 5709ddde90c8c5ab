"""The README's quickstart as a newcomer runs it: under torchrun it prints its last line once."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.test_docs import ROOT, parse

pytestmark = pytest.mark.slow


def _quickstart() -> str:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        blocks, _ = parse(f.read())
    (code,) = [code for _, code, _ in blocks if "class Regressor" in code]
    return code


def test_the_quickstart_under_torchrun_prints_once(tmp_path, script_env):
    script = tmp_path / "quickstart.py"
    script.write_text(_quickstart())
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    done = subprocess.run(command, env=script_env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("train_loss")]
    assert len(lines) == 1, done.stdout
