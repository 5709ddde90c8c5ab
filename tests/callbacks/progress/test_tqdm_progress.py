"""ProgressBar: sparse lines without a terminal, a tqdm bar with one, nothing when turned off.

That only global rank 0 draws is checked under DDP(2) in tests/callbacks/test_ddp.py.
"""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import time

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from callbacks import EarlyStopping, ProgressBar, Timer, TQDMProgressBar
from callbacks.progress.tqdm_progress import _duration
from tests._models import Classifier, loader
from trainer import Trainer


TOOK = r"(\d+ ms|\d+\.\d s)"  # an epoch's duration as the line shows it


def _lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("epoch ")]


class Slow(Classifier):
    def training_step(self, batch, batch_idx):
        time.sleep(0.05)
        return super().training_step(batch, batch_idx)


def test_without_a_terminal_it_prints_one_line_per_epoch_and_no_carriage_returns(capsys):
    trainer = Trainer(max_epochs=2, log_dir=None, enable_checkpointing=False, callbacks=[ProgressBar()])
    trainer.fit(Classifier(), loader(64), loader(32))
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = _lines(err)
    assert len(lines) == 2
    # The step, and the epoch means of the values logged with prog_bar=True, under their TensorBoard tag.
    assert re.fullmatch(rf"epoch 0 done in {TOOK} step=4 train_loss=\d\.\d+", lines[0])
    assert lines[1].startswith("epoch 1 done in ") and " step=8 " in lines[1]


def test_an_epoch_under_a_second_reports_milliseconds(capsys):
    trainer = Trainer(max_epochs=1, log_dir=None, enable_checkpointing=False, callbacks=[ProgressBar()])
    trainer.fit(Classifier(), loader(64))  # 4 batches of a tiny MLP: a few ms
    (line,) = _lines(capsys.readouterr().err)
    took = re.match(r"epoch 0 done in (\d+) ms ", line)
    assert took and 0 <= int(took[1]) < 1000, line


def test_durations_read_in_the_unit_that_fits():
    assert [_duration(s) for s in (0.0004, 0.042, 0.9994, 0.9996, 12.34, 59.94, 59.96, 245.4, 3725.0)] == [
        "0 ms", "42 ms", "999 ms", "1.0 s", "12.3 s", "59.9 s", "1 min 00 s", "4 min 05 s", "62 min 05 s",
    ]


def test_an_epoch_cut_short_by_max_steps_says_so_and_where(capsys):
    trainer = Trainer(max_steps=3, log_dir=None, enable_checkpointing=False, callbacks=[ProgressBar()])
    trainer.fit(Classifier(), loader(64))  # 4 batches per epoch
    (line,) = _lines(capsys.readouterr().err)
    # A cut epoch has no epoch means (its end comes in the run that resumes it): the last batch's value.
    assert re.fullmatch(rf"epoch 0 stopped at batch 3/4 \(max_steps=3\) after {TOOK} step=3 train_loss=\d\.\d+", line)


def test_max_steps_reached_with_the_epochs_last_batch_finishes_the_epoch_and_then_stops(capsys):
    trainer = Trainer(max_steps=4, max_epochs=5, log_dir=None, enable_checkpointing=False, callbacks=[ProgressBar()])
    trainer.fit(Classifier(), loader(64))
    (line,) = _lines(capsys.readouterr().err)
    assert re.match(rf"epoch 0 done in {TOOK}, then stopped \(max_steps=4\) step=4 ", line)


class ConstantValLoss(Classifier):
    def validation_step(self, batch, batch_idx):
        self.log("val_loss", 1.0)  # never improves after the first epoch


def test_a_stop_by_a_callback_gives_the_callbacks_reason(capsys):
    trainer = Trainer(max_epochs=5, log_dir=None, enable_checkpointing=False, callbacks=[EarlyStopping("val_loss", patience=0), ProgressBar()])
    trainer.fit(ConstantValLoss(), loader(64), loader(32))
    lines = _lines(capsys.readouterr().err)
    assert len(lines) == 2 and lines[0].startswith("epoch 0 done in ") and "stopped" not in lines[0]
    assert re.match(rf"epoch 1 done in {TOOK}, then stopped \(early_stopping\) step=8 ", lines[1])

    trainer = Trainer(max_epochs=1, log_dir=None, enable_checkpointing=False, callbacks=[Timer(0.001), ProgressBar()])
    trainer.fit(Slow(), loader(64))  # 50 ms per batch: the budget is spent in the first one
    (line,) = _lines(capsys.readouterr().err)
    assert re.match(rf"epoch 0 stopped at batch 1/4 \(timer\) after {TOOK} step=1 ", line)


def _seconds(shown: str) -> float:
    number, unit = shown.split()
    return float(number) / 1000 if unit == "ms" else float(number)


def test_in_a_log_the_first_line_comes_early_and_estimates_the_epoch_and_the_time_left(capsys, monkeypatch):
    monkeypatch.setattr("callbacks.progress.tqdm_progress._FIRST_LINE_S", 0.01)  # 5 s in real runs; here the first 50 ms batch passes it
    trainer = Trainer(max_epochs=2, log_dir=None, enable_checkpointing=False, callbacks=[ProgressBar()])  # its defaults: a line every 30 s
    trainer.fit(Slow(), loader(64))
    lines = _lines(capsys.readouterr().err)
    # One early line in the fit's first epoch; then only the epochs' ends.
    assert len(lines) == 3 and lines[1].startswith("epoch 0 done") and lines[2].startswith("epoch 1 done"), lines
    estimate = re.search(rf"about {TOOK} per epoch, {TOOK} left in this one\)$", lines[0])
    assert lines[0].startswith("epoch 0 batch 1/4 ") and estimate, lines[0]
    per_epoch, left = _seconds(estimate[1]), _seconds(estimate[2])
    assert per_epoch >= 4 * 0.05 and 0 < left <= per_epoch  # 4 batches of at least 50 ms, one of them done


def test_the_time_left_runs_to_max_steps_when_that_comes_first(capsys):
    trainer = Trainer(max_steps=2, log_dir=None, enable_checkpointing=False, callbacks=[ProgressBar(line_every_s=0.001)])
    trainer.fit(Slow(), loader(64))
    first = _lines(capsys.readouterr().err)[0]
    assert re.search(rf"about {TOOK} per epoch, {TOOK} left to max_steps=2\)$", first), first


class ShowsValAcc(Classifier):
    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self(x).argmax(-1) == y).float().mean(), prog_bar=True)


def test_in_a_log_a_batch_value_and_an_epoch_mean_have_the_labels_of_their_tensorboard_tags(capsys):
    trainer = Trainer(max_epochs=1, enable_checkpointing=False, callbacks=[ProgressBar(line_every_s=0.001)])
    trainer.fit(ShowsValAcc(), loader(64), loader(32))
    lines = _lines(capsys.readouterr().err)
    batch_line, epoch_line = lines[-2], lines[-1]
    assert re.search(r" train_loss=\d\.\d+ ", batch_line)  # the batch's own value
    labels = dict(item.split("=") for item in epoch_line.split() if "=" in item)
    assert set(labels) == {"step", "train_loss", "val_acc"} and labels["step"] == "4"
    # train_loss: the last step's (Lightning's bar; training_step's default has no epoch value) ...
    assert float(labels["train_loss"]) == pytest.approx(trainer.callback_metrics["train_loss"].item(), rel=1e-3)
    # ... and the epoch's validation mean, under its TensorBoard name.
    acc = EventAccumulator(trainer.run_dir)
    acc.Reload()
    assert float(labels["val_acc"]) == pytest.approx(acc.Scalars("val_acc")[-1].value, rel=1e-3)


def test_a_configured_bar_replaces_the_built_in_and_prints_at_its_own_pace(capsys):
    bar = ProgressBar(line_every_s=0.01)
    trainer = Trainer(max_epochs=1, log_dir=None, enable_checkpointing=False, callbacks=[bar])
    assert [cb for cb in trainer.callbacks if isinstance(cb, ProgressBar)] == [bar]
    trainer.fit(Slow(), loader(64))
    lines = _lines(capsys.readouterr().err)
    # Each 50 ms batch passes the 10 ms pace: one line per batch (once, not per bar), then the epoch's.
    assert [line.split(" step=")[0] for line in lines[:4]] == [f"epoch 0 batch {i}/4" for i in (1, 2, 3, 4)]
    assert re.fullmatch(
        rf"epoch 0 batch 1/4 step=1 loss=\d\.\d+ train_loss=\d\.\d+ \(\d+\.\d batches/s; about {TOOK} per epoch, {TOOK} left in this one\)",
        lines[0],
    )
    assert len(lines) == 5 and lines[4].startswith("epoch 0 done")


def test_after_a_mid_epoch_resume_the_rate_counts_only_the_batches_run_since(capsys):
    first = Trainer(max_steps=6, enable_progress_bar=False)  # stops after batch 6 of 8 and saves last.ckpt
    first.fit(Classifier(), loader(64, batch_size=8))
    resumed = Trainer(max_epochs=1, enable_checkpointing=False, callbacks=[ProgressBar(line_every_s=0.001)])
    resumed.fit(Slow(), loader(64, batch_size=8), ckpt_path="last")
    lines = _lines(capsys.readouterr().err)
    assert lines[0].startswith("epoch 0 batch 7/8 step=7 ")
    # Each batch sleeps 50 ms, so at most 20 batches/s; counting the 6 skipped ones would claim ~140.
    rate = float(re.search(r"\((\d+\.\d) batches/s;", lines[0]).group(1))
    assert 0 < rate <= 20.0


def test_enable_progress_bar_false_prints_nothing(capsys):
    trainer = Trainer(max_epochs=1, log_dir=None, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(Classifier(), loader(64), loader(32))
    assert not any(isinstance(cb, ProgressBar) for cb in trainer.callbacks)
    assert _lines(capsys.readouterr().err) == []


def test_bad_pace_values_are_refused():
    with pytest.raises(ValueError, match=r"ProgressBar\(refresh_s\)=0"):
        ProgressBar(refresh_s=0)
    with pytest.raises(TypeError, match=r"ProgressBar\(line_every_s\)='30'"):
        ProgressBar(line_every_s="30")


_TTY_SCRIPT = """
from callbacks import EarlyStopping, ProgressBar, Timer, TQDMProgressBar
from callbacks.progress.tqdm_progress import _duration
from tests._models import Classifier, loader
from trainer import Trainer

class Styled(TQDMProgressBar):  # Lightning's docs: a factory overridden to style one bar
    def init_validation_tqdm(self):
        bar = super().init_validation_tqdm()
        bar.set_description("running validation ...")
        return bar

    def init_train_tqdm(self):
        bar = super().init_train_tqdm()
        bar.colour = "green"
        return bar


if __name__ == "__main__":
    trainer = Trainer(max_epochs=1, log_dir=None, enable_checkpointing=False, callbacks=[Styled()])
    trainer.fit(Classifier(), loader(64), loader(32))
    trainer.test(Classifier(), loader(32), verbose=False)
    trainer = Trainer(max_epochs=2, log_dir=None, enable_checkpointing=False, callbacks=[ProgressBar(refresh_s=0.001)])
    trainer.fit(Classifier(), loader(64), loader(32))
    trainer = Trainer(max_steps=2, log_dir=None, enable_checkpointing=False, callbacks=[ProgressBar(refresh_s=0.001)])
    trainer.fit(Classifier(), loader(64))
"""


@pytest.mark.slow
def test_on_a_terminal_it_draws_a_tqdm_bar_per_epoch_with_step_loss_and_prog_bar_values(tmp_path, script_env):
    script = tmp_path / "bar.py"
    script.write_text(_TTY_SCRIPT)
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 200, 0, 0))  # 24 rows, 200 columns
    proc = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, env=script_env)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(leader)
    assert proc.wait(timeout=60) == 0
    out = b"".join(chunks).decode(errors="replace")
    assert "\r" in out  # redrawn in place, not line by line
    assert "Epoch 0: 100%" in out and "Epoch 1: 100%" in out and "4/4" in out
    assert re.search(r"step=4, .*train_loss=\d\.\d+", out)  # the epoch's final postfix: the last step's, as Lightning's
    assert re.search(r"loss=\d\.\d+", out)
    assert "Validation" in out
    # the second fit, max_steps=2 and no max_epochs: the bar counts to the steps left, as Lightning's
    assert "Epoch 0 (stopped: max_steps=2): 100%" in out and "2/2" in out
    assert not _lines(out)  # the no-terminal lines are not printed as well
    # Styled's factories: the validation bar's own description, the epoch bar in green (tqdm's colour), "Testing"
    assert "running validation ..." in out and "\x1b[32m" in out and "Testing: " in out


# --- TQDMProgressBar: Lightning's name and arguments ----------------------------------------
def test_tqdm_progress_bar_refresh_rate_bounds_the_redraws_and_zero_turns_it_off(capfd):
    from callbacks import TQDMProgressBar

    bar = TQDMProgressBar(refresh_rate=3, line_every_s=1e-9)  # every batch is due by time: the rate decides
    trainer = Trainer(max_epochs=1, log_dir=None, enable_checkpointing=False, enable_model_summary=False, callbacks=[bar])
    trainer.fit(Classifier(), loader(128))  # 8 batches
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("epoch 0 batch")]
    assert [line.split()[3] for line in lines] == ["3/8", "6/8"]
    assert [cb for cb in trainer.callbacks if isinstance(cb, ProgressBar)] == [bar] and bar.leave is False

    off = Trainer(max_epochs=1, log_dir=None, enable_checkpointing=False, enable_model_summary=False,
                  callbacks=[TQDMProgressBar(refresh_rate=0)])
    off.fit(Classifier(), loader(64))
    assert "epoch 0" not in capfd.readouterr().err
    with pytest.raises(ValueError, match=r"TQDMProgressBar\(refresh_rate\)=-1"):
        TQDMProgressBar(refresh_rate=-1)


# --- Lightning's ProgressBar API -------------------------------------------------------------------
class NoVersion(ProgressBar):
    """Lightning's documented customization: override get_metrics."""

    def get_metrics(self, trainer, pl_module):
        items = super().get_metrics(trainer, pl_module)
        items.pop("v_num", None)
        items["my_metric"] = 123
        return items


def test_get_metrics_is_the_version_and_the_prog_bar_values_and_an_override_changes_the_line(capsys, tmp_path):
    plain = ProgressBar(line_every_s=0.001)
    trainer = Trainer(max_epochs=1, log_dir=tmp_path, enable_checkpointing=False, callbacks=[plain])
    model = Classifier()
    trainer.fit(model, loader(64))
    metrics = plain.get_metrics(trainer, model)
    assert metrics == {"v_num": 0, "train_loss": pytest.approx(trainer.progress_bar_metrics["train_loss"])}
    assert " v_num=0 " in _lines(capsys.readouterr().err)[0]

    custom = NoVersion(line_every_s=0.001)
    Trainer(max_epochs=1, log_dir=tmp_path, enable_checkpointing=False, callbacks=[custom]).fit(Classifier(), loader(64))
    first = _lines(capsys.readouterr().err)[0]
    assert " my_metric=123 " in first and "v_num" not in first


class Counts(TQDMProgressBar):
    def __init__(self, **kw):
        super().__init__(**kw)
        self.totals = []

    def on_train_epoch_end(self, trainer, module):
        super().on_train_epoch_end(trainer, module)
        self.totals.append((self.train_progress_bar.total, self.total_val_batches))


@pytest.mark.parametrize("refresh_rate", [1, 0])
def test_the_bars_totals_as_lightning_code_reads_them(refresh_rate, capsys):
    bar = Counts(refresh_rate=refresh_rate)
    trainer = Trainer(max_epochs=3, check_val_every_n_epoch=2, limit_val_batches=1, log_dir=None,
                      enable_checkpointing=False, num_sanity_val_steps=0, callbacks=[bar])
    trainer.fit(Classifier(), loader(64), loader(32))
    assert bar.totals == [(4, 0), (4, 1), (4, 0)]  # 4 batches an epoch; validation in the second epoch only
    assert bar.val_progress_bar.total == 1
    trainer.test(Classifier(), loader(48), verbose=False)
    assert bar.test_progress_bar.total == 3 and bar.train_progress_bar.total == 4
    with pytest.raises(TypeError, match="_predict_progress_bar` reference has not been set yet"):
        bar.predict_progress_bar


def test_with_max_steps_and_no_epoch_limit_the_bar_counts_to_max_steps():
    bar = Counts()
    Trainer(max_steps=6, log_dir=None, enable_checkpointing=False, callbacks=[bar]).fit(Classifier(), loader(64))
    assert bar.train_progress_bar.total == 2  # the second epoch: 2 steps left of 6


class Prints(Classifier):
    def training_step(self, batch, batch_idx):
        self.print("from training_step", end="")
        return super().training_step(batch, batch_idx)


def test_module_print_goes_under_the_bar_while_it_is_enabled(monkeypatch, capsys):
    written = []
    monkeypatch.setattr("tqdm.tqdm.write", lambda s, **kw: written.append((s, kw)))
    bar = ProgressBar()
    trainer = Trainer(max_steps=1, log_dir=None, enable_checkpointing=False, callbacks=[bar])
    trainer.fit(Prints(), loader(64))
    assert written == [("from training_step", {"end": ""})]

    bar.disable()
    assert bar.is_disabled
    trainer = Trainer(max_steps=1, log_dir=None, enable_checkpointing=False, callbacks=[bar])
    trainer.fit(Prints(), loader(64))
    assert len(written) == 1 and "from training_step" in capsys.readouterr().out


def test_tqdm_miniters_in_the_environment_is_a_lower_bound_on_the_refresh_rate(monkeypatch):
    monkeypatch.setenv("TQDM_MINITERS", "2")
    assert TQDMProgressBar(refresh_rate=1).refresh_rate == 2
    assert TQDMProgressBar(refresh_rate=5).refresh_rate == 5
    assert not TQDMProgressBar(refresh_rate=0).is_disabled  # 2 from the environment


@pytest.mark.parametrize(
    ("value", "shown"),
    [(0.001, "0.001"), (0.1, "0.100"), (1.0, "1.000"), (10, "10"), (1e-5, "1e-5"), ("1", "1.000"), ("abc", "abc"), ("10000", "10000")],
)
def test_tqdm_pads_a_bars_floats_and_numeric_strings_to_five_characters(value, shown):
    from callbacks import Tqdm
    from tqdm import tqdm

    assert issubclass(Tqdm, tqdm) and Tqdm.format_num(value) == shown
