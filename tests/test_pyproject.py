"""pyproject.toml: the torch floor it declares admits no version that lacks an API the package calls."""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("trainer", "callbacks", "strategies")

# What the package calls (as it is spelled in the source), and the first torch release that has it.
# A call to something newer needs a row here and a higher floor.
FIRST_RELEASE = {
    "torch.nn.utils.get_total_norm(": (2, 6),  # clipping by value (pytorch/pytorch#139662)
    'torch.amp.GradScaler("cuda")': (2, 3),  # 16-mixed
    "device_id=": (2, 3),  # dist.init_process_group(device_id=...), eager NCCL init
    "mmap=": (2, 1),  # torch.load(..., mmap=True): ckpt_path="last" checks files cheaply
    "weights_only=True": (1, 13),
}


def _source() -> str:
    text = []
    for package in PACKAGES:
        for folder, _, names in os.walk(os.path.join(ROOT, package)):
            text += [open(os.path.join(folder, n), encoding="utf-8").read() for n in names if n.endswith(".py")]
    return "\n".join(text)


def _torch_floor() -> tuple[int, int]:
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        match = re.search(r'"torch>=(\d+)\.(\d+)', f.read())
    assert match, "pyproject.toml should pin a torch floor, e.g. \"torch>=2.6\""
    return int(match[1]), int(match[2])


def test_the_torch_floor_has_every_api_the_package_calls():
    source, floor = _source(), _torch_floor()
    for api, first in FIRST_RELEASE.items():
        assert api in source, f"{api} is no longer called: drop its row (and maybe lower the floor)"
        assert floor >= first, f"torch>={floor[0]}.{floor[1]} admits versions without {api} (first in {first[0]}.{first[1]})"


# --- the README's test command installs what the tests import ---------------------------------
# A module's import name, where its distribution's name differs.
DISTRIBUTION = {"yaml": "pyyaml", "torchmetrics": "torchmetrics", "jsonargparse": "jsonargparse", "mlflow": "mlflow-skinny"}
# Our own packages, and the scripts in benchmarks/ and examples/ that tests import by name.
OURS = {"trainer", "callbacks", "strategies", "loggers", "tests", "benchmarks"} | {
    name[:-3] for folder in ("benchmarks", "examples") for name in os.listdir(os.path.join(ROOT, folder)) if name.endswith(".py")
}


def _requirements(extra: str, seen: set[str] | None = None) -> set[str]:
    """The distributions that ``pip install -e ".[extra]"`` brings in by name: the base
    dependencies, the extra's, and those of the extras it names (``steadytrainer[cli,plot]``)."""
    import tomllib

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    seen = set() if seen is None else seen
    names: set[str] = set()
    for requirement in project["dependencies"] + project["optional-dependencies"][extra]:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement)[0].lower()
        if name == project["name"]:
            for inner in re.search(r"\[(.*)\]", requirement)[1].split(","):
                if inner not in seen:
                    seen.add(inner)
                    names |= _requirements(inner.strip(), seen)
        else:
            names.add(name)
    return names


def _imports(source: str) -> tuple[set[str], set[str]]:
    """The top-level modules a file imports, and those it imports through ``pytest.importorskip``."""
    import ast

    tree = ast.parse(source)
    imported, skipped = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "importorskip" and node.args:
            if isinstance(node.args[0], ast.Constant):
                skipped.add(node.args[0].value.split(".")[0])
    return imported - skipped, skipped


def _test_sources() -> dict[str, str]:
    sources = {}
    for folder in ("tests", "examples"):
        for path, _, names in os.walk(os.path.join(ROOT, folder)):
            for n in names:
                if n.endswith(".py"):
                    with open(os.path.join(path, n), encoding="utf-8") as f:
                        sources[os.path.relpath(os.path.join(path, n), ROOT)] = f.read()
    from tests.test_docs import _pages, parse

    for page in _pages():
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            blocks, _ = parse(f.read())
        sources[page] = "\n".join(code for _, code, skip in blocks if skip is None)
    return sources


def test_the_dev_extra_installs_every_package_the_tests_and_docs_import():
    import sys

    dev = _requirements("dev")
    missing = {}
    for where, source in _test_sources().items():
        imported, _ = _imports(source)
        for module in imported - OURS - set(sys.stdlib_module_names) - {"__future__"}:
            if DISTRIBUTION.get(module, module).lower() not in dev:
                missing.setdefault(module, where)
    assert not missing, (
        f"imported by tests, examples or docs but not installed by the README's test command "
        f'(pip install -e ".[dev]"): {missing}; add each to the dev extra in pyproject.toml, or import it '
        "with pytest.importorskip(name, reason=<the pip command of its optional extra>)"
    )


def test_a_test_of_an_optional_extra_skips_with_its_install_command():
    import ast

    dev = _requirements("dev")
    for where, source in _test_sources().items():
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "importorskip" and node.args:
                module = node.args[0].value.split(".")[0]
                assert DISTRIBUTION.get(module, module).lower() not in dev, (
                    f"{where}: importorskip({module!r}), but the dev extra installs it: import it plainly, "
                    "so that a missing install fails instead of skipping"
                )
                reason = next((k.value.value for k in node.keywords if k.arg == "reason"), "")
                assert "pip install" in reason, f"{where}: importorskip({module!r}) needs reason='... pip install ...'"
