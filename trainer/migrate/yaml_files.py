"""Rewrites the Lightning names in a YAML config (LightningCLI's ``class_path: lightning.pytorch...``) in place.

The file is not loaded and dumped again, which would lose its comments, order and quoting: each scalar
that is a whole Lightning name is replaced in the text, and PyYAML then checks that the rewritten file
reads as the old one with those names, and nothing else, replaced.
"""

from __future__ import annotations

import re
from typing import Any

from trainer.migrate.names import resolve, resolve_module
from trainer.migrate.problem import Problem

# A plain or quoted scalar that is a whole dotted Lightning name: after `key: `, a list's `- `, or inside a
# flow collection, and followed by the end of the line, a comment, or the collection's next item.
_SCALAR = re.compile(
    r"""(?P<before>(?:^[ \t]*(?:-[ \t]+)+|:[ \t]+|[\[{,][ \t]*))(?P<quote>["']?)"""
    r"""(?P<name>(?:lightning|pytorch_lightning)(?:\.[A-Za-z_]\w*)+)(?P=quote)(?=[ \t]*(?:\r?$|[,\]}]|\#))""",
    re.MULTILINE,
)


def unmapped(name: str) -> bool:
    """Whether ``name`` names a Lightning class we have no counterpart for (a module name is left alone)."""
    return resolve(name) is None and resolve_module(name) is None and name.rpartition(".")[2][:1].isupper()


def _renamed(data: Any) -> Any:
    if isinstance(data, str):
        return resolve(data) or data
    if isinstance(data, dict):
        return {k: _renamed(v) for k, v in data.items()}  # a key is never a class path
    if isinstance(data, list):
        return [_renamed(v) for v in data]
    return data


def migrate_yaml(source: str, path: str) -> tuple[str, list[Problem]]:
    """``source`` with its Lightning class paths replaced by ours, and what could not be; with a problem the
    source comes back as it was."""
    if "lightning" not in source:
        return source, []
    import yaml

    problems: list[Problem] = []

    def replace(match: re.Match[str]) -> str:
        name = match["name"]
        if unmapped(name):
            line = source.count("\n", 0, match.start("name")) + 1
            problems.append(Problem(path, line, f"no counterpart for {name}"))
        return match["before"] + match["quote"] + (resolve(name) or name) + match["quote"]

    new = _SCALAR.sub(replace, source)
    if problems or new == source:
        return source, problems
    try:
        same = yaml.safe_load(new) == _renamed(yaml.safe_load(source))
    except yaml.YAMLError as e:
        line = getattr(getattr(e, "problem_mark", None), "line", 0) + 1
        return source, [Problem(path, line, f"cannot read the file as YAML ({type(e).__name__})")]
    if not same:  # a name inside a longer text, or a key: safer to leave the file to the user
        return source, [Problem(path, 1, "cannot rewrite this file's Lightning names without changing other values")]
    return new, []
