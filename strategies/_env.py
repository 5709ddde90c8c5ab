"""Rank, world size and rendezvous address, read in one place.

torchrun (and any launcher that copies its convention) sets RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT. Under SLURM's srun, the SLURM_* variables
carry the same facts; they are translated here so the rest of the code reads one format.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass


@dataclass(frozen=True)
class ClusterEnv:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int


def launched_env() -> ClusterEnv | None:
    """The cluster position if a launcher started this process, else None."""
    env = os.environ
    if all(k in env for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
        return ClusterEnv(
            rank=int(env["RANK"]),
            world_size=int(env["WORLD_SIZE"]),
            local_rank=int(env["LOCAL_RANK"]),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])),
        )
    # srun: one task per process. A plain `salloc` shell also has SLURM_NTASKS, so require
    # SLURM_PROCID/SLURM_LOCALID, which only srun sets per task.
    if all(k in env for k in ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS")) and int(env["SLURM_NTASKS"]) > 1:
        _slurm_rendezvous(env)
        return ClusterEnv(
            rank=int(env["SLURM_PROCID"]),
            world_size=int(env["SLURM_NTASKS"]),
            local_rank=int(env["SLURM_LOCALID"]),
            local_world_size=_slurm_tasks_on_this_node(env),
        )
    return None


def _slurm_rendezvous(env: os._Environ) -> None:
    """Point MASTER_ADDR/PORT at the job's first node unless the user already did."""
    if "MASTER_ADDR" not in env:
        nodes = env.get("SLURM_NODELIST", env.get("SLURM_JOB_NODELIST", "127.0.0.1"))
        env["MASTER_ADDR"] = _first_host(nodes)
    if "MASTER_PORT" not in env:
        # A port derived from the job id, so every task of one job agrees without talking.
        env["MASTER_PORT"] = str(15000 + int(env.get("SLURM_JOB_ID", "0")) % 20000)


def _slurm_tasks_on_this_node(env: os._Environ) -> int:
    """From SLURM_NTASKS_PER_NODE, else this node's entry of the step's tasks-per-node
    list ('2(x3),1' is 2, 2, 2, 1), else all tasks (one node)."""
    if "SLURM_NTASKS_PER_NODE" in env:
        return int(env["SLURM_NTASKS_PER_NODE"])
    spec = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if not spec:
        return int(env["SLURM_NTASKS"])
    counts: list[int] = []
    for part in spec.split(","):
        m = re.fullmatch(r"([0-9]+)(?:\(x([0-9]+)\))?", part.strip())
        if m is None:
            raise ValueError(f"SLURM tasks-per-node {spec!r} is not in SLURM's 'N(xM),K' form.")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    node = int(env.get("SLURM_NODEID", "0"))
    return counts[min(node, len(counts) - 1)]


def _first_host(nodelist: str) -> str:
    """'node[03-05,07],gpu1' -> 'node03'."""
    m = re.match(r"([^,\[]+)(?:\[([0-9]+))?", nodelist)
    if not m:
        return nodelist
    return m.group(1) + (m.group(2) or "")
