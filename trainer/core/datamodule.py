"""DataModule: the data of a project in one object, Lightning's ``LightningDataModule``."""

from __future__ import annotations

import inspect
import os
from typing import TYPE_CHECKING, Any

from torch.utils.data import DataLoader, Dataset, IterableDataset

from trainer.core.exceptions import MisconfigurationException
from trainer.core.distributed import move_to_device
from trainer.core.hparams import CHECKPOINT_READER, HyperparametersMixin

if TYPE_CHECKING:
    from trainer.trainer import Trainer


class DataModule(HyperparametersMixin):
    """The data of a project in one object: ``fit(model, datamodule=dm)``.

    Define the loader methods you need. ``prepare_data`` runs once per machine (on its local
    rank 0, the other processes wait), for downloads and other writes to disk; ``setup(stage)``
    runs in every process, for what each one holds in memory (splits, tokenizers). Set
    ``prepare_data_per_node = False`` when the machines share a file system, and global rank 0
    alone prepares. ``self.save_hyperparameters()`` and ``self.hparams`` work as on the module;
    ``state_dict()``/``load_state_dict()`` are saved in and restored from checkpoints; while a
    stage runs ``self.trainer`` is the Trainer. Lightning's ``LightningDataModule``, with the
    same names.
    """

    prepare_data_per_node = True
    #: Where checkpoints keep the hyperparameters (Lightning's keys).
    CHECKPOINT_HYPER_PARAMS_KEY = "datamodule_hyper_parameters"
    CHECKPOINT_HYPER_PARAMS_NAME = "datamodule_hparams_name"
    CHECKPOINT_HYPER_PARAMS_TYPE = "datamodule_hparams_type"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        self.trainer: Trainer | None = None

    def prepare_data(self) -> None: ...
    def setup(self, stage: str) -> None: ...
    def teardown(self, stage: str) -> None: ...
    # Not defined until a subclass defines them (the Trainer asks which ones it does); called, each says so.
    def train_dataloader(self) -> Any:
        raise _undefined("train_dataloader", self)

    def val_dataloader(self) -> Any:
        raise _undefined("val_dataloader", self)

    def test_dataloader(self) -> Any:
        raise _undefined("test_dataloader", self)

    def predict_dataloader(self) -> Any:
        raise _undefined("predict_dataloader", self)
    def on_exception(self, exception: BaseException) -> None: ...

    # The batch hooks, as on the module: a DataModule's own override is used in place of the module's.
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch

    def transfer_batch_to_device(self, batch: Any, device: Any, dataloader_idx: int) -> Any:
        return move_to_device(batch, device)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch

    def __str__(self) -> str:
        """Which loaders the DataModule gives now, and their datasets' sizes, one line each
        (Lightning's): ``{Train dataloader: size=64}``, ``None`` for a loader its method
        cannot give (not defined, or ``setup`` has not run), ``size=NA`` for a dataset without
        a length, ``1. size=16 ; 2. size=NA`` for several loaders."""

        def size(loader: Any) -> str:
            dataset = getattr(loader, "dataset", None)
            return str(len(dataset)) if hasattr(dataset, "__len__") else "NA"

        lines = []
        for title, method in (("Train", "train_dataloader"), ("Validation", "val_dataloader"),
                              ("Test", "test_dataloader"), ("Predict", "predict_dataloader")):
            try:
                loaders = getattr(self, method)()
            except Exception:  # noqa: BLE001 - any failure means "not available", as in Lightning
                loaders = None
            if isinstance(loaders, DataLoader):
                text = f"size={size(loaders)}"
            elif isinstance(loaders, (list, tuple, dict)) and loaders:
                each = loaders.values() if isinstance(loaders, dict) else loaders
                text = " ; ".join(
                    f"{i}. size={size(x)}" if isinstance(x, DataLoader) else "None" for i, x in enumerate(each, 1)
                )
            else:
                text = "None"
            lines.append(f"{{{title} dataloader: {text}}}")
        return os.linesep.join(lines)

    def state_dict(self) -> dict[str, Any]:
        """What checkpoints keep of this DataModule (plain data, tensors); empty by default."""
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Take back what ``state_dict`` returned, when fit resumes from a checkpoint."""

    @classmethod
    def load_from_checkpoint(
        cls, checkpoint_path: str | os.PathLike, map_location: Any = None, hparams_file: Any = None, **kwargs: Any,
    ) -> "DataModule":
        """The DataModule a checkpoint was trained with: built from the hyperparameters it recorded
        (``kwargs`` replace or add some), then given its ``state_dict`` back."""
        return CHECKPOINT_READER[0](cls, checkpoint_path, map_location, hparams_file, **kwargs)

    @classmethod
    def from_datasets(
        cls, train_dataset: Any = None, val_dataset: Any = None, test_dataset: Any = None, predict_dataset: Any = None,
        batch_size: int = 1, num_workers: int = 0, **datamodule_kwargs: Any,
    ) -> "DataModule":
        """A DataModule whose loaders serve these datasets (the training one shuffled);
        ``batch_size`` and ``num_workers`` go to the DataLoaders, and to ``__init__`` if it takes them.
        A list or dict of datasets gives several loaders."""

        def loaders(data: Any, shuffle: bool = False) -> Any:
            if isinstance(data, dict):
                return {k: loaders(v, shuffle) for k, v in data.items()}
            if isinstance(data, (list, tuple)):
                return [loaders(v, shuffle) for v in data]
            return DataLoader(data, batch_size=batch_size, num_workers=num_workers,
                              shuffle=shuffle and not isinstance(data, IterableDataset))

        for name, data in (("train_dataset", train_dataset), ("val_dataset", val_dataset),
                           ("test_dataset", test_dataset), ("predict_dataset", predict_dataset)):
            if (data is not None and not isinstance(data, (Dataset, list, tuple, dict))
                    and not hasattr(data, "__getitem__")):
                raise TypeError(
                    f"DataModule.from_datasets({name}={data!r:.80}) takes a torch Dataset (or a list or dict of them)."
                )
        params = inspect.signature(cls.__init__).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
        sizes = (("batch_size", batch_size), ("num_workers", num_workers))
        extra = {k: v for k, v in sizes if takes_any or k in params}
        dm = cls(**datamodule_kwargs, **extra)
        if train_dataset is not None:
            dm.train_dataloader = lambda: loaders(train_dataset, shuffle=True)
        if val_dataset is not None:
            dm.val_dataloader = lambda: loaders(val_dataset)
        if test_dataset is not None:
            dm.test_dataloader = lambda: loaders(test_dataset)
        if predict_dataset is not None:
            dm.predict_dataloader = lambda: loaders(predict_dataset)
        return dm


def _undefined(method: str, owner: Any) -> MisconfigurationException:
    return MisconfigurationException(
        f"`{method}` must be implemented to be used with the Lightning Trainer: define "
        f"{type(owner).__name__}.{method}(self) returning a DataLoader."
    )
