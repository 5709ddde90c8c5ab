"""Trainer(strategy=..., devices=...): names, aliases, instances, devices, "auto", launchers."""

from __future__ import annotations

import os

import pytest
import torch

import strategies
from strategies import DataParallelStrategy, DDPStrategy, SingleDeviceStrategy, Strategy
from strategies._env import launched_env
from strategies.precision import Precision
from tests._models import Classifier, loader, quiet
from trainer import Trainer

GPUS = torch.cuda.device_count()


def test_every_strategy_is_exported_from_the_package():
    for name in ("Strategy", "SingleDeviceStrategy", "DataParallelStrategy", "DDPStrategy"):
        assert name in strategies.__all__
        assert isinstance(getattr(strategies, name), type)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("single", SingleDeviceStrategy),
        ("single_device", SingleDeviceStrategy),
        ("dp", DataParallelStrategy),
        ("data_parallel", DataParallelStrategy),
        ("ddp", DDPStrategy),
    ],
)
def test_names_and_aliases(name, expected, recwarn):
    trainer = Trainer(strategy=name, **quiet())
    assert type(trainer.strategy) is expected


def test_an_instance_is_used_as_given():
    chosen = DDPStrategy(timeout=30)
    trainer = Trainer(strategy=chosen, devices=2, **quiet())
    assert trainer.strategy is chosen
    assert chosen.num_processes == 2
    assert chosen.timeout.total_seconds() == 30
    assert isinstance(Trainer(strategy=SingleDeviceStrategy("cpu"), **quiet()).strategy.root_device, torch.device)


def test_the_strategy_is_built_with_the_trainers_precision():
    """Strategy(precision=...) from the start, a Precision object, named or given as an instance:
    a step never finds a strategy without one."""
    assert type(SingleDeviceStrategy().precision) is Precision and SingleDeviceStrategy().precision.precision == "32-true"
    named = Trainer(strategy="single", precision="bf16-mixed", **quiet()).strategy
    assert named.precision.precision == "bf16-mixed" and named.precision.dtype == torch.bfloat16
    given = DDPStrategy()
    assert Trainer(strategy=given, precision="64-true", **quiet()).strategy.precision.param_dtype == torch.float64
    trainer = Trainer(max_steps=1, precision="bf16-mixed", **quiet())
    trainer.fit(Classifier(), loader(8))
    assert trainer.strategy.precision.device_type == "cpu" and trainer.strategy.precision.scaler is None


def test_a_single_device_instance_and_a_device_list_conflict():
    with pytest.raises(ValueError, match=r"devices=\[0\] and SingleDeviceStrategy\(device='cpu'\) both choose"):
        Trainer(strategy=SingleDeviceStrategy("cpu"), devices=[0], **quiet())
    with pytest.raises(ValueError, match=r"devices=2 asks for 2 devices, but SingleDeviceStrategy\(device='cpu'\) runs on one"):
        Trainer(strategy=SingleDeviceStrategy("cpu"), devices=2, **quiet())


def test_unknown_name_lists_the_valid_ones_and_suggests_the_closest():
    with pytest.raises(ValueError) as info:
        Trainer(strategy="dpp", **quiet())
    message = str(info.value)
    assert message.startswith("Unknown strategy 'dpp'. Valid: ")
    for valid in ("'auto'", "'single'", "'single_device'", "'dp'", "'data_parallel'", "'ddp'"):
        assert valid in message
    assert message.endswith("Did you mean 'ddp'?")


@pytest.mark.parametrize(("typo", "closest"), [("DDP", "ddp"), ("singel", "single"), ("data-parallel", "data_parallel")])
def test_typos_get_the_closest_name(typo, closest):
    with pytest.raises(ValueError, match=f"Did you mean '{closest}'"):
        Trainer(strategy=typo, **quiet())


def test_a_far_off_name_gets_no_suggestion():
    with pytest.raises(ValueError) as info:
        Trainer(strategy="deepspeed", **quiet())
    assert "Did you mean" not in str(info.value)


def test_a_strategy_that_is_neither_name_nor_instance_is_a_type_error():
    with pytest.raises(TypeError, match=r"strategy=<class 'strategies.ddp.DDPStrategy'> must be a name"):
        Trainer(strategy=DDPStrategy, **quiet())  # the class, not an instance


@pytest.mark.parametrize(("devices", "processes"), [("auto", max(GPUS, 1)), (1, 1), (3, 3)])
def test_ddp_devices_count(devices, processes):
    if isinstance(devices, int) and GPUS and devices > GPUS:
        pytest.skip("more devices than GPUs is an error on a GPU machine")
    assert Trainer(strategy="ddp", devices=devices, **quiet()).strategy.num_processes == processes


@pytest.mark.parametrize(
    ("devices", "error", "says"),
    [
        (0, ValueError, "must be at least 1"),
        (-2, ValueError, "must be at least 1"),
        ("0", ValueError, "must be at least 1"),
        (True, TypeError, "must be 'auto', a count or a list"),
        (2.0, TypeError, "must be 'auto', a count or a list"),
        (None, TypeError, "must be 'auto', a count or a list"),
        ("gpu", ValueError, "is not understood"),
        ("two", ValueError, "is not understood"),
        ([], ValueError, "one or more device indices"),
        ([-1], ValueError, "one or more device indices"),
        ([0, 1.0], ValueError, "one or more device indices"),
        ([0, 0], ValueError, "DDPStrategy(backend='gloo', device_ids=[0, 0])"),
    ],
)
def test_bad_devices_are_rejected_with_the_value_and_the_fix(devices, error, says):
    with pytest.raises(error) as info:
        Trainer(strategy="ddp", devices=devices, **quiet())
    assert f"devices={devices!r}" in str(info.value)
    assert says in str(info.value)


def test_several_devices_with_a_single_device_strategy():
    with pytest.raises(ValueError, match=r"devices=2 with strategy='single', which runs on one device\. Use strategy='ddp'"):
        Trainer(strategy="single", devices=2, **quiet())


@pytest.mark.skipif(GPUS > 7, reason="cuda:7 exists here")
@pytest.mark.parametrize("strategy", ["single", "dp", "ddp", "auto"])
def test_a_device_index_that_does_not_exist(strategy):
    with pytest.raises(ValueError) as info:
        Trainer(strategy=strategy, devices=[7], **quiet())
    assert "devices=[7]: CUDA device 7 does not exist" in str(info.value)
    assert f"this machine has {GPUS} visible CUDA device(s)" in str(info.value)


@pytest.mark.skipif(GPUS >= 2, reason="'auto' picks ddp with 2 or more GPUs")
def test_auto_is_one_device_without_a_launcher():
    strategy = Trainer(**quiet()).strategy
    assert type(strategy) is SingleDeviceStrategy
    assert strategy.root_device.type == ("cuda" if GPUS else "cpu")


def test_auto_with_several_devices_is_ddp():
    strategy = Trainer(devices=2, **quiet()).strategy
    assert type(strategy) is DDPStrategy and strategy.num_processes == 2


def test_auto_joins_a_launcher(monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    strategy = Trainer(**quiet()).strategy
    assert type(strategy) is DDPStrategy
    assert strategy.num_processes == 4  # the whole job, not this node
    with pytest.raises(ValueError, match="the launcher started 2 process"):
        Trainer(devices=3, **quiet())


def _own_env(monkeypatch, *names: str) -> None:
    """Let monkeypatch restore ``names`` even though the code under test sets them itself."""
    for name in names:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def _srun_task(monkeypatch, **env: str) -> None:
    _own_env(monkeypatch, "MASTER_ADDR", "MASTER_PORT")
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def test_slurm_srun_is_translated(monkeypatch):
    _srun_task(
        monkeypatch, SLURM_PROCID="3", SLURM_LOCALID="1", SLURM_NTASKS="6", SLURM_NODEID="1",
        SLURM_STEP_TASKS_PER_NODE="2(x2),2", SLURM_JOB_ID="4321", SLURM_NODELIST="gpu-a[07-09],gpu-b1",
    )
    env = launched_env()
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (3, 6, 1, 2)
    assert os.environ["MASTER_ADDR"] == "gpu-a07"
    assert os.environ["MASTER_PORT"] == str(15000 + 4321 % 20000)
    assert type(Trainer(**quiet()).strategy) is DDPStrategy


def test_slurm_keeps_a_rendezvous_the_user_set(monkeypatch):
    _srun_task(monkeypatch, SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NTASKS="2", SLURM_NTASKS_PER_NODE="2")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.5")
    monkeypatch.setenv("MASTER_PORT", "29400")
    assert launched_env().local_world_size == 2
    assert (os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]) == ("10.0.0.5", "29400")


def test_slurm_one_task_or_a_plain_allocation_is_not_a_launch(monkeypatch):
    _srun_task(monkeypatch, SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NTASKS="1")
    assert launched_env() is None
    monkeypatch.delenv("SLURM_PROCID")  # an `salloc` shell: the job's variables but no task
    monkeypatch.setenv("SLURM_NTASKS", "4")
    assert launched_env() is None


def test_torchrun_variables_win_over_slurm(monkeypatch):
    _srun_task(monkeypatch, SLURM_PROCID="5", SLURM_LOCALID="1", SLURM_NTASKS="8")
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    assert launched_env().rank == 0 and launched_env().world_size == 2


@pytest.mark.skipif(GPUS > 0, reason="the line names the CPU")
def test_fit_logs_one_line_with_strategy_devices_world_size_and_global_batch(trainer_log):
    Trainer(strategy="single", max_steps=1, accumulate_grad_batches=3, **quiet()).fit(Classifier(), loader(batch_size=8))
    lines = [line for line in trainer_log if line.startswith("Training with")]
    assert lines == [
        "Training with single on cpu; 1 device(s), world size 1; "
        "global batch 24 = 8 per device x 1 device(s) x 3 accumulation."
    ]


def test_strategy_base_defaults_are_identities():
    base = Strategy()
    t = torch.ones(3)
    assert base.all_reduce_sum(t) is t
    assert base.broadcast_object("x") == "x"
    assert base.gather_objects(5) == [5]
    assert base.is_global_zero and base.world_size == 1


def test_parallel_strategy_is_the_base_of_ddp_fsdp_and_dp_as_in_lightning():
    from strategies import FSDPStrategy, ParallelStrategy

    for name, parallel in (("ddp", True), ("fsdp", True), ("dp", True), ("single", False)):
        strategy = Trainer(strategy=name, devices=2 if parallel and name != "dp" else "auto", **quiet()).strategy
        assert isinstance(strategy, ParallelStrategy) is parallel, name
    assert issubclass(FSDPStrategy, ParallelStrategy) and not issubclass(SingleDeviceStrategy, ParallelStrategy)
