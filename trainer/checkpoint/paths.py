"""What a ``ckpt_path`` names, decided once per ``fit``, ``validate``, ``test`` or ``predict``.

:func:`resolve_ckpt_path` is the one place: global rank 0 turns ``None``, ``"last"``,
``"best"``, an http(s) URL or a path into one local file (or None), and every rank gets its
answer. :func:`check_ckpt_path` only checks the argument's form, in the caller, before any
process starts. The rules are docs/checkpoints.md's "Which file a ckpt_path names"."""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import re
import urllib.parse
import warnings
from typing import TYPE_CHECKING, Any

from trainer.checkpoint import files as ckpt_io
from trainer.checkpoint import layout
from trainer.checkpoint.files import (
    CheckpointError,
    MissingCheckpoint,
    is_sharded,
    is_url,
    require_archive,
)
from trainer.checkpoint.integrity import damage
from trainer.core.distributed import rank_zero_warn

if TYPE_CHECKING:
    from trainer.trainer import Trainer

log = logging.getLogger("trainer")
LAST = "last.ckpt"


# --- the argument, in the caller -----------------------------------------------------------------
def check_ckpt_path(ckpt_path: Any, evaluating: bool = False) -> None:
    """A wrong type, a missing file, a folder or a non-checkpoint fails here, before any process
    starts. Evaluation also takes "best", the checkpoint callback's best file."""
    if ckpt_path is None:
        return
    words = ("best", "last") if evaluating else ("last",)
    choices = " or ".join(repr(w) for w in words)
    if not isinstance(ckpt_path, (str, os.PathLike)):
        raise TypeError(f"ckpt_path={ckpt_path!r} must be a path to a checkpoint file, {choices}, or None.")
    path = os.fspath(ckpt_path)
    if path in words or is_url(path):
        return
    if path == "best":
        raise ValueError(
            "ckpt_path='best' is for validate, test and predict. To go on training, resume with "
            "ckpt_path='last' or a path (e.g. trainer.checkpoint_callback.best_model_path)."
        )
    if is_sharded(path):
        return  # a sharded checkpoint (FSDPStrategy(checkpoint="sharded")): a folder
    if os.path.isdir(path):
        raise ValueError(
            f"ckpt_path={path!r} is a folder. Pass a checkpoint file in it (e.g. its last.ckpt), or {choices}."
        )
    if not os.path.isfile(path):
        raise MissingCheckpoint(
            f"Checkpoint file not found: {path}. ckpt_path={path!r} does not exist. "
            f"Pass an existing file, {choices}, or None."
        )
    require_archive(path, f"ckpt_path={path!r}")


# --- the resolver, in each process of the stage --------------------------------------------------
def resolve_ckpt_path(trainer: Trainer, ckpt_path: Any, stage: str) -> str | None:
    """The one local file ``ckpt_path`` names for ``trainer.<stage>`` (None: start from the model
    as it is). Global rank 0 decides, downloads a URL, searches for "last"; every rank gets the
    same answer, or raises the same error (an error on rank 0 alone would leave the others
    waiting). Call it once per stage, after the model's own callbacks joined (their folders count)."""
    strategy = trainer.strategy
    answer: tuple[str, Any] | None = None
    if strategy.is_global_zero:
        try:
            answer = ("file", _resolve(trainer, ckpt_path, stage))
        except Exception as err:  # noqa: BLE001 - handed to every rank, raised there
            answer = ("error", err)
    kind, value = strategy.broadcast_object(answer)
    if kind == "error":
        raise value
    return value


def _resolve(trainer: Trainer, ckpt_path: Any, stage: str) -> str | None:
    if ckpt_path is None:
        return None
    path = os.fspath(ckpt_path)
    if path == "best":
        return _best(trainer, stage)
    if path == "last":
        return _last(trainer, stage)
    return local_file(path)


def _best(trainer: Trainer, stage: str) -> str:
    """``"best"`` (evaluation only): the first ModelCheckpoint's best file, as in Lightning."""
    callbacks = trainer.checkpoint_callbacks
    if len(callbacks) > 1:
        rank_zero_warn(
            f'`.{stage}(ckpt_path="best")` is called with Trainer configured with multiple `ModelCheckpoint` '
            "callbacks. It will use the best checkpoint path from first checkpoint callback."
        )
    if not callbacks:
        raise ValueError(
            f'`.{stage}(ckpt_path="best")` is set but `ModelCheckpoint` is not configured. This Trainer has no '
            "ModelCheckpoint callback to rank the checkpoints (enable_checkpointing=False). "
            "Pass the file's path, or 'last'."
        )
    best = callbacks[0].best_model_path
    if not best and trainer.fast_dev_run:
        raise ValueError(
            f'You cannot execute `.{stage}(ckpt_path="best")` with `fast_dev_run=True`. Please pass an exact '
            f"checkpoint path to `.{stage}(ckpt_path=...)`: fast_dev_run saves no checkpoint."
        )
    if not best:
        raise ValueError(
            f'`.{stage}(ckpt_path="best")` is set but `ModelCheckpoint` is not configured to save the best model. '
            "It has saved no checkpoint yet (or save_top_k=0): run trainer.fit(...) first, or pass a checkpoint's "
            "path, or 'last'."
        )
    return best


# --- "last" --------------------------------------------------------------------------------------
def _last(trainer: Trainer, stage: str) -> str | None:
    """``"last"``: the newest intact checkpoint of this run's own folders (:func:`_own_folders`).
    Fit takes a file of any name (a ``kill -9`` resumes without ``save_last``); an evaluation
    takes Lightning's "last", a ``last*.ckpt`` file (``save_last``, a stop's resume point)."""
    folders, named, stop_point = _own_folders(trainer)
    fit = stage == "fit"
    pattern = "*.ckpt" if fit else "last*.ckpt"
    # Temp files of unfinished saves start with "." and never match.
    candidates = [f for folder in folders for f in glob.glob(os.path.join(glob.escape(folder), pattern))]
    if stop_point is not None and os.path.isfile(stop_point):
        candidates.append(stop_point)
    candidates = [f for f in candidates if os.path.exists(f)]  # no dangling link
    candidates.sort(key=_newest_first, reverse=True)
    where = " and ".join(folders) + (f" (and the stop point {stop_point})" if stop_point else "")
    found = _newest_intact(candidates, fit, stop_point, named)
    if found is None:
        no_fit = f"no earlier fit in {runs_base(trainer)[0]}" if not where else f"no checkpoint in {where}"
        # Lightning's warning (not an error, so that a relaunch script can always pass it), and where we looked
        rank_zero_warn(
            f'.{stage}(ckpt_path="last") is set, but there is no last checkpoint available. No checkpoint will be '
            "loaded. HINT: Set `ModelCheckpoint(..., save_last=True)`. "
            f"(Looked for one: {no_fit}; starting from scratch.)"
        )
        return None
    log.info("ckpt_path='last' is %s: the newest intact checkpoint in %s.", found, where)
    return found


def _own_folders(trainer: Trainer) -> tuple[list[str], list[str], str | None]:
    """(the folders "last" searches, the ModelCheckpoints' named ``dirpath``\\ s, a stop's resume
    point to consider). This run's own folders only: each ModelCheckpoint's ``dirpath`` when it
    names one, else the latest fit's run folder (:func:`_run_folder`). With every folder named,
    the run folder, shared with other experiments, is not searched: only its ``last.ckpt``, a stop's
    resume point, is considered, and taken only if it records one of those folders (it was
    this experiment's, see ``callbacks/_checkpoint_files.resume_point``)."""
    callbacks = trainer.checkpoint_callbacks
    named = list(dict.fromkeys(cb.dirpath_given for cb in callbacks if cb.dirpath_given is not None))
    run = _run_folder(trainer)
    run = None if run is None else os.path.abspath(run)
    if not named or len(named) < len(callbacks):  # a ModelCheckpoint writes into the run folder
        return named + ([run] if run is not None and run not in named else []), named, None
    return named, named, None if run is None or run in named else os.path.join(run, LAST)


def _newest_intact(candidates: list[str], fit: bool, stop_point: str | None, named: list[str]) -> str | None:
    """The first of ``candidates`` (newest first) that is intact and loads safely (for fit: not a
    weights-only file); a damaged, truncated or refused newer file is skipped with a warning that
    names it and the file taken instead. The ``stop_point`` counts only if it records a ``named`` folder."""
    skipped: list[str] = []
    found = None
    for f in candidates:
        try:
            ckpt = load_good(f, mmap=True) if fit else ckpt_io.load(f, mmap=True)  # CRCs read, tensors mapped
        except CheckpointError as err:
            skipped.append(f"skipping {f}: {err}")
            continue
        if f == stop_point and not _records_folder(ckpt, named):
            why = "another experiment's stop point (its ModelCheckpoint wrote elsewhere)"
            log.info("ckpt_path='last': not %s, %s.", f, why)
            continue
        found = f
        break
    verb = "Resuming from" if fit else "Evaluating"
    instead = f"{verb} {found} instead, the newest intact checkpoint." if found else "No intact checkpoint is left."
    for skip in skipped:
        warnings.warn(f"ckpt_path='last': {skip} {instead}", stacklevel=4)
    return found


def _records_folder(ckpt: dict[str, Any], folders: list[str]) -> bool:
    """True if a ModelCheckpoint whose state ``ckpt`` holds wrote into one of ``folders``."""
    states = ckpt.get("callbacks") or {}
    return any(isinstance(s, dict) and s.get("dirpath") in folders for s in states.values())


def _run_folder(trainer: Trainer) -> str | None:
    """The latest fit's own checkpoints folder: without a logger, ``<log_dir>/checkpoints``
    (``./checkpoints`` with ``log_dir=None``); else that of the first logger's latest fit only:
    its fixed version's folder, or the newest ``<save_dir>/<name>/version_<n>`` with a
    ``checkpoints`` folder (None if none).

    Never any older version: in the default ``lightning_logs`` they belong to other runs,
    and the latest fit, killed before its first save, must start afresh, not resume one of them.
    """
    base, fixed = runs_base(trainer)
    if base is None:
        return os.path.join(os.path.abspath(trainer.default_root_dir or os.getcwd()), "checkpoints")
    if fixed is not None:
        folder = os.path.join(base, fixed, "checkpoints")
        return folder if os.path.isdir(folder) else None
    try:
        names = os.listdir(base)
    except OSError:  # no run of this name yet
        return None
    # A fit with checkpointing makes its version's checkpoints folder at its start; validate and test make none.
    fits = [
        int(d[8:]) for d in names
        if d.startswith("version_") and d[8:].isdigit() and os.path.isdir(os.path.join(base, d, "checkpoints"))
    ]
    return os.path.join(base, f"version_{max(fits)}", "checkpoints") if fits else None


def run_checkpoints(trainer: Trainer) -> str:
    """The run's own checkpoints folder: ``<run folder>/checkpoints`` (the first logger's
    ``<save_dir>/<name>/version_<n>``; without a logger ``default_root_dir``, or the working
    folder). The default ModelCheckpoint writes there, and a stop's resume point goes there
    when a ``dirpath`` the user gave holds no ``last.ckpt``."""
    base = trainer.run_dir if trainer.run_dir is not None else os.getcwd()
    return os.path.join(base, "checkpoints")


def runs_base(trainer: Trainer) -> tuple[str | None, str | None]:
    """(the first logger's ``<save_dir>/<name>``, its fixed version folder or None), or (None, None)."""
    if not trainer.loggers:
        return None, None
    first = trainer.loggers[0]
    base = os.path.join(first.save_dir or trainer.default_root_dir or os.getcwd(), first.name or "")
    version = getattr(first, "pinned_version", None) if hasattr(type(first), "pinned_version") else None
    return base, None if version is None else (version if isinstance(version, str) else f"version_{version}")


_STEP = re.compile(r"step=(\d+)")


def _newest_first(path: str) -> tuple[int, bool, int]:
    """Newest first. A file's time has the kernel's clock tick (4 ms at HZ=250), so saves a few
    fast steps apart can tie: ``last.ckpt``, a hard link to the newest save, wins a tie, then the
    higher ``step=`` in the name (an epoch-end file and the step save after it, in one tick)."""
    name = os.path.basename(path)
    step = _STEP.search(name)
    return os.stat(path).st_mtime_ns, name == LAST, int(step.group(1)) if step else -1


def load_good(path: str, mmap: bool = False) -> dict[str, Any]:
    """``path`` loaded, if fit can resume from it."""
    ckpt = ckpt_io.load(path, mmap=mmap)
    if layout.is_weights_only(ckpt):
        raise CheckpointError(
            f"{path!r} holds the model's weights only (ModelCheckpoint(save_weights_only=True)), no optimizer or "
            "loop state, so fit cannot resume from it. Evaluate it with test(ckpt_path=...), or resume from a "
            "file saved with save_weights_only=False."
        )
    return ckpt


# --- URLs ----------------------------------------------------------------------------------------
def local_file(path: str) -> str:
    """``path`` itself; for a checkpoint at an http(s) URL (Lightning reads those too), its copy in
    torch's hub cache (``torch.hub.get_dir()/checkpoints``), named after the whole URL, so that two
    URLs ending in the same file name never share one. A copy is checked (the zip archive's size
    and CRCs) before it is used, and downloaded again if damaged; a download becomes a cache entry
    only once it is whole."""
    if not is_url(path):
        return path
    import torch.hub  # torch is imported by now; its hub only here

    name = os.path.basename(urllib.parse.urlparse(path).path) or "checkpoint.ckpt"
    entry = os.path.join(torch.hub.get_dir(), "checkpoints", f"{hashlib.sha256(path.encode()).hexdigest()[:16]}-{name}")
    if os.path.isfile(entry):
        problem = damage(entry)
        if problem is None:
            log.info("ckpt_path=%r: the cached copy %s.", path, entry)
            return entry
        log.warning("ckpt_path=%r: the cached copy %s is damaged (%s); downloading it again.", path, entry, problem)
        ckpt_io.remove(entry)
    _download(path, entry)
    log.info("ckpt_path=%r: downloaded to %s.", path, entry)
    return entry


def _download(url: str, entry: str) -> None:
    """``url`` into ``entry``, through a temp file beside it that is renamed only once the body
    is complete and the archive checks: a failed or cut-off download leaves nothing behind."""
    import http.client  # only for a URL: urllib.request costs milliseconds at `import trainer`
    import urllib.error
    import urllib.request

    fd, tmp = ckpt_io.open_temp(os.path.dirname(entry), f".download-{os.path.basename(entry)}-")
    try:
        with os.fdopen(fd, "wb") as out:
            try:
                with urllib.request.urlopen(url, timeout=60) as response:  # http(s) only: is_url checked it
                    announced, got = response.headers.get("Content-Length"), 0
                    while chunk := response.read(1 << 20):
                        out.write(chunk)
                        got += len(chunk)
            except urllib.error.HTTPError as err:
                kind = MissingCheckpoint if err.code == 404 else CheckpointError
                raise kind(
                    f"Could not download ckpt_path={url!r}: the server answered HTTP {err.code} ({err.reason}). "
                    "Check the URL, or download the file yourself and pass its path."
                ) from None
            except (urllib.error.URLError, OSError, http.client.HTTPException) as err:
                reason = getattr(err, "reason", None) or err
                raise CheckpointError(
                    f"Could not download ckpt_path={url!r}: {reason}. Nothing was cached: check the URL and the "
                    "network, and try again."
                ) from None
        # http.client ends a body cut short without a word: compare with what the server announced
        if announced is not None and announced.isdigit() and got != int(announced):
            raise CheckpointError(
                f"Could not download ckpt_path={url!r}: the connection closed after {got} bytes, before the "
                f"{announced} the server announced. Nothing was cached: try again."
            )
        problem = damage(tmp)
        if problem is not None:
            raise CheckpointError(
                f"The download of ckpt_path={url!r} is not a whole checkpoint: {problem}. Nothing was cached: "
                "check that the URL serves the .ckpt file itself (not a web page), and try again."
            )
        os.replace(tmp, entry)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
