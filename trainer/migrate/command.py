"""``python -m trainer.migrate PATH...``: the diff that moves a Lightning project here, ``--write`` to apply it."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Iterator

from trainer.migrate.problem import Problem

_SUFFIXES = (".py", ".yaml", ".yml")
_OURS = ("trainer", "callbacks", "loggers", "strategies")  # the top-level packages the migrated imports name
_INSTALL = 'pip install "steadytrainer[migrate]" (or pip install ".[migrate]" in a checkout)'


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.migrate",
        description="Rewrite a Lightning project's imports and config class paths into this project's names. Prints "
        "the unified diff; a name with no counterpart is reported with its file and line, and its file left as it is.",
    )
    parser.add_argument("paths", nargs="*", metavar="PATH", help="Python files, YAML configs, or folders of them")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="apply the changes in place")
    mode.add_argument("--check", action="store_true", help="exit with status 1 when a file would change (for CI)")
    mode.add_argument("--names", action="store_true", help="print the table of Lightning's names and ours (markdown)")
    return parser


def _files(paths: list[str]) -> Iterator[str]:
    for path in paths:
        if os.path.isfile(path):
            yield path
            continue
        for folder, dirs, names in os.walk(path):
            # hidden folders, caches and virtual environments hold no code of the project's own
            dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d != "__pycache__"
                             and not os.path.exists(os.path.join(folder, d, "pyvenv.cfg")))
            yield from (os.path.join(folder, n) for n in sorted(names) if n.endswith(_SUFFIXES))


def _diff(path: str, old: str, new: str) -> str:
    name = path.lstrip("/")
    lines = difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{name}", f"b/{name}")
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def _shadows(path: str) -> Problem | None:
    """A module of the project's own that a script folder would import instead of one of our packages."""
    folder, name = os.path.split(path)
    if name == "__init__.py":
        folder, name = os.path.split(folder)
        inside = os.path.dirname(path)
    else:
        name, inside = name.removesuffix(".py"), path
    if name not in _OURS or not inside or os.path.exists(os.path.join(folder, "__init__.py")):
        return None  # inside a package it is `pkg.callbacks`, which shadows nothing
    return Problem(path, 1, f"this module would be imported instead of the package {name!r} that the migrated imports "
                   f"name, when its folder is on sys.path (a script's folder is): rename it, e.g. to my_{name}")


def migrate_file(path: str) -> tuple[str, str, list[Problem]]:
    """The file's text, its text migrated, and the names it holds that have no counterpart."""
    from trainer.migrate.python_files import migrate_python
    from trainer.migrate.yaml_files import migrate_yaml

    try:
        with open(path, encoding="utf-8", newline="") as f:
            old = f.read()
    except (UnicodeDecodeError, OSError) as e:
        return "", "", [Problem(path, 1, f"cannot read the file ({e})")]
    new, problems = (migrate_python if path.endswith(".py") else migrate_yaml)(old, path)
    return old, new, problems


def main(argv: list[str] | None = None) -> int:
    """Run the command; the exit status is 0, 1 (a name with no counterpart, or ``--check`` found changes) or 2."""
    args = _parser().parse_args(argv)
    if args.names:
        from trainer.migrate.names import render_table

        print(render_table(), end="")
        return 0
    if not args.paths:
        _parser().error("give the files or folders to migrate, e.g. python -m trainer.migrate src/ configs/")
    missing = [p for p in args.paths if not os.path.exists(p)]
    if missing:
        print(f"No such file or folder: {', '.join(map(repr, missing))}.", file=sys.stderr)
        return 2
    for module in ("libcst", "yaml"):
        try:
            __import__(module)
        except ImportError:
            print(f"python -m trainer.migrate needs {module!r}, which is not installed: {_INSTALL}.", file=sys.stderr)
            return 2
    changed: list[str] = []
    problems: list[Problem] = []
    left: set[str] = set()
    for path in _files(args.paths):
        old, new, found = migrate_file(path)
        problems += found
        left |= {path} if found else set()
        shadow = _shadows(path) if path.endswith(".py") else None
        problems += [shadow] if shadow else []
        if new != old:
            changed.append(path)
            sys.stdout.write(_diff(path, old, new))
            if args.write:
                with open(path, "w", encoding="utf-8", newline="") as f:
                    f.write(new)
    for problem in problems:
        print(problem, file=sys.stderr)
    verb = "rewritten" if args.write else "to rewrite"
    summary = f"{len(changed)} file(s) {verb}; {len(problems)} problem(s), {len(left)} file(s) left as they are."
    print(summary, file=sys.stderr)
    return 1 if problems or (args.check and changed) else 0
