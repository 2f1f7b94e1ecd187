"""`python -m mpgemm demo`: the classic mixed-precision experiment.

A small CNN (channel counts multiples of 8, fp32 output) learns a built-in,
deterministically generated 10-class image dataset three ways, with the same
seed, data order and number of steps:

  fp32       plain fp32 training;
  torch.amp  autocast to fp16 with torch.amp.GradScaler, the peer;
  mpgemm     mpgemm.amp.prepare(): fp16 model with fp32 master weights,
             dynamic loss scaling, Conv2d and Linear layers on mpgemm's kernels.

For several batch sizes it prints ms/step, memory, final test accuracy, the
speedup over fp32 and how many steps each scaler skipped.
"""

import contextlib
import dataclasses
import math
import statistics
import time

import torch
import torch.nn.functional as F

from . import amp
from ._build import build_info
from .progress import Progress
from . import display

WAYS = ("fp32", "torch.amp", "mpgemm")
CLASSES = 10


@dataclasses.dataclass(frozen=True)
class DemoConfig:
    batch_sizes: tuple = (32, 64, 128)
    steps: int = 200
    image_size: int = 16
    train_size: int = 4096
    test_size: int = 1024
    noise: float = 0.4
    lr: float = 0.05
    seed: int = 0


QUICK = DemoConfig(batch_sizes=(64,), steps=150, train_size=2048, test_size=512)


def make_dataset(n, size, seed, noise):
    """n images (3 x size x size) of 10 classes: each class is a colored
    grating of its own orientation and frequency, drawn with a random phase,
    contrast and shift under Gaussian noise. Deterministic for a seed."""
    classes = torch.Generator().manual_seed(1234)
    angles = torch.rand(CLASSES, generator=classes) * math.pi
    freqs = 1.5 + 3.0 * torch.rand(CLASSES, generator=classes)
    colors = F.normalize(torch.rand(CLASSES, 3, generator=classes) + 0.2, dim=1)

    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, CLASSES, (n,), generator=g)
    coords = torch.linspace(0, 1, size)
    yy, xx = torch.meshgrid(coords, coords, indexing="ij")
    angle = angles[labels].view(n, 1, 1) + 0.15 * torch.randn(n, 1, 1, generator=g)
    phase = 2 * math.pi * torch.rand(n, 1, 1, generator=g)
    wave = torch.sin(2 * math.pi * freqs[labels].view(n, 1, 1) * (xx * torch.cos(angle) + yy * torch.sin(angle))
                     + phase)
    contrast = 0.5 + torch.rand(n, 1, 1, 1, generator=g)
    images = contrast * wave.unsqueeze(1) * colors[labels].view(n, 3, 1, 1)
    images = images + noise * torch.randn(n, 3, size, size, generator=g)
    return images, labels


def make_model(image_size):
    flat = 16 * (image_size // 4) ** 2
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(flat, 64), torch.nn.ReLU(), torch.nn.Linear(64, CLASSES),
    )


@dataclasses.dataclass
class RunResult:
    way: str
    batch_size: int
    ms_per_step: float
    memory_mb: float
    accuracy: float
    skipped_steps: int = 0


class _SavedBytes:
    """Bytes of the tensors saved for backward during one forward (activations,
    and the parameters autograd keeps with them)."""

    def __init__(self):
        self.total = 0

    def __enter__(self):
        def pack(t):
            self.total += t.numel() * t.element_size()
            return t

        self._hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)


def train_one_way(way, batch_size, config, device, data, progress=None):
    (train_x, train_y), (test_x, test_y) = data
    torch.manual_seed(config.seed)
    model = make_model(config.image_size).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=0.9)
    scaler = None
    if way == "torch.amp":
        scaler = torch.amp.GradScaler(device.type)
    elif way == "mpgemm":
        model, optimizer, scaler = amp.prepare(model, optimizer)
    # Annealed to zero so that the final accuracy is a converged one.
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=config.steps)
    autocast = torch.autocast(device.type, dtype=torch.float16, enabled=way == "torch.amp")
    order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(config.seed))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times, saved, skipped = [], _SavedBytes(), 0
    model.train()
    for step in range(config.steps):
        index = order[(step * batch_size + torch.arange(batch_size)) % len(train_x)]
        x, y = train_x[index].to(device), train_y[index].to(device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        with autocast, (saved if step == 0 else contextlib.nullcontext()):
            loss = F.cross_entropy(model(x).float(), y)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scale = scaler.get_scale()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            # Both scalers halve the scale on an overflow, and only then: a skipped step.
            skipped += scaler.get_scale() < scale
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
        if progress:
            progress.advance(note=f"{way} batch {batch_size}")
    memory = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else saved.total
    model.eval()
    correct = 0
    with torch.no_grad(), autocast:
        for x, y in zip(test_x.split(256), test_y.split(256)):
            correct += (model(x.to(device)).argmax(1).cpu() == y).sum().item()
    warm = times[min(5, len(times) - 1):]
    return RunResult(way, batch_size, 1000 * statistics.median(warm), memory / 2**20, 100 * correct / len(test_x),
                     skipped)


def run(config=DemoConfig(), device=None, show_progress=True):
    device = torch.device(device or ("cuda" if build_info()["cuda_available"] else "cpu"))
    data = (make_dataset(config.train_size, config.image_size, config.seed, config.noise),
            make_dataset(config.test_size, config.image_size, config.seed + 1, config.noise))
    progress = Progress(len(WAYS) * len(config.batch_sizes) * config.steps, "demo") if show_progress else None
    return device, [train_one_way(way, batch, config, device, data, progress)
                    for batch in config.batch_sizes for way in WAYS]


def format_table(device, results):
    by_batch = {}
    for r in results:
        by_batch.setdefault(r.batch_size, {})[r.way] = r
    memory = "peak MB" if device.type == "cuda" else "saved MB"
    header = (["batch"] + [f"{w} ms" for w in WAYS] + [f"{w} {memory}" for w in WAYS] + [f"{w} acc%" for w in WAYS]
              + [f"{w} speedup" for w in WAYS[1:]])
    rows = []
    for batch, ways in sorted(by_batch.items()):
        rows.append([str(batch)] + [f"{ways[w].ms_per_step:.2f}" for w in WAYS]
                    + [f"{ways[w].memory_mb:.2f}" for w in WAYS] + [f"{ways[w].accuracy:.1f}" for w in WAYS]
                    + [f"{ways['fp32'].ms_per_step / ways[w].ms_per_step:.2f}x" for w in WAYS[1:]])
    return display.format_table(header, rows, right_align=True)


def describe_device(device):
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}: mpgemm runs its WMMA Tensor Core kernels"
    return ("CPU: mpgemm runs its CPU reference backend (no Tensor Cores). These times are CPU times, not GPU "
            "measurements; 'saved MB' is what autograd saved for backward in one step.")


def plot(results, path):
    plt = display.pyplot("demo")
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, (field, title) in zip(axes, [("ms_per_step", "ms / step"), ("memory_mb", "memory (MB)"),
                                         ("accuracy", "test accuracy (%)")]):
        for way in WAYS:
            points = sorted((r.batch_size, getattr(r, field)) for r in results if r.way == way)
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=way)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch size")
        ax.set_title(title)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(args):
    config = QUICK if args.quick else DemoConfig()
    if args.batch_sizes is not None:
        config = dataclasses.replace(config, batch_sizes=tuple(args.batch_sizes))
    if args.steps is not None:
        config = dataclasses.replace(config, steps=args.steps)
    device, results = run(config, None if args.device == "auto" else args.device)
    print(describe_device(device))
    print(f"{config.steps} steps per run, seed {config.seed}, SGD lr {config.lr} momentum 0.9 cosine-annealed, "
          f"{config.train_size} training and {config.test_size} test images of 3x{config.image_size}x{config.image_size}")
    print(format_table(device, results))
    skipped = {f"{r.way} batch {r.batch_size}": r.skipped_steps for r in results if r.way != "fp32"}
    print(f"steps skipped on overflow: {skipped}")
    if args.plot:
        plot(results, args.plot)
        print(f"plot written to {args.plot}")
    return 0
