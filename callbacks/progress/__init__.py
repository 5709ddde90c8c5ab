"""Progress bars: the tqdm bar (the default without rich) and Lightning's TQDMProgressBar."""

from .tqdm_progress import ProgressBar, TQDMProgressBar, tqdm_class

__all__ = ["ProgressBar", "TQDMProgressBar", "tqdm_class"]
