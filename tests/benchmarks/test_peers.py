"""benchmarks/peers.py runs every workload, the Trainer reaches the raw loop's weights, and a peer
that is not installed gets a line instead of a row."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks")
PEERS = {"lightning": "lightning", "accelerate": "accelerate", "ignite": "pytorch-ignite"}  # module: what pip installs
RAW = re.compile(r"^.*?\s+raw\s+(\d+\.\d+)\s+1\s+(\d+\.\d+)\s+1\s+-$")  # ms/step, whole-run ms
# side, ms/step, per-step ratio [interval], whole-run ms, whole-run ratio, weights
ROW = re.compile(r"^\s+(\S+(?: \S+)?)\s+(\d+\.\d+)\s+(\d+\.\d+) \[(\d+\.\d+), (\d+\.\d+)\]\s+(\d+\.\d+)\s+(\d+\.\d+)\s+(\S.*)$")


def test_quick_run_has_raw_and_trainer_rows_for_each_workload_and_identical_weights(repo_root, script_env):
    done = subprocess.run([sys.executable, "benchmarks/peers.py", "--quick"], cwd=repo_root, env=script_env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert re.match(r"\d{4}-\d\d-\d\d, \d+ cores, .*torch \d", lines[1]), lines[1]
    for label in ("tiny MLP (hidden 64, batch 32)", "medium MLP (hidden 512, batch 32)", "lstm (LSTM 10->20->5, batch 30"):
        at = next(i for i, line in enumerate(lines) if line.startswith(label))
        raw = RAW.match(lines[at][len(label):])
        assert raw and float(raw.group(1)) > 0 and float(raw.group(2)) > 0, lines[at]
        for offset, name in ((1, "floor"), (2, "trainer")):  # the step alone, then this Trainer
            row = ROW.match(lines[at + offset])
            assert row, lines[at + offset]
            side, ms, ratio, lo, hi, whole_ms, whole, weights = row.groups()
            assert side == name and weights == "identical"
            assert float(ms) > 0 and float(whole_ms) > 0 and float(lo) <= float(ratio) <= float(hi) and float(whole) > 0
    for module, dist in PEERS.items():
        skipped = f"{module} not installed, skipped (pip install {dist})"
        if importlib.util.find_spec(module) is None:
            assert skipped in lines
        else:  # installed here: it has a row on each workload instead
            assert skipped not in lines and sum(line.strip().startswith(module + " ") for line in lines) == 3


def test_a_peer_that_cannot_be_imported_is_skipped_with_the_pip_line(monkeypatch):
    monkeypatch.syspath_prepend(BENCHMARKS)
    import peers
    monkeypatch.setitem(sys.modules, "ignite", None)  # as if not installed, whatever this environment has
    found, missing = peers.installed_peers()
    assert "ignite" in missing and not any(side.startswith("ignite") for side in found)
    assert "ignite not installed, skipped (pip install pytorch-ignite)" in peers.skipped_lines(missing)
