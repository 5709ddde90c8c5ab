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
            local_world_size=int(env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0]),
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


def _first_host(nodelist: str) -> str:
    """'node[03-05,07],gpu1' -> 'node03'."""
    m = re.match(r"([^,\[]+)(?:\[([0-9]+))?", nodelist)
    if not m:
        return nodelist
    return m.group(1) + (m.group(2) or "")
