"""CSVLogger: ``metrics.csv`` and ``hparams.yaml`` in a version folder, with the standard library only."""

from __future__ import annotations

import csv
import io
import os
import warnings
from typing import Any

from trainer.core.checks import positive_int

from ._disk import naming, remote_fs
from ._hparams import _yaml_lines, write_yaml
from .logger import FolderLogger, add_prefix, params_dict, rank_zero_experiment, rank_zero_only


class ExperimentWriter:
    """``metrics.csv``: a ``step`` column then one column per name (sorted), one row per
    logged step. Values logged for the same step in several calls (training, the epoch's
    means, validation) share its row; a name not logged at a step leaves its cell empty.
    Rows wait in memory until ``save``; a header that gains a column rewrites the file."""

    NAME_METRICS_FILE = "metrics.csv"

    def __init__(self, log_dir: str, *, resumed: bool = False) -> None:
        """``resumed``: a fit resumed from a checkpoint goes on after the rows already there (the logger's
        ``drop_after_step`` cut them at its step); else, as Lightning's, an old ``metrics.csv`` is deleted."""
        self.log_dir = log_dir
        self.metrics_file_path = os.path.join(log_dir, self.NAME_METRICS_FILE)
        self.hparams: dict[str, Any] = {}
        self._rows: list[dict[str, Any]] = []  # not yet on disk (the first may be the last one written, reopened)
        self._header: list[str] = []  # the columns on disk
        self._last: dict[str, Any] | None = None  # the last row on disk, and where it starts
        self._last_offset = 0
        self._reopened = False  # self._rows[0] replaces the last row on disk
        self._fs = remote_fs(log_dir)  # None: a local folder
        if not resumed:
            self._clear_old_run()
        if self._fs is not None:
            self._fs.makedirs(log_dir, exist_ok=True)
            return
        os.makedirs(log_dir, exist_ok=True)
        if os.path.exists(self.metrics_file_path):  # a resumed run: carry on after the rows there
            with open(self.metrics_file_path, newline="", encoding="utf-8") as f:
                self._header = next(csv.reader(f), [])
            self._last_offset = os.path.getsize(self.metrics_file_path)

    def _clear_old_run(self) -> None:
        """Lightning's: a version folder used before (``CSVLogger(version=0)`` again) is warned about,
        and its ``metrics.csv`` deleted, so that the new run's rows are not mixed with the old ones."""
        fs = self._fs
        # Files only: the run's own empty checkpoints/ folder is made before the logger's first write here
        # (Lightning makes it at the first save), and is no old run.
        if fs is None and not any(files for _, _, files in os.walk(self.log_dir)):
            return
        if fs is not None and not (fs.isdir(self.log_dir) and fs.find(self.log_dir)):
            return
        warnings.warn(
            f"Experiment logs directory {self.log_dir} exists and is not empty. Previous log files in this "
            "directory will be deleted when the new ones are saved! To go on after the rows of a run you "
            "resume, pass its checkpoint: trainer.fit(model, ckpt_path=...).",
            UserWarning, stacklevel=4,
        )
        if fs is None and os.path.isfile(self.metrics_file_path):
            os.remove(self.metrics_file_path)
        elif fs is not None and fs.isfile(self.metrics_file_path):
            fs.rm_file(self.metrics_file_path)

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """The rows not yet on disk (Lightning's name): ``save`` writes them and empties it."""
        return self._rows

    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        if step is None:  # Lightning's: the count of rows waiting
            step = len(self._rows)
        values = {k: _value(v) for k, v in metrics.items()}
        if self._rows and self._rows[-1]["step"] == step:
            self._rows[-1].update(values)
        elif not self._rows and self._last is not None and self._last["step"] == step:
            self._rows.append({**self._last, **values})  # the row on disk gets these too
            self._reopened = True
        else:
            self._rows.append({"step": step, **values})

    def log_hparams(self, params: dict[str, Any]) -> None:
        """Record ``params`` and write ``hparams.yaml`` now, as Lightning's writer does."""
        self.hparams.update(params)
        self._write_hparams()

    def _write_hparams(self) -> None:
        path = os.path.join(self.log_dir, "hparams.yaml")
        if self._fs is None:
            write_yaml(path, self.hparams)
            return
        with self._fs.open(path, "w", encoding="utf-8") as f:
            f.write("".join(_yaml_lines(self.hparams, 0)) if self.hparams else "{}\n")

    def save(self) -> None:
        if self.hparams:
            self._write_hparams()
        if not self._rows:
            return
        names = {k for row in self._rows for k in row} - {"step"}
        if self._fs is not None:
            self._save_remote(sorted(names | set(self._header) - {"step"}))
            return
        if not self._header or not names <= set(self._header):
            self._rewrite(sorted(names | set(self._header) - {"step"}))
        else:
            mode = "r+" if os.path.exists(self.metrics_file_path) else "w"
            with naming(self.metrics_file_path), open(
                self.metrics_file_path, mode, newline="", encoding="utf-8",
            ) as f:
                f.seek(self._last_offset if self._reopened else 0, os.SEEK_SET if self._reopened else os.SEEK_END)
                f.truncate()
                self._append(f, self._header)
        self._rows, self._reopened = [], False

    def _save_remote(self, names: list[str]) -> None:
        """A remote file is written whole (object stores neither append nor truncate)."""
        old: list[dict[str, Any]] = []
        if self._fs.exists(self.metrics_file_path):
            with self._fs.open(self.metrics_file_path, "r", newline="", encoding="utf-8") as f:
                old = list(csv.DictReader(f))
        if self._reopened:  # self._rows[0] is the last row there, updated
            old = old[:-1]
        self._header = ["step", *names]
        with self._fs.open(self.metrics_file_path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=self._header, restval="")
            writer.writeheader()
            writer.writerows(old)
            writer.writerows(self._rows)
        self._last = self._rows[-1]
        self._rows, self._reopened = [], False

    def _append(self, f: Any, header: list[str]) -> None:
        writer = csv.DictWriter(f, fieldnames=header, restval="")
        for row in self._rows:
            self._last_offset = f.tell()
            writer.writerow(row)
        self._last = self._rows[-1]

    def _rewrite(self, names: list[str]) -> None:
        """A new column: the rows on disk (less a reopened last one) and the new ones, under the new header."""
        old: list[dict[str, Any]] = []
        if os.path.exists(self.metrics_file_path):
            with open(self.metrics_file_path, "rb") as raw:  # the offset counts bytes
                data = raw.read(self._last_offset if self._reopened else -1).decode("utf-8")
            old = list(csv.DictReader(io.StringIO(data, newline="")))
        header = ["step", *names]
        tmp = f"{self.metrics_file_path}.tmp{os.getpid()}"
        with naming(self.metrics_file_path, tmp):
            with open(tmp, "w", newline="", encoding="utf-8") as f:
                writer = csv.DictWriter(f, fieldnames=header, restval="")
                writer.writeheader()
                writer.writerows(old)
                self._append(f, header)
            os.replace(tmp, self.metrics_file_path)
        self._header = header


def _value(value: Any) -> Any:
    if hasattr(value, "item"):  # a tensor (read when the step is logged, as Lightning does)
        return value.item()
    return value


class CSVLogger(FolderLogger):
    """Writes ``<save_dir>/<name>/version_<n>/metrics.csv`` and ``hparams.yaml`` beside it.

    ``metrics.csv`` has a ``step`` column and one column per logged name; the rows reach the
    file at ``save`` (epoch ends and validations, at most once a second), every
    ``flush_logs_every_n_steps`` steps, and when the stage ends. ``hparams.yaml`` holds the
    model's ``save_hyperparameters`` arguments. Read them with ``csv.DictReader`` (or pandas).
    """

    LOGGER_JOIN_CHAR = "-"

    def __init__(
        self,
        save_dir: str | os.PathLike | None = None,
        name: str | None = "lightning_logs",
        version: int | str | None = None,
        prefix: str = "",
        flush_logs_every_n_steps: int = 100,
    ) -> None:
        super().__init__(save_dir, name, version)
        if not isinstance(prefix, str):
            raise TypeError(f"CSVLogger(prefix={prefix!r}) must be a string, put before each name with '-'.")
        self._prefix = prefix
        self._flush_every = positive_int("CSVLogger(flush_logs_every_n_steps)", flush_logs_every_n_steps)
        self._experiment: ExperimentWriter | None = None
        self._resumed = False  # a fit resumed past step 0: metrics.csv goes on after its kept rows

    @property
    @rank_zero_experiment
    def experiment(self) -> ExperimentWriter:
        """The writer of ``metrics.csv`` (its folder is made on first use)."""
        if self._experiment is None:
            self._experiment = ExperimentWriter(self.log_dir, resumed=self._resumed)
        return self._experiment

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        step = len(self.experiment._rows) if step is None else int(step)
        self.experiment.log_metrics(add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR), step)
        if (step + 1) % self._flush_every == 0:
            self.save()

    @rank_zero_only
    def log_hyperparams(self, params: Any = None) -> None:
        self.experiment.log_hparams({k: v for k, v in params_dict(params).items() if not str(k).startswith("trainer/")})

    @rank_zero_only
    def save(self) -> None:
        if self._experiment is not None:
            self._experiment.save()

    @rank_zero_only
    def finalize(self, status: str) -> None:
        self.save()

    def drop_after_step(self, step: int) -> None:
        """Before a fit that resumes at ``step``: rows the crashed run wrote after it go."""
        path = os.path.join(self.log_dir, ExperimentWriter.NAME_METRICS_FILE)
        self._resumed = self._resumed or bool(step)
        if not step or not os.path.exists(path):
            return
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f)
            header, rows = reader.fieldnames or [], [r for r in reader if int(r["step"]) <= step]
        tmp = f"{path}.tmp{os.getpid()}"
        with open(tmp, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=header)
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, path)
        self._experiment = None  # reopened after the kept rows

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_experiment"] = None
        return state
