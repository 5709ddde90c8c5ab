"""Bad input gets a sentence before training starts: it names the argument, shows the value and
says what to do. Extends test_errors.py (the first table) to every public argument.

Each row is (what the user wrote, the error class, words the message must contain).
"""

from __future__ import annotations


import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

from callbacks import Callback, ModelCheckpoint, ProgressBar
from strategies import DataParallelStrategy, DDPStrategy, SingleDeviceStrategy
from tests._models import Classifier, dataset, loader, quiet
from trainer import CheckpointError, MisconfigurationException, Trainer

NO_CUDA = not torch.cuda.is_available()


# --- construction: Trainer, strategies, callbacks --------------------------------------------
@pytest.mark.parametrize(
    "build, error, words",
    [
        # unknown names suggest the closest valid one
        (lambda: Trainer(strategy="DDP"), ValueError, ["'DDP'", "Did you mean 'ddp'"]),
        (lambda: Trainer(strategy="singel"), ValueError, ["'singel'", "'single'"]),
        (lambda: Trainer(strategy=None), TypeError, ["strategy=None", "Strategy instance"]),
        (lambda: Trainer(precision="bf16_mixed"), ValueError, ["precision='bf16_mixed'", "Did you mean 'bf16-mixed'"]),
        (lambda: Trainer(precision=8), ValueError, ["precision=8", "'32-true'", "'bf16-mixed'"]),
        (lambda: Trainer(gradient_clip_algorithm="nrom"), ValueError, ["'nrom'", "Did you mean 'norm'"]),
        # devices that do not exist, or more devices than the strategy runs on
        pytest.param(lambda: Trainer(devices=[7]), ValueError, ["devices=[7]", "CUDA device 7 does not exist", "devices=1 or 'auto'"], marks=pytest.mark.skipif(not NO_CUDA, reason="needs no GPU")),
        pytest.param(lambda: Trainer(strategy="dp", devices=[7]), ValueError, ["devices=[7]", "does not exist"], marks=pytest.mark.skipif(not NO_CUDA, reason="needs no GPU")),
        (lambda: Trainer(strategy="ddp", devices=[7, 8]), ValueError, ["devices=[7, 8]", "CUDA device 7, 8 does not exist", "devices=<count>"]),
        (lambda: Trainer(strategy="single", devices=2), ValueError, ["devices=2", "strategy='single'", "strategy='ddp'"]),
        (lambda: Trainer(strategy=SingleDeviceStrategy(), devices=[0, 1]), ValueError, ["devices=[0, 1]", "one device"]),
        (lambda: Trainer(devices=[0, 0]), ValueError, ["devices=[0, 0]", "twice"]),
        (lambda: Trainer(devices=[]), ValueError, ["devices=[]"]),
        (lambda: Trainer(devices=1.0), TypeError, ["devices=1.0"]),
        (lambda: Trainer(devices=True), TypeError, ["devices=True"]),
        # counts: non-positive or not an int
        (lambda: Trainer(max_epochs=True), TypeError, ["max_epochs=True", "int"]),
        (lambda: Trainer(max_steps="10"), TypeError, ["max_steps='10'"]),
        (lambda: Trainer(max_steps=-2), ValueError, ["max_steps=-2", ">= 1"]),  # -1 is Lightning's "no limit"
        (lambda: Trainer(accumulate_grad_batches=2.0), TypeError, ["accumulate_grad_batches=2.0"]),
        (lambda: Trainer(log_every_n_steps=-5), ValueError, ["log_every_n_steps=-5"]),
        (lambda: Trainer(check_val_every_n_epoch=0), ValueError, ["check_val_every_n_epoch=0"]),
        (lambda: Trainer(val_check_interval=0.0), ValueError, ["val_check_interval=0.0", "(0, 1]"]),
        (lambda: Trainer(val_check_interval=0), ValueError, ["val_check_interval=0"]),
        (lambda: Trainer(limit_train_batches=-1), ValueError, ["limit_train_batches=-1"]),
        (lambda: Trainer(limit_test_batches="all"), TypeError, ["limit_test_batches='all'"]),
        (lambda: Trainer(gradient_clip_val=float("nan")), ValueError, ["gradient_clip_val=nan", "finite"]),
        (lambda: Trainer(gradient_clip_val=float("inf")), ValueError, ["gradient_clip_val=inf", "finite"]),
        (lambda: Trainer(seed=-1), ValueError, ["seed=-1"]),
        (lambda: Trainer(seed=2**32), ValueError, ["seed=4294967296", "2**32"]),
        (lambda: Trainer(seed=1.5), TypeError, ["seed=1.5"]),
        # flags, names, paths, callables
        (lambda: Trainer(deterministic=1), TypeError, ["deterministic=1", "True or False"]),
        (lambda: Trainer(enable_checkpointing="yes"), TypeError, ["enable_checkpointing='yes'"]),  # None is Lightning's default
        (lambda: Trainer(name=".."), ValueError, ["name='..'", "run folder"]),
        (lambda: Trainer(name="a/b"), ValueError, ["name='a/b'"]),
        (lambda: Trainer(name=3), TypeError, ["name=3"]),
        (lambda: Trainer(log_dir=["runs"]), TypeError, ["log_dir=['runs']", "None"]),
        (lambda: Trainer(optimizer=torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)), TypeError, ["optimizer=", "callable"]),
        (lambda: Trainer(callbacks=5), TypeError, ["callbacks=5", "list"]),
        (lambda: Trainer(callbacks="abc"), TypeError, ["callbacks='abc'"]),
        (lambda: Trainer(callbacks=[ModelCheckpoint]), TypeError, ["class ModelCheckpoint", "ModelCheckpoint()"]),
        (lambda: Trainer(callbacks=[print]), TypeError, ["callbacks contains", "Callback"]),
        (lambda: Trainer(callbacks=[object()]), TypeError, [
            "callbacks contains <object object", "not a callbacks.Callback", "Subclass callbacks.Callback",
            "Trainer(callbacks=[MyCallback()])",
        ]),
        # strategies' own arguments
        (lambda: DDPStrategy(timeout=0), ValueError, ["timeout=0", "> 0"]),
        (lambda: DDPStrategy(timeout=float("inf")), ValueError, ["timeout=inf", "finite"]),
        (lambda: DDPStrategy(timeout=float("nan")), ValueError, ["timeout=nan"]),
        (lambda: DDPStrategy(timeout="5"), TypeError, ["timeout='5'", "seconds"]),
        (lambda: DDPStrategy(backend="ncll"), ValueError, ["backend='ncll'", "Did you mean 'nccl'"]),
        (lambda: DDPStrategy(start_method="thread"), ValueError, ["start_method='thread'", "spawn"]),
        (lambda: DDPStrategy(find_unused_parameters="yes"), TypeError, ["find_unused_parameters='yes'"]),
        (lambda: DataParallelStrategy(device_ids="0,1"), ValueError, ["device_ids='0,1'", "[0, 1]"]),
        (lambda: DataParallelStrategy(device_ids=[0, -1]), ValueError, ["device_ids=[0, -1]", "[0, 1]"]),
        (lambda: DDPStrategy(device_ids=[]), ValueError, ["device_ids=[]", "[0, 1]"]),
        (lambda: DataParallelStrategy(output_device="cuda:0"), TypeError, ["output_device='cuda:0'", "CUDA index"]),
        (lambda: SingleDeviceStrategy(device="gpu0"), ValueError, ["device='gpu0'", "'cuda:1'"]),
        pytest.param(lambda: SingleDeviceStrategy(device="cuda:3"), ValueError, ["cuda:3", "does not exist"], marks=pytest.mark.skipif(not NO_CUDA, reason="needs no GPU")),
        # callbacks' own arguments
        (lambda: ModelCheckpoint(mode="mxa"), ValueError, ["`mode` can be min, max but got mxa", "'mxa'", "Did you mean 'max'"]),  # Lightning's first
        (lambda: ModelCheckpoint(every_n_train_steps=1, every_n_epochs=2), MisconfigurationException,
         ["Combination of parameters every_n_train_steps=1, every_n_epochs=2 and train_time_interval=None should be mutually exclusive",
          "pass at most one of every_n_train_steps"]),
        (lambda: ModelCheckpoint(save_top_k=-2), ValueError, ["save_top_k", "-2", ">= -1"]),
        (lambda: ModelCheckpoint(every_n_epochs=-1), ValueError, ["every_n_epochs", "-1"]),
        (lambda: ModelCheckpoint(every_n_train_steps=1.5), TypeError, ["every_n_train_steps", "1.5"]),
        (lambda: ModelCheckpoint(filename="{epoch"), ValueError, ["filename='{epoch'", "{val_loss:.3f}"]),
        (lambda: ModelCheckpoint(monitor=3), TypeError, ["monitor=3"]),
        (lambda: ModelCheckpoint(dirpath=3), TypeError, ["dirpath=3"]),
        (lambda: ModelCheckpoint(save_last="yes"), TypeError, ["save_last", "'yes'"]),
        (lambda: ProgressBar(refresh_s=0), ValueError, ["refresh_s", "0", "> 0"]),
        (lambda: ProgressBar(line_every_s="x"), TypeError, ["line_every_s", "'x'"]),
    ],
)
def test_bad_arguments_fail_at_construction(build, error, words):
    with pytest.raises(error) as info:
        build()
    for word in words:
        assert word in str(info.value), f"{word!r} not in: {info.value}"


# --- the start of fit (and validate/test/predict) ---------------------------------------------
class NoBatches(IterableDataset):
    """An iterable dataset without __len__ that yields nothing."""

    def __iter__(self):
        return iter(())


class Epochs(Callback):
    """Fails the test if fit starts a 4th epoch: an empty epoch must end fit, not loop forever."""

    def __init__(self) -> None:
        self.started = self.batches = 0

    def on_train_epoch_start(self, trainer, module):
        self.started += 1
        assert self.started <= 3, "fit kept starting empty epochs"

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.batches += 1


def one_pass():
    yield from loader(32, 16)  # a generator: 2 batches, then exhausted for good


class Returns(Classifier):
    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return {"float": loss.item(), "no loss key": {"los": loss}, "int tensor": torch.tensor(1)}[self.what]


class Optimizers(Classifier):
    def __init__(self, what: str) -> None:
        super().__init__()
        self.what = what

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return {
            "two optimizers": [opt, torch.optim.Adam(self.parameters())],
            "scheduler without step": (opt, "cosine"),
            "unknown key": {"optimizer": opt, "scheduler": None},
            "bad interval": {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1), "interval": "batch"},
            "plateau without monitor": (opt, torch.optim.lr_scheduler.ReduceLROnPlateau(opt)),
            "scheduler of another optimizer": ([opt], [torch.optim.lr_scheduler.StepLR(torch.optim.SGD(self.parameters(), lr=0.1), 1)]),
            "plateau on a metric never logged": {"optimizer": opt, "lr_scheduler": {
                "scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(opt), "monitor": "giraffe"}},
            "none": None,
        }[self.what]


def checkpoint_files(tmp_path):
    """A missing path, a folder, a text file, a tensor, an empty file and a cut-off checkpoint."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "notes.txt").write_text("epoch 3 looked good\n")
    torch.save(torch.ones(3), tmp_path / "tensor.pt")
    (tmp_path / "empty.ckpt").write_bytes(b"")
    good = tmp_path / "good.ckpt"  # a real archive, but weights only
    torch.save({"model": Classifier().state_dict()}, good)
    (tmp_path / "cut.ckpt").write_bytes(good.read_bytes()[: good.stat().st_size // 2])


@pytest.mark.parametrize(
    "case, error, words",
    [
        # loaders that are not loaders, or yield nothing
        (dict(train="data.csv"), TypeError, ["train_dataloaders='data.csv'", "DataLoader"]),
        (dict(train=dataset(8)), TypeError, ["train_dataloaders=", "not iterable", "DataLoader"]),
        (dict(train=DataLoader(dataset(4), batch_size=8, drop_last=True)), ValueError, ["train_dataloaders is empty", "drop_last"]),
        (dict(val=DataLoader(dataset(4), batch_size=8, drop_last=True)), ValueError, ["val_dataloaders is empty"]),
        (dict(train=DataLoader(NoBatches(), batch_size=2), options=dict(max_steps=5)), ValueError, ["yielded no batches in epoch 0", "never end"]),
        # training_step returns something that is not a loss
        (dict(model=Returns("float")), TypeError, ["training_step returned float", "scalar tensor"]),
        (dict(model=Returns("no loss key")), TypeError, ["training_step returned dict", "'loss'"]),
        (dict(model=Returns("int tensor")), ValueError, ["does not require grad"]),
        # configure_optimizers returns something unusable
        (dict(model=Optimizers("two optimizers")), ValueError, ["configure_optimizers() returned 2 optimizers", "automatic optimization steps one"]),
        (dict(model=Optimizers("scheduler without step")), TypeError, ["'cosine'", "no step() method"]),
        (dict(model=Optimizers("unknown key")), ValueError, ["unknown keys ['scheduler']", "lr_scheduler="]),
        (dict(model=Optimizers("bad interval")), ValueError, ["interval='batch'", "'epoch' or 'step'"]),
        (dict(model=Optimizers("plateau without monitor")), ValueError, ["ReduceLROnPlateau", "monitor="]),
        (dict(model=Optimizers("scheduler of another optimizer")), MisconfigurationException,
         ["Some schedulers are attached with an optimizer that wasn't returned from `configure_optimizers`.", "StepLR steps an optimizer"]),
        # Lightning's sentence first, after the first epoch (that is when the scheduler steps)
        (dict(model=Optimizers("plateau on a metric never logged"), options=dict(max_steps=None, max_epochs=1), trained=2),
         MisconfigurationException, ["ReduceLROnPlateau conditioned on metric giraffe which is not available. Available metrics are: "
                                     "['train_loss']", "self.log('giraffe', value)", "'strict': False"]),
        (dict(model=Optimizers("none"), options=dict(optimizer=lambda: None)), TypeError, ["Trainer(optimizer=", "takes 0 positional", "lambda params"]),
        (dict(model=Optimizers("none"), options=dict(optimizer=lambda params: "adam")), TypeError, ["Trainer(optimizer=...) returned 'adam'", "not usable"]),
        # a monitored metric that is never logged names the ones that are
        (dict(options=dict(callbacks=[ModelCheckpoint(dirpath="ckpts", monitor="val_acc")]), trained=2), ValueError, ["monitor='val_acc'", "never logged", "['train_loss']"]),
        # ckpt_path: missing, not a file, not a checkpoint
        (dict(ckpt="missing.ckpt"), ValueError, ["ckpt_path='missing.ckpt' does not exist", "'last'"]),
        (dict(ckpt="missing.ckpt"), FileNotFoundError, ["ckpt_path='missing.ckpt' does not exist"]),  # Lightning's type too
        (dict(ckpt="folder"), ValueError, ["ckpt_path='folder' is a folder", "last.ckpt"]),
        (dict(ckpt="notes.txt"), CheckpointError, ["ckpt_path='notes.txt' is not a checkpoint", "zip archive"]),
        (dict(ckpt="empty.ckpt"), CheckpointError, ["ckpt_path='empty.ckpt' is not a checkpoint"]),
        (dict(ckpt="cut.ckpt"), CheckpointError, ["ckpt_path='cut.ckpt' is not a checkpoint", "cut off"]),
        (dict(ckpt="tensor.pt"), CheckpointError, ["'tensor.pt' is not a trainer checkpoint", "'state_dict'"]),
        (dict(ckpt="good.ckpt"), CheckpointError, ["'good.ckpt' holds the model's weights only", "test(ckpt_path=...)"]),
        (dict(ckpt=3), TypeError, ["ckpt_path=3", "'last'"]),
        # (precision="16-mixed" on a CPU runs bf16-mixed, with Lightning's warning: tests/trainer/test_lightning_arguments.py)
    ],
)
def test_bad_fit_input_fails_before_training(case, error, words, tmp_path):
    checkpoint_files(tmp_path)
    epochs = Epochs()
    options = {"max_steps": 2, **case.get("options", {})}
    options["callbacks"] = [epochs, *options.get("callbacks", [])]
    trainer = Trainer(**quiet(enable_checkpointing=True, **options))
    with pytest.raises(error) as info:
        trainer.fit(case.get("model", Classifier()), case.get("train", loader(32, 16)), case.get("val"), ckpt_path=case.get("ckpt"))
    for word in words:
        assert word in str(info.value), f"{word!r} not in: {info.value}"
    # Nothing trained, except where the problem only shows after an epoch (a monitor, a one-pass iterator).
    assert epochs.batches == case.get("trained", 0)


class PlateauOnAMetricNeverLogged(Classifier):
    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": scheduler, "monitor": "giraffe", "strict": False}}


def test_a_plateau_scheduler_with_strict_false_skips_its_step_with_lightnings_warning():
    model = PlateauOnAMetricNeverLogged()
    trainer = Trainer(**quiet(max_epochs=2))
    with pytest.warns(RuntimeWarning, match=r"^ReduceLROnPlateau conditioned on metric giraffe which is not available but "
                      r"strict is set to `False`\. Skipping learning rate update\.$"):
        trainer.fit(model, loader(32, 16))
    assert trainer.global_step == 4  # trained on
    assert trainer.lr_scheduler_configs[0].scheduler.last_epoch == 0  # never stepped


def test_validate_test_predict_check_their_input():
    trainer = Trainer(**quiet())
    with pytest.raises(TypeError, match=r"trainer.validate\(\) has no data: dataloaders=None, and no datamodule= "
                       r"was given and Classifier does not define val_dataloader\(\)"):
        trainer.validate(Classifier(), None)
    with pytest.raises(TypeError, match=r"dataloaders=5 is not iterable"):
        trainer.validate(Classifier(), 5)
    with pytest.raises(ValueError, match=r"dataloaders is empty"):
        trainer.test(Classifier(), [])
    class NoValidation(Classifier):
        validation_step = None

    with pytest.raises(TypeError, match=r"trainer.validate\(\) needs NoValidation.validation_step"):
        trainer.validate(NoValidation(), loader())
    with pytest.raises(TypeError, match=r"model must be a torch.nn.Module"):
        trainer.predict("model", loader())


# A DDP script without the __main__ guard: tests/strategies/test_ddp.py runs one for real
# (test_a_script_without_the_main_guard_fails_with_the_explanation).


# --- a loader that yields None ----------------------------------------------------------------
class NoneAt(torch.utils.data.Dataset):
    """Samples of a TensorDataset, and None for index ``bad``: a __getitem__ that gave up on a sample."""

    def __init__(self, bad: int) -> None:
        self.data, self.bad = dataset(32), bad

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i):
        return None if i == self.bad else self.data[i]


def _none_loader(bad: int) -> DataLoader:
    # batch_size=None: each sample is a batch, so the None reaches the step as the batch itself.
    return DataLoader(NoneAt(bad), batch_size=None)


def test_a_training_loader_that_yields_none_skips_that_batch_with_lightnings_warning():
    seen = []

    class Seen(Classifier):
        def training_step(self, batch, batch_idx):
            seen.append(batch_idx)
            return super().training_step(batch, batch_idx)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            seen.append((batch_idx, outputs is None))

    model = Seen()
    before = [p.clone() for p in model.parameters()]
    with pytest.warns(UserWarning, match=r"train_dataloader yielded None\. If this was on purpose, ignore this warning"):
        trainer = Trainer(**quiet(max_epochs=1, limit_train_batches=3))
        trainer.fit(model, _none_loader(1))
    assert seen == [0, (0, False), (1, True), 2, (2, False)]  # no step for batch 1, and its outputs are None
    assert trainer.global_step == 2
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_an_evaluation_loader_that_yields_none_names_which_of_several():
    with pytest.raises(TypeError, match=r"The validation loader 1 \(dataloader_idx=1\) yielded None as batch 3, so "
                                        r"validation_step received batch=None \(batch_idx=3\)"):
        Trainer(**quiet()).validate(Classifier(), [loader(16), _none_loader(3)], verbose=False)
    with pytest.raises(TypeError, match=r"The test loader yielded None as batch 0"):
        Trainer(**quiet()).test(Classifier(), _none_loader(0), verbose=False)


def test_a_step_that_fails_on_a_real_batch_keeps_its_own_error():
    class Broken(Classifier):
        def training_step(self, batch, batch_idx):
            raise KeyError("mine")

    with pytest.raises(KeyError, match="mine"):
        Trainer(**quiet(max_epochs=1)).fit(Broken(), loader(16))


class FirstEpochOnly(IterableDataset):
    """Yields in epoch 0 only, as Lightning's test_iterable_dataset_stop_iteration_at_epoch_beginning."""

    def __init__(self, model):
        self.model = model

    def __iter__(self):
        if self.model.current_epoch == 0:
            yield from dataset(4)


def test_an_epoch_without_batches_is_skipped_with_a_warning_when_fit_has_an_epoch_limit():
    model = Classifier()
    trainer = Trainer(**quiet(max_epochs=3))
    with pytest.warns(UserWarning, match=r"train_dataloaders yielded no batches in epoch 1\. .*The epoch is skipped"):
        trainer.fit(model, DataLoader(FirstEpochOnly(model), batch_size=2))
    assert (trainer.global_step, trainer.current_epoch) == (2, 3)  # Lightning's
    trainer = Trainer(**quiet(max_epochs=3))
    with pytest.warns(UserWarning, match=r"no batches in epoch 1\. It is an iterator .* pass a DataLoader"):
        trainer.fit(Classifier(), one_pass())
    assert (trainer.global_step, trainer.current_epoch) == (2, 3)
