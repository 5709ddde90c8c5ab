"""The command that moves a Lightning project here: ``python -m trainer.migrate PATH...`` (the ``migrate`` extra)."""

from trainer.migrate.command import main, migrate_file
from trainer.migrate.names import MODULES, NAMES, resolve, resolve_module
from trainer.migrate.problem import Problem

__all__ = ["MODULES", "NAMES", "Problem", "main", "migrate_file", "resolve", "resolve_module"]
