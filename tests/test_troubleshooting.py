"""docs/troubleshooting.md's table says what the code does: each row's situation is run here, and
every message the row quotes (``...`` standing for any text) is one the situation produced.
Rows whose situation needs other processes or a full disk are run by the test named for them."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch

import tests._models
from torch.utils.data import DataLoader

from callbacks import ModelCheckpoint
from tests._models import Classifier, loader, quiet
from trainer import Trainer

DOC = Path(__file__).resolve().parent.parent / "docs" / "troubleshooting.md"


def _rows() -> dict[str, str]:
    """The table's rows: "What happened" -> "What you see"."""
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        if len(cells) == 3 and cells[0] not in ("What happened", "---"):
            rows[cells[0]] = cells[1]
    return rows


def _quotes(cell: str) -> list[str]:
    """The messages a cell quotes: code spans that start with an error's or warning's name, or with ``...``."""
    spans = [a or b for a, b in re.findall(r"``\s?(.+?)\s?``|`([^`]+)`", cell)]
    return [s for s in spans if re.match(r"(\w+(Error|Warning|Exception)|error): |\.\.\. ", s)]


def _pattern(quote: str) -> re.Pattern[str]:
    parts = [re.escape(p) for p in re.split(r" ?\.\.\. ?", quote)]
    return re.compile(".*?".join(parts), re.DOTALL)


def _messages(*situations) -> list[str]:
    """``Type: message`` of what each situation raised or warned."""
    seen = []
    for situation in situations:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                situation()
            except Exception as err:  # noqa: BLE001 - the message is what the row quotes
                seen.append(f"{type(err).__name__}: {err}")
        seen += [f"{w.category.__name__}: {w.message}" for w in caught]
    return seen


def _fit(model=None, data=None, ckpt_path=None, **options):
    def run():
        trainer = Trainer(**quiet(**{"max_epochs": 1, **options}))
        trainer.fit(Classifier() if model is None else model, loader(32) if data is None else data, ckpt_path=ckpt_path)
    return run


class StopsAtOnce(Classifier):
    def training_step(self, batch, batch_idx):
        self.trainer.should_stop = True
        return super().training_step(batch, batch_idx)


def _lightning_callback():
    from lightning.pytorch.callbacks import EarlyStopping

    return Trainer(callbacks=[EarlyStopping(monitor="val_loss")])


class ReturnsNone(Classifier):
    def training_step(self, batch, batch_idx):
        return None


class ReturnsNoneToLBFGS(ReturnsNone):
    def configure_optimizers(self):
        return torch.optim.LBFGS(self.parameters())


class UnreducedLoss(Classifier):
    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self(x), y, reduction="none")[:3]


class DetachedLoss(Classifier):
    def training_step(self, batch, batch_idx):
        return super().training_step(batch, batch_idx).detach()


def _returns_a_string():
    class Classifier(tests._models.Classifier):  # the name the row quotes
        def configure_optimizers(self):
            return "adam"

    return Classifier()


class TwoOptimizers(Classifier):
    def configure_optimizers(self):
        return [torch.optim.SGD(self.parameters(), lr=0.1), torch.optim.SGD(self.parameters(), lr=0.1)]


class NaNLoss(Classifier):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if batch_idx >= 1 else loss


class NoneAtBatch5(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return None if i == 5 else loader(8, 1).dataset[i]


def _opt_model(optimizer: str, groups: int = 1):
    from tests.trainer.checkpoint.test_state_dicts import Opt

    return Opt(optimizer, groups=groups)


def _resume(tmp, saved, resumed, int_weights: bool = False):
    def run():
        trainer = Trainer(**quiet(max_epochs=1))
        trainer.fit(saved, loader(32))
        trainer.save_checkpoint(tmp / "a.ckpt")
        if int_weights:
            ckpt = torch.load(tmp / "a.ckpt", weights_only=False)
            ckpt["state_dict"]["net.0.weight"] = ckpt["state_dict"]["net.0.weight"].long()
            torch.save(ckpt, tmp / "a.ckpt")
        Trainer(**quiet(max_epochs=2)).fit(resumed, loader(32), ckpt_path=tmp / "a.ckpt")
    return run


def _write_files(tmp: Path) -> None:
    """What the situations read: written when a test runs, in its tmp_path (never at collection)."""
    (tmp / "notes.txt").write_text("not a checkpoint")
    (tmp / "a_file").write_text("")


def _situations(tmp: Path) -> dict[str, list]:
    return {
        "A typo in a name": [lambda: Trainer(strategy="dpp")],
        "A GPU that is not there": [lambda: Trainer(devices=[7])],
        "More devices than the strategy uses": [lambda: Trainer(strategy="single", devices=2)],
        "No end given": [_fit(StopsAtOnce(), max_epochs=None)],
        "Nothing to train on": [_fit(data=loader(0)), _fit(data=iter([])), _fit(data=iter(list(loader(32))), max_epochs=2)],
        "`training_step` returns no usable loss": [
            _fit(ReturnsNone()), _fit(ReturnsNoneToLBFGS()), _fit(UnreducedLoss()), _fit(DetachedLoss()),
        ],
        "`configure_optimizers` returns something else": [
            _fit(_returns_a_string()), _fit(TwoOptimizers()),
        ],
        "A monitored metric that is never logged": [
            _fit(callbacks=[ModelCheckpoint(dirpath=str(tmp / "c"), monitor="val_loss")], max_epochs=1),
        ],
        "A bad `ckpt_path`": [_fit(ckpt_path="nope.ckpt"), _fit(ckpt_path="notes.txt")],  # tmp is the folder the test runs in
        "A checkpoint folder that cannot be written": [
            _fit(callbacks=[ModelCheckpoint(dirpath=str(tmp / "a_file" / "checkpoints"))]),
        ],
        "A loader yields `None` (a `__getitem__` or `collate_fn` that gave up on a sample)": [
            _fit(data=DataLoader(NoneAtBatch5(), batch_size=1, collate_fn=lambda b: b[0])),
            lambda: Trainer(**quiet()).validate(
                Classifier(), [loader(16), DataLoader(NoneAtBatch5(), batch_size=1, collate_fn=lambda b: b[0])],
                verbose=False),
        ],
        "`callbacks=[...]` holds something else": [lambda: Trainer(callbacks=[object()]), _lightning_callback],
        "NaN or Inf loss": [_fit(NaNLoss(), log_every_n_steps=1)],
        "A resume with another optimizer, other param groups, or weights of another kind": [
            _resume(tmp, _opt_model("adam"), _opt_model("sgd")), _resume(tmp, _opt_model("sgd"), _opt_model("sgd", 2)),
            _resume(tmp, _opt_model("sgd"), _opt_model("sgd"), int_weights=True),
        ],
        "A `compile=` spec torch.compile would refuse": [lambda: Trainer(compile={"mode": "fastest"})],
    }


# Rows whose situation runs elsewhere (other processes, a full disk, a damaged file): the test that runs it.
ELSEWHERE = {
    "The disk fills up during a save": "tests/trainer/checkpoint/test_checkpoint.py",
    "`fit(ckpt_path=\"last\")` on a run that already reached its end": "tests/trainer/checkpoint/test_resume.py",
    "Weights or optimizer state turn NaN before a save": "tests/trainer/checkpoint/test_checkpoint.py",
    "A checkpoint file changed on disk": "tests/trainer/checkpoint/test_integrity.py",
    "Two runs started in one checkpoint folder": "tests/trainer/checkpoint/test_folder_lock.py",
    "A sharded checkpoint that carries code": "tests/trainer/checkpoint/test_sharded_read.py",
    "The log disk fills up": "tests/loggers/test_disk.py",
    "A CLI config that names `os.system`, `subprocess.*`, `pickle.loads`...": "tests/trainer/test_cli.py",
    "`ckpt_path=\"last\"` took a file you did not expect": "tests/trainer/checkpoint/test_paths.py",
    "A checkpoint URL that is not there": "tests/trainer/checkpoint/test_paths.py",
    "A download cut short, or a URL that serves a web page": "tests/trainer/checkpoint/test_paths.py",
    "A cached download damaged on disk": "tests/trainer/checkpoint/test_paths.py",
    "A bad `--ckpt_path` in the CLI": "tests/trainer/test_cli.py",
}


def test_every_row_is_run_here_or_by_the_test_named_for_it(tmp_path):
    assert set(_rows()) == set(_situations(tmp_path)) | set(ELSEWHERE)
    assert all((DOC.parent.parent / test).is_file() for test in ELSEWHERE.values())


@pytest.mark.parametrize("row", sorted(_situations(Path("."))))
def test_each_message_a_row_quotes_is_what_its_situation_says(tmp_path, row):
    if row == "A GPU that is not there" and torch.cuda.is_available():
        pytest.skip("the row quotes a machine without CUDA")
    quotes = _quotes(_rows()[row])
    assert quotes, f"the row {row!r} quotes no message"
    _write_files(tmp_path)
    seen = _messages(*_situations(tmp_path)[row])
    for quote in quotes:
        assert any(_pattern(quote).match(m) or (quote.startswith("...") and _pattern(quote).search(m)) for m in seen), (
            f"{row!r} quotes {quote!r}, and its situation said:\n" + "\n".join(seen))
