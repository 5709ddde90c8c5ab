"""No code path loses the only good checkpoint: kills during rotation, a full disk, a folder
that cannot be written, and file names or loaded states that would point at other files."""

from __future__ import annotations

import errno
import os
import tempfile
import signal
import subprocess
import sys
import textwrap
import time
import zipfile

import pytest

from callbacks import Callback, ModelCheckpoint
from tests._models import Classifier, loader
from trainer import Trainer
from trainer.checkpoint import files as checkpoint


def _trainer(dirpath, **options) -> Trainer:
    options.setdefault("callbacks", [ModelCheckpoint(dirpath=dirpath, every_n_train_steps=1, save_top_k=1, save_last=True)])
    return Trainer(enable_progress_bar=False, log_dir=None, **options)


def _step_of(path) -> int:
    return checkpoint.load(path)["global_step"]


def _ckpt_names(folder) -> list[str]:
    return sorted(f for f in os.listdir(folder) if f.endswith(".ckpt"))


# --- killed while rotating top-k ----------------------------------------------------------------
KILL_SCRIPT = textwrap.dedent(
    """
    import os, stat, sys, time

    import torch

    from callbacks import ModelCheckpoint
    from tests._models import Classifier, loader
    from trainer import Trainer
    from trainer.checkpoint import files as checkpoint

    phase, folder, marker = sys.argv[1:]
    real_fsync, saves = os.fsync, []

    def hold(note):
        open(marker, "w").write(note)
        time.sleep(600)  # the test kills us here

    def half_written(fd):  # save_atomic fsyncs its temp file once written: keep half of the third
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # the folder's fsync
            return real_fsync(fd)
        saves.append(1)
        if len(saves) < 3:
            return real_fsync(fd)
        os.ftruncate(fd, os.fstat(fd).st_size // 2)
        hold("mid-write")

    real_save_atomic = checkpoint.save_atomic

    def save_then_hold(obj, path):  # the new file is complete; the one it replaces is not deleted yet
        real_save_atomic(obj, path)
        if torch.load(path, weights_only=True)["global_step"] >= 3:
            hold("written, old one not yet deleted")

    if phase == "mid-write":
        os.fsync = half_written
    else:
        checkpoint.save_atomic = save_then_hold
    checkpoints = ModelCheckpoint(dirpath=folder, every_n_train_steps=1, save_top_k=1, save_last=True)
    trainer = Trainer(max_steps=50, enable_progress_bar=False, log_dir=None, callbacks=[checkpoints])
    trainer.fit(Classifier(), loader(256, 4))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("phase, newest", [("mid-write", 2), ("between write and delete", 3)])
def test_a_kill_during_rotation_leaves_a_readable_checkpoint_to_resume_from(phase, newest, tmp_path, script_env):
    """Top-k=1 saves every step; the third save is killed mid-write, or after it is complete
    but before the previous file is deleted. Every *.ckpt left is complete, and fit resumes."""
    folder, marker = tmp_path / "ckpts", tmp_path / "marker"
    (tmp_path / "kill_me.py").write_text(KILL_SCRIPT)
    proc = subprocess.Popen(
        [sys.executable, "kill_me.py", phase, str(folder), str(marker)], cwd=tmp_path, env=script_env,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), proc.stderr.read().decode() if proc.poll() is not None else "no marker"
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()

    names = _ckpt_names(folder)
    assert "last.ckpt" in names and len(names) >= 2
    steps = {name: _step_of(folder / name) for name in names}  # every *.ckpt loads: none is cut off
    assert steps["last.ckpt"] == 2 and max(steps.values()) == newest
    leftovers = [f for f in os.listdir(folder) if f not in names]
    if phase == "mid-write":  # the cut-off write is a hidden temp file, not something named *.ckpt
        assert len(leftovers) == 1 and leftovers[0].startswith(".tmp-")
        assert not zipfile.is_zipfile(folder / leftovers[0])
    else:
        assert leftovers == []

    resumed = _trainer(folder, max_steps=newest + 2)
    resumed.fit(Classifier(), loader(256, 4), ckpt_path="last")
    assert resumed.global_step == newest + 2


# --- a full disk, a folder that cannot be written ----------------------------------------------
def test_a_full_disk_raises_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    folder, real_fsync, calls = tmp_path / "ckpts", os.fsync, []

    def disk_fills_on_the_third_save(fd):  # save_atomic fsyncs each temp file it has written
        if not os.readlink(f"/proc/self/fd/{fd}").startswith(str(folder)) or not os.path.isfile(f"/proc/self/fd/{fd}"):
            return real_fsync(fd)
        calls.append(1)
        if len(calls) < 3:
            return real_fsync(fd)
        os.ftruncate(fd, 100)  # part of it got out, then the disk was full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", disk_fills_on_the_third_save)
    trainer = _trainer(folder, max_steps=10)
    with pytest.raises(OSError) as info:
        trainer.fit(Classifier(), loader(64, 4))
    assert info.value.errno == errno.ENOSPC
    message = str(info.value)
    assert "Could not write the checkpoint" in message and "epoch=0-step=3.ckpt" in message
    assert "No space left on device" in message and "is unchanged" in message and "ckpt_path='last'" in message
    # Step 3's write failed on the writer thread; step 4's save waits for it and stops the run.
    assert trainer.global_step == 4
    # The previous checkpoint is intact and still the newest; no partial file is left behind.
    assert sorted(os.listdir(folder)) == ["epoch=0-step=2.ckpt", "last.ckpt"]
    assert _step_of(folder / "epoch=0-step=2.ckpt") == _step_of(folder / "last.ckpt") == 2


class CountBatches(Callback):
    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.batches += 1


def test_a_folder_the_os_refuses_fails_before_training_with_the_systems_reason(tmp_path, monkeypatch):
    # As for a user without write permission (these tests run as root, whom chmod does not stop):
    # access() says no, and the test file the check then tries fails with the system's reason.
    folder = str(tmp_path / "ckpts")
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: os.path.realpath(path) != os.path.realpath(folder))

    def refused(*args, dir=None, **kwargs):
        raise PermissionError(13, "Permission denied", dir)

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", refused)
    count = CountBatches()
    trainer = _trainer(folder, max_steps=2, callbacks=[count, ModelCheckpoint(dirpath=folder)])
    with pytest.raises(PermissionError, match=r"ModelCheckpoint cannot write to dirpath=.*ckpts.*: Permission denied\. Pick"):
        trainer.fit(Classifier(), loader())
    assert count.batches == 0


def test_a_folder_access_wrongly_refuses_is_still_used_when_a_file_can_be_made_there(tmp_path, monkeypatch):
    folder = str(tmp_path / "ckpts")
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False)  # some network mounts answer so
    trainer = _trainer(folder, max_steps=2, callbacks=[ModelCheckpoint(dirpath=folder, every_n_train_steps=1)])
    trainer.fit(Classifier(), loader())
    assert sorted(os.listdir(folder)) == ["epoch=0-step=2.ckpt"]


def test_a_writable_folder_is_checked_without_a_test_file(tmp_path, monkeypatch):
    def no_test_file(*args, **kwargs):
        raise AssertionError("a test file was created to check the folder")

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", no_test_file)
    folder = str(tmp_path / "ckpts")
    _trainer(folder, max_steps=2, callbacks=[ModelCheckpoint(dirpath=folder, every_n_train_steps=1)]).fit(Classifier(), loader())
    assert sorted(os.listdir(folder)) == ["epoch=0-step=2.ckpt"]


def test_a_checkpoint_folder_that_cannot_be_written_fails_before_training(tmp_path):
    # chmod does not stop root, but nothing can create a folder inside a regular file.
    (tmp_path / "a_file").write_text("")
    count = CountBatches()
    bad = tmp_path / "a_file" / "ckpts"
    trainer = _trainer(bad, max_steps=2, callbacks=[count, ModelCheckpoint(dirpath=bad)])
    with pytest.raises(PermissionError, match=r"ModelCheckpoint cannot write to dirpath=.*a_file/ckpts.*Not a directory"):
        trainer.fit(Classifier(), loader())
    assert count.batches == 0
    # The same for the default checkpoint folder under an unwritable log_dir.
    trainer = Trainer(max_steps=2, enable_progress_bar=False, log_dir=tmp_path / "a_file", callbacks=[count])
    with pytest.raises(OSError, match=r"Cannot create the run folder .* for Trainer\(log_dir=.*a_file.*log_dir=None"):
        trainer.fit(Classifier(), loader())
    assert count.batches == 0


# --- names and states that would point at other files -----------------------------------------
def test_a_fixed_filename_never_overwrites_a_kept_checkpoint(tmp_path):
    """With save_top_k=2 and filename='best', the second save must not replace the first."""
    callback = ModelCheckpoint(dirpath=tmp_path, filename="best", every_n_train_steps=1, save_top_k=2, monitor="step", mode="max")
    Trainer(max_steps=3, enable_progress_bar=False, log_dir=None, callbacks=[callback]).fit(Classifier(), loader())
    # Step 3's save pushes step 1's file out of the top 2: it takes its name, swapped in whole (Lightning's).
    assert _ckpt_names(tmp_path) == ["best-v1.ckpt", "best.ckpt"]
    assert (_step_of(tmp_path / "best-v1.ckpt"), _step_of(tmp_path / "best.ckpt")) == (2, 3)  # the two newest
    # 'last' as a filename does not clobber last.ckpt either.
    callback = ModelCheckpoint(dirpath=tmp_path / "b", filename="last", every_n_train_steps=1, save_top_k=1, save_last=True)
    Trainer(max_steps=2, enable_progress_bar=False, log_dir=None, callbacks=[callback]).fit(Classifier(), loader())
    assert _ckpt_names(tmp_path / "b") == ["last-v1.ckpt", "last.ckpt"]


def test_resuming_into_another_folder_never_deletes_the_old_folders_checkpoints(tmp_path):
    """The resumed ModelCheckpoint loads the old run's top-k list, whose files live elsewhere:
    rotation must not delete them (they may be the only copies)."""
    old, new = tmp_path / "old", tmp_path / "new"

    def top2(folder) -> ModelCheckpoint:
        return ModelCheckpoint(dirpath=folder, every_n_train_steps=1, save_top_k=2, monitor="step", mode="max")

    _trainer(old, max_steps=3, callbacks=[top2(old)]).fit(Classifier(), loader())
    before = {name: (old / name).read_bytes() for name in _ckpt_names(old)}
    resumed = _trainer(new, max_steps=6, callbacks=[top2(new)])
    resumed.fit(Classifier(), loader(), ckpt_path=old / "epoch=0-step=3.ckpt")
    assert {name: (old / name).read_bytes() for name in _ckpt_names(old)} == before
    assert _ckpt_names(new) == ["epoch=0-step=5.ckpt", "epoch=0-step=6.ckpt"]


def test_a_user_checkpoint_callback_replaces_the_built_in_one(tmp_path):
    """Two ModelCheckpoints would save twice, and share one state key in every checkpoint."""
    mine = ModelCheckpoint(dirpath=tmp_path / "mine")
    trainer = Trainer(max_steps=2, enable_progress_bar=False, log_dir=tmp_path / "runs", callbacks=[mine])
    assert [cb for cb in trainer.callbacks if isinstance(cb, ModelCheckpoint)] == [mine]
    trainer.fit(Classifier(), loader(32, 16))
    assert _ckpt_names(tmp_path / "mine") == ["epoch=0-step=2.ckpt"]
    assert not list((tmp_path / "runs").glob("*/*/checkpoints"))


DDP_DISK_FULL = textwrap.dedent(
    """
    import errno, os, sys

    from callbacks import ModelCheckpoint
    from tests._models import Classifier, loader
    from trainer import Trainer

    real_fsync, saves = os.fsync, []

    def disk_full_at_step_3(fd):  # runs in rank 0's writer thread, on each checkpoint's temp file
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        if name.startswith(".tmp-") and ".ckpt" in name:
            saves.append(1)
            if len(saves) == 3:  # the save of step 3
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_fsync(fd)

    os.fsync = disk_full_at_step_3  # module level: the spawned ranks re-import this file

    if __name__ == "__main__":
        ckpt = ModelCheckpoint(dirpath=sys.argv[1], every_n_train_steps=1, every_n_epochs=None)
        trainer = Trainer(strategy="ddp", devices=2, max_steps=20, enable_progress_bar=False, log_dir=None, callbacks=[ckpt])
        trainer.fit(Classifier(), loader(256, 4))
    """
)


@pytest.mark.slow
def test_under_ddp_a_failed_background_write_stops_every_rank_with_rank_0s_error(tmp_path, script_env):
    (tmp_path / "ddp_disk_full.py").write_text(DDP_DISK_FULL)
    start = time.monotonic()
    done = subprocess.run(
        [sys.executable, "ddp_disk_full.py", str(tmp_path / "ckpts")], cwd=tmp_path, env=script_env,
        capture_output=True, text=True, timeout=240,
    )
    took = time.monotonic() - start
    assert done.returncode != 0
    assert "WorkerError" in done.stderr and "Could not write the checkpoint" in done.stderr, done.stderr[-3000:]
    assert "epoch=0-step=3.ckpt" in done.stderr and "No space left on device" in done.stderr
    assert took < 120  # the other rank did not sit in a collective until the 5-minute timeout
    names = sorted(os.listdir(tmp_path / "ckpts"))
    assert "epoch=0-step=2.ckpt" in names and not any("step=4" in n or "step=5" in n for n in names)
