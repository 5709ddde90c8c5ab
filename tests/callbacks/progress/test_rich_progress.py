"""RichProgressBar on a real rich console (recorded into a StringIO), and the Trainer's choice of
default bar and summary with and without rich, as Lightning 2.6.6 makes it."""

from __future__ import annotations

import io
import pickle
import re
import subprocess
import sys

import pytest
import rich
import torch
from torch.utils.data import DataLoader, IterableDataset

from callbacks import ModelSummary, ProgressBar, RichModelSummary, RichProgressBar, RichProgressBarTheme
from tests._models import Classifier, loader
from trainer import Trainer


@pytest.fixture(autouse=True)
def _default_console():
    yield
    rich.reconfigure()  # the bar reconfigures rich's global console (Lightning's console_kwargs): a fresh one after


def _fit(bar: RichProgressBar, model: Classifier | None = None, **options) -> Trainer:
    options = {
        "max_epochs": 2,
        "limit_val_batches": 2,
        "log_dir": None,
        "enable_checkpointing": False,
        "enable_model_summary": False,
        **options,
    }
    trainer = Trainer(callbacks=[bar], **options)
    trainer.fit(model or Classifier(), loader(64), loader(32))
    return trainer


def _console(**kwargs) -> dict:
    return {"file": io.StringIO(), "record": True, "width": 150, "color_system": "truecolor", **kwargs}


def test_the_recorded_console_shows_the_epoch_the_batches_and_the_metrics_in_the_themes_styles():
    theme = RichProgressBarTheme(
        description="underline", metrics="bold", metrics_format=".2e", progress_bar_finished="#00ff00"
    )
    bar = RichProgressBar(theme=theme, console_kwargs=_console())
    _fit(bar)
    console = rich.get_console()
    text = console.export_text(clear=False)
    (row,) = [line for line in text.splitlines() if line.startswith("Epoch")]  # leave=False: one bar, drawn at the end
    assert row.startswith("Epoch 1/1 ") and " 4/4 " in row and "it/s" in row
    assert re.search(r"train_loss: \d\.\d\de[-+]\d\d", row), row  # the metrics column, in metrics_format
    assert "Validation" not in text and "Sanity" not in text  # their bars are hidden when they end
    styled = console.export_text(styles=True)
    assert "\x1b[4mEpoch 1/1" in styled  # description: underline
    assert re.search(r"\x1b\[1mtrain_loss: ", styled)  # metrics: bold
    assert "\x1b[38;2;0;255;0m" in styled  # the finished bar's colour


def test_the_bars_count_each_stage_and_the_sanity_and_validation_bars_are_hidden():
    bar = RichProgressBar(console_kwargs=_console())
    trainer = _fit(bar, num_sanity_val_steps=1)
    tasks = [(t.description, t.completed, t.total, t.visible) for t in bar.progress.tasks]
    assert tasks == [
        ("Sanity Checking", 1, 1, False),
        ("Epoch 1/1 ", 4, 4, True),
        ("Validation", 2, 2, False),
        ("Validation", 2, 2, False),
    ]
    assert bar.train_progress_bar.completed == 4 and bar.val_progress_bar.total == 2
    trainer.test(Classifier(), loader(48), verbose=False)
    assert (bar.test_progress_bar.description, bar.test_progress_bar.completed) == ("Testing", 3)
    trainer.predict(Classifier(), loader(16))
    assert (bar.predict_progress_bar.description, bar.predict_progress_bar.completed) == ("Predicting", 1)


def test_leave_true_keeps_one_bar_per_epoch():
    # (read from the file: each epoch's new rich Progress reconfigures the console, which starts a new record)
    out = io.StringIO()
    kept = RichProgressBar(leave=True, console_kwargs=_console(file=out, color_system=None))
    _fit(kept, max_epochs=3)
    rows = [line.split()[:2] for line in out.getvalue().splitlines() if line.startswith("Epoch")]
    assert rows == [["Epoch", "0/2"], ["Epoch", "1/2"], ["Epoch", "2/2"]]
    out = io.StringIO()
    reused = RichProgressBar(console_kwargs=_console(file=out, color_system=None))
    _fit(reused, max_epochs=3)
    rows = [line.split()[:2] for line in out.getvalue().splitlines() if line.startswith("Epoch")]
    assert rows == [["Epoch", "2/2"]]


def test_refresh_rate_zero_draws_nothing_and_disable_too():
    off = RichProgressBar(refresh_rate=0, console_kwargs=_console())
    assert off.is_disabled and not off.is_enabled
    _fit(off)
    assert off.progress is None
    disabled = RichProgressBar(console_kwargs=_console())
    disabled.disable()
    _fit(disabled)
    assert disabled.progress is None and disabled.train_progress_bar_id is None
    with pytest.raises(TypeError, match="has no training bar yet"):
        disabled.train_progress_bar


class Endless(IterableDataset):
    def __iter__(self):
        for _ in range(5):
            yield torch.randn(8), torch.tensor(0)


def test_a_loader_of_unknown_length_shows_dashes_for_its_total():
    bar = RichProgressBar(console_kwargs=_console())
    trainer = Trainer(
        max_epochs=1, callbacks=[bar], log_dir=None, enable_checkpointing=False, enable_model_summary=False
    )
    trainer.fit(Classifier(), DataLoader(Endless(), batch_size=None))
    (row,) = [line for line in rich.get_console().export_text().splitlines() if line.startswith("Epoch")]
    assert " 5/-- " in row and bar.train_progress_bar.total is None


class Interrupted(Classifier):
    def training_step(self, batch, batch_idx):
        if batch_idx == 1:
            raise RuntimeError("boom")
        return super().training_step(batch, batch_idx)


def test_an_exception_in_fit_stops_the_live_display_and_the_bar_pickles():
    bar = RichProgressBar(console_kwargs=_console())
    pickle.dumps(bar)
    with pytest.raises(RuntimeError, match="boom"):
        _fit(bar, Interrupted())
    assert not bar.progress.live.is_started  # the terminal is given back
    restored = pickle.loads(pickle.dumps(bar))
    assert restored.progress is None and restored.theme == bar.theme


def test_get_metrics_gives_numbers_and_print_is_a_plain_print(capsys):
    bar = RichProgressBar(console_kwargs=_console())
    trainer = _fit(bar, max_epochs=1)
    metrics = bar.get_metrics(trainer, trainer.lightning_module)
    assert isinstance(metrics["train_loss"], float)
    bar.print("hello", "there", sep="-")
    assert capsys.readouterr().out == "hello-there\n"


def test_it_overrides_every_hook_the_tqdm_bar_draws_in():
    tqdm_hooks = {name for name in vars(ProgressBar) if name.startswith(("on_", "setup", "teardown"))}
    assert tqdm_hooks and all(getattr(RichProgressBar, name) is not getattr(ProgressBar, name) for name in tqdm_hooks)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        (dict(refresh_rate=-1), "RichProgressBar(refresh_rate)=-1 must be >= 0"),
        (dict(leave="yes"), "RichProgressBar(leave)='yes' must be True or False"),
        (dict(theme="dark"), "RichProgressBar(theme='dark') must be a RichProgressBarTheme"),
        (dict(console_kwargs=["file"]), "RichProgressBar(console_kwargs=['file']) must be a dict"),
    ],
)
def test_bad_arguments_are_refused_when_the_bar_is_built(kwargs, words):
    with pytest.raises((TypeError, ValueError)) as info:
        RichProgressBar(**kwargs)
    assert words in str(info.value)


def test_with_rich_installed_the_defaults_are_richs_as_in_lightning():
    trainer = Trainer(log_dir=None, enable_checkpointing=False)
    assert [type(cb) for cb in trainer.callbacks] == [RichProgressBar, RichModelSummary]
    assert isinstance(trainer.progress_bar_callback, ProgressBar)  # Lightning's isinstance(cb, ProgressBar) finds it
    given = Trainer(callbacks=[ProgressBar(), ModelSummary(max_depth=2)], log_dir=None, enable_checkpointing=False)
    assert [type(cb) for cb in given.callbacks] == [ProgressBar, ModelSummary]  # a bar or summary passed replaces it


HIDDEN = """
import sys
sys.modules["rich"] = None  # rich hidden, as where it is not installed
import callbacks
from trainer import Trainer
print([type(cb).__name__ for cb in Trainer(log_dir=None, enable_checkpointing=False).callbacks])
for make in (callbacks.RichProgressBar, callbacks.RichModelSummary):
    try:
        make()
    except ModuleNotFoundError as error:
        print(error)
"""


def test_without_rich_the_defaults_are_tqdms_and_the_rich_classes_say_how_to_install_it(script_env):
    done = subprocess.run([sys.executable, "-c", HIDDEN], env=script_env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    chosen, bar_error, summary_error = done.stdout.splitlines()
    assert chosen == "['ProgressBar', 'ModelSummary']"
    assert bar_error.startswith(
        "`RichProgressBar` requires `rich` >= 13.0. Install it by running `pip install -U rich`"
    )
    assert summary_error.startswith("`RichModelSummary` requires `rich` to be installed. Install it by running")


class StoppedByHand(Classifier):
    def on_train_start(self):
        raise KeyboardInterrupt


def test_ctrl_c_as_training_starts_stops_the_live_display():
    bar = RichProgressBar(console_kwargs=_console())
    trainer = Trainer(
        max_steps=2, callbacks=[bar], log_dir=None, enable_checkpointing=False, enable_model_summary=False
    )
    with pytest.raises((KeyboardInterrupt, SystemExit)):
        trainer.fit(StoppedByHand(), loader(32))
    assert bar.progress is not None and not bar.progress.live.is_started


# rich.style draws a style id from Python's global random when it is imported: a fit that first draws
# the bar after seeding, and its resume, which imports rich at another point, would draw other numbers.
IMPORT_UNDER_SEED = """
import random
from callbacks.progress.rich_progress import import_rich
random.seed(0)
{imports}
print(random.random())
"""


def test_importing_rich_for_the_bar_leaves_pythons_random_where_it_was(script_env):
    def draw(imports: str) -> str:
        code = IMPORT_UNDER_SEED.format(imports=imports)
        done = subprocess.run([sys.executable, "-c", code], env=script_env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    untouched = draw("")
    assert draw("import_rich(); import rich.progress, rich.table") == untouched
    assert draw("import rich.style") != untouched  # what rich does when imported plainly
