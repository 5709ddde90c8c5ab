"""CometLogger: a Comet experiment (online, or offline into a local archive to upload later)."""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any, Literal

from ._tracking import need
from .logger import Logger, params_dict, rank_zero_experiment, rank_zero_only

if TYPE_CHECKING:
    import torch

log = logging.getLogger("trainer")
FRAMEWORK_NAME = "pytorch-lightning"  # what Comet's UI shows as the source, as Lightning's logger reports it
_MODES = (None, "get_or_create", "get", "create")
# Lightning's older argument names, still taken with a warning: old -> new
_RENAMED = {"experiment_name": "name", "project_name": "project", "offline": "online", "save_dir": "offline_directory"}


class CometLogger(Logger):
    """Logs to a `Comet <https://www.comet.com>`_ experiment: ``pip install "steadytrainer[comet]"``.

    As Lightning's, the experiment starts when the logger is made, on global rank 0 only, with
    ``comet_ml.start(api_key=, workspace=, project=, experiment_key=, mode=, online=)``; the
    other keywords (``name``, ``offline_directory``, ``log_code``, ...) go to
    ``comet_ml.ExperimentConfig``. ``online=False`` records the experiment into a zip archive in
    ``offline_directory`` and sends nothing (``comet upload <archive>`` sends it later); the
    archive is written when the experiment ends (``logger.experiment.end()``, or the process's
    exit). ``mode``: ``"get_or_create"`` (the default), ``"get"`` (continue the experiment
    ``experiment_key``) or ``"create"``. ``prefix`` goes before each metric's name.

    ``name`` is the project, ``version`` the experiment's key and ``save_dir`` the offline
    directory. A stage's end flushes the experiment without ending it, so a later
    ``trainer.test`` logs into it. Pickled (a spawned DDP worker), it keeps the experiment's key
    and starts the experiment again where it is next used. Lightning's older names
    (``experiment_name``, ``project_name``, ``offline``, ``save_dir``) are taken with a warning.
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        workspace: str | None = None,
        project: str | None = None,
        experiment_key: str | None = None,
        mode: Literal["get_or_create", "get", "create"] | None = None,
        online: bool | None = None,
        prefix: str | None = None,
        **kwargs: Any,
    ) -> None:
        need("comet_ml", "CometLogger", "Comet", "comet-ml>=3.44.4", "comet")
        if mode not in _MODES:
            raise ValueError(f"CometLogger(mode={mode!r}) must be one of {list(_MODES)}.")
        for option, value in (("api_key", api_key), ("workspace", workspace), ("project", project),
                              ("experiment_key", experiment_key), ("prefix", prefix)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"CometLogger({option}={value!r}) must be a string or None.")
        project, online = _old_names(kwargs, project, online)
        if online is not None and not isinstance(online, bool):
            raise TypeError(f"CometLogger(online={online!r}) must be True (send to Comet), False (offline) or None.")
        self._api_key, self._workspace, self._project_name = api_key, workspace, project
        self._experiment_key, self._mode, self._online, self._prefix = experiment_key, mode, online, prefix
        self._kwargs = kwargs
        self._experiment: Any = None
        # Before comet_ml's first import: its automatic logging would hook into torch (Lightning's setting)
        os.environ["COMET_DISABLE_AUTO_LOGGING"] = "1"
        import comet_ml

        # Not disabled offline, as Lightning 2.6's code does (its issue 21617): its docs say offline records locally
        self._comet_config = comet_ml.ExperimentConfig(**kwargs)
        if rank_zero_only.rank == 0:  # the other ranks write nothing
            self._create_experiment()

    def _create_experiment(self) -> None:
        import comet_ml

        experiment = comet_ml.start(
            api_key=self._api_key, workspace=self._workspace, project=self._project_name,
            experiment_key=self._experiment_key, mode=self._mode, online=self._online,
            experiment_config=self._comet_config,
        )
        if experiment is None:
            raise comet_ml.exceptions.ExperimentNotFound("Failed to create Comet experiment.")
        self._experiment = experiment
        self._experiment_key = experiment.get_key()
        self._project_name = experiment.project_name
        experiment.log_other("Created from", FRAMEWORK_NAME)

    @property
    @rank_zero_experiment
    def experiment(self) -> Any:
        """The ``comet_ml`` experiment (started again here after unpickling)."""
        if self._experiment is None:
            self._create_experiment()
        return self._experiment

    @property
    def name(self) -> str | None:
        """The project's name."""
        return self._project_name

    @property
    def version(self) -> str | None:
        """The experiment's key (None before the experiment starts)."""
        return self._experiment.get_key() if self._experiment is not None else None

    @property
    def save_dir(self) -> str | None:
        """The offline directory (None: Comet's default)."""
        return self._comet_config.offline_directory

    @rank_zero_only
    def log_hyperparams(self, params: Any) -> None:
        self.experiment.__internal_api__log_parameters__(
            parameters=params_dict(params), framework=FRAMEWORK_NAME, flatten_nested=True, source="manual",
        )

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        values = {k: v.detach().cpu() if hasattr(v, "detach") else v for k, v in metrics.items()}
        epoch = values.pop("epoch", None)  # Comet keeps the epoch beside the step
        self.experiment.__internal_api__log_metrics__(
            values, step=step, epoch=epoch, prefix=self._prefix, framework=FRAMEWORK_NAME,
        )

    def log_graph(self, model: torch.nn.Module, input_array: Any = None) -> None:
        if self._experiment is not None:
            self._experiment.__internal_api__set_model_graph__(graph=model, framework=FRAMEWORK_NAME)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        # Flushed, not ended (Lightning's): a later stage logs into the same experiment.
        if self._experiment is not None:  # none in a caller whose workers ran the stage
            self._experiment.flush()

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        if self._experiment is not None:  # its connections and threads do not pickle: the key finds it again
            state["_experiment_key"] = self._experiment.get_key()
        state["_experiment"] = None
        return state


def _old_names(kwargs: dict[str, Any], project: str | None, online: bool | None) -> tuple[str | None, bool | None]:
    """Lightning's older argument names in ``kwargs``, each moved to its new name with Lightning's warning."""
    for old, new in _RENAMED.items():
        if old not in kwargs:
            continue
        log.warning("The parameter `%s` is deprecated, please use `%s` instead.", old, new)
        value = kwargs.pop(old)
        if old == "project_name":
            project = value if project is None else project
        elif old == "offline":
            online = (not value) if online is None else online
        elif new not in kwargs:
            kwargs[new] = value
    return project, online
