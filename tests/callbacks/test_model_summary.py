"""ModelSummary (the callback) and trainer.core.summary (Lightning's model summary utilities): the
table's rows, columns and totals, shapes and FLOPs from example_input_array, and max_depth."""

from __future__ import annotations

import io
import re
import warnings
from collections import OrderedDict

import pytest
import rich
import torch
from torch import nn

from callbacks import ModelSummary, RichModelSummary
from tests._models import Classifier, loader, quiet
from trainer import Trainer, TrainModule
from trainer.core.summary import (
    LEFTOVER_PARAMS_NAME, NOT_APPLICABLE, UNKNOWN_SIZE, ModelSummary as Summary, get_human_readable_count, summarize,
)


def _logged_table(trainer_log, model, depth):
    Trainer(max_steps=1, **quiet(enable_model_summary=True, callbacks=[ModelSummary(max_depth=depth)])).fit(model, loader(32))
    tables = [line for line in trainer_log if "Trainable params" in line]
    return tables[-1].strip("\n").splitlines() if tables else []


def test_the_callback_logs_lightnings_table_with_shapes_from_example_input_array(trainer_log):
    model = Classifier()
    table = _logged_table(trainer_log, model, 1)
    assert [c.strip() for c in table[0].split("|")] == ["", "Name", "Type", "Params", "Mode", "FLOPs"]
    assert [c.strip() for c in table[2].split("|")] == ["0", "net", "Sequential", "178", "train", "0"]
    assert table[4:] == [
        "178       Trainable params", "0         Non-trainable params", "178       Total params",
        "0.001     Total estimated model params size (MB)", "5         Modules in train mode",
        "0         Modules in eval mode", "0         Total Flops",
    ]
    model.example_input_array = torch.zeros(4, 8)
    table = _logged_table(trainer_log, model, -1)
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:]] for line in table[2:7]}
    assert rows["net"] == ["Sequential", "178", "train", "1.3 K", "[4, 8]", "[4, 2]"]
    assert rows["net.0"] == ["Linear", "144", "train", "1.0 K", "[4, 8]", "[4, 16]"] and "net.3" in rows
    assert table[-1] == "1.3 K     Total Flops"


def test_max_depth_zero_logs_nothing_and_below_minus_one_is_refused(trainer_log):
    assert _logged_table(trainer_log, Classifier(), 0) == []
    with pytest.raises(ValueError, match=r"ModelSummary\(max_depth\)=-2"):
        ModelSummary(max_depth=-2)
    with pytest.raises(ValueError, match="`max_depth` can be -1, 0 or > 0, got -2"):
        summarize(Classifier(), max_depth=-2)


class Nested(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.branch = nn.Sequential(nn.Linear(5, 5), nn.Sequential(nn.Linear(5, 3)))
        self.unused = nn.Conv2d(1, 1, 1)
        self.free = nn.Parameter(torch.ones(2, 2))  # belongs to no submodule
        self.example_input_array = torch.rand(2, 5)

    def forward(self, x):
        return self.branch(x)


@pytest.mark.parametrize("max_depth, names", [
    (0, []), (1, ["branch", "unused"]), (2, ["branch", "branch.0", "branch.1", "unused"]),
    (-1, ["branch", "branch.0", "branch.1", "branch.1.0", "unused"]),
])
def test_the_summary_object_has_lightnings_numbers(max_depth, names):
    model = Nested()
    model.branch[1].eval()
    summary = summarize(model, max_depth=max_depth)
    assert summary.layer_names == names
    assert summary.total_parameters == 30 + 18 + 2 + 4 and summary.trainable_parameters == 54
    assert summary.total_training_modes == {"train": 3, "eval": 2} and model.branch.training and not model.branch[1].training
    assert summary.model_size == pytest.approx(54 * 4 / 1e6)
    if max_depth == -1:
        assert summary.in_sizes == [[2, 5], [2, 5], [2, 5], [2, 5], UNKNOWN_SIZE]
        assert summary.out_sizes[1:3] == [[2, 5], [2, 3]] and summary.param_nums == [48, 30, 18, 18, 2]
        assert summary.training_modes == [True, True, False, False, True]
    if max_depth == 1:  # the rows' parameters fall short of the total: the rest is a row of its own
        data = OrderedDict(summary._get_summary_data())
        assert data["Name"][-1] == LEFTOVER_PARAMS_NAME and data["Params"][-1].strip() == "4"
        assert data["Type"][-1] == data["In sizes"][-1] == NOT_APPLICABLE
        assert all(isinstance(cell, str) for cells in data.values() for cell in cells)


def test_a_lazy_model_counts_zero_and_says_why():
    class Lazy(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.LazyLinear(3)

    summary = Summary(Lazy())
    with pytest.warns(UserWarning, match="The total number of parameters detected may be inaccurate"):
        assert summary.total_parameters == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert summary.trainable_parameters == 0


def test_a_mixed_precision_trainer_gets_a_warning_and_32_bits():
    model = Classifier()
    Trainer(max_steps=1, precision="bf16-mixed", **quiet(enable_model_summary=False)).fit(model, loader(32))
    with pytest.warns(UserWarning, match="Precision bf16-mixed is not supported by the model summary"):
        summary = summarize(model)
    assert summary.model_size == pytest.approx(178 * 4 / 1e6)


@pytest.mark.parametrize("number, text", [(0, "0  "), (123, "123  "), (1234, "1.2 K"), (2e6, "2.0 M"), (3e9, "3.0 B"), (4e14, "400 T"), (5e15, "5,000 T")])
def test_human_readable_counts_are_lightnings(number, text):
    assert get_human_readable_count(number) == text


@pytest.fixture
def rich_console():
    """rich's global console, recorded into a StringIO (RichModelSummary prints there, as Lightning's)."""
    rich.reconfigure(file=io.StringIO(), record=True, width=120, color_system="truecolor")
    yield rich.get_console()
    rich.reconfigure()


def test_rich_model_summary_draws_the_same_rows_and_totals_on_richs_console(rich_console, trainer_log):
    model = Classifier()
    model.example_input_array = torch.zeros(4, 8)
    Trainer(max_steps=1, **quiet(callbacks=[RichModelSummary(max_depth=-1, header_style="bold green")])).fit(model, loader(32))
    assert not any("Trainable params" in line for line in trainer_log)  # drawn, not logged
    text = rich_console.export_text(clear=False)
    rows = {cells[1]: cells[2:] for cells in ([c.strip() for c in re.split("[│┃]", line)[1:-1]] for line in text.splitlines())
            if len(cells) == 8}
    assert rows["Name"] == ["Type", "Params", "Mode", "FLOPs", "In sizes", "Out sizes"]
    assert rows["net"] == ["Sequential", "178", "train", "1.3 K", "[4, 8]", "[4, 2]"]
    assert rows["net.0"] == ["Linear", "144", "train", "1.0 K", "[4, 8]", "[4, 16]"]
    for total in ("Trainable params: 178", "Non-trainable params: 0", "Total params: 178",
                  "Total estimated model params size (MB): 0.001", "Modules in train mode: 5", "Total FLOPs: 1.3 K"):
        assert total in text
    styled = rich_console.export_text(styles=True)
    assert "\x1b[1;32mName" in styled  # header_style
    assert "\x1b[1mTrainable params\x1b[0m: 178" in styled


def test_rich_model_summary_shows_the_model_size_in_mb_and_max_depth_zero_draws_nothing(rich_console):
    RichModelSummary.summarize([(" ", ["0"]), ("Name", ["net"])], 10, 10, 5500.0, {"train": 1, "eval": 0}, total_flops=0)
    assert "Total estimated model params size (MB): 5,500.000" in rich_console.export_text()
    Trainer(max_steps=1, **quiet(callbacks=[RichModelSummary(max_depth=0)])).fit(Classifier(), loader(32))
    assert rich_console.export_text() == ""
