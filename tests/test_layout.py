"""The layout docs/layout.md describes: rooms by concern, file sizes, and imports that run one way."""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("trainer", "callbacks", "strategies", "loggers")
# Bottom to top: a module may import (at module level) only from its own room or the ones below.
# strategies, callbacks and loggers share a rank: they sit on core, data and checkpoint, under the loops.
RANK = {
    "trainer._version": 0, "trainer.core": 0, "trainer.data": 1, "trainer.utilities": 1, "trainer.checkpoint": 2,
    "strategies": 3, "callbacks": 3, "loggers": 3, "trainer.profilers": 3, "trainer.loops": 4, "trainer.trainer": 5,
    "trainer.options": 5,
    "trainer.trainer_properties": 5, "trainer.calls_without_model": 5, "trainer.init_arguments": 5, "trainer.tuner": 5,
    "trainer.cli": 5,
    "trainer.migrate": 5,
}


def _sources(package: str) -> list[str]:
    found = []
    for folder, _, names in os.walk(os.path.join(ROOT, package)):
        found += [os.path.relpath(os.path.join(folder, n), ROOT) for n in names if n.endswith(".py")]
    return sorted(p.replace(os.sep, "/") for p in found)


def _room(module: str) -> str | None:
    for room in sorted(RANK, key=len, reverse=True):
        if module == room or module.startswith(room + "."):
            return room
    return None


def _module_level_imports(path: str) -> list[tuple[str, list[str]]]:
    """(module, names) of each import that runs when the file is imported: TYPE_CHECKING blocks
    and function bodies are left out."""
    tree = ast.parse(open(os.path.join(ROOT, path)).read())
    found: list[tuple[str, list[str]]] = []

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.extend((a.name, []) for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                found.append((node.module if node.level == 0 else "." + node.module, [a.name for a in node.names]))
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                visit(node.body + node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body + node.orelse + node.finalbody)

    visit(tree.body)
    return found


ALL = [p for pkg in PACKAGES for p in _sources(pkg)]


@pytest.mark.parametrize("path", ALL)
def test_no_package_file_is_over_400_lines(path):
    with open(os.path.join(ROOT, path)) as f:
        assert sum(1 for _ in f) <= 400, f"{path} is over 400 lines: split it by concept"


@pytest.mark.parametrize("path", ALL)
def test_no_package_line_is_over_120_characters(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        long = [n for n, line in enumerate(f, start=1) if len(line.rstrip("\n")) > 120]
    assert not long, f"{path}: line(s) {long} are over 120 characters: shorten them (.ci/run checks with ruff too)"


@pytest.mark.parametrize("package", [
    "trainer", "trainer/core", "trainer/core/export", "trainer/data", "trainer/checkpoint", "trainer/loops", "trainer/loops/optimization",
    "trainer/profilers", "trainer/tuner", "trainer/utilities", "trainer/migrate", "callbacks", "callbacks/progress",
    "callbacks/training", "callbacks/monitors", "strategies", "loggers",
])
def test_no_room_holds_more_than_12_modules_and_its_init_says_what_it_is_for(package):
    folder = os.path.join(ROOT, package)
    modules = [n for n in os.listdir(folder) if n.endswith(".py") and n != "__init__.py"]
    assert len(modules) <= 12, f"{package} holds {len(modules)} modules: {sorted(modules)}"
    tree = ast.parse(open(os.path.join(folder, "__init__.py")).read())
    doc = ast.get_docstring(tree)
    assert doc and doc.strip(), f"{package}/__init__.py should open with one line saying what the room is for"


@pytest.mark.parametrize("path", [p for p in ALL if not p.endswith("trainer/__init__.py")])
def test_imports_run_one_way(path):
    """No module imports a room above its own, and none imports the trainer package's __init__
    (``from trainer import X``): that __init__ imports the rooms, so that would be a circle."""
    own = _room(path[:-3].replace("/", ".").removesuffix(".__init__"))
    assert own is not None, f"{path} is in no room of RANK"
    for module, names in _module_level_imports(path):
        if module.startswith("."):  # a sibling in the same package
            assert not path.startswith("trainer/"), f"{path}: the trainer package imports absolutely (from trainer.core... import ...)"
            continue
        assert module != "trainer", f"{path} imports {names} from the trainer package's __init__"
        room = _room(module)
        if room is not None and room != own:
            assert RANK[room] < RANK[own] or (own == "trainer.trainer"), f"{path} ({own}) imports {module} ({room}), a room above it"


def _function_level_imports(path: str) -> list[tuple[int, str]]:
    """(line, module) of each absolute import inside a function body (not under TYPE_CHECKING)."""
    found: list[tuple[int, str]] = []
    for fn in ast.walk(ast.parse(open(os.path.join(ROOT, path)).read())):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    found += [(node.lineno, a.name) for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    found.append((node.lineno, node.module))
    return sorted(set(found))


def _imports_above(path: str, imports: list[tuple[int, str]]) -> list[str]:
    own = _room(path[:-3].replace("/", ".").removesuffix(".__init__"))
    above = [(line, m) for line, m in imports if (room := _room(m)) is not None and RANK[room] > RANK[own]]
    return [f"line {line}: {module}" for line, module in above]


def test_the_check_of_function_level_imports_finds_one_that_points_up():
    code = "def f():\n    from trainer.loops.run import Run\n    import torch\n"
    tree = ast.parse(code)
    imports = [(n.lineno, n.module) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    assert _imports_above("trainer/core/module.py", imports) == ["line 2: trainer.loops.run"]
    assert _imports_above("trainer/trainer.py", imports) == []


@pytest.mark.parametrize("path", [p for p in ALL if not p.endswith("trainer/__init__.py")])
def test_imports_inside_functions_point_no_room_up_either(path):
    """A deferred import is still a dependency: one inside a function (to keep ``import trainer``
    cheap, or to break a circle) may reach its own rank or below, never a room above."""
    bad = _imports_above(path, _function_level_imports(path))
    assert not bad, f"{path} imports a room above its own inside a function ({', '.join(bad)}): pass the value down"


# A run's state is one object, handed down (docs/layout.md): the Trainer holds its options, the
# counters and a reference to the current run, and only the Trainer and the run's own module
# write its attributes. Everywhere else a Trainer is only given values through its public
# setters (Lightning's: should_stop, accumulate_grad_batches, the options, ...).
TRAINER_WRITERS = ("trainer/trainer.py", "trainer/loops/run.py")


def _names_a_trainer(node: ast.AST) -> bool:
    """``trainer``, ``search`` (the Tuner's copy), or ``<anything>.trainer`` / ``<anything>._trainer``."""
    if isinstance(node, ast.Name):
        return node.id in ("trainer", "search")
    return isinstance(node, ast.Attribute) and node.attr in ("trainer", "_trainer")


def _trainer_attribute_writes(path: str) -> list[tuple[int, str]]:
    """(line, attribute) of each ``trainer.<attribute> = ...`` (also augmented, annotated or in a
    tuple) and ``setattr(trainer, ...)``; a name that is not a constant is ``"<computed>"``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(open(os.path.join(ROOT, path)).read())):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        while any(isinstance(t, (ast.Tuple, ast.List)) for t in targets):
            targets = [e for t in targets for e in (t.elts if isinstance(t, (ast.Tuple, ast.List)) else [t])]
        found += [(t.lineno, t.attr) for t in targets if isinstance(t, ast.Attribute) and _names_a_trainer(t.value)]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and node.args:
            if _names_a_trainer(node.args[0]):
                name = node.args[1]
                found.append((node.lineno, name.value if isinstance(name, ast.Constant) else "<computed>"))
    return found


def _public_setters(cls: type | None = None) -> set[str]:
    if cls is None:
        from trainer import Trainer as cls

    return {n for n, v in inspect.getmembers(cls) if isinstance(v, property) and v.fset and not n.startswith("_")}


def test_the_checks_of_trainer_writes_find_them():
    """The two checks below can fail: they find the writes a Trainer used to get from everywhere."""
    code = "trainer._opt = opt\ntrainer.grad_norm, trainer.state = 1, 2\nsetattr(search, name, 0)\nmodule.trainer._phase = None\n"
    tree = ast.parse(code)
    assert sorted(t.attr for t in ast.walk(tree) if isinstance(t, ast.Attribute) and _names_a_trainer(t.value)) == [
        "_opt", "_phase", "grad_norm", "state",
    ]
    assert {"should_stop", "accumulate_grad_batches", "max_epochs", "callbacks", "logger"} <= _public_setters()
    assert not {"_run", "_options", "state", "_strategy"} & _public_setters()


# The Trainer's public setters that write the current call's run: those Lightning documents as settable.
RUN_SETTERS = {"ckpt_path", "optimizers", "datamodule"}  # datamodule: a plain attribute in Lightning


def _setters_that_write_the_run(cls: type) -> set[str]:
    """The public setters of ``cls`` (a Trainer) after which some field of the run holds another
    object: each is set on a fresh Trainer to the first of a few values it takes."""
    writers = set()
    for name in sorted(_public_setters(cls)):
        trainer = cls(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        run = trainer._current_run()
        before = dict(vars(run))
        for value in (object(), "value.ckpt", [], True, 1):
            try:
                setattr(trainer, name, value)
                break
            except (TypeError, ValueError, AttributeError):
                continue
        if trainer._current_run() is not run or any(before[k] is not v for k, v in vars(run).items()):
            writers.add(name)
    return writers


def test_no_public_setter_writes_the_run_but_lightnings_settable_ones():
    """``trainer.<name> = ...`` writes the run only where Lightning documents the name as settable
    (``ckpt_path``, ``optimizers``; ``datamodule``, a plain attribute there); the run's other values are read-only
    properties."""
    from trainer import Trainer

    assert _setters_that_write_the_run(Trainer) == RUN_SETTERS


def test_the_check_of_the_run_setters_finds_a_new_one():
    from trainer import Trainer

    class Leaky(Trainer):
        grad_norm = property(lambda t: None, lambda t, value: setattr(t._current_run(), "grad_norm", value))

    assert _setters_that_write_the_run(Leaky) == RUN_SETTERS | {"grad_norm"}


@pytest.mark.parametrize("path", [p for p in ALL if p not in TRAINER_WRITERS])
def test_only_the_trainer_and_the_run_write_the_trainers_attributes(path):
    setters = _public_setters()
    bad = [f"line {line}: trainer.{name}" for line, name in _trainer_attribute_writes(path) if name not in setters]
    assert not bad, (
        f"{path} writes the Trainer's own attributes ({', '.join(bad)}): a call's state belongs on its run "
        "(trainer/loops/run.py), handed to whoever needs it; elsewhere set only the Trainer's public setters."
    )


@pytest.mark.parametrize("path", [p for p in ALL if p.startswith("callbacks/")])
def test_callbacks_read_no_underscore_name_of_the_trainer_or_the_run(path):
    bad = []
    for node in ast.walk(ast.parse(open(os.path.join(ROOT, path)).read())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and _names_a_trainer(node.value):
            bad.append(f"line {node.lineno}: trainer.{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            name = node.args[1] if len(node.args) > 1 else None
            if node.args and _names_a_trainer(node.args[0]) and isinstance(name, ast.Constant) and str(name.value).startswith("_"):
                bad.append(f"line {node.lineno}: {node.func.id}(trainer, {name.value!r})")
    assert not bad, f"{path} reads private names of the Trainer or its run ({', '.join(bad)}): use public ones"


@pytest.mark.slow
def test_the_trainer_package_has_no_circle_through_its_init(script_env):
    """Importing the package loads only the bottom rooms: no loop, strategy or callback."""
    code = (
        "import sys, trainer\n"
        "above = sorted(m for m in sys.modules if m.startswith(('trainer.loops', 'trainer.trainer', 'strategies', 'callbacks', 'loggers')))\n"
        "print(above)"
    )
    done = subprocess.run([sys.executable, "-c", code], env=script_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("first", ["trainer", "strategies", "callbacks", "trainer.data", "trainer.loops", "strategies.ddp", "callbacks.model_checkpoint"])
def test_any_package_can_be_imported_first(first, script_env):
    code = f"import {first}; from trainer import Trainer; from strategies import DDPStrategy; from callbacks import ModelCheckpoint"
    done = subprocess.run([sys.executable, "-c", code], env=script_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


# The public names, pinned: `from trainer import ...`, `from callbacks import ...` and
# `from strategies import ...` are what users write, whatever the rooms behind them.
PUBLIC = {
    "trainer": [
        "AttributeDict", "CheckpointError", "CombinedLoader", "DataModule", "Interrupted", "LightningOptimizer",
        "MisconfigurationException", "PossibleUserWarning", "RunningStage", "TrainModule", "Trainer", "TrainerFn", "TrainerState",
        "TrainerStatus", "Tuner",
        "__version__", "grad_norm", "rank_zero_debug", "rank_zero_info", "rank_zero_only", "rank_zero_warn", "seed_everything",
    ],
    "callbacks": [
        "BackboneFinetuning", "BaseFinetuning", "BasePredictionWriter", "BatchSizeFinder", "Callback", "EarlyStopping", "EarlyStoppingReason",
        "GradientAccumulationScheduler", "LambdaCallback", "LearningRateFinder", "LearningRateMonitor", "ModelCheckpoint",
        "ModelSummary", "NaNGuard", "ProgressBar", "RichModelSummary", "RichProgressBar", "RichProgressBarTheme",
        "StochasticWeightAveraging", "TQDMProgressBar", "TensorBoardLogger", "Timer", "Tqdm",
        "EMAWeightAveraging", "ModelPruning", "WeightAveraging",
        "DeviceStatsMonitor", "SpikeDetection", "Throughput", "ThroughputMonitor", "TrainingSpikeException", "measure_flops",
    ],
    "loggers": [
        "CSVLogger", "CometLogger", "DummyExperiment", "DummyLogger", "ExperimentWriter", "Logger", "MLFlowLogger",
        "TensorBoardLogger", "WandbLogger", "rank_zero_experiment", "rank_zero_only",
    ],
    "strategies": [
        "DDPStrategy", "DataParallelStrategy", "FSDPStrategy", "ParallelStrategy", "SingleDeviceStrategy", "Strategy", "WorkerError",
        "select_strategy",
    ],
}


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_public_names_are_pinned(package):
    module = __import__(package)
    assert sorted(module.__all__) == sorted(PUBLIC[package])
    for name in PUBLIC[package]:
        assert getattr(module, name) is not None


HEAVY = (
    "torch.distributed.tensor", "torch.distributed.checkpoint", "torch.distributed.fsdp", "torch._dynamo", "sympy",
    "jsonargparse", "torchmetrics", "mlflow", "wandb",
    "rich",  # the default bar and summary when installed, imported when they first draw
)


@pytest.mark.slow
def test_importing_the_packages_and_the_trainer_loads_no_heavy_module(script_env):
    """fsdp's DTensor and DCP, compile's dynamo (and the sympy they pull in), the CLI's
    jsonargparse, the MLflow and W&B clients: each is imported where it is used, so `import trainer` stays cheap
    (benchmarks/import_time.py prints the cost)."""
    code = (
        "import sys, trainer, callbacks, strategies, loggers\n"
        "from trainer import Trainer\n"
        "Trainer(max_steps=1)\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], env=script_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout
