"""pyproject.toml: the torch floor it declares admits no version that lacks an API the package calls."""

from __future__ import annotations

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("trainer", "callbacks", "strategies")

# What the package calls (as it is spelled in the source), and the first torch release that has it.
# A call to something newer needs a row here and a higher floor.
FIRST_RELEASE = {
    "torch.nn.utils.get_total_norm(": (2, 6),  # clipping by value (pytorch/pytorch#139662)
    'torch.amp.GradScaler("cuda")': (2, 3),  # 16-mixed
    "device_id=": (2, 3),  # dist.init_process_group(device_id=...), eager NCCL init
    "mmap=": (2, 1),  # torch.load(..., mmap=True): ckpt_path="last" checks files cheaply
    "weights_only=True": (1, 13),
}


def _source() -> str:
    text = []
    for package in PACKAGES:
        for folder, _, names in os.walk(os.path.join(ROOT, package)):
            text += [open(os.path.join(folder, n), encoding="utf-8").read() for n in names if n.endswith(".py")]
    return "\n".join(text)


def _torch_floor() -> tuple[int, int]:
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        match = re.search(r'"torch>=(\d+)\.(\d+)', f.read())
    assert match, "pyproject.toml should pin a torch floor, e.g. \"torch>=2.6\""
    return int(match[1]), int(match[2])


def test_the_torch_floor_has_every_api_the_package_calls():
    source, floor = _source(), _torch_floor()
    for api, first in FIRST_RELEASE.items():
        assert api in source, f"{api} is no longer called: drop its row (and maybe lower the floor)"
        assert floor >= first, f"torch>={floor[0]}.{floor[1]} admits versions without {api} (first in {first[0]}.{first[1]})"
