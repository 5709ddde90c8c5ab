"""Lightning's public utilities that users import: parsing, memory, seeding, warnings, shared parameters,
throughput and FLOPs.

Each module answers to its Lightning counterpart (``lightning.pytorch.utilities.parsing`` is
``trainer.utilities.parsing``, and so on); the names Lightning exports from
``lightning.pytorch.utilities`` itself are exported here.
"""

from trainer.core.distributed import rank_zero_info, rank_zero_only, rank_zero_warn
from trainer.core.hparams import AttributeDict
from trainer.core.metrics import grad_norm
from trainer.utilities.memory import recursive_detach
from trainer.utilities.parameter_tying import find_shared_parameters, set_shared_parameters
from trainer.utilities.parsing import is_picklable
from trainer.utilities.seed import isolate_rng
from trainer.utilities.throughput import Throughput, measure_flops
from trainer.utilities.types import LRSchedulerConfig
from trainer.utilities.warnings import PossibleUserWarning, disable_possible_user_warnings

__all__ = [
    "AttributeDict", "LRSchedulerConfig", "PossibleUserWarning", "Throughput", "disable_possible_user_warnings",
    "find_shared_parameters", "grad_norm", "is_picklable", "isolate_rng", "measure_flops", "rank_zero_info",
    "rank_zero_only", "rank_zero_warn", "recursive_detach", "set_shared_parameters",
]
