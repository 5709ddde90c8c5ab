"""Lightning code as its README, bug-report template and demos write it, with only the imports
renamed (the table in docs/migrating-from-lightning.md). Module level, so that DDP workers can
unpickle the models. Trainer arguments this branch does not have yet keep today's names
(``log_dir=`` for Lightning's ``default_root_dir=``)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler, TensorDataset, random_split

import trainer as L  # was: import lightning as L


# --- Lightning's README: the autoencoder ---------------------------------------------------
class LitAutoEncoder(L.TrainModule):  # was: L.LightningModule
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(8 * 8, 16), nn.ReLU(), nn.Linear(16, 3))
        self.decoder = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 8 * 8))

    def forward(self, x):
        # in lightning, forward defines the prediction/inference actions
        embedding = self.encoder(x)
        return embedding

    def training_step(self, batch, batch_idx):
        # training_step defines the train loop. It is independent of forward
        x, _ = batch
        x = x.view(x.size(0), -1)
        z = self.encoder(x)
        x_hat = self.decoder(z)
        loss = F.mse_loss(x_hat, x)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=1e-3)
        return optimizer


def tiny_mnist(n: int = 64) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.rand(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g))


# --- the bug-report template: BoringModel ---------------------------------------------------
class RandomDataset(Dataset):
    def __init__(self, size, length):
        self.len = length
        self.data = torch.randn(length, size)

    def __getitem__(self, index):
        return self.data[index]

    def __len__(self):
        return self.len


class BoringModel(L.TrainModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(32, 2)
        self.called: list[str] = []

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        loss = self(batch).sum()
        self.log("train_loss", loss)
        return {"loss": loss}

    def validation_step(self, batch, batch_idx):
        loss = self(batch).sum()
        self.log("valid_loss", loss)

    def test_step(self, batch, batch_idx):
        loss = self(batch).sum()
        self.log("test_loss", loss)

    def configure_optimizers(self):
        return torch.optim.SGD(self.layer.parameters(), lr=0.1)

    # the hooks a bug report adds to show what ran, and when
    def on_fit_start(self):
        self.called.append("on_fit_start")

    def on_train_start(self):
        self.called.append("on_train_start")

    def on_train_epoch_start(self):
        self.called.append("on_train_epoch_start")

    def on_train_batch_start(self, batch, batch_idx):
        self.called.append("on_train_batch_start")

    def on_before_backward(self, loss):
        self.called.append("on_before_backward")

    def on_after_backward(self):
        self.called.append("on_after_backward")

    def on_before_optimizer_step(self, optimizer):
        self.called.append("on_before_optimizer_step")

    def on_before_zero_grad(self, optimizer):
        self.called.append("on_before_zero_grad")

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.called.append("on_train_batch_end")

    def on_validation_epoch_start(self):
        self.called.append("on_validation_epoch_start")

    def on_validation_epoch_end(self):
        self.called.append("on_validation_epoch_end")

    def on_train_epoch_end(self):
        self.called.append("on_train_epoch_end")

    def on_train_end(self):
        self.called.append("on_train_end")

    def on_fit_end(self):
        self.called.append("on_fit_end")


# --- lightning.pytorch.demos: the Transformer and the LSTM (small) ----------------------------
class PositionalEncoding(nn.Module):
    def __init__(self, dim: int, dropout: float = 0.1, max_len: int = 64) -> None:
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, dim, 2) * (-math.log(10000.0) / dim))
        pe = torch.zeros(max_len, dim)
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0))

    def forward(self, x):
        return self.dropout(x + self.pe[:, : x.size(1)])


class Transformer(nn.Module):
    def __init__(self, vocab_size: int = 20, ninp: int = 16, nhead: int = 2, nhid: int = 32, nlayers: int = 1, dropout: float = 0.1):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, ninp)
        self.transformer = nn.Transformer(
            d_model=ninp, nhead=nhead, num_encoder_layers=nlayers, num_decoder_layers=nlayers,
            dim_feedforward=nhid, dropout=dropout, batch_first=True,
        )
        self.pos_encoder = PositionalEncoding(ninp, dropout)
        self.decoder = nn.Linear(ninp, vocab_size)
        self.ninp = ninp
        self.vocab_size = vocab_size

    def forward(self, inputs, target):
        _, t = inputs.shape
        mask = self.transformer.generate_square_subsequent_mask(t).to(inputs.device)
        src = self.pos_encoder(self.embedding(inputs) * math.sqrt(self.ninp))
        target = self.pos_encoder(self.embedding(target) * math.sqrt(self.ninp))
        output = self.transformer(src, target, tgt_mask=mask)
        output = self.decoder(output)
        output = F.log_softmax(output, dim=-1)
        return output.view(-1, self.vocab_size)


class LightningTransformer(L.TrainModule):
    def __init__(self, vocab_size: int = 20):
        super().__init__()
        self.save_hyperparameters()
        self.model = Transformer(vocab_size=vocab_size)

    def forward(self, inputs, target):
        return self.model(inputs, target)

    def training_step(self, batch, batch_idx):
        inputs, target = batch
        output = self(inputs, target)
        loss = torch.nn.functional.nll_loss(output, target.view(-1))
        self.log("train_loss", loss, prog_bar=True, on_step=True, on_epoch=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.model.parameters(), lr=0.1)


def tokens(n: int = 32, length: int = 8, vocab: int = 20) -> TensorDataset:
    """(input, target) pairs: the target is the input shifted by one, as WikiText2 gives them."""
    g = torch.Generator().manual_seed(0)
    stream = torch.randint(0, vocab, (n, length + 1), generator=g)
    return TensorDataset(stream[:, :-1], stream[:, 1:])


class SimpleLSTM(nn.Module):
    def __init__(self, vocab_size: int = 20, ninp: int = 8, nhid: int = 8, nlayers: int = 1, dropout: float = 0.2):
        super().__init__()
        self.vocab_size = vocab_size
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab_size, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, batch_first=True)
        self.decoder = nn.Linear(nhid, vocab_size)
        self.nlayers, self.nhid = nlayers, nhid

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        decoded = self.decoder(self.drop(output)).view(-1, self.vocab_size)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, batch_size: int):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, batch_size, self.nhid), weight.new_zeros(self.nlayers, batch_size, self.nhid))


class SequenceSampler(Sampler):
    def __init__(self, dataset, batch_size: int) -> None:
        super().__init__()
        self.dataset, self.batch_size = dataset, batch_size
        self.chunk_size = len(self.dataset) // self.batch_size

    def __iter__(self):
        n = len(self.dataset)
        for i in range(self.chunk_size):
            yield list(range(i, n - (n % self.batch_size), self.chunk_size))

    def __len__(self) -> int:
        return self.chunk_size


class LightningLSTM(L.TrainModule):
    def __init__(self, vocab_size: int = 20):
        super().__init__()
        self.model = SimpleLSTM(vocab_size=vocab_size)
        self.hidden = None
        self.hidden_resets = 0

    def on_train_epoch_end(self) -> None:
        self.hidden = None
        self.hidden_resets += 1

    def training_step(self, batch, batch_idx):
        input, target = batch
        if self.hidden is None:
            self.hidden = self.model.init_hidden(input.size(0))
        self.hidden = (self.hidden[0].detach(), self.hidden[1].detach())
        output, self.hidden = self.model(input, self.hidden)
        loss = F.nll_loss(output, target.reshape(-1))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def train_dataloader(self):
        dataset = tokens(40)
        return DataLoader(dataset, batch_sampler=SequenceSampler(dataset, batch_size=4))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=20.0)


# --- a GAN with manual optimization (Lightning's docs) ------------------------------------------
class GAN(L.TrainModule):
    def __init__(self, latent_dim: int = 4, lr: float = 0.01):
        super().__init__()
        self.save_hyperparameters()
        self.automatic_optimization = False
        self.generator = nn.Sequential(nn.Linear(latent_dim, 8), nn.ReLU(), nn.Linear(8, 64))
        self.discriminator = nn.Sequential(nn.Linear(64, 8), nn.ReLU(), nn.Linear(8, 1))

    def forward(self, z):
        return self.generator(z)

    def training_step(self, batch):
        imgs, _ = batch
        imgs = imgs.view(imgs.size(0), -1)
        g_opt, d_opt = self.optimizers()
        z = torch.randn(imgs.size(0), self.hparams.latent_dim).type_as(imgs)

        # train the generator
        self.toggle_optimizer(g_opt)
        valid = torch.ones(imgs.size(0), 1).type_as(imgs)
        g_loss = F.binary_cross_entropy_with_logits(self.discriminator(self(z)), valid)
        self.manual_backward(g_loss)
        g_opt.step()
        g_opt.zero_grad()
        self.untoggle_optimizer(g_opt)

        # train the discriminator
        self.toggle_optimizer(d_opt)
        real_loss = F.binary_cross_entropy_with_logits(self.discriminator(imgs), valid)
        fake = torch.zeros(imgs.size(0), 1).type_as(imgs)
        fake_loss = F.binary_cross_entropy_with_logits(self.discriminator(self(z).detach()), fake)
        d_loss = (real_loss + fake_loss) / 2
        self.manual_backward(d_loss)
        d_opt.step()
        d_opt.zero_grad()
        self.untoggle_optimizer(d_opt)
        self.log_dict({"g_loss": g_loss, "d_loss": d_loss}, prog_bar=True)

    def configure_optimizers(self):
        lr = self.hparams.lr
        opt_g = torch.optim.Adam(self.generator.parameters(), lr=lr, betas=(0.5, 0.999))
        opt_d = torch.optim.Adam(self.discriminator.parameters(), lr=lr, betas=(0.5, 0.999))
        return [opt_g, opt_d], []


# --- a DataModule (Lightning's docs' MNISTDataModule, on random images) ---------------------------
class MNISTDataModule(L.DataModule):  # was: L.LightningDataModule
    def __init__(self, data_dir: str = "./data", batch_size: int = 16):
        super().__init__()
        self.save_hyperparameters()
        self.stages: list[str] = []

    def prepare_data(self):
        import os

        os.makedirs(self.hparams.data_dir, exist_ok=True)
        torch.save(tiny_mnist(96).tensors, os.path.join(self.hparams.data_dir, "mnist.pt"))

    def setup(self, stage: str):
        import os

        self.stages.append(stage)
        full = TensorDataset(*torch.load(os.path.join(self.hparams.data_dir, "mnist.pt"), weights_only=True))
        if stage == "fit":
            self.mnist_train, self.mnist_val = random_split(full, [64, 32], generator=torch.Generator().manual_seed(42))
        if stage == "test":
            self.mnist_test = full
        if stage == "predict":
            self.mnist_predict = full

    def train_dataloader(self):
        return DataLoader(self.mnist_train, batch_size=self.hparams.batch_size)

    def val_dataloader(self):
        return DataLoader(self.mnist_val, batch_size=self.hparams.batch_size)

    def test_dataloader(self):
        return DataLoader(self.mnist_test, batch_size=self.hparams.batch_size)

    def predict_dataloader(self):
        return DataLoader(self.mnist_predict, batch_size=self.hparams.batch_size)


class LitClassifier(L.TrainModule):
    def __init__(self, hidden_dim: int = 16, learning_rate: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.l1 = nn.Linear(8 * 8, self.hparams.hidden_dim)
        self.l2 = nn.Linear(self.hparams.hidden_dim, 10)

    def forward(self, x):
        x = x.view(x.size(0), -1)
        return self.l2(torch.relu(self.l1(x)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_epoch=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        y_hat = self(x)
        self.log("val_loss", F.cross_entropy(y_hat, y), prog_bar=True)
        self.log("val_acc", (y_hat.argmax(1) == y).float().mean())

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", F.cross_entropy(self(x), y))

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        x, _ = batch
        return self(x).argmax(1)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.learning_rate)
