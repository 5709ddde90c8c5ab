"""python -m trainer.migrate on whole projects: the migrated project trains here with no Lightning importable,
and gives what the same project renamed by hand gives; what cannot be mapped is reported and left as it is."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys

import pytest
import torch

from tests.trainer.migrate._projects import BY_HAND_NAMES, LIGHTNING_NAMES, project, write
from trainer.migrate import main

# Runs a script as `python script.py ...` would, with `import lightning` (and pytorch_lightning) failing:
# the venv has the real Lightning for other tests, and the migrated code must not need it.
NO_LIGHTNING = (
    "import runpy, sys\n"
    "sys.modules['lightning'] = sys.modules['pytorch_lightning'] = None\n"
    "sys.argv = sys.argv[1:]\n"
    "runpy.run_path(sys.argv[0], run_name='__main__')\n"
)


def _run(folder, *argv: str, env: dict[str, str]) -> None:
    env = {**env, "PYTHONPATH": f"{env['PYTHONPATH']}{os.pathsep}{folder}"}
    done = subprocess.run([sys.executable, "-c", NO_LIGHTNING, *argv], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def _lightning_imports(folder) -> list[str]:
    found = []
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{path.name}: {n}" for n in names if n.split(".")[0] in ("lightning", "pytorch_lightning")]
    return found


@pytest.mark.slow
def test_a_migrated_project_trains_without_lightning_as_the_project_renamed_by_hand(tmp_path, script_env, capsys):
    migrated, by_hand = tmp_path / "migrated", tmp_path / "by_hand"
    write(migrated, project(LIGHTNING_NAMES))
    write(by_hand, project(BY_HAND_NAMES))
    assert main(["--write", str(migrated)]) == 0
    assert _lightning_imports(migrated) == []
    assert "lightning" not in (migrated / "config.yaml").read_text()
    for folder in (migrated, by_hand):
        _run(folder, "train.py", env=script_env)
        _run(folder, "cli_main.py", "fit", "--config", "config.yaml", env=script_env)
    for weights in ("weights.pt", "cli_weights.pt"):
        ours, theirs = torch.load(migrated / weights), torch.load(by_hand / weights)
        assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours), weights
    out = json.loads((migrated / "out.json").read_text())
    assert out == json.loads((by_hand / "out.json").read_text())
    assert [e[:2] for e in out["events"]] == [[0, 8], [1, 16], [2, 24]]  # the Recorder callback saw every epoch
    for folder in ("ckpts", "cli_ckpts"):  # ModelCheckpoint from Python and from the YAML config
        assert sorted(os.listdir(migrated / folder)) == sorted(os.listdir(by_hand / folder)) != []
    assert (migrated / "cli_logs").is_dir()  # the config's CSVLogger


def test_a_second_run_changes_nothing_and_check_passes(tmp_path, capsys):
    write(tmp_path, project(LIGHTNING_NAMES))
    assert main(["--check", str(tmp_path)]) == 1  # it would change, and --check changes nothing
    assert "from lightning" in (tmp_path / "train.py").read_text()
    assert main(["--write", str(tmp_path)]) == 0
    once = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(["--check", str(tmp_path)]) == 0
    assert capsys.readouterr().out == ""
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == once


def test_the_diff_names_each_file_and_write_applies_it(tmp_path, capsys):
    (tmp_path / "train.py").write_text("import lightning as L\n\nmodel = L.LightningModule()\n")
    assert main([str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    path = str(tmp_path / "train.py").lstrip("/")
    assert out.splitlines() == [
        f"--- a/{path}", f"+++ b/{path}", "@@ -1,3 +1,3 @@",
        "-import lightning as L", "+import trainer as L", " ", "-model = L.LightningModule()", "+model = L.TrainModule()",
    ]
    assert (tmp_path / "train.py").read_text().startswith("import lightning")  # no --write: nothing written
    assert err.strip() == "1 file(s) to rewrite; 0 problem(s), 0 file(s) left as they are."
    assert main(["--write", str(tmp_path / "train.py")]) == 0
    assert (tmp_path / "train.py").read_text() == "import trainer as L\n\nmodel = L.TrainModule()\n"


def test_a_name_with_no_counterpart_is_reported_with_its_line_and_its_file_left_whole(tmp_path, capsys):
    source = "import lightning as L\nfrom lightning.pytorch.callbacks import EarlyStopping\n\n\nfabric = L.fabric.Fabric()\n"
    (tmp_path / "train.py").write_text(source)
    (tmp_path / "ok.py").write_text("from lightning.pytorch import Trainer\n")
    (tmp_path / "config.yaml").write_text("strategy:\n  class_path: lightning.pytorch.strategies.DeepSpeedStrategy\n")
    assert main(["--write", str(tmp_path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"no counterpart for lightning.pytorch.strategies.DeepSpeedStrategy at {tmp_path / 'config.yaml'}:2",
        f"no counterpart for lightning.fabric.Fabric at {tmp_path / 'train.py'}:5",
        "1 file(s) rewritten; 2 problem(s), 2 file(s) left as they are.",
    ]
    assert (tmp_path / "train.py").read_text() == source  # EarlyStopping's line is not rewritten either
    assert (tmp_path / "ok.py").read_text() == "from trainer import Trainer\n"


def test_without_libcst_the_command_says_how_to_install_it(tmp_path, script_env):
    (tmp_path / "train.py").write_text("import lightning\n")
    code = "import sys\nsys.modules['libcst'] = None\nfrom trainer.migrate import main\nraise SystemExit(main(sys.argv[1:]))\n"
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=script_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "python -m trainer.migrate needs 'libcst', which is not installed: "
        'pip install "steadytrainer[migrate]" (or pip install ".[migrate]" in a checkout).'
    )


def test_bad_paths_and_the_names_table(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere")]) == 2
    assert capsys.readouterr().err.strip() == f"No such file or folder: {str(tmp_path / 'nowhere')!r}."
    assert main(["--names"]) == 0
    row = "| `lightning.LightningModule`, `lightning.pytorch.LightningModule` | `trainer.TrainModule` |"
    assert row in capsys.readouterr().out.splitlines()


def test_hidden_folders_caches_and_virtual_environments_are_left_out(tmp_path, capsys):
    for folder in (".git", "__pycache__", "venv"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "x.py").write_text("import lightning\n")
    (tmp_path / "venv" / "pyvenv.cfg").write_text("home = /usr\n")
    (tmp_path / "notes.txt").write_text("import lightning\n")
    assert main(["--check", str(tmp_path)]) == 0
    assert capsys.readouterr().out == ""


def test_a_module_of_the_project_that_would_shadow_one_of_our_packages_is_reported(tmp_path, capsys):
    (tmp_path / "callbacks.py").write_text("from lightning.pytorch.callbacks import Callback\n\n\nclass Mine(Callback):\n    pass\n")
    (tmp_path / "train.py").write_text("from lightning.pytorch.callbacks import EarlyStopping\nfrom callbacks import Mine\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "loggers.py").write_text("import lightning\n")  # pkg.loggers: it shadows nothing
    assert main(["--write", str(tmp_path)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("this module would be imported instead of the package 'callbacks' that the migrated imports")
    assert err[0].endswith(f"rename it, e.g. to my_callbacks at {tmp_path / 'callbacks.py'}:1")
    assert err[1:] == ["3 file(s) rewritten; 1 problem(s), 0 file(s) left as they are."]
