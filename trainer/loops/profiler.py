"""``Trainer(profiler="simple")``: where a stage's time went.

The loops never ask whether profiling is on inside their per-batch body. With a profiler, the
pieces that the body calls are swapped, once per epoch or per stage, for timed versions of
themselves: the batch iterator (fetching), the training step (forward), backward, the
optimizers' ``step`` (through torch's own step hooks), each callback's and the module's hooks,
and each validation run. Without one nothing is swapped, so it costs nothing.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, Iterable, Iterator

from callbacks import ModelCheckpoint
from callbacks.base import HOOKS

_ORDER = ("fetching", "training_step", "backward", "optimizer_step", "callbacks", "checkpointing", "module hooks",
          "validation", "test", "predict")
_MEANING = {
    "fetching": "loading the next batch (and copying it to the device)",
    "training_step": "the forward pass: training_step, the loss",
    "backward": "loss.backward()",
    "optimizer_step": "optimizer.step()",
    "callbacks": "the callbacks' hooks",
    "checkpointing": "ModelCheckpoint's hooks: writing checkpoints",
    "module hooks": "the module's own hooks (on_train_epoch_end, ...)",
    "validation": "validation runs (their callbacks included)",
}


class SimpleProfiler:
    """Adds up the time of each action; ``summary()`` is the table printed at the end of a stage.

    ``recorded[action] == [calls, total_seconds]``. Actions nest: validation includes the
    callbacks it calls, so the percentages (of the stage's wall time) may add up to more than 100.
    """

    def __init__(self) -> None:
        self.recorded: dict[str, list[float]] = {}
        self.stage = ""
        self._start = 0.0
        self.total = 0.0
        self._handles: list[Any] = []

    # --- a stage -----------------------------------------------------------------------
    def start(self, stage: str) -> None:
        self.recorded, self.stage, self.total = {}, stage, 0.0
        self._start = time.perf_counter()

    def stop(self) -> None:
        self.total = time.perf_counter() - self._start
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def add(self, action: str, seconds: float) -> None:
        entry = self.recorded.get(action)
        if entry is None:
            self.recorded[action] = [1, seconds]
        else:
            entry[0] += 1
            entry[1] += seconds

    # --- timed versions ----------------------------------------------------------------
    def timed(self, action: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        clock, add = time.perf_counter, self.add

        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            start = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                add(action, clock() - start)

        return run

    def timed_iter(self, action: str, batches: Iterable[Any]) -> Iterator[Any]:
        clock, add, it = time.perf_counter, self.add, iter(batches)
        while True:
            start = clock()
            try:
                batch = next(it)
            except StopIteration:
                return
            add(action, clock() - start)
            yield batch

    def attach_optimizers(self, optimizers: Iterable[Any]) -> None:
        """Time ``optimizer.step()`` with torch's step hooks (removed by ``stop``)."""
        clock, starts = time.perf_counter, {}

        def before(optimizer: Any, args: Any, kwargs: Any) -> None:
            starts[id(optimizer)] = clock()

        def after(optimizer: Any, args: Any, kwargs: Any) -> None:
            self.add("optimizer_step", clock() - starts.pop(id(optimizer), clock()))

        for optimizer in optimizers:
            self._handles += [optimizer.register_step_pre_hook(before), optimizer.register_step_post_hook(after)]

    def wrap_hooks(self, hooks: Any) -> None:
        """Each hook function of a ``Hooks`` table, timed as its owner's: a callback's, ModelCheckpoint's
        (checkpointing) or the module's own. The same function keeps one wrapper, so the loop's
        ``fn is not own`` checks still hold."""
        own = {id(fn): name for name, fn in hooks.module_hooks.items()}
        wrapped: dict[int, Callable[..., Any]] = {}

        def timed(fn: Callable[..., Any]) -> Callable[..., Any]:
            if id(fn) not in wrapped:
                owner = getattr(fn, "__self__", None)
                action = "module hooks" if id(fn) in own else "checkpointing" if isinstance(owner, ModelCheckpoint) else "callbacks"
                wrapped[id(fn)] = self.timed(action, fn)
            return wrapped[id(fn)]

        for name in HOOKS:
            setattr(hooks, name, [timed(fn) for fn in getattr(hooks, name)])
        hooks.module_hooks = {name: timed(fn) for name, fn in hooks.module_hooks.items()}

    # --- the report --------------------------------------------------------------------
    def summary(self) -> str:
        """The table: each action's calls, total and mean time and share of the stage's time."""
        total = self.total or (time.perf_counter() - self._start)
        rows = [(a, *self.recorded[a]) for a in _ORDER if a in self.recorded]
        rows += [(a, *v) for a, v in self.recorded.items() if a not in _ORDER]
        width = max([len(a) for a, *_ in rows] + [len("Action")])
        lines = [
            f"Profiler report ({self.stage}): {total:.3f} s in all",
            f"{'Action':<{width}}  {'Calls':>7}  {'Total (s)':>10}  {'Mean (ms)':>10}  {'%':>6}  What",
        ]
        for action, calls, seconds in rows:
            share = 100.0 * seconds / total if total > 0 else 0.0
            lines.append(
                f"{action:<{width}}  {int(calls):>7}  {seconds:>10.3f}  {1000.0 * seconds / calls:>10.3f}  "
                f"{share:>6.1f}  {_MEANING.get(action, '')}"
            )
        return "\n".join(lines)

    def describe(self) -> None:
        print(self.summary(), flush=True)
