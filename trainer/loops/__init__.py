"""The order of events: a stage, the fit and evaluation loops, hooks, optimization and precision."""

from trainer.loops.fit import FitLoop
from trainer.loops.stage import run_stage

__all__ = ["FitLoop", "run_stage"]
