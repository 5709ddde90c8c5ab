"""PossibleUserWarning: Lightning's warning class, raised where Lightning raises it, and silenced by its switch."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer import PossibleUserWarning, Trainer, TrainModule
from trainer.utilities import disable_possible_user_warnings


class _Tiny(TrainModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_logging_interval_longer_than_the_epoch_is_a_possible_user_warning():
    loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)
    trainer = Trainer(max_epochs=1, log_every_n_steps=50, enable_checkpointing=False, enable_progress_bar=False)
    with pytest.warns(PossibleUserWarning, match=r"The number of training batches \(2\) is smaller than the logging"):
        trainer.fit(_Tiny(), loader)


def test_disable_possible_user_warnings_silences_only_them():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        disable_possible_user_warnings()
        warnings.warn("maybe a mistake", PossibleUserWarning)
        warnings.warn("a real one", UserWarning)
    assert [str(w.message) for w in caught] == ["a real one"]


@pytest.mark.parametrize("setting", ["0", "off"])
def test_the_environment_switch_silences_them_at_import(setting):
    code = (
        "import warnings, trainer\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.warn('x', trainer.PossibleUserWarning)\n"
        "print(len(w))\n"
    )
    env = {**os.environ, "POSSIBLE_USER_WARNINGS": setting, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0"
