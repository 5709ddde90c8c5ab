"""``PyTorchProfiler``: torch.profiler around a stage, the cost of each operator, traces for Chrome and TensorBoard."""

from __future__ import annotations

import inspect
import os
import warnings
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn
from torch.autograd.profiler import EventList, record_function
from torch.profiler import ProfilerAction, ProfilerActivity, tensorboard_trace_handler

from trainer.core.exceptions import MisconfigurationException
from trainer.profilers._schedule import ScheduleWrapper
from trainer.profilers.base import Profiler

_KINETO_AVAILABLE = torch.profiler.kineto_available()


class RegisterRecordFunction:
    """``with RegisterRecordFunction(model): model(x)`` labels each submodule's forward in the
    profile as ``[pl][module]<class path>: <name>`` (``torch.nn.modules.linear.Linear: layer.0``)."""

    def __init__(self, model: nn.Module) -> None:
        self._model = model
        self._records: dict[str, record_function] = {}
        self._handles: list[Any] = []

    def _start(self, _: nn.Module, inputs: Any, record_name: str) -> Any:
        record = record_function("[pl][module]" + record_name)
        record.__enter__()
        self._records[record_name] = record
        return inputs

    def _stop(self, _: nn.Module, __: Any, output: Any, record_name: str) -> Any:
        self._records.pop(record_name).__exit__(None, None, None)
        return output

    def __enter__(self) -> None:
        for name, module in self._model.named_modules():
            if name:  # the model itself is the step's record
                record_name = f"{type(module).__module__}.{type(module).__name__}: {name}"
                self._handles.append(module.register_forward_pre_hook(partial(self._start, record_name=record_name)))
                self._handles.append(module.register_forward_hook(partial(self._stop, record_name=record_name)))

    def __exit__(self, *exc: Any) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


class PyTorchProfiler(Profiler):
    """torch.profiler over each stage: every operator's CPU (and CUDA) time, by default over the
    steps that ``schedule`` picks (``wait=1, warmup=1, active=3``: the 3rd to 5th training,
    validation, test or predict step; with fewer than 5 steps, every step, with a warning).

    The report is torch's table (``row_limit`` rows sorted by ``sort_by_key``, formatted by
    ``table_kwargs``); ``export_to_chrome`` writes each step kind's trace as
    ``<dirpath>/<stage>-<filename>-<action>.<...>.pt.trace.json`` (open it in chrome://tracing,
    Perfetto or TensorBoard). Each action the Trainer profiles shows as ``[pl][profile]<action>``
    and, with ``record_module_names``, each submodule's forward as ``[pl][module]<class>: <name>``.
    Other keyword arguments go to ``torch.profiler.profile`` (``record_shapes``,
    ``profile_memory``, ``with_stack``, ``schedule``, ``on_trace_ready``, ...). ``emit_nvtx``
    marks NVTX ranges for nvprof or Nsight instead, on CUDA.
    """

    STEP_FUNCTIONS = {"training_step", "validation_step", "test_step", "predict_step"}
    AVAILABLE_SORT_KEYS = {
        "cpu_time", "cuda_time", "cpu_time_total", "cuda_time_total", "cpu_memory_usage", "cuda_memory_usage",
        "self_cpu_memory_usage", "self_cuda_memory_usage", "count",
    }

    def __init__(
        self, dirpath: str | Path | None = None, filename: str | None = None, group_by_input_shapes: bool = False,
        emit_nvtx: bool = False, export_to_chrome: bool = True, row_limit: int = 20, sort_by_key: str | None = None,
        record_module_names: bool = True, table_kwargs: dict[str, Any] | None = None, **profiler_kwargs: Any,
    ) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        self.profiler: Any = None
        self.function_events: EventList | None = None
        self._module: nn.Module | None = None
        self._register: RegisterRecordFunction | None = None
        self._parent_profiler: Any = None
        self._recording_map: dict[str, record_function] = {}
        self._schedule: ScheduleWrapper | None = None
        self._group_by_input_shapes = group_by_input_shapes and profiler_kwargs.get("record_shapes", False)
        self._emit_nvtx = emit_nvtx
        self._export_to_chrome = export_to_chrome
        self._row_limit = row_limit
        self._sort_by_key = sort_by_key or _default_sort_by_key(profiler_kwargs)
        self._record_module_names = record_module_names
        self._profiler_kwargs = profiler_kwargs
        self._table_kwargs = table_kwargs if table_kwargs is not None else {}
        self._has_on_trace_ready = "on_trace_ready" in profiler_kwargs
        if emit_nvtx and not torch.cuda.is_available():
            raise ValueError(
                "PyTorchProfiler(emit_nvtx=True) marks NVTX ranges for nvprof or Nsight Systems, which need a CUDA "
                "device, and this machine has none: leave emit_nvtx=False to profile on the CPU."
            )
        if _KINETO_AVAILABLE:
            self._init_kineto(profiler_kwargs)
        if self._sort_by_key not in self.AVAILABLE_SORT_KEYS:
            raise MisconfigurationException(
                f"Found sort_by_key: {self._sort_by_key}. Should be within {self.AVAILABLE_SORT_KEYS}. "
            )
        valid = set(inspect.signature(EventList.table).parameters) - {"self", "sort_by", "row_limit"}
        for key in self._table_kwargs:
            if key in {"sort_by", "row_limit"}:
                raise KeyError(
                    f"Found invalid table_kwargs key: {key}. This is already a positional argument of the Profiler."
                )
            if key not in valid:
                raise KeyError(f"Found invalid table_kwargs key: {key}. Should be within {valid}.")

    def _init_kineto(self, kwargs: dict[str, Any]) -> None:
        schedule = kwargs.get("schedule")
        if schedule is not None:
            if not callable(schedule):
                raise MisconfigurationException(f"Schedule should be a callable. Found: {schedule}")
            action = schedule(0)
            if not isinstance(action, ProfilerAction):
                raise MisconfigurationException(
                    f"Schedule should return a `torch.profiler.ProfilerAction`. Found: {action}"
                )
        schedule = schedule if "schedule" in kwargs else _default_schedule()  # schedule=None: record every step
        self._schedule = ScheduleWrapper(schedule) if schedule is not None else None
        kwargs["schedule"] = self._schedule
        kwargs["activities"] = kwargs.get("activities") or _default_activities()
        self._export_to_flame_graph = kwargs.get("export_to_flame_graph", False)
        self._metric = kwargs.get("metric", "self_cpu_time_total")
        kwargs["with_stack"] = kwargs.get("with_stack", False) or self._export_to_flame_graph

    def setup_module(self, module: Any) -> None:
        self._module = module

    # --- recording ---------------------------------------------------------------------
    def start(self, action_name: str) -> None:
        if self.profiler is None:
            if torch.autograd._profiler_enabled():  # another profiler left open (one that never described)
                torch.autograd._disable_profiler()
            if self._schedule is not None:
                self._schedule.setup(action_name)
            self._create_profilers()
            entered = self.profiler.__enter__()
            self.profiler = entered if entered is not None else self.profiler
            if self._parent_profiler is not None:
                self._parent_profiler.__enter__()
        if self._module is not None and self._register is None and self._record_module_names:
            self._register = RegisterRecordFunction(self._module)
            self._register.__enter__()
        if self.profiler is not None and action_name not in self._recording_map:
            recording = record_function("[pl][profile]" + action_name)
            recording.__enter__()
            self._recording_map[action_name] = recording

    def stop(self, action_name: str) -> None:
        recording = self._recording_map.pop(action_name, None)
        if recording is not None:
            recording.__exit__(None, None, None)
        if not _KINETO_AVAILABLE or self._emit_nvtx or self.profiler is None:
            return
        if any(action_name.endswith(step) for step in self.STEP_FUNCTIONS):
            self._step(action_name)

    def _step(self, action_name: str) -> None:
        """After a training/validation/test/predict step: the schedule moves on, and a trace ready is exported."""
        if self._schedule is not None:
            self._schedule.pre_step(action_name)
        if self._too_few_steps():
            warnings.warn(
                "The PyTorch Profiler default schedule will be overridden as there is not enough steps to properly "
                "record traces: it records every step of this stage.", UserWarning, stacklevel=2,
            )
            self._schedule = None
            self.profiler.schedule = torch.profiler.profiler._default_schedule_fn
        if not self._has_on_trace_ready:
            self.profiler.on_trace_ready = partial(self._on_trace_ready, action_name=action_name)
        if self._schedule is not None:
            self.profiler.step_num = self._schedule.num_step
        self.profiler.step()
        self.profiler.add_metadata("Framework", "trainer")

    def _on_trace_ready(self, profiler: Any, action_name: str) -> None:
        if self.dirpath is None:
            warnings.warn("The PyTorchProfiler failed to export trace as `dirpath` is None", UserWarning, stacklevel=2)
            return
        if self._export_to_chrome:
            tensorboard_trace_handler(str(self.dirpath), self._prepare_filename(action_name=action_name, extension=""))(
                profiler
            )
        if self._export_to_flame_graph:
            path = os.path.join(self.dirpath, self._prepare_filename(action_name=action_name, extension=".stack"))
            profiler.export_stacks(path, metric=self._metric)

    def _too_few_steps(self) -> bool:
        """The default schedule needs 5 steps of a kind (torch fails with fewer): is this stage shorter?"""
        schedule, module = self._schedule, self._module
        if schedule is None or schedule._schedule is not _default_schedule() or module is None:
            return False
        try:
            trainer = module.trainer
        except RuntimeError:  # a module not attached to a Trainer: nothing to count
            return False
        counts = {
            "training_step": [trainer.num_training_batches],
            "validation_step": list(trainer.num_val_batches or []) + list(trainer.num_sanity_val_batches or []),
            "test_step": list(trainer.num_test_batches or []), "predict_step": list(trainer.num_predict_batches or []),
        }
        kind = schedule._kind
        return kind is not None and sum(counts[kind]) < 5

    # --- the report ----------------------------------------------------------------------
    def summary(self) -> str:
        if not self._profiler_kwargs.get("enabled", True) or self._emit_nvtx:
            return ""
        self._delete_profilers()
        if not self.function_events:
            return ""
        if self._export_to_chrome and not _KINETO_AVAILABLE:
            name = f"{self.local_rank}_trace.json"
            self.function_events.export_chrome_trace(name if self.dirpath is None else os.path.join(self.dirpath, name))
        data = self.function_events.key_averages(group_by_input_shapes=self._group_by_input_shapes)
        table = data.table(sort_by=self._sort_by_key, row_limit=self._row_limit, **self._table_kwargs)
        return self._stats_to_str({"records": table})

    def _create_profilers(self) -> None:
        if self._emit_nvtx:
            self._parent_profiler = self._parent_profiler or torch.cuda.profiler.profile()
            self.profiler = self._create_profiler(torch.autograd.profiler.emit_nvtx)
        else:
            self._parent_profiler = None
            self.profiler = self._create_profiler(
                torch.profiler.profile if _KINETO_AVAILABLE else torch.autograd.profiler.profile
            )

    def _create_profiler(self, profiler: type) -> Any:
        accepted = inspect.signature(profiler.__init__).parameters
        return profiler(**{k: v for k, v in self._profiler_kwargs.items() if k in accepted})

    def _delete_profilers(self) -> None:
        if self.profiler is not None:
            self.profiler.__exit__(None, None, None)
            if not self._emit_nvtx:
                self.function_events = self.profiler.events() if _KINETO_AVAILABLE else self.profiler.function_events
            self.profiler = None
        if self._schedule is not None:
            self._schedule.reset()
        if self._parent_profiler is not None:
            self._parent_profiler.__exit__(None, None, None)
            self._parent_profiler = None
        if self._register is not None:
            self._register.__exit__(None, None, None)
            self._register = None

    def teardown(self, stage: str | None) -> None:
        self._delete_profilers()
        for action in list(self._recording_map):
            self.stop(action)
        self._recording_map = {}
        super().teardown(stage=stage)

    def __getstate__(self) -> dict[str, Any]:
        # the module and the running torch profiler stay in their process (a spawned worker's copy comes without them)
        state = self.__dict__.copy()
        state.update(profiler=None, _module=None, _register=None, _parent_profiler=None, _recording_map={})
        return state


@lru_cache(1)
def _default_schedule() -> Callable[[int], ProfilerAction] | None:
    # Few steps recorded: the profiling overhead stays small against the run's time.
    return torch.profiler.schedule(wait=1, warmup=1, active=3) if _KINETO_AVAILABLE else None


def _default_activities() -> list[ProfilerActivity]:
    if not _KINETO_AVAILABLE:
        return []
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])


def _default_sort_by_key(kwargs: dict[str, Any]) -> str:
    activities = kwargs.get("activities") or []
    cuda = ProfilerActivity.CUDA in activities or (not activities and torch.cuda.is_available())
    cuda = cuda or kwargs.get("use_cuda", False)
    return f"{'cuda' if cuda else 'cpu'}_time_total"
