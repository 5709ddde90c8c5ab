"""strategy="dp": splitting and combining (CPU, exact), the CPU fallback, and the real
multi-GPU path (CUDA tests, skipped without GPUs)."""

from __future__ import annotations

import copy
import dataclasses
import glob
import logging
import warnings
from collections import namedtuple

import pytest
import torch
from torch import nn

from strategies import DataParallelStrategy, SingleDeviceStrategy
from strategies.data_parallel import combine_outputs, split_batch
from tests._models import Classifier, dataset, loader, quiet
from tests.conftest import requires_cuda
from trainer import Trainer
from trainer.core.metrics import MetricSink, set_sink
from strategies.precision import Precision

CPU = torch.device("cpu")
Pair = namedtuple("Pair", "inputs targets")


@dataclasses.dataclass
class Batch:
    x: torch.Tensor
    mask: torch.Tensor
    name: str = "batch"


# --- split_batch -------------------------------------------------------------------------
def test_split_is_balanced_and_the_chunks_concatenate_to_the_batch():
    for total in range(1, 10):
        for n in range(1, 5):
            x = torch.arange(total * 2).reshape(total, 2)
            chunks = split_batch(x, n)
            sizes = [size for _, size in chunks]
            assert sizes == [len(c) for c, _ in chunks]
            assert sum(sizes) == total and len(chunks) == min(n, total)
            assert max(sizes) - min(sizes) <= 1  # an uneven last batch is spread, not dumped on one device
            assert torch.equal(torch.cat([c for c, _ in chunks]), x)


def test_uneven_batch_sizes():
    assert [size for _, size in split_batch(torch.zeros(7, 3), 2)] == [4, 3]
    assert [size for _, size in split_batch(torch.zeros(5), 4)] == [2, 1, 1, 1]


def test_a_batch_smaller_than_the_device_count_gives_one_sample_per_chunk():
    chunks = split_batch((torch.tensor([[1.0], [2.0]]), torch.tensor([0, 1])), 4)
    assert len(chunks) == 2
    assert [c[1].tolist() for c, _ in chunks] == [[0], [1]]


def test_nested_containers_keep_their_types_and_are_split_together():
    x, y = torch.arange(10.0).reshape(5, 2), torch.arange(5)
    batch = {
        "pair": Pair(x, y),
        "more": [Batch(x=x + 100, mask=y > 2), (y * 10, "tag")],
    }
    (first, n1), (second, n2) = split_batch(batch, 2)
    assert (n1, n2) == (3, 2)
    assert isinstance(first["pair"], Pair) and isinstance(first["more"], list)
    assert isinstance(first["more"][0], Batch) and isinstance(first["more"][1], tuple)
    assert torch.equal(first["pair"].inputs, x[:3]) and torch.equal(second["pair"].targets, y[3:])
    assert torch.equal(second["more"][0].x, x[3:] + 100)
    assert second["more"][0].mask.tolist() == [True, True]
    assert second["more"][0].name == "batch"
    assert first["more"][1] == (first["more"][1][0], "tag") and first["more"][1][0].tolist() == [0, 10, 20]


def test_tensors_that_are_not_batched_go_whole_to_every_chunk():
    scale = torch.tensor(0.5)  # 0-dim, even though it comes first
    table = torch.arange(12.0).reshape(3, 4)  # another length: shared, like an embedding table
    x = torch.arange(8.0).reshape(8, 1)
    chunks = split_batch((scale, x, table, "id"), 2)
    assert [size for _, size in chunks] == [4, 4]
    for (s, part, t, tag), _ in chunks:
        assert s is scale and t is table and tag == "id"
        assert len(part) == 4


def test_a_batch_without_tensors_is_one_chunk():
    assert split_batch({"names": ["a", "b"]}, 2) == [({"names": ["a", "b"]}, 1)]


# --- combine_outputs ---------------------------------------------------------------------
def _mse(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(model(x), y)  # mean-reduced


def test_the_weighted_mean_of_chunk_losses_is_the_full_batch_loss_with_the_same_gradients():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    x, y = torch.randn(7, 3), torch.randn(7, 1)
    full = _mse(model, x, y)
    full.backward()
    full_grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()

    chunks = split_batch((x, y), 3)
    losses = [_mse(model, cx, cy) for (cx, cy), _ in chunks]
    combined = combine_outputs(losses, [size for _, size in chunks], CPU)
    combined.backward()
    assert torch.allclose(combined, full, atol=1e-6)
    for p, g in zip(model.parameters(), full_grads):
        assert torch.allclose(p.grad, g, atol=1e-6)
    # An unweighted mean (what averaging replica losses naively gives) would be wrong here.
    assert not torch.allclose(torch.stack(losses).mean(), full, atol=1e-6)


def test_batched_outputs_are_concatenated_in_replica_order():
    x = torch.arange(7.0).reshape(7, 1)
    chunks = split_batch(x, 3)
    outputs = [c * 2 for c, _ in chunks]
    assert torch.equal(combine_outputs(outputs, [s for _, s in chunks], CPU), x * 2)


def test_nested_outputs_are_combined_per_leaf():
    Out = namedtuple("Out", "loss preds")

    @dataclasses.dataclass
    class Extra:
        count: torch.Tensor
        label: str

    outputs = [
        {"loss": torch.tensor(1.0), "out": Out(torch.tensor(2.0), torch.tensor([1, 2])), "extra": [Extra(torch.tensor(3.0), "a")], "step": 5},
        {"loss": torch.tensor(4.0), "out": Out(torch.tensor(8.0), torch.tensor([3])), "extra": [Extra(torch.tensor(6.0), "b")], "step": 5},
    ]
    merged = combine_outputs(outputs, [2, 1], CPU)
    assert merged["loss"].item() == pytest.approx((1.0 * 2 + 4.0) / 3)
    assert isinstance(merged["out"], Out)
    assert merged["out"].loss.item() == pytest.approx((2.0 * 2 + 8.0) / 3)
    assert merged["out"].preds.tolist() == [1, 2, 3]
    assert isinstance(merged["extra"][0], Extra) and merged["extra"][0].count.item() == pytest.approx(4.0)
    assert merged["extra"][0].label == ["a", "b"]  # not a tensor: one entry per replica
    assert merged["step"] == [5, 5]


# Each replica's outputs, faked on the CPU: what the replicas of one step would return.
def test_lists_of_strings_are_concatenated_in_batch_order_even_and_uneven():
    assert combine_outputs([["a", "b"], ["c", "d"]], [2, 2], CPU) == ["a", "b", "c", "d"]
    merged = combine_outputs([{"names": ["a", "b", "c"]}, {"names": ["d", "e"]}], [3, 2], CPU)
    assert merged == {"names": ["a", "b", "c", "d", "e"]}


def test_per_sample_lists_of_tensors_of_uneven_chunks_are_concatenated():
    t = [torch.tensor([float(i)]) for i in range(5)]
    merged = combine_outputs([t[:3], t[3:]], [3, 2], CPU)
    assert isinstance(merged, list) and [x.item() for x in merged] == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_strings_in_the_batch_are_split_with_it_and_come_back_in_order():
    x, ids = torch.arange(10.0).reshape(5, 2), ["a", "b", "c", "d", "e"]
    chunks = split_batch({"x": x, "ids": ids}, 2)
    assert [c["ids"] for c, _ in chunks] == [["a", "b", "c"], ["d", "e"]]
    outputs = [{"ids": c["ids"], "sum": c["x"].sum(1)} for c, _ in chunks]  # a predict_step's
    merged = combine_outputs(outputs, [n for _, n in chunks], CPU)
    assert merged["ids"] == ids and torch.equal(merged["sum"], x.sum(1))


def test_a_loss_of_shape_one_stays_shape_one_and_is_the_weighted_mean():
    merged = combine_outputs([torch.tensor([1.0]), torch.tensor([4.0])], [2, 1], CPU)
    assert merged.shape == (1,) and merged.item() == pytest.approx(2.0)
    merged = combine_outputs([{"loss": torch.tensor([[1.0]])}, {"loss": torch.tensor([[4.0]])}], [3, 3], CPU)
    assert merged["loss"].shape == (1, 1) and merged["loss"].item() == pytest.approx(2.5)


def test_one_sample_chunks_read_a_one_element_tensor_as_the_loss_in_training_only():
    # A batch no bigger than the device count: each chunk is one sample, so shape (1,) is ambiguous.
    outputs = [torch.tensor([1.0]), torch.tensor([3.0])]
    assert combine_outputs(outputs, [1, 1], CPU, training=True).tolist() == [2.0]  # the loss
    assert combine_outputs(outputs, [1, 1], CPU).tolist() == [1.0, 3.0]  # predictions


def test_integer_counts_are_summed_not_averaged():
    merged = combine_outputs([{"correct": torch.tensor(3), "acc": torch.tensor(0.75)}, {"correct": torch.tensor(2), "acc": torch.tensor(2 / 3)}], [4, 3], CPU)
    assert merged["correct"].dtype == torch.int64 and merged["correct"].item() == 5  # as one device counts the batch
    assert merged["acc"].item() == pytest.approx(5 / 7)


def _replica_sink(chunk: int, **logged) -> MetricSink:
    sink = MetricSink()
    sink.batch_size = chunk
    for name, (value, batch_size) in logged.items():
        sink.log(name, value, batch_size=batch_size)
    return sink


def test_merged_metrics_take_every_replicas_names_and_their_batch_sizes():
    parent = MetricSink()
    replicas = [
        _replica_sink(2, loss=(1.0, None), tokens=(1.0, 1)),  # batch_size=1: one token counted
        _replica_sink(2, loss=(3.0, None), tokens=(4.0, 3), rare=(7.0, None)),  # only replica 1 saw it
    ]
    parent.merge_replicas(replicas)
    assert parent.latest == {"loss": 2.0, "tokens": pytest.approx((1.0 * 1 + 4.0 * 3) / 4), "rare": 7.0}
    means = parent.epoch_means()
    assert means["rare"] == 7.0 and means["tokens"] == pytest.approx(3.25)
    assert parent._series["tokens"].weight == 4 and parent._series["rare"].weight == 2


def test_metrics_logged_only_by_a_later_replica_are_kept():
    parent = MetricSink()
    parent.merge_replicas([_replica_sink(3), _replica_sink(2, rare=(5.0, None))])
    assert parent.latest == {"rare": 5.0}


# --- the CPU fallback ---------------------------------------------------------------------
@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="with 2 GPUs, dp does not fall back")
def test_dp_without_two_gpus_warns_once_trains_like_one_device_and_saves_plain_checkpoints():
    torch.manual_seed(0)
    model = Classifier()
    reference = copy.deepcopy(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = Trainer(strategy="dp", max_epochs=2, **quiet(enable_checkpointing=True))
        trainer.fit(model, loader(batch_size=16))
    fallback = [w for w in caught if "strategy='dp' needs 2 or more GPUs" in str(w.message)]
    assert len(fallback) == 1, [str(w.message) for w in caught]
    assert "running on the single device" in str(fallback[0].message)
    assert fallback[0].filename == __file__  # points at the line that built the Trainer

    Trainer(strategy="single", max_epochs=2, **quiet()).fit(reference, loader(batch_size=16))
    for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-6), name

    assert not any(k.startswith("module.") for k in model.state_dict())
    (last,) = glob.glob("checkpoints/*.ckpt")
    saved = torch.load(last, weights_only=True)["state_dict"]
    assert not any(k.startswith("module.") for k in saved)
    bare = Classifier()
    bare.load_state_dict(saved)  # strict: same keys, no wrapper prefix
    for name, value in bare.state_dict().items():
        assert torch.equal(value, model.state_dict()[name]), name


def test_device_ids_are_checked_when_the_trainer_is_built():
    with pytest.raises(ValueError, match=r"device_ids=\[\]\) must be a non-empty list"):
        DataParallelStrategy(device_ids=[])
    with pytest.raises(ValueError, match=r"device_ids=\[0, -1\]\) must be a non-empty list"):
        DataParallelStrategy(device_ids=[0, -1])
    with pytest.raises(ValueError, match=r"both choose the devices"):
        Trainer(strategy=DataParallelStrategy(device_ids=[0]), devices=2, **quiet())


@pytest.mark.skipif(torch.cuda.device_count() > 0, reason="checks the message on a machine without GPUs")
def test_explicit_gpus_on_a_cpu_machine_are_an_error_not_a_fallback():
    with pytest.raises(ValueError, match=r"DataParallelStrategy\(device_ids\)=\[0, 1\]: CUDA device 0, 1 does not exist"):
        Trainer(strategy=DataParallelStrategy(device_ids=[0, 1]), **quiet())


# --- the real path: CUDA only -------------------------------------------------------------
class AutocastProbe(Classifier):
    """Records, in whichever replica thread runs it, whether autocast is on and what a matmul gives."""
    # (An assert in a test model is fine: a failure in a replica re-raises in the caller.)

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, bool, torch.dtype]] = []  # shared by the replicas (shallow copies)

    def training_step(self, batch, batch_idx):
        x, _ = batch
        assert self.device == x.device  # a replica reports its own GPU
        self.seen.append((str(x.device), torch.is_autocast_enabled("cuda"), self.net[0](x).dtype))
        return super().training_step(batch, batch_idx)


def _one_dp_step(strategy, model: nn.Module, batch, precision: str = "32"):
    """What the Trainer does for one training batch: set up, run the step, backward."""
    strategy.precision = Precision(precision, strategy.root_device)
    strategy.setup_environment()
    strategy.setup_module(model)
    previous = set_sink(MetricSink())  # where self.log writes during a step
    try:
        loss = strategy.run_step("training_step", batch, 0)
    finally:
        set_sink(previous)
    loss.backward()
    return loss.detach(), [p.grad.detach().clone() for p in model.parameters()]


def _dp_matches_one_device(device_ids: list[int]) -> None:
    torch.manual_seed(0)
    model = Classifier()
    reference = copy.deepcopy(model)
    x, y = dataset(n=7)[:]  # 7 samples: an uneven split
    dp = DataParallelStrategy(device_ids=device_ids)
    dp.configure_devices("auto")
    dp_loss, dp_grads = _one_dp_step(dp, model, (x, y))
    one = SingleDeviceStrategy(f"cuda:{device_ids[0]}")
    one_loss, one_grads = _one_dp_step(one, reference, (x, y))
    assert dp_loss.device == torch.device("cuda", device_ids[0])
    assert torch.allclose(dp_loss, one_loss, atol=1e-6)
    for a, b in zip(dp_grads, one_grads):
        assert torch.allclose(a, b, atol=1e-6)
    assert not any(k.startswith("module.") for k in dp.module_state_dict())


@requires_cuda(2)
def test_dp_on_two_gpus_gives_the_single_device_loss_and_gradients():
    _dp_matches_one_device([0, 1])


@requires_cuda(1)
def test_two_replicas_on_one_gpu_exercise_the_whole_path():
    # torch's replicate/Broadcast accept a repeated device: broadcast returns the source for
    # the source's own device, and reduce_add falls back from NCCL to plain adds when a device
    # repeats, so device_ids=[0, 0] runs split, replicate, two threads, combine and backward.
    _dp_matches_one_device([0, 0])


@requires_cuda(1)
def test_bf16_autocast_is_active_inside_every_replica_thread():
    ids = [0, 1] if torch.cuda.device_count() >= 2 else [0, 0]
    model = AutocastProbe()
    strategy = DataParallelStrategy(device_ids=ids)
    strategy.configure_devices("auto")
    x, y = dataset(n=8)[:]
    _one_dp_step(strategy, model, (x, y), precision="bf16-mixed")
    assert len(model.seen) == 2
    assert sorted(device for device, _, _ in model.seen) == sorted(f"cuda:{i}" for i in ids)
    assert all(enabled and dtype == torch.bfloat16 for _, enabled, dtype in model.seen)


@requires_cuda(2)
def test_dp_fit_on_two_gpus_matches_one_gpu_and_logs_the_global_batch(caplog):
    logger = logging.getLogger("trainer")
    logger.addHandler(caplog.handler)
    try:
        torch.manual_seed(0)
        model = Classifier()
        reference = copy.deepcopy(model)
        trainer = Trainer(strategy="dp", devices=2, max_epochs=2, **quiet(enable_checkpointing=True))
        trainer.fit(model, loader(n=60, batch_size=16))  # the loader's batch is the global batch
    finally:
        logger.removeHandler(caplog.handler)
    one = Trainer(strategy=SingleDeviceStrategy("cuda:0"), max_epochs=2, **quiet())
    one.fit(reference, loader(n=60, batch_size=16))
    for (name, a), b in zip(model.state_dict().items(), reference.state_dict().values()):
        assert torch.allclose(a, b, atol=1e-5), name
    assert trainer.callback_metrics["train_loss"] == pytest.approx(one.callback_metrics["train_loss"].item(), abs=1e-5)
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("Training with")] == [
        "Training with dp on cuda:0, cuda:1; 2 device(s), world size 1; "
        "global batch 16 = 8 per device x 2 device(s) x 1 accumulation."
    ]
    saved = torch.load(trainer.checkpoint_callback.best_model_path, weights_only=True)["state_dict"]
    assert set(saved) == set(Classifier().state_dict())
