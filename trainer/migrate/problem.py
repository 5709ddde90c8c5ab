"""What the command could not rewrite: a sentence, and the file and line it is about."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    """A name the command cannot map (or a file it cannot read), at ``path:line``."""

    path: str
    line: int
    message: str

    def __str__(self) -> str:
        return f"{self.message} at {self.path}:{self.line}"
