"""Every README code block marked ```python runnable runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCK = re.compile(r"```python runnable\n(.*?)```", re.S)


def _blocks() -> list[str]:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return BLOCK.findall(f.read())


def test_the_readme_has_runnable_blocks():
    assert _blocks(), "README.md should mark its examples as ```python runnable"


@pytest.mark.parametrize("index", range(len(_blocks())))
def test_readme_block_runs(index, tmp_path, script_env):
    script = tmp_path / f"readme_block_{index}.py"
    script.write_text(_blocks()[index])
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=script_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"README block {index} failed:\n{done.stdout}\n{done.stderr}"


# --- the other Python blocks: fragments that use the quick start's model and loaders -------------
FRAGMENT = re.compile(r"```python\n(.*?)```", re.S)
# What the fragments take for granted: a model with a validation metric, loaders (small), a
# `model`, and for the loading example the checkpoint file it names.
PRELUDE = '''
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import Trainer, TrainModule

{regressor}

class MyModel(Regressor):
    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y))


_x = torch.randn(64, 8)
train_loader = DataLoader(TensorDataset(_x, _x.sum(1, keepdim=True)), batch_size=16, shuffle=True)
val_loader = DataLoader(TensorDataset(_x[:32], _x[:32].sum(1, keepdim=True)), batch_size=16)
model = MyModel()
if __name__ == "__main__" and {needs_file!r} and not os.path.exists({needs_file!r}):
    _t = Trainer(max_steps=2, log_dir=None, enable_progress_bar=False, enable_checkpointing=False)
    _t.fit(MyModel(), train_loader)
    _t.save_checkpoint({needs_file!r})
'''


def _fragments() -> list[str]:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return FRAGMENT.findall(f.read())


def test_the_readme_has_fragments_to_check():
    assert len(_fragments()) >= 4


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(_fragments())))
def test_readme_fragment_runs_after_the_quick_starts_definitions(index, tmp_path, script_env):
    regressor = _blocks()[0].split('if __name__ == "__main__":')[0]  # imports and the Regressor class
    block = _fragments()[index]
    named = re.search(r'torch\.load\("([^"]+\.ckpt)"', block)
    prelude = PRELUDE.format(regressor=regressor, needs_file=named.group(1) if named else "")
    script = tmp_path / f"readme_fragment_{index}.py"
    script.write_text(prelude + "\n" + block)
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=script_env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"README fragment {index} failed:\n{block}\n{done.stdout}\n{done.stderr}"
