"""The Hopper path on a GPU (issue 16): correctness of the wgmma GEMM against
float64 on every operand layout, input and output type and edge, on blocks
alone, on pairs that multicast B and on pairs whose consumers take tiles in
turn (ping-pong), then the speed of all three against cuBLAS and the WMMA
path, in one process. The speed table also times the single blocks'
epilogue both ways: through the copy engine (`wgmma`, D 16-byte aligned)
and from registers (`wgmma_direct`, the same D 8 bytes off, which the copy
engine cannot describe).

    python3 bench/wgmma_check.py [--json FILE] [--skip-speed | --skip-correctness]

Needs an sm_90 GPU and an extension built with 9.0 in TORCH_CUDA_ARCH_LIST.
The correctness cases force each Hopper kernel (MPGEMM_GEMM_PATH=wgmma,
wgmma_2x1, wgmma_pingpong), also where the heuristic would split K on WMMA
tiles instead.
Exit status 1 if any case is wrong, or does not run on the kernel forced."""

import argparse
import json
import os
import sys

import torch

import mpgemm
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
TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1.5e-2}


def operand(batch, rows, cols, layout, dtype):
    """A fresh random (batch x) rows x cols matrix, row- or column-major."""
    lead = (batch,) if batch > 1 else ()
    if layout == "row":
        return torch.randn(*lead, rows, cols, device="cuda").to(dtype)
    return torch.randn(*lead, cols, rows, device="cuda").to(dtype).transpose(-1, -2)


def check_case(batch, m, n, k, layouts, dtype, out_dtype, bias, activation, path):
    os.environ["MPGEMM_GEMM_PATH"] = path
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
            "unwritten": unwritten, "ok": unwritten == 0 and err < tol and plan.config == path}


def correctness():
    results = []
    for i, (batch, m, n, k) in enumerate(SHAPES):
        for layouts in LAYOUTS:
            for dtype, path in ((d, p) for d in (torch.float16, torch.bfloat16) for p in HOPPER_PATHS):
                out_dtype = dtype if (i + len(results) // 2) % 3 == 0 else torch.float32
                bias = i % 2 == 0
                activation = [None, "relu", "gelu"][i % 3]
                results.append(check_case(batch, m, n, k, layouts, dtype, out_dtype, bias, activation, path))
                r = results[-1]
                print(f"{'ok  ' if r['ok'] else 'FAIL'} {r['batch']}x{m}x{n}x{k} {r['layouts']} {r['dtype']}->{r['out']} "
                      f"bias={bias} act={activation} config={r['config']} rel_err={r['rel_err']:.2e} "
                      f"unwritten={r['unwritten']}", flush=True)
    return results


# (m, n, k) beyond the cubes: where a 128 x 256 tile leaves multiprocessors
# idle (few tiles), and the shapes of transformer layers.
SWEEP = [(512, 512, 512), (1024, 1024, 1024), (1536, 1536, 1536), (16, 4096, 4096), (128, 4096, 4096),
         (4096, 128, 4096), (64, 64, 16384), (1024, 1024, 16384), (16384, 4096, 4096), (16384, 16384, 4096),
         (16384, 4096, 16384), (16384, 64, 4096), (16384, 128, 4096), (8192, 128, 8192)]


def speed(cubes=(2048, 4096, 8192), dtypes=(torch.float16, torch.bfloat16)):
    clock = CudaEventClock()
    rows = []
    cases = [((size, size, size), layouts, dtype) for dtype in dtypes for size in cubes
             for layouts in (("row", "col"), ("row", "row"))]
    cases += [(shape, ("row", "col"), torch.float16) for shape in SWEEP]
    for (m, n, k), layouts, dtype in cases:
        def inputs():
            return operand(1, m, k, layouts[0], dtype), operand(1, k, n, layouts[1], dtype)
        sets = [inputs() for _ in range(input_sets_for(2 * (m * k + k * n), 50 * 2**20, max_sets=4))]

        # D for the epilogue through the copy engine, and one 8 bytes off a
        # 16-byte boundary, which it cannot describe: stores from registers.
        d_copied = torch.empty(m, n, device="cuda")
        d_direct = torch.empty(m * n + 2, device="cuda")[2:].view(m, n)

        def wgmma(a, b):
            os.environ["MPGEMM_GEMM_PATH"] = "wgmma"
            return mpgemm.gemm(a, b, out=d_copied)

        def wgmma_direct(a, b):
            os.environ["MPGEMM_GEMM_PATH"] = "wgmma"
            return mpgemm.gemm(a, b, out=d_direct)

        def wgmma_2x1(a, b):
            os.environ["MPGEMM_GEMM_PATH"] = "wgmma_2x1"
            return mpgemm.gemm(a, b)

        def wgmma_pingpong(a, b):
            os.environ["MPGEMM_GEMM_PATH"] = "wgmma_pingpong"
            return mpgemm.gemm(a, b)

        def wmma(a, b):
            os.environ["MPGEMM_GEMM_PATH"] = "wmma"
            return mpgemm.gemm(a, b)

        def forced(path):
            def run(a, b):
                os.environ["MPGEMM_GEMM_PATH"] = path
                return mpgemm.gemm(a, b)
            return run

        def cublas(a, b):
            return torch.mm(a, b, out_dtype=torch.float32)

        fns = {"wgmma": wgmma, "wgmma_direct": wgmma_direct, "wgmma_2x1": wgmma_2x1,
               "wgmma_pingpong": wgmma_pingpong, "wmma": wmma}
        if n <= NARROW_COLUMNS:
            fns.update({path: forced(path) for path in NARROW_PATHS})
        times = time_interleaved({**fns, "cublas": cublas}, sets, clock=clock, reps=15)
        os.environ["MPGEMM_GEMM_PATH"] = "wgmma"
        flop = 2 * m * n * k
        row = {"m": m, "n": n, "k": k, "dtype": str(dtype).removeprefix("torch."),
               "layouts": "".join(layout[0] for layout in layouts)}
        for name, t in times.items():
            row[f"{name}_tflops"] = flop / t.median_ms / 1e9
        for name in times:
            if name != "cublas":
                row[f"{name}_vs_cublas"] = row[f"{name}_tflops"] / row["cublas_tflops"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="write the results here")
    skip = parser.add_mutually_exclusive_group()
    skip.add_argument("--skip-speed", action="store_true")
    skip.add_argument("--skip-correctness", action="store_true")
    args = parser.parse_args()
    os.environ["MPGEMM_GEMM_PATH"] = "wgmma"
    torch.manual_seed(0)
    results = {"device": torch.cuda.get_device_name(),
               "correctness": [] if args.skip_correctness else correctness()}
    if not args.skip_speed:
        results["speed"] = speed()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    failed = [r for r in results["correctness"] if not r["ok"]]
    print(f"{len(results['correctness']) - len(failed)}/{len(results['correctness'])} cases right")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
