"""The layout the README's "Layout" section describes: file sizes and the import direction."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("trainer", "callbacks", "strategies")
# trainer.trainer and the loops sit on top of strategies and callbacks; everything else in
# the trainer package is the core that strategies and callbacks build on.
TOP = {"trainer/trainer.py", "trainer/stage.py", "trainer/fit_loop.py", "trainer/evaluation_loop.py", "trainer/_hooks.py"}


def _sources(package: str) -> list[str]:
    folder = os.path.join(ROOT, package)
    return sorted(f"{package}/{name}" for name in os.listdir(folder) if name.endswith(".py"))


def _imported(path: str) -> set[str]:
    """Top-level package names a module imports (at run time: TYPE_CHECKING blocks left out)."""
    tree = ast.parse(open(os.path.join(ROOT, path)).read())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            node.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", [p for pkg in PACKAGES for p in _sources(pkg)])
def test_no_package_file_is_over_400_lines(path):
    with open(os.path.join(ROOT, path)) as f:
        assert sum(1 for _ in f) <= 400, f"{path} is over 400 lines: split it by concept"


@pytest.mark.parametrize("path", [p for p in _sources("trainer") if p not in TOP])
def test_the_trainer_core_imports_neither_strategies_nor_callbacks(path):
    assert not _imported(path) & {"strategies", "callbacks"}, path


@pytest.mark.parametrize("path", _sources("strategies") + _sources("callbacks"))
def test_strategies_and_callbacks_use_only_the_trainer_core(path):
    """They may import trainer's core modules, never the Trainer on top of them."""
    tree = ast.parse(open(os.path.join(ROOT, path)).read())
    top_modules = {p[:-3].replace("/", ".") for p in TOP}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            assert node.module not in top_modules, f"{path} imports {node.module}"
            if node.module == "trainer":
                imported = {a.name for a in node.names}
                assert "Trainer" not in imported or _under_type_checking(tree, node), f"{path} imports Trainer"


def _under_type_checking(tree: ast.AST, target: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) and target in ast.walk(node):
            return True
    return False


@pytest.mark.parametrize("first", ["trainer", "strategies", "callbacks", "trainer.data", "strategies.ddp", "callbacks.model_checkpoint"])
def test_any_package_can_be_imported_first(first, script_env):
    code = f"import {first}; from trainer import Trainer; from strategies import DDPStrategy; from callbacks import ModelCheckpoint"
    done = subprocess.run([sys.executable, "-c", code], env=script_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
