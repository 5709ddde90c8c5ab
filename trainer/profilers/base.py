"""``Profiler``, the class every profiler subclasses, and ``PassThroughProfiler``, the one that records nothing."""

from __future__ import annotations

import logging
import os
import re
from abc import ABC, abstractmethod
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, TextIO

log = logging.getLogger(__name__)

# Characters that are not safe in a file name on some platform: an action such as "val/loss" must not make a folder.
_UNSAFE = re.compile(r"[\\/:*?\"<>|\n\r\t]")


class Profiler(ABC):
    """Records how long named actions take; subclass it to write your own profiler.

    ``start(action)`` and ``stop(action)`` bracket one action (``profile(action)`` is the same as a
    ``with`` block); ``summary()`` is the report. The Trainer calls ``setup`` when a stage starts,
    the actions in between (``run_training_epoch``, ``[Callback]<key>.<hook>``, ...; see
    docs/profiling.md), and ``describe()`` when the stage ends, which writes the summary to
    ``<dirpath>/<stage>-<filename>.txt`` when ``filename`` is given (the rank joins the name
    under several processes), else logs it. ``dirpath`` defaults to ``trainer.log_dir``.
    """

    def __init__(self, dirpath: str | Path | None = None, filename: str | None = None) -> None:
        self.dirpath = dirpath
        self.filename = filename
        self._output_file: TextIO | None = None
        self._write_stream: Callable[[str], Any] | None = None
        self._local_rank: int | None = None
        self._stage: str | None = None

    @abstractmethod
    def start(self, action_name: str) -> None:
        """Start recording ``action_name``."""

    @abstractmethod
    def stop(self, action_name: str) -> None:
        """Stop recording ``action_name``, started before."""

    def summary(self) -> str:
        """The report that ``describe`` writes; empty says nothing."""
        return ""

    @contextmanager
    def profile(self, action_name: str) -> Iterator[str]:
        """``with profiler.profile("load data"): ...`` records the block as one ``"load data"`` action."""
        try:
            self.start(action_name)
            yield action_name
        finally:
            self.stop(action_name)

    # --- a stage -----------------------------------------------------------------------
    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        """Before a stage's first action: its name (``"fit"``, ``"validate"``, ...), this process's
        rank when there are several (None for one), and the folder to write to if ``dirpath`` is None."""
        self._stage = stage
        self._local_rank = local_rank
        self.dirpath = self.dirpath or log_dir

    def setup_module(self, module: Any) -> None:
        """The module a stage runs, given after ``setup`` (None after ``teardown``). The
        ``PyTorchProfiler`` labels its submodules' calls; the others ignore it."""

    def describe(self) -> None:
        """Write the summary: to ``<dirpath>/<file name>`` with a ``filename``, else to the log (rank 0's)."""
        self._prepare_streams()  # a profiler used on its own, without a Trainer, describes too
        summary = self.summary()
        if summary and self._write_stream is not None:
            self._write_stream(summary)
        if self._output_file is not None:
            self._output_file.flush()
        self.teardown(stage=self._stage)

    def teardown(self, stage: str | None) -> None:
        """After a stage: the report's file is closed."""
        self._write_stream = None
        if self._output_file is not None:
            self._output_file.close()
            self._output_file = None  # an open file cannot be pickled or deep-copied

    @property
    def local_rank(self) -> int:
        return 0 if self._local_rank is None else self._local_rank

    # --- file names and the report -------------------------------------------------------
    def _prepare_filename(self, action_name: str | None = None, extension: str = ".txt") -> str:
        """``<stage>-<filename>-<rank>-<action><extension>``, each part where known, unsafe characters as ``_``."""
        rank = None if self._local_rank is None else str(self._local_rank)
        parts = [self._stage, self.filename or None, rank, action_name]
        base = "-".join(p for p in parts if p is not None)
        base = re.sub(r"_+", "_", _UNSAFE.sub("_", base)).strip()
        return (base or "profile") + extension

    def _prepare_streams(self) -> None:
        if self._write_stream is not None:
            return
        if self.filename and self.dirpath:
            os.makedirs(self.dirpath, exist_ok=True)
            self._output_file = open(os.path.join(self.dirpath, self._prepare_filename()), "a")
            self._write_stream = self._output_file.write
        else:
            self._write_stream = self._rank_zero_info

    def _rank_zero_info(self, *args: Any, **kwargs: Any) -> None:
        if self._local_rank in (None, 0):
            log.info(*args, **kwargs)

    def _stats_to_str(self, stats: dict[str, str]) -> str:
        """A report of one text per action, headed by the stage and the rank."""
        output = [(f"{self._stage.upper()} " if self._stage is not None else "") + "Profiler Report"]
        rank = f" rank: {self._local_rank}" if self._local_rank is not None else ""
        for action, value in stats.items():
            output += [f"Profile stats for: {action}{rank}", value]
        return os.linesep.join(output)

    def __del__(self) -> None:
        if "_output_file" in vars(self):  # not when __init__ failed before it
            self.teardown(stage=self._stage)


class PassThroughProfiler(Profiler):
    """Records nothing: the Trainer's profiler when none is asked for. The Trainer sees it and
    times nothing, so a run without a profiler pays nothing for one."""

    def start(self, action_name: str) -> None:
        pass

    def stop(self, action_name: str) -> None:
        pass
