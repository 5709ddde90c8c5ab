"""TrainModule.to_torchscript, as Lightning's: a ScriptModule that gives forward's outputs without our classes."""

from __future__ import annotations

import warnings

import pytest
import torch

from trainer import TrainModule, Trainer
from trainer.utilities.warnings import LightningDeprecationWarning

DEPRECATED = "has been deprecated in v2.7 and will be removed in v2.8"


class Net(TrainModule):
    def __init__(self, width: int = 8) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(width, 2)
        self.drop = torch.nn.Dropout(0.5)  # eval mode or not shows in the outputs
        self.example_input_array = torch.randn(4, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.layer(x))

    def training_step(self, batch, batch_idx):
        return self(batch[0]).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("method", ["script", "trace"])
def test_the_scripted_module_gives_forwards_outputs_in_eval_mode_and_the_module_keeps_its_mode(method, tmp_path):
    model = Net()
    x = torch.randn(3, 8)
    # Lightning's category, a DeprecationWarning: a filter on either name catches it
    with pytest.warns(LightningDeprecationWarning, match=DEPRECATED):
        scripted = model.to_torchscript(file_path=tmp_path / "net.pt", method=method)
    assert isinstance(scripted, torch.jit.ScriptModule) and not scripted.training
    assert model.training  # put back as it was
    expected = model.eval()(x)
    loaded = torch.jit.load(str(tmp_path / "net.pt"))
    assert torch.allclose(scripted(x), expected) and torch.allclose(loaded(x), expected)
    assert not callable(getattr(scripted, "training_step", None))


def test_a_fitted_module_scripts_and_its_trainer_is_not_compiled(tmp_path):
    model = Net()
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 8)), batch_size=4)
    Trainer(default_root_dir=tmp_path, max_epochs=1, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False).fit(model, data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = model.to_torchscript()
    x = torch.randn(2, 8)
    assert torch.allclose(scripted(x), model.eval()(x))


def test_trace_takes_example_inputs_or_the_example_input_array_else_says_which_to_give():
    model = Net()
    x = torch.randn(5, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        traced = model.to_torchscript(method="trace", example_inputs=x, check_inputs=[(torch.randn(2, 8),)])
        assert torch.allclose(traced(x), model.eval()(x))
        model.example_input_array = None
        with pytest.raises(ValueError, match="requires either `example_inputs` or `model.example_input_array`"):
            model.to_torchscript(method="trace")


def test_an_unknown_method_is_refused_with_the_valid_ones():
    model = Net()
    with pytest.warns(DeprecationWarning, match=DEPRECATED), pytest.raises(ValueError) as err:
        model.to_torchscript(method="temp")
    assert "only supports 'script' or 'trace', but value given was: 'temp'" in str(err.value)
    assert model.training


def test_the_warning_points_at_the_callers_line():
    with pytest.warns(DeprecationWarning, match=DEPRECATED) as record:
        Net().to_torchscript()
    assert record[0].filename == __file__
