"""Per-device tuning of the GEMM's tile choice: times every candidate plan of
each shape (mpgemm.plan.candidate_plans) and caches the fastest on disk
(mpgemm.plan.write_tuning), then installs it in this process. The library
reads the cache back with mpgemm.load_tuning()."""

import torch

from .. import _C
from .. import plan as gemm_plans
from . import timing


def _shape(shape):
    shape = tuple(int(s) for s in shape)
    if len(shape) == 3:
        return (1, *shape)
    if len(shape) != 4:
        raise ValueError(f"mpgemm.tune_gemm: a shape is (m, n, k) or (batch, m, n, k), got {shape!r}")
    return shape


def gpu_time_fn(dtype=torch.float16, reps=10, warmup_ms=50.0):
    """Times a plan on the current GPU: row-major operands of `dtype`, fp32
    out, the plan installed for the shape, with the library's timing helper."""

    def time_ms(shape, plan):
        batch, m, n, k = shape
        a = torch.randn(batch, m, k, device="cuda").to(dtype)
        b = torch.randn(batch, k, n, device="cuda").to(dtype)
        if batch == 1:
            a, b = a[0], b[0]
        _C.set_tuned_gemm_plan(batch, m, n, k, plan.config, plan.split_k, plan.stream_k_blocks > 0)
        timings = timing.time_interleaved({"gemm": lambda x, y: torch.ops.mpgemm.gemm(x, y)}, [(a, b)],
                                          clock=timing.CudaEventClock(), warmup_ms=warmup_ms, reps=reps)
        return timings["gemm"].median_ms

    return time_ms


def tune_gemm(shapes, *, time_fn=None, device_name=None, arch=None, device_limits=None, dtype=torch.float16):
    """For each (m, n, k) or (batch, m, n, k) in `shapes`, times every
    candidate plan with time_fn(shape, plan) -> milliseconds (by default on
    the current GPU), keeps the fastest in the device's tuning cache and
    installs it; returns the chosen entries. Operands are taken as aligned
    (16-byte loads); shapes that are not run the heuristic's plan."""
    if device_name is None or arch is None:
        device_name, arch = gemm_plans.device_key()
    if time_fn is None:
        time_fn = gpu_time_fn(dtype)
    chosen = []
    try:
        for shape in map(_shape, shapes):
            batch, m, n, k = shape
            candidates = gemm_plans.candidate_plans(m, n, k, batch=batch, device_limits=device_limits)
            times = [(float(time_fn(shape, p)), p) for p in candidates]
            best_ms, best = min(times, key=lambda t: t[0])
            chosen.append({"batch": batch, "m": m, "n": n, "k": k, "config": best.config,
                           "split_k": best.split_k, "stream_k": best.stream_k_blocks > 0, "time_ms": best_ms})
    finally:
        _C.clear_tuned_gemm_plans()  # the timing installed each candidate in turn
    gemm_plans.write_tuning(chosen, device_name, arch)
    gemm_plans.load_tuning(device_name=device_name, arch=arch)
    return chosen
