"""The hook contract: which hooks run, how often, and in which order (trainer.loops.fit.FitLoop's docstring)."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from callbacks import Callback
from callbacks.base import HOOKS
from tests._models import Classifier, loader, quiet
from trainer import Trainer


class Recorder(Callback):
    """Overrides every hook and records its name, in call order."""

    def __init__(self) -> None:
        self.events: list[str] = []


def _recording(name: str):
    def hook(self: Recorder, trainer: Trainer, module, *args, **kwargs) -> None:
        self.events.append(name)

    return hook


for _name in HOOKS:
    setattr(Recorder, _name, _recording(_name))

BATCH = ["on_train_batch_start", "on_before_backward", "on_after_backward"]  # inside an accumulation group
FIRST = ["on_train_batch_start", "on_before_zero_grad", "on_before_backward", "on_after_backward"]  # a group's first
VALIDATION_2 = [  # a validation run of two batches
    "on_validation_start", "on_validation_epoch_start",
    "on_validation_batch_start", "on_validation_batch_end",
    "on_validation_batch_start", "on_validation_batch_end",
    "on_validation_epoch_end", "on_validation_end",
]


def _fit(**options) -> tuple[Recorder, Trainer]:
    rec = Recorder()
    trainer = Trainer(**quiet(callbacks=[rec], **options))
    # 8 training batches and 4 validation batches in the loaders; limits cut them to 5 and 2.
    trainer.fit(Classifier(), loader(64, batch_size=8), loader(32, batch_size=8))
    return rec, trainer


def test_fit_runs_the_hooks_of_the_docstring_in_order_with_accumulation_and_limits():
    rec, trainer = _fit(max_epochs=2, accumulate_grad_batches=2, limit_train_batches=5, limit_val_batches=2)
    # Batches 0-4 form accumulation groups [0, 1], [2, 3] and the short [4]: three optimizer steps.
    # on_train_log (log_every_n_steps=50): never in 6 steps (Lightning's rows come at the 50th).
    epoch = (
        ["on_train_epoch_start"]
        + FIRST + ["on_train_batch_end"]
        + BATCH + ["on_before_optimizer_step", "on_train_batch_end"]
        + FIRST + ["on_train_batch_end"]
        + BATCH + ["on_before_optimizer_step", "on_train_batch_end"]
        + FIRST + ["on_before_optimizer_step", "on_train_batch_end"]
        + VALIDATION_2  # after the last batch's on_train_batch_end (Lightning's val_check_batch)
        + ["on_train_epoch_end"]
    )

    # The sanity check's 2 batches run the validation hooks, as in Lightning.
    start = ["setup", "on_fit_start", "on_sanity_check_start", *VALIDATION_2, "on_sanity_check_end", "on_train_start"]
    expected = start + epoch + epoch + ["on_train_end", "on_fit_end", "teardown"]
    assert rec.events == expected
    assert trainer.global_step == 6 and trainer.current_epoch == 2
    counts = Counter(rec.events)
    assert counts["on_train_batch_start"] == counts["on_train_batch_end"] == 10
    assert counts["on_before_optimizer_step"] == 6
    assert counts["on_validation_batch_end"] == 2 + 4  # the sanity check's, then 2 a validation
    # Hooks of other stages, checkpoints and errors never ran.
    assert not {h for h in HOOKS if h.startswith(("on_test", "on_predict"))} & set(counts)
    assert "on_save_checkpoint" not in counts and "on_exception" not in counts


def test_validation_due_mid_epoch_runs_after_that_batch_end_and_only_on_its_schedule():
    rec, trainer = _fit(max_epochs=1, limit_train_batches=5, limit_val_batches=2, val_check_interval=2, log_every_n_steps=2)
    expected = (
        ["setup", "on_fit_start", "on_sanity_check_start", *VALIDATION_2, "on_sanity_check_end", "on_train_start",
         "on_train_epoch_start"]
        + FIRST + ["on_before_optimizer_step", "on_train_batch_end"]  # step 1: no row (Lightning's)
        # the row after on_train_batch_end (what it logs is in it), before the validation
        + FIRST + ["on_before_optimizer_step", "on_train_batch_end", "on_train_log"] + VALIDATION_2
        + FIRST + ["on_before_optimizer_step", "on_train_batch_end"]
        + FIRST + ["on_before_optimizer_step", "on_train_batch_end", "on_train_log"] + VALIDATION_2
        + FIRST + ["on_before_optimizer_step", "on_train_batch_end"]  # batch 5 of 5: no multiple of 2, no validation
        + ["on_train_epoch_end", "on_train_end", "on_fit_end", "teardown"]
    )
    assert rec.events == expected


def test_no_validation_hooks_without_a_validation_loader_or_with_limit_val_batches_0():
    rec, _ = _fit(max_epochs=1, limit_train_batches=2, limit_val_batches=0)
    assert not [e for e in rec.events if "validation" in e]
    assert rec.events.count("on_train_batch_end") == 2


@pytest.mark.parametrize(
    ("stage", "phase", "limit"),
    [("validate", "validation", "limit_val_batches"), ("test", "test", "limit_test_batches"), ("predict", "predict", "limit_predict_batches")],
)
def test_validate_test_and_predict_run_their_own_hooks_once_per_batch(stage, phase, limit):
    rec = Recorder()
    trainer = Trainer(**quiet(callbacks=[rec], **{limit: 3}))
    getattr(trainer, stage)(Classifier(), loader(64, batch_size=8))
    per_batch = [f"on_{phase}_batch_start", f"on_{phase}_batch_end"] * 3
    assert rec.events == (
        ["setup", f"on_{phase}_start", f"on_{phase}_epoch_start"] + per_batch
        + [f"on_{phase}_epoch_end", f"on_{phase}_end", "teardown"]
    )


def test_user_callbacks_run_in_the_order_given_before_the_built_in_checkpoint():
    first, second = Recorder(), Recorder()
    order: list[str] = []
    first.events = _Tagged(order, "first")
    second.events = _Tagged(order, "second")
    trainer = Trainer(max_epochs=1, enable_progress_bar=False, log_dir=None, callbacks=[first, second], limit_train_batches=2)
    trainer.fit(Classifier(), loader(64, batch_size=8))
    end = order.index("first:on_train_epoch_end")
    # The epoch's checkpoint is written by the built-in ModelCheckpoint, which runs after both.
    assert order[end:end + 4] == [
        "first:on_train_epoch_end", "second:on_train_epoch_end", "first:on_save_checkpoint", "second:on_save_checkpoint",
    ]
    assert order.count("first:on_save_checkpoint") == 1


class _Tagged(list):
    def __init__(self, sink: list[str], tag: str) -> None:
        super().__init__()
        self.sink, self.tag = sink, tag

    def append(self, name: str) -> None:
        self.sink.append(f"{self.tag}:{name}")


class FailsAtBatch2(Classifier):
    def training_step(self, batch, batch_idx):
        if batch_idx == 2:
            raise RuntimeError("boom at batch 2")
        return super().training_step(batch, batch_idx)


def test_an_error_runs_on_exception_then_teardown_and_propagates():
    rec = Recorder()
    seen: list[BaseException] = []
    rec.on_exception = lambda trainer, module, err: (rec.events.append("on_exception"), seen.append(err))
    trainer = Trainer(**quiet(callbacks=[rec], max_epochs=1))
    with pytest.raises(RuntimeError, match="boom at batch 2"):
        trainer.fit(FailsAtBatch2(), loader(64, batch_size=8))
    assert rec.events[-3:] == ["on_train_batch_start", "on_exception", "teardown"]
    assert rec.events.count("on_train_batch_end") == 2
    assert isinstance(seen[0], RuntimeError)


def test_hooks_receive_the_trainer_module_and_loop_values():
    got: dict[str, tuple] = {}

    class Args(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            got.setdefault("batch_end", (trainer, module, outputs, batch_idx))

        def on_before_backward(self, trainer, module, loss):
            got.setdefault("loss", loss)

        def on_before_optimizer_step(self, trainer, module, optimizer):
            got.setdefault("optimizer", optimizer)

    model = Classifier()
    trainer = Trainer(**quiet(callbacks=[Args()], max_steps=1))
    trainer.fit(model, loader(64, batch_size=8))
    t, m, outputs, batch_idx = got["batch_end"]
    assert t is trainer and m is model and batch_idx == 0
    # Lightning's outputs: {"loss": the loss}, detached (a callback that keeps it keeps no graph)
    assert set(outputs) == {"loss"} and torch.equal(outputs["loss"], got["loss"].detach())
    assert not outputs["loss"].requires_grad and outputs["loss"].ndim == 0
    assert got["optimizer"] is trainer.optimizer


class LogWatcher(Callback):
    def __init__(self) -> None:
        self.calls: list[tuple[int, dict[str, float]]] = []

    def on_train_log(self, trainer, module, metrics):
        self.calls.append((trainer.global_step, metrics))


class RecordsItsLoss(Classifier):
    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)  # logs train_loss
        self.losses.append(loss.item())
        return loss


def test_on_train_log_runs_every_log_every_n_steps_optimizer_steps_with_the_logged_floats():
    watcher, model = LogWatcher(), RecordsItsLoss()
    trainer = Trainer(**quiet(callbacks=[watcher], max_epochs=1, accumulate_grad_batches=2, log_every_n_steps=2))
    trainer.fit(model, loader(64, batch_size=8))  # 8 batches, 4 optimizer steps
    # Once per logged optimizer step, not once per micro-batch, with the step's last micro-batch's value.
    assert [step for step, _ in watcher.calls] == [2, 4]
    assert [m["train_loss"] for _, m in watcher.calls] == [model.losses[3], model.losses[7]]
    assert all(set(m) == {"train_loss"} and type(m["train_loss"]) is float for _, m in watcher.calls)


def test_two_stateful_callbacks_with_one_state_key_are_refused_and_generated_keys_tell_them_apart():
    import pytest

    from callbacks import EarlyStopping
    from trainer import Trainer

    # Lightning's RuntimeError, at construction: a checkpoint would keep only one of the two states
    with pytest.raises(RuntimeError, match=r"Found more than one stateful callback of type `EarlyStopping`.*"
                       r"state_key \"EarlyStopping\{'monitor': 'val_loss', 'mode': 'min'\}\""):
        Trainer(callbacks=[EarlyStopping("val_loss"), EarlyStopping("val_loss", patience=5)])
    Trainer(callbacks=[EarlyStopping("val_loss"), EarlyStopping("val_acc")])  # two keys: accepted

    class Counter(EarlyStopping):
        @property
        def state_key(self):
            return self._generate_state_key(monitor=self.monitor, patience=self.patience)

    assert Counter("a", patience=2).state_key.endswith("Counter{'monitor': 'a', 'patience': 2}")  # the class's __qualname__


class Order(Callback):
    """Records the checkpoint hooks, with the module's own, in the order they run."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    @property
    def state_key(self) -> str:
        return self._generate_state_key(name=self.name)

    def state_dict(self):
        self.log.append(f"{self.name}.state_dict")
        return {"name": self.name}

    def load_state_dict(self, state_dict):
        self.log.append(f"{self.name}.load_state_dict")

    def on_save_checkpoint(self, trainer, module, checkpoint):
        self.log.append(f"{self.name}.on_save_checkpoint")
        assert checkpoint["callbacks"][self.state_key] == {"name": self.name}  # every state_dict() is taken first

    def on_load_checkpoint(self, trainer, module, checkpoint):
        self.log.append(f"{self.name}.on_load_checkpoint")
        assert torch.equal(module.net[0].weight, checkpoint["state_dict"]["net.0.weight"])  # the weights are back


def test_checkpoint_hooks_run_in_lightnings_order():
    log: list[str] = []

    class Model(Classifier):
        def on_save_checkpoint(self, checkpoint):
            log.append("module.on_save_checkpoint")

        def on_load_checkpoint(self, checkpoint):
            log.append("module.on_load_checkpoint")

    trainer = Trainer(**quiet(max_steps=2, callbacks=[Order("a", log), Order("b", log)]))
    trainer.fit(Model(), loader(32))
    log.clear()
    trainer.save_checkpoint("state.ckpt")
    assert log == [
        "a.state_dict", "b.state_dict", "a.on_save_checkpoint", "b.on_save_checkpoint", "module.on_save_checkpoint",
    ]
    log.clear()
    Trainer(**quiet(max_steps=4, callbacks=[Order("a", log), Order("b", log)])).fit(Model(), loader(32), ckpt_path="state.ckpt")
    assert log[:5] == [
        "module.on_load_checkpoint", "a.on_load_checkpoint", "b.on_load_checkpoint", "a.load_state_dict", "b.load_state_dict",
    ]


def test_a_callbacks_public_members_are_lightnings_hooks_so_code_that_wraps_each_one_works():
    from callbacks import LambdaCallback

    public = {m for m in dir(Callback) if not m.startswith("_")}
    assert "wants" not in public and {"setup", "on_train_batch_end", "state_dict", "state_key"} <= public
    assert "on_train_log" not in public  # ours, not Lightning's: called where a callback defines it
    hooks = public - {"state_key", "state_dict", "load_state_dict"}
    calls = set()
    wrapped = LambdaCallback(**{h: (lambda h: lambda *a, **k: calls.add(h))(h) for h in hooks})
    trainer = Trainer(**quiet(max_epochs=1, limit_train_batches=1, callbacks=[wrapped]))
    trainer.fit(Classifier(), loader(32), loader(32))  # one step: no logging step (log_every_n_steps=50)
    trainer.test(Classifier(), loader(32))
    trainer.predict(Classifier(), loader(32))
    # Every public hook runs in a short fit, test and predict, but those of a failure and of checkpoints
    # (Lightning's test raises in a resumed fit for them).
    assert hooks - calls == {"on_exception", "on_save_checkpoint", "on_load_checkpoint"}


def test_lambda_callback_takes_on_train_log_though_the_base_class_lacks_it():
    from callbacks import LambdaCallback

    steps = []
    wrapped = LambdaCallback(on_train_log=lambda trainer, module, metrics: steps.append(trainer.global_step))
    Trainer(**quiet(max_epochs=1, log_every_n_steps=2, callbacks=[wrapped])).fit(Classifier(), loader(64))
    assert steps == [2, 4]


def test_a_subclass_wants_from_0_1_0_is_still_asked():
    class OnlyEpochs(Callback):
        def __init__(self):
            self.batches = 0

        def wants(self, hook):
            return hook != "on_train_batch_end"

        def on_train_batch_end(self, *args):
            self.batches += 1

    cb = OnlyEpochs()
    Trainer(**quiet(max_epochs=1, callbacks=[cb])).fit(Classifier(), loader(32))
    assert cb.batches == 0


def test_a_mock_with_the_callback_spec_gets_every_hook_as_in_lightning():
    from unittest.mock import Mock

    mock = Mock(spec=Callback)
    Trainer(**quiet(max_epochs=1, callbacks=[mock])).fit(Classifier(), loader(32))
    called = {c[0] for c in mock.method_calls}
    assert {"setup", "on_fit_start", "on_train_batch_end", "on_train_epoch_end", "on_fit_end", "teardown"} <= called


def test_a_subclass_wants_hook_skips_a_hook_and_callbacks_public_members_stay_lightnings():
    class OnlyEpochs(Callback):
        def __init__(self):
            self.batches = self.epochs = 0

        def wants_hook(self, hook):
            return hook != "on_train_batch_end"

        def on_train_batch_end(self, *args):
            self.batches += 1

        def on_train_epoch_end(self, *args):
            self.epochs += 1

    cb = OnlyEpochs()
    Trainer(**quiet(max_epochs=2, callbacks=[cb])).fit(Classifier(), loader(32))
    assert (cb.batches, cb.epochs) == (0, 2)
    assert not {"wants_hook", "wait_for_saves", "restore_param_groups", "tune_before_stage"} & set(dir(Callback))
