"""A sharded checkpoint folder (``FSDPStrategy(checkpoint="sharded")``) runs no code when it is
read: its ``.metadata``, which torch.distributed.checkpoint unpickles with plain pickle, goes
through an unpickler that builds only the metadata's own classes, and its non-tensor entries are
loaded with ``weights_only=True``. The folders here are real ones, written by two FSDP processes."""

from __future__ import annotations

import os
import pickle
import shutil
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch import nn

from strategies import FSDPStrategy
from tests._models import Classifier, loader
from tests.conftest import ranks_forked_from_the_server
from trainer import CheckpointError, Trainer
from trainer.checkpoint.files import SHARDED_META


class RunsCode:
    """Unpickling this runs a shell command."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _model() -> Classifier:
    return Classifier(optimizer="adam", lr=0.01)


pytestmark = pytest.mark.slow  # the folder comes from a fit on two processes


@pytest.fixture(scope="module")
def sharded_folder(tmp_path_factory) -> Path:
    """One epoch under fsdp on 2 processes, saved as a sharded folder (written once per module)."""
    root = tmp_path_factory.mktemp("sharded")
    t = Trainer(
        strategy=FSDPStrategy(checkpoint="sharded", shard=[nn.Linear]), devices=2, max_epochs=1,
        log_dir=root, enable_progress_bar=False, enable_model_summary=False,
    )
    with ranks_forked_from_the_server():  # see tests/conftest.py
        t.fit(_model(), loader(n=32, batch_size=8))
    return Path(t.checkpoint_callback.best_model_path).resolve()  # the epoch's folder


def _resume(folder: Path) -> None:
    Trainer(
        strategy=FSDPStrategy(checkpoint="sharded", shard=[nn.Linear]), devices=1, max_epochs=2, log_dir=None,
        enable_progress_bar=False, enable_model_summary=False,
    ).fit(_model(), loader(n=32, batch_size=8), ckpt_path=str(folder))


def test_a_metadata_file_carrying_code_is_refused_on_every_path_and_the_code_never_runs(sharded_folder, tmp_path):
    evil = tmp_path / "evil.ckpt"
    shutil.copytree(sharded_folder, evil)
    with open(evil / ".metadata", "rb") as f:
        metadata = pickle.load(f)  # our own file, written above
    metadata.storage_meta.modules = [RunsCode(str(tmp_path / "pwned"))]  # real metadata, one object more
    with open(evil / ".metadata", "wb") as f:
        pickle.dump(metadata, f)

    refusal = rf"Refusing to load '{evil}/.metadata': it holds a pickled posix.system, which is not one of the classes"
    with pytest.raises(CheckpointError, match=refusal):
        Classifier.load_from_checkpoint(evil)
    with pytest.raises(Exception, match=refusal):  # in the fsdp worker, before any shard is read
        _resume(evil)
    assert not (tmp_path / "pwned").exists()

    with open(evil / ".metadata", "rb") as f:  # the file is real: what torch's own reader does runs it
        pickle.load(f)
    assert (tmp_path / "pwned").exists()


def test_an_entry_carrying_code_is_refused_and_the_code_never_runs(sharded_folder, tmp_path):
    # The same checkpoint written again with one of its plain entries (an optimizer's lr)
    # replaced by an object: torch.distributed.checkpoint stores it pickled, and its own planner
    # reads it back with torch.load(weights_only=False).
    entries = _read_whole(sharded_folder)
    entries["optimizer_states.0.param_groups.0.lr"] = RunsCode(str(tmp_path / "pwned"))
    evil = tmp_path / "evil.ckpt"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.save(entries, checkpoint_id=str(evil), no_dist=True)
    shutil.copy(sharded_folder / SHARDED_META, evil / SHARDED_META)

    with pytest.raises(Exception, match=r"Refusing to load the sharded checkpoint .*evil.ckpt.*its entry "
                                        r"'optimizer_states.0.param_groups.0.lr' holds pickled objects"):
        _resume(evil)
    assert not (tmp_path / "pwned").exists()


def test_an_intact_folder_still_loads_whole_into_one_process(sharded_folder):
    model = Classifier.load_from_checkpoint(sharded_folder)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert not torch.equal(model.net[0].weight, Classifier().net[0].weight)  # the trained weights, not a fresh init


def _read_whole(folder: Path) -> dict:
    """Every entry of the folder by its flat key, read with torch's own tools (our own, trusted file)."""
    with open(folder / ".metadata", "rb") as f:
        metadata = pickle.load(f)
    entries = {
        key: torch.empty(m.size, dtype=m.properties.dtype) if isinstance(m, TensorStorageMetadata) else None
        for key, m in metadata.state_dict_metadata.items()
    }
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(entries, checkpoint_id=str(folder), no_dist=True)
    return entries
