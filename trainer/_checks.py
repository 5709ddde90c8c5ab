"""Argument checks that turn bad input into one clear sentence."""

from __future__ import annotations

import difflib
from typing import Any, Iterable


def suggest(value: str, choices: Iterable[str]) -> str:
    """' Did you mean 'x'?' for the closest choice, or ''."""
    close = difflib.get_close_matches(str(value), list(choices), n=1, cutoff=0.5)
    return f" Did you mean {close[0]!r}?" if close else ""


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
