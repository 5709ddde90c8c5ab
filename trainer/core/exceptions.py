"""Lightning's error for a setting that cannot work and its warning for one that may be a mistake, by their names."""

from __future__ import annotations


class MisconfigurationException(ValueError):
    """A setting, or a combination of them, that cannot work: a bad Trainer argument, a module
    that lacks what a stage needs, a scheduler without the monitor it steps on, ...

    Lightning code catches it as ``except MisconfigurationException`` (and its tests match its
    message); it is a ``ValueError``, so ``except ValueError`` catches it too. The message
    starts with Lightning's sentence where Lightning has one, and then says what to do.
    """


class MisconfigurationTypeError(MisconfigurationException, TypeError):
    """A ``MisconfigurationException`` about a value's type (``max_epochs="ten"``): ``except
    TypeError`` catches it too, as it caught this project's type errors before."""


def misconfigured(message: str, lightning: str = "", type_error: bool = False) -> MisconfigurationException:
    """The exception for a bad setting: Lightning's sentence first (its tests and users match it),
    then ours, which names the argument, shows the value and says what to do."""
    text = f"{lightning} {message}" if lightning else message
    return MisconfigurationTypeError(text) if type_error else MisconfigurationException(text)


class LightningDeprecationWarning(DeprecationWarning):
    """Lightning's category for what Lightning deprecated (``to_torchscript``): a filter or a
    ``pytest.warns`` on Lightning's name catches the same warnings here."""


class PossibleUserWarning(UserWarning):
    """Lightning's warning about a setting that is often, not always, a mistake (a logging interval
    longer than the epoch, an unset ``max_epochs``). ``trainer.utilities.disable_possible_user_warnings()``,
    or ``POSSIBLE_USER_WARNINGS=0`` in the environment, silences them all."""
