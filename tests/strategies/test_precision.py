"""strategies/precision.py: a true precision ("64-true", "bf16-true") converts the model as Lightning's does."""

from __future__ import annotations

import pytest
import torch

from tests._models import Classifier, loader, quiet
from trainer import Trainer


class LateLayer(Classifier):
    def __init__(self) -> None:
        super().__init__()
        self.built_dtypes: list[torch.dtype] = []

    def configure_model(self) -> None:
        self.late = torch.nn.Linear(2, 2)
        self.built_dtypes.append(self.late.weight.dtype)


class ComplexBuffers(LateLayer):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("made_in_init", torch.complex(torch.rand(4), torch.rand(4)), persistent=False)

    def configure_model(self) -> None:
        super().configure_model()
        self.register_buffer("made_in_configure_model", torch.complex(torch.rand(4), torch.rand(4)), persistent=False)


def test_64_true_leaves_complex_buffers_whole_and_configure_model_builds_in_float64():
    model = ComplexBuffers()
    before = model.made_in_init.clone()
    Trainer(max_steps=1, precision="64-true", **quiet()).fit(model, loader(8, 4))
    assert model.made_in_init.dtype == torch.complex64 and torch.equal(model.made_in_init, before)  # imaginary part kept
    assert model.made_in_configure_model.dtype == torch.complex128  # made under float64 as the default
    assert model.built_dtypes == [torch.float64] and next(model.parameters()).dtype == torch.float64


@pytest.mark.parametrize(("precision", "dtype"), [("bf16-true", torch.bfloat16), ("16-true", torch.float16)])
def test_configure_model_builds_layers_in_a_true_precisions_dtype(precision, dtype):
    model = LateLayer()
    Trainer(precision=precision, **quiet()).validate(model, loader(8, 4))
    assert model.built_dtypes == [dtype] and model.late.weight.dtype == dtype
    assert torch.get_default_dtype() == torch.float32  # put back afterwards
