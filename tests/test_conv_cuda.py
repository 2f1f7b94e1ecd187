"""The convolution kernels against cuDNN and float64 (skipped without a GPU).

The op allocates its output; the caching allocator hands back the block just
freed, so filling a same-sized block with NaN right before each launch poisons
the output: an element the kernel does not write stays NaN."""

import pytest
import torch
import torch.nn.functional as F

import mpgemm
from mpgemm.testing import relative_error

from test_conv import CASES, RESNET50

pytestmark = pytest.mark.gpu
TOLERANCE = 1e-3


def poisoned(call, shape, dtype, memory_format=torch.contiguous_format):
    torch.full(shape, float("nan"), dtype=dtype, device="cuda").contiguous(memory_format=memory_format)
    return call()


def compare(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    x = x.detach().requires_grad_()
    weight = weight.detach().requires_grad_()
    out = mpgemm.conv2d(x, weight, bias, stride, padding, dilation, groups, out_dtype=torch.float32)
    assert not out.isnan().any()
    grad = torch.randn_like(out)
    grad_x, grad_w = torch.autograd.grad(out, (x, weight), grad.half().float())
    assert not grad_x.isnan().any() and not grad_w.isnan().any()
    x16, w16 = x.detach().half(), weight.detach().half()
    for dtype in (torch.float16, torch.float32):  # cuDNN in fp16 and in fp32 on the fp16 values
        xr, wr = x16.to(dtype).requires_grad_(), w16.to(dtype).requires_grad_()
        ref = F.conv2d(xr, wr, None if bias is None else bias.to(dtype), stride, padding, dilation, groups)
        ref_x, ref_w = torch.autograd.grad(ref, (xr, wr), grad.half().to(dtype))
        tol = TOLERANCE if dtype == torch.float32 else 3e-3
        assert relative_error(out, ref.detach().double().cpu()) < tol
        assert relative_error(grad_x, ref_x.double().cpu()) < 5 * tol
        assert relative_error(grad_w, ref_w.double().cpu()) < 5 * tol


@pytest.mark.parametrize("c, k, kernel, stride, padding, size", RESNET50)
@pytest.mark.parametrize("batch", [1, 32])
def test_resnet50_layers_against_cudnn(c, k, kernel, stride, padding, size, batch):
    x = torch.randn(batch, c, size, size, device="cuda").half().to(memory_format=torch.channels_last)
    weight = torch.randn(k, c, kernel, kernel, device="cuda") * (c * kernel * kernel) ** -0.5
    n_out = (size + 2 * padding - kernel) // stride + 1
    poisoned(lambda: None, (batch, k, n_out, n_out), torch.float32, torch.channels_last)
    compare(x, weight, torch.randn(k, device="cuda"), stride, padding)


@pytest.mark.parametrize("x_shape, k, kernel, kwargs", CASES)
@pytest.mark.parametrize("channels_last", [False, True])
def test_cases_against_cudnn(x_shape, k, kernel, kwargs, channels_last):
    x = torch.randn(*x_shape, device="cuda").half()
    if channels_last and x.dim() == 4:
        x = x.to(memory_format=torch.channels_last)
    c = x_shape[-3]
    weight = torch.randn(k, c // kwargs.get("groups", 1), kernel, kernel, device="cuda") * (c * kernel) ** -0.5
    compare(x, weight, torch.randn(k, device="cuda"), **kwargs)


def test_misaligned_channels_last_view():
    base = torch.randn(2 * 16 * 9 * 9 + 1, device="cuda").half()
    x = base[1:].view(2, 9, 9, 16).permute(0, 3, 1, 2)  # channels_last, 2-byte offset: one-element path
    compare(x, torch.randn(8, 16, 3, 3, device="cuda") / 12, None, 1, 1)
