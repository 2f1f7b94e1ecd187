"""Where a training step's GPU time goes: `bench train --profile`.

A few steps of a Trainer are recorded with torch.profiler (CPU and CUDA
activities) and read back from the trace it exports. Each device event (a
kernel, a copy or a fill) is placed in the step, and the phase of the step
(forward, backward, optimizer: the ranges `training.Trainer.step` marks),
during which the host launched it: the launch's CPU time comes from the
runtime or driver call that shares the event's correlation id, so kernels
queued long before they run, and those the autograd engine launches from its
own thread, land where they were asked for. Then:

- categories: each device event in one kind, in this order: launched in the
  optimizer phase (unscaling, the update, the master copies) -> "optimizer";
  copies and fills; a kernel whose name says mpgemm -> "mpgemm"; attention
  (flash or fused SDPA) -> "attention"; normalization (cuDNN's batch norms
  too); pooling -> "elementwise" (torch names its channels_last kernels
  *_nhwc, as cuDNN's are); cuDNN's and cuBLAS's convolution and GEMM kernels
  (and their helpers) -> "cudnn/cublas";
  elementwise and reductions; anything else -> "other". "idle" is the step's time (between the GPU
  synchronizations that bracket it) that no device event covers.
- the products by phase: the time of the convolution and GEMM kernels
  (mpgemm's, cuDNN's and cuBLAS's, and their helpers: folds, split-K
  reductions, padded copies) launched in the forward and in the backward,
  so that a step's forward products (a ResNet's fprop) and backward ones
  (dgrad and wgrad) compare between ways without a conv benchmark's
  stand-ins.
- the kernels that take the most time per step, by name (KEPT_KERNELS of
  them kept, TOP_KERNELS printed).

Times are per step, averaged over the profiled steps. The profiler's own
overhead lengthens the host's side; the device times are the kernels' own.
"""

import json
import os
import re
import tempfile

import torch

STEP = "train_step"
PHASES = ("forward", "backward", "optimizer")
CATEGORIES = ("mpgemm", "cudnn/cublas", "attention", "normalization", "elementwise", "optimizer",
              "copies and fills", "other", "idle")
# The kernels a summary keeps, by time (enough to find a small one, such
# as the statistics' totals, that a prediction names), and those printed.
KEPT_KERNELS = 40
TOP_KERNELS = 15
DEVICE_EVENTS = {"kernel", "gpu_memcpy", "gpu_memset"}
LAUNCH_EVENTS = {"cuda_runtime", "cuda_driver"}
# Kernel names, matched in CATEGORIES' order after the optimizer phase and
# the copies (case-insensitive). cuBLAS on Hopper names its kernels nvjet_*
# or sm90_xmma_gemm_*, cuDNN its convolutions sm90_xmma_{fprop,dgrad,wgrad}_*.
NAME_RULES = (
    ("mpgemm", re.compile(r"mpgemm")),
    ("attention", re.compile(r"flash|fmha|attention|sdpa")),
    # Before cuDNN's: its batch norms are cudnn::batchnorm_*; LayerNorm's
    # backward is torch's GammaBetaBackward.
    ("normalization", re.compile(r"norm|welford|gammabeta")),
    # Before cuDNN's too: torch names its channels_last pooling kernels *_nhwc.
    ("elementwise", re.compile(r"pool")),
    ("cudnn/cublas", re.compile(r"xmma|cudnn|cublas|cutlass|nvjet|gemm|gemv|conv|implicit|fprop|dgrad|wgrad|"
                                r"nchw|nhwc")),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled|reduce|copy|fill|cat|index|softmax|scatter|"
                               r"gather|where|relu|gelu|add|mul|loss|pool|sum|cast")),
)


# A product's kernel: every one of the kind "cudnn/cublas" (the rules
# before it take batch norm, attention and pooling), and of mpgemm's those
# whose function's own name (not its namespace, mpgemm, which says gemm)
# says so: the GEMMs, convolutions, folds, split-K reductions and padded
# copies, not batch norm's, the statistics' or the gating's kernels.
MPGEMM_PRODUCT_NAME = re.compile(r"gemm|conv|fold|fprop|dgrad|wgrad|splitk|row_sums_reduce|depthwise|padded_copy")
PRODUCT_PHASES = ("forward", "backward")


def phase_name(phase):
    """The range Trainer.step marks for a phase of its step."""
    return f"{STEP}/{phase}"


def category(name, phase, kind="kernel"):
    """The kind a device event counts in (CATEGORIES)."""
    if phase == "optimizer":
        return "optimizer"
    if kind != "kernel":
        return "copies and fills"
    lowered = name.lower()
    return next((label for label, pattern in NAME_RULES if pattern.search(lowered)), "other")


def is_product(name, label):
    """Whether a kernel of kind `label` computes (or feeds) a convolution or
    GEMM; name: the kernel's full name."""
    if label == "cudnn/cublas":
        return True
    function = short_name(name, width=len(name)).split("<")[0].rsplit("::", 1)[-1].lower()
    return label == "mpgemm" and MPGEMM_PRODUCT_NAME.search(function) is not None


def short_name(name, width=80):
    """A kernel's name without its parameter list, cut to `width`."""
    name = name.removeprefix("void ").replace("(anonymous namespace)::", "")
    depth = 0
    for i, ch in enumerate(name):
        depth += (ch == "<") - (ch == ">")
        if ch == "(" and depth == 0:
            name = name[:i]
            break
    return name if len(name) <= width else name[:width - 3] + "..."


def _covered(intervals):
    """The total length of a union of (start, end) intervals."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def _containing(intervals, t):
    return next((i for i, (s, e) in enumerate(intervals) if s <= t <= e), None)


def summarize_trace(events):
    """The profile of the trace's STEP ranges, from its event list (the
    chrome trace's "traceEvents"): per step, each category's milliseconds
    and the kernels that take the most. None when the trace holds no step."""
    def ranges(name):
        return sorted((e["ts"], e["ts"] + e["dur"]) for e in events
                      if e.get("cat") == "user_annotation" and e.get("name") == name)

    steps = ranges(STEP)
    if not steps:
        return None
    phases = {phase: ranges(phase_name(phase)) for phase in PHASES}
    launches = {e["args"]["correlation"]: e["ts"] for e in events
                if e.get("cat") in LAUNCH_EVENTS and "correlation" in e.get("args", {})}
    per_category = dict.fromkeys(CATEGORIES, 0.0)
    per_phase = dict.fromkeys(PHASES, 0.0)
    products = dict.fromkeys(PRODUCT_PHASES, 0.0)
    kernels = {}
    busy = [[] for _ in steps]
    for e in events:
        if e.get("cat") not in DEVICE_EVENTS:
            continue
        launched = launches.get(e.get("args", {}).get("correlation"), e["ts"])
        step = _containing(steps, launched)
        if step is None:
            continue
        phase = next((p for p in PHASES if _containing(phases[p], launched) is not None), None)
        kind = "kernel" if e["cat"] == "kernel" else "copy"
        label = category(e["name"], phase, kind)
        per_category[label] += e["dur"]
        if phase:
            per_phase[phase] += e["dur"]
        if phase in products and kind == "kernel" and is_product(e["name"], label):
            products[phase] += e["dur"]
        entry = kernels.setdefault(e["name"], {"name": e["name"], "category": label, "us": 0.0, "calls": 0})
        entry["us"] += e["dur"]
        entry["calls"] += 1
        start, end = steps[step]
        busy[step].append((max(e["ts"], start), min(e["ts"] + e["dur"], end)))
    n = len(steps)
    step_us = sum(e - s for s, e in steps) / n
    per_category["idle"] = sum((e - s) - _covered(b) for (s, e), b in zip(steps, busy))
    per_category = {k: v / n / 1000 for k, v in per_category.items()}
    top = sorted(kernels.values(), key=lambda k: -k["us"])[:KEPT_KERNELS]
    return {
        "steps": n, "step_ms": step_us / 1000, "device_events": sum(k["calls"] for k in kernels.values()),
        "categories_ms": per_category,
        "phases_ms": {k: v / n / 1000 for k, v in per_phase.items()},
        "products_ms": {k: v / n / 1000 for k, v in products.items()},
        "top_kernels": [{"name": k["name"], "category": k["category"], "ms_per_step": k["us"] / n / 1000,
                         "calls_per_step": k["calls"] / n, "share": k["us"] / n / step_us} for k in top],
    }


def profile_steps(step, steps):
    """Runs step() `steps` times under torch.profiler; the summary of its trace."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(steps):
            step()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    return summarize_trace(trace.get("traceEvents", []))


def format_profile(entry):
    """The lines of one profile: the step's time by category, then the top kernels."""
    head = f"{entry['model']} batch {entry['batch_size']}, {entry['way']}"
    summary = entry.get("summary")
    if not summary:
        return [f"{head}: {entry.get('reason') or 'no step recorded'}"]
    step = summary["step_ms"]
    lines = [f"{head}: {step:.1f} ms per step (mean of {summary['steps']} profiled steps)"]
    parts = [f"{name} {ms:.1f} ({100 * ms / step:.0f}%)" for name, ms in summary["categories_ms"].items() if ms > 0]
    if not summary.get("device_events"):
        return lines + ["  no device events recorded (no GPU: the step ran on the CPU)"]
    lines.append("  by kind: " + ", ".join(parts))
    lines.append("  device time by phase: " + ", ".join(f"{name} {ms:.1f} ms"
                                                        for name, ms in summary["phases_ms"].items()))
    if "products_ms" in summary:  # from 2026-11-30 on
        lines.append("  convolution and GEMM kernels by phase: " + ", ".join(
            f"{name} {ms:.1f} ms" for name, ms in summary["products_ms"].items()))
    lines.append(f"  {'ms/step':>8} {'calls':>6} {'share':>6}  {'kind':<13} kernel")
    for k in summary["top_kernels"][:TOP_KERNELS]:
        lines.append(f"  {k['ms_per_step']:8.2f} {k['calls_per_step']:6.0f} {100 * k['share']:5.1f}%  "
                     f"{k['category']:<13} {short_name(k['name'], 60)}")
    return lines
