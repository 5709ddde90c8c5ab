"""MLFlowLogger: a run in an MLflow tracking store (a local ``./mlruns`` folder by default)."""

from __future__ import annotations

import logging
import os
import re
import tempfile
import time
import warnings
from typing import TYPE_CHECKING, Any, Literal

from trainer.core.checks import flag

from ._hparams import write_yaml
from ._tracking import checkpoint_metadata, flatten, log_model_option, need, new_checkpoints
from .logger import Logger, add_prefix, params_dict, rank_zero_experiment, rank_zero_only

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

log = logging.getLogger(__name__)
LOCAL_FILE_URI_PREFIX = "file:"
_STATUS = {"success": "FINISHED", "finished": "FINISHED", "failed": "FAILED"}


class MLFlowLogger(Logger):
    """Logs a run to `MLflow <https://mlflow.org>`_: ``pip install "steadytrainer[mlflow]"``
    (``mlflow-skinny`` is enough).

    The run is made on global rank 0 when it is first needed (the Trainer asks before a stage
    starts), in the experiment ``experiment_name`` (made if missing), named ``run_name``, with
    ``tags``; ``run_id`` continues an existing run instead. ``tracking_uri`` is the store:
    ``$MLFLOW_TRACKING_URI`` if set, else ``file:<save_dir>`` (``file:./mlruns``). MLflow 3
    refuses a ``file:`` store unless ``MLFLOW_ALLOW_FILE_STORE=true``; for a ``file:`` URI this
    logger sets that variable when it is not set (``MLFLOW_ALLOW_FILE_STORE=false`` is kept).

    What it stores: ``log_hyperparams`` as the run's params (nested dicts flattened to ``a/b``,
    values as strings of at most 250 characters), each ``log_metrics`` value as a metric at its
    step (names with ``prefix-`` before them; characters MLflow refuses are dropped, with a
    warning), checkpoints as artifacts (``log_model``: ``True`` uploads the kept ones when
    training ends, or each one at once with ``save_top_k=-1``; ``"all"`` each one as it is
    saved; each in a folder named after the file, with ``metadata.yaml`` and ``aliases.txt``),
    and the run's status when a stage ends: FINISHED, or FAILED when it raised.

    ``experiment`` is the ``mlflow.tracking.MlflowClient``; pass ``logger.run_id`` to its
    methods (``self.logger.experiment.log_text(self.logger.run_id, "note", "note.txt")``). On
    other ranks it is a stand-in that does nothing, and nothing is written. ``name`` is the
    experiment's id and ``version`` the run's id, so checkpoints go to
    ``<save_dir>/<experiment id>/<run id>/checkpoints``, as in Lightning.
    """

    LOGGER_JOIN_CHAR = "-"

    def __init__(
        self,
        experiment_name: str = "lightning_logs",
        run_name: str | None = None,
        tracking_uri: str | None = None,
        tags: dict[str, Any] | None = None,
        save_dir: str | os.PathLike | None = "./mlruns",
        log_model: Literal[True, False, "all"] = False,
        prefix: str = "",
        artifact_location: str | None = None,
        run_id: str | None = None,
        synchronous: bool | None = None,
    ) -> None:
        need("mlflow", "MLFlowLogger", "MLflow", "mlflow-skinny>=2.8", "mlflow")
        for option, value in (("experiment_name", experiment_name), ("prefix", prefix)):
            if not isinstance(value, str):
                raise TypeError(f"MLFlowLogger({option}={value!r}) must be a string.")
        for option, value in (("run_name", run_name), ("tracking_uri", tracking_uri), ("run_id", run_id),
                              ("artifact_location", artifact_location)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"MLFlowLogger({option}={value!r}) must be a string or None.")
        if tags is not None and not isinstance(tags, dict):
            raise TypeError(f"MLFlowLogger(tags={tags!r}) must be a dict of tag names to values, or None.")
        if synchronous is not None:
            flag("MLFlowLogger(synchronous)", synchronous)
        tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not tracking_uri:
            if save_dir is None:
                raise ValueError("MLFlowLogger(save_dir=None) needs a tracking_uri (or $MLFLOW_TRACKING_URI).")
            tracking_uri = f"{LOCAL_FILE_URI_PREFIX}{os.fspath(save_dir)}"
        self._experiment_name = experiment_name
        self._experiment_id: str | None = None
        self._tracking_uri = tracking_uri
        self._run_name = run_name
        self._run_id = run_id
        self.tags = tags
        self._log_model = log_model_option("MLFlowLogger", log_model)
        self._prefix = prefix
        self._artifact_location = artifact_location
        self._log_batch_kwargs = {} if synchronous is None else {"synchronous": synchronous}
        self._mlflow_client: MlflowClient | None = None
        self._checkpoint_callback: Any = None  # log_model=True: uploaded from when training ends
        self._logged_model_time: dict[str, float] = {}

    # --- the run -----------------------------------------------------------------------
    @property
    @rank_zero_experiment
    def experiment(self) -> MlflowClient:
        """The ``MlflowClient`` of the store, with the run made (or found, for ``run_id``)."""
        if self._mlflow_client is None:
            self._mlflow_client = self._open()
        return self._mlflow_client

    def _open(self) -> MlflowClient:
        uri = self._tracking_uri
        if uri.startswith(LOCAL_FILE_URI_PREFIX):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3's file store is opt-in
            # MLflow keeps one store per URI: a relative one would follow a later working directory
            uri = LOCAL_FILE_URI_PREFIX + os.path.abspath(self._tracking_uri[len(LOCAL_FILE_URI_PREFIX):])
        import mlflow
        from mlflow.tracking import MlflowClient
        from mlflow.tracking.context.registry import resolve_tags
        from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

        mlflow.set_tracking_uri(uri)  # as Lightning's: mlflow's own calls go to the same store
        client = MlflowClient(uri)
        if self._run_id is not None:
            self._experiment_id = client.get_run(self._run_id).info.experiment_id
            return client
        found = client.get_experiment_by_name(self._experiment_name)
        if found is not None and found.lifecycle_stage != "deleted":
            self._experiment_id = found.experiment_id
        else:
            log.warning(f"Experiment with name {self._experiment_name} not found. Creating it.")
            location = self._artifact_location
            self._experiment_id = client.create_experiment(name=self._experiment_name, artifact_location=location)
        tags = dict(self.tags or {})
        if self._run_name is not None:
            if MLFLOW_RUN_NAME in tags:
                log.warning(
                    f"The tag {MLFLOW_RUN_NAME} is found in tags. The value will be overridden by {self._run_name}."
                )
            tags[MLFLOW_RUN_NAME] = self._run_name
            self.tags = tags
        run = client.create_run(experiment_id=self._experiment_id, tags=resolve_tags(tags))
        self._run_id = run.info.run_id
        return client

    @property
    def run_id(self) -> str | None:
        """The run's id (the run is made on first use)."""
        _ = self.experiment
        return self._run_id

    @property
    def experiment_id(self) -> str | None:
        """The experiment's id (the run is made on first use)."""
        _ = self.experiment
        return self._experiment_id

    @property
    def name(self) -> str | None:
        """The experiment's id (Lightning's: not its name)."""
        return self.experiment_id

    @property
    def version(self) -> str | None:
        """The run's id."""
        return self.run_id

    @property
    def save_dir(self) -> str | None:
        """The store's folder for a ``file:`` URI, else None."""
        if self._tracking_uri.startswith(LOCAL_FILE_URI_PREFIX):
            return self._tracking_uri[len(LOCAL_FILE_URI_PREFIX):]
        return None

    # --- what the Trainer (or the user) logs -------------------------------------------
    @rank_zero_only
    def log_hyperparams(self, params: Any) -> None:
        from mlflow.entities import Param

        flat = flatten(params_dict(params))
        batch = [Param(key=str(k), value=str(v)[:250]) for k, v in flat.items()]  # Lightning's cut (MLflow's old limit)
        for i in range(0, len(batch), 100):  # MLflow takes at most 100 params a call
            self.experiment.log_batch(run_id=self.run_id, params=batch[i:i + 100], **self._log_batch_kwargs)

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        from mlflow.entities import Metric

        timestamp_ms = int(time.time() * 1000)
        batch = []
        for key, value in add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR).items():
            if isinstance(value, str):
                log.warning(f"Discarding metric with string value {key}={value}.")
                continue
            clean = re.sub("[^a-zA-Z0-9_/. -]+", "", key)
            if clean != key:
                warnings.warn(
                    "MLFlow only allows '_', '/', '.' and ' ' special characters in metric name. "
                    f"Replacing {key} with {clean}.",
                    RuntimeWarning, stacklevel=3,  # the caller of log_metrics (past rank_zero_only)
                )
            batch.append(Metric(key=clean, value=float(value), timestamp=timestamp_ms, step=int(step or 0)))
        if batch:
            self.experiment.log_batch(run_id=self.run_id, metrics=batch, **self._log_batch_kwargs)

    @rank_zero_only
    def finalize(self, status: str = "success") -> None:
        """Uploads the checkpoints ``log_model=True`` waits for, and ends the run: FINISHED,
        or FAILED when the stage raised (the run stays usable: a later stage logs into it)."""
        if self._mlflow_client is None:
            return
        if self._checkpoint_callback is not None:
            self._upload_checkpoints(self._checkpoint_callback)
        self.experiment.set_terminated(self.run_id, _STATUS.get(status, status))

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        if self._log_model == "all" or (self._log_model is True and checkpoint_callback.save_top_k == -1):
            self._upload_checkpoints(checkpoint_callback)
        elif self._log_model is True:
            self._checkpoint_callback = checkpoint_callback

    def _upload_checkpoints(self, callback: Any) -> None:
        for mtime, path, score in new_checkpoints(callback, self._logged_model_time):
            folder = os.path.splitext(os.path.basename(path))[0]
            self.experiment.log_artifact(self.run_id, path, folder)
            aliases = ["latest", "best"] if path == callback.best_model_path else ["latest"]
            with tempfile.TemporaryDirectory() as tmp:
                metadata = checkpoint_metadata(callback, path, score, key="Checkpoint")
                write_yaml(os.path.join(tmp, "metadata.yaml"), metadata)
                with open(os.path.join(tmp, "aliases.txt"), "w", encoding="utf-8") as f:
                    f.write(str(aliases))
                self.experiment.log_artifacts(self.run_id, tmp, folder)
            self._logged_model_time[path] = mtime

    def __getstate__(self) -> dict[str, Any]:
        # Pickled into worker processes (DDP): the run starts here first, so that the workers log
        # into it and this process's logger knows its id (on rank 0; elsewhere this does nothing).
        _ = self.experiment
        state = self.__dict__.copy()
        state["_mlflow_client"] = None  # reopened from the run's id where it is unpickled
        state["_checkpoint_callback"] = None
        return state
