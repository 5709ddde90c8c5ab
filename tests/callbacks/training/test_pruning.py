"""ModelPruning: the zeros in the weights, the sparsity it logs, its schedules, and checkpoints saved while pruning."""

from __future__ import annotations

import copy
import logging
import os
import re

import pytest
import torch
import torch.nn.utils.prune as prune
from torch import nn

from callbacks import Callback, ModelCheckpoint, ModelPruning
from tests._models import Classifier, loader, quiet
from trainer import MisconfigurationException, Trainer


def _fit(model, *callbacks, epochs=1, **options):
    trainer = Trainer(**quiet(max_epochs=epochs, enable_model_summary=False, callbacks=list(callbacks), **options))
    trainer.fit(model, loader(64), loader(32))
    return trainer


def _zeros(model: nn.Module, names=("weight", "bias")) -> tuple[int, int]:
    values = [p for n, p in model.named_parameters() if n.rsplit(".", 1)[-1] in names]
    return sum(int((p == 0).sum()) for p in values), sum(p.numel() for p in values)


class Zeros(Callback):
    """The model's zero weights at each epoch's end (placed after the pruning callback)."""

    def __init__(self) -> None:
        self.counts: list[int] = []

    def on_train_epoch_end(self, trainer, module):
        self.counts.append(sum(int((m.weight == 0).sum()) for m in module.modules() if isinstance(m, nn.Linear)))


def test_global_l1_pruning_zeros_the_smallest_half_and_logs_the_sparsity(caplog):
    model = Classifier()
    total = sum(p.numel() for p in model.parameters())  # 8*16 + 16 + 16*2 + 2 = 178
    with caplog.at_level(logging.INFO):
        _fit(model, ModelPruning("l1_unstructured", amount=0.5, verbose=1))
    zeros, size = _zeros(model)
    assert (size, zeros) == (total, round(0.5 * total))
    assert not any(name.endswith(("_orig", "_mask")) for name, _ in model.named_parameters())  # made permanent
    assert f"Applied `L1Unstructured`. Pruned: 0/{total} (0.00%) -> 89/{total} (50.00%)" in caplog.messages


def test_verbose_2_logs_each_parameter(caplog):
    model = Classifier()
    pairs = [(model.net[0], "weight"), (model.net[3], "weight")]
    with caplog.at_level(logging.INFO):
        _fit(model, ModelPruning("random_unstructured", parameters_to_prune=pairs, amount=0.25, verbose=2))
    lines = [m for m in caplog.messages if m.startswith("Applied `RandomUnstructured` to")]
    assert len(lines) == 2
    assert re.match(
        r"Applied `RandomUnstructured` to `Linear\(in_features=8, out_features=16, bias=True\)\.weight` "
        r"with amount=0.25\. Pruned: 0 \(0\.00%\) -> \d+ \(\d+\.\d\d%\)$",
        lines[0],
    )
    assert int((model.net[0].weight == 0).sum()) + int((model.net[3].weight == 0).sum()) == round(0.25 * (128 + 32))
    assert not (model.net[0].bias == 0).any()  # not among the pairs


def test_apply_pruning_and_amount_follow_the_epoch():
    zeros = Zeros()
    model = Classifier()
    pruning = ModelPruning(
        "l1_unstructured",
        parameter_names=["weight"],
        amount=lambda epoch: 10 * (epoch + 1),
        apply_pruning=lambda epoch: epoch in (1, 2),
        use_lottery_ticket_hypothesis=False,
    )
    _fit(model, pruning, zeros, epochs=4)
    assert zeros.counts == [0, 20, 50, 50]  # epoch 1 prunes 20 weights, epoch 2 30 more, then none


def test_structured_pruning_zeros_whole_rows_of_each_layer():
    model = Classifier()
    _fit(
        model,
        ModelPruning(
            "ln_structured",
            parameter_names=["weight"],
            use_global_unstructured=False,
            amount=0.5,
            pruning_dim=0,
            pruning_norm=1,
        ),
    )
    first, last = model.net[0].weight, model.net[3].weight
    assert int((first == 0).all(dim=1).sum()) == 8 and int((last == 0).all(dim=1).sum()) == 1


def test_a_prune_function_prunes_each_parameter_on_its_own():
    model = Classifier()
    _fit(
        model,
        ModelPruning(prune.random_unstructured, parameter_names=["weight"], use_global_unstructured=False, amount=4),
    )
    assert [int((m.weight == 0).sum()) for m in (model.net[0], model.net[3])] == [4, 4]


def test_lottery_ticket_resets_the_remaining_weights_to_their_initial_values():
    model = Classifier()
    initial = copy.deepcopy(model.net[0].weight.detach())
    pairs = [(model.net[0], "weight")]
    _fit(
        model,
        ModelPruning("l1_unstructured", parameters_to_prune=pairs, amount=0.5, make_pruning_permanent=False),
        epochs=1,
    )
    layer = model.net[0]
    assert torch.equal(layer.weight_orig.detach(), initial)  # reset after the epoch's pruning
    model(torch.zeros(1, 8))  # the forward pre-hook recomputes weight from weight_orig and the mask
    assert torch.equal(layer.weight, initial * layer.weight_mask)


def test_a_checkpoint_saved_while_pruning_holds_the_pruned_weights_and_loads_into_the_plain_model(tmp_path):
    model = Classifier()
    seen: list[bool] = []

    class StillPruning(Callback):  # the model trains on with its masks after each save
        def on_train_epoch_end(self, trainer, module):
            seen.append(hasattr(module.net[0], "weight_orig"))

    checkpoint = ModelCheckpoint(dirpath=tmp_path, save_top_k=-1, filename="{epoch}")
    pruning = ModelPruning("l1_unstructured", amount=0.3, use_lottery_ticket_hypothesis=False)
    _fit(model, pruning, checkpoint, StillPruning(), epochs=2)
    assert seen == [True, True]
    state = torch.load(os.path.join(tmp_path, "epoch=0.ckpt"), weights_only=True)["state_dict"]
    assert not any(k.endswith(("_orig", "_mask")) for k in state)
    plain = Classifier()
    plain.load_state_dict(state)  # strict: the plain model's keys
    zeros, total = _zeros(plain)
    assert zeros == round(0.3 * total)


def test_without_make_pruning_permanent_the_masks_stay():
    model = Classifier()
    _fit(model, ModelPruning("l1_unstructured", amount=0.2, make_pruning_permanent=False))
    assert hasattr(model.net[0], "weight_mask") and hasattr(model.net[0], "weight_orig")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(pruning_fn="l1_unstructured", parameter_names=["chocolate"]), r"chocolate isn't in \('weight', 'bias'\)"),
        (dict(pruning_fn={}), r"`pruning_fn` is expected to be a str in \["),
        (dict(pruning_fn="l2_unstructured"), "isn't available in PyTorch's built-in functions"),
        (dict(pruning_fn="random_structured"), "the `pruning_dim` should be provided"),
        (dict(pruning_fn="ln_structured", pruning_dim=0), "requesting `ln_structured` pruning, the `pruning_norm`"),
        (dict(pruning_fn="random_structured", pruning_dim=0), 'Only the "unstructured" PRUNING_TYPE is supported'),
        (dict(pruning_fn=prune.L1Unstructured, use_global_unstructured=False), "currently only supported with"),
        (dict(pruning_fn="l1_unstructured", verbose=3), r"must be any of \(0, 1, 2\)"),
        (dict(pruning_fn="l1_unstructured", amount="half"), "`amount` should be provided"),
    ],
)
def test_bad_settings_fail_at_construction(kwargs, match):
    with pytest.raises(MisconfigurationException, match=match):
        ModelPruning(**kwargs)


def test_parameters_not_in_the_model_fail_at_setup():
    stranger = nn.Linear(2, 2)
    with pytest.raises(MisconfigurationException, match="don't exist in the model"):
        _fit(Classifier(), ModelPruning("l1_unstructured", parameters_to_prune=[(stranger, "weight")]))
