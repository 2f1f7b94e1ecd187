"""The launchers ask the runtime about a kernel once per kernel and device
(csrc/kernels/common/launch_utils.h's KernelAttributes): the arch of the code
the device runs for it, and its opt-in to more than 48 KiB of dynamic shared
memory. A call after the first launches its kernels with no function-attribute
call of the runtime's at all.

In a fresh process, where nothing has been asked, torch.profiler records the
CUDA runtime's calls of mpgemm's first calls (fp16 and bf16 GEMMs, a
convolution forward and backward), then of the same calls again: the first
must opt kernels in (cudaFuncSetAttribute; every Hopper kernel and the WMMA
tiles past 48 KiB take it), the second must make no cudaFuncSetAttribute or
cudaFuncGetAttributes call, and give the first call's bits. Once on the
default paths (the Hopper kernels on sm_90), once on the WMMA kernels alone,
whose launchers also ask a tile's and bf16's arch. Skipped where the profiler
records no cudaFuncSetAttribute even in the first call (it then cannot
tell)."""

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu

ATTRIBUTE_CALLS = ("cudaFuncSetAttribute", "cudaFuncGetAttributes")

CHILD = r"""
import json, sys
import torch
import mpgemm

torch.manual_seed(int(sys.argv[1]))
dev = "cuda"
a16 = torch.randn(1024, 512, device=dev).half()
b16 = torch.randn(512, 768, device=dev).half()
a_bf, b_bf = a16.bfloat16(), b16.bfloat16()
image = torch.randn(4, 64, 14, 14, device=dev).half().to(memory_format=torch.channels_last).requires_grad_()
filters = (torch.randn(128, 64, 3, 3, device=dev) / 24).half().requires_grad_()
dz = torch.randn(4, 128, 14, 14, device=dev).half().to(memory_format=torch.channels_last)
# torch's own lazy set-up (its handles, autograd's device thread) before the first profile.
t = torch.randn(64, 64, device=dev, requires_grad=True)
torch.autograd.grad((t @ t).sum(), t)
torch.cuda.synchronize()


def calls():
    z = mpgemm.conv2d(image, filters, None, 1, 1)
    grads = torch.autograd.grad(z, (image, filters), dz)
    return [mpgemm.gemm(a16, b16), mpgemm.gemm(a_bf, b_bf, out_dtype=torch.bfloat16), z, *grads]


def profiled():
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        out = calls()
        torch.cuda.synchronize()
    counts = {}
    for e in prof.events():
        if e.name in sys.argv[2:]:
            counts[e.name] = counts.get(e.name, 0) + 1
    return out, counts


first, first_counts = profiled()
again, again_counts = profiled()
print(json.dumps({"first": first_counts, "again": again_counts,
                  "bitwise": [torch.equal(f, a) for f, a in zip(first, again)]}))
"""


@pytest.mark.parametrize("path", ["auto", "wmma"])
def test_a_second_call_asks_the_runtime_nothing_about_its_kernels(path):
    env = dict(os.environ, MPGEMM_GEMM_PATH=path, MPGEMM_CONV_PATH=path)
    child = subprocess.run([sys.executable, "-c", CHILD, "20261202", *ATTRIBUTE_CALLS], env=env, capture_output=True,
                           text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-4000:]
    report = json.loads(child.stdout.strip().splitlines()[-1])
    if report["first"].get("cudaFuncSetAttribute", 0) == 0:
        pytest.skip(f"the profiler recorded no cudaFuncSetAttribute in the first calls: {report['first']}")
    assert all(report["bitwise"]), report
    assert not any(report["again"].get(name, 0) for name in ATTRIBUTE_CALLS), report
