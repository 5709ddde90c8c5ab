"""Each way of importing Lightning, rewritten: only the imports change where the file's names can stay, a name
reached through a module becomes ours in place, and a file without Lightning comes back byte for byte."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trainer.migrate.python_files import migrate_python

CASES = {
    "an alias of the package": (
        "import lightning as L\n\n\nclass M(L.LightningModule):\n    pass\n\n\nt = L.Trainer(max_steps=1)\n",
        "import trainer as L\n\n\nclass M(L.TrainModule):\n    pass\n\n\nt = L.Trainer(max_steps=1)\n",
    ),
    "pytorch_lightning as pl": (
        "import pytorch_lightning as pl\n\ndm = pl.LightningDataModule()\ncb = pl.callbacks.EarlyStopping('x')\n",
        "import trainer as pl\nfrom callbacks import EarlyStopping\n\ndm = pl.DataModule()\ncb = EarlyStopping('x')\n",
    ),
    "a chain through the alias adds the import it needs": (
        "import lightning as L\n\ncb = L.pytorch.callbacks.ModelCheckpoint(monitor='v')\n",
        "import trainer as L\nfrom callbacks import ModelCheckpoint\n\ncb = ModelCheckpoint(monitor='v')\n",
    ),
    "from-import with aliases keeps the file's names": (
        "from lightning.pytorch import LightningModule as LM, Trainer\n",
        "from trainer import TrainModule as LM, Trainer\n",
    ),
    "a renamed class keeps its Lightning name in the file": (
        "from lightning import LightningModule\n\n\nclass M(LightningModule):\n    pass\n",
        "from trainer import TrainModule as LightningModule\n\n\nclass M(LightningModule):\n    pass\n",
    ),
    "a submodule path": (
        "from lightning.pytorch.loggers.tensorboard import TensorBoardLogger\n"
        "from pytorch_lightning.callbacks.early_stopping import EarlyStopping\n",
        "from loggers import TensorBoardLogger\nfrom callbacks import EarlyStopping\n",
    ),
    "names from one module that go to several of ours": (
        "from lightning.pytorch import Trainer, Callback, loggers as pl_loggers\n\nlog = pl_loggers.CSVLogger('x')\n",
        "from trainer import Trainer\nfrom callbacks import Callback\nimport loggers as pl_loggers\n\nlog = pl_loggers.CSVLogger('x')\n",
    ),
    "a parenthesised import keeps its comments": (
        "from lightning.pytorch.callbacks import (\n    ModelCheckpoint,  # the best\n    EarlyStopping,\n)\n",
        "from callbacks import (\n    ModelCheckpoint,  # the best\n    EarlyStopping,\n)\n",
    ),
    "an import inside a function": (
        "def f():\n    import lightning.pytorch.callbacks as cbs\n    return cbs.lr_monitor.LearningRateMonitor()\n",
        "def f():\n    import callbacks as cbs\n    return cbs.LearningRateMonitor()\n",
    ),
    "a TYPE_CHECKING block and a string annotation": (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import lightning.pytorch as pl\n\n\n"
        "def f(m: 'pl.LightningModule') -> None:\n    pass\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import trainer as pl\n\n\n"
        "def f(m: 'pl.TrainModule') -> None:\n    pass\n",
    ),
    "import lightning.pytorch binds no name of ours": (
        "import os\nimport lightning.pytorch\n\ntrainer = lightning.pytorch.Trainer()\n",
        "import os\nfrom trainer import Trainer\n\ntrainer = Trainer()\n",
    ),
    "a name the file already uses gets another": (
        "import lightning as L\n\nModelCheckpoint = 3\ncb = L.pytorch.callbacks.ModelCheckpoint()\n",
        "import trainer as L\nfrom callbacks import ModelCheckpoint as ModelCheckpoint_\n\nModelCheckpoint = 3\ncb = ModelCheckpoint_()\n",
    ),
    "two names of ours alike get two names": (
        "import lightning.pytorch as pl\n\n\nclass S(pl.callbacks.ModelSummary):\n    pass\n\n\n"
        "s = pl.utilities.model_summary.ModelSummary\n",
        "import trainer as pl\nfrom trainer.core.summary import ModelSummary as ModelSummary_\nfrom callbacks import ModelSummary\n\n\n"
        "class S(ModelSummary):\n    pass\n\n\ns = ModelSummary_\n",
    ),
    "a star import": (
        "from lightning.pytorch.callbacks import *\n",
        "from callbacks import *\n",
    ),
    "a jsonargparse class_path in Python": (
        "defaults = {'callbacks': [{'class_path': \"lightning.pytorch.callbacks.EarlyStopping\"}], 'x': 'lightning.pytorch'}\n",
        "defaults = {'callbacks': [{'class_path': \"callbacks.EarlyStopping\"}], 'x': 'lightning.pytorch'}\n",
    ),
    "a TYPE_CHECKING block left empty": (
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import lightning\n",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    pass\n",
    ),
    "other modules in the same import statement": (
        "import os, lightning as L, sys\n",
        "import os, trainer as L, sys\n",
    ),
    "import lightning.pytorch.callbacks binds every prefix": (
        "import lightning.pytorch.callbacks\n\nx = lightning.pytorch.callbacks.EarlyStopping\ny = lightning.pytorch.Trainer\n",
        "from callbacks import EarlyStopping\nfrom trainer import Trainer\n\nx = EarlyStopping\ny = Trainer\n",
    ),
    "a module we have none for, imported by name": (
        "from lightning.pytorch import utilities\n\n\n@utilities.rank_zero_only\ndef f():\n    pass\n",
        "from trainer import rank_zero_only\n\n\n@rank_zero_only\ndef f():\n    pass\n",
    ),
    "two aliases in one string annotation": (
        "import lightning as L, pytorch_lightning as pl\n\n\ndef f(a: 'tuple[L.LightningModule, pl.LightningDataModule]'):\n    pass\n",
        "import trainer as L, trainer as pl\n\n\ndef f(a: 'tuple[L.TrainModule, pl.DataModule]'):\n    pass\n",
    ),
    "a class's attribute reached through the alias": (
        "import lightning as L\n\nm = L.LightningModule.load_from_checkpoint('x.ckpt')\nv = L.__version__\n",
        "import trainer as L\n\nm = L.TrainModule.load_from_checkpoint('x.ckpt')\nv = L.__version__\n",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_spelling_is_rewritten(case):
    before, after = CASES[case]
    assert migrate_python(before, "x.py") == (after, [])
    assert migrate_python(after, "x.py") == (after, [])  # the second run changes nothing


@pytest.mark.parametrize("source, line, name", [
    ("import os\nfrom lightning.fabric import Fabric\n", 2, "lightning.fabric.Fabric"),
    ("import lightning as L\n\n\nf = L.fabric.Fabric()\n", 4, "lightning.fabric.Fabric"),
    ("from lightning.pytorch.utilities.types import STEP_OUTPUT\n", 1, "lightning.pytorch.utilities.types.STEP_OUTPUT"),
    ("x = 1\ncfg = {'class_path': 'lightning.pytorch.strategies.DeepSpeedStrategy'}\n", 2,
     "lightning.pytorch.strategies.DeepSpeedStrategy"),
    ("from lightning.pytorch.demos import *\n", 1, "lightning.pytorch.demos.*"),
    ("from lightning.pytorch.utilities.model_helpers import is_overridden\n\nx = is_overridden\n", 3,
     "lightning.pytorch.utilities.model_helpers.is_overridden"),
])
def test_a_name_with_no_counterpart_leaves_the_file_as_it_is(source, line, name):
    source = "from lightning.pytorch import Trainer\n" + source  # a name that maps: it is not rewritten either
    new, problems = migrate_python(source, "train.py")
    assert new == source
    assert [str(p) for p in problems] == [f"no counterpart for {name} at train.py:{line + 1}"]


def test_a_use_of_a_module_that_no_name_of_ours_replaces_leaves_the_file():
    source = "import lightning\n\nx = lightning.Trainer\nz = getattr(lightning, 'Trainer')\n"
    new, problems = migrate_python(source, "x.py")
    assert new == source and [str(p) for p in problems] == ["cannot rewrite a use of the module lightning itself at x.py:4"]


def test_a_file_that_does_not_parse_is_reported():
    new, problems = migrate_python("import lightning as L\ndef (:\n", "bad.py")
    assert new == "import lightning as L\ndef (:\n"
    assert len(problems) == 1 and str(problems[0]).startswith("cannot parse the file") and problems[0].path == "bad.py"


# --- properties ------------------------------------------------------------------------------------------------
# Files built from the spellings above in any order and number, with the file's own code between them.
IMPORTS = [
    "import lightning as L", "import pytorch_lightning as pl", "import lightning.pytorch as lp",
    "from lightning.pytorch import LightningModule as LM, Trainer", "from lightning.pytorch import loggers as pl_loggers",
    "from lightning.pytorch.callbacks.early_stopping import EarlyStopping",
    "from lightning.pytorch.callbacks import (\n    ModelCheckpoint,  # keep\n    LearningRateMonitor as LRM,\n)",
    "import lightning.pytorch", "import os, lightning as L",
]
USES = [
    "m = L.LightningModule", "c = L.pytorch.callbacks.ModelCheckpoint", "d = pl.LightningDataModule",
    "s = pl.callbacks.early_stopping.EarlyStopping", "t = lp.Trainer", "u = lightning.pytorch.Trainer",
    "v = pl_loggers.CSVLogger", "w = {'class_path': 'lightning.pytorch.callbacks.Timer'}",
]
OTHER = ["x = 1  # lightning fast", "def f(a, b=2):\n    return a + b", "s = 'lightning'", "# a comment", "", "\n",
         "class Lightning:\n    rate = 0.1", "import json", "if True:\n    y = [1,\n         2]"]


@st.composite
def lightning_files(draw) -> str:
    imports = draw(st.lists(st.sampled_from(IMPORTS), min_size=1, max_size=5))
    bound = "\n".join(imports)
    uses = [u for u in USES if u.split("=")[1].strip().split(".")[0] in bound or "class_path" in u]
    body = draw(st.lists(st.sampled_from(uses + OTHER), max_size=8))
    return "\n".join(imports + body) + draw(st.sampled_from(["", "\n"]))


@settings(max_examples=60, deadline=None)
@given(lightning_files())
def test_migrating_twice_is_migrating_once(source):
    once, problems = migrate_python(source, "x.py")
    assert problems == []
    assert migrate_python(once, "x.py") == (once, [])
    compile(once, "x.py", "exec")
    assert "import lightning" not in once and "from lightning" not in once and "pytorch_lightning" not in once


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(OTHER + ["import torch", "z = torch.nn.Linear(2, 2)  # no Lightning"]), max_size=10),
       st.sampled_from(["\n", "\r\n"]), st.text(max_size=30))
def test_a_file_without_lightning_comes_back_byte_for_byte(lines, end, noise):
    source = "\n".join(lines).replace("\n", end) + end + "# " + noise.replace("\n", " ").replace("\r", " ") + end
    assert migrate_python(source, "x.py") == (source, [])
    broken = source + "def (:" + end  # a file that does not parse, and imports no Lightning: not ours to judge
    assert migrate_python(broken, "x.py") == (broken, [])


def test_a_file_that_names_lightning_only_in_comments_keeps_a_last_comment_ending_in_a_backslash():
    source = "x = 1  # lightning fast\n# \\\n"  # libcst's own round trip drops this file's last newline
    assert migrate_python(source, "x.py") == (source, [])
