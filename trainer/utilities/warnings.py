"""Lightning's ``PossibleUserWarning``: a warning about something that is often, not always, a mistake
(few loader workers, a logging interval longer than the epoch). ``POSSIBLE_USER_WARNINGS=0`` (or
``off``) in the environment silences them when ``trainer`` is imported, as in Lightning. And
Lightning's ``LightningDeprecationWarning``, the category of what Lightning deprecated."""

from __future__ import annotations

import os
import warnings

from trainer.core.exceptions import LightningDeprecationWarning, PossibleUserWarning

__all__ = ["LightningDeprecationWarning", "PossibleUserWarning", "disable_possible_user_warnings"]


def disable_possible_user_warnings(module: str = "") -> None:
    """Ignore ``PossibleUserWarning`` (from ``module`` only, when given: a regular expression)."""
    warnings.filterwarnings("ignore", category=PossibleUserWarning, module=module)


def honour_environment() -> None:
    """Silence them if the environment asks to (``trainer`` calls this when it is imported)."""
    if os.environ.get("POSSIBLE_USER_WARNINGS", "").lower() in ("0", "off"):
        disable_possible_user_warnings()
