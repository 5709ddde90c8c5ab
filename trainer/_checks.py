"""Argument checks that turn bad input into one clear sentence."""

from __future__ import annotations

from typing import Any, Iterable


def suggest(value: str, choices: Iterable[str]) -> str:
    """' Did you mean 'x'?' for the closest choice (typo distance), or ''."""
    value = str(value).lower()
    scored = sorted(
        (score, abs(len(c) - len(value)), c)
        for c in choices
        if (score := _score(value, c.lower())) <= max(1, min(len(value), len(c)) // 2)
    )
    return f" Did you mean {scored[0][2]!r}?" if scored else ""


def _score(value: str, choice: str) -> int:
    # A typo of the whole name, or of a prefix ('bf16' for 'bf16-mixed', 'ddp_spawn' for 'ddp').
    n = min(len(value), len(choice))
    return min(_distance(value, choice), _distance(value[:n], choice[:n]) + 1)


def _distance(a: str, b: str) -> int:
    """Edit distance counting a swap of neighbours as one edit ('dpp' -> 'ddp' is 1)."""
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        prev2, prev = prev, cur
    return prev[-1]


def positive_int(name: str, value: Any, *, allow_none: bool = False, minimum: int = 1) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}={value!r} must be an int >= {minimum}" + (" or None." if allow_none else "."))
    if value < minimum:
        raise ValueError(f"{name}={value!r} must be >= {minimum}" + (" (or None)." if allow_none else "."))
    return value


def positive_number(name: str, value: Any, *, allow_none: bool = True) -> float | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name}={value!r} must be a positive number" + (" or None." if allow_none else "."))
    if not value > 0 or value != value or value == float("inf"):
        raise ValueError(f"{name}={value!r} must be a finite number > 0" + (" (or None)." if allow_none else "."))
    return value


def one_of(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        valid = ", ".join(repr(c) for c in choices)
        raise ValueError(f"Unknown {name}={value!r}. Valid: {valid}.{suggest(str(value), choices)}")
    return value


def flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name}={value!r} must be True or False.")
    return value
