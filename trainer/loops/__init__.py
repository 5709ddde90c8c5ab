"""The order of events: each entry point's run, the fit and evaluation loops, hooks and optimization."""

from trainer.loops.fit import FitLoop
from trainer.loops.stage import run_stage

__all__ = ["FitLoop", "run_stage"]
