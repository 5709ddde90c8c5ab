"""DataModule: the data of a project in one object, Lightning's ``LightningDataModule``."""

from __future__ import annotations

from typing import Any


class DataModule:
    """The data of a project in one object: ``fit(model, datamodule=dm)``.

    Define the loader methods you need. ``prepare_data`` runs once per machine (on its local
    rank 0, the other processes wait), for downloads and other writes to disk; ``setup(stage)``
    runs in every process, for what each one holds in memory (splits, tokenizers). Set
    ``prepare_data_per_node = False`` when the machines share a file system, and global rank 0
    alone prepares. Lightning's ``LightningDataModule``, with the same names.
    """

    prepare_data_per_node = True

    def prepare_data(self) -> None: ...
    def setup(self, stage: str) -> None: ...
    def teardown(self, stage: str) -> None: ...
    def train_dataloader(self) -> Any: ...
    def val_dataloader(self) -> Any: ...
    def test_dataloader(self) -> Any: ...
    def predict_dataloader(self) -> Any: ...
