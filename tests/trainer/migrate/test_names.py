"""One table of names: the command reads trainer/migrate/names.py, and the docs' import table is that data."""

from __future__ import annotations

import importlib
import os
import re

import pytest

from trainer.migrate.names import MODULES, NAMES, render_table, resolve, resolve_module

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PAGE = "docs/migrating-from-lightning.md"
BLOCK = re.compile(r"<!-- names:[^\n]*-->\n(?P<table>.*?)<!-- end of names -->", re.DOTALL)

# Rows whose names other open branches add (their issues name the target): each is missing here until the
# lead merges that branch, and the test below says when one arrives, so that this list only shrinks.
AWAITING_MERGE: set[str] = set()


def _pairs(table: str) -> set[tuple[str, str]]:
    """(Lightning's name, ours) of each row. It reads the generated rows (`a.X` for X in `C`, `D` | `e.X`) and
    the hand-written forms other branches add, so that a row merged by hand is named: `a.X` (`C`, `D`) | `e.X`,
    `a.b.C`, `D` | `e.C`, ... (bare names share the module before them) and `a.C`, `a.D` | `e.C`, `e.D`."""
    pairs = set()
    for row in table.splitlines()[2:]:
        cells = row.strip().strip("|").split("|")
        if len(cells) != 2:
            continue
        left, right = ([t.removeprefix("import ") for t in re.findall(r"`([^`]+)`", c)] for c in cells)
        right = [r for r in right if "." in r or r in MODULES.values()]
        if not left or not right:
            continue
        if cells[0].lstrip().startswith("`import "):  # modules: `import lightning`, ... | `import trainer`
            pairs |= {(name, right[0]) for name in left}
            continue
        if left[0].endswith(".X") and right[0].endswith(".X"):
            pairs |= {(left[0][:-1] + n, right[0][:-1] + n) for n in left[1:]}
            continue
        names, module = [], ""
        for token in left:
            module = token.rpartition(".")[0] if "." in token else module
            names.append(token if "." in token else f"{module}.{token}")
        if len(right) == len(names):
            pairs |= set(zip(names, right))
        elif len({n.rpartition(".")[2] for n in names}) == 1:
            pairs |= {(n, right[0]) for n in names}
        else:
            pairs |= {(n, f"{right[0].rpartition('.')[0]}.{n.rpartition('.')[2]}") for n in names}
    return pairs


def _data_pairs() -> set[tuple[str, str]]:
    return set(NAMES.items()) | set(MODULES.items())


def test_the_docs_table_is_the_data():
    with open(os.path.join(ROOT, PAGE), encoding="utf-8") as f:
        match = BLOCK.search(f.read())
    assert match, f"{PAGE} should hold the generated table between <!-- names: ... --> and <!-- end of names -->"
    docs, data = _pairs(match["table"]), _data_pairs()
    assert _pairs(render_table()) == data  # the reading of a table finds every row of the data
    only_docs = "".join(f'\n    "{l}": "{o}",' for l, o in sorted(docs - data))
    only_data = "".join(f"\n    {l} -> {o}" for l, o in sorted(data - docs))
    assert match["table"] == render_table(), (
        f"{PAGE}'s import table and trainer/migrate/names.py differ.\n"
        f"Rows only in the docs (add each to NAMES, or MODULES for an `import` row):{only_docs or ' none'}\n"
        f"Rows only in names.py:{only_data or ' none'}\n"
        f"Then paste the output of `python -m trainer.migrate --names` between the markers in {PAGE}."
    )


def test_the_reading_of_the_docs_table_finds_a_row_added_by_hand():
    table = render_table() + (
        "| `lightning.pytorch.loggers.X` (`CometLogger`, `NeptuneLogger`) | `loggers.X` |\n"  # CometLogger: a known row
        "| `lightning.pytorch.utilities.suggested_max_num_workers`, `move_data_to_device` | `trainer.utilities.suggested_max_num_workers`, ... |\n"
        "| `lightning.pytorch.demos.Transformer` | `trainer.demos.Transformer` (a note) |\n"
    )
    assert _pairs(table) - _data_pairs() == {
        ("lightning.pytorch.loggers.NeptuneLogger", "loggers.NeptuneLogger"),
        ("lightning.pytorch.utilities.suggested_max_num_workers", "trainer.utilities.suggested_max_num_workers"),
        ("lightning.pytorch.utilities.move_data_to_device", "trainer.utilities.move_data_to_device"),
        ("lightning.pytorch.demos.Transformer", "trainer.demos.Transformer"),
    }


@pytest.mark.parametrize("name", sorted(NAMES) + sorted(MODULES))
def test_each_lightning_name_is_lightnings(name):
    """Lightning 2.6 has every name of the table where the row says (the compat extra installs it)."""
    if name in MODULES:
        importlib.import_module(name)
        return
    module, _, attribute = name.rpartition(".")
    assert hasattr(importlib.import_module(module), attribute), f"lightning has no {name}"


@pytest.mark.parametrize("ours", sorted(set(NAMES.values()) | set(MODULES.values())))
def test_each_name_of_ours_exists(ours):
    try:
        module = importlib.import_module(ours if ours in MODULES.values() else ours.rpartition(".")[0])
        found = module if ours in MODULES.values() else getattr(module, ours.rpartition(".")[2])
    except (ImportError, AttributeError):
        found = None
    if found is not None and not os.path.abspath(module.__file__).startswith(ROOT + os.sep):
        found = None  # another checkout's, through an editable install's finder: not this tree's
    if ours in AWAITING_MERGE:
        assert found is None, f"{ours} exists now: remove it from AWAITING_MERGE in {__file__}"
    else:
        assert found is not None, f"trainer/migrate/names.py maps a Lightning name to {ours}, which does not exist"


@pytest.mark.parametrize("spelling, ours", [
    ("lightning.pytorch.LightningModule", "trainer.TrainModule"),
    ("pytorch_lightning.LightningModule", "trainer.TrainModule"),
    ("lightning.pytorch.core.module.LightningModule", "trainer.TrainModule"),
    ("pytorch_lightning.callbacks.early_stopping.EarlyStopping", "callbacks.EarlyStopping"),
    ("lightning.pytorch.callbacks.model_summary.ModelSummary", "callbacks.ModelSummary"),
    ("lightning.pytorch.utilities.model_summary.model_summary.ModelSummary", "trainer.core.summary.ModelSummary"),
    ("lightning.pytorch.utilities.combined_loader.CombinedLoader", "trainer.data.CombinedLoader"),
    ("lightning.pytorch.trainer.trainer.Trainer", "trainer.Trainer"),
    ("lightning.fabric.Fabric", None),
    ("lightning.pytorch.callbacks.ModelCheckpoint.CHECKPOINT_NAME_LAST", None),  # a class is not a module
    ("lightning.pytorch.utilities.types.STEP_OUTPUT", None),
])
def test_every_spelling_of_a_name_resolves_to_its_row(spelling, ours):
    assert resolve(spelling) == ours


def test_modules():
    assert resolve_module("pytorch_lightning") == "trainer" and resolve_module("pytorch_lightning.loggers") == "loggers"
    assert resolve_module("lightning.fabric") is None
