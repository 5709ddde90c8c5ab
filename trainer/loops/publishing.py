"""What fit publishes of the logged values, and when: into ``callback_metrics`` and to the
``on_train_log`` hooks (the loggers) every ``log_every_n_steps`` steps, after
``on_train_batch_end`` (Lightning's rows); the epoch values at each epoch's end.
:class:`Publisher` is held by :class:`~trainer.loops.fit.FitLoop` (``loop.publisher``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from trainer.core.metrics import MetricSink, set_sink

if TYPE_CHECKING:
    from trainer.core.module import TrainModule
    from trainer.loops.run import Run
    from trainer.trainer import Trainer


class Publisher:
    """One fit's publishing of logged values; ``next_log`` is the step of the next log step."""

    def __init__(self, trainer: Trainer, run: Run, model: TrainModule) -> None:
        self.trainer, self.run, self.model = trainer, run, model
        self._published: tuple[int, dict[str, float]] = (-1, {})  # (step, values) last put in callback_metrics
        self._first_sink: MetricSink | None = None
        step, every = trainer.state.log_step, trainer.log_every_n_steps
        self.next_log = 1 if step == 0 else step - step % every + every

    def train_start(self) -> None:
        """``on_train_start``, whose ``self.log`` values are the first epoch's epoch values
        (Lightning's: logged at its end, then gone)."""
        sink = self._first_sink = MetricSink(training=True)
        previous = set_sink(sink.open_epoch_end())  # epoch values there, each counted once, as at an epoch's end
        try:
            self.run.hooks.call("on_train_start", self.trainer, self.model)
        finally:
            set_sink(previous)
            sink.epoch_end = False

    def epoch_sink(self) -> MetricSink:
        """The sink of an epoch's values: the first epoch's holds what on_train_start logged."""
        sink, self._first_sink = self._first_sink or MetricSink(training=True), None
        return sink

    def at_log_step(self) -> None:
        """At step 1 and every ``log_every_n_steps`` steps (the loop checked the loss first); every
        ``log_every_n_steps``-th step (Lightning's cadence, none at step 1), publish the step's
        logged values, those logged in ``on_train_batch_end`` included, to the ``on_train_log`` hooks."""
        trainer, run = self.trainer, self.run
        every = 1 if trainer.fast_dev_run else trainer.log_every_n_steps  # fast_dev_run: each step, as Lightning's
        step = trainer.state.log_step
        self.next_log = step - step % every + every
        if step % every:  # step 1: checked only
            return
        run.step_cache, self._published = (-1, {}), (-1, {})  # read again: on_train_batch_end may have logged
        metrics = self.publish_step_metrics()
        run.logged_metrics.update(metrics)  # with loggers or without, as Lightning's (no epoch: the rows' only)
        for fn in self.run.hooks.on_train_log:
            fn(trainer, self.model, metrics)

    def publish_step_metrics(self) -> dict[str, float]:
        """This step's logged values, into ``callback_metrics`` (once per step)."""
        trainer, run = self.trainer, self.run
        step = trainer.state.log_step
        if self._published[0] != step:
            metrics = trainer.step_metrics()
            sink = run.train_sink
            if trainer.strategy.world_size > 1:  # what monitors read must be the same on every rank
                metrics = over_processes(metrics, reduce_kinds(sink, epoch=False), trainer.strategy)
            if sink is not None and sink.options:  # self.log keywords: aliases, logger=False
                run.callback_metrics.update(sink.for_callbacks(metrics))
                metrics = sink.for_logger(metrics)
            else:
                run.callback_metrics.update(metrics)
            self._published = (step, metrics)
        return self._published[1]

    def publish_epoch_means(self, sink: MetricSink) -> None:
        """The epoch's values (Lightning's: those logged with on_epoch, and in on_train_epoch_end)
        into ``callback_metrics``, after the last step's (a value with no epoch value keeps it)."""
        strategy, run = self.trainer.strategy, self.run
        run.logged_metrics.update(self.publish_step_metrics())  # the last step's, logged or not (Lightning's)
        means = epoch_means(sink, strategy)  # none of training_step's defaults: on_epoch=False
        run.callback_metrics.update(sink.for_callbacks(means))
        run.train_epoch_metrics = sink.for_logger(means)  # logger=False: callback_metrics only
        run.logged_metrics.update(run.train_epoch_metrics)
        run.prog_bar_names |= sink.prog_bar
        run.epoch_values_step = self.trainer.state.global_step  # newer than the step's, until the next step


def reduce_kinds(sink: MetricSink | None, epoch: bool) -> dict[str, str]:
    """The published names that are reduced over the processes by other than their mean: "sum",
    "max", "min" (``reduce_fx``), "local" (``rank_zero_only``: not at all). For the epoch's values,
    only "max" and "min": ``epoch_means`` reduced the others."""
    wanted = ("max", "min") if epoch else ("sum", "max", "min")
    kinds = {}
    for opts in (sink.options.values() if sink is not None else ()):
        published = opts.epoch_name if epoch else opts.step_name
        if published is not None and (opts.local and not epoch or not opts.local and opts.kind in wanted):
            kinds[published] = "local" if opts.local else opts.kind
    return kinds


def over_processes(values: dict[str, float], kinds: dict[str, str], strategy: Any) -> dict[str, float]:
    """``values`` reduced over the processes as Lightning's ``sync_dist`` does, by ``kinds`` (above),
    else by their mean (a name some process lacks: over the others). One reduction whatever the
    names, so that every rank makes the same calls; a max or min travels as one slot per rank."""
    rank, one, zero = strategy.global_rank, torch.ones((), dtype=torch.float64), torch.zeros((), dtype=torch.float64)
    parts = {}
    for name, value in values.items():
        kind = kinds.get(name, "mean")
        if kind in ("max", "min"):
            for r in range(strategy.world_size):
                mine = r == rank
                slot = torch.tensor(value if mine else 0.0, dtype=torch.float64)
                parts[f"{name}\x00{r}"] = (slot, one if mine else zero)
        elif kind != "local":
            parts[name] = (torch.tensor(value, dtype=torch.float64), one)
    out = {name: value for name, value in values.items() if kinds.get(name) == "local"}
    extremes: dict[str, list[float]] = {}
    for key, (total, weight) in sorted(strategy.reduce_metrics(parts).items()):
        name, _, slot = key.partition("\x00")
        if slot:
            if float(weight) > 0:
                extremes.setdefault(name, []).append(float(total))
        else:
            out[name] = float(total) if kinds.get(name) == "sum" else float(total) / float(weight)
    out.update((name, max(seen) if kinds[name] == "max" else min(seen)) for name, seen in extremes.items())
    return out


def epoch_means(sink: MetricSink, strategy: Any) -> dict[str, float]:
    """``sink``'s epoch values over all processes, a ``reduce_fx`` max or min's included."""
    means = sink.epoch_means(strategy.reduce_metrics)
    if strategy.world_size > 1:  # every rank reduces, with extremes to reduce or not
        kinds = reduce_kinds(sink, epoch=True)
        means.update(over_processes({n: v for n, v in means.items() if n in kinds}, kinds, strategy))
    return means
