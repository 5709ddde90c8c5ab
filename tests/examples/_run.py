"""Running an example script as a user would, and reading back what it wrote."""

from __future__ import annotations

import glob
import importlib.util
import os
import subprocess
import sys
from types import ModuleType

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")


def run_example(name: str, *args: str, env: dict[str, str], timeout: float = 120) -> str:
    """``python examples/<name>.py <args>``; returns stdout + stderr, failing with both on a non-zero exit."""
    done = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, f"{name}.py"), *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"examples/{name}.py exited with {done.returncode}:\n{output}"
    return output


def load_example(name: str) -> ModuleType:
    """Import an example file as a module (its main() is behind the __main__ guard).

    As ``python examples/<name>.py`` does, the examples folder is on ``sys.path`` while the
    file runs, so its ``from _cli import ...`` finds the shared examples/_cli.py.
    """
    spec = importlib.util.spec_from_file_location(f"example_{name}", os.path.join(EXAMPLES, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, EXAMPLES)
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(EXAMPLES)
    return module


def only_run_dir(log_dir: str) -> str:
    runs = glob.glob(os.path.join(log_dir, "lightning_logs", "version_*"))
    assert len(runs) == 1, f"expected one run under {log_dir}, found {runs}"
    return runs[0]


def scalar_tags(run_dir: str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series in the run's TensorBoard event files, as (step, value) pairs."""
    assert glob.glob(os.path.join(run_dir, "events.out.tfevents.*")), f"no TensorBoard event file in {run_dir}"
    acc = EventAccumulator(run_dir)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
