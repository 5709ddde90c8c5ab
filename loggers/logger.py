"""The Logger base class, rank-zero guards, and the version folders of file loggers."""

from __future__ import annotations

import functools
import os
from abc import ABC, abstractmethod
from typing import Any, Callable

from trainer.checkpoint.run_dir import claim_version, resumed_version
from trainer.core.distributed import rank_zero_only

from ._disk import remote_fs


class DummyExperiment:
    """What ``logger.experiment`` is on ranks other than 0: every call does nothing."""

    def nop(self, *args: Any, **kwargs: Any) -> None:
        return None

    def __getattr__(self, name: str) -> Callable[..., None]:
        return self.nop

    def __getitem__(self, index: Any) -> DummyExperiment:  # self.logger.experiment[0].add_image(...)
        return self

    def __setitem__(self, *args: Any) -> None:
        return None


def rank_zero_experiment(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """For a logger's ``experiment`` property: the real object on rank 0, a
    :class:`DummyExperiment` elsewhere (so user code may call it on every rank)."""

    @functools.wraps(fn)
    def experiment(self: Any) -> Any:
        if rank_zero_only.rank > 0:
            return DummyExperiment()
        return fn(self)

    return experiment


class Logger(ABC):
    """What the Trainer writes to: subclass it for a tracking service (about 20 lines).

    The Trainer calls these on global rank 0 only: ``log_hyperparams`` when fit starts (the
    model's ``save_hyperparameters`` arguments), ``log_graph`` then too, ``log_metrics`` at
    each logging step (every ``log_every_n_steps`` optimizer steps), at each epoch's end and
    after each validation and test, ``save`` at most once a second at epoch ends and
    validations, and ``finalize("success")`` (or ``"failed"``) when a stage ends. The values
    it gets are floats, or tensors the logger turns into numbers when it writes them.

    The Trainer's side: a few public methods, not part of Lightning's Logger, through which the
    Trainer tells a logger where and when a run starts. Their defaults suit a logger that writes
    to a service, so a subclass overrides none of them; the file loggers (``FolderLogger``) do.
    ``use_trainer_dir`` (given to a Trainer), ``prepare_stage`` (rank 0, before each stage),
    ``drop_after_step`` (a fit that resumes), ``log_fit_hyperparams`` (a fit's start),
    ``pinned_version``, ``chosen_version`` and ``use_version`` (the version folder, told to every rank).
    """

    @property
    @abstractmethod
    def name(self) -> str | None:
        """The experiment's name."""

    @property
    @abstractmethod
    def version(self) -> int | str | None:
        """The experiment's version (``version_<n>`` folders for file loggers)."""

    @property
    def root_dir(self) -> str | None:
        """The folder holding all versions of this experiment (None if nothing is saved locally)."""
        return None

    @property
    def log_dir(self) -> str | None:
        """This version's folder (None if nothing is saved locally)."""
        return None

    @property
    def save_dir(self) -> str | None:
        """The folder under which the logger writes (None if nothing is saved locally)."""
        return None

    @property
    def group_separator(self) -> str:
        return "/"

    @property
    def experiment(self) -> Any:
        """The service's own object (a ``SummaryWriter`` for TensorBoard), for what the
        interface does not cover. Wrap an override with :func:`rank_zero_experiment`."""
        return DummyExperiment()

    @abstractmethod
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Record ``metrics`` (name -> number) at ``step`` (the global step)."""

    @abstractmethod
    def log_hyperparams(self, params: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        """Record the hyperparameters (a dict, or an ``argparse.Namespace``)."""

    def log_graph(self, model: Any, input_array: Any = None) -> None:
        """Record the model's graph (most loggers do nothing)."""

    def save(self) -> None:
        """Make what was logged durable (write buffered values)."""

    def finalize(self, status: str) -> None:
        """The stage ended with ``status`` ("success" or "failed"): save, release resources."""
        self.save()

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        """Called by ``ModelCheckpoint`` after each save, on global rank 0, with the file on disk
        (e.g. to upload it: ``checkpoint_callback.best_model_path``, ``last_model_path``). A
        logger that overrides it makes each save wait for its background write first."""

    # --- the Trainer's side (not Lightning's: names a Lightning logger does not define) ----
    def use_trainer_dir(self, save_dir: str, name: str) -> None:
        """Given to a Trainer: a logger made without a ``save_dir`` writes under the Trainer's
        ``save_dir`` (its ``log_dir``, else the working directory) and ``name``. Default: nothing."""

    def prepare_stage(self, resume_path: str | None, *, fit: bool) -> None:
        """Global rank 0, before each stage (``fit`` true for a fit, which may resume the checkpoint
        ``resume_path``). Default: the run starts now, as in Lightning (``experiment`` is read, so an
        MLflow or W&B run exists and its id can name the run's folder)."""
        getattr(self, "experiment", None)  # read for its effect: the run starts

    def drop_after_step(self, step: int) -> None:
        """Before a fit that resumes at global step ``step``: forget what a crashed run wrote after
        it (the CSV rows, the TensorBoard events). Default: nothing."""

    def log_fit_hyperparams(self, hparams: dict[str, Any], trainer_options: dict[str, Any]) -> None:
        """A fit's start: the model's ``save_hyperparameters`` (and the DataModule's), and the
        Trainer's options as ``trainer/<name>``. Default: ``log_hyperparams(hparams)``, as Lightning."""
        self.log_hyperparams(hparams)

    @property
    def pinned_version(self) -> int | str | None:
        """The version the user gave (``version=...``), which no fit changes; None by default."""
        return None

    @property
    def chosen_version(self) -> int | str | None:
        """The version picked so far, without picking one (``version`` picks); None by default."""
        return None

    def use_version(self, version: int | str) -> None:
        """On the ranks other than 0: the version rank 0 picked, so every rank names the same
        folder. Default: nothing."""


class DummyLogger(Logger):
    """Lightning's stand-in for the loggers under ``fast_dev_run``: ``trainer.logger`` is one,
    so code such as ``self.logger.experiment.add_image(...)`` runs and writes nothing."""

    @property
    def name(self) -> str:
        return ""

    @property
    def version(self) -> str:
        return ""

    def log_metrics(self, *args: Any, **kwargs: Any) -> None:  # any arguments, as Lightning's: it records nothing
        pass

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Callable[..., None]:  # another logger's method (log_text, ...): does nothing
        if name.startswith("__"):
            raise AttributeError(name)
        return DummyExperiment().nop

    def __getitem__(self, index: int) -> DummyLogger:  # self.logger[0].experiment.add_image(...)
        return self


def params_dict(params: Any) -> dict[str, Any]:
    """Hyperparameters as a dict: ``argparse.Namespace`` and other objects with ``vars``."""
    if params is None:
        return {}
    if isinstance(params, dict):
        return dict(params)
    if hasattr(params, "__dict__"):
        return dict(vars(params))
    raise TypeError(f"log_hyperparams(params={params!r:.80}) must be a dict or an argparse.Namespace.")


def add_prefix(metrics: dict[str, Any], prefix: str, separator: str = "-") -> dict[str, Any]:
    """``{"loss": 1}`` with prefix ``"train"`` -> ``{"train-loss": 1}``, as Lightning joins them."""
    if not prefix:
        return metrics
    return {f"{prefix}{separator}{k}": v for k, v in metrics.items()}


class FolderLogger(Logger):
    """A logger that writes files into ``<save_dir>/<name>/version_<n>``.

    ``version=None`` takes the next free ``n`` (the folder is made at once, so two loggers
    never share one), or, when fit resumes a checkpoint from one of this logger's version
    folders, that folder; an int gives ``version_<n>``, a string names the folder itself.
    ``save_dir=None`` means the Trainer's ``log_dir`` (and, left at its default, the
    Trainer's ``name``), filled in when the logger is given to a Trainer.
    """

    _default_name = "lightning_logs"
    _made_by_trainer = False  # Trainer(logger=True)'s: a new version for each fit
    _fit_in_version = False  # a fit wrote into the current version (a Trainer's own next fit takes another)

    # No ``kind`` argument: jsonargparse follows a subclass's ``**kwargs`` into this signature, so
    # every parameter here must be one a config may leave out (``lazy_instance(TensorBoardLogger)``).
    def __init__(
        self, save_dir: str | os.PathLike | None = None, name: str | None = None, version: int | str | None = None
    ) -> None:
        kind = type(self).__name__
        if save_dir is not None and not isinstance(save_dir, (str, os.PathLike)):
            raise TypeError(f"{kind}(save_dir={save_dir!r}) must be a folder path (str or os.PathLike).")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"{kind}(name={name!r}) must be a string (the experiment's folder), "
                            "or None or '' for none.")
        if version is not None and (isinstance(version, bool) or not isinstance(version, (int, str))):
            raise TypeError(f"{kind}(version={version!r}) must be an int (version_<n>), a string (the folder's name) "
                            "or None (the next free one).")
        self._kind = kind
        self._save_dir = None if save_dir is None else os.fspath(save_dir)
        self._name = name or ""
        self._name_given = name is not None and name != self._default_name
        self._version = version
        self._fixed_version = version is not None

    @property
    def save_dir(self) -> str | None:
        return self._save_dir

    @property
    def name(self) -> str:
        return self._name

    @property
    def root_dir(self) -> str | None:
        save_dir = self.save_dir  # (the properties, as Lightning's: a subclass may give its own name)
        # "~" and "$VAR" expanded, as Lightning's log_dir does (never a folder named "~")
        return None if save_dir is None else os.path.expanduser(os.path.expandvars(os.path.join(save_dir, self.name)))

    @property
    def version(self) -> int | str:
        if self._version is None:
            self._version = self._claim(None)
        return self._version

    @property
    def log_dir(self) -> str | None:
        """``<save_dir>/<name>/version_<n>``."""
        if self.root_dir is None:
            return None
        version = self.version
        return os.path.join(self.root_dir, version if isinstance(version, str) else f"version_{version}")

    def _claim(self, resume_path: str | None) -> int | str:
        root = self.root_dir
        if root is None:
            raise RuntimeError(
                f"{self._kind}(save_dir=None) writes under the Trainer's log_dir: give it to a Trainer first, "
                f"or pass {self._kind}(save_dir=...)."
            )
        fs = remote_fs(root)
        if fs is not None:  # s3://..., memory://...: the next free version there (its folder is made on first write)
            listed = fs.ls(root, detail=False) if fs.exists(root) else []
            names = [str(p).rstrip("/").rsplit("/", 1)[-1] for p in listed]
            return max((int(d[8:]) for d in names if d.startswith("version_") and d[8:].isdigit()), default=-1) + 1
        resumed = resumed_version(root, resume_path)
        if resumed is not None:
            return int(resumed[8:]) if resumed[8:].isdigit() else resumed
        what = f"Trainer(log_dir={self._save_dir!r}, name={self._name!r})" if self._made_by_trainer else (
            f"{self._kind}(save_dir={self._save_dir!r}, name={self._name!r})"
        )
        return claim_version(root, what)

    # --- the Trainer's side (Logger's protocol) -----------------------------------------
    def use_trainer_dir(self, save_dir: str, name: str) -> None:
        """Given to a Trainer without a save_dir: write under the Trainer's folder."""
        if self._save_dir is None:
            self._save_dir = save_dir
            if not self._name_given:
                self._name = name

    @property
    def pinned_version(self) -> int | str | None:
        return self._version if self._fixed_version else None

    @property
    def chosen_version(self) -> int | str | None:
        return self._version

    def use_version(self, version: int | str) -> None:
        self._version = version

    def prepare_stage(self, resume_path: str | None, *, fit: bool) -> None:
        """Rank 0, before a fit: pick the version (the resumed run's folder, or a fresh one for a
        logger the Trainer made itself). Its files open at the first value, so nothing else starts."""
        if fit:
            self._start_fit(resume_path, self._made_by_trainer)

    def _start_fit(self, resume_path: str | None, new_version: bool) -> None:
        if self._fixed_version:
            return
        if new_version and self._version is not None and resume_path is None and not self._fit_in_version:
            # Lightning's: a version claimed before the first fit (trainer.log_dir read, log_hyperparams
            # or a validate called) is the fit's, so that one run is one folder
            self._fit_in_version = True
            return
        if new_version or (self._version is None):
            self._version = self._claim(resume_path)
        self._fit_in_version = True
