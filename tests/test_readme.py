"""Every README code block marked ```python runnable runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK = re.compile(r"```python runnable\n(.*?)```", re.S)


def _blocks() -> list[str]:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return BLOCK.findall(f.read())


def test_the_readme_has_runnable_blocks():
    assert _blocks(), "README.md should mark its examples as ```python runnable"


@pytest.mark.parametrize("index", range(len(_blocks())))
def test_readme_block_runs(index, tmp_path, script_env):
    script = tmp_path / f"readme_block_{index}.py"
    script.write_text(_blocks()[index])
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=script_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"README block {index} failed:\n{done.stdout}\n{done.stderr}"
