"""``Trainer(profiler=...)``: which profiler a name (Lightning's), None or an instance stands for."""

from __future__ import annotations

from typing import Any

from trainer.core.checks import suggest
from trainer.core.exceptions import misconfigured
from trainer.profilers.base import PassThroughProfiler, Profiler

# Trainer(profiler="...")'s names, Lightning's
_PROFILERS = ("simple", "advanced", "pytorch", "xla")


def profiler_of(profiler: Any) -> Profiler:
    """``Trainer(profiler=...)``: None (a PassThroughProfiler, which records nothing), a name, or a Profiler."""
    if profiler is None:
        return PassThroughProfiler()
    if isinstance(profiler, Profiler):
        return profiler
    if not isinstance(profiler, str):
        raise TypeError(
            f"profiler={profiler!r} must be None, one of {', '.join(map(repr, _PROFILERS[:3]))}, or a "
            "trainer.profilers.Profiler instance, e.g. SimpleProfiler(dirpath='logs', filename='perf')."
        )
    name = profiler.lower()
    if name == "xla":
        raise misconfigured(
            "profiler='xla' profiles TPUs through torch_xla, which this trainer does not run on: use 'simple', "
            "'advanced' or 'pytorch' (PyTorchProfiler covers CPU and CUDA)."
        )
    if name not in _PROFILERS:
        raise misconfigured(
            f"Unknown profiler={profiler!r}. Valid: None, {', '.join(map(repr, _PROFILERS[:3]))}, or a Profiler "
            f"instance.{suggest(name, _PROFILERS[:3])}",
            "When passing string value for the `profiler` parameter of `Trainer`, it can only be one of "
            f"{list(_PROFILERS)}.",
        )
    from trainer.profilers import AdvancedProfiler, PyTorchProfiler, SimpleProfiler  # torch.profiler's, when asked for

    return {"simple": SimpleProfiler, "advanced": AdvancedProfiler, "pytorch": PyTorchProfiler}[name]()
