"""How much a checkpoint save costs, next to a training step.

    python benchmarks/checkpoint_save_cost.py [--device cpu|cuda] [--steps 60] [--saves 20]

For each model it trains ``--steps`` optimizer steps (Adam, batch 64) and times each step,
then times ``trainer.save_checkpoint`` (capture the full state, write a temp file, fsync,
os.replace, fsync the folder) ``--saves`` times. Medians are printed, and the ratio says
how many training steps one save costs when the loop waits for it.

``ModelCheckpoint`` does not wait: the loop only takes the state and copies its tensors to
the CPU ("copy"), and a thread writes the copy. So "copy/step" is what a save costs the
loop, plus the writer's share of the interpreter (benchmarks/overhead.py measures the sum
as training time lost per save). "char-lm" has the shape of examples/char_lm.py's model.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from callbacks import Callback  # noqa: E402
from strategies import SingleDeviceStrategy  # noqa: E402
from trainer import Trainer, TrainModule  # noqa: E402

# The saves go to the checkout's disk (their fsync is part of the cost; /tmp is often memory),
# into a temp folder inside this one, which git ignores: a run cut short leaves nothing to commit.
SCRATCH = os.path.join(os.path.dirname(os.path.abspath(__file__)), ".scratch")


class Model(TrainModule):
    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-3)


class TinyGPT(nn.Module):
    """The shape of examples/char_lm.py's model: 2 pre-norm blocks, 128 wide, 4 heads, 64
    characters of context, 98 symbols (about 0.43 M parameters)."""

    def __init__(self, vocab: int = 98, block: int = 64, width: int = 128, layers: int = 2) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(block, width)
        layer = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, vocab))
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(block), persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        return self.head(self.blocks(x, mask=self.mask, is_causal=True)).transpose(1, 2)  # (batch, vocab, time)


def mlp(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Flatten(), nn.Linear(3 * 32 * 32, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)
    )


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 256), nn.ReLU(), nn.Dropout(0.1), nn.Linear(256, 10),
    )


class Timer(Callback):
    def __init__(self, folder: str, saves: int) -> None:
        self.folder, self.saves = folder, saves
        self.steps: list[float] = []
        self.save_times: list[float] = []
        self.copy_times: list[float] = []
        self._t = 0.0

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()
        self._t = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()
        self.steps.append(time.perf_counter() - self._t)

    def on_train_end(self, trainer, module):
        for i in range(self.saves):
            t = time.perf_counter()
            trainer.save_checkpoint(os.path.join(self.folder, f"save-{i % 2}.ckpt"))
            self.save_times.append(time.perf_counter() - t)
            t = time.perf_counter()
            trainer.checkpoint_state(copy=True)  # what ModelCheckpoint's loop side does
            self.copy_times.append(time.perf_counter() - t)


def images(n: int) -> TensorDataset:
    return TensorDataset(torch.randn(n, 3, 32, 32), torch.randint(0, 10, (n,)))


def text(n: int) -> TensorDataset:
    ids = torch.randint(0, 98, (n, 65))
    return TensorDataset(ids[:, :-1], ids[:, 1:])


def measure(name: str, net: nn.Module, data_fn, device: str, steps: int, saves: int) -> None:
    data = data_fn(64 * steps)
    model = Model(net)
    params = sum(p.numel() for p in model.parameters())
    os.makedirs(SCRATCH, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=SCRATCH) as folder:
        timer = Timer(folder, saves)
        trainer = Trainer(
            strategy=SingleDeviceStrategy(device), max_steps=steps, enable_progress_bar=False, log_dir=None,
            enable_checkpointing=False, callbacks=[timer], log_every_n_steps=10**9,
        )
        trainer.fit(model, DataLoader(data, batch_size=64, shuffle=True))
        size = os.path.getsize(os.path.join(folder, "save-0.ckpt"))
    step = statistics.median(timer.steps[5:])  # skip warm-up steps
    save, copy = statistics.median(timer.save_times), statistics.median(timer.copy_times)
    print(
        f"{name:<10} {params / 1e6:7.2f} M params  file {size / 2**20:7.1f} MiB  step {step * 1e3:7.2f} ms  "
        f"save {save * 1e3:7.2f} ms  save/step {save / step:5.2f}  copy {copy * 1e3:6.2f} ms  copy/step {copy / step:5.2f}"
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--saves", type=int, default=20)
    args = p.parse_args()
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {args.device}, {torch.get_num_threads()} threads, batch 64, Adam")
    measure("char-lm", TinyGPT(), text, args.device, args.steps, args.saves)
    measure("cnn", cnn(), images, args.device, args.steps, args.saves)
    measure("mlp-2048", mlp(2048), images, args.device, args.steps, args.saves)


if __name__ == "__main__":
    main()
