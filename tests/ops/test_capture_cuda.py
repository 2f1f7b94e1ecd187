"""mpgemm's first calls in a process made inside a CUDA graph capture.

The launchers ask per-device facts once (whether a unit's loaded code has the
Hopper kernels, how many of a kernel's clusters fit, the shared memory a
kernel may take) and keep them. A first call inside a capture must ask them
without a copy or a synchronization, which torch.cuda.graph's global capture
mode refuses (and which would break the capture). Each case runs in a fresh
process, where no fact has been asked: torch's own lazy set-up is warmed up
on a side stream first, as torch.cuda.graph asks, and mpgemm is first called
inside the capture. The replay must equal the same calls run eagerly
afterwards bit for bit (so both ran the same kernels), and a float64
reference; on an sm_90 GPU the eager calls run the Hopper kernels (skipped
without a GPU)."""

import json
import os
import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.gpu

IS_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)

CHILD = r"""
import json, sys
import torch
import torch.nn.functional as F
import mpgemm
from mpgemm.testing import relative_error

torch.manual_seed(int(sys.argv[1]))
dev = "cuda"
a16 = torch.randn(2048, 1024, device=dev).half()
b16 = torch.randn(1024, 2048, device=dev).half()
a_bf, b_bf = a16.bfloat16(), b16.bfloat16()
x = torch.randn(4, 256, 512, device=dev).half().requires_grad_()
w = (torch.randn(768, 512, device=dev) / 512 ** 0.5).half().requires_grad_()
bias = torch.randn(768, device=dev).half().requires_grad_()
dy = torch.randn(4, 256, 768, device=dev).half()
image = torch.randn(4, 64, 14, 14, device=dev).half().to(memory_format=torch.channels_last).requires_grad_()
filters = (torch.randn(128, 64, 3, 3, device=dev) / 24).half().requires_grad_()
dz = torch.randn(4, 128, 7, 7, device=dev).half().to(memory_format=torch.channels_last)


def calls():
    y = mpgemm.linear(x, w, bias, activation="gelu")
    z = mpgemm.conv2d(image, filters, None, 2, 1)
    grads = torch.autograd.grad((y, z), (x, w, bias, image, filters), (dy, dz))
    return [mpgemm.gemm(a16, b16), mpgemm.gemm(a_bf, b_bf, out_dtype=torch.bfloat16), y, z, *grads]


def references():
    refs = [t.detach().double().requires_grad_() for t in (x, w, bias, image, filters)]
    y = F.gelu(F.linear(*refs[:3]))
    z = F.conv2d(refs[3], refs[4], None, 2, 1)
    grads = torch.autograd.grad((y, z), refs, (dy.double(), dz.double()))
    return [a16.double() @ b16.double(), a_bf.double() @ b_bf.double(), y, z, *grads]


# torch's lazy set-up (its handles, autograd's device thread), outside the capture.
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    t = torch.randn(64, 64, device=dev, requires_grad=True)
    torch.autograd.grad(F.conv2d((t @ t).view(1, 1, 64, 64), t.view(1, 1, 64, 64)[..., :3, :3]).sum(), t)
torch.cuda.current_stream().wait_stream(side)
torch.cuda.synchronize()

graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    captured = calls()


def kernels(fn):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        out = fn()
        torch.cuda.synchronize()
    return out, sorted({e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA})


_, replayed = kernels(graph.replay)
eager, ran = kernels(calls)
print(json.dumps({
    "bitwise": [torch.equal(c, e) for c, e in zip(captured, eager)],
    "errors": [relative_error(c, r) for c, r in zip(captured, references())],
    "replayed": replayed,
    "eager": ran,
}))
"""


@pytest.mark.parametrize("conv_path", ["auto", pytest.param("wgmma", marks=pytest.mark.skipif(
    not IS_HOPPER, reason="the Hopper convolution needs an sm_90 GPU"))])
def test_first_calls_inside_a_capture_replay_as_eager_calls_run(conv_path):
    env = dict(os.environ, MPGEMM_CONV_PATH=conv_path)
    child = subprocess.run([sys.executable, "-c", CHILD, "20261201"], env=env, capture_output=True, text=True,
                           timeout=300)
    assert child.returncode == 0, child.stderr[-4000:]
    result = json.loads(child.stdout.strip().splitlines()[-1])
    names = ["gemm fp16", "gemm bf16", "linear", "conv2d", "dx", "dw", "dbias", "dimage", "dfilters"]
    assert all(result["bitwise"]), dict(zip(names, result["bitwise"]))
    assert all(e < 1e-2 for e in result["errors"]), dict(zip(names, result["errors"]))
    if IS_HOPPER:
        # The eager calls reuse the answers kept from inside the capture (one
        # that failed there is asked again, and the replay's kernels would
        # then differ from the eager calls': the bitwise check above). The
        # replay's own kernels are checked where the profiler lists a graph's.
        replayed = result["replayed"] if any("mpgemm" in name for name in result["replayed"]) else result["eager"]
        for ran in (result["eager"], replayed):
            hopper = [name for name in ran if "wgmma" in name]
            assert hopper, ran
            if conv_path == "wgmma":
                assert any("wgmma_conv_kernel" in name for name in hopper), hopper
