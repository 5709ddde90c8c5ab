"""Lightning's ``FSDPStrategy`` options, which name torch's FSDP1 wrapper, read as FSDP2 (``fully_shard``) settings."""

from __future__ import annotations

from typing import Any

from torch.distributed.fsdp import CPUOffload, MixedPrecision, MixedPrecisionPolicy, ShardingStrategy

#: FSDP1 options that FSDP2 does by itself: kept in ``FSDPStrategy.kwargs``, with nothing left to set.
#: ``use_orig_params``: FSDP2 has no flat parameters, the optimizer always holds the original ones;
#: the prefetches and ``limit_all_gathers``: FSDP2 prefetches and limits in-flight all-gathers itself;
#: ``sync_module_states``: the strategy broadcasts rank 0's weights before sharding.
BUILT_IN = ("use_orig_params", "limit_all_gathers", "forward_prefetch", "backward_prefetch", "sync_module_states")
#: ``fully_shard``'s own options, passed to it as given
PASSED = ("shard_placement_fn", "ignored_params")

HYBRID = (ShardingStrategy.HYBRID_SHARD, ShardingStrategy._HYBRID_SHARD_ZERO2)
# Whether each group frees its gathered parameters after forward (FSDP2's reshard_after_forward)
_RESHARDS = {
    ShardingStrategy.FULL_SHARD: True, ShardingStrategy.HYBRID_SHARD: True,
    ShardingStrategy.SHARD_GRAD_OP: False, ShardingStrategy._HYBRID_SHARD_ZERO2: False,
    ShardingStrategy.NO_SHARD: False,  # a shard is the whole parameter: nothing to free
}


def cpu_offload_config(value: Any) -> CPUOffload:
    """Lightning's ``cpu_offload``: a bool (or None) becomes ``CPUOffload(offload_params=value)``."""
    if value is None or isinstance(value, bool):
        return CPUOffload(offload_params=bool(value))
    if isinstance(value, CPUOffload):
        return value
    raise TypeError(
        f"FSDPStrategy(cpu_offload={value!r}) must be True, False or a torch.distributed.fsdp.CPUOffload."
    )


def sharding_strategy_of(value: Any, reshard_after_forward: bool | None) -> ShardingStrategy:
    """Lightning's ``sharding_strategy`` (a ``ShardingStrategy`` or its name, any case); left out
    (None), it follows ``reshard_after_forward``: True or None is FULL_SHARD, False SHARD_GRAD_OP."""
    if reshard_after_forward is not None and not isinstance(reshard_after_forward, bool):
        raise TypeError(f"FSDPStrategy(reshard_after_forward={reshard_after_forward!r}) must be True or False.")
    if value is None:
        return ShardingStrategy.SHARD_GRAD_OP if reshard_after_forward is False else ShardingStrategy.FULL_SHARD
    if isinstance(value, str) and value.upper() in ShardingStrategy.__members__:
        value = ShardingStrategy[value.upper()]
    if not isinstance(value, ShardingStrategy):
        names = ", ".join(repr(n) for n in ShardingStrategy.__members__ if not n.startswith("_"))
        raise ValueError(f"FSDPStrategy(sharding_strategy={value!r}): use one of {names}, or a ShardingStrategy.")
    if reshard_after_forward is not None and reshard_after_forward != _RESHARDS[value]:
        raise ValueError(
            f"FSDPStrategy(sharding_strategy={value.name!r}, reshard_after_forward={reshard_after_forward!r}) "
            f"contradict each other: {value.name} means reshard_after_forward={_RESHARDS[value]}. Pass one of them."
        )
    return value


def reshards(strategy: ShardingStrategy) -> bool:
    return _RESHARDS[strategy]


def check_device_mesh(device_mesh: Any, strategy: ShardingStrategy) -> None:
    """A hybrid strategy needs a 2-D mesh (replicas, shard size); the others take none."""
    if strategy in HYBRID and device_mesh is None:
        raise ValueError(
            f"The hybrid sharding strategy requires you to pass `device_mesh`: sharding_strategy={strategy.name!r} "
            "shards within groups of processes and replicates across them; say how many, e.g. "
            "FSDPStrategy(sharding_strategy='HYBRID_SHARD', device_mesh=(num_nodes, devices_per_node))."
        )
    if device_mesh is None:
        return
    if strategy not in HYBRID:
        raise ValueError(
            f"FSDPStrategy(device_mesh={device_mesh!r}) is for the hybrid sharding strategies: add "
            "sharding_strategy='HYBRID_SHARD' (or '_HYBRID_SHARD_ZERO2'), or leave device_mesh out."
        )
    if isinstance(device_mesh, (tuple, list)) and not (
        len(device_mesh) == 2 and all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in device_mesh)
    ):
        raise ValueError(
            f"FSDPStrategy(device_mesh={device_mesh!r}) must be (replication size, sharding size), two positive "
            "ints whose product is the number of processes, or a torch DeviceMesh of two dimensions."
        )


def mp_policy_of(config: Any) -> MixedPrecisionPolicy | None:
    """Lightning's ``mixed_precision`` (FSDP1's ``MixedPrecision``), or FSDP2's own policy, as FSDP2's policy.

    FSDP2 casts no buffers, so a ``buffer_dtype`` has nothing to act on: buffers keep their dtype."""
    if config is None or isinstance(config, MixedPrecisionPolicy):
        return config
    if isinstance(config, MixedPrecision):
        return MixedPrecisionPolicy(
            param_dtype=config.param_dtype, reduce_dtype=config.reduce_dtype,
            cast_forward_inputs=config.cast_forward_inputs or config.cast_root_forward_inputs,
        )
    raise TypeError(
        f"FSDPStrategy(mixed_precision={config!r}) must be a torch.distributed.fsdp.MixedPrecision "
        "(or FSDP2's MixedPrecisionPolicy), e.g. MixedPrecision(param_dtype=torch.bfloat16)."
    )


def shard_of(shard: Any, auto_wrap_policy: Any) -> Any:
    """Lightning's ``auto_wrap_policy``, a set of module classes, is ``shard``."""
    if auto_wrap_policy is None:
        return shard
    if shard is not None:
        raise ValueError(
            "FSDPStrategy(shard=..., auto_wrap_policy=...): auto_wrap_policy is Lightning's name for shard. "
            "Pass one of them."
        )
    if not isinstance(auto_wrap_policy, (set, frozenset, list, tuple)):
        raise TypeError(
            f"FSDPStrategy(auto_wrap_policy={auto_wrap_policy!r}): FSDP1's wrap-policy functions have no "
            "FSDP2 counterpart; pass a set of module classes, e.g. {TransformerBlock}, or "
            "shard=lambda module: ... (True for each module to shard on its own)."
        )
    return list(auto_wrap_policy)


def check_kwargs(kwargs: dict[str, Any]) -> None:
    """Every other keyword is one of FSDP1's that FSDP2 does by itself, or one of ``fully_shard``'s."""
    unknown = [name for name in kwargs if name not in BUILT_IN + PASSED]
    if unknown:
        raise TypeError(
            f"FSDPStrategy got {unknown[0]}={kwargs[unknown[0]]!r}, an option this strategy does not take: it "
            f"shards with FSDP2's fully_shard, not FSDP1's FullyShardedDataParallel. It takes fully_shard's "
            f"{', '.join(PASSED)}, and accepts FSDP1's {', '.join(BUILT_IN)}, which FSDP2 does by itself."
        )
