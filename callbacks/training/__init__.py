"""Callbacks that change how the model trains: weight averaging, pruning, staged fine-tuning, accumulation schedules."""

from .finetuning import BackboneFinetuning, BaseFinetuning
from .gradient_accumulation_scheduler import GradientAccumulationScheduler
from .pruning import ModelPruning
from .stochastic_weight_avg import StochasticWeightAveraging
from .weight_averaging import EMAWeightAveraging, WeightAveraging

__all__ = [
    "BackboneFinetuning", "BaseFinetuning", "EMAWeightAveraging", "GradientAccumulationScheduler", "ModelPruning",
    "StochasticWeightAveraging", "WeightAveraging",
]
