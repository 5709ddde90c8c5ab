"""A file ModelCheckpoint saved after a mid-epoch validation resumes bit-exact (one process
and DDP(2) on gloo), and the top-k set it records stays right across a resume."""

from __future__ import annotations

import json
import os

import pytest
import torch

from callbacks import Callback, ModelCheckpoint
from tests._models import Classifier, loader, quiet
from trainer import Trainer
from trainer.checkpoint import files as checkpoint
from trainer.checkpoint.background_save import BackgroundWriter

# loader(64, 16, shuffle=True): 4 batches an epoch; validation every 2 batches: steps 2, 4, 6, 8.
SCORES = {2: 3.0, 4: 1.0, 6: 2.0, 8: 0.5}


class Scored(Classifier):
    """Dropout and Adam (the RNG and the optimizer state matter); ``val_metric`` is known per step.
    Under DDP rank 0 logs it minus ``skew`` and rank 1 plus: only the mean over ranks is the score."""

    def __init__(self, skew: float = 0.0, scores: dict[int, float] = SCORES) -> None:
        super().__init__(dropout=0.5, optimizer="adam")
        self.skew, self.scores = skew, scores

    def validation_step(self, batch, batch_idx):
        super().validation_step(batch, batch_idx)
        sign = 1.0 if self.trainer.strategy.global_rank == 1 else -1.0
        self.log("val_metric", self.scores.get(self.trainer.global_step, 9.0) + sign * self.skew)


class Record(Callback):
    """The batches each step trained on, and the global RNG when training ended."""

    def __init__(self) -> None:
        self.batches: dict[int, torch.Tensor] = {}
        self.rng: torch.Tensor | None = None

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.batches[trainer.global_step] = batch[0].clone()

    def on_train_end(self, trainer, module):
        self.rng = torch.get_rng_state()


class Crash(Exception):
    pass


class CrashAfter(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            raise Crash


def run(folder: str, ckpt_path=None, top_k: int = -1, extra=(), scores=SCORES) -> tuple[Classifier, Record, ModelCheckpoint]:
    model, record = Scored(scores=scores), Record()
    cb = ModelCheckpoint(dirpath=folder, monitor="val_metric", save_top_k=top_k)
    trainer = Trainer(**quiet(max_epochs=2, val_check_interval=2, seed=0, callbacks=[cb, record, *extra]))
    trainer.fit(model, loader(64, shuffle=True), loader(32), ckpt_path=ckpt_path)
    return model, record, cb


def name(step: int) -> str:
    return f"epoch={(step - 1) // 4}-step={step}.ckpt"


@pytest.mark.parametrize("step", [2, 6], ids=["epoch-0", "epoch-1"])
def test_a_mid_epoch_save_resumes_with_the_same_batches_rng_and_weights(step):
    expected, seen, _ = run("a")
    model, record, _ = run("b", ckpt_path=f"a/{name(step)}")

    assert checkpoint.load(f"a/{name(step)}")["steadytrainer"]["loop"]["batch_in_epoch"] == 2  # saved in the middle of its epoch
    assert sorted(record.batches) == [s for s in sorted(seen.batches) if s >= step]
    for s, batch in record.batches.items():
        assert torch.equal(batch, seen.batches[s]), f"step {s} trained on other samples"
    assert torch.equal(record.rng, seen.rng)
    for k, v in expected.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k
    # The files saved after the resume hold what the uninterrupted run's hold.
    a, b = checkpoint.load(f"a/{name(8)}"), checkpoint.load(f"b/{name(8)}")
    assert_same_state(a, b)


def assert_same_state(a: dict, b: dict) -> None:
    for key in ("state_dict", "optimizer_states", "loops"):
        assert _equal(a[key], b[key]), key
    for key in ("loop", "rng"):
        assert _equal(a["steadytrainer"][key], b["steadytrainer"][key]), key


def test_the_top_k_set_stays_right_across_a_mid_epoch_crash_and_resume():
    _, _, uninterrupted = run("a", top_k=2)
    with pytest.raises(Crash):
        run("b", top_k=2, extra=[CrashAfter(7)])  # after the step-6 save, in the middle of epoch 1
    assert sorted(os.listdir("b")) == sorted([name(4), name(6)])
    _, _, resumed = run("b", ckpt_path="last", top_k=2)

    assert sorted(os.listdir("a")) == sorted([name(4), name(8)])
    assert sorted(os.listdir("b")) == sorted([name(4), name(6), name(8)])  # step 6's: resumed from, so kept
    assert {os.path.basename(p): s for p, s in resumed.best_k_models.items()} == {name(4): 1.0, name(8): 0.5}
    assert {os.path.basename(p): s for p, s in uninterrupted.best_k_models.items()} == {name(4): 1.0, name(8): 0.5}
    assert resumed.best_model_path == os.path.abspath(f"b/{name(8)}") and resumed.best_model_score == 0.5


def test_fit_refuses_best_and_goes_on_from_the_best_files_path_mid_epoch():
    best_mid_epoch = {2: 3.0, 4: 1.0, 6: 0.2, 8: 0.5}
    expected, seen, cb = run("a", top_k=2, scores=best_mid_epoch)
    assert os.path.basename(cb.best_model_path) == "epoch=1-step=6.ckpt"
    with pytest.raises(ValueError, match="ckpt_path='best' is for validate, test and predict"):
        Trainer(**quiet(enable_checkpointing=True, max_epochs=2)).fit(Scored(), loader(64), ckpt_path="best")

    model, record, _ = run("b", ckpt_path=cb.best_model_path, top_k=2, scores=best_mid_epoch)
    assert sorted(record.batches) == [6, 7]
    for k, v in expected.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k


class Endless(torch.utils.data.IterableDataset):
    """A stream that never ends (no __len__)."""

    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        while True:
            yield torch.randn(8, generator=g), torch.randint(0, 2, (), generator=g)


def stream_run(folder: str, ckpt_path=None) -> tuple[Classifier, Record]:
    model, record = Classifier(dropout=0.5, optimizer="adam"), Record()
    cb = ModelCheckpoint(dirpath=folder, monitor="val_loss", save_top_k=-1)
    trainer = Trainer(**quiet(
        max_steps=30, val_check_interval=10, check_val_every_n_epoch=None, seed=0, callbacks=[cb, record],
    ))
    trainer.fit(model, torch.utils.data.DataLoader(Endless(), batch_size=8), loader(32), ckpt_path=ckpt_path)
    return model, record


def test_a_save_in_an_endless_stream_resumes_with_the_same_batches_and_weights():
    expected, seen = stream_run("a")
    (at_20,) = [f for f in os.listdir("a") if "-step=20." in f]
    model, record = stream_run("b", ckpt_path=f"a/{at_20}")

    assert sorted(record.batches) == list(range(20, 30))
    assert all(torch.equal(batch, seen.batches[s]) for s, batch in record.batches.items())
    assert torch.equal(record.rng, seen.rng)
    for k, v in expected.state_dict().items():
        assert torch.equal(model.state_dict()[k], v), k


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


# --- DDP(2) on gloo ----------------------------------------------------------------------------
class CountingWriter(BackgroundWriter):
    def __init__(self) -> None:
        super().__init__()
        self.writes = 0

    def submit(self, fn, *args):
        self.writes += 1
        super().submit(fn, *args)


class CountingCheckpoint(ModelCheckpoint):
    def setup(self, trainer, pl_module, stage):
        super().setup(trainer, pl_module, stage)
        self._writer = CountingWriter()  # in each process: a writer is process state, which pickling leaves behind


class PerRank(Callback):
    """Each rank's view of the checkpoints at the end of fit, in ``<folder>/rank<r>.json``."""

    def __init__(self, folder: str) -> None:
        self.folder = folder

    def on_fit_end(self, trainer, module):
        cb = trainer.checkpoint_callback
        seen = {
            "best_k": {os.path.basename(p): s for p, s in cb.best_k_models.items()},
            "best_score": cb.best_model_score, "writes": cb._writer.writes,
        }
        with open(os.path.join(self.folder, f"rank{trainer.strategy.global_rank}.json"), "w") as f:
            json.dump(seen, f)


def ddp_run(folder: str, ranks: str, ckpt_path=None) -> Classifier:
    model = Scored(skew=0.25)
    cb = CountingCheckpoint(dirpath=folder, monitor="val_metric", save_top_k=-1)
    os.makedirs(ranks, exist_ok=True)
    trainer = Trainer(**quiet(
        strategy="ddp", devices=2, max_epochs=2, val_check_interval=2, seed=0, callbacks=[cb, PerRank(ranks)],
    ))
    # 128 samples: 64 a rank, 4 batches an epoch, as in one process.
    trainer.fit(model, loader(128, shuffle=True), loader(64), ckpt_path=ckpt_path)
    return model


@pytest.mark.slow
@pytest.mark.usefixtures("ranks_from_the_fork_server")  # ranks fork from a warm server: see tests/conftest.py
def test_ddp_ranks_agree_on_the_best_only_rank_0_writes_and_a_mid_epoch_save_resumes_bit_exact():
    expected = ddp_run("a", "ranks-a")
    zero, one = (json.load(open(f"ranks-a/rank{r}.json")) for r in (0, 1))
    # The score is the mean over ranks (rank 0 saw 0.25 less, rank 1 0.25 more), the same on both.
    assert zero["best_k"] == one["best_k"] == {name(s): SCORES[s] for s in (2, 4, 6, 8)}
    assert zero["best_score"] == one["best_score"] == 0.5
    assert (zero["writes"], one["writes"]) == (4, 0)  # a file at each of the 4 validations, by rank 0 alone
    assert sorted(os.listdir("a")) == sorted([name(s) for s in (2, 4, 6, 8)])

    resumed = ddp_run("b", "ranks-b", ckpt_path=f"a/{name(6)}")  # 2 batches into epoch 1
    for k, v in expected.state_dict().items():
        assert torch.equal(resumed.state_dict()[k], v), k
    assert sorted(os.listdir("b")) == [name(8)]
    assert_same_state(checkpoint.load(f"a/{name(8)}"), checkpoint.load(f"b/{name(8)}"))
