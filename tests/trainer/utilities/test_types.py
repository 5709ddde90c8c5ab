"""trainer/utilities/types.py: trainer.lr_scheduler_configs holds Lightning's LRSchedulerConfig."""

from __future__ import annotations

import torch

from tests._models import Classifier, loader, quiet
from trainer import Trainer
from trainer.utilities import LRSchedulerConfig


class Plateau(Classifier):
    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters())
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(opt),
                "monitor": "train_loss"}


def test_a_plateau_schedulers_config_is_lightnings_dataclass_with_its_defaults():
    trainer = Trainer(max_epochs=1, limit_train_batches=2, **quiet())
    trainer.fit(Plateau(), loader(32))
    config = trainer.lr_scheduler_configs[0]
    assert config == LRSchedulerConfig(
        scheduler=config.scheduler, monitor="train_loss", interval="epoch", frequency=1, reduce_on_plateau=True,
        strict=True, name=None,
    )
    assert config.scheduler.last_epoch == 1  # stepped on train_loss at the epoch's end


def test_reduce_on_plateau_in_a_scheduler_dict_steps_it_on_its_monitor():
    got = []

    class OnMetric(torch.optim.lr_scheduler.StepLR):  # a scheduler of the user's that takes the metric
        def step(self, metric=None):
            got.append(metric)
            super().step()

    class Custom(Classifier):
        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1)
            sched = OnMetric(opt, step_size=1)
            return [opt], [{"scheduler": sched, "reduce_on_plateau": True, "monitor": "train_loss"}]

    trainer = Trainer(max_epochs=2, limit_train_batches=2, **quiet())
    trainer.fit(Custom(), loader(32))
    assert trainer.lr_scheduler_configs[0].reduce_on_plateau
    assert got[0] is None  # torch's own first step, as the scheduler is built
    assert len(got) == 3 and all(m is not None for m in got[1:])  # then once an epoch, with train_loss
