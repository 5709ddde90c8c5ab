"""Callbacks that change how the model trains: weight averaging, staged fine-tuning, an accumulation schedule."""

from .finetuning import BackboneFinetuning, BaseFinetuning
from .gradient_accumulation_scheduler import GradientAccumulationScheduler
from .stochastic_weight_avg import StochasticWeightAveraging

__all__ = ["BackboneFinetuning", "BaseFinetuning", "GradientAccumulationScheduler", "StochasticWeightAveraging"]
