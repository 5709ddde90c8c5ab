"""``MisconfigurationException``: Lightning's error for a setting that cannot work, under its name."""

from __future__ import annotations


class MisconfigurationException(ValueError):
    """A setting, or a combination of them, that cannot work: a bad Trainer argument, a module
    that lacks what a stage needs, a scheduler without the monitor it steps on, ...

    Lightning code catches it as ``except MisconfigurationException`` (and its tests match its
    message); it is a ``ValueError``, so ``except ValueError`` catches it too. The message
    starts with Lightning's sentence where Lightning has one, and then says what to do.
    """
