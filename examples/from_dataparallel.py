"""From an ``nn.DataParallel`` script to ``Trainer(strategy="dp")``, line by line.

What it shows: the classic multi-GPU script (below, as a comment) rewritten with
``TrainModule`` and the Trainer, and where each of its lines went. The data is generated
here: small colour images of four shapes (horizontal bar, vertical bar, square outline,
ring) on noise, so the network has something real to learn with no download.

Run it (from the repository root):

    python examples/from_dataparallel.py                       # strategy="dp", every visible GPU
    CUDA_VISIBLE_DEVICES=2,3 python examples/from_dataparallel.py
    python examples/from_dataparallel.py --devices 0,1 --precision bf16-mixed
    python examples/from_dataparallel.py --strategy ddp --devices 2   # the faster option, same model

On a machine without two GPUs, ``strategy="dp"`` warns and runs on one device; the result
is the same model. With the defaults on a 2-core CPU it reaches about 99% validation
accuracy in 3 epochs (well under a minute).
"""

# ---- Before: the script people start from --------------------------------------------------
#
#   class Net(nn.Module):
#       def __init__(self):
#           super().__init__()
#           self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
#           self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
#           self.pool = nn.AdaptiveMaxPool2d(1)   # the usual blog version skips this and flattens
#           self.fc = nn.Linear(64, 10)           # 64*H*W features into Linear(64, 10): a shape
#       def forward(self, x):                     # error on any real image. Pool to 1x1 first.
#           x = F.max_pool2d(F.relu(self.conv1(x)), 2)
#           x = F.max_pool2d(F.relu(self.conv2(x)), 2)
#           return self.fc(torch.flatten(self.pool(x), 1))
#
#   net = Net()
#   net = nn.DataParallel(net, device_ids=[0, 1])                          # (1)
#   net.cuda()                                                             # (2)
#   criterion = nn.CrossEntropyLoss()
#   optimizer = optim.SGD(net.parameters(), lr=0.01, momentum=0.9)         # (3)
#   for epoch in range(10):                                                # (4)
#       for inputs, labels in trainloader:
#           inputs, labels = inputs.cuda(), labels.cuda()                  # (2)
#           optimizer.zero_grad()                                          # (4)
#           outputs = net(inputs)                                          # (5)
#           loss = criterion(outputs, labels)                              # (5)
#           loss.backward()                                                # (4)
#           optimizer.step()                                               # (4)
#       print(f"epoch {epoch} loss {loss.item():.3f}")                     # (6)
#   torch.save(net.module.state_dict(), "net.pth")                         # (7)
#
# ---- Where each line went --------------------------------------------------------------------
#
# (1) nn.DataParallel(net, device_ids=[0, 1])  ->  Trainer(strategy="dp", devices=[0, 1]).
#     devices=2 means the first two GPUs; devices="auto" means all of them. Indices are
#     relative to CUDA_VISIBLE_DEVICES, exactly as before, so `CUDA_VISIBLE_DEVICES=2,3`
#     still picks the GPUs. The model is never wrapped, so there is no more `.module`:
#     `net.conv1`, `net.state_dict()` and `net.load_state_dict(...)` work on the model itself.
# (2) net.cuda(), inputs.cuda()  ->  gone. The strategy moves the model and each batch.
# (3) the optimizer  ->  configure_optimizers(), built from the model's own parameters.
# (4) the loop, zero_grad/backward/step  ->  trainer.fit(); range(10) -> max_epochs=10.
# (5) outputs = net(inputs); loss = criterion(outputs, labels)  ->  training_step().
#     nn.DataParallel runs only forward() in the replicas and gathers every replica's
#     outputs onto GPU 0, where the loss is computed (so GPU 0 runs out of memory first).
#     strategy="dp" runs the whole training_step in each replica on its slice of the batch:
#     the loss is computed per replica, and only the scalar losses are combined, as a mean
#     weighted by slice size. For a mean loss like this one, loss and gradients equal those of
#     one device on the whole batch (BatchNorm statistics stay per replica, as with DataParallel).
#     The DataLoader's batch_size stays the global batch, split across the GPUs, as before.
# (6) print(loss)  ->  self.log("train_loss", loss): progress bar, TensorBoard (--log-dir),
#     and epoch means; self.log in validation_step gives val_loss/val_acc at each validation.
# (7) torch.save(net.module.state_dict(), "net.pth")  ->  the checkpoint contract: the
#     Trainer writes <log_dir>/default/version_<n>/checkpoints/last.ckpt, and
#         Net().load_state_dict(torch.load(path, weights_only=True)["state_dict"])
#     loads it into the bare model: no "module." prefixes, no pickled code. The same file
#     resumes training with trainer.fit(..., ckpt_path="last").
#
# ---- After --------------------------------------------------------------------------------------

import argparse

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from _cli import trainer_options, trainer_parser  # examples/_cli.py, next to this file
from trainer import Trainer, TrainModule, seed_everything

SHAPES = ("horizontal bar", "vertical bar", "square outline", "ring")


class Net(TrainModule):  # was nn.Module: the layers and forward() are unchanged
    def __init__(self, num_classes: int = len(SHAPES), lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.lr = lr
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.pool = nn.AdaptiveMaxPool2d(1)  # 64 features whatever the image size
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(torch.flatten(self.pool(x), 1))

    def training_step(self, batch, batch_idx):  # runs inside each replica, on its slice
        inputs, labels = batch
        loss = F.cross_entropy(self(inputs), labels)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        inputs, labels = batch
        logits = self(inputs)
        self.log("val_loss", F.cross_entropy(logits, labels))
        self.log("val_acc", (logits.argmax(1) == labels).float().mean(), prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


def shapes(n: int, size: int = 32, seed: int = 0) -> TensorDataset:
    """``n`` noisy ``3 x size x size`` images, each one shape of random position, size and colour."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, len(SHAPES), (n,), generator=g)
    cy, cx = torch.randint(size // 4, size - size // 4, (2, n, 1, 1), generator=g).float()
    r = torch.randint(size // 8, size // 4, (n, 1, 1), generator=g).float()
    grid_y, grid_x = torch.meshgrid(torch.arange(size).float(), torch.arange(size).float(), indexing="ij")
    dy, dx = (grid_y - cy).abs(), (grid_x - cx).abs()
    masks = torch.stack([
        (dy <= 1) & (dx <= r),                                       # horizontal bar
        (dx <= 1) & (dy <= r),                                       # vertical bar
        (torch.maximum(dy, dx) - r).abs() <= 1,                      # square outline
        ((dy**2 + dx**2).sqrt() - r).abs() <= 1,                     # ring
    ])
    mask = masks[labels, torch.arange(n)].unsqueeze(1).float()      # (n, 1, size, size)
    colour = 0.5 + 0.5 * torch.rand(n, 3, 1, 1, generator=g)
    images = mask * colour + 0.6 * torch.randn(n, 3, size, size, generator=g)
    return TensorDataset(images, labels)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = trainer_parser(
        __doc__,
        examples=[
            "python examples/from_dataparallel.py                                # strategy='dp', every visible GPU",
            "python examples/from_dataparallel.py --devices 0,1 --precision bf16-mixed",
        ],
        strategy="dp", strategy_help="dp (this example's point), ddp, single, auto",
        devices_default="auto", devices_help="'auto', a count, or indices like 0,1",
        max_epochs=3, batch_size=64, batch_size_help="the global batch, split across the GPUs",
    )
    p.add_argument("--n-train", type=int, default=2048, help="generated training images (validation: a quarter as many others)")
    p.add_argument("--lr", type=float, default=0.05, help="learning rate of SGD with momentum 0.9")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    seed_everything(args.seed)
    train = DataLoader(shapes(args.n_train, seed=args.seed), batch_size=args.batch_size, shuffle=True)
    val_set = shapes(max(args.n_train // 4, 64), seed=args.seed + 1)  # other images, same shapes
    val = DataLoader(val_set, batch_size=256)

    net = Net(lr=args.lr)
    # Curves TensorBoard can draw: train_loss every 4 steps (96 in the default run; the default
    # of every 50 would leave one point) and validation 4 times per epoch (12 points, not 3).
    trainer = Trainer(**trainer_options(args, log_every_n_steps=4, val_check_interval=0.25))
    trainer.fit(net, train, val)
    print(f"val_acc {trainer.callback_metrics['val_acc']:.3f} after {trainer.global_step} steps; logs in {trainer.run_dir}")

    # (7) The checkpoint loads into a bare Net: no wrapper, no "module." prefix, no pickled code.
    path = trainer.checkpoint_callback.last_model_path
    bare = Net()
    bare.load_state_dict(torch.load(path, weights_only=True)["state_dict"])
    bare.eval()
    with torch.no_grad():
        images, labels = val_set.tensors
        accuracy = (bare(images).argmax(1) == labels).float().mean().item()
    print(f"checkpoint {path} loaded into a bare Net(): val accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
