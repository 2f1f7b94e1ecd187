"""The Hopper path on a GPU (issue 16): correctness of the wgmma GEMM against
float64 on every operand layout, input and output type and edge, on blocks
alone, on pairs that multicast B and on pairs whose consumers take tiles in
turn (ping-pong), then the speed of all three against cuBLAS and the WMMA
path, in one process. The speed table also times the single blocks'
epilogue both ways: through the copy engine (`wgmma`, D 16-byte aligned)
and from registers (`wgmma_direct`, the same D 8 bytes off, which the copy
engine cannot describe).

    python3 bench/wgmma_check.py [--json FILE] [--skip-speed | --skip-correctness]

The speed part opens with one small Hopper GEMM timed after each of four
predecessors (`predecessors`: whether a kernel pays for what the one before
it left in L2 or for the multiprocessors' reconfiguration, which the
benchmarks' separator before each timed call makes the same for every
call), and ends with the training sweep (mpgemm.tools.models.training_gemms:
each linear of GPT-2 small's to Llama-7B's blocks at 2048 and 16384 tokens,
forward, dgrad and wgrad with their real layouts, fp16): the default path
(whole K where the default splits K on the Hopper block, split-K there
wherever MPGEMM_WGMMA_SPLIT_K=1 would split, stream-K where it would be
planned) beside cuBLAS, with the geomean and the lowest of the default's
ratios.

Needs an sm_90 GPU and an extension built with 9.0 in TORCH_CUDA_ARCH_LIST.
The correctness cases force each Hopper kernel (MPGEMM_GEMM_PATH=wgmma,
wgmma_2x1, wgmma_pingpong, wgmma_n128, wgmma_n64), also where the heuristic
would split K on WMMA tiles instead, and split-K on the Hopper block
(MPGEMM_WGMMA_SPLIT_K=1: wherever its cost model splits) on such shapes, and
stream-K (MPGEMM_STREAM_K=1, opt-in) where its model plans it; the speed
table times them (`wgmma_splitk`, `wgmma_streamk`) beside the rest where
they apply (split-K: at least 128 rows and more than 128 columns;
stream-K: at least 128 rows, on the narrow tile it plans for at most 128
columns), and odd sizes on the Hopper kernel through
aligned copies of their operands (`wgmma_padded`, MPGEMM_PADDED_OPERANDS=1)
beside the WMMA path they take without.
Exit status 1 if any case is wrong, or does not run on the kernel forced."""

import argparse
import json
import math
import os
import statistics
import sys

import torch

import mpgemm
from mpgemm.tools.models import training_gemms
from mpgemm.tools.timing import CudaEventClock, input_sets_for, time_interleaved

LAYOUTS = [("row", "col"), ("row", "row"), ("col", "col"), ("col", "row")]
# MPGEMM_GEMM_PATH values that force each Hopper kernel; each names the plan's config.
HOPPER_PATHS = ("wgmma", "wgmma_2x1", "wgmma_pingpong", "wgmma_n128", "wgmma_n64")
# The narrow tiles' schedules, timed on outputs of at most NARROW_COLUMNS columns.
NARROW_PATHS, NARROW_COLUMNS = ("wgmma_n128", "wgmma_n64"), 128
# (batch, m, n, k): one tile; several tiles with K remainders and ragged
# edges; a wave and more; a batch. Each size a multiple of 8 where it may be
# a leading dimension, so that every layout stays on the path.
SHAPES = [(1, 128, 256, 64), (1, 64, 64, 16), (1, 136, 264, 72), (1, 1000, 1000, 1000), (1, 8, 8, 8),
          (1, 24, 4104, 520), (1, 4104, 24, 2056), (1, 2048, 2048, 4096), (3, 200, 328, 96)]
# Single matrices whose K the split cost model splits on the 128 x 256 tile
# (13 ways, 4 ways), run with MPGEMM_WGMMA_SPLIT_K=1.
SPLIT_SHAPES = [(1, 128, 264, 4104), (1, 1000, 1000, 8200)]
# Single matrices that run stream-K with MPGEMM_STREAM_K=1, and the tile
# they run it on: two tiles over 32 runs, 32 ragged tiles over a device's
# blocks; on the narrow tiles, 8 ragged 128 x 128 tiles and 16 of 128 x 64.
STREAM_K_SHAPES = [((1, 128, 264, 4104), "wgmma"), ((1, 1000, 1000, 8200), "wgmma"),
                   ((1, 1000, 104, 5000), "wgmma_n128"), ((1, 2000, 40, 3000), "wgmma_n64")]
TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2}


def use_path(path, split_k=False, padded=False, stream_k=False):
    """Forces MPGEMM_GEMM_PATH=path, split-K on the Hopper block where
    split_k (wherever its cost model splits; False: never; None: the
    default, where the split pays), odd-pitched operands onto it through
    aligned copies where padded, and stream-K where stream_k."""
    os.environ["MPGEMM_GEMM_PATH"] = path
    if split_k is None:
        os.environ.pop("MPGEMM_WGMMA_SPLIT_K", None)
    else:
        os.environ["MPGEMM_WGMMA_SPLIT_K"] = "1" if split_k else "0"
    os.environ["MPGEMM_PADDED_OPERANDS"] = "1" if padded else "0"
    os.environ["MPGEMM_STREAM_K"] = "1" if stream_k else "0"


def operand(batch, rows, cols, layout, dtype):
    """A fresh random (batch x) rows x cols matrix, row- or column-major."""
    lead = (batch,) if batch > 1 else ()
    if layout == "row":
        return torch.randn(*lead, rows, cols, device="cuda").to(dtype)
    return torch.randn(*lead, cols, rows, device="cuda").to(dtype).transpose(-1, -2)


def check_case(batch, m, n, k, layouts, dtype, out_dtype, bias, activation, path, split_k=False, stream_k=False):
    use_path(path, split_k, stream_k=stream_k)
    a = operand(batch, m, k, layouts[0], dtype)
    # A batch multiplies a batch of B when B is column-major, one broadcast B otherwise.
    b = operand(batch if layouts[1] == "col" else 1, k, n, layouts[1], dtype)
    bias_t = torch.randn(n, device="cuda").to(dtype) if bias else None
    plan = mpgemm.gemm_plan(m, n, k, batch=batch)
    out = torch.full((batch, m, n) if batch > 1 else (m, n), float("nan"), device="cuda", dtype=out_dtype)
    mpgemm.gemm(a, b, bias=bias_t, activation=activation, out_dtype=out_dtype, out=out)
    torch.cuda.synchronize()
    ref = a.double() @ b.double()
    if bias:
        ref = ref + bias_t.double()
    if activation == "relu":
        ref = torch.relu(ref)
    elif activation == "gelu":
        ref = torch.nn.functional.gelu(ref)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    unwritten = int(torch.isnan(out).sum())
    tol = TOLERANCE[dtype] if out_dtype == torch.float32 else max(TOLERANCE[dtype], 2e-3)
    return {"batch": batch, "m": m, "n": n, "k": k, "layouts": "".join(l[0] for l in layouts),
            "dtype": str(dtype).removeprefix("torch."), "out": str(out_dtype).removeprefix("torch."),
            "bias": bias, "activation": activation, "config": plan.config, "rel_err": err,
            "split_k": plan.split_k, "stream_k_blocks": plan.stream_k_blocks, "unwritten": unwritten,
            "ok": unwritten == 0 and err < tol and plan.config == path and (plan.split_k > 1) == split_k
            and (plan.stream_k_blocks > 0) == stream_k}


def correctness():
    results = []
    cases = [(shape, path, False, False) for shape in SHAPES for path in HOPPER_PATHS]
    cases += [(shape, "wgmma", True, False) for shape in SPLIT_SHAPES]
    cases += [(shape, path, False, True) for shape, path in STREAM_K_SHAPES]
    for i, ((batch, m, n, k), path, split_k, stream_k) in enumerate(cases):
        for layouts in LAYOUTS:
            for dtype in (torch.float16, torch.bfloat16):
                out_dtype = dtype if (i + len(results) // 2) % 3 == 0 else torch.float32
                bias = i % 2 == 0
                activation = [None, "relu", "gelu"][i % 3]
                results.append(check_case(batch, m, n, k, layouts, dtype, out_dtype, bias, activation, path, split_k,
                                          stream_k))
                r = results[-1]
                print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['batch']}x{m}x{n}x{k} {r['layouts']} {r['dtype']}->{r['out']} "
                      f"bias={bias} act={activation} config={r['config']} split_k={r['split_k']} "
                      f"stream_k_blocks={r['stream_k_blocks']} rel_err={r['rel_err']:.2e} "
                      f"unwritten={r['unwritten']}", flush=True)
    return results


# (m, n, k) beyond the cubes: where a 128 x 256 tile leaves multiprocessors
# idle (few tiles), the shapes of transformer layers, and narrow outputs
# (the last two: WMMA's split-K by default, stream-K on 128 x 64 and 128 x
# 128 tiles with MPGEMM_STREAM_K=1); then GPT-2 small's first MLP linear at
# `bench train`'s batch of 64 x 1024 tokens, where ping-pong pairs run GELU's
# tanh form in their epilogue (bench/NOTES.md: its plain rate beside the
# 128 x 256 tile's).
SWEEP = [(512, 512, 512), (1024, 1024, 1024), (1536, 1536, 1536), (16, 4096, 4096), (128, 4096, 4096),
         (4096, 128, 4096), (64, 64, 16384), (1024, 1024, 16384), (16384, 4096, 4096), (16384, 16384, 4096),
         (16384, 4096, 16384), (16384, 64, 4096), (16384, 128, 4096), (8192, 128, 8192), (4096, 64, 4096),
         (2048, 128, 8192), (65536, 3072, 768)]
# Odd sizes, whose operands the copy engine cannot describe as they lie:
# WMMA's path beside the Hopper kernel on aligned copies (`wgmma_padded`).
ODD_SWEEP = [(4095, 4097, 4093), (2047, 2049, 2045), (1023, 1025, 1021)]


def timed_row(row, fns, sets, clock):
    """`row` (a GEMM's m, n, k and labels) with each of `fns`' TFLOP/s, timed
    interleaved over `sets`, and each one's ratio to the "cublas" one's;
    printed as a JSON line."""
    times = time_interleaved(fns, sets, clock=clock, reps=15)
    flop = 2 * row["m"] * row["n"] * row["k"]
    for name, t in times.items():
        row[f"{name}_tflops"] = flop / t.median_ms / 1e9
    for name in times:
        if name != "cublas":
            row[f"{name}_vs_cublas"] = row[f"{name}_tflops"] / row["cublas_tflops"]
    print(json.dumps(row), flush=True)
    return row


def input_sets(m, n, k, layouts, dtype):
    """Fresh (A, B) pairs in `layouts`, as many as keep the timings off L2."""
    def inputs():
        return operand(1, m, k, layouts[0], dtype), operand(1, k, n, layouts[1], dtype)
    return [inputs() for _ in range(input_sets_for(2 * (m * k + k * n), 50 * 2**20, max_sets=4))]


def speed(cubes=(2048, 4096, 8192), dtypes=(torch.float16, torch.bfloat16)):
    clock = CudaEventClock()
    rows = []
    cases = [((size, size, size), layouts, dtype) for dtype in dtypes for size in cubes
             for layouts in (("row", "col"), ("row", "row"))]
    cases += [(shape, ("row", "col"), torch.float16) for shape in SWEEP + ODD_SWEEP]
    for (m, n, k), layouts, dtype in cases:
        sets = input_sets(m, n, k, layouts, dtype)

        # D for the epilogue through the copy engine, and one 8 bytes off a
        # 16-byte boundary, which it cannot describe: stores from registers.
        d_copied = torch.empty(m, n, device="cuda")
        d_direct = torch.empty(m * n + 2, device="cuda")[2:].view(m, n)

        def wgmma(a, b):
            use_path("wgmma")
            return mpgemm.gemm(a, b, out=d_copied)

        def wgmma_direct(a, b):
            use_path("wgmma")
            return mpgemm.gemm(a, b, out=d_direct)

        def forced(path, split_k=False, padded=False, stream_k=False):
            def run(a, b):
                use_path(path, split_k, padded, stream_k)
                return mpgemm.gemm(a, b)
            return run

        def cublas(a, b):
            return torch.mm(a, b, out_dtype=torch.float32)

        if (m, n, k) in ODD_SWEEP:
            fns = {"wmma": forced("wmma"), "wgmma_padded": forced("wgmma", padded=True)}
        else:
            fns = {"wgmma": wgmma, "wgmma_direct": wgmma_direct, "wgmma_2x1": forced("wgmma_2x1"),
                   "wgmma_pingpong": forced("wgmma_pingpong"), "wmma": forced("wmma")}
            if n <= NARROW_COLUMNS:
                fns.update({path: forced(path) for path in NARROW_PATHS})
            if m >= 128 and n > NARROW_COLUMNS:
                fns["wgmma_splitk"] = forced("wgmma", split_k=True)
            if m >= 128:
                # Stream-K where its model plans it, on the tile it plans (a narrow one for narrow outputs).
                use_path("auto", stream_k=True)
                streamed = mpgemm.gemm_plan(m, n, k)
                if streamed.stream_k_blocks:
                    fns["wgmma_streamk"] = forced(streamed.config, stream_k=True)
        row = {"m": m, "n": n, "k": k, "dtype": str(dtype).removeprefix("torch."),
               "layouts": "".join(layout[0] for layout in layouts)}
        rows.append(timed_row(row, {**fns, "cublas": cublas}, sets, clock))
        use_path("wgmma")
    return rows


def training_speed():
    """The default path on training's GEMMs beside cuBLAS, fp16; whole K
    where the default splits K on the Hopper block, split-K wherever its
    cost model splits (MPGEMM_WGMMA_SPLIT_K=1) and the default does not,
    stream-K where it would be planned; then the geomean and the lowest of
    the default's ratios."""
    clock = CudaEventClock()
    rows = []
    for label, (m, n, k), layouts in training_gemms():
        sets = input_sets(m, n, k, layouts, torch.float16)

        def with_path(split_k, stream_k=False):
            def run(a, b):
                use_path("auto", split_k, stream_k=stream_k)
                return mpgemm.gemm(a, b)
            return run

        use_path("auto", split_k=None)
        plan = mpgemm.gemm_plan(m, n, k)
        use_path("auto", split_k=False)
        whole_plan = mpgemm.gemm_plan(m, n, k)
        use_path("auto", split_k=True)
        split_plan = mpgemm.gemm_plan(m, n, k)
        use_path("auto", stream_k=True)
        stream_k_plan = mpgemm.gemm_plan(m, n, k)
        fns = {"default": with_path(None), "cublas": lambda a, b: torch.mm(a, b, out_dtype=torch.float32)}
        if whole_plan != plan:
            fns["whole_k"] = with_path(False)
        if split_plan != plan:
            fns["wgmma_splitk"] = with_path(True)
        if stream_k_plan.stream_k_blocks:
            fns["wgmma_streamk"] = with_path(False, stream_k=True)
        row = {"gemm": label, "m": m, "n": n, "k": k, "layouts": "".join(layout[0] for layout in layouts),
               "dtype": "float16", "config": plan.config, "split_k": plan.split_k,
               "whole_k_config": whole_plan.config, "splitk_config": split_plan.config,
               "splitk_split_k": split_plan.split_k, "stream_k_blocks": stream_k_plan.stream_k_blocks}
        rows.append(timed_row(row, fns, sets, clock))
    use_path("wgmma")
    ratios = [row["default_vs_cublas"] for row in rows]
    geomean = math.exp(sum(math.log(r) for r in ratios) / len(ratios))
    lowest = min(rows, key=lambda row: row["default_vs_cublas"])
    print(f"training sweep: default at {geomean:.3f} of cuBLAS (geomean of {len(rows)} GEMMs), lowest "
          f"{lowest['default_vs_cublas']:.3f} ({lowest['gemm']})")
    return rows


# What may run right before a kernel: L2 clean or full of dirty lines, after
# a kernel that asked for as much shared memory or for little.
PREDECESSORS = ("itself", "a spin", "a write of 128 MiB", "a read of twice L2")


def predecessors(reps=30):
    """The device time of one Hopper kernel (the product of ResNet-50's 1024
    to 256 channel 1x1 convolution at 14x14 and batch 256 as its dgrad's
    shape, 50176 x 1024 x 256, fp16 out) right after each of PREDECESSORS,
    median of `reps`. Each starts from the same state (mpgemm's separator: a
    read of twice L2, then a spin that keeps the host's launches out of the
    timed interval), then runs its predecessor: the product itself (L2 full
    of its dirty output; the same shared memory asked for), nothing past the
    spin (L2 clean; the spin asks for no shared memory), a write of 128 MiB
    (L2 dirty; an elementwise kernel's), the separator again (L2 clean; a
    reduction's). If dirty lines cost, "itself" and the write are the slow
    ones; if the multiprocessors' reconfiguration for a kernel that asks for
    227 KB of shared memory does, every one but "itself". The benchmarks
    time every call after the separator, so the second would be in their
    numbers, as in a training step wherever a convolution follows an
    elementwise kernel."""
    clock = CudaEventClock()
    m, n, k = 50176, 1024, 256
    sets = [(torch.randn(m, k, device="cuda").half(), torch.randn(k, n, device="cuda").half()) for _ in range(3)]
    dirty = torch.empty(64 * 2**20, dtype=torch.float16, device="cuda")
    calls = [0]

    def product():
        a, b = sets[calls[0] % len(sets)]
        calls[0] += 1
        return mpgemm.gemm(a, b, out_dtype=torch.float16)

    before = {"itself": product, "a spin": lambda: None, "a write of 128 MiB": lambda: dirty.fill_(1.0),
              "a read of twice L2": clock.separate}
    use_path("auto")
    config = mpgemm.gemm_plan(m, n, k).config
    for _ in range(5):  # plans, tensor maps and the separator's buffer made
        product(), clock.separate()
    marks = {name: [] for name in PREDECESSORS}
    for _ in range(reps):
        for name in PREDECESSORS:
            clock.separate()
            clock.hold(0.5)
            before[name]()
            begin = clock.mark()
            product()
            marks[name].append((begin, clock.mark()))
        clock.synchronize()  # each interval is read once both of its events are done
    use_path("wgmma")
    medians = {name: statistics.median(clock.elapsed_ms(b, e) for b, e in pairs) * 1000
               for name, pairs in marks.items()}
    print(f"a small Hopper GEMM ({m} x {n} x {k}, {config}) after " +
          ", ".join(f"{name}: {us:.1f} us" for name, us in medians.items()), flush=True)
    return {"m": m, "n": n, "k": k, "config": config, "us_after": medians}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    skip = parser.add_mutually_exclusive_group()
    skip.add_argument("--skip-speed", action="store_true")
    skip.add_argument("--skip-correctness", action="store_true")
    args = parser.parse_args()
    use_path("wgmma")
    torch.manual_seed(0)
    results = {"device": torch.cuda.get_device_name(),
               "correctness": [] if args.skip_correctness else correctness()}
    if not args.skip_speed:
        results["predecessors"] = predecessors()
        results["speed"] = speed()
        results["training"] = training_speed()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    failed = [r for r in results["correctness"] if not r["ok"]]
    print(f"{len(results['correctness']) - len(failed)}/{len(results['correctness'])} cases right")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
