"""strategy="ddp" with real gloo processes on this CPU: spawned from a script, started by
torchrun (one node and two "nodes"), failures, and the `__main__` guard.

Each spawn or torchrun start costs seconds (fresh interpreters import torch), so each test
checks everything one start can show.
"""

from __future__ import annotations

import copy
import multiprocessing
import os
import pickle
import subprocess
import sys
import time

import pytest
import torch
from torch.multiprocessing.spawn import ProcessRaisedException
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import (
    BatchSampler, DataLoader, Dataset, DistributedSampler, RandomSampler, SequentialSampler, WeightedRandomSampler,
)

from callbacks import Callback
from strategies import DDPStrategy, WorkerError
from strategies._spawn import free_port
from tests._models import Classifier, dataset, loader, quiet
from tests.conftest import requires_cuda
from trainer import Trainer, TrainModule

pytestmark = pytest.mark.slow
ATOL = 1e-5


# --- module level, so that the spawned workers can unpickle them --------------------------
def _decay(step: int) -> float:
    return 1.0 / (1 + step)


class Scheduled(Classifier):
    """SGD whose LR falls every optimizer step: a scheduler stepped once per rank, or per
    micro-batch, would give other weights."""

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.5)
        return {"optimizer": optimizer, "lr_scheduler": LambdaLR(optimizer, _decay), "interval": "step"}


class GradSync(Callback):
    """After each backward: do all ranks hold the same gradients? Rank 0's record returns to
    the caller through state_dict."""

    def __init__(self) -> None:
        self.same_on_all_ranks: list[bool] = []

    def on_after_backward(self, trainer, module) -> None:
        grads = torch.cat([p.grad.flatten() for p in module.parameters()])
        everyone = trainer.strategy.gather_objects(grads)
        self.same_on_all_ranks.append(all(torch.equal(everyone[0], g) for g in everyone[1:]))

    def state_dict(self):
        return {"same_on_all_ranks": self.same_on_all_ranks}

    def load_state_dict(self, state_dict) -> None:
        self.same_on_all_ranks = state_dict["same_on_all_ranks"]


class FailsAtStep3(Classifier):
    def training_step(self, batch, batch_idx):
        if self.trainer.global_step == 3 and self.trainer.strategy.global_rank == 1:
            with open("failed_at", "w") as f:
                f.write(repr(time.time()))
            raise RuntimeError("the disk ate my batch")
        return super().training_step(batch, batch_idx)


class Indexed(Dataset):
    """Sample i is (tensor([i]), i): a batch says which samples it holds."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int):
        return torch.tensor([float(i)]), i


class Regressor(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Linear(1, 1)

    def training_step(self, batch, batch_idx):
        return self.w(batch[0]).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


class SeenBatches(Callback):
    """Every rank's training batches as lists of sample indices, gathered to rank 0 at the end."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, int, list[int]]] = []  # (epoch, rank, indices)

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        indices = torch.as_tensor(batch[1]).reshape(-1).tolist()
        self.seen.append((trainer.current_epoch, trainer.strategy.global_rank, indices))

    def on_train_end(self, trainer, module) -> None:
        self.seen = [s for part in trainer.strategy.gather_objects(self.seen) for s in part]

    def state_dict(self):
        return {"seen": self.seen}

    def load_state_dict(self, state_dict) -> None:
        self.seen = state_dict["seen"]


# --- helpers ------------------------------------------------------------------------------
def _one_device(batch_size: int, **options) -> tuple[Classifier, Trainer]:
    torch.manual_seed(0)
    model = Classifier()
    trainer = Trainer(strategy="single", max_epochs=2, **quiet(**options))
    trainer.fit(model, loader(n=64, batch_size=batch_size))
    return model, trainer


def _assert_same_weights(state: dict, model: torch.nn.Module) -> None:
    assert set(state) == set(model.state_dict())
    for name, value in model.state_dict().items():
        assert torch.allclose(state[name], value, atol=ATOL), name


def _child_pids() -> list[int]:
    """Live children of this process, from /proc (multiprocessing's resource tracker and fork server aside)."""
    me, children = str(os.getpid()), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
        except OSError:
            continue  # it exited meanwhile
        if ppid == me and b"resource_tracker" not in cmdline and b"forkserver" not in cmdline:
            children.append(int(entry))
    return children


def _run_all(commands: list[list[str]], env: dict, cwd, timeout: float) -> list[tuple[int, str]]:
    """Run commands side by side; return (exit code, output) for each. On timeout, kill their
    whole process groups (torchrun's workers too) and fail with the output so far."""
    procs, logs = [], []
    for i, cmd in enumerate(commands):
        log = open(os.path.join(cwd, f"command_{i}.log"), "w+")
        procs.append(subprocess.Popen(cmd, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        logs.append(log)
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
    results = []
    for proc, log in zip(procs, logs):
        log.seek(0)
        results.append((proc.returncode, log.read()))
        log.close()
    if any(code == -9 for code, _ in results):
        pytest.fail(f"timed out after {timeout} s:\n" + "\n---\n".join(out for _, out in results))
    return results


# --- spawned from a plain script ----------------------------------------------------------
def test_spawned_ddp_with_accumulation_equals_one_device_with_the_doubled_batch(capfd):
    clip = 0.05
    options = dict(accumulate_grad_batches=2, gradient_clip_val=clip, log_every_n_steps=1)
    torch.manual_seed(0)
    model = Scheduled()
    reference = copy.deepcopy(model)
    sync = GradSync()
    trainer = Trainer(strategy="ddp", devices=2, max_epochs=2, callbacks=[sync], **quiet(enable_checkpointing=True, **options))
    val = loader(n=13, batch_size=4)  # 13 samples: shards of 7 and 6, batches of 4, 3 | 4, 2
    trainer.fit(model, loader(n=64, batch_size=4), val)

    one = Trainer(strategy="single", max_epochs=2, **quiet(**options))
    one.fit(reference, loader(n=64, batch_size=8), val)
    assert float(one.grad_norm) > clip  # clipping was active, so clipping before the sync would show

    # The caller's model and trainer hold rank 0's results.
    _assert_same_weights(model.state_dict(), reference)
    assert (trainer.global_step, trainer.current_epoch) == (one.global_step, one.current_epoch) == (8, 2)
    assert set(trainer.callback_metrics) == set(one.callback_metrics) == {"train_loss", "val_loss", "val_acc"}
    for name, value in one.callback_metrics.numbers().items():
        # Epoch means are weighted by samples across ranks: an unweighted mean of the
        # ranks' validation means would differ, as the shards differ in size.
        assert trainer.callback_metrics.numbers()[name] == pytest.approx(value, abs=1e-6), name

    # no_sync on the accumulation micro-step, then one all-reduce before clipping and the step.
    assert sync.same_on_all_ranks == [False, True] * 8  # 8 micro-batches per epoch per rank

    # Only rank 0 wrote checkpoints, with the user's keys.
    assert sorted(os.listdir("checkpoints")) == ["epoch=1-step=8.ckpt"]
    saved = torch.load("checkpoints/epoch=1-step=8.ckpt", weights_only=True)["state_dict"]
    assert not any(key.startswith("module.") for key in saved)
    _assert_same_weights(saved, model)

    lines = [line for line in capfd.readouterr().err.splitlines() if "Training with ddp" in line]
    assert lines == [
        "[trainer] Training with ddp (gloo) on cpu; 2 device(s), world size 2; "
        "global batch 16 = 4 per device x 2 device(s) x 2 accumulation."
    ]


def test_a_users_batch_sampler_keeps_its_batch_size_and_shuffle_when_sharded():
    data = Indexed()
    seen = SeenBatches()
    trainer = Trainer(strategy="ddp", devices=2, max_epochs=2, callbacks=[seen], **quiet())
    trainer.fit(Regressor(), DataLoader(data, batch_sampler=BatchSampler(RandomSampler(data), 4, drop_last=False)))

    for epoch in (0, 1):
        batches = {rank: [b for e, r, b in seen.seen if (e, r) == (epoch, rank)] for rank in (0, 1)}
        assert [len(b) for b in batches[0]] == [len(b) for b in batches[1]] == [4, 4, 4]  # 24 samples, 12 per rank
        assert sorted(i for rank in (0, 1) for b in batches[rank] for i in b) == list(range(24))  # disjoint shards
    order = {epoch: [i for e, r, b in seen.seen if (e, r) == (epoch, 0) for i in b] for epoch in (0, 1)}
    assert order[0] != sorted(order[0]) and order[0] != order[1]  # shuffled, anew each epoch


def _rank_0_of_2() -> DDPStrategy:
    """A strategy as rank 0 of 2 sees itself, for process_dataloader paths with no collective."""
    strategy = DDPStrategy()
    strategy.global_rank, strategy.world_size = 0, 2
    return strategy


def test_a_users_batch_sampler_keeps_its_batches_in_evaluation_and_over_its_own_distributed_sampler():
    data = Indexed()
    val = _rank_0_of_2().process_dataloader(DataLoader(data, batch_sampler=BatchSampler(SequentialSampler(data), 5, False)), "validate")
    assert [b[1].tolist() for b in val] == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11]]  # rank 0's half, in batches

    own = DistributedSampler(data, num_replicas=2, rank=0, shuffle=True, seed=3)
    train = _rank_0_of_2().process_dataloader(DataLoader(data, batch_sampler=BatchSampler(own, 4, True)), "train")
    assert train.sampler is own and train.batch_size == 4 and train.drop_last  # kept, where set_epoch reaches it


@pytest.mark.parametrize(
    "batch_sampler, named",
    [
        (BatchSampler(WeightedRandomSampler([1.0] * 24, 24), 4, False), "WeightedRandomSampler"),
        ([[0, 1], [2, 3, 4]], "list"),
    ],
)
def test_a_batch_sampler_that_cannot_be_sharded_is_refused_with_the_fix(batch_sampler, named):
    loader_ = DataLoader(Indexed(), batch_sampler=batch_sampler)
    with pytest.raises(ValueError) as info:
        _rank_0_of_2().process_dataloader(loader_, "train")
    message = str(info.value)
    assert "DataLoader(batch_sampler=" in message and named in message
    assert "DistributedSampler" in message and "batch_size=" in message


def test_a_rank_that_raises_stops_everything_quickly_with_its_rank_and_traceback():
    trainer = Trainer(strategy="ddp", devices=2, max_epochs=50, **quiet())
    # torch's ProcessRaisedException, which Lightning's ddp_spawn raises and its users catch
    with pytest.raises(ProcessRaisedException, match="the disk ate my batch") as info:
        trainer.fit(FailsAtStep3(), loader(n=64, batch_size=4))
    assert isinstance(info.value, WorkerError) and info.value.error_index == 1
    assert pickle.loads(pickle.dumps(info.value)).rank == 1
    raised_at = time.time()
    with open("failed_at") as f:
        failed_at = float(f.read())
    assert raised_at - failed_at < 30  # seconds after the failure, not a collective's timeout (5 min)
    assert info.value.rank == 1
    message = str(info.value)
    assert message.startswith("DDP rank 1 (of 2) failed:")
    assert "Traceback" in message and "in training_step" in message
    assert "RuntimeError: the disk ate my batch" in message
    assert multiprocessing.active_children() == []
    deadline = time.time() + 10  # a killed rank's teardown can lag on a loaded machine; a leaked one stays
    while _child_pids() and time.time() < deadline:
        time.sleep(0.1)
    assert _child_pids() == []


SCRIPT_WITHOUT_GUARD = """\
from tests._models import Classifier, loader, quiet
from trainer import Trainer

Trainer(strategy="ddp", devices=2, max_epochs=1, **quiet()).fit(Classifier(), loader())
"""


def test_a_script_without_the_main_guard_fails_with_the_explanation(tmp_path, script_env):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT_WITHOUT_GUARD)
    ((code, output),) = _run_all([[sys.executable, str(script)]], script_env, tmp_path, timeout=120)
    assert code != 0, output
    assert "strategies._spawn.WorkerError: DDP rank" in output
    assert 'must sit under `if __name__ == "__main__":`' in output  # the worker's own error
    assert "Each worker re-imports your script" in output


# --- started by torchrun ------------------------------------------------------------------
TORCHRUN_SCRIPT = '''\
"""Started by torchrun from tests/strategies/test_ddp.py: python script.py OUT MODE."""
import sys

import torch
from torch.utils.data import DataLoader, Dataset, Subset

from tests._models import Classifier, dataset, loader, quiet
from trainer import Trainer, TrainModule


class Logits(Classifier):
    def predict_step(self, batch, batch_idx):
        return self(batch[0])


class Indices(Dataset):
    def __len__(self):
        return 20

    def __getitem__(self, i):
        return torch.tensor([float(i)]), i


class RecordsIndices(TrainModule):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Linear(1, 1)
        self.seen = []

    def training_step(self, batch, batch_idx):
        x, index = batch
        self.seen.append((self.trainer.current_epoch, index.tolist()))
        return self.w(x).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def fit(out, strategy):
    torch.manual_seed(0)
    model = Classifier()
    trainer = Trainer(strategy=strategy, max_epochs=2, **quiet())
    trainer.fit(model, loader(n=64, batch_size=8))
    if torch.distributed.is_initialized():
        sys.exit("fit left its process group behind; the next fit in this process could not start")
    if trainer.is_global_zero:
        torch.save({
            "weights": model.state_dict(), "global_step": trainer.global_step,
            "strategy": type(trainer.strategy).__name__, "world_size": trainer.world_size,
        }, f"{out}/{strategy}.pt")
    return model, trainer


def main(out, mode):
    if mode == "fit":
        fit(out, "auto")
        return
    fit(out, "ddp")
    model, trainer = fit(out, "auto")  # the same processes fit again, then predict, validate, fit
    logits = Logits()
    logits.load_state_dict(model.state_dict())
    predictions = trainer.predict(logits, loader(n=13, batch_size=4))
    one_sample = trainer.validate(model, DataLoader(Subset(dataset(64), [5]), batch_size=4))  # rank 1: no data
    recorder = RecordsIndices()
    Trainer(strategy="ddp", max_epochs=2, seed=7, **quiet()).fit(recorder, DataLoader(Indices(), batch_size=3, shuffle=True))
    rank = trainer.strategy.global_rank
    torch.save(recorder.seen, f"{out}/seen_{rank}.pt")
    if rank == 0:
        torch.save({"predictions": torch.cat(predictions), "one_sample": one_sample}, f"{out}/eval.pt")
    else:  # gathered to rank 0 only
        torch.save({"predictions": predictions}, f"{out}/eval_{rank}.pt")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
'''


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def test_torchrun_one_node_ddp_and_auto_match_one_device(tmp_path, script_env):
    """One torchrun start: fit with "ddp", fit again with "auto" in the same processes,
    predict, validate with an empty shard, and fit with shuffling; then check each."""
    script = tmp_path / "script.py"
    script.write_text(TORCHRUN_SCRIPT)
    command = _torchrun("--standalone", "--nproc_per_node=2", str(script), str(tmp_path), "full")
    ((code, output),) = _run_all([command], script_env, tmp_path, timeout=240)
    assert code == 0, output

    reference, one = _one_device(batch_size=16)
    for strategy in ("ddp", "auto"):
        result = torch.load(tmp_path / f"{strategy}.pt", weights_only=True)
        assert (result["strategy"], result["world_size"]) == ("DDPStrategy", 2), strategy
        assert result["global_step"] == one.global_step == 8
        _assert_same_weights(result["weights"], reference)

    # predict: every sample once, in dataset order (rank 0's shard, then rank 1's).
    trained = Classifier()
    trained.load_state_dict(torch.load(tmp_path / "auto.pt", weights_only=True)["weights"])
    evaluated = torch.load(tmp_path / "eval.pt", weights_only=True)
    assert torch.load(tmp_path / "eval_1.pt", weights_only=True)["predictions"] is None
    x, y = dataset(13)[:]
    with torch.no_grad():
        assert torch.allclose(evaluated["predictions"], trained(x), atol=1e-6)
        # Fewer samples than ranks: the rank with an empty shard still joins the reduction.
        x5, y5 = dataset(64)[5:6]
        expected = torch.nn.functional.cross_entropy(trained(x5), y5).item()
    assert evaluated["one_sample"][0]["val_loss"] == pytest.approx(expected, abs=1e-6)

    # shuffle=True with Trainer(seed=...): one permutation shared by the ranks, a new one each epoch.
    seen = [torch.load(tmp_path / f"seen_{rank}.pt", weights_only=True) for rank in (0, 1)]
    for epoch in (0, 1):
        shards = [[i for e, batch in ranks for i in batch if e == epoch] for ranks in seen]
        assert sorted(shards[0] + shards[1]) == list(range(20)), shards
    epochs = [[i for e, batch in seen[0] for i in batch if e == epoch] for epoch in (0, 1)]
    assert epochs[0] != epochs[1] and epochs[0] != sorted(epochs[0])


def test_torchrun_two_nodes_on_one_machine_match_one_device(tmp_path, script_env):
    script = tmp_path / "script.py"
    script.write_text(TORCHRUN_SCRIPT)
    endpoint = f"127.0.0.1:{free_port()}"
    commands = [
        _torchrun(
            "--nnodes=2", f"--node-rank={node}", "--nproc_per_node=1", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}", "--local-addr=127.0.0.1", str(script), str(tmp_path), "fit",
        )
        for node in (0, 1)
    ]
    for code, output in _run_all(commands, script_env, tmp_path, timeout=240):
        assert code == 0, output

    result = torch.load(tmp_path / "auto.pt", weights_only=True)
    assert (result["strategy"], result["world_size"]) == ("DDPStrategy", 2)
    reference, _ = _one_device(batch_size=16)
    _assert_same_weights(result["weights"], reference)


# --- BatchNorm under DDP: evaluation sees rank 0's statistics --------------------------------
class Normed(Classifier):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(), torch.nn.Linear(16, 2))


class RecordsStatistics(Callback):
    def on_validation_start(self, trainer, module):
        torch.save(module.net[1].running_mean.clone(), f"stats{trainer.strategy.global_rank}.pt")


def test_ddp_validation_uses_rank_zeros_batchnorm_statistics_on_every_rank():
    trainer = Trainer(strategy="ddp", devices=2, max_epochs=1, callbacks=[RecordsStatistics()], **quiet())
    trainer.fit(Normed(), loader(n=64, batch_size=8, shuffle=True), loader(n=32))
    rank0, rank1 = (torch.load(f"stats{r}.pt", weights_only=True) for r in (0, 1))
    assert torch.equal(rank0, rank1)


def test_sync_batchnorm_on_the_cpu_says_it_needs_gpus():
    trainer = Trainer(strategy="ddp", devices=2, max_steps=1, sync_batchnorm=True, **quiet())
    with pytest.raises(WorkerError, match="sync_batchnorm=True needs CUDA devices"):
        trainer.fit(Normed(), loader())


class RecordsLayer(Callback):
    def on_train_start(self, trainer, module):
        torch.save(type(module.net[1]).__name__, f"layer{trainer.strategy.global_rank}.pt")


@requires_cuda(1)
def test_sync_batchnorm_converts_the_models_batchnorm_layers_on_a_gpu():
    trainer = Trainer(strategy="ddp", devices=[0], max_steps=1, sync_batchnorm=True, callbacks=[RecordsLayer()], **quiet())
    trainer.fit(Normed(), loader())
    assert torch.load("layer0.pt", weights_only=True) == "SyncBatchNorm"


# --- DDP on a real GPU ---------------------------------------------------------------------
class RecordsDevice(Callback):
    """Where each rank's parameters live, and the group's backend, written by every rank."""

    def on_train_start(self, trainer, module):
        where = (str(next(module.parameters()).device), torch.distributed.get_backend())
        torch.save(where, f"device{trainer.strategy.global_rank}.pt")


def _fit_on_cuda(strategy, devices, batch_size: int, **options) -> tuple[Classifier, Trainer]:
    torch.manual_seed(0)
    model = Classifier(optimizer="adam")
    trainer = Trainer(strategy=strategy, devices=devices, max_epochs=2, **quiet(**options))
    trainer.fit(model, loader(n=64, batch_size=batch_size), loader(n=16))
    return model, trainer


def _assert_close_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.allclose(x.cpu(), y.cpu(), atol=ATOL), name


@requires_cuda(1)
def test_ddp_over_nccl_in_one_process_matches_one_gpu():
    model, trainer = _fit_on_cuda("ddp", [0], 8, callbacks=[RecordsDevice()])
    reference, one = _fit_on_cuda("single", [0], 8)
    assert torch.load("device0.pt", weights_only=True) == ("cuda:0", "nccl")
    _assert_close_weights(model, reference)
    assert trainer.callback_metrics["val_loss"] == pytest.approx(one.callback_metrics["val_loss"].item(), abs=1e-5)


@requires_cuda(1)
def test_two_ddp_processes_share_one_gpu_over_gloo_and_match_one_device_with_the_doubled_batch():
    strategy = DDPStrategy(backend="gloo", device_ids=[0, 0])
    model, trainer = _fit_on_cuda(strategy, "auto", 4, callbacks=[RecordsDevice()])
    reference, one = _fit_on_cuda("single", [0], 8)
    for rank in (0, 1):
        assert torch.load(f"device{rank}.pt", weights_only=True) == ("cuda:0", "gloo")
    _assert_close_weights(model, reference)
    assert trainer.callback_metrics["val_loss"] == pytest.approx(one.callback_metrics["val_loss"].item(), abs=1e-5)


@requires_cuda(1)
def test_nccl_with_two_processes_on_one_gpu_is_refused_with_the_fix():
    with pytest.raises(ValueError) as info:
        Trainer(strategy=DDPStrategy(device_ids=[0, 0]), **quiet())
    assert "DDPStrategy(device_ids=[0, 0]) puts two processes on one GPU" in str(info.value)
    assert "backend='gloo'" in str(info.value)
