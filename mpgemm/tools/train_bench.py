"""`python -m mpgemm bench train`: the classic mixed-precision training experiment.

ResNet-50 (224x224 images, channels_last) and a GPT-2-small-shaped
transformer block (sequence 1024; with --models, a Llama block of the same
width too) are trained on synthetic data with SGD
(momentum 0.9) in each of the five ways of `training` (fp32 with TF32 off;
torch.amp and mpgemm in fp16 and in bf16), and in "mpgemm fused" where --ways
names it (mpgemm.fuse's chains: ResNet-50's conv -> batch norm, the block's
MLP as one mpgemm.mlp, the Llama block's as one mpgemm.gated_mlp), through
the training step
the demo uses. For each batch size: images/s or tokens/s (median step time after
warm-up steps, which go on while the loss scaler skips its first steps; the
GPU synchronized around each step), the spread of the step times, the
speedup over fp32 (timed at each model's smallest batch only), mpgemm's
ratio to torch.amp, the peak memory and mpgemm's workspaces (the largest one
call took); then, per model and way, the largest batch that fits in the
GPU's memory; with --profile, where the device time of torch.amp's and
mpgemm's steps goes (step_profile.py).

The whole run is bounded by --time-limit: the timed runs share most of it and
the largest-batch searches the rest; a run times at least min_timed_steps
(20) whatever its share, then more while its share lasts, and a run the time
limit did not reach is reported as not run. Without a GPU only --quick runs: a tiny
configuration that shows the benchmark works, not GPU measurements.
"""

import argparse
import dataclasses
import gc
import statistics
import time

import torch
import torch.nn.functional as F

from .._build import build_info
from ..memory import reset_workspace_stats, workspace_stats
from . import display, gpu_state, models, provenance, step_profile, training
from .progress import Progress
from .train_report import format_report

WAYS = training.WAYS
GPU_TIME_LIMIT_S = 200.0
CPU_QUICK_TIME_LIMIT_S = GPU_QUICK_TIME_LIMIT_S = 60.0
SEARCH_SHARE = 0.3  # of the time limit, kept for the largest-batch searches
WARMUP_SHARE = 0.3  # of a run's share, at most, spent on warm-up steps
# A search stops once the largest batch that fits is known to within this
# fraction of it: the last tries are the largest and slowest.
SEARCH_RESOLUTION = 1 / 16
PROFILED_WAYS = ("torch.amp", "mpgemm", "mpgemm fused")  # what --profile records, per model at its largest batch
PROFILED_STEPS = 3
LR = 0.01  # small enough that random labels do not drive the loss to inf


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    unit: str  # what the throughput counts: "images" or "tokens"
    batch_unit: str  # what a batch counts: "images" or "sequences"
    gpu_batch_sizes: tuple
    build: object  # config -> fp32 model, built on the current default device
    make_batch: object  # (batch size, config, device, generator) -> (input, target)
    loss_fn: object
    items_per_sample: object  # config -> images or tokens in one sample


def _images(batch, config, device, generator):
    x = torch.randn(batch, 3, config.image_size, config.image_size, device=device, generator=generator)
    labels = torch.randint(0, 1000, (batch,), device=device, generator=generator)
    return x.to(memory_format=torch.channels_last), labels


def _embeddings(batch, config, device, generator):
    shape = (batch, config.seq_len, config.d_model)
    return (torch.randn(shape, device=device, generator=generator),
            torch.randn(shape, device=device, generator=generator))


WORKLOADS = {
    "resnet50": Workload("resnet50", "images", "images", (32, 64, 128, 256),
                         lambda config: models.resnet50().to(memory_format=torch.channels_last),
                         _images, F.cross_entropy, lambda config: 1),
    "gpt2-block": Workload("gpt2-block", "tokens", "sequences", (8, 16, 32, 64),
                           lambda config: models.TransformerBlock(config.d_model),
                           _embeddings, F.mse_loss, lambda config: config.seq_len),
    # Opt-in (--models): not among the default runs' models.
    "llama-block": Workload("llama-block", "tokens", "sequences", (8, 16, 32, 64),
                            lambda config: models.LlamaBlock(config.d_model),
                            _embeddings, F.mse_loss, lambda config: config.seq_len),
}
DEFAULT_MODELS = ("resnet50", "gpt2-block")


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    models: tuple = DEFAULT_MODELS
    batch_sizes: tuple = None  # None: each workload's gpu_batch_sizes
    image_size: int = 224
    seq_len: int = 1024
    d_model: int = 768
    ways: tuple = WAYS
    max_warmup_steps: int = 5
    # Warm-up goes on past max_warmup_steps while its last step was skipped
    # (the loss scaler's first overflows), at most this many steps more, so
    # that the timed steps are the steady state's.
    max_skip_warmup_steps: int = 30
    # Timed steps: at least min_timed_steps (or max_timed_steps, if fewer)
    # whatever the run's share of the time, the time limit alone stopping
    # them; then more, up to max_timed_steps, while the share lasts.
    min_timed_steps: int = 20
    max_timed_steps: int = 30
    time_limit_s: float = GPU_TIME_LIMIT_S
    search: bool = True
    profile: bool = False
    # fp32 is timed at each model's smallest batch only: it is the slowest
    # way by far, and the speedups over it hardly change with the batch.
    fp32_every_batch: bool = False
    seed: int = 0

    def batches(self, workload):
        return self.batch_sizes or workload.gpu_batch_sizes

    def runs_way(self, workload, batch, way):
        if way not in self.ways:
            return False
        return way != "fp32" or self.fp32_every_batch or batch == min(self.batches(workload))


CAPTURED_SEARCH_REASON = "a captured way's batch is its eager way's: the search times eager steps"
NO_SEARCH_REASON = ("--quick on the CPU, where host memory bounds the batch, not a GPU's; the search needs a "
                    "GPU")
# Tiny: torch's fp16 and bf16 matmuls and convolutions are slow on most CPUs,
# and the torch.amp ways run them (a GPT-2 block step at sequence 64 takes
# seconds); at 32 the five ways cost what three did at 64.
# A smoke test of the pipeline: the transformer blocks at width 96, where
# torch.amp's fp16 products on a CPU take a second a step at GPT-2's 768.
CPU_QUICK = BenchConfig(batch_sizes=(2,), image_size=32, seq_len=32, d_model=96, max_warmup_steps=1,
                        max_skip_warmup_steps=0, min_timed_steps=2, max_timed_steps=2,
                        time_limit_s=CPU_QUICK_TIME_LIMIT_S, search=False)
GPU_QUICK = BenchConfig(batch_sizes=(32,), time_limit_s=GPU_QUICK_TIME_LIMIT_S)


@dataclasses.dataclass
class Run:
    model: str
    batch_size: int
    way: str
    items_per_step: int
    status: str = "not run"  # "ok", "out of memory", "error" or "not run"
    reason: str = ""
    warmup_step_times_s: list = dataclasses.field(default_factory=list)
    step_times_s: list = dataclasses.field(default_factory=list)
    skipped_steps: int = 0  # of the timed steps
    peak_memory_mb: float = None  # GPU: torch.cuda.max_memory_allocated over the timed steps
    saved_memory_mb: float = None  # what autograd saved for backward in the first step
    # mpgemm's workspaces over the timed steps (mpgemm.memory): the largest one
    # call took, and all of them per step; zero for torch's ways and on the CPU.
    workspace_largest_mb: float = None
    workspace_mb_per_step: float = None
    final_loss: float = None

    @property
    def median_step_s(self):
        return statistics.median(self.step_times_s) if self.step_times_s else None

    @property
    def spread(self):
        """(slowest - fastest) timed step over the median."""
        return (max(self.step_times_s) - min(self.step_times_s)) / self.median_step_s if self.step_times_s else None

    @property
    def items_per_s(self):
        return self.items_per_step / self.median_step_s if self.step_times_s else None


@dataclasses.dataclass
class Search:
    model: str
    way: str
    status: str = "not run"  # "found", "at least", "not run", "skipped" or "error"
    reason: str = ""
    largest_fitting: int = None
    smallest_oom: int = None
    tries: list = dataclasses.field(default_factory=list)  # {batch_size, fits, seconds, peak_memory_mb}


class Budget:
    """The time limit, shared out: a task gets the time left to its phase
    divided by the tasks left in it, so time a fast task leaves goes on to
    the next ones."""

    def __init__(self, seconds, clock=time.perf_counter):
        self.clock = clock
        self.start = clock()
        self.end = self.start + seconds

    def left(self, until=None):
        return min(self.end if until is None else until, self.end) - self.clock()

    def share(self, phase_end, tasks_left):
        return max(0.0, self.left(phase_end)) / tasks_left


def is_out_of_memory(error):
    # cuBLAS and cuDNN report a failed workspace allocation as their own error.
    return isinstance(error, torch.cuda.OutOfMemoryError) or (
        isinstance(error, RuntimeError) and ("out of memory" in str(error) or "ALLOC_FAILED" in str(error)))


def describe_error(error):
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:200] if lines else ''}"


def free_memory(device):
    """Called once the failed step's frames are gone, so that its tensors are free."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _trainer(workload, way, config, device):
    torch.manual_seed(config.seed)
    with torch.device(device):
        model = workload.build(config)
    # Fused on a GPU, for every way: it steps and skips on the device, so that
    # neither scaler waits on the device in a step (mpgemm.amp.LossScaler).
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, fused=torch.device(device).type == "cuda")
    return training.setup(way, model, optimizer, device)


def _batch(workload, batch, config, device):
    return workload.make_batch(batch, config, device, torch.Generator(device).manual_seed(config.seed))


def _train(run, workload, config, device, budget, share_end):
    """Warm-up steps, then timed steps, each bounded by count and by time:
    a step starts only if the last one's time still fits."""
    x, target = _batch(workload, run.batch_size, config, device)
    with _trainer(workload, run.way, config, device) as trainer:
        saved = training.SavedBytes()
        with saved:
            first = trainer.step(x, target, workload.loss_fn)
        run.saved_memory_mb = saved.total / 2**20
        run.warmup_step_times_s.append(first.seconds)
        # A captured way's peak is its capture's, which its warm-up holds: the
        # graph's pool keeps a step's activations for good, and replays
        # allocate nothing.
        captured = training.WAYS_BY_NAME[run.way].captured
        if captured and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        last = _warm_up(trainer, x, target, workload, config, budget, budget.clock() + WARMUP_SHARE *
                        budget.left(share_end), run.warmup_step_times_s, first.skipped)
        if trainer.warming_up:
            run.status = "error"
            run.reason = ("the time limit came before its capture"
                          if trainer.eager_steps >= training.CAPTURE_AFTER_STEPS else
                          f"never captured its step: {trainer.eager_steps} of its {len(run.warmup_step_times_s)} "
                          f"warm-up steps updated the model, {training.CAPTURE_AFTER_STEPS} needed")
            return
        if device.type == "cuda" and not captured:
            torch.cuda.reset_peak_memory_stats(device)
        reset_workspace_stats()
        # The first min_timed_steps may overrun the run's share, not the time limit.
        least = min(config.min_timed_steps, config.max_timed_steps)
        while len(run.step_times_s) < config.max_timed_steps and \
                budget.left(share_end if len(run.step_times_s) >= least else None) > last:
            step = trainer.step(x, target, workload.loss_fn)
            last = step.seconds
            run.step_times_s.append(step.seconds)
            run.skipped_steps += step.skipped
            run.final_loss = step.loss
        if device.type == "cuda":
            run.peak_memory_mb = torch.cuda.max_memory_allocated(device) / 2**20
        if not captured:  # replays ask mpgemm for no workspace: theirs were taken at the capture
            workspaces = workspace_stats()
            run.workspace_largest_mb = workspaces["largest_bytes"] / 2**20
            run.workspace_mb_per_step = workspaces["bytes"] / 2**20 / max(1, len(run.step_times_s))
    if run.step_times_s:
        run.status = "ok"
    else:
        run.reason = "the time limit came during its warm-up"


def _warm_up(trainer, x, target, workload, config, budget, warmup_end, times, skipped):
    """Warm-up steps after the first (whose time `times` holds, and
    `skipped` whether the scaler skipped it): up to config.max_warmup_steps
    while the warm-up's time lasts, then on while the last step was skipped,
    config.max_skip_warmup_steps more at most; likewise on while a captured
    way has yet to capture its step. The last step's time."""
    last = times[-1]
    while budget.left(warmup_end) > last and (
            len(times) < config.max_warmup_steps or
            ((skipped or trainer.warming_up) and len(times) < config.max_warmup_steps + config.max_skip_warmup_steps)):
        step = trainer.step(x, target, workload.loss_fn)
        last, skipped = step.seconds, step.skipped
        times.append(last)
    return last


def _predicted_step_s(runs, model, way, batch):
    """A step's time at `batch` from the largest batch measured for the same
    model and way, taken as proportional to the batch; None when none was."""
    done = [r for r in runs if r.model == model and r.way == way and r.step_times_s]
    if not done:
        return None
    largest = max(done, key=lambda r: r.batch_size)
    return largest.median_step_s * batch / largest.batch_size


def measure_runs(config, device, budget, done):
    """The timed runs, in plan order; done(runs, note) after each."""
    plan = [(WORKLOADS[name], batch, way) for name in config.models for batch in config.batches(WORKLOADS[name])
            for way in training.ALL_WAYS if config.runs_way(WORKLOADS[name], batch, way)]
    phase_end = budget.start + (budget.end - budget.start) * (1 - SEARCH_SHARE if config.search else 1)
    runs = []
    for index, (workload, batch, way) in enumerate(plan):
        run = Run(workload.name, batch, way, batch * workload.items_per_sample(config))
        runs.append(run)
        share = budget.share(phase_end, len(plan) - index)
        predicted = _predicted_step_s(runs, workload.name, way, batch)
        if budget.left() <= 0:
            run.reason = "the time limit came before it"
        elif predicted is not None and 2 * predicted > budget.left():
            run.reason = f"two steps ({2 * predicted:.1f} s predicted) would pass the time limit"
        else:
            try:
                _train(run, workload, config, device, budget, budget.clock() + share)
            except Exception as error:  # one failed run must not lose the others' measurements
                run.warmup_step_times_s, run.step_times_s = [], []
                run.status = "out of memory" if is_out_of_memory(error) else "error"
                run.reason = describe_error(error)
            free_memory(device)
        done(runs, f"{workload.name} batch {batch} {way}")
    return runs


def _try_batch(workload, way, batch, config, device):
    """One forward+backward+step at `batch` on a fresh model: a try entry."""
    start = time.perf_counter()
    entry = {"batch_size": batch, "fits": False, "seconds": None, "peak_memory_mb": None, "error": None}
    try:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        x, target = _batch(workload, batch, config, device)
        with _trainer(workload, way, config, device) as trainer:
            trainer.step(x, target, workload.loss_fn)
        entry["fits"] = True
        if device.type == "cuda":
            entry["peak_memory_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    except Exception as error:
        if not is_out_of_memory(error):
            entry["error"] = describe_error(error)
    free_memory(device)
    entry["seconds"] = time.perf_counter() - start
    return entry


def _known_to_resolution(lo, hi):
    return hi is not None and hi - lo <= max(1, int(lo * SEARCH_RESOLUTION))


def search_largest_batch(search, workload, runs, config, device, budget, share_end):
    """Doubles from the largest batch the timed runs fitted until a try runs
    out of memory, then bisects, while the share lasts."""
    mine = [r for r in runs if r.model == search.model and r.way == search.way]
    lo = max((r.batch_size for r in mine if r.status == "ok"), default=0)
    hi = min((r.batch_size for r in mine if r.status == "out of memory"), default=None)
    seconds_per_sample = None
    if lo:
        seconds_per_sample = _predicted_step_s(runs, search.model, search.way, lo) / lo
    while not _known_to_resolution(lo, hi):
        batch = (2 * lo if lo else min(config.batches(workload))) if hi is None else (lo + hi) // 2
        predicted = seconds_per_sample * batch if seconds_per_sample else 0.0
        if budget.left(share_end) <= predicted:
            search.reason = (f"the next try, batch {batch}, would pass the time share"
                             + (f" ({predicted:.1f} s predicted)" if predicted else ""))
            break
        entry = _try_batch(workload, search.way, batch, config, device)
        search.tries.append(entry)
        if entry["error"]:
            search.status, search.reason = "error", f"batch {batch} failed: {entry['error']}"
            search.largest_fitting, search.smallest_oom = lo or None, hi
            return
        if entry["fits"]:
            lo, seconds_per_sample = batch, entry["seconds"] / batch
        else:
            hi = batch
    search.largest_fitting, search.smallest_oom = lo or None, hi
    if _known_to_resolution(lo, hi):
        search.status = "found"
    elif lo:
        search.status = "at least"
    else:
        search.status = "not run"


def run_searches(config, device, budget, runs, done):
    """A largest-batch search per model and way; done(searches, note) after each."""
    searches = [Search(name, way) for name in config.models for way in config.ways]
    for search in searches:
        if not config.search:
            search.status, search.reason = "skipped", NO_SEARCH_REASON
        elif training.WAYS_BY_NAME[search.way].captured:
            search.status, search.reason = "skipped", CAPTURED_SEARCH_REASON
    done(searches, "")
    searched = [search for search in searches if search.status == "not run"]
    for index, search in enumerate(searched):
        share_end = budget.clock() + budget.share(None, len(searched) - index)
        search_largest_batch(search, WORKLOADS[search.model], runs, config, device, budget, share_end)
        done(searches, f"largest batch {search.model} {search.way}")
    return searches


def _run_entries(runs, on_gpu):
    """The runs as the report holds them: their fields, units, medians,
    spreads and, for GPU times only, the speedup over fp32 (at the same
    batch, else at the batch fp32 ran: "fp32_batch") and, for mpgemm's ways
    and the captured ones, the ratio to torch.amp's eager throughput in the
    same type at the same batch."""
    fp32 = {}
    for r in runs:
        if r.way == "fp32" and r.items_per_s:
            fp32.setdefault(r.model, {})[r.batch_size] = r.items_per_s
    amp_of = {way.dtype: way.name for way in training.WAYS_BY_NAME.values()
              if way.recipe == "torch.amp" and not way.captured}
    rates = {(r.model, r.batch_size, r.way): r.items_per_s for r in runs if r.items_per_s}
    entries = []
    for run in runs:
        workload, measured = WORKLOADS[run.model], fp32.get(run.model, {})
        fp32_batch = run.batch_size if run.batch_size in measured else min(measured, default=None)
        way = training.WAYS_BY_NAME[run.way]
        # mpgemm's ways, and the captured ones, against torch.amp's eager step.
        amp = (rates.get((run.model, run.batch_size, amp_of.get(way.dtype)))
               if way.recipe == "mpgemm" or way.captured else None)
        entries.append(dataclasses.asdict(run) | {
            "unit": workload.unit, "batch_unit": workload.batch_unit, "median_step_s": run.median_step_s,
            "spread": run.spread, "items_per_s": run.items_per_s,
            "speedup_vs_fp32": run.items_per_s / measured[fp32_batch] if on_gpu and run.items_per_s and fp32_batch
            else None,
            "fp32_batch": fp32_batch if on_gpu else None,
            "vs_torch_amp": run.items_per_s / amp if on_gpu and run.items_per_s and amp else None})
    return entries


def profile_runs(config, device, budget, done):
    """--profile: PROFILED_STEPS steps of each of PROFILED_WAYS (those the
    config runs) per model at its largest batch, under torch.profiler, after
    the warm-up a timed run takes; done(profiles, note) after each."""
    profiles = []
    for name in config.models:
        workload = WORKLOADS[name]
        batch = max(config.batches(workload))
        for way in (w for w in PROFILED_WAYS if w in config.ways):
            entry = {"model": name, "batch_size": batch, "way": way, "steps": PROFILED_STEPS, "summary": None,
                     "reason": ""}
            profiles.append(entry)
            if budget.left() <= 0:
                entry["reason"] = "the time limit came before it"
            else:
                try:
                    x, target = _batch(workload, batch, config, device)
                    with _trainer(workload, way, config, device) as trainer:
                        first = trainer.step(x, target, workload.loss_fn)
                        _warm_up(trainer, x, target, workload, config, budget, budget.end, [first.seconds],
                                 first.skipped)
                        entry["summary"] = step_profile.profile_steps(
                            lambda: trainer.step(x, target, workload.loss_fn), PROFILED_STEPS)
                except Exception as error:  # a profile that fails must not lose the timed runs
                    entry["reason"] = describe_error(error)
                free_memory(device)
            done(profiles, f"profile {name} {way}")
    return profiles


def run(config, device, show_progress=True, checkpoint=None):
    """The report: provenance, settings, GPU state, runs and searches.
    checkpoint(report) is called after every run and search, so that a run
    killed from outside still leaves what it measured ("complete": false)."""
    device = torch.device(device)
    budget = Budget(config.time_limit_s)
    report = {"provenance": provenance.describe(device), "build_info": build_info(), "complete": False,
              "config": dataclasses.asdict(config) | {
                  "batch_sizes": {name: list(config.batches(WORKLOADS[name])) for name in config.models},
                  "lr": LR, "search_share": SEARCH_SHARE, "warmup_share": WARMUP_SHARE},
              "settings": {"fp32": training.FP32_NOTE, "bf16": training.BF16_NOTE,
                           "cudnn_benchmark": torch.backends.cudnn.benchmark,
                           "data": "synthetic, generated on the device from fixed seeds"},
              "device_memory_mb": (torch.cuda.get_device_properties(device).total_memory / 2**20
                                   if device.type == "cuda" else None),
              "gpu_state": {"before": gpu_state.read(device), "after": None},
              "runs": [], "largest_batch": [], "profiles": [], "elapsed_s": 0.0}
    planned_runs = sum(config.runs_way(WORKLOADS[m], batch, way) for m in config.models
                       for batch in config.batches(WORKLOADS[m]) for way in training.ALL_WAYS)
    searched_ways = [way for way in config.ways if not training.WAYS_BY_NAME[way].captured]
    planned_searches = len(config.models) * len(searched_ways) if config.search else 0
    planned_profiles = len(config.models) * len(set(PROFILED_WAYS) & set(config.ways)) if config.profile else 0
    progress = Progress(planned_runs + planned_searches + planned_profiles, "bench train") if show_progress else None

    def record(key, entries, note):
        report[key] = entries
        report["elapsed_s"] = budget.clock() - budget.start
        if progress and note:
            progress.advance(note=note)
        if checkpoint:
            checkpoint(report)

    runs = measure_runs(config, device, budget,
                        lambda runs, note: record("runs", _run_entries(runs, device.type == "cuda"), note))
    report["gpu_state"]["after"] = gpu_state.read(device)
    if config.profile:
        profile_runs(config, device, budget, lambda profiles, note: record("profiles", profiles, note))
    run_searches(config, device, budget, runs, lambda searches, note: record(
        "largest_batch", [dataclasses.asdict(s) | {"batch_unit": WORKLOADS[s.model].batch_unit} for s in searches],
        note))
    report["complete"] = True
    return report


def positive_seconds(text):
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text}")
    return value


def _parse_names(text, known, what, quote=str):
    """The names of a comma-separated list, each one of `known`."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(map(quote, unknown)) or repr(text)}; "
                                         f"choose from {', '.join(known)}")
    return names


def parse_models(text):
    return _parse_names(text, tuple(WORKLOADS), "model")


def parse_ways(text):
    return _parse_names(text, training.ALL_WAYS, "way", quote=repr)  # way names hold spaces


def make_config(on_gpu, args):
    config = (GPU_QUICK if on_gpu else CPU_QUICK) if args.quick else BenchConfig()
    changes = {name: value for name, value in (("models", args.models), ("time_limit_s", args.time_limit),
                                               ("ways", args.ways)) if value is not None}
    if args.batch_sizes:
        changes["batch_sizes"] = tuple(args.batch_sizes)
    if args.profile:
        changes["profile"] = True
    if args.no_search:
        changes["search"] = False
    return dataclasses.replace(config, **changes)


def main(args):
    device = torch.device("cuda" if build_info()["cuda_available"] else "cpu")
    if device.type != "cuda" and not args.quick:
        print(display.wrap("mpgemm bench train: the full benchmark (ResNet-50 at 224x224 and a GPT-2 block at "
                            "sequence 1024, batches up to 256) needs a GPU and a CUDA build of mpgemm. Without "
                            "one, `bench train --quick` runs a tiny configuration on the CPU."))
        return 2
    save = display.json_saver(args.json)
    report = run(make_config(device.type == "cuda", args), device, checkpoint=save)
    save(report)
    print(format_report(report))
    if args.json:
        print(f"report written to {args.json}")
    failed = any(r["status"] == "error" for r in report["runs"] + report["largest_batch"])
    return 1 if failed else 0
