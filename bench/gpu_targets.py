"""Small GPU programs for the tools that watch another program run, used by
bench/gpu_check.py:

  python3 bench/gpu_targets.py sanitize
      one call of each kernel family under compute-sanitizer: a small aligned
      GEMM (16-byte cp.async path, fused bias and GELU), a small odd one
      (one-element path, fp16 out), and a convolution's forward, backward-data
      and backward-filter passes; every result is checked against float64.
  python3 bench/gpu_targets.py profile [--size N] [--warmup W]
      W calls of the N^3 GEMM (fp16 in, fp32 out), then the one that
      `ncu --launch-skip W --launch-count 1` reads.
  python3 bench/gpu_targets.py profile --without-ncu --json PATH
      where ncu cannot run: the same GEMM's kernel time from torch.profiler
      (CUPTI) and the SM clock from NVML right after, as cycles per call.
"""

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mpgemm  # noqa: E402
from mpgemm.testing import reference_gemm, relative_error  # noqa: E402
from mpgemm.tools import gpu_state, timing  # noqa: E402

TOLERANCE = 1e-3


def _check(name, out, ref):
    error = relative_error(out, ref)
    print(f"{name}: relative error {error:.3g}")
    if not error < TOLERANCE:
        raise SystemExit(f"{name}: relative error {error:.3g} is not below {TOLERANCE}")


def sanitize():
    torch.manual_seed(0)
    a, b = torch.randn(256, 128, device="cuda").half(), torch.randn(128, 192, device="cuda").half()
    bias = torch.randn(192, device="cuda")
    _check("gemm 256x192x128 bias gelu", mpgemm.gemm(a, b, bias=bias, activation="gelu"),
           reference_gemm(a, b, bias, "gelu"))
    a, b = torch.randn(33, 29, device="cuda").half(), torch.randn(29, 47, device="cuda").half()
    _check("gemm 33x47x29 fp16 out", mpgemm.gemm(a, b, out_dtype=torch.float16), reference_gemm(a, b))

    x = torch.randn(2, 16, 10, 10, device="cuda").half().to(memory_format=torch.channels_last).requires_grad_()
    w = (torch.randn(32, 16, 3, 3, device="cuda") / 12).half().requires_grad_()
    y = mpgemm.conv2d(x, w, padding=1)
    grad = torch.randn_like(y)
    gx, gw = torch.autograd.grad(y, (x, w), grad)
    x64, w64 = x.detach().double().cpu().requires_grad_(), w.detach().double().cpu().requires_grad_()
    y64 = F.conv2d(x64, w64, padding=1)
    gx64, gw64 = torch.autograd.grad(y64, (x64, w64), grad.double().cpu())
    _check("conv2d fprop", y, y64.detach())
    _check("conv2d dgrad", gx, gx64)
    _check("conv2d wgrad", gw, gw64)
    torch.cuda.synchronize()


def profile(size, warmup, without_ncu, json_path):
    a, b = torch.randn(size, size, device="cuda").half(), torch.randn(size, size, device="cuda").half()
    for _ in range(warmup):
        mpgemm.gemm(a, b)
    torch.cuda.synchronize()
    if not without_ncu:
        mpgemm.gemm(a, b)
        torch.cuda.synchronize()
        return
    kernel_ms = timing.profiled_kernel_ms(mpgemm.gemm, [(a, b)], reps=20)
    # Read right after the calls, while the clock is still the one they ran at.
    after = gpu_state.read()
    clock = after.get("sm_clock_mhz") if after else None
    result = {"source": "torch.profiler kernel time x NVML SM clock read right after (ncu unavailable)",
              "size": size, "kernel_ms": kernel_ms, "tflops": 2 * size**3 / (kernel_ms * 1e-3) / 1e12,
              "sm_clock_mhz": clock, "cycles": kernel_ms * 1e3 * clock if clock else None, "gpu_state": after}
    print(json.dumps(result, indent=1))
    with open(json_path, "w") as f:
        json.dump(result, f, indent=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("sanitize")
    p = commands.add_parser("profile")
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--without-ncu", action="store_true")
    p.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    if not torch.cuda.is_available() or mpgemm.build_info()["backend"] != "cuda":
        raise SystemExit("gpu_targets.py needs a GPU and a CUDA build of mpgemm")
    if args.command == "sanitize":
        sanitize()
    elif args.without_ncu and not args.json:
        parser.error("--without-ncu needs --json PATH")
    else:
        profile(args.size, args.warmup, args.without_ncu, args.json)


if __name__ == "__main__":
    main()
