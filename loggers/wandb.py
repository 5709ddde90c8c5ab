"""WandbLogger: a Weights & Biases run (online, or offline into a local folder to sync later)."""

from __future__ import annotations

import os
import sys
import warnings
from typing import TYPE_CHECKING, Any, Literal

from trainer.core.checks import flag, one_of
from trainer.core.exceptions import MisconfigurationException

from ._tracking import checkpoint_metadata, json_ready, log_model_option, need, new_checkpoints
from .logger import DummyExperiment, Logger, add_prefix, params_dict, rank_zero_experiment, rank_zero_only

if TYPE_CHECKING:
    import torch
    from wandb import Artifact
    from wandb.sdk.wandb_run import Run

STEP_KEY = "trainer/global_step"  # Lightning's x-axis for every metric


class WandbLogger(Logger):
    """Logs to a `Weights & Biases <https://wandb.ai>`_ run: ``pip install "steadytrainer[wandb]"``.

    The run starts on global rank 0 when it is first needed (the Trainer asks before a stage
    starts) with ``wandb.init(project=, name=, dir=save_dir, id=version, resume="allow",
    **kwargs)``: ``project`` falls back to ``$WANDB_PROJECT``, then ``"lightning_logs"``; the
    same ``id`` (or ``version``) resumes that run. If a run is already in progress
    (``wandb.init`` called before), it is used, with a warning. ``offline=True`` writes the run
    into ``<save_dir>/wandb/offline-run-*`` and sends nothing (``wandb sync`` uploads it later).
    ``experiment`` is the ``wandb.Run`` (``experiment`` may also be passed in).

    What it records: ``log_hyperparams`` into the run's config, each ``log_metrics`` row with
    ``trainer/global_step`` (every metric's x-axis), ``log_table``/``log_text``/``log_image``/
    ``log_audio``/``log_video`` as W&B media, ``watch(model)`` the gradients, and with
    ``log_model`` the checkpoints as ``model`` artifacts (``True``: the kept ones when training
    ends, or each one at once with ``save_top_k=-1``; ``"all"``: each one as it is saved;
    aliases ``latest`` and ``best``). The run stays open after a stage, as Lightning's, so a
    later ``trainer.test`` logs into it; ``wandb.finish()`` (or the process's exit) ends it.
    ``name`` is the project and ``version`` the run's id, so checkpoints go to
    ``<save_dir>/<project>/<id>/checkpoints``. Other ranks get a stand-in and write nothing.
    """

    LOGGER_JOIN_CHAR = "-"

    def __init__(
        self,
        name: str | None = None,
        save_dir: str | os.PathLike = ".",
        version: str | None = None,
        offline: bool = False,
        dir: str | os.PathLike | None = None,
        id: str | None = None,
        anonymous: bool | None = None,
        project: str | None = None,
        log_model: Literal["all"] | bool = False,
        experiment: Run | None = None,
        prefix: str = "",
        checkpoint_name: str | None = None,
        add_file_policy: Literal["mutable", "immutable"] = "mutable",
        **kwargs: Any,
    ) -> None:
        need("wandb", "WandbLogger", "Weights & Biases", "wandb>=0.19", "wandb")
        flag("WandbLogger(offline)", offline)
        log_model = log_model_option("WandbLogger", log_model)
        if offline and log_model:
            raise MisconfigurationException(
                f"Providing log_model={log_model} and offline={offline} is an invalid configuration since model "
                "checkpoints cannot be uploaded in offline mode.\nHint: Set `offline=False` to log your model."
            )
        for option, value in (("name", name), ("version", version), ("id", id), ("project", project),
                              ("checkpoint_name", checkpoint_name)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"WandbLogger({option}={value!r}) must be a string or None.")
        if not isinstance(prefix, str):
            raise TypeError(f"WandbLogger(prefix={prefix!r}) must be a string, put before each name with '-'.")
        self.add_file_policy = one_of("WandbLogger(add_file_policy)", add_file_policy, ("mutable", "immutable"))
        save_dir = os.fspath(save_dir) if save_dir is not None else (os.fspath(dir) if dir is not None else None)
        self._offline = offline
        self._log_model = log_model
        self._prefix = prefix
        self._experiment = experiment
        self._logged_model_time: dict[str, float] = {}
        self._checkpoint_callbacks: dict[int, Any] = {}
        self._checkpoint_name = checkpoint_name
        self._wandb_init: dict[str, Any] = {
            "name": name,
            "project": project or os.environ.get("WANDB_PROJECT", "lightning_logs"),
            "dir": save_dir,
            "id": version or id,
            "resume": "allow",
        }
        if anonymous is not None:  # (wandb warns about the argument itself, whatever its value)
            self._wandb_init["anonymous"] = "allow" if anonymous else "never"
        if offline:
            self._wandb_init["mode"] = "offline"
        self._wandb_init.update(kwargs)
        self._project = self._wandb_init["project"]
        self._save_dir = self._wandb_init["dir"]
        self._name = self._wandb_init["name"]
        self._id = self._wandb_init["id"]

    # --- the run -----------------------------------------------------------------------
    @property
    @rank_zero_experiment
    def experiment(self) -> Run:
        """The ``wandb.Run`` (started on first use)."""
        if self._experiment is None:
            import wandb

            attach_id = getattr(self, "_attach_id", None)
            if wandb.run is not None:
                warnings.warn(
                    "There is a wandb run already in progress and newly created instances of `WandbLogger` will reuse "
                    "this run. If this is not desired, call `wandb.finish()` before instantiating `WandbLogger`.",
                    stacklevel=2,
                )
                self._experiment = wandb.run
            elif attach_id is not None:  # unpickled in a worker process: the parent's run
                # A worker spawned before the run started lacks the service's address in its environment.
                token = getattr(self, "_service_token", None)
                if token:
                    os.environ.setdefault(wandb.env.SERVICE, token)
                self._experiment = wandb._attach(attach_id)
            else:
                init = dict(self._wandb_init)
                if self._save_dir is not None:
                    # Absolute: wandb's service process resolves a relative one against its own working
                    # directory. Made first: wandb falls back to a temp folder without it.
                    init["dir"] = os.path.abspath(self._save_dir)
                    os.makedirs(init["dir"], exist_ok=True)
                self._experiment = wandb.init(**init)
                if self._wandb_init.get("sync_tensorboard"):
                    self._experiment.define_metric("*", step_metric="global_step")
                else:
                    self._experiment.define_metric(STEP_KEY)
                    self._experiment.define_metric("*", step_metric=STEP_KEY, step_sync=True)
        return self._experiment

    @property
    def name(self) -> str | None:
        """The project's name (the run's own is ``experiment.name``)."""
        return self._project

    @property
    def version(self) -> str | None:
        """The run's id (the one given, before the run starts)."""
        return self._experiment.id if self._experiment else self._id

    @property
    def save_dir(self) -> str | None:
        return self._save_dir

    def watch(
        self, model: torch.nn.Module, log: str | None = "gradients", log_freq: int = 100, log_graph: bool = True
    ) -> None:
        """Record ``model``'s gradients (``log="all"``: and parameters) every ``log_freq`` steps."""
        self.experiment.watch(model, log=log, log_freq=log_freq, log_graph=log_graph)

    # --- what the Trainer (or the user) logs -------------------------------------------
    @rank_zero_only
    def log_hyperparams(self, params: Any) -> None:
        self.experiment.config.update(json_ready(params_dict(params)), allow_val_change=True)

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        metrics = add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR)
        if step is not None and not self._wandb_init.get("sync_tensorboard"):
            self.experiment.log({**metrics, STEP_KEY: step})
        else:
            self.experiment.log(metrics)

    @rank_zero_only
    def log_table(self, key: str, columns: list[str] | None = None, data: list[list[Any]] | None = None,
                  dataframe: Any = None, step: int | None = None) -> None:
        """A ``wandb.Table`` from ``columns`` and ``data`` (rows), or from a pandas ``dataframe``."""
        import wandb

        self.log_metrics({key: wandb.Table(columns=columns, data=data, dataframe=dataframe)}, step)

    @rank_zero_only
    def log_text(self, key: str, columns: list[str] | None = None, data: list[list[str]] | None = None,
                 dataframe: Any = None, step: int | None = None) -> None:
        """Text, as a table."""
        self.log_table(key, columns, data, dataframe, step)

    @rank_zero_only
    def log_image(self, key: str, images: list[Any], step: int | None = None, **kwargs: Any) -> None:
        """Images (tensors, arrays, PIL images or file paths); each keyword is a list with one
        value per image (``caption=[...]``, ``masks=[...]``, ``boxes=[...]``)."""
        self._log_media("images", "Image", key, images, step, kwargs)

    @rank_zero_only
    def log_audio(self, key: str, audios: list[Any], step: int | None = None, **kwargs: Any) -> None:
        """Audio clips (arrays or file paths); keywords as ``log_image``'s (``sample_rate=[...]``)."""
        self._log_media("audios", "Audio", key, audios, step, kwargs)

    @rank_zero_only
    def log_video(self, key: str, videos: list[Any], step: int | None = None, **kwargs: Any) -> None:
        """Videos (arrays or file paths); keywords as ``log_image``'s (``fps=[...]``)."""
        self._log_media("videos", "Video", key, videos, step, kwargs)

    def _log_media(
        self, what: str, kind: str, key: str, items: list[Any], step: int | None, kwargs: dict[str, Any]
    ) -> None:
        if not isinstance(items, list):
            hint = f"pass log_{kind.lower()}(key, [item, ...])"
            raise TypeError(f'Expected a list as "{what}", found {type(items)}: {hint}.')
        for name, values in kwargs.items():
            if len(values) != len(items):
                raise ValueError(
                    f"Expected {len(items)} items but only found {len(values)} for {name} (one per item of {what})."
                )
        import wandb

        make = getattr(wandb, kind)
        media = [make(item, **{name: values[i] for name, values in kwargs.items()}) for i, item in enumerate(items)]
        self.log_metrics({key: media}, step)

    # --- checkpoints as artifacts -------------------------------------------------------
    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        if self._log_model == "all" or (self._log_model is True and checkpoint_callback.save_top_k == -1):
            self._upload_checkpoints(checkpoint_callback)
        elif self._log_model is True:
            self._checkpoint_callbacks[id(checkpoint_callback)] = checkpoint_callback

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """After a stage that succeeded, uploads the checkpoints ``log_model=True`` waits for.
        The run stays open (Lightning's): ``wandb.finish()`` ends it."""
        if status != "success" or self._experiment is None:
            return
        for callback in self._checkpoint_callbacks.values():
            self._upload_checkpoints(callback)

    def _upload_checkpoints(self, callback: Any) -> None:
        import wandb

        for mtime, path, score in new_checkpoints(callback, self._logged_model_time):
            if not self._checkpoint_name:
                self._checkpoint_name = f"model-{self.experiment.id}"
            metadata = checkpoint_metadata(callback, path, score)
            artifact = wandb.Artifact(name=self._checkpoint_name, type="model", metadata=metadata)
            artifact.add_file(path, name="model.ckpt", policy=self.add_file_policy)
            aliases = ["latest", "best"] if path == callback.best_model_path else ["latest"]
            self.experiment.log_artifact(artifact, aliases=aliases)
            self._logged_model_time[path] = mtime

    @staticmethod
    @rank_zero_only
    def download_artifact(artifact: str, save_dir: str | os.PathLike | None = None, artifact_type: str | None = None,
                          use_artifact: bool | None = True) -> str:
        """Downloads ``artifact`` (``"entity/project/name:alias"``) and returns its folder; inside
        a run (and with ``use_artifact``) the run records that it used it."""
        import wandb

        if wandb.run is not None and use_artifact:
            found = wandb.run.use_artifact(artifact)
        else:
            found = wandb.Api().artifact(artifact, type=artifact_type)
        return found.download(root=None if save_dir is None else os.fspath(save_dir))

    def use_artifact(self, artifact: str, artifact_type: str | None = None) -> Artifact:
        """Records that this run uses ``artifact``, and returns it."""
        return self.experiment.use_artifact(artifact, type=artifact_type)

    def __getstate__(self) -> dict[str, Any]:
        # Pickled into a worker process: the run starts here first, and the worker attaches to
        # it, so every fit of this logger writes one run (Lightning's).
        run = self.experiment
        state = self.__dict__.copy()
        if self._experiment is not None and not isinstance(run, DummyExperiment):
            state["_id"] = getattr(run, "id", None)
            state["_attach_id"] = getattr(run, "_attach_id", None)
            state["_service_token"] = os.environ.get(sys.modules["wandb"].env.SERVICE)  # (imported: a run exists)
            state["_name"] = run.name
        state["_experiment"] = None
        state["_checkpoint_callbacks"] = {}
        return state
