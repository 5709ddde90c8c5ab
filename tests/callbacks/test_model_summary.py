"""ModelSummary: max_depth, and input/output shapes from example_input_array."""

from __future__ import annotations

import pytest
import torch

from callbacks import ModelSummary
from tests._models import Classifier, loader, quiet
from trainer import Trainer


def _summary(trainer_log, model, depth):
    Trainer(max_steps=1, **quiet(enable_model_summary=True, callbacks=[ModelSummary(max_depth=depth)])).fit(model, loader(32))
    return [line for line in trainer_log if line.startswith(type(model).__name__ + ":")][-1].splitlines()


def test_max_depth_chooses_the_rows_and_example_input_array_adds_shapes(trainer_log):
    model = Classifier()
    rows = [line.split("|")[1].strip() for line in _summary(trainer_log, model, 1)[1:] if "|" in line][1:]
    assert rows == ["net"]
    model.example_input_array = torch.zeros(4, 8)
    table = _summary(trainer_log, model, -1)
    assert "In sizes" in table[1] and "Out sizes" in table[1]
    cells = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[5:]] for line in table[3:] if "|" in line}
    assert cells["net"] == ["[4, 8]", "[4, 2]"] and cells["net.0"] == ["[4, 8]", "[4, 16]"] and "net.3" in cells
    assert not any("|" in line for line in _summary(trainer_log, Classifier(), 0))  # the totals only


def test_max_depth_below_minus_one_is_refused():
    with pytest.raises(ValueError, match=r"ModelSummary\(max_depth\)=-2"):
        ModelSummary(max_depth=-2)
