"""Progress bars: the tqdm bar (ProgressBar, Lightning's TQDMProgressBar) and Lightning's RichProgressBar."""

from .rich_progress import RichProgressBar, RichProgressBarTheme, rich_available
from .tqdm_progress import ProgressBar, TQDMProgressBar, tqdm_class

__all__ = ["ProgressBar", "RichProgressBar", "RichProgressBarTheme", "TQDMProgressBar", "rich_available", "tqdm_class"]
