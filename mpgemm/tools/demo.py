"""`python -m mpgemm demo`: the classic mixed-precision experiment.

A small CNN (channel counts multiples of 8, fp32 output) learns a built-in,
deterministically generated 10-class image dataset in each of the ways of
`training` (fp32; torch.amp and mpgemm in fp16, and again in bf16), with the
same seed, data order and number of steps, through the training step that
`bench train` uses.

For several batch sizes it prints ms/step, memory, final test accuracy, the
speedup over fp32 (GPU times only) and, in words, which steps each loss
scaler skipped and why (the bf16 ways scale no loss, so skip none).
"""

import contextlib
import dataclasses
import math
import statistics

import torch
import torch.nn.functional as F

from .._build import build_info
from .progress import Progress
from . import display, training

WAYS = training.WAYS
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
    steps: int
    skipped_at: list = dataclasses.field(default_factory=list)  # 1-based numbers of the skipped steps
    first_scale: float = 1.0
    last_scale: float = 1.0

    @property
    def skipped_steps(self):
        return len(self.skipped_at)


def train_one_way(way, batch_size, config, device, data, progress=None):
    (train_x, train_y), (test_x, test_y) = data
    torch.manual_seed(config.seed)
    model = make_model(config.image_size).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=0.9)
    with training.setup(way, model, optimizer, device) as trainer:
        # Annealed to zero so that the final accuracy is a converged one.
        schedule = torch.optim.lr_scheduler.CosineAnnealingLR(trainer.optimizer, T_max=config.steps)
        order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(config.seed))
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        steps, saved = [], training.SavedBytes()
        trainer.model.train()
        for step in range(config.steps):
            index = order[(step * batch_size + torch.arange(batch_size)) % len(train_x)]
            x, y = train_x[index].to(device), train_y[index].to(device)
            with saved if step == 0 else contextlib.nullcontext():
                steps.append(trainer.step(x, y, F.cross_entropy))
            schedule.step()
            if progress:
                progress.advance(note=f"{way} batch {batch_size}")
        memory = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else saved.total
        trainer.model.eval()
        correct = 0
        with torch.no_grad(), trainer.autocast():
            for x, y in zip(test_x.split(256), test_y.split(256)):
                correct += (trainer.model(x.to(device)).argmax(1).cpu() == y).sum().item()
        last_scale = trainer.scaler.get_scale() if trainer.scaler is not None else 1.0
    warm = steps[min(5, len(steps) - 1):]
    return RunResult(way, batch_size, 1000 * statistics.median(s.seconds for s in warm), memory / 2**20,
                     100 * correct / len(test_x), len(steps), [i + 1 for i, s in enumerate(steps) if s.skipped],
                     steps[0].scale, last_scale)


def run(config=DemoConfig(), device=None, show_progress=True):
    device = torch.device(device or ("cuda" if build_info()["cuda_available"] else "cpu"))
    data = (make_dataset(config.train_size, config.image_size, config.seed, config.noise),
            make_dataset(config.test_size, config.image_size, config.seed + 1, config.noise))
    progress = Progress(len(WAYS) * len(config.batch_sizes) * config.steps, "demo") if show_progress else None
    return device, [train_one_way(way, batch, config, device, data, progress)
                    for batch in config.batch_sizes for way in WAYS]


def format_table(device, results):
    """One row per batch size and way. Speedups only for GPU times: CPU
    times say nothing about Tensor Cores."""
    on_gpu = device.type == "cuda"
    fp32_ms = {r.batch_size: r.ms_per_step for r in results if r.way == "fp32"}
    way_width = max(map(len, WAYS))  # the way column reads left-aligned, the numbers right-aligned
    header = ["batch", "way".ljust(way_width), "ms/step"] + (["speedup"] if on_gpu else []) + [
        "peak MB" if on_gpu else "saved MB", "test acc%", "skipped steps"]
    rows = []
    for r in sorted(results, key=lambda r: (r.batch_size, WAYS.index(r.way))):
        speedup = [f"{fp32_ms[r.batch_size] / r.ms_per_step:.2f}x" if r.batch_size in fp32_ms else ""]
        rows.append([str(r.batch_size), r.way.ljust(way_width), f"{r.ms_per_step:.2f}"] + (speedup if on_gpu else [])
                    + [f"{r.memory_mb:.2f}", f"{r.accuracy:.1f}", f"{r.skipped_steps} of {r.steps}"])
    return display.format_table(header, rows, right_align=True)


def describe_skips(result):
    """What a mixed-precision run's skipped steps mean, in a sentence."""
    head = f"{result.way}, batch {result.batch_size}: "
    if not training.WAYS_BY_NAME[result.way].loss_scaled:
        return head + f"no step skipped, as {training.BF16_NOTE}."
    if not result.skipped_at:
        return head + f"no step skipped: no gradient overflowed fp16 at loss scale {result.first_scale:g}."
    n = len(result.skipped_at)
    which = f"step{'s' if n > 1 else ''} {', '.join(map(str, result.skipped_at))}"
    if result.skipped_at == list(range(1, n + 1)):
        cause = (f"the initial loss scale, {result.first_scale:g}, was too high: the scaled gradients overflowed "
                 f"fp16")
    else:
        cause = "the scaled gradients overflowed fp16"
    each = "that update was" if n == 1 else "each of those updates was"
    return (head + f"skipped {n} of {result.steps} steps ({which}); {cause}, so {each} not applied and the scale "
            f"was halved (it ended at {result.last_scale:g}).")


def describe_device(device):
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}: mpgemm runs its WMMA Tensor Core kernels"
    return ("CPU: mpgemm runs its CPU reference backend (no Tensor Cores). These times are CPU times, not GPU "
            "measurements, so no speedup is shown; 'saved MB' is what autograd saved for backward in one step.")


def plot(results, path):
    plt = display.pyplot("demo")
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, (field, title) in zip(axes, [("ms_per_step", "ms / step"), ("memory_mb", "memory (MB)"),
                                         ("accuracy", "test accuracy (%)")]):
        for way in WAYS:
            points = sorted((r.batch_size, getattr(r, field)) for r in results if r.way == way)
            # bf16 dashed: where a bf16 way's line lies on its fp16 twin's (memory), both show.
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=way,
                    linestyle="--" if training.WAYS_BY_NAME[way].dtype == torch.bfloat16 else "-")
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
    print(display.wrap(describe_device(device)))
    print(display.wrap(f"{config.steps} steps per run, seed {config.seed}, SGD lr {config.lr} momentum 0.9 "
                        f"cosine-annealed, {config.train_size} training and {config.test_size} test images of "
                        f"3x{config.image_size}x{config.image_size}. {training.FP32_NOTE}."))
    print(format_table(device, results))
    print("Steps skipped on overflow:")
    for r in results:
        if r.way != "fp32":
            print(display.wrap(describe_skips(r), indent="  "))
    if args.plot:
        plot(results, args.plot)
        print(f"plot written to {args.plot}")
    return 0
