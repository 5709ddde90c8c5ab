"""Every test here runs a benchmark script in a fresh Python (some with two processes): slow."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    here = config.rootpath / "tests" / "benchmarks"
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.slow)
