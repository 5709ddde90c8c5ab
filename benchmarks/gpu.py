"""The GPU check's table: the Trainer against a hand-written loop on one CUDA device.

    python -m pytest -m cuda -p no:cacheprovider && python benchmarks/gpu.py   # the whole GPU check
    python benchmarks/gpu.py --quick                                           # a smoke run, rough numbers
    python benchmarks/gpu.py --device cpu --quick                              # the script's logic, on a CPU

Three parts, each printed as rows of one table:

- **speed**: the char_lm transformer of examples/char_lm.py, in a larger configuration, in
  ``bf16-mixed`` on the standard library's source. A hand-written loop (``.to(device)``,
  autocast, backward, clipping, AdamW, ``loss.item()`` every 50 steps) and the Trainer with
  all its defaults (progress bar, TensorBoard, checkpointing) train the same model from the
  same weights on the same batches, in this process, reps alternating (raw, Trainer,
  Trainer, raw, ...) after one warm-up rep each. A rep's clock starts at the end of step
  ``WARM`` and stops at the end of its last step, each read after
  ``torch.cuda.synchronize()``. Tokens per second is the median over reps; the ratio is
  raw time over Trainer time per token (above 1: the Trainer is faster). Peak memory is
  ``torch.cuda.max_memory_allocated`` over a rep.
- **dp memory**: one training step of a model with a large output (a 32k-token vocabulary)
  with two replicas on one GPU (``device_ids=[0, 0]``). ``torch.nn.DataParallel`` gathers
  every replica's logits onto the output device and computes the loss there;
  ``strategy="dp"`` computes the loss inside each replica, and only the scalar losses
  travel. Peak ``max_memory_allocated`` of the step, for both and for one device, plus
  the loss each gives.
- **ddp**: whether two processes may share one GPU, on each backend (an all-reduce of a
  CUDA tensor in two processes bound to ``cuda:0``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
# Measure this checkout, and import the example's model from examples/char_lm.py.
sys.path[:0] = [p for p in (_ROOT, os.path.join(_ROOT, "examples")) if p not in sys.path[:2]]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from _workloads import NullTerminal  # noqa: E402
from callbacks import Callback  # noqa: E402
from char_lm import CharChunks, CharLM, stdlib_corpus  # noqa: E402
from strategies import DataParallelStrategy  # noqa: E402
from trainer import Trainer, TrainModule  # noqa: E402

WARM = 10  # steps before the clock starts: allocator growth, kernel selection
LOG_EVERY = 50  # the Trainer's default log_every_n_steps; the raw loop reads the loss as often
CLIP = 1.0
LR = 3e-4


class GPTConfig:
    def __init__(self, quick: bool, device: str, reps: int | None = None) -> None:
        small = device == "cpu"
        self.block_size = 64 if small else 256
        self.d_model = 64 if small else 512
        self.n_layers = 2 if small else 8
        self.n_heads = 4 if small else 8
        self.batch_size = 8 if small else 32
        self.steps = 30 if (quick or small) else 300  # per rep, WARM of them untimed
        self.reps = reps or (2 if (quick or small) else 5)

    def model(self) -> CharLM:
        torch.manual_seed(0)
        return Bench(block_size=self.block_size, d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads)

    @property
    def label(self) -> str:
        return f"char_lm GPT ({self.n_layers} layers, {self.d_model} wide, {self.block_size} context, batch {self.batch_size})"


class Bench(CharLM):
    """CharLM with a constant learning rate, so the raw loop needs no copy of its schedule."""

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=LR, weight_decay=0.01)


def make_loader(cfg: GPTConfig, ids: torch.Tensor) -> DataLoader:
    g = torch.Generator().manual_seed(1)  # the same order every rep, on both sides
    return DataLoader(CharChunks(ids, cfg.block_size), batch_size=cfg.batch_size, shuffle=True, drop_last=True, generator=g)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")


# --- the two sides -------------------------------------------------------------------------
def raw_loop(cfg: GPTConfig, ids: torch.Tensor, device: torch.device, initial: dict) -> tuple[float, float, nn.Module]:
    """The loop people write: seconds for the timed steps, peak GiB, the trained model."""
    model = cfg.model()
    model.load_state_dict(initial)
    model.to(device)
    reset_peak(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    model.train()
    started = None
    for step, (x, y) in enumerate(make_loader(cfg, ids)):
        if step == cfg.steps:
            break
        x, y = x.to(device), y.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad()
        if (step + 1) % LOG_EVERY == 0:
            loss.item()
        if step + 1 == WARM:
            sync(device)
            started = time.perf_counter()
    sync(device)
    return time.perf_counter() - started, peak_gib(device), model


class Clock(Callback):
    """Appended after the built-in callbacks: a step's time includes their work."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.started, self.stopped = device, None, None

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == WARM:
            sync(self.device)
            self.started = time.perf_counter()
        if trainer.global_step == trainer.max_steps:
            sync(self.device)
            self.stopped = time.perf_counter()


def trainer_run(cfg: GPTConfig, ids: torch.Tensor, device: torch.device, initial: dict, log_dir: str) -> tuple[float, float, nn.Module]:
    model = cfg.model()
    model.load_state_dict(initial)
    reset_peak(device)
    clock = Clock(device)
    trainer = Trainer(
        strategy="single", devices=[0] if device.type == "cuda" else 1, precision="bf16-mixed",
        max_steps=cfg.steps, gradient_clip_val=CLIP, log_dir=log_dir,
    )
    trainer.callbacks.append(clock)
    with contextlib.redirect_stderr(NullTerminal()):
        trainer.fit(model, make_loader(cfg, ids))
    return clock.stopped - clock.started, peak_gib(device), model


def report_speed(cfg: GPTConfig, device: torch.device) -> None:
    ids, _, _ = stdlib_corpus(4.0)
    initial = {k: v.clone() for k, v in cfg.model().state_dict().items()}
    tokens = (cfg.steps - WARM) * cfg.batch_size * cfg.block_size
    times: dict[str, list[float]] = {"raw": [], "trainer": []}
    peaks: dict[str, float] = {}
    weights: dict[str, list[dict]] = {"raw": [], "trainer": []}  # on the CPU: a rep's peak is its own
    order = ["raw", "trainer"] + ["raw", "trainer", "trainer", "raw"] * ((cfg.reps + 1) // 2)
    with tempfile.TemporaryDirectory() as log_dir:
        for i, side in enumerate(order):
            run = raw_loop if side == "raw" else lambda *a: trainer_run(*a, log_dir)
            seconds, peaks[side], model = run(cfg, ids, device, initial)
            state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
            weights[side] = weights[side][:1] + [state]  # the first and the latest
            del model  # with its trainer and optimizer state, before the next rep allocates
            gc.collect()  # the model and its trainer refer to each other
            if i >= 2:  # the first of each side warms up
                times[side].append(seconds)
    raw, ours = (statistics.median(times[s]) for s in ("raw", "trainer"))

    def max_diff(a: dict, b: dict) -> float:
        return max((x.float() - y.float()).abs().max().item() for x, y in zip(a.values(), b.values()))

    print(f"\nspeed: {cfg.label}, bf16-mixed, {cfg.steps - WARM} timed steps x {len(times['raw'])} reps per side")
    print(f"  {'side':<22}{'tokens/s':>12}{'ratio':>8}{'peak GiB':>10}")
    print(f"  {'hand-written loop':<22}{tokens / raw:>12,.0f}{1.0:>8.3f}{peaks['raw']:>10.2f}")
    print(f"  {'Trainer':<22}{tokens / ours:>12,.0f}{raw / ours:>8.3f}{peaks['trainer']:>10.2f}")
    spread = ", ".join(f"{tokens / t:,.0f}" for t in times["trainer"])
    print(f"  Trainer reps: {spread} tokens/s")
    print(
        f"  final weights, max |diff|: Trainer vs raw loop {max_diff(weights['raw'][-1], weights['trainer'][-1]):.2e}; "
        f"raw loop vs itself, two reps {max_diff(weights['raw'][0], weights['raw'][-1]):.2e} (the GPU's run-to-run noise)"
    )


# --- dp memory -----------------------------------------------------------------------------
class WideHead(TrainModule):
    """Embedding, one hidden layer, and a 32k-token output: the logits dwarf the weights."""

    def __init__(self, vocab: int = 32_000, width: int = 1024) -> None:
        super().__init__()
        self.embed, self.hidden, self.head = nn.Embedding(vocab, width), nn.Linear(width, width), nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.hidden(self.embed(ids))))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self(x).flatten(0, 1), y.flatten())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def report_dp_memory(device: torch.device) -> None:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randint(0, 32_000, (16, 512), generator=g), torch.randint(0, 32_000, (16, 512), generator=g)
    logits_gib = x.numel() * 32_000 * 4 / 2**30
    rows = []

    def measure(label: str, step) -> None:
        torch.manual_seed(0)
        model = WideHead().to(device)
        reset_peak(device)
        before = torch.cuda.memory_allocated(device) / 2**30
        try:
            loss = step(model)
            rows.append((label, peak_gib(device), peak_gib(device) - before, f"{loss:.6f}"))
        except Exception as err:  # noqa: BLE001 - a row that says what failed
            rows.append((label, float("nan"), float("nan"), f"failed: {type(err).__name__}: {str(err)[:80]}"))
        del model

    def one_device(model: nn.Module) -> float:
        loss = model.training_step((x.to(device), y.to(device)), 0)
        loss.backward()
        return loss.item()

    def torch_dp(model: nn.Module) -> float:
        wrapped = nn.DataParallel(model, device_ids=[0, 0])
        logits = wrapped(x.to(device))  # both halves gathered onto cuda:0
        loss = F.cross_entropy(logits.flatten(0, 1), y.to(device).flatten())
        loss.backward()
        return loss.item()

    def ours(model: nn.Module) -> float:
        from trainer.core.metrics import MetricSink, set_sink
        from strategies.precision import Precision

        strategy = DataParallelStrategy(device_ids=[0, 0])
        strategy.configure_devices("auto")
        strategy.precision = Precision("32", strategy.root_device)
        strategy.setup_environment()
        strategy.setup_module(model)
        previous = set_sink(MetricSink())
        try:
            loss = strategy.run_step("training_step", (x, y), 0)  # the Trainer's call for one batch
        finally:
            set_sink(previous)
        loss.backward()
        return loss.item()

    measure("one device", one_device)
    measure("nn.DataParallel, loss outside", torch_dp)
    measure('strategy="dp", loss in replicas', ours)
    print(f"\ndp memory: one step, batch 16 x 512 tokens, 32k vocabulary (fp32 logits {logits_gib:.2f} GiB), replicas on cuda:0, cuda:0")
    print(f"  {'run':<34}{'peak GiB':>10}{'step GiB':>10}  loss")
    for label, peak, step, loss in rows:
        print(f"  {label:<34}{peak:>10.2f}{step:>10.2f}  {loss}")


# --- ddp: two processes on one GPU ---------------------------------------------------------
_PROBE = """
import os, sys, torch, torch.distributed as dist
rank = int(sys.argv[2])
torch.cuda.set_device(0)
dist.init_process_group(sys.argv[1], init_method="file://" + sys.argv[3], rank=rank, world_size=2)
t = torch.full((4,), float(rank + 1), device="cuda:0")
dist.all_reduce(t)
torch.cuda.synchronize()
print("sum", t[0].item(), flush=True)
dist.destroy_process_group()
"""


def report_ddp_sharing() -> None:
    print("\nddp: two processes bound to cuda:0, one all-reduce of a CUDA tensor")
    for backend in ("nccl", "gloo"):
        with tempfile.TemporaryDirectory() as folder:
            store = os.path.join(folder, "store")
            procs = [
                subprocess.Popen([sys.executable, "-c", _PROBE, backend, str(r), store], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                for r in (0, 1)
            ]
            outputs = []
            for p in procs:
                try:
                    outputs.append(p.communicate(timeout=90)[0])
                except subprocess.TimeoutExpired:
                    p.kill()
                    outputs.append("timed out after 90 s")
        if all("sum 3.0" in o for o in outputs):
            verdict = "works (sum 3.0 on both ranks)"
        else:
            lines = [line.strip() for o in outputs for line in o.splitlines()]
            telling = [x for x in lines if "Duplicate GPU" in x] or [x for x in lines if "Error" in x or "timed out" in x]
            verdict = "refused: " + (telling[0][:160] if telling else lines[-1][:160])
        print(f"  {backend:<6}{verdict}")


def machine(device: torch.device) -> str:
    if device.type != "cuda":
        return f"CPU ({platform.machine()}), torch {torch.__version__}"
    props = torch.cuda.get_device_properties(device)
    return (
        f"{props.name} ({props.total_memory / 2**30:.0f} GiB), torch {torch.__version__}, "
        f"CUDA {torch.version.cuda}, Python {platform.python_version()}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few steps and reps: a smoke run, rough numbers")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: a tiny model, to check the script")
    parser.add_argument("--reps", type=int, help="timed reps per side in the speed part (default 5, or 2 with --quick)")
    parser.add_argument("--only", default="speed,dp,ddp", help="comma-separated parts: speed, dp, ddp")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device is visible; use --device cpu to check the script on a CPU")
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    parts = {p.strip() for p in args.only.split(",")}
    logging.getLogger("trainer").setLevel(logging.WARNING)
    print(f"GPU check, {datetime.date.today().isoformat()}: {machine(device)}")
    if "speed" in parts:
        report_speed(GPTConfig(args.quick, args.device, args.reps), device)
    if device.type == "cuda" and "dp" in parts:
        report_dp_memory(device)
    if device.type == "cuda" and "ddp" in parts:
        report_ddp_sharing()
    return 0


if __name__ == "__main__":
    sys.exit(main())
