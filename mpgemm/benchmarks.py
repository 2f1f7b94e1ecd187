"""`python -m mpgemm bench [gemm|linear|conv|ceiling|all]`: mpgemm against cuBLAS.

GEMM: mpgemm.gemm against cuBLAS doing the same computation (fp16 in, fp32
accumulate, fp32 out): cublasGemmEx with CUBLAS_COMPUTE_32F through the
extension, and torch.mm(..., out_dtype=torch.float32) where torch has it;
fp16-out figures against torch's fp16 mm. linear: mpgemm.linear's fused
bias+GELU against torch's F.linear plus gelu, forward and forward+backward.
conv: mpgemm.conv2d against cuDNN (F.conv2d, fp16, channels_last) on
ResNet-50's layers, forward and forward+backward. ceiling: the rate of WMMA's
mma.sync with nothing else in the way (no loads, no barriers; the large GEMM
tile's warps, 1 or 2 blocks per SM), the bound that GEMM's instruction mix can
approach.

Every number is the median of CUDA-event timings after a warm-up, with input
sets rotated so that repeated calls do not find their operands in L2. On a
machine without a GPU the suites run the CPU reference on tiny shapes and say
plainly that these are not GPU measurements.
"""

import argparse
import dataclasses
import datetime
import json
import os
import re
import subprocess

import torch
import torch.nn.functional as F

from . import ops
from ._build import build_info
from .progress import Progress
from . import display
from .timing import CudaEventClock, Timing, WallClock, input_sets_for, time_op

# Dense fp16 Tensor Core peaks with fp32 accumulation, from vendor datasheets,
# matched against torch.cuda.get_device_name() in order.
KNOWN_PEAKS_TFLOPS = [
    (r"H100.*PCIe", 756.0),
    (r"H100|H200", 989.4),
    (r"A100", 312.0),
    (r"L40S", 362.0),
    (r"\bL4\b", 121.0),
    (r"RTX 4090", 165.2),
    (r"\bT4\b", 65.0),
    (r"V100", 125.0),
]
L2_BYTES_FALLBACK = 64 * 2**20

# ResNet-50's convolutions: (in, out, kernel, stride, padding, input size).
RESNET50_LAYERS = [
    (3, 64, 7, 2, 3, 224), (64, 64, 1, 1, 0, 56), (64, 64, 3, 1, 1, 56), (64, 256, 1, 1, 0, 56),
    (256, 64, 1, 1, 0, 56), (128, 128, 3, 2, 1, 56), (128, 512, 1, 1, 0, 28), (256, 512, 1, 2, 0, 56),
    (128, 128, 3, 1, 1, 28), (256, 256, 3, 1, 1, 14), (1024, 256, 1, 1, 0, 14), (512, 512, 3, 1, 1, 7),
    (512, 2048, 1, 1, 0, 7), (2048, 512, 1, 1, 0, 7),
]

GPU_SUITES = {
    "gemm": [("square", (s, s, s)) for s in (512, 1024, 2048, 4096, 8192)]
    + [("odd", (4095, 4097, 4093)), ("odd", (1023, 1025, 1021))],
    "linear": [("mlp", (t, o, i)) for t in (2048, 8192, 16384) for (i, o) in ((4096, 16384), (16384, 4096))],
    "conv": [("resnet50", (b,) + layer) for b in (32, 256) for layer in RESNET50_LAYERS],
    "ceiling": [("mma.sync", (blocks_per_sm, 20000)) for blocks_per_sm in (1, 2)],
}
QUICK_SUITES = {
    "gemm": [("square", (1024, 1024, 1024)), ("square", (4096, 4096, 4096)), ("odd", (4095, 4097, 4093))],
    "linear": [("mlp", (4096, 16384, 4096))],
    "conv": [("resnet50", (32,) + layer) for layer in RESNET50_LAYERS[1:4]],
    "ceiling": [("mma.sync", (1, 20000))],
}
CPU_SUITES = {
    "gemm": [("square", (64, 64, 64)), ("odd", (63, 65, 61))],
    "linear": [("mlp", (64, 256, 128))],
    "conv": [("resnet50", (2, 16, 16, 3, 1, 1, 8))],
    "ceiling": [("mma.sync", (1, 10))],
}
SUITES = tuple(GPU_SUITES)


@dataclasses.dataclass
class Measurement:
    suite: str
    case: str
    # gemm (M, N, K); linear (tokens, out_features, in_features);
    # conv (batch, in, out, kernel, stride, padding, input size);
    # ceiling (blocks per multiprocessor, iterations)
    shape: tuple
    impl: str
    baseline: str  # the impl this one is compared with ("" for a baseline)
    flops: float
    times_ms: list

    @property
    def median_ms(self):
        return Timing(self.times_ms).median_ms

    @property
    def tflops(self):
        return self.flops / (self.median_ms * 1e-3) / 1e12


def parse_shapes(text):
    """"4096x4096x4096,1024x512x256" -> [(4096, 4096, 4096), (1024, 512, 256)]"""
    shapes = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        parts = item.lower().split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
            raise argparse.ArgumentTypeError(f"expected MxNxK with positive integers, got {item!r}")
        shapes.append(tuple(int(p) for p in parts))
    if not shapes:
        raise argparse.ArgumentTypeError("expected at least one MxNxK shape")
    return shapes


def device_peak(device):
    """(dense fp16 TFLOP/s, where the number comes from)."""
    name = torch.cuda.get_device_name(device)
    for pattern, peak in KNOWN_PEAKS_TFLOPS:
        if re.search(pattern, name):
            return peak, f"datasheet ({name})"
    a = torch.randn(8192, 8192, device=device).half()
    timing = time_op(lambda x: torch.mm(x, x), [(a,)], clock=CudaEventClock(), warmup=3, reps=10)
    return 2 * 8192**3 / (timing.median_ms * 1e-3) / 1e12, "measured: torch.mm fp16 8192^3 (a lower bound)"


def _cublas_fp32(a, b):
    return torch.ops.mpgemm._cublas_gemm(a, b, out_dtype=torch.float32)


def _torch_mm_fp32(a, b):
    return torch.mm(a, b, out_dtype=torch.float32)


def _torch_has_out_dtype(device):
    try:
        _torch_mm_fp32(torch.ones(8, 8, device=device).half(), torch.ones(8, 8, device=device).half())
        return True
    except (TypeError, RuntimeError):
        return False


def gemm_impls(device):
    """name -> (fn, baseline name). The first entries are the fp32-out comparison."""
    if device.type != "cuda":
        return {"mpgemm": (lambda a, b: ops.gemm(a, b), "")}
    impls = {
        "cublas fp32-out": (_cublas_fp32, ""),
        "mpgemm fp32-out": (lambda a, b: ops.gemm(a, b), "cublas fp32-out"),
        "torch.mm fp16-out": (torch.mm, ""),
        "mpgemm fp16-out": (lambda a, b: ops.gemm(a, b, out_dtype=torch.float16), "torch.mm fp16-out"),
    }
    if _torch_has_out_dtype(device):
        impls["torch.mm fp32-out"] = (_torch_mm_fp32, "")
    return impls


def _forward_and_backward(forward, baseline_forward, device, mpgemm_name, baseline_name):
    """fwd and fwd+bwd impls of an op taking (x, w, b) and, for backward, grad."""
    def with_backward(fn):
        def run(x, w, b, grad):
            fn(x, w, b).backward(grad)

        return run

    if device.type != "cuda":
        return {f"{mpgemm_name} fwd": (forward, ""), f"{mpgemm_name} fwd+bwd": (with_backward(forward), "")}
    return {
        f"{baseline_name} fwd": (baseline_forward, ""),
        f"{mpgemm_name} fwd": (forward, f"{baseline_name} fwd"),
        f"{baseline_name} fwd+bwd": (with_backward(baseline_forward), ""),
        f"{mpgemm_name} fwd+bwd": (with_backward(forward), f"{baseline_name} fwd+bwd"),
    }


def linear_impls(device):
    return _forward_and_backward(lambda x, w, b: ops.linear(x, w, b, activation="gelu"),
                                 lambda x, w, b: F.gelu(F.linear(x, w, b)), device, "mpgemm fused", "torch unfused")


def conv_impls(device, stride, padding):
    return _forward_and_backward(lambda x, w, b: ops.conv2d(x, w, b, stride, padding),
                                 lambda x, w, b: F.conv2d(x, w, b, stride, padding), device, "mpgemm", "cudnn")


def _input_sets(make, bytes_per_set, device):
    cache = L2_BYTES_FALLBACK
    if device.type == "cuda":
        cache = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", cache) or cache
    return [make() for _ in range(input_sets_for(bytes_per_set, cache))]


def _gemm_case(shape, device):
    m, n, k = shape

    def make():
        return torch.randn(m, k, device=device).half(), torch.randn(k, n, device=device).half()

    return make, 2 * (m * k + k * n), gemm_impls(device), 2.0 * m * n * k


def _linear_case(shape, device):
    m, n, k = shape

    def make():
        x = torch.randn(m, k, device=device).half().requires_grad_()
        w = (torch.randn(n, k, device=device) / k**0.5).half().requires_grad_()
        b = torch.randn(n, device=device).half().requires_grad_()
        return x, w, b, torch.randn(m, n, device=device).half()

    return make, 2 * (m * k + n * k + m * n), linear_impls(device), 2.0 * m * n * k


def _conv_case(shape, device):
    batch, c, k, kernel, stride, padding, size = shape
    out = (size + 2 * padding - kernel) // stride + 1
    channels_last = torch.channels_last

    def make():
        x = torch.randn(batch, c, size, size, device=device).half().to(memory_format=channels_last)
        w = (torch.randn(k, c, kernel, kernel, device=device) * (c * kernel * kernel) ** -0.5).half()
        grad = torch.randn(batch, k, out, out, device=device).half().to(memory_format=channels_last)
        return (x.requires_grad_(), w.to(memory_format=channels_last).requires_grad_(),
                torch.randn(k, device=device).half().requires_grad_(), grad)

    bytes_per_set = 2 * (batch * c * size * size + k * c * kernel * kernel + batch * k * out * out)
    return make, bytes_per_set, conv_impls(device, stride, padding), 2.0 * batch * k * out * out * c * kernel**2


def _ceiling_case(shape, device):
    blocks_per_sm, iterations = shape
    tile = build_info()["mma_ceiling"]
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    blocks = blocks_per_sm * sms
    out_shape = (blocks, tile["warps"], tile["warp_m"], tile["warp_n"])

    def make():
        return (torch.randn(tile["warp_m"], tile["k"], device=device).half(),
                torch.randn(tile["k"], tile["warp_n"], device=device).half(),
                torch.empty(out_shape, device=device))

    def ceiling(a, b, out):
        torch.ops.mpgemm._mma_ceiling(a, b, iterations, out=out)

    slots = blocks * tile["warps"] * tile["warp_m"] * tile["warp_n"]
    return make, 4 * slots, {"mma.sync ceiling": (ceiling, "")}, 2.0 * slots * tile["k"] * iterations


CASE_BUILDERS = {"gemm": _gemm_case, "linear": _linear_case, "conv": _conv_case, "ceiling": _ceiling_case}
# Suites whose impls take the input set as it is; the others run forward under
# no_grad, or forward and backward.
DIRECT_SUITES = ("gemm", "ceiling")
# Suites whose cases --shapes replaces.
SHAPED_SUITES = ("gemm", "linear")


def measure_case(suite, case, shape, device, clock, warmup, reps):
    make, bytes_per_set, impls, flops = CASE_BUILDERS[suite](shape, device)
    sets = _input_sets(make, bytes_per_set, device)
    results = []
    for impl, (fn, baseline) in impls.items():
        if suite in DIRECT_SUITES:
            run, run_sets, impl_flops = fn, sets, flops
        elif impl.endswith("fwd+bwd"):  # backward costs two more products of the forward's size
            run, run_sets, impl_flops = fn, sets, 3 * flops
        else:
            def run(*args, fn=fn):
                with torch.no_grad():
                    return fn(*args)

            run_sets, impl_flops = [s[:3] for s in sets], flops
        timing = time_op(run, run_sets, clock=clock, warmup=warmup, reps=reps)
        results.append(Measurement(suite, case, shape, impl, baseline, impl_flops, timing.times_ms))
    return results


def git_commit():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                                check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True).stdout.strip()
        return commit + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run(suites, device, *, quick=False, shapes=None, reps=20, warmup=5, show_progress=True):
    on_gpu = device.type == "cuda"
    table = GPU_SUITES if on_gpu and not quick else QUICK_SUITES if on_gpu else CPU_SUITES
    if not on_gpu:
        reps, warmup = min(reps, 3), 1
    plan = [(suite, case, shape) for suite in suites for case, shape in
            ([("custom", s) for s in shapes] if shapes and suite in SHAPED_SUITES else table[suite])]
    clock = CudaEventClock() if on_gpu else WallClock()
    progress = Progress(len(plan), "bench") if show_progress and plan else None
    measurements = []
    for suite, case, shape in plan:
        torch.manual_seed(len(measurements))
        measurements += measure_case(suite, case, shape, device, clock, warmup, reps)
        if progress:
            progress.advance(note=f"{suite} {'x'.join(map(str, shape))}")
    report = {
        "device": torch.cuda.get_device_name(device) if on_gpu else "cpu",
        "gpu_measurement": on_gpu,
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "build_info": build_info(),
        "git_commit": git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "timing": {"clock": type(clock).__name__, "warmup": warmup, "reps": reps, "statistic": "median"},
        "results": [dict(dataclasses.asdict(m), median_ms=m.median_ms, tflops=m.tflops) for m in measurements],
    }
    if on_gpu:
        peak, source = device_peak(device)
        report["peak_tflops"] = {"value": peak, "source": source}
    return report


def format_report(report):
    lines = []
    if not report["gpu_measurement"]:
        lines.append("CPU reference backend: these are not GPU measurements, and no speed comparison is made.")
    else:
        peak = report["peak_tflops"]
        lines.append(f"{report['device']}, commit {report['git_commit']}, {report['date']}; "
                     f"peak {peak['value']:.1f} TFLOP/s ({peak['source']})")
    by_key = {(r["suite"], r["case"], tuple(r["shape"]), r["impl"]): r for r in report["results"]}
    header = ["suite", "case", "shape", "impl", "median ms", "TFLOP/s"]
    if report["gpu_measurement"]:
        header += ["vs baseline", "% peak"]
    rows = []
    for r in report["results"]:
        row = [r["suite"], r["case"], "x".join(map(str, r["shape"])), r["impl"], f"{r['median_ms']:.4f}",
               f"{r['tflops']:.2f}"]
        if report["gpu_measurement"]:
            base = by_key.get((r["suite"], r["case"], tuple(r["shape"]), r["baseline"]))
            row.append(f"{base['median_ms'] / r['median_ms']:.2f}x" if base else "")
            row.append(f"{100 * r['tflops'] / report['peak_tflops']['value']:.1f}")
        rows.append(row)
    lines.append(display.format_table(header, rows, rule=False))
    return "\n".join(lines)


def write_csv(report, path):
    import csv

    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["suite", "case", "shape", "impl", "baseline", "median_ms", "tflops", "times_ms"])
        for r in report["results"]:
            writer.writerow([r["suite"], r["case"], "x".join(map(str, r["shape"])), r["impl"], r["baseline"],
                             r["median_ms"], r["tflops"], " ".join(f"{t:.6f}" for t in r["times_ms"])])


def plot_report(report, path):
    plt = display.pyplot("bench")
    fig, ax = plt.subplots(figsize=(6.5, 4))
    square = [r for r in report["results"] if r["suite"] == "gemm" and r["case"] == "square"]
    for impl in dict.fromkeys(r["impl"] for r in square):
        points = sorted((r["shape"][0], r["tflops"]) for r in square if r["impl"] == impl)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=impl)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M = N = K")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"{report['device']} @ {report['git_commit'][:10]}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(args):
    device = torch.device("cuda" if build_info()["cuda_available"] else "cpu")
    if args.shapes and args.suite not in SHAPED_SUITES + ("all",):
        print(f"mpgemm bench: --shapes applies to the gemm and linear suites, not to {args.suite}")
        return 2
    suites = list(SUITES) if args.suite == "all" else [args.suite]
    report = run(suites, device, quick=args.quick, shapes=args.shapes, reps=args.reps)
    print(format_report(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if args.csv:
        write_csv(report, args.csv)
    if args.plot:
        plot_report(report, args.plot)
    return 0
