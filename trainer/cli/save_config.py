"""SaveConfigCallback: the command line's full config, written as ``config.yaml`` into the run's folder."""

from __future__ import annotations

import os
import warnings
from typing import Any

from callbacks.base import Callback

__all__ = ["SaveConfigCallback"]


class SaveConfigCallback(Callback):
    """Writes the full config (every default included) to ``<trainer.log_dir>/config.yaml`` when a
    stage sets up, once, on global rank 0, as Lightning's does: ``lightning_logs/version_<n>/``
    with the default logger, the working directory (``default_root_dir``) without one. It
    refuses to overwrite another run's file unless ``overwrite=True``. Subclass it and
    override :meth:`save_config` to store the config elsewhere too (``save_to_log_dir=False``:
    only there)."""

    def __init__(self, parser: Any, config: Any, config_filename: str = "config.yaml", overwrite: bool = False,
                 multifile: bool = False, save_to_log_dir: bool = True) -> None:
        self.parser, self.config = parser, config
        self.config_filename, self.overwrite, self.multifile = config_filename, overwrite, multifile
        self.save_to_log_dir = save_to_log_dir
        self.already_saved = False
        if not save_to_log_dir and type(self).save_config is SaveConfigCallback.save_config:
            raise ValueError(
                "`save_to_log_dir=False` only makes sense when subclassing SaveConfigCallback to implement "
                "`save_config` and it is desired to disable the standard behavior of saving to log_dir."
            )

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self.already_saved:
            return
        strategy = trainer.strategy
        if self.save_to_log_dir:
            log_dir = trainer.log_dir or os.getcwd()  # log_dir=None (no run folder): the working directory
            path = os.path.join(log_dir, self.config_filename)
            if not self.overwrite:
                exists = strategy.broadcast_object(os.path.isfile(path) if trainer.is_global_zero else None)
                if exists:
                    raise RuntimeError(
                        f"{type(self).__name__} expected {path} to NOT exist. Aborting to avoid overwriting results of "
                        "a previous run. You can delete the previous config file, set "
                        "`LightningCLI(save_config_callback=None)` to disable config saving, or set "
                        '`LightningCLI(save_config_kwargs={"overwrite": True})` to overwrite the config file. '
                        "(It is another run's config: or choose another --trainer.default_root_dir.)"
                    )
            if trainer.is_global_zero:
                os.makedirs(log_dir, exist_ok=True)
                with warnings.catch_warnings():  # skip_none: deprecated in newer jsonargparse, needed in older
                    warnings.simplefilter("ignore")
                    self.parser.save(
                        self.config, path, skip_none=False, overwrite=self.overwrite, multifile=self.multifile
                    )
        if trainer.is_global_zero:
            self.save_config(trainer, pl_module, stage)
            self.already_saved = True
        self.already_saved = strategy.broadcast_object(self.already_saved)  # every rank agrees for later stages

    def save_config(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """Override to store the config somewhere else too (global rank 0 only: no collectives here),
        e.g. ``trainer.logger.log_hyperparams({"config": self.parser.dump(self.config, skip_none=False)})``."""
