"""Fuzzed Trainer options: every outcome is a clean run or one of our sentences.

Each example draws Trainer keyword values, all valid or with one invalid option, and runs a
tiny fit. Valid options must train; an invalid one must raise ValueError or TypeError whose
message names it. Any other exception (an IndexError from deep inside, a hang, a raw torch
error) fails the test. Combinations that are invalid together (devices=2 with
strategy='single', no max_epochs and no max_steps) are worked out
by ``_problems``.

DDP runs in this process as a one-process job, as under ``torchrun --nproc_per_node=1``:
spawning workers per example would be too slow, and strategy='ddp' is still set up, wrapped
and torn down for real.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
import warnings
from typing import Any, Iterator

# Hypothesis keeps caches (and, on a failure, patch files) under ./.hypothesis even with
# database=None; keep them out of the checkout. Read when it first writes, i.e. after this.
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", os.path.join(tempfile.gettempdir(), "trainer-hypothesis"))

import torch  # noqa: E402
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st  # noqa: E402

from callbacks import ModelCheckpoint, ProgressBar
from strategies import DDPStrategy, SingleDeviceStrategy
from strategies._spawn import free_port
from tests._models import Classifier, loader
from trainer import Trainer, TrainModule

CUDA = torch.cuda.is_available()
SGD = functools.partial(torch.optim.SGD, lr=0.1)


def single_on_cpu() -> SingleDeviceStrategy:
    return SingleDeviceStrategy("cpu")


def ddp_instance() -> DDPStrategy:
    return DDPStrategy(timeout=30)


# Each option: valid values, and invalid ones with the words one of which its error must contain.
# Callables build fresh objects (strategies and callbacks are stateful).
VALID: dict[str, list[Any]] = {
    "strategy": ["auto", "single", "single_device", "dp", "data_parallel", "ddp", single_on_cpu, ddp_instance],
    "devices": ["auto", 1, 2],  # 2: only with 'dp' (which falls back to the CPU), see _problems
    "precision": ["32", 32, "32-true", "bf16-mixed", "bf16", "16-mixed", 16],  # 16 on a CPU: bf16, as Lightning's
    "max_epochs": [None, 1, 2],
    "max_steps": [None, 1, 3],
    "accumulate_grad_batches": [1, 2, 3],
    "gradient_clip_val": [None, 0.5, 1],
    "gradient_clip_algorithm": ["norm", "value"],
    "check_val_every_n_epoch": [None, 1, 2],
    "val_check_interval": [None, 0.5, 1.0, 1, 3],
    "log_every_n_steps": [1, 2, 50],
    "log_dir": [None, "runs"],
    "callbacks": [None, [], lambda: [ModelCheckpoint(dirpath="ckpts", every_n_train_steps=1)],
                  lambda: [ModelCheckpoint(dirpath="best", monitor="train_loss", save_top_k=2)],
                  lambda: ProgressBar(refresh_s=1.0)],
    "enable_progress_bar": [True, False],
    "enable_checkpointing": [True, False],
    "limit_train_batches": [None, 0, 1, 2, 0.5, 1.0],  # 0: trains nothing (Lightning's)
    "limit_val_batches": [None, 0, 1, 0.5],
    "seed": [None, 0, 7],
    "deterministic": [False, True],
    "optimizer": [SGD, lambda: (lambda params: torch.optim.Adam(params, lr=1e-3))],
    "name": ["default", "run-1"],
}
INVALID: dict[str, list[tuple[Any, tuple[str, ...]]]] = {
    "strategy": [("dpp", ("strategy",)), ("gpu", ("strategy",)), ("DDP", ("strategy",)), (None, ("strategy",)),
                 (3, ("strategy",)), ("", ("strategy",))],
    "devices": [(0, ("devices",)), (-2, ("devices",)), (1.5, ("devices",)), ("two", ("devices",)), ([], ("devices",)),
                ([0, 0], ("devices",)), (True, ("devices",)), (None, ("devices",))]
    + ([] if CUDA else [([0], ("devices",)), ([7], ("devices",))]),
    "precision": [("8", ("precision",)), ("half", ("precision",)), (16.0, ("precision",)), ("fp16", ("precision",))],
    "max_epochs": [(0, ("max_epochs",)), (-2, ("max_epochs",)), (1.5, ("max_epochs",)), ("1", ("max_epochs",)),
                   (True, ("max_epochs",))],
    "max_steps": [(0, ("max_steps",)), (-2, ("max_steps",)), (2.0, ("max_steps",))],
    "accumulate_grad_batches": [(0, ("accumulate_grad_batches",)), (1.0, ("accumulate_grad_batches",)),
                                (-1, ("accumulate_grad_batches",))],
    "gradient_clip_val": [(-1.0, ("gradient_clip_val",)),  # 0 is Lightning's "no clipping"
                          (float("nan"), ("gradient_clip_val",)), (float("inf"), ("gradient_clip_val",)),
                          ("1", ("gradient_clip_val",))],
    "gradient_clip_algorithm": [("l2", ("gradient_clip_algorithm",)), ("Norm", ("gradient_clip_algorithm",)),
                                (1, ("gradient_clip_algorithm",))],
    "check_val_every_n_epoch": [(0, ("check_val_every_n_epoch",)), (1.5, ("check_val_every_n_epoch",))],
    "val_check_interval": [(0, ("val_check_interval",)), (0.0, ("val_check_interval",)),
                           (1.5, ("val_check_interval",)), (-1, ("val_check_interval",)),
                           ("half", ("val_check_interval",))],
    "log_every_n_steps": [(0, ("log_every_n_steps",)), (-1, ("log_every_n_steps",)), (2.5, ("log_every_n_steps",))],
    "log_dir": [(5, ("log_dir",)), (["runs"], ("log_dir",))],
    "callbacks": [(5, ("callbacks",)), ("abc", ("callbacks",)), (lambda: [object()], ("callbacks",)),
                  (lambda: [ModelCheckpoint], ("callbacks", "ModelCheckpoint")),
                  # a monitor never logged is found only by a save, which a short run may never reach
                  # (test_model_checkpoint_when.py covers it); this one is refused when built
                  (lambda: [ModelCheckpoint(dirpath="never", save_top_k=3)], ("save_top_k=3",)),
                  (lambda: [ModelCheckpoint(save_top_k=-5)], ("save_top_k",)),
                  (lambda: [ModelCheckpoint(filename="{epoch")], ("filename",)),
                  (lambda: [ProgressBar(refresh_s=-1)], ("refresh_s",))],
    "enable_progress_bar": [("yes", ("enable_progress_bar",)), (1, ("enable_progress_bar",)),
                            ("", ("enable_progress_bar",))],
    "enable_checkpointing": [("no", ("enable_checkpointing",)), (0, ("enable_checkpointing",))],
    "limit_train_batches": [(-1, ("limit_train_batches",)), (1.5, ("limit_train_batches",)),
                            ("all", ("limit_train_batches",))],
    "limit_val_batches": [(-1, ("limit_val_batches",)), (2.0, ("limit_val_batches",))],
    "seed": [(-1, ("seed",)), (1.5, ("seed",)), ("1", ("seed",)), (2**32, ("seed",))],
    "deterministic": [("yes", ("deterministic",)), (1, ("deterministic",))],
    "optimizer": [(None, ("optimizer",)), ("adam", ("optimizer",)), (lambda: (lambda: None), ("optimizer",)),
                  (lambda: (lambda params: "adam"), ("optimizer",))],
    "name": [("", ("name",)), ("a/b", ("name",)), ("..", ("name",)), (3, ("name",))],
}
ALWAYS = {"optimizer", "max_steps", "max_epochs"}  # the model has no configure_optimizers; both ends None is rarer


_PORT: dict[str, int] = {}  # one rendezvous port for every one-process DDP example


class NeedsOptimizer(Classifier):
    """Takes its optimizer from Trainer(optimizer=...), so that option matters: it has no
    configure_optimizers of its own (one returning None would train with no optimizer)."""

    configure_optimizers = TrainModule.configure_optimizers


@st.composite
def trainer_options(draw: st.DrawFn) -> tuple[dict[str, Any], dict[str, tuple[str, ...]]]:
    """Options, and the words expected in the error for each invalid one (empty: all valid)."""
    bad = draw(st.one_of(st.none(), st.sampled_from(sorted(INVALID))))
    options: dict[str, Any] = {}
    invalid: dict[str, tuple[str, ...]] = {}
    for name in sorted(VALID):
        if name == bad:
            options[name], invalid[name] = draw(st.sampled_from(INVALID[name]))
        elif name in ALWAYS or draw(st.booleans()):
            options[name] = draw(st.sampled_from(VALID[name]))
    return options, invalid


def _problems(options: dict[str, Any], invalid: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """The invalid options, plus combinations of valid values that cannot work together."""
    problems = dict(invalid)
    strategy, devices = options.get("strategy", "auto"), options.get("devices", "auto")
    if devices == 2 and "devices" not in invalid and "strategy" not in invalid:
        if _is_ddp(strategy) or strategy == "auto":
            problems["devices"] = ("devices",)  # the one-process launcher started 1, not 2
        elif strategy in ("single", "single_device", single_on_cpu):
            problems["devices"] = ("devices",)
    interval, every = options.get("val_check_interval"), options.get("check_val_every_n_epoch", 1)
    if isinstance(interval, int) and every is not None and options.get("limit_val_batches") != 0 and not invalid.keys() & {
        "val_check_interval", "check_val_every_n_epoch", "limit_val_batches", "limit_train_batches"
    }:
        limit = options.get("limit_train_batches")
        batches = 2 if limit is None else max(1, int(2 * limit)) if isinstance(limit, float) else min(2, limit)  # loader(8, 4)
        if interval > batches and limit != 0:  # limit_train_batches=0: no training, so no schedule to check
            problems["val_check_interval"] = ("val_check_interval",)  # more batches than an epoch has
    if options.get("check_val_every_n_epoch", 1) is None and isinstance(interval, float) and not invalid.keys() & {
        "val_check_interval", "check_val_every_n_epoch"
    }:
        problems["val_check_interval"] = ("val_check_interval",)  # Lightning's: a fraction needs epochs
    bar_given = isinstance(options.get("callbacks"), type(lambda: 0)) and "ProgressBar" in str(options["callbacks"].__code__.co_names)
    if bar_given and options.get("enable_progress_bar") is False and "callbacks" not in invalid and "enable_progress_bar" not in invalid:
        problems["enable_progress_bar"] = ("enable_progress_bar",)  # Lightning's: a bar given, and bars turned off
    saver_given = isinstance(options.get("callbacks"), type(lambda: 0)) and "ModelCheckpoint" in str(options["callbacks"].__code__.co_names)
    if saver_given and options.get("enable_checkpointing") is False and not invalid.keys() & {"callbacks", "enable_checkpointing"}:
        problems["enable_checkpointing"] = ("enable_checkpointing",)  # Lightning's: a ModelCheckpoint given, and checkpointing off
    return problems


def _is_ddp(strategy: Any) -> bool:
    return strategy in ("ddp", ddp_instance)


@contextlib.contextmanager
def _isolated_example(options: dict[str, Any], port: int) -> Iterator[None]:
    """Put back what a run may change globally; give DDP a one-process launcher's environment."""
    environ, deterministic = dict(os.environ), torch.are_deterministic_algorithms_enabled()
    strategy, devices = options.get("strategy", "auto"), options.get("devices", "auto")
    if _is_ddp(strategy) or strategy == "auto" and devices == 2:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. strategy='dp' without GPUs runs on one device, with a warning
            yield
    finally:
        os.environ.clear()
        os.environ.update(environ)
        torch.use_deterministic_algorithms(deterministic)


def _build(value: Any) -> Any:
    """Call the factories (lambdas and the named ones above); pass everything else as drawn."""
    factory = value in (single_on_cpu, ddp_instance) or getattr(value, "__name__", "") == "<lambda>"
    return value() if factory else value


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=trainer_options())
def test_fuzzed_options_train_cleanly_or_fail_with_our_sentence(drawn):
    options, invalid = drawn
    if options.get("max_epochs") is None and options.get("max_steps") is None:
        options["max_epochs"] = 1  # neither: Lightning's 1000 epochs (tests/trainer/test_lightning_arguments.py), too long here
    problems = _problems(options, invalid)
    port = _PORT.setdefault("port", free_port())
    with _isolated_example(options, port):
        try:
            kwargs = {k: _build(v) for k, v in options.items()}
            trainer = Trainer(**kwargs)
            trainer.fit(NeedsOptimizer(), loader(8, 4), loader(4, 4))
        except (ValueError, TypeError) as err:
            assert problems, f"valid options {options} raised {err!r}"
            words = [w for expected in problems.values() for w in expected]
            assert any(w in str(err) for w in words), f"{err!r} names none of {words}"
            return
    assert not problems, f"accepted {problems} without an error"
    if options.get("limit_train_batches") == 0:
        assert trainer.global_step == 0  # nothing to train, as in Lightning
    else:
        assert 0 < trainer.global_step <= 6

