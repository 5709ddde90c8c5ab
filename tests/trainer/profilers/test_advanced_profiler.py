"""trainer/profilers/advanced.py: cProfile per action, pstats' report and .prof files."""

from __future__ import annotations

import copy
import os
import pickle
import pstats
import time

import pytest

from trainer.profilers import AdvancedProfiler


def _busy() -> int:
    return sum(range(10_000))


def test_each_action_gets_its_own_cprofile_and_the_report_is_pstats(tmp_path):
    profiler = AdvancedProfiler(dirpath=tmp_path, filename="perf")
    with profiler.profile("work"):
        _busy()
    with profiler.profile("sleep"):
        time.sleep(0.01)
    assert set(profiler.profiled_actions) == {"work", "sleep"}
    profiler.describe()
    report = (tmp_path / "perf.txt").read_text()
    assert report.startswith("Profiler Report")
    work = report[report.index("Profile stats for: work"):report.index("Profile stats for: sleep")]
    assert "_busy" in work and "cumulative" in work and "sleep" not in work.split("Ordered by")[1]
    assert profiler.profiled_actions == {}  # teardown clears the records


def test_line_count_restriction_limits_the_functions_listed():
    profiler = AdvancedProfiler(line_count_restriction=1)
    with profiler.profile("work"):
        _busy()
        time.sleep(0)
    assert "due to restriction <1>" in profiler.summary()


def test_nested_actions_do_not_fail():
    profiler = AdvancedProfiler()
    with profiler.profile("outer"), profiler.profile("inner"):
        _busy()
    assert set(profiler.profiled_actions) == {"outer", "inner"}


def test_dump_stats_writes_a_prof_file_per_action_that_pstats_reads(tmp_path):
    profiler = AdvancedProfiler(dirpath=tmp_path, dump_stats=True)
    profiler.setup("fit")
    with profiler.profile("val/loss"):
        _busy()
    profiler.describe()
    assert os.listdir(tmp_path) == ["fit-val_loss.prof"]
    stats = pstats.Stats(str(tmp_path / "fit-val_loss.prof"))
    assert any(func[2] == "_busy" for func in stats.stats)


def test_dump_stats_needs_a_folder():
    profiler = AdvancedProfiler(dump_stats=True)
    with profiler.profile("a"):
        pass
    with pytest.raises(ValueError, match=r"dump_stats=True\) writes each action's .prof file into dirpath, which is None"):
        profiler.summary()


def test_stop_of_an_unstarted_action_and_copies_without_records(tmp_path):
    profiler = AdvancedProfiler(dirpath=tmp_path, filename="p", line_count_restriction=0.5)
    with pytest.raises(ValueError, match="Attempting to stop recording"):
        profiler.stop("never")
    with profiler.profile("a"):
        pass
    for clone in (copy.deepcopy(profiler), pickle.loads(pickle.dumps(profiler))):
        assert clone.profiled_actions == {} and clone.filename == "p" and clone.line_count_restriction == 0.5
