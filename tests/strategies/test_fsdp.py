"""strategy="fsdp": FSDP2 on 2 CPU processes (gloo) against one device with the doubled batch."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import MixedPrecisionPolicy

from callbacks import Callback, ModelCheckpoint
from strategies import FSDPStrategy
from tests._models import Classifier, TinyGAN, gan_loader, loader, quiet
from tests.conftest import requires_cuda
from trainer import Trainer

# Ranks fork from a warm server (tests/conftest.py), not spawned: the same training, seconds less a fit.
pytestmark = pytest.mark.usefixtures("ranks_from_the_fork_server")


def _close(a: nn.Module, b: nn.Module) -> None:
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5, msg=name)


def _pair(**kw):
    torch.manual_seed(0)
    sharded, single = Classifier(**kw), Classifier(**kw)
    single.load_state_dict(sharded.state_dict())
    return sharded, single


@pytest.mark.slow
@pytest.mark.parametrize("options", [{}, dict(accumulate_grad_batches=2, gradient_clip_val=0.3)], ids=["plain", "accumulate-clip"])
def test_fsdp_on_two_processes_trains_to_the_weights_of_one_device_with_the_doubled_batch(options):
    # SGD, whose step scales with the gradient: a reduce-scatter that sums instead of averaging
    # (pytorch#162338, gloo) doubles every step and fails this. The clip bites on some steps only.
    sharded, single = _pair(lr=0.5)
    strategy = FSDPStrategy(shard=[nn.Linear])  # three shard groups: both Linear layers and the root
    Trainer(strategy=strategy, devices=2, max_epochs=2, **quiet(**options)).fit(sharded, loader(n=96, batch_size=8))
    Trainer(max_epochs=2, **quiet(**options)).fit(single, loader(n=96, batch_size=16))
    _close(sharded, single)


@pytest.mark.slow
def test_its_checkpoint_is_the_bare_models_and_resumes_under_single_and_fsdp(tmp_path):
    sharded, single = _pair(optimizer="adam", lr=0.01)
    first = Trainer(strategy="fsdp", devices=2, max_epochs=1, log_dir=tmp_path / "fsdp", enable_progress_bar=False)
    first.fit(sharded, loader(n=64, batch_size=8))
    path = first.checkpoint_callback.best_model_path
    ckpt = torch.load(path, weights_only=True)
    bare = Classifier()
    bare.load_state_dict(ckpt["state_dict"])  # plain keys, full tensors, on the CPU
    assert all(v.device.type == "cpu" for v in ckpt["state_dict"].values())
    (adam,) = ckpt["optimizer_states"]
    assert set(adam["state"]) == {n for n, _ in bare.named_parameters()}  # by name: any world size

    # The fsdp checkpoint goes on under single (doubled batch), and a single run's checkpoint
    # goes on under fsdp: both land where two epochs on one device do.
    def adam():
        return Classifier(optimizer="adam", lr=0.01)

    on_single = adam()
    Trainer(max_epochs=2, **quiet()).fit(on_single, loader(n=64, batch_size=16), ckpt_path=path)
    first_on_single = Trainer(max_epochs=1, log_dir=tmp_path / "single", enable_progress_bar=False)
    first_on_single.fit(single, loader(n=64, batch_size=16))
    on_fsdp = adam()
    Trainer(strategy="fsdp", devices=2, max_epochs=2, **quiet()).fit(
        on_fsdp, loader(n=64, batch_size=8), ckpt_path=first_on_single.checkpoint_callback.best_model_path
    )
    straight = adam()
    straight.load_state_dict(_pair()[0].state_dict())
    Trainer(max_epochs=2, **quiet()).fit(straight, loader(n=64, batch_size=16))
    _close(on_single, straight)
    _close(on_fsdp, straight)


@pytest.mark.slow
def test_sharded_checkpoints_are_whole_folders_and_resume_bit_exact(tmp_path):
    def sharded():
        return FSDPStrategy(checkpoint="sharded", shard=[nn.Linear])

    def trainer(folder, epochs):
        return Trainer(
            strategy=sharded(), devices=2, max_epochs=epochs, seed=7, log_dir=tmp_path / folder, enable_progress_bar=False,
            callbacks=[ModelCheckpoint(save_last=True)],
        )

    straight, stopped = _pair(dropout=0.2)
    trainer("straight", 3).fit(straight, loader(n=64, batch_size=8, shuffle=True))
    first = trainer("run", 1)
    first.fit(stopped, loader(n=64, batch_size=8, shuffle=True))
    last = Path(first.checkpoint_callback.last_model_path)
    assert last.name == "last.ckpt" and last.is_dir()  # a link to the epoch's folder
    assert (last / "meta.pt").is_file() and (last / ".metadata").is_file()  # the meta, and DCP's own files
    (last.parent / ".tmp-epoch=9-step=99.ckpt-crashed").mkdir()  # a save a kill cut short: never a checkpoint

    resumed = Classifier(dropout=0.2)
    again = trainer("run", 3)
    again.fit(resumed, loader(n=64, batch_size=8, shuffle=True), ckpt_path="last")
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), name
    folder = Path(again.checkpoint_callback.last_model_path).parent
    # save_top_k=1: the older epochs' folders were deleted; no temp folder is left.
    assert sorted(p.name for p in folder.iterdir()) == ["epoch=2-step=12.ckpt", "last.ckpt"]
    # Another world size reads it too (torch.distributed.checkpoint reshards on load).
    on_one = Classifier(dropout=0.2)
    Trainer(strategy=sharded(), devices=1, **quiet()).validate(on_one, loader(n=16), ckpt_path=str(folder / "last.ckpt"))
    for (name, a), b in zip(straight.state_dict().items(), on_one.state_dict().values()):
        assert torch.equal(a, b), name
    # And one process with no process group, for inference: load_from_checkpoint reads the shards whole.
    for (name, a), b in zip(straight.state_dict().items(), Classifier.load_from_checkpoint(folder / "last.ckpt").state_dict().values()):
        assert torch.equal(a, b), name
    with pytest.raises(ValueError, match=r"is a sharded checkpoint .* under strategy='fsdp'"):
        Trainer(max_epochs=4, **quiet()).fit(Classifier(), loader(), ckpt_path=str(folder / "last.ckpt"))


@pytest.mark.slow
def test_validate_test_and_predict_run_sharded_with_uneven_shards():
    model = Classifier()
    data = loader(n=33, batch_size=4)  # 17 and 16 samples: 5 batches on rank 0, 4 on rank 1
    [expected] = Trainer(**quiet()).test(model, data)
    trainer = Trainer(strategy="fsdp", devices=2, **quiet())
    [got] = trainer.test(model, data)
    assert got.keys() == expected.keys()
    for k in expected:
        assert got[k] == pytest.approx(expected[k], rel=1e-5)
    assert torch.equal(torch.cat(trainer.predict(model, data)), torch.cat(Trainer(**quiet()).predict(model, data)))


@pytest.mark.slow
def test_a_gan_stepped_by_hand_under_fsdp_matches_one_device():
    torch.manual_seed(0)
    sharded, single = TinyGAN(clip=0.05), TinyGAN(clip=0.05)
    single.load_state_dict(sharded.state_dict())
    Trainer(strategy="fsdp", devices=2, max_epochs=2, **quiet()).fit(sharded, gan_loader(batch_size=8))
    Trainer(max_epochs=2, **quiet()).fit(single, gan_loader(batch_size=16))
    _close(sharded, single)


@pytest.mark.slow
def test_compile_under_fsdp_trains_to_the_same_weights():
    sharded, single = _pair()
    Trainer(strategy="fsdp", devices=2, max_epochs=2, compile=dict(backend="eager"), **quiet()).fit(sharded, loader(n=96, batch_size=8))
    Trainer(max_epochs=2, **quiet()).fit(single, loader(n=96, batch_size=16))
    _close(sharded, single)


class OnMeta(Classifier):
    """Built on the meta device: no memory until each rank allocates its shard."""

    def __init__(self):
        with torch.device("meta"):
            super().__init__()


@pytest.mark.slow
def test_a_model_built_on_the_meta_device_is_materialised_shard_by_shard(tmp_path):
    model = OnMeta()
    assert all(p.is_meta for p in model.parameters())
    trainer = Trainer(strategy="fsdp", devices=2, max_epochs=1, log_dir=tmp_path, enable_progress_bar=False)
    trainer.fit(model, loader())
    assert not any(p.is_meta for p in model.parameters())  # the caller's model got the trained weights
    assert all(torch.isfinite(p).all() and p.abs().sum() > 0 for p in model.parameters())
    assert 0 < trainer.callback_metrics["train_loss"] < 5


@pytest.mark.parametrize(
    "make, error, message",
    [
        (lambda: FSDPStrategy(shard="Linear"), TypeError, r"shard='Linear'\) must be a list of module classes"),
        (lambda: FSDPStrategy(reduce_dtype="bf16"), TypeError, r"reduce_dtype='bf16'\) must be a floating torch.dtype"),
        (lambda: FSDPStrategy(checkpoint="folder"), ValueError, r"checkpoint='folder'\): 'full' .* or 'sharded'"),
        pytest.param(
            lambda: Trainer(strategy=FSDPStrategy(cpu_offload=True), devices=2, max_epochs=1, **quiet()).fit(Classifier(), loader()),
            Exception, r"cpu_offload=True\) moves shards from GPU to CPU memory", marks=pytest.mark.slow,  # two processes
        ),
    ],
)
def test_bad_options_say_what_to_pass(make, error, message):
    with pytest.raises(error, match=message):
        make()


@pytest.mark.slow
def test_bf16_mixed_computes_in_bf16_and_keeps_float32_weights():
    sharded, single = _pair()
    Trainer(strategy="fsdp", devices=2, max_epochs=2, precision="bf16-mixed", **quiet()).fit(sharded, loader(n=96, batch_size=8))
    Trainer(max_epochs=2, **quiet()).fit(single, loader(n=96, batch_size=16))
    assert all(v.dtype == torch.float32 for v in sharded.state_dict().values())  # the sharded masters stay fp32
    gaps = [(a - b).abs().max().item() for a, b in zip(sharded.state_dict().values(), single.state_dict().values())]
    assert 0 < max(gaps) < 1e-2  # bf16 steps: close to float32's, not equal


def test_the_default_rule_shards_repeated_blocks_and_nothing_else():
    from strategies.fsdp import _repeated_blocks

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn, self.mlp = nn.Linear(4, 4), nn.Linear(4, 4)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(10, 4)
            self.blocks = nn.Sequential(Block(), Block(), Block())
            self.extra = nn.ModuleList([nn.LayerNorm(4), nn.Linear(4, 4)])  # no class repeats here
            self.head = nn.Linear(4, 10)

    net = Net()
    assert _repeated_blocks(net) == {id(b) for b in net.blocks}


@requires_cuda(2)
@pytest.mark.parametrize("options", [dict(), dict(cpu_offload=True)], ids=["nccl", "cpu-offload"])
def test_fsdp_on_two_gpus_matches_one_gpu_with_the_doubled_batch(options):
    sharded, single = _pair(lr=0.5)
    Trainer(strategy=FSDPStrategy(**options), devices=2, max_epochs=2, **quiet()).fit(sharded, loader(n=96, batch_size=8))
    Trainer(strategy="single", devices=[0], max_epochs=2, **quiet()).fit(single, loader(n=96, batch_size=16))
    _close(sharded, single)


# --- Lightning's options (FSDP1's names), as FSDP2 settings ---------------------------------------------------------
def test_lightnings_options_are_kept_under_lightnings_names():
    from torch.distributed.fsdp import CPUOffload, MixedPrecision, ShardingStrategy

    default = FSDPStrategy()
    assert default.sharding_strategy == ShardingStrategy.FULL_SHARD and default.reshard_after_forward
    assert default.cpu_offload == CPUOffload(offload_params=False)
    assert default.kwargs == {"use_orig_params": True} and default.mixed_precision_config is None
    assert FSDPStrategy(cpu_offload=True).cpu_offload == CPUOffload(offload_params=True)
    assert FSDPStrategy(sharding_strategy="shard_grad_op").reshard_after_forward is False
    assert FSDPStrategy(reshard_after_forward=False).sharding_strategy == ShardingStrategy.SHARD_GRAD_OP
    assert FSDPStrategy(sharding_strategy=ShardingStrategy.NO_SHARD).sharding_strategy.name == "NO_SHARD"
    config = MixedPrecision(param_dtype=torch.bfloat16)
    assert FSDPStrategy(mixed_precision=config).mixed_precision_config is config
    hybrid = FSDPStrategy(sharding_strategy="HYBRID_SHARD", device_mesh=(2, 4), use_orig_params=False)
    assert hybrid.kwargs == {"use_orig_params": False, "device_mesh": (2, 4)}
    assert FSDPStrategy(state_dict_type="sharded").sharded_checkpoints
    assert FSDPStrategy(auto_wrap_policy={nn.Linear}).shard == (nn.Linear,)


def test_device_mesh_parses_from_the_command_line_as_a_pair():
    import inspect

    import jsonargparse

    parser = jsonargparse.ArgumentParser()
    parser.add_argument("--device_mesh", type=inspect.signature(FSDPStrategy).parameters["device_mesh"].annotation)
    assert parser.parse_args(["--device_mesh=[2, 4]"]).device_mesh == (2, 4)


@pytest.mark.parametrize(
    "options, error, message",
    [
        (dict(sharding_strategy="ZERO3"), ValueError, r"sharding_strategy='ZERO3'\): use one of 'FULL_SHARD'"),
        (dict(sharding_strategy="FULL_SHARD", reshard_after_forward=False), ValueError, "contradict each other"),
        (dict(sharding_strategy="HYBRID_SHARD"), ValueError, "The hybrid sharding strategy requires you to pass `device_mesh`"),
        (dict(device_mesh=(2, 4)), ValueError, r"device_mesh=\(2, 4\)\) is for the hybrid sharding strategies"),
        (dict(sharding_strategy="HYBRID_SHARD", device_mesh=(2, 0)), ValueError, r"must be \(replication size, sharding size\)"),
        (dict(cpu_offload="yes"), TypeError, r"cpu_offload='yes'\) must be True, False or a torch.distributed.fsdp.CPUOffload"),
        (dict(mixed_precision=torch.bfloat16), TypeError, r"mixed_precision=torch.bfloat16\) must be a torch.distributed.fsdp.MixedPrecision"),
        (dict(process_group=1), TypeError, r"got process_group=1, an option this strategy does not take"),
        (dict(mixed_precision=MixedPrecisionPolicy(), reduce_dtype=torch.bfloat16), ValueError, "give the reduce dtype inside mixed_precision"),
        (dict(state_dict_type="full", checkpoint="sharded"), ValueError, "state_dict_type is Lightning's name for checkpoint"),
        (dict(auto_wrap_policy=lambda module, recurse, numel: True), TypeError, "FSDP1's wrap-policy functions have no FSDP2 counterpart"),
        (dict(shard=[nn.Linear], auto_wrap_policy={nn.Linear}), ValueError, "auto_wrap_policy is Lightning's name for shard"),
    ],
)
def test_lightnings_options_that_cannot_apply_say_why(options, error, message):
    with pytest.raises(error, match=message):
        FSDPStrategy(**options)


def test_save_checkpoint_refuses_storage_options_with_lightnings_words(tmp_path):
    with pytest.raises(TypeError, match=r"`FSDPStrategy.save_checkpoint\(..., storage_options=...\)` is not supported"):
        FSDPStrategy().save_checkpoint(checkpoint={}, filepath=tmp_path / "a.ckpt", storage_options={"anon": True})
    assert not (tmp_path / "a.ckpt").exists()


class _Holds(Callback):
    """Fails the run unless each rank holds all of every parameter (``whole``) or a part of it."""

    def __init__(self, whole: bool) -> None:
        self.whole = whole

    def on_train_start(self, trainer, module):
        local = sum(p.to_local().numel() for p in module.parameters())
        if (local == sum(p.numel() for p in module.parameters())) != self.whole:
            raise AssertionError(f"rank {trainer.global_rank} holds {local} parameters; whole={self.whole}")


@pytest.mark.slow
@pytest.mark.parametrize(
    "options, whole",
    [(dict(sharding_strategy="SHARD_GRAD_OP"), False), (dict(sharding_strategy="NO_SHARD"), True),
     (dict(sharding_strategy="HYBRID_SHARD", device_mesh=(2, 1)), True),
     (dict(sharding_strategy="HYBRID_SHARD", device_mesh=(1, 2)), False)],
    ids=["shard-grad-op", "no-shard", "hybrid-replicated", "hybrid-sharded"],
)
def test_each_sharding_strategy_trains_to_the_weights_of_one_device(options, whole):
    sharded, single = _pair(lr=0.5)
    trainer = Trainer(strategy=FSDPStrategy(**options), devices=2, max_epochs=2, **quiet(callbacks=[_Holds(whole)]))
    trainer.fit(sharded, loader(n=96, batch_size=8))
    Trainer(max_epochs=2, **quiet()).fit(single, loader(n=96, batch_size=16))
    _close(sharded, single)


@pytest.mark.slow
def test_a_mixed_precision_config_computes_in_its_dtype():
    from torch.distributed.fsdp import MixedPrecision

    sharded, single = _pair()
    strategy = FSDPStrategy(mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
    Trainer(strategy=strategy, devices=2, max_epochs=2, **quiet()).fit(sharded, loader(n=96, batch_size=8))
    Trainer(max_epochs=2, **quiet()).fit(single, loader(n=96, batch_size=16))
    assert all(v.dtype == torch.float32 for v in sharded.state_dict().values())  # the sharded masters stay fp32
    gaps = [(a - b).abs().max().item() for a, b in zip(sharded.state_dict().values(), single.state_dict().values())]
    assert 0 < max(gaps) < 1e-2  # bf16 compute under precision="32": the config took effect
