"""The API reference keeps up with the code: every Trainer argument has its line and its longer
text, every ``self.log`` keyword its row, and the Trainer's signature reads as it is called."""

from __future__ import annotations

import inspect
import os
import re

import pytest

from trainer import Trainer
from trainer.core.metrics import log_metric

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _page(path: str) -> str:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def _trainer_arguments() -> list[str]:
    params = inspect.signature(Trainer.__init__).parameters.values()
    return [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]


def test_every_trainer_argument_has_a_line_in_the_reference_and_a_row_in_trainer_arguments():
    reference, longer = _page("docs/reference/trainer.md"), _page("docs/trainer-arguments.md")
    lines = dict(re.findall(r"^\| \[`(\w+)`\]\[trainer-(\w+)\] \|", reference, re.M))
    assert list(lines) == _trainer_arguments()  # each once, in the signature's order
    assert all(name == anchor for name, anchor in lines.items())
    assert [n for n in _trainer_arguments() if f"[](){{#trainer-{n}}}" not in longer] == []


def test_ckpt_path_is_explained_for_every_value_and_linked_from_each_entry_point():
    reference = _page("docs/reference/trainer.md")
    section = reference[reference.index("{#ckpt-path}"):reference.index(":::")]
    assert [row.split("|")[1].strip() for row in section.splitlines() if row.startswith("| ")][1:] == [
        "`None` (the default)", '`"last"`', '`"best"`', "a path",
    ]
    for stage in ("fit", "validate"):
        assert "[ckpt_path][ckpt-path]" in getattr(Trainer, stage).__doc__
    assert "ckpt_path" in Trainer.test.__doc__ and "ckpt_path" in Trainer.predict.__doc__


def test_every_keyword_of_self_log_has_a_row_with_its_default():
    reference = _page("docs/reference/module.md")
    section = reference[reference.index("{#self-log}"):reference.index("{#self-log-hooks}")]
    rows = {m[0]: m[1] for m in re.findall(r"^\| `(\w+)` \|([^|]*)\|", section, re.M)}
    params = inspect.signature(log_metric).parameters
    assert list(rows) == list(params)
    for name, param in params.items():
        if param.default is not inspect.Parameter.empty and name not in ("on_step", "on_epoch"):
            assert rows[name].strip() == f"`{param.default!r}`".replace("'", '"'), name
    shown = re.search(r"```text\nself\.log\((.*?)\)\n", section, re.S)[1]
    assert re.sub(r"\s+", " ", shown) == ", ".join(
        n if p.default is inspect.Parameter.empty else f"{n}={p.default!r}".replace("'", '"') for n, p in params.items()
    )


def test_the_rendered_signature_shows_log_dirs_folder_and_not_the_catch_all():
    griffe = pytest.importorskip("griffe", reason="the docs extra: pip install -e '.[docs]'")
    extension = griffe.load_extensions(os.path.join(ROOT, "docs", "_signatures.py") + ":SignatureAsCalled")
    module = griffe.load("trainer.trainer", search_paths=[ROOT], extensions=extension)
    params = module["Trainer.__init__"].parameters
    assert "unknown" not in params
    folder = inspect.signature(Trainer.__init__).parameters["log_dir"].default  # a marker str, or a plain one
    assert str(params["log_dir"].default).strip("'\"") == str(folder)  # the folder, not the marker's name
    assert [p.name for p in params][1:] == _trainer_arguments()  # after self: every option, nothing else
