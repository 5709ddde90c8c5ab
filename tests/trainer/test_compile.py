"""Trainer(compile=...), fit(torch.compile(model)) and compiled submodules: same training, the keys
Lightning writes, resume both ways.

The tests compile with backend="eager": dynamo captures the graphs as it would for inductor,
and the numbers stay exactly eager's, so a compiled run can be held to torch.equal.
"""

from __future__ import annotations

import pytest
import torch

from callbacks import ProgressBar
from tests._models import Classifier, loader, quiet
from trainer import Trainer, TrainModule

EAGER = dict(backend="eager")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class CompiledInside(Classifier):
    """A user who compiles a submodule in __init__: its state_dict keys carry ``_orig_mod.``."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.net = torch.compile(self.net, backend="eager")


def _same(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_compile_trains_as_eager_and_writes_the_plain_models_keys(tmp_path):
    torch.manual_seed(0)
    compiled, plain = Classifier(dropout=0.1), Classifier(dropout=0.1)
    plain.load_state_dict(compiled.state_dict())
    trainer = Trainer(max_epochs=2, seed=3, compile=EAGER, log_dir=tmp_path, enable_progress_bar=False)
    trainer.fit(compiled, loader())
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # it did compile
    Trainer(max_epochs=2, seed=3, **quiet()).fit(plain, loader())
    _same(compiled.state_dict(), plain.state_dict())
    ckpt = torch.load(trainer.checkpoint_callback.best_model_path, weights_only=True)
    _same(ckpt["state_dict"], plain.state_dict())  # loads into the uncompiled model as it is
    assert getattr(compiled, "_compiled_call_impl", None) is None  # handed back uncompiled


def test_a_compiled_submodule_keeps_its_keys_as_lightning_and_its_checkpoint_resumes_a_plain_run(tmp_path):
    torch.manual_seed(0)
    model = CompiledInside()
    assert any("_orig_mod." in k for k in model.state_dict())
    first = Trainer(max_epochs=1, log_dir=tmp_path / "a", enable_progress_bar=False)
    first.fit(model, loader())
    path = first.checkpoint_callback.best_model_path
    ckpt = torch.load(path, weights_only=True)
    assert list(ckpt["state_dict"]) == list(CompiledInside().state_dict())  # the model's own keys, as Lightning writes
    fresh = CompiledInside()
    fresh.load_state_dict(ckpt["state_dict"])  # a plain load_state_dict, as a Lightning user does it
    _same(fresh.state_dict(), model.state_dict())

    reloaded = CompiledInside.load_from_checkpoint(path)  # into the compiled submodule again
    plain_again = Classifier.load_from_checkpoint(path)  # ours: the keys are mapped to the uncompiled model's
    _same(model.state_dict(), reloaded.state_dict())
    for x, _ in loader(n=16):
        assert torch.equal(reloaded(x), plain_again(x))

    # Resume the other way: the compiled run's checkpoint continues an uncompiled model, and an
    # uncompiled run's checkpoint continues a compiled one; both match training straight through.
    straight = Classifier()
    straight.load_state_dict(plain_again.state_dict())
    Trainer(max_epochs=2, **quiet()).fit(straight, loader(), ckpt_path=path)
    compiled_again = Classifier()
    Trainer(max_epochs=2, compile=EAGER, **quiet()).fit(compiled_again, loader(), ckpt_path=path)
    _same(compiled_again.state_dict(), straight.state_dict())
    inside = CompiledInside()
    Trainer(max_epochs=2, **quiet()).fit(inside, loader(), ckpt_path=path)
    for k, v in straight.state_dict().items():
        assert torch.equal(inside.state_dict()[k.replace("net.", "net._orig_mod.", 1)], v), k


@pytest.mark.slow
@pytest.mark.usefixtures("ranks_from_the_fork_server")  # ranks fork from a warm server: see tests/conftest.py
def test_compile_under_ddp_trains_and_hands_back_plain_weights(tmp_path):
    torch.manual_seed(0)
    spread, single = Classifier(), Classifier()
    single.load_state_dict(spread.state_dict())
    trainer = Trainer(strategy="ddp", devices=2, max_epochs=1, compile=EAGER, log_dir=tmp_path, enable_progress_bar=False)
    trainer.fit(spread, loader(batch_size=8))
    Trainer(max_epochs=1, **quiet()).fit(single, loader(batch_size=16))
    for (k, a), b in zip(spread.state_dict().items(), single.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=k)
    ckpt = torch.load(trainer.checkpoint_callback.best_model_path, weights_only=True)
    assert list(ckpt["state_dict"]) == list(Classifier().state_dict())


def test_fit_takes_torch_compile_of_the_model_as_lightning_does(tmp_path):
    from trainer.utilities.compile import to_uncompiled

    torch.manual_seed(0)
    model, plain = Classifier(dropout=0.1), Classifier(dropout=0.1)
    plain.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="eager")
    trainer = Trainer(max_epochs=2, seed=3, log_dir=tmp_path, enable_progress_bar=False)
    trainer.fit(compiled, loader(), loader(n=32))
    assert trainer.lightning_module is model and model._compiler_ctx["compiler"] == "dynamo"
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # its steps did compile
    Trainer(max_epochs=2, seed=3, **quiet()).fit(plain, loader(), loader(n=32))
    _same(model.state_dict(), plain.state_dict())
    ckpt = torch.load(trainer.checkpoint_callback.best_model_path, weights_only=True)
    assert list(ckpt["state_dict"]) == list(Classifier().state_dict())  # the module's keys, no '_orig_mod.'
    assert trainer.validate(compiled, loader(n=32), verbose=False)[0]["val_loss"] >= 0
    assert trainer.test(compiled, loader(n=32), verbose=False)[0]["test_loss"] >= 0
    assert torch.cat(trainer.predict(compiled, loader(n=32))).shape == (32,)
    assert to_uncompiled(model) is model and model._compiler_ctx is None
    assert model.training_step == Classifier.training_step.__get__(model)
    with pytest.raises(ValueError, match="required to be a compiled LightningModule"):
        to_uncompiled(model)


class Unlogged(Classifier):
    def training_step(self, batch, batch_idx):  # self.log breaks the graph, which fullgraph=True refuses
        x, y = batch
        return torch.nn.functional.cross_entropy(self(x), y)


class TrainingOnly(TrainModule):  # no validation_step or test_step: nothing of theirs to compile
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.cross_entropy(self.layer(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_compiled_module_with_only_a_training_step_trains_and_uncompiles():
    from trainer.utilities.compile import to_uncompiled

    model = TrainingOnly()
    Trainer(max_epochs=1, **quiet()).fit(torch.compile(model, backend="eager"), loader())
    assert model.global_step == 8 and not hasattr(model, "validation_step")
    assert hasattr(model.training_step, "_torchdynamo_orig_callable")  # compiled
    to_uncompiled(model)
    assert not hasattr(model.training_step, "_torchdynamo_orig_callable") and not hasattr(model, "test_step")


def test_fullgraph_compiles_each_step_whole():
    model = Unlogged()
    Trainer(max_epochs=1, **quiet()).fit(torch.compile(model, backend="eager", fullgraph=True), loader())
    assert model.global_step == 8 and model._compiler_ctx["dynamo_ctx"] is not None


def test_a_compiled_plain_module_is_refused_in_lightnings_words():
    with pytest.raises(ValueError, match="`model` is expected to be a compiled LightningModule. Found a `Linear`"):
        Trainer(max_epochs=1, **quiet()).fit(torch.compile(torch.nn.Linear(2, 2)), loader())


@pytest.mark.parametrize(
    "value, error, message",
    [
        ("yes", TypeError, r"compile='yes' must be True, False, or torch.compile's keyword arguments"),
        (dict(mod="max-autotune"), ValueError, r"unknown keys \['mod'\].*mode"),
    ],
)
def test_a_bad_compile_option_names_the_argument(value, error, message):
    with pytest.raises(error, match=message):
        Trainer(max_epochs=1, compile=value)


def test_the_bar_says_it_is_compiling_and_the_curves_have_every_logged_step(tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer = Trainer(max_epochs=1, log_every_n_steps=2, compile=EAGER, log_dir=tmp_path, enable_checkpointing=False,
                      callbacks=[ProgressBar()])  # the tqdm bar's line (rich's bar, the default with rich, has none)
    trainer.fit(Classifier(), loader(n=128, batch_size=16))  # 8 steps: steps 2, 4, 6, 8 logged at 1, 3, 5, 7
    err = capsys.readouterr().err
    assert "compiling the model (torch.compile): the first steps take longer" in err
    acc = EventAccumulator(trainer.run_dir)
    acc.Reload()
    assert [e.step for e in acc.Scalars("train_loss")] == [1, 3, 5, 7]
    # No throughput of the Trainer's own, as in Lightning (ThroughputMonitor measures it when asked).
    assert not [tag for tag in acc.Tags()["scalars"] if tag.startswith("throughput")]
