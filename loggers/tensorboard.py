"""TensorBoardLogger: what ``tensorboard --logdir lightning_logs`` shows for a run, with no configuration."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import TYPE_CHECKING, Any, Iterator

from trainer.core.checks import flag, positive_number

from ._event_file import summary_writer_class
from ._hparams import experiment, metric_columns, session_end_success, session_start, write_yaml
from .logger import FolderLogger, add_prefix, params_dict, rank_zero_experiment, rank_zero_only

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

# Scalars wait this long before going to the writer. Each hand-off wakes the writer's thread,
# which then takes the GIL from the loop: milliseconds on a busy machine, every
# log_every_n_steps otherwise. save(), finalize() and any other write hand them off first.
_HAND_OFF_S = 10.0


class TensorBoardLogger(FolderLogger):
    """Writes TensorBoard event files into ``<save_dir>/<name>/version_<n>[/<sub_dir>]``.

    ``Trainer(logger=True)`` (the default) makes one under the Trainer's ``log_dir`` and
    ``name``. What the Trainer writes to it, against ``global_step``:

    - every value logged in ``training_step``, under its own name, every ``log_every_n_steps``
      optimizer steps, and its epoch mean as ``<name>_epoch`` at each epoch's end;
    - values logged in ``validation_step``/``test_step``: their means, under their own names;
    - ``epoch``; no gradient norm (``self.log("grad_norm", self.trainer.grad_norm)`` logs it), no
      learning rate (``callbacks.LearningRateMonitor`` logs it, as in Lightning) and no throughput
      (``callbacks.ThroughputMonitor`` does);
    - the Trainer's options (``trainer/<option>``) and the model's ``save_hyperparameters``
      arguments in the HParams tab. When fit ends, the run's list of columns: the metrics
      given to ``log_hyperparams``, then the values logged, validation and epoch means first,
      then ``epoch`` (the tab ticks the first 5);
      a name that is also a hyperparameter's (``lr``) is one column, the hyperparameter.

    ``experiment`` is the ``torch.utils.tensorboard.SummaryWriter`` itself: ``add_image``,
    ``add_histogram``, ``add_figure``, ``add_text`` land in the same run. A resumed fit
    appends to its own folder and drops what the crashed run wrote after the checkpoint
    (``purge_step``). Scalars and the HParams session are handed to the writer in batches
    (every 10 s, at ``save`` and ``finalize``), off the training steps; the first values
    logged (a fit's first step's) open the writer and its event file, unless ``experiment``
    was used before. ``**kwargs`` go to ``SummaryWriter`` (``flush_secs=30`` by default,
    ``max_queue``, ``filename_suffix``, ...).
    """

    def __init__(
        self,
        save_dir: str | os.PathLike | None = None,
        name: str | None = "lightning_logs",
        version: int | str | None = None,
        log_graph: bool = False,
        default_hp_metric: bool = True,
        prefix: str = "",
        sub_dir: str | os.PathLike | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(save_dir, name, version)
        self._log_graph = flag("TensorBoardLogger(log_graph)", log_graph)
        self._default_hp_metric = flag("TensorBoardLogger(default_hp_metric)", default_hp_metric)
        if not isinstance(prefix, str):
            raise TypeError(f"TensorBoardLogger(prefix={prefix!r}) must be a string, put before each name with '-'.")
        self._prefix = prefix
        self._sub_dir = None if sub_dir is None else os.fspath(sub_dir)
        self._kwargs = kwargs  # SummaryWriter's: assigned as it is, so that jsonargparse follows it there
        positive_number("TensorBoardLogger(flush_secs)", self.flush_secs, allow_none=False)
        self._experiment: SummaryWriter | None = None
        self._purge_step: int | None = None
        self._session_open = False  # an HParams session started in this writer, to be marked finished
        self._hparams: dict[str, Any] = {}
        self._hparams_dirty = False
        # Scalars not yet given to the writer: (step, wall time, (name, value) pairs).
        self._pending: list[tuple[int, float, tuple[tuple[str, Any], ...]]] = []
        # HParams sessions not yet given: (params, step, wall time).
        self._sessions: list[tuple[dict[str, Any], int, float]] = []
        # For the HParams columns written when fit ends: the first session's params (the one
        # TensorBoard keeps), the metrics given with them, and the points written per tag.
        self._columns: dict[str, Any] | None = None
        self._declared: list[str] = []
        self._counts: dict[str, int] = {}
        self._handed_off = time.perf_counter()

    @property
    def flush_secs(self) -> float:
        return self._kwargs.setdefault("flush_secs", 30.0)

    @property
    def sub_dir(self) -> str | None:
        return self._sub_dir

    @property
    def log_dir(self) -> str | None:
        folder = super().log_dir
        if folder is None or self._sub_dir is None:
            return folder
        return os.path.join(folder, os.path.expandvars(os.path.expanduser(self._sub_dir)))

    @property
    @rank_zero_experiment
    def experiment(self) -> SummaryWriter:
        """The ``SummaryWriter`` of this run (opened on first use)."""
        if self._experiment is None:
            with _without_boto3():  # a local import, written out: jsonargparse follows **kwargs into SummaryWriter
                from torch.utils.tensorboard import SummaryWriter
            SummaryWriter = summary_writer_class(SummaryWriter)  # torch's, with no writer thread (_event_file.py)
            self._experiment = SummaryWriter(log_dir=self.log_dir, purge_step=self._purge_step, **self._kwargs)
            self._purge_step = None
        return self._experiment

    # --- what the Trainer (or the user) logs -------------------------------------------
    @rank_zero_only
    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Queued, and handed to the writer every 10 s or at ``save``; numbers or tensors."""
        metrics = add_prefix(metrics, self._prefix)
        self._pending.append((0 if step is None else int(step), time.time(), tuple(metrics.items())))
        # The first values open the writer (after a fit's first step): the run shows up at once.
        if self._deferring:  # a fit's start: its hp_metric waits for the first step
            return
        if self._experiment is None or time.perf_counter() - self._handed_off >= _HAND_OFF_S:
            self._hand_off()

    _yaml_written = False  # hparams.yaml is in the run's folder (an empty one when no hyperparameters were logged)
    _deferring = False  # set by log_fit_hyperparams around a fit's start: the hand-off waits for the first step

    @rank_zero_only
    def log_hyperparams(self, params: Any, metrics: dict[str, Any] | None = None) -> None:
        """One HParams session: ``params`` become columns (their values shown as bool, number
        or string), and the run's scalars its metrics. ``hparams.yaml`` gets the model's
        (the ``trainer/`` options stay in TensorBoard only)."""
        params = params_dict(params)
        shown = {
            str(k): v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in params.items() if v is not None
        }
        # Handed to the writer with the scalars: a fit's start opens no writer and waits for no
        # file, so its first step comes sooner (benchmarks/fit_cost.py).
        self._sessions.append((shown, self._last_step, time.time()))  # a resumed fit's step
        self._session_open = True
        self._hparams.update({k: v for k, v in params.items() if not str(k).startswith("trainer/")})
        self._hparams_dirty = True
        chosen = metrics is not None  # the metrics for the HParams tab (not the placeholder)
        if metrics is None and self._default_hp_metric:
            metrics = {"hp_metric": -1}
        if metrics:  # queued with the session, for the first hand-off; through log_metrics, as Lightning's
            self._declared += list(add_prefix(metrics, self._prefix)) if chosen else []
            self.log_metrics(metrics, None)
        if not self._deferring:  # a call of the user's: on disk now, as in Lightning (a fit's start defers it)
            self._hand_off()

    def log_fit_hyperparams(self, hparams: dict[str, Any], trainer_options: dict[str, Any]) -> None:
        """A fit's start: the HParams session gets the Trainer's options as columns too, and is
        written with the first step's values (the fit's start waits for no file)."""
        self._deferring = True
        try:
            self.log_hyperparams({**trainer_options, **hparams})
        finally:
            self._deferring = False

    @rank_zero_only
    def log_graph(self, model: Any, input_array: Any = None) -> None:
        """The model's graph, traced on ``input_array`` (default: ``model.example_input_array``,
        a tensor or a tuple of the forward's positional arguments); Lightning's warnings when
        there is none or it cannot be traced."""
        import warnings

        import torch

        if not self._log_graph:
            return
        if input_array is None:
            input_array = getattr(model, "example_input_array", None)
        if input_array is None:
            warnings.warn(
                "Could not log computational graph to TensorBoard: The `model.example_input_array` attribute "
                "is not set or `input_array` was not given. "
                "(Set model.example_input_array, or call logger.log_graph(model, input_array).)",
                stacklevel=2,
            )
            return
        if not isinstance(input_array, (torch.Tensor, tuple)):
            warnings.warn(
                "Could not log computational graph to TensorBoard: The `input_array` or "
                f"`model.example_input_array` has type {type(input_array)} which can't be traced by TensorBoard. "
                "Make the input array a tuple representing "
                "the positional arguments to the model's `forward()` implementation.", stacklevel=2,
            )
            return
        device = getattr(model, "device", None)
        if device is not None:
            from trainer.data.batches import move_to_device

            input_array = move_to_device(input_array, device)
        from trainer.core.export import jit_tracing

        with jit_tracing(), warnings.catch_warnings():  # add_graph traces with torch.jit, now deprecated
            warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.jit")
            self.experiment.add_graph(model, input_array)

    @rank_zero_only
    def save(self) -> None:
        self._hand_off()
        if self.root_dir is None or self._experiment is None and self.chosen_version is None:
            return  # no folder picked and nothing written (a predict's end, as Lightning's): none to make
        self.experiment.flush()  # a run that logged nothing gets its folder and event file too, as in Lightning
        if self._hparams_dirty or not self._yaml_written:  # hparams.yaml, "{}" without hyperparameters (Lightning's)
            write_yaml(os.path.join(self.log_dir, "hparams.yaml"), self._hparams)
            self._hparams_dirty, self._yaml_written = False, True

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Writes what waits; after a fit that finished, the HParams columns and the
        session's success; closes the writer (a later ``experiment`` opens a new event
        file in the same folder)."""
        self._hand_off()
        if self._experiment is not None:
            if status == "success" and self._session_open and self._columns is not None:
                # Only a finished fit's: TensorBoard keeps the first list it finds, and a run
                # stopped before its first validation would list no validation metrics.
                columns = metric_columns(self._counts, self._declared, self._columns, self._prefix)
                self._experiment.file_writer.add_summary(experiment(self._columns, columns), self._last_step)
                self._experiment.file_writer.add_summary(session_end_success(), self._last_step)
            self._session_open = False
        self._columns, self._declared, self._counts = None, [], {}
        self.save()
        if self._experiment is not None:
            self._experiment.close()
            self._experiment = None

    # --- internals ---------------------------------------------------------------------
    _last_step = 0

    def _hand_off(self) -> None:
        """Give the queued scalars to the writer: one event per logged step."""
        self._handed_off = time.perf_counter()
        if not self._pending and not self._sessions:
            return
        from tensorboard.compat.proto.summary_pb2 import Summary

        writer = self.experiment.file_writer
        sessions, self._sessions = self._sessions, []
        for shown, step, walltime in sessions:
            writer.add_summary(session_start(shown), step, walltime)
            if self._columns is None:
                self._columns = shown
        pending, self._pending = self._pending, []
        counts = self._counts
        for step, walltime, items in pending:
            values = [Summary.Value(tag=tag, simple_value=_number(tag, value)) for tag, value in items]
            if values:
                writer.add_summary(Summary(value=values), step, walltime)
            for tag, _ in items:
                counts[tag] = counts.get(tag, 0) + 1
            self._last_step = max(self._last_step, step)

    def drop_after_step(self, step: int) -> None:
        """Before a fit that resumes at ``step``: the events the crashed run wrote after it go."""
        self._last_step = step
        if step and self._experiment is None:
            self._purge_step = step + 1

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_experiment"] = None  # never pickled into DDP workers
        state["_pending"], state["_sessions"] = [], []
        state["_columns"], state["_declared"], state["_counts"] = None, [], {}  # a worker's own run lists its own
        return state


def _number(tag: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"TensorBoardLogger.log_metrics: {tag}={value!r:.80} is not a number "
                         "(a float, int or one-element tensor).") from None


@contextlib.contextmanager
def _without_boto3() -> Iterator[None]:
    """torch's SummaryWriter, imported in here without boto3.

    tensorboard imports boto3 whenever it is installed, for ``s3://`` log dirs, which the run
    folder never is: about 10 MiB of memory and 0.3 s of start-up for nothing. A boto3 that
    is already imported is left alone. tensorboard decides once, at import, whether S3 works:
    code that uses tensorboard with ``s3://`` paths in the same process imports boto3 first.
    """
    missing = object()
    saved = {name: sys.modules.get(name, missing) for name in ("boto3", "botocore")}
    if saved["boto3"] is missing:
        sys.modules.update(dict.fromkeys(saved))  # None in sys.modules: `import boto3` raises ImportError
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is missing:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
