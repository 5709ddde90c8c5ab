"""Lightning's names and ours: the one table that the command and docs/migrating-from-lightning.md both read.

Adding a name is one line in ``NAMES``; then regenerate the docs' table (tests/migrate/test_names.py says how).
A row holds the name where Lightning's docs import it from; the other spellings resolve to it (``resolve``):
``pytorch_lightning.X`` is ``lightning.pytorch.X``, and a name in a submodule
(``lightning.pytorch.callbacks.early_stopping.EarlyStopping``) is the one its package exports.
"""

from __future__ import annotations

# Lightning's modules that a user binds to a name (`import lightning as L`, `from lightning.pytorch import loggers`),
# and the module of ours that holds the same names.
MODULES: dict[str, str] = {
    "lightning": "trainer",
    "lightning.pytorch": "trainer",
    "lightning.pytorch.callbacks": "callbacks",
    "lightning.pytorch.loggers": "loggers",
    "lightning.pytorch.strategies": "strategies",
    "lightning.pytorch.cli": "trainer.cli",
    "lightning.pytorch.profilers": "trainer.profilers",
}

# Lightning's name -> ours, one row each.
NAMES: dict[str, str] = {
    "lightning.LightningModule": "trainer.TrainModule",
    "lightning.pytorch.LightningModule": "trainer.TrainModule",
    "lightning.LightningDataModule": "trainer.DataModule",
    "lightning.pytorch.LightningDataModule": "trainer.DataModule",
    "lightning.Trainer": "trainer.Trainer",
    "lightning.pytorch.Trainer": "trainer.Trainer",
    "lightning.seed_everything": "trainer.seed_everything",
    "lightning.pytorch.seed_everything": "trainer.seed_everything",
    "lightning.fabric.seed_everything": "trainer.seed_everything",
    "lightning.__version__": "trainer.__version__",
    "lightning.pytorch.__version__": "trainer.__version__",
    "lightning.Callback": "callbacks.Callback",
    "lightning.pytorch.Callback": "callbacks.Callback",
    "lightning.pytorch.callbacks.Callback": "callbacks.Callback",
    "lightning.pytorch.callbacks.ModelCheckpoint": "callbacks.ModelCheckpoint",
    "lightning.pytorch.callbacks.EarlyStopping": "callbacks.EarlyStopping",
    "lightning.pytorch.callbacks.LambdaCallback": "callbacks.LambdaCallback",
    "lightning.pytorch.callbacks.ModelSummary": "callbacks.ModelSummary",
    "lightning.pytorch.callbacks.Timer": "callbacks.Timer",
    "lightning.pytorch.callbacks.LearningRateMonitor": "callbacks.LearningRateMonitor",
    "lightning.pytorch.callbacks.TQDMProgressBar": "callbacks.TQDMProgressBar",
    "lightning.pytorch.callbacks.StochasticWeightAveraging": "callbacks.StochasticWeightAveraging",
    "lightning.pytorch.callbacks.BaseFinetuning": "callbacks.BaseFinetuning",
    "lightning.pytorch.callbacks.BackboneFinetuning": "callbacks.BackboneFinetuning",
    "lightning.pytorch.callbacks.GradientAccumulationScheduler": "callbacks.GradientAccumulationScheduler",
    "lightning.pytorch.callbacks.BasePredictionWriter": "callbacks.BasePredictionWriter",
    "lightning.pytorch.callbacks.LearningRateFinder": "callbacks.LearningRateFinder",
    "lightning.pytorch.callbacks.BatchSizeFinder": "callbacks.BatchSizeFinder",
    "lightning.pytorch.callbacks.RichProgressBar": "callbacks.RichProgressBar",
    "lightning.pytorch.callbacks.RichModelSummary": "callbacks.RichModelSummary",
    "lightning.pytorch.callbacks.ModelPruning": "callbacks.ModelPruning",
    "lightning.pytorch.callbacks.WeightAveraging": "callbacks.WeightAveraging",
    "lightning.pytorch.callbacks.EMAWeightAveraging": "callbacks.EMAWeightAveraging",
    "lightning.pytorch.callbacks.DeviceStatsMonitor": "callbacks.DeviceStatsMonitor",
    "lightning.pytorch.callbacks.ThroughputMonitor": "callbacks.ThroughputMonitor",
    "lightning.pytorch.callbacks.SpikeDetection": "callbacks.SpikeDetection",
    "lightning.pytorch.callbacks.progress.tqdm_progress.Tqdm": "callbacks.Tqdm",
    "lightning.pytorch.callbacks.progress.rich_progress.RichProgressBarTheme": "callbacks.RichProgressBarTheme",
    "lightning.pytorch.loggers.Logger": "loggers.Logger",
    "lightning.pytorch.loggers.TensorBoardLogger": "loggers.TensorBoardLogger",
    "lightning.pytorch.loggers.CSVLogger": "loggers.CSVLogger",
    "lightning.pytorch.loggers.MLFlowLogger": "loggers.MLFlowLogger",
    "lightning.pytorch.loggers.WandbLogger": "loggers.WandbLogger",
    "lightning.pytorch.loggers.CometLogger": "loggers.CometLogger",
    "lightning.pytorch.loggers.logger.DummyLogger": "loggers.DummyLogger",
    "lightning.pytorch.loggers.csv_logs.ExperimentWriter": "loggers.ExperimentWriter",
    "lightning.pytorch.loggers.logger.rank_zero_experiment": "loggers.rank_zero_experiment",
    "lightning.pytorch.profilers.Profiler": "trainer.profilers.Profiler",
    "lightning.pytorch.profilers.SimpleProfiler": "trainer.profilers.SimpleProfiler",
    "lightning.pytorch.profilers.AdvancedProfiler": "trainer.profilers.AdvancedProfiler",
    "lightning.pytorch.profilers.PyTorchProfiler": "trainer.profilers.PyTorchProfiler",
    "lightning.pytorch.profilers.PassThroughProfiler": "trainer.profilers.PassThroughProfiler",
    "lightning.pytorch.tuner.Tuner": "trainer.Tuner",
    "lightning.pytorch.cli.LightningCLI": "trainer.cli.LightningCLI",
    "lightning.pytorch.cli.LightningArgumentParser": "trainer.cli.LightningArgumentParser",
    "lightning.pytorch.cli.SaveConfigCallback": "trainer.cli.SaveConfigCallback",
    "lightning.pytorch.cli.ArgsType": "trainer.cli.ArgsType",
    "lightning.pytorch.cli.OptimizerCallable": "trainer.cli.OptimizerCallable",
    "lightning.pytorch.cli.LRSchedulerCallable": "trainer.cli.LRSchedulerCallable",
    "lightning.pytorch.cli.LRSchedulerTypeTuple": "trainer.cli.LRSchedulerTypeTuple",
    "lightning.pytorch.cli.instantiate_class": "trainer.cli.instantiate_class",
    "lightning.pytorch.cli.instantiate_module": "trainer.cli.instantiate_module",
    "lightning.pytorch.utilities.rank_zero_only": "trainer.rank_zero_only",
    "lightning.pytorch.utilities.rank_zero_info": "trainer.rank_zero_info",
    "lightning.pytorch.utilities.rank_zero_warn": "trainer.rank_zero_warn",
    "lightning.pytorch.utilities.rank_zero.rank_zero_debug": "trainer.rank_zero_debug",
    "lightning.pytorch.utilities.grad_norm": "trainer.grad_norm",
    "lightning.pytorch.utilities.AttributeDict": "trainer.AttributeDict",
    "lightning.pytorch.utilities.parsing.AttributeDict": "trainer.AttributeDict",
    "lightning.pytorch.utilities.CombinedLoader": "trainer.data.CombinedLoader",
    "lightning.pytorch.utilities.combined_loader.CombinedLoader": "trainer.data.CombinedLoader",
    "lightning.pytorch.utilities.parsing.is_picklable": "trainer.utilities.parsing.is_picklable",
    "lightning.pytorch.utilities.parsing.clean_namespace": "trainer.utilities.parsing.clean_namespace",
    "lightning.pytorch.utilities.parsing.collect_init_args": "trainer.utilities.parsing.collect_init_args",
    "lightning.pytorch.utilities.parsing.get_init_args": "trainer.utilities.parsing.get_init_args",
    "lightning.pytorch.utilities.parsing.parse_class_init_keys": "trainer.utilities.parsing.parse_class_init_keys",
    "lightning.pytorch.utilities.parsing.lightning_getattr": "trainer.utilities.parsing.lightning_getattr",
    "lightning.pytorch.utilities.parsing.lightning_hasattr": "trainer.utilities.parsing.lightning_hasattr",
    "lightning.pytorch.utilities.parsing.lightning_setattr": "trainer.utilities.parsing.lightning_setattr",
    "lightning.pytorch.utilities.memory.recursive_detach": "trainer.utilities.memory.recursive_detach",
    "lightning.pytorch.utilities.seed.isolate_rng": "trainer.utilities.seed.isolate_rng",
    "lightning.pytorch.utilities.compile.from_compiled": "trainer.utilities.compile.from_compiled",
    "lightning.pytorch.utilities.compile.to_uncompiled": "trainer.utilities.compile.to_uncompiled",
    "lightning.pytorch.utilities.types.LRSchedulerConfig": "trainer.utilities.types.LRSchedulerConfig",
    "lightning.pytorch.utilities.find_shared_parameters": "trainer.utilities.find_shared_parameters",
    "lightning.pytorch.utilities.set_shared_parameters": "trainer.utilities.set_shared_parameters",
    "lightning.pytorch.utilities.is_picklable": "trainer.utilities.is_picklable",
    "lightning.pytorch.utilities.measure_flops": "trainer.utilities.measure_flops",
    "lightning.pytorch.utilities.warnings.PossibleUserWarning": "trainer.PossibleUserWarning",
    "lightning.pytorch.utilities.disable_possible_user_warnings": "trainer.utilities.disable_possible_user_warnings",
    "lightning.fabric.utilities.warnings.PossibleUserWarning": "trainer.PossibleUserWarning",
    "lightning.pytorch.utilities.rank_zero.LightningDeprecationWarning":
        "trainer.utilities.warnings.LightningDeprecationWarning",
    "lightning.fabric.utilities.rank_zero.LightningDeprecationWarning":
        "trainer.utilities.warnings.LightningDeprecationWarning",
    "lightning.fabric.utilities.disable_possible_user_warnings": "trainer.utilities.disable_possible_user_warnings",
    "lightning.fabric.utilities.throughput.Throughput": "trainer.utilities.Throughput",
    "lightning.fabric.utilities.throughput.measure_flops": "trainer.utilities.measure_flops",
    "lightning.fabric.utilities.spike.TrainingSpikeException": "callbacks.TrainingSpikeException",
    "lightning.pytorch.strategies.DDPStrategy": "strategies.DDPStrategy",
    "lightning.pytorch.strategies.FSDPStrategy": "strategies.FSDPStrategy",
    "lightning.pytorch.trainer.states.TrainerFn": "trainer.TrainerFn",
    "lightning.pytorch.trainer.states.TrainerStatus": "trainer.TrainerStatus",
    "lightning.pytorch.trainer.states.RunningStage": "trainer.RunningStage",
    "lightning.pytorch.trainer.states.TrainerState": "trainer.TrainerState",
    "lightning.pytorch.utilities.exceptions.MisconfigurationException": "trainer.MisconfigurationException",
    "lightning.fabric.utilities.exceptions.MisconfigurationException": "trainer.MisconfigurationException",
    "lightning.pytorch.utilities.model_summary.ModelSummary": "trainer.core.summary.ModelSummary",
    "lightning.pytorch.utilities.model_summary.summarize": "trainer.core.summary.summarize",
    "lightning.pytorch.utilities.model_summary.LayerSummary": "trainer.core.summary.LayerSummary",
    "lightning.pytorch.core.optimizer.LightningOptimizer": "trainer.LightningOptimizer",
}


def spelled(name: str) -> str:
    """``name`` in Lightning's current spelling: ``pytorch_lightning[.X]`` is ``lightning.pytorch[.X]``."""
    if name == "pytorch_lightning" or name.startswith("pytorch_lightning."):
        return "lightning.pytorch" + name[len("pytorch_lightning"):]
    return name


def is_lightning(name: str) -> bool:
    """Whether ``name`` is Lightning's (``lightning``, ``pytorch_lightning`` or below them)."""
    return spelled(name).partition(".")[0] == "lightning"


def resolve(name: str) -> str | None:
    """Our name for Lightning's ``name`` (a dotted path), or None when it has no counterpart.

    Exactly a row first; else the name one package up, while the parts left out are module names
    (lowercase): ``lightning.pytorch.loggers.tensorboard.TensorBoardLogger`` is the package's ``TensorBoardLogger``.
    """
    parts = spelled(name).split(".")
    if ".".join(parts) in NAMES:
        return NAMES[".".join(parts)]
    last = parts[-1]
    for end in range(len(parts) - 2, 1, -1):
        if not parts[end].islower():
            break
        candidate = ".".join(parts[:end] + [last])
        if candidate in NAMES:
            return NAMES[candidate]
    return None


def resolve_module(name: str) -> str | None:
    """Our module for Lightning's module ``name``, or None when it has none."""
    return MODULES.get(spelled(name))


def render_table() -> str:
    """The docs' import table (markdown), rows in ``NAMES``'s order. Names that keep their name from one Lightning
    module to one of ours share a row (``lightning.pytorch.callbacks.X`` for X in ...), as do the Lightning
    spellings of one renamed name (``lightning.LightningModule``, ``lightning.pytorch.LightningModule``)."""
    rows = ["| Lightning | here |", "|---|---|"]
    by_module: dict[str, list[str]] = {}
    for lightning, ours in MODULES.items():
        by_module.setdefault(ours, []).append(lightning)
    for ours, lightning in by_module.items():
        rows.append(f"| {', '.join(f'`import {m}`' for m in lightning)} | `import {ours}` |")
    kept: dict[tuple[str, str], list[str]] = {}  # (Lightning's module, ours) -> the names that keep their name
    renamed: dict[str, list[str]] = {}  # our name -> Lightning's names for it
    order: list[tuple[str, str] | str] = []
    for lightning, ours in NAMES.items():
        (l_module, _, l_name), (o_module, _, o_name) = lightning.rpartition("."), ours.rpartition(".")
        key: tuple[str, str] | str = (l_module, o_module) if l_name == o_name else ours
        group = kept.setdefault(key, []) if isinstance(key, tuple) else renamed.setdefault(key, [])
        if not group:
            order.append(key)
        group.append(l_name if isinstance(key, tuple) else lightning)
    for key in order:
        if isinstance(key, str):
            rows.append(f"| {', '.join(f'`{n}`' for n in renamed[key])} | `{key}` |")
        elif len(kept[key]) == 1:
            rows.append(f"| `{key[0]}.{kept[key][0]}` | `{key[1]}.{kept[key][0]}` |")
        else:
            rows.append(f"| `{key[0]}.X` for X in {', '.join(f'`{n}`' for n in kept[key])} | `{key[1]}.X` |")
    return "\n".join(rows) + "\n"
