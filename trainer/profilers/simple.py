"""``SimpleProfiler``: the wall time of each action, its calls and its share of the run."""

from __future__ import annotations

import math
import os
import time
from collections import defaultdict
from pathlib import Path

from trainer.profilers.base import Profiler


class SimpleProfiler(Profiler):
    """Records each action's durations (``recorded_durations[action]``, in seconds) and reports,
    per action, the mean, the number of calls, the total and the share of the time since the
    profiler was built (``extended=False``: the mean and the total only), largest first.

    ``start`` of an action already running, or ``stop`` of one never started, is a ``ValueError``:
    an action cannot nest inside itself. Different actions nest freely (a batch holds its hooks),
    so the shares may add up to more than 100 %.
    """

    def __init__(self, dirpath: str | Path | None = None, filename: str | None = None, extended: bool = True) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        self.current_actions: dict[str, float] = {}
        self.recorded_durations: dict[str, list[float]] = defaultdict(list)
        self.extended = extended
        self.start_time = time.perf_counter()

    def start(self, action_name: str) -> None:
        if action_name in self.current_actions:
            raise ValueError(f"Attempted to start {action_name} which has already started.")
        self.current_actions[action_name] = time.perf_counter()

    def stop(self, action_name: str) -> None:
        end = time.perf_counter()
        if action_name not in self.current_actions:
            raise ValueError(f"Attempting to stop recording an action ({action_name}) which was never started.")
        self.recorded_durations[action_name].append(end - self.current_actions.pop(action_name))

    def _make_report_extended(self) -> tuple[list[tuple[str, float, int, float, float]], int, float]:
        """(rows of (action, mean, calls, total, percent), all calls, the time since the profiler was built)."""
        elapsed = time.perf_counter() - self.start_time
        rows = []
        for action, durations in self.recorded_durations.items():
            total = math.fsum(durations)  # many tiny durations: an exact sum
            rows.append((action, total / len(durations), len(durations), total, 100.0 * total / elapsed))
        rows.sort(key=lambda row: row[4], reverse=True)
        return rows, sum(row[2] for row in rows), elapsed

    def _make_report(self) -> list[tuple[str, float, float]]:
        """Rows of (action, mean, total), the longest mean first."""
        rows = []
        for action, durations in self.recorded_durations.items():
            total = math.fsum(durations)
            rows.append((action, total / len(durations), total))
        rows.sort(key=lambda row: row[1], reverse=True)
        return rows

    def summary(self) -> str:
        """Lightning's table, cell for cell (tab-separated columns)."""
        sep = os.linesep
        text = (f"{self._stage.upper()} " if self._stage is not None else "") + f"Profiler Report{sep}"
        if not self.recorded_durations:
            return text + sep
        width = max(len(k) for k in self.recorded_durations)

        def row(*cells: str) -> str:
            return f"{sep}|  {cells[0]:<{width}s}\t|" + "".join(f"  {c:<15}\t|" for c in cells[1:])

        if self.extended:
            header = row("Action", "Mean duration (s)", "Num calls", "Total time (s)", "Percentage %")
            line = f"{sep}{'-' * len(header.expandtabs())}"
            rows, calls, elapsed = self._make_report_extended()
            text += line + header + line + row("Total", "-", f"{calls}", f"{elapsed:.5}", "100 %") + line
            for action, mean, n, total, percent in rows:
                text += row(action, f"{mean:.5}", f"{n}", f"{total:.5}", f"{percent:.5}")
        else:
            header = row("Action", "Mean duration (s)", "Total time (s)")
            line = f"{sep}{'-' * len(header.expandtabs())}"
            text += line + header + line
            for action, mean, total in self._make_report():
                text += row(action, f"{mean:.5}", f"{total:.5}")
        return text + line + sep
