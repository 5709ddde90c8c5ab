"""``trainer.validate`` and ``trainer.test`` in each process (their entry points), and the
evaluation loop: validation (also inside fit), test and predict."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable

import torch

from trainer.data.rng import generator_states, rng_state, set_generator_states, set_rng_state
from trainer.checkpoint.paths import resolve_ckpt_path
from trainer.checkpoint.training_state import evaluate_checkpoint
from trainer.core.seed import seeded_workers
from trainer.data.batches import batch_size
from trainer.data.pipeline import BatchPipeline, batch_transfer, takes_dataloader_iter
from trainer.data.loaders import (
    LOADER_METHOD, Loaders, check_dataloader_idx, check_predict_mode, stage_loader, warn_spawned_workers,
)
from trainer.core.checks import none_batch
from trainer.core.exceptions import misconfigured
from trainer.core.metrics import MetricSink, set_sink
from trainer.core.module import overridden
from trainer.core.state import RunningStage, TrainerFn
from trainer.loops.hooks import refusing_logs
from trainer.loops.publishing import epoch_means
from trainer.loops.run import start, stage_hooks, use_run_folder

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.loops.run import Run, StageData
    from trainer.trainer import Trainer

_STEP = {"validation": "validation_step", "test": "test_step", "predict": "predict_step"}
_STAGES = {"validation": RunningStage.VALIDATING, "test": RunningStage.TESTING, "predict": RunningStage.PREDICTING}
_COUNTS = {"validation": "num_val_batches", "test": "num_test_batches", "predict": "num_predict_batches"}
# Lightning's profiler names of each batch's fetch
_NEXT = {
    "validation": "[_EvaluationLoop].val_next", "test": "[_EvaluationLoop].test_next",
    "predict": "[_PredictionLoop].predict_next",
}
_LIMITS = {"validation": "limit_val_batches", "test": "limit_test_batches"}


def validate_stage(trainer: Trainer, model: TrainModule, data: StageData, ckpt_path: Any) -> list[dict[str, float]]:
    """``trainer.validate`` in this process: one validation over its loaders; what was logged, per loader."""
    return _evaluate(trainer, "validate", model, data, ckpt_path, "validation")


def test_stage(trainer: Trainer, model: TrainModule, data: StageData, ckpt_path: Any) -> list[dict[str, float]]:
    """``trainer.test`` in this process: one test over its loaders; what was logged, per loader."""
    return _evaluate(trainer, "test", model, data, ckpt_path, "test")


def _evaluate(
    trainer: Trainer, stage: str, model: TrainModule, data: StageData, ckpt_path: Any, phase: str,
) -> list[dict[str, float]]:
    """The run set up; the run folder (fit's, after a fit); then, between the ``setup`` and
    ``teardown`` hooks, the checkpoint's weights, the loaders and the loop."""
    run = start(trainer, stage, model, data.datamodule)
    path = resolve_ckpt_path(trainer, ckpt_path, stage)  # before any hook: a wrong "best" fails first
    if run.run_dir is None:  # evaluation after fit writes into fit's folder
        use_run_folder(trainer, run)
    with stage_hooks(trainer, run):
        loaders = evaluation_loaders(trainer, run, data, path)
        logged = evaluation_loop(trainer, run, phase, loaders, getattr(trainer, _LIMITS[phase]))  # limits setup set
        return per_loader(run.eval_metrics, loaders, logged)  # the epoch values the loggers got (not the step rows)


def evaluation_loaders(trainer: Trainer, run: Run, data: StageData, path: str | None) -> Loaders:
    """What validate, test and predict share before their loop: the weights of ``path`` (resolved)
    (the counters stay the Trainer's), and the stage's loaders, seeded and prepared by the strategy."""
    strategy = trainer.strategy
    evaluate_checkpoint(trainer, run, path)
    found = stage_loader(run.stage, data.loader, run.module, data.datamodule, checked=True)
    if run.stage == "predict":
        check_predict_mode(found)
    loaders = Loaders(found)
    for loader in loaders.each():
        seeded_workers(loader, strategy.global_rank)
    loaders = loaders.map(lambda loader: strategy.process_dataloader(loader, run.stage))
    if strategy.is_global_zero:
        warn_spawned_workers(loaders.each(), LOADER_METHOD[run.stage])
    # Lightning's trainer.val_dataloaders, test_dataloaders, predict_dataloaders: as the stage runs them
    prefix = {"validate": "val", "test": "test", "predict": "predict"}[run.stage]
    setattr(run, prefix + "_dataloaders", loaders.as_given())
    return loaders


def per_loader(metrics: dict[str, float], loaders: Loaders, logged: list[set[str]]) -> list[dict[str, float]]:
    """validate's and test's result, as Lightning's: a list with one dict per loader, in the
    order given (a dict's in its order). With several loaders each holds what its steps logged
    (``logged``: suffixed, or not with ``add_dataloader_idx=False``), and every one holds what
    the epoch-end hooks logged."""
    if not loaders.several:
        return [dict(metrics)]
    by_a_loader = set().union(*logged)
    shared = {k: v for k, v in metrics.items() if k not in by_a_loader}
    return [{**{k: v for k, v in metrics.items() if k in names}, **shared} for names in logged]


def _no_grad(trainer: Trainer) -> Any:
    """``Trainer(inference_mode=True)`` (Lightning's default): ``torch.inference_mode()``, the
    cheaper no-grad; else ``torch.no_grad()``. Inside fit, and under fsdp (whose shards are
    gathered into tensors that training reuses), no_grad, so that no tensor made during
    validation is an inference tensor that training cannot use."""
    if trainer.inference_mode and trainer.state.fn is not TrainerFn.FITTING and trainer.strategy.name != "fsdp":
        return torch.inference_mode()
    return torch.no_grad()


def results_table(stage: str, results: list[dict[str, float]]) -> str:
    """``validate``'s or ``test``'s results as Lightning prints them with ``verbose=True``: one
    row per metric (the ``/dataloader_idx_<i>`` suffix taken off), one column per loader."""
    stripped = [{k.split("/dataloader_idx_")[0]: v for k, v in r.items()} for r in results]
    names = sorted({k for r in stripped for k in r})
    title = "Validate" if stage == "validate" else "Test"
    headers = [f"{title} metric"] + [f"DataLoader {i}" for i in range(len(results))]
    cells = [[name] + [f"{r[name]:.6g}" if name in r else "" for r in stripped] for name in names]
    width = max([len(h) for h in headers] + [len(c) for row in cells for c in row] + [12]) + 2
    bar = "─" * (width * len(headers))
    lines = [bar, "".join(h.center(width) for h in headers).rstrip(), bar]
    lines += ["".join(c.center(width) for c in row).rstrip() for row in cells] or ["(nothing was logged)".center(width)]
    return "\n".join(lines + [bar])


def evaluation_loop(
    trainer: Trainer, run: Run, phase: str, loaders: Any, limit: int | float | None, publish: bool = True,
    keep_rng: bool = False,
) -> list[Any] | None:
    """:func:`run_evaluation`, with ``trainer.state.stage`` saying which phase runs (``trainer.validating``
    and friends read it; the sanity check stays SANITY_CHECKING).
    A validation draws random numbers as a hand-written loop's does (its loader's iterator draws
    a seed). ``keep_rng``: one that an uninterrupted run would not have made (a stop's own) puts
    every generator back after, and a checkpoint saved meanwhile records the state from before
    it (resume.capture), so that the resumed run draws what the uninterrupted one did."""
    state = trainer.state
    previous = state.stage
    if previous is not RunningStage.SANITY_CHECKING:
        state.stage = _STAGES[phase]
    rng = rng_state() if keep_rng and run.training_rng is None else None  # once per such validation
    if rng is not None:
        run.training_rng = rng
    if publish and run.publish_step_metrics is not None and previous is not RunningStage.SANITY_CHECKING:
        run.publish_step_metrics()  # fit's validation: its hooks see the last step's training values (Lightning's)
    try:
        return run_evaluation(trainer, run, phase, loaders, limit, publish)
    finally:
        if rng is not None:
            set_rng_state(rng)
            run.training_rng = None
        state.stage = previous


def run_evaluation(
    trainer: Trainer, run: Run, phase: str, loaders: Any, limit: int | float | None, publish: bool = True
) -> list[Any] | None:
    """Run ``phase`` ("validation", "test" or "predict") over ``loaders`` (one loader or a
    :class:`~trainer.loaders.Loaders`); for predict, one list of outputs per loader, else the
    names each loader logged.

    The order of events::

        every rank takes rank 0's buffers (BatchNorm statistics); torch.no_grad()
        model.on_{phase}_model_eval()              # model.eval(), unless overridden
        on_{phase}_start, on_{phase}_epoch_start
        for each loader, for each batch (up to the limit, which applies per loader):
            on_{phase}_batch_start
            output = strategy.run_step("{phase}_step")  # + dataloader_idx with several loaders
            on_{phase}_batch_end                        # hooks get dataloader_idx with several loaders
            (each loader's epoch means of self.log values: suffixed with several loaders)
        on_{phase}_epoch_end                       # the model's hook may self.log epoch values
        the means -> logged_metrics, callback_metrics (the sanity check's: callback_metrics until its end)
        on_{phase}_end
        model.on_{phase}_model_train() if overridden, else every module's train/eval mode restored

    The training counters (``global_step``, ``current_epoch``) are read, never changed.
    """
    model, hooks, strategy = run.module, run.hooks, trainer.strategy
    loaders = loaders if isinstance(loaders, Loaders) else Loaders(loaders)
    step_name = _STEP[phase]
    lengths = loaders.lengths()
    counts, published = loaders.counts(lambda n: limited(n, limit, "val" if phase == "validation" else phase))
    if publish:  # Lightning's trainer.num_val_batches (num_test_batches, ...): one count per loader
        setattr(run, _COUNTS[phase], published)
    # A rank whose shard is empty (fewer samples than ranks) still joins the metric reduction.
    if not any(counts) and (limit == 0 or strategy.world_size == 1):
        return [[] for _ in counts] if phase == "predict" else [set() for _ in counts]
    strategy.broadcast_buffers()
    wrapped = trainer.model  # the strategy's wrapper (DDP's) when there is one: its mode is put back too
    modes, restore = [m.training for m in wrapped.modules()], True  # restored unless on_{phase}_model_train sets them
    means: dict[str, float] = {}
    logged: list[set[str]] = []  # the names each loader logged
    prog_bar: set[str] = set()
    hidden: set[str] = set()  # logged with logger=False: callback_metrics only
    aliases: dict[str, str] = {}
    # Lightning's rule: the step and the batch hooks get dataloader_idx only with several loaders.
    prefix = "val" if phase == "validation" else phase
    pipeline = BatchPipeline(strategy, run.precision, run.fetching, timer=run.profiling and run.profiling.timed_iter)
    iter_step = takes_dataloader_iter(model, step_name)  # the step draws its batches: it gets an iterator
    feed = pipeline.feed(loaders, counts, trainer.current_epoch, _NEXT[phase]) if iter_step else None
    batch_hooks = (f"on_{phase}_batch_start", f"on_{phase}_batch_end")  # a dataloader_iter step takes no dataloader_idx
    check_dataloader_idx(model, prefix, batch_hooks if feed is not None else (step_name, *batch_hooks), loaders.several)
    transfer = batch_transfer(model, strategy, trainer.datamodule)  # None unless a transfer hook is overridden
    run_step, profiling = strategy.run_step, run.profiling
    if profiling is not None:  # [Strategy]<class>.validation_step and each next batch, timed (profiling.py)
        run_step = profiling.strategy_call(strategy, step_name, run_step)
    outer = MetricSink()  # what the start and end hooks log: one value per process
    sinks = [outer]  # each loader's too: their Metrics are reset at the end
    # predict logs nothing: self.log raises there, as Lightning's, which has no results to log into
    active = (lambda sink: None) if phase == "predict" else (lambda sink: sink)
    previous_sink = set_sink(active(outer))
    no_grad = _no_grad(trainer)  # around the hooks too, as Lightning's loop: on_{phase}_start sees it
    no_grad.__enter__()
    try:
        with refusing_logs():
            getattr(model, f"on_{phase}_model_eval", model.eval)()
        hooks.call(f"on_{phase}_start", trainer, model)
        hooks.call(f"on_{phase}_epoch_start", trainer, model)
        batch_start, batch_end = getattr(hooks, f"on_{phase}_batch_start"), getattr(hooks, f"on_{phase}_batch_end")
        for i, (loader, n, length) in enumerate(zip(loaders, counts, lengths)):
            sink = MetricSink()
            sinks.append(sink)
            set_sink(active(sink))
            hook_args = (i,) if loaders.several else ()  # Lightning's rule: the index only with several
            with strategy.evaluating():  # e.g. fsdp gathers its shards once per loader (no_grad is on already)
                # A limit stops without loading one batch more; a whole pass runs the loader to its end,
                # as a hand-written loop does (a RandomSampler draws once more at its end).
                # set_epoch as Lightning's: a sampler that shuffles per epoch does here too
                record = run.predict_loop if phase == "predict" else None
                drawn = None if record is None else record.start_loader(loader)
                if feed is None:
                    it = pipeline.open(loader, trainer.current_epoch, limit=math.inf if n == length else n,
                                       timed_as=_NEXT[phase], drawn=drawn)
                for batch_idx, batch in enumerate(it) if feed is None else feed.steps(i):
                    if feed is not None:  # the hooks get the last batch the step fetched, and its indices
                        hook_args = (feed.dataloader_idx,) if loaders.several else ()
                    sink.batch_size = batch_size(batch)
                    if record is not None:
                        record.on_batch(i)
                    if transfer is not None:
                        batch = transfer(batch, i)
                    for fn in batch_start:
                        fn(trainer, model, batch, batch_idx, *hook_args)
                    try:
                        out = run_step(step_name, batch, batch_idx, *hook_args) if feed is None else (
                            run_step(step_name, feed, batch_idx))  # the iterator alone reaches the step
                    except StopIteration:
                        if feed is None:
                            raise
                        feed.done = True  # the step says the stage is over (Lightning's)
                        break
                    except Exception as err:  # costs nothing until a step fails
                        if batch is None:
                            which = f"The {phase} loader" + (f" {i} (dataloader_idx={i})" if loaders.several else "")
                            raise none_batch(which, batch_idx, step_name, err) from err
                        raise
                    if record is not None:
                        record.keep(i, out)
                    if feed is not None:
                        batch, batch_idx = feed.batch, feed.batch_idx
                        hook_args = (feed.dataloader_idx,) if loaders.several else ()
                    for fn in batch_end:
                        fn(trainer, model, out, batch, batch_idx, *hook_args)
                    if sink.options and publish:  # self.log(on_step=True): a row per batch, as Lightning's
                        _step_row(trainer, run, phase, i, sink, loaders.suffix(i))
            suffix = loaders.suffix(i)
            if sink.options:  # self.log's keywords: add_dataloader_idx=False, logger=False, on_step
                def named(name: str, sink: MetricSink = sink, suffix: str = suffix) -> str:
                    return name if name in sink.no_suffix else name + suffix
                mine = {named(name): v for name, v in epoch_means(sink, strategy).items()}
                hidden |= {named(name) for name in sink.hidden}
                aliases.update((named(n), named(a)) for n, a in sink.aliases.items())
                prog_bar |= {named(name) for name in sink.prog_bar}
            else:
                mine = {name + suffix: v for name, v in epoch_means(sink, strategy).items()}
                prog_bar |= {name + suffix for name in sink.prog_bar}
            means.update(mine)
            logged.append(set(mine))  # this loader's result holds them (add_dataloader_idx=False's too)
        set_sink(active(outer))
        # The sanity check's values are readable (callback_metrics, the bars) until on_sanity_check_end, as in Lightning
        shown = publish or trainer.sanity_checking
        if shown:  # the epoch's values, for on_{phase}_epoch_end to read (Lightning's)
            run.callback_metrics.update(means)
            run.callback_metrics.update((aliases[k], v) for k, v in means.items() if k in aliases)
        hooks.call(f"on_{phase}_epoch_end", trainer, model)
        means.update(epoch_means(outer, strategy))
        hidden |= outer.hidden
        aliases.update(outer.aliases)
        if publish:
            run.eval_metrics = {k: v for k, v in means.items() if k not in hidden} if hidden else means
            run.logged_metrics.update(run.eval_metrics)
        if shown:
            run.callback_metrics.update(means)
            run.callback_metrics.update((aliases[k], v) for k, v in means.items() if k in aliases)
            run.prog_bar_names |= prog_bar | outer.prog_bar
        with refusing_logs():  # Lightning's: nothing is logged at the end, nor in the mode hooks
            hooks.call(f"on_{phase}_end", trainer, model)
            if phase != "predict" and overridden(model, f"on_{phase}_model_train"):
                restore = False
                getattr(model, f"on_{phase}_model_train")()
    finally:
        no_grad.__exit__(None, None, None)
        set_sink(previous_sink)
        for sink in sinks:  # after on_{phase}_end, as Lightning resets its results
            sink.reset_metrics()
        for m, mode in zip(wrapped.modules(), modes) if restore else ():
            m.training = mode
    return run.predict_loop.per_dataloader if phase == "predict" else logged


def _step_row(trainer: Trainer, run: Run, phase: str, loader: int, sink: MetricSink, suffix: str) -> None:
    """The values an evaluation step logged with ``on_step=True`` (``<name>_step`` with
    on_epoch too), to the loggers and ``logged_metrics``, not ``callback_metrics``: Lightning's
    row, at the count of this loader's batches so far in the stage (across a fit's validations).
    Those logged with ``prog_bar=True`` too are in ``progress_bar_metrics`` (logger=False ones included)."""
    bar = sink.prog_bar
    stepped = [
        (name, opts.step_name, opts.logger) for name, opts in sink.options.items()
        if opts.step_name is not None and (opts.logger or opts.step_name in bar)
    ]
    if not stepped:  # e.g. only logger=False values: nothing to read off the device
        return
    latest = sink.latest_floats()
    row = {}
    for name, step, logged in stepped:
        if step in latest:
            key = step if name in sink.no_suffix else step + suffix
            if logged:
                row[key] = latest[step]
            if step in bar:
                run.eval_step_bar[key] = latest[step]
    if row:
        key = (phase, loader)
        step = run.eval_steps[key] = run.eval_steps.get(key, -1) + 1
        run.logged_metrics.update(row)
        for logger in trainer.loggers:
            logger.log_metrics(metrics=row, step=step)


def sanity_check(trainer: Trainer, run: Run, get_loaders: Callable[[], Loaders | None] | None) -> None:
    """Before training: ``num_sanity_val_steps`` batches of each validation loader (-1: all), so
    that a bug in ``validation_step`` shows in seconds, not after the first epoch.

    It changes nothing that training sees: every RNG (and each loader's own generator) is put
    back and nothing it logs is kept. The callbacks and the model see the validation hooks
    between ``on_sanity_check_start`` and ``on_sanity_check_end``, as in Lightning, with
    ``trainer.sanity_checking`` True: the built-in ones save, stop and write nothing then.
    """
    steps = trainer.num_sanity_val_steps
    if get_loaders is None or steps == 0 or trainer.limit_val_batches == 0:
        return
    model, hooks, cap = run.module, run.hooks, trainer.limit_val_batches
    limit = cap if steps == -1 else min(steps, cap) if isinstance(cap, int) else steps  # an int cap is a count too
    rng = rng_state()
    # What it logs is shown until on_sanity_check_end, then gone (Lightning's): training starts from these
    callback_metrics, prog_bar_names = dict(run.callback_metrics), set(run.prog_bar_names)
    stage, trainer.state.stage = trainer.state.stage, RunningStage.SANITY_CHECKING  # on_sanity_check_start to _end
    try:
        hooks.call("on_sanity_check_start", trainer, model)
        loaders = get_loaders()  # val_dataloader() sees trainer.sanity_checking, as in Lightning
        if loaders is not None:
            generators = [generator_states(loader) for loader in loaders]
            try:
                evaluation_loop(trainer, run, "validation", loaders, limit, publish=False)
            finally:
                set_rng_state(rng)
                for loader, states in zip(loaders, generators):
                    set_generator_states(loader, states)
        hooks.call("on_sanity_check_end", trainer, model)
    finally:
        trainer.state.stage = stage
        run.callback_metrics.clear()
        run.callback_metrics.update(callback_metrics)
        run.prog_bar_names = prog_bar_names


def limited(n: int | None, limit: int | float | None, prefix: str = "") -> int | float:
    """How many batches to run: the loader's length (inf if unsized) cut by a count or fraction limit.
    A fraction other than 1.0 of a loader without a length is Lightning's error (``prefix``: "train", "val", ...)."""
    total = math.inf if n is None else n
    if limit is None:
        return total
    if isinstance(limit, float):
        if total == math.inf and limit != 1.0 and prefix:
            raise misconfigured(
                f"{prefix}_dataloader has no length (an IterableDataset or a stream), "
                f"so limit_{prefix}_batches={limit!r} is a fraction of an unknown number: pass a number of batches.",
                f"When using an `IterableDataset` for `{prefix}_dataloader`, `Trainer(limit_{prefix}_batches)` must be "
                f"`1.0` or an int. An int specifies `num_{prefix}_batches` to use.",
            )
        return total if total == math.inf else max(1, int(total * limit))
    return min(total, limit)
