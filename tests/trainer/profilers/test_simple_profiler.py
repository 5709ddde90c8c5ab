"""trainer/profilers/simple.py: the durations, the errors and Lightning's table."""

from __future__ import annotations

import copy
import os
import time

import pytest

from trainer.profilers import SimpleProfiler


def test_durations_are_recorded_per_action():
    profiler = SimpleProfiler()
    for seconds in (0.02, 0.01):
        with profiler.profile("sleep"):
            time.sleep(seconds)
    with profiler.profile("nothing"):
        pass
    sleeps = profiler.recorded_durations["sleep"]
    assert len(sleeps) == 2 and sleeps[0] >= 0.02 and sleeps[1] >= 0.01
    assert len(profiler.recorded_durations["nothing"]) == 1 and profiler.recorded_durations["nothing"][0] < 0.01


def test_an_action_cannot_start_twice_or_stop_unstarted():
    profiler = SimpleProfiler()
    with pytest.raises(ValueError, match=r"Attempting to stop recording an action \(test\) which was never started"):
        profiler.stop("test")
    profiler.start("test")
    with pytest.raises(ValueError, match="Attempted to start test which has already started"):
        profiler.start("test")
    profiler.stop("test")
    assert len(profiler.recorded_durations["test"]) == 1


def _profiler_with(durations: dict[str, list[float]], elapsed: float, monkeypatch, extended: bool) -> SimpleProfiler:
    profiler = SimpleProfiler(extended=extended)
    profiler.recorded_durations.update(durations)
    monkeypatch.setattr(time, "perf_counter", lambda: 100.0)  # the report's clock: elapsed since start_time
    profiler.start_time = 100.0 - elapsed
    return profiler


def test_the_extended_table_is_lightnings(monkeypatch):
    profiler = _profiler_with({"short": [1.0], "long_action": [2.0, 2.0]}, 10.0, monkeypatch, extended=True)
    profiler.setup("fit")
    sep = os.linesep
    lines = profiler.summary().expandtabs().split(sep)
    assert lines[0] == "FIT Profiler Report"
    assert lines[3].startswith("|  Action     \t|".expandtabs()) and "Mean duration (s)" in lines[3] and "Percentage %" in lines[3]
    total, first, second = lines[5], lines[7], lines[8]
    assert [c.strip() for c in total.split("|")[1:-1]] == ["Total", "-", "3", "10.0", "100 %"]
    assert [c.strip() for c in first.split("|")[1:-1]] == ["long_action", "2.0", "2", "4.0", "40.0"]
    assert [c.strip() for c in second.split("|")[1:-1]] == ["short", "1.0", "1", "1.0", "10.0"]
    assert set(lines[2]) == {"-"} and len(lines[2]) == len(lines[3]) + len(sep)  # Lightning's rule: the header's length with its newline


def test_the_short_table_sorts_by_mean(monkeypatch):
    profiler = _profiler_with({"many": [0.5, 0.5, 0.5], "one": [1.0]}, 10.0, monkeypatch, extended=False)
    rows = [line for line in profiler.summary().expandtabs().split(os.linesep) if line.startswith("|")]
    assert [[c.strip() for c in row.split("|")[1:-1]] for row in rows] == [
        ["Action", "Mean duration (s)", "Total time (s)"], ["one", "1.0", "1.0"], ["many", "0.5", "1.5"],
    ]


def test_an_empty_profiler_reports_its_header_only_and_copies(tmp_path):
    profiler = SimpleProfiler(dirpath=tmp_path, filename="test")
    profiler.describe()
    assert (tmp_path / "test.txt").read_text() == f"Profiler Report{os.linesep}{os.linesep}"
    assert copy.deepcopy(profiler).filename == "test"
