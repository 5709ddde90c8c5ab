"""trainer/profilers/base.py: Profiler's file names, describe, profile(), and a user's own profiler."""

from __future__ import annotations

import copy
import time
from collections import defaultdict

import pytest

from trainer.profilers import PassThroughProfiler, Profiler, SimpleProfiler


class ActionCountProfiler(Profiler):
    """Lightning's "build your own profiler" example: each action's calls."""

    def __init__(self, dirpath=None, filename=None):
        super().__init__(dirpath=dirpath, filename=filename)
        self.counts = defaultdict(int)

    def start(self, action_name):
        pass

    def stop(self, action_name):
        self.counts[action_name] += 1

    def summary(self):
        return "\n".join(f"{name}: {n}" for name, n in sorted(self.counts.items()))


def test_a_profiler_must_say_how_it_starts_and_stops():
    class Half(Profiler):
        def start(self, action_name):
            pass

    with pytest.raises(TypeError, match="stop"):
        Half()


def test_profile_brackets_the_block_even_when_it_raises():
    profiler = ActionCountProfiler()
    with profiler.profile("load") as name:
        assert name == "load"
    with pytest.raises(KeyError), profiler.profile("load"):
        raise KeyError("boom")
    assert profiler.counts == {"load": 2}


@pytest.mark.parametrize(
    ("stage", "rank", "action", "extension", "expected"),
    [
        (None, None, None, ".txt", "perf.txt"),
        ("fit", None, None, ".txt", "fit-perf.txt"),
        ("fit", 1, None, ".txt", "fit-perf-1.txt"),
        ("test", 0, "val/loss:x", ".prof", "test-perf-0-val_loss_x.prof"),
    ],
)
def test_the_report_file_is_named_stage_filename_rank_action(tmp_path, stage, rank, action, extension, expected):
    profiler = ActionCountProfiler(dirpath=tmp_path, filename="perf")
    if stage is not None:
        profiler.setup(stage, local_rank=rank)
    assert profiler._prepare_filename(action_name=action, extension=extension) == expected


def test_describe_writes_the_summary_under_dirpath_and_appends(tmp_path):
    profiler = ActionCountProfiler(dirpath=tmp_path / "new", filename="perf")
    profiler.setup("fit", log_dir=str(tmp_path / "ignored"))  # dirpath given: the log_dir is not used
    with profiler.profile("a"):
        pass
    profiler.describe()
    profiler.describe()
    assert (tmp_path / "new" / "fit-perf.txt").read_text() == "a: 1a: 1"
    assert profiler._output_file is None  # closed: the profiler can be copied and pickled
    assert copy.deepcopy(profiler).counts == {"a": 1}


def test_without_a_dirpath_the_log_dir_is_used_and_without_a_filename_the_report_is_logged(tmp_path, trainer_log):
    profiler = ActionCountProfiler(filename="perf")
    profiler.setup("validate", log_dir=str(tmp_path))
    assert profiler.dirpath == str(tmp_path)
    with profiler.profile("b"):
        pass
    profiler.describe()
    assert (tmp_path / "validate-perf.txt").read_text() == "b: 1"

    logged = ActionCountProfiler()
    with logged.profile("c"):
        pass
    logged.describe()
    assert trainer_log[-1] == "c: 1"
    rank_one = ActionCountProfiler()
    rank_one.setup("fit", local_rank=1)
    with rank_one.profile("d"):
        pass
    rank_one.describe()  # only local rank 0 logs
    assert trainer_log[-1] == "c: 1"


def test_passthrough_records_nothing_and_reports_nothing(tmp_path):
    profiler = PassThroughProfiler(dirpath=tmp_path, filename="perf")
    with profiler.profile("a"):
        time.sleep(0)
    assert profiler.summary() == ""
    profiler.describe()
    assert (tmp_path / "perf.txt").read_text() == ""


def test_a_simple_profilers_stats_header_names_the_stage_and_rank():
    profiler = SimpleProfiler()
    profiler.setup("fit", local_rank=1)
    assert profiler._stats_to_str({"a": "x"}).splitlines() == ["FIT Profiler Report", "Profile stats for: a rank: 1", "x"]
