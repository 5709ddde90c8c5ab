"""``AdvancedProfiler``: Python's cProfile per action, every function call inside it."""

from __future__ import annotations

import cProfile
import io
import os
import pstats
from collections import defaultdict
from pathlib import Path
from typing import Any

from trainer.profilers.base import Profiler


class AdvancedProfiler(Profiler):
    """One ``cProfile.Profile`` per action; the report is pstats' table of each, sorted by
    cumulative time, the first ``line_count_restriction`` lines (a count, or a fraction from 0.0
    to 1.0). ``dump_stats=True`` also writes each action's raw profile to
    ``<dirpath>/<stage>-<filename>-<action>.prof`` for ``snakeviz`` or ``pstats.Stats(path)``.

    Starting an action pauses the others, since Python allows one active profiler at a time
    (3.12 refuses a second): time spent in a nested action counts in that one only.
    """

    def __init__(
        self, dirpath: str | Path | None = None, filename: str | None = None, line_count_restriction: float = 1.0,
        dump_stats: bool = False,
    ) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        self.profiled_actions: dict[str, cProfile.Profile] = defaultdict(cProfile.Profile)
        self.line_count_restriction = line_count_restriction
        self.dump_stats = dump_stats

    def start(self, action_name: str) -> None:
        for profile in self.profiled_actions.values():
            profile.disable()
        self.profiled_actions[action_name].enable()

    def stop(self, action_name: str) -> None:
        profile = self.profiled_actions.get(action_name)
        if profile is None:
            raise ValueError(f"Attempting to stop recording an action ({action_name}) which was never started.")
        profile.disable()

    def summary(self) -> str:
        stats = {}
        for action, profile in self.profiled_actions.items():
            if self.dump_stats:
                self._dump(action, profile)
            text = io.StringIO()
            table = pstats.Stats(profile, stream=text).strip_dirs().sort_stats("cumulative")
            table.print_stats(self.line_count_restriction)
            stats[action] = text.getvalue()
        return self._stats_to_str(stats)

    def _dump(self, action: str, profile: cProfile.Profile) -> None:
        if not self.dirpath:
            raise ValueError(
                "AdvancedProfiler(dump_stats=True) writes each action's .prof file into dirpath, which is "
                f"{self.dirpath!r}: pass dirpath=..., or run it under a Trainer (its log_dir)."
            )
        os.makedirs(self.dirpath, exist_ok=True)
        profile.dump_stats(os.path.join(self.dirpath, self._prepare_filename(action_name=action, extension=".prof")))

    def teardown(self, stage: str | None) -> None:
        super().teardown(stage=stage)
        self.profiled_actions.clear()

    def __reduce__(self) -> tuple[Any, ...]:
        # a cProfile.Profile cannot be pickled or copied: the copy starts with no records
        state = {
            "dirpath": self.dirpath, "filename": self.filename, "line_count_restriction": self.line_count_restriction,
            "dump_stats": self.dump_stats,
        }
        return (self.__class__, (), state)
