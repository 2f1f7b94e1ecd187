"""Gradients of mpgemm.linear and mpgemm.gemm against float64 autograd on the
same fp16-rounded values, on every available backend."""

import pytest
import torch
import torch.nn.functional as F

import mpgemm
from mpgemm.testing import random_operand, relative_error

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# dL/dz is rounded to fp16 for the Tensor Core products, and fp16 gradients
# are rounded once more on output.
GRAD_TOLERANCE = 5e-3
ACTIVATIONS = {None: lambda t: t, "relu": torch.relu, "gelu": F.gelu}


def float64_leaf(t):
    """The fp16 value the kernels see, as a float64 leaf."""
    return t.detach().half().double().requires_grad_()


def assert_grads_close(tensors, references):
    for t, ref in zip(tensors, references):
        assert t.grad is not None
        assert t.grad.dtype == t.dtype, "a gradient must have its input's dtype"
        assert t.grad.shape == t.shape
        err = relative_error(t.grad, ref.grad)
        assert err < GRAD_TOLERANCE, f"relative error {err:.3g} for a {tuple(t.shape)} gradient"


LINEAR_CASES = [
    # x shape, out_features
    ((5, 7), 3),
    ((1, 1), 1),
    ((33, 65), 17),
    ((2, 9, 31), 24),
    ((2, 3, 5, 40), 9),
    ((40,), 12),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("x_shape, out_features", LINEAR_CASES)
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
@pytest.mark.parametrize("has_bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_linear_gradients(device, x_shape, out_features, activation, has_bias, dtype):
    in_features = x_shape[-1]
    x = torch.randn(x_shape, device=device).to(dtype).requires_grad_()
    weight = (torch.randn(out_features, in_features, device=device) / in_features**0.5).to(dtype).requires_grad_()
    bias = torch.randn(out_features, device=device).to(dtype).requires_grad_() if has_bias else None
    grad_out = torch.randn(*x_shape[:-1], out_features, device=device)

    y = mpgemm.linear(x, weight, bias, activation=activation)
    assert y.dtype == dtype
    y.backward(grad_out.to(dtype))

    x64, w64 = float64_leaf(x), float64_leaf(weight)
    b64 = bias.detach().double().requires_grad_() if has_bias else None
    y64 = ACTIVATIONS[activation](F.linear(x64, w64, b64))
    y64.backward(grad_out.to(dtype).double())
    assert relative_error(y, y64.detach()) < 2e-3
    params = [x, weight] + ([bias] if has_bias else [])
    assert_grads_close(params, [x64, w64] + ([b64] if has_bias else []))


@pytest.mark.parametrize("device", DEVICES)
def test_linear_mixed_dtypes(device):
    # fp16 activations with fp32 master weights: dx fp16, dW and db fp32.
    x = torch.randn(6, 20, device=device).half().requires_grad_()
    weight = torch.randn(11, 20, device=device).requires_grad_()
    bias = torch.randn(11, device=device).requires_grad_()
    y = mpgemm.linear(x, weight, bias, activation="gelu", out_dtype=torch.float32)
    assert y.dtype == torch.float32
    grad_out = torch.randn(6, 11, device=device)
    y.backward(grad_out)
    x64, w64, b64 = float64_leaf(x), float64_leaf(weight), bias.detach().double().requires_grad_()
    F.gelu(F.linear(x64, w64, b64)).backward(grad_out.double())
    assert_grads_close([x, weight, bias], [x64, w64, b64])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "a_shape, b_shape",
    [((7, 12), (12, 9)), ((3, 7, 12), (3, 12, 9)), ((3, 7, 12), (12, 9)), ((7, 12), (4, 12, 9)),
     ((1, 7, 12), (5, 12, 9)), ((5, 7, 12), (1, 12, 9))],
)
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
@pytest.mark.parametrize("bias_dtype", [None, torch.float16, torch.float32])
def test_gemm_gradients(device, a_shape, b_shape, activation, bias_dtype):
    a = random_operand(a_shape, layout="col", device=device).requires_grad_()
    b = random_operand(b_shape, device=device).requires_grad_()
    n = b_shape[-1]
    bias = None if bias_dtype is None else torch.randn(n, dtype=bias_dtype, device=device).requires_grad_()
    out = mpgemm.gemm(a, b, bias=bias, activation=activation)
    grad_out = torch.randn(out.shape, device=device)
    out.backward(grad_out)

    a64, b64 = float64_leaf(a), float64_leaf(b)
    bias64 = None if bias is None else bias.detach().double().requires_grad_()
    ref = torch.matmul(a64, b64) + (0 if bias64 is None else bias64)
    ACTIVATIONS[activation](ref).backward(grad_out.double())
    tensors = [a, b] + ([bias] if bias is not None else [])
    assert_grads_close(tensors, [a64, b64] + ([bias64] if bias is not None else []))


@pytest.mark.parametrize("device", DEVICES)
def test_only_bias_requires_grad(device):
    a, b = random_operand((4, 8), device=device), random_operand((8, 5), device=device)
    bias = torch.randn(5, device=device, requires_grad=True)
    mpgemm.gemm(a, b, bias=bias, activation="relu").sum().backward()
    z = a.double() @ b.double() + bias.detach().double()
    torch.testing.assert_close(bias.grad.double(), (z > 0).double().sum(0))


@pytest.mark.parametrize("op", ["linear", "gemm"])
def test_double_backward_raises(op):
    x = torch.randn(4, 6).half().requires_grad_()
    w = torch.randn(3, 6).half().requires_grad_()
    y = mpgemm.linear(x, w, activation="gelu") if op == "linear" else mpgemm.gemm(x, w.t(), activation="gelu")
    (grad_x,) = torch.autograd.grad(y.float().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match=f"mpgemm.{op}: double backward is not supported"):
        grad_x.float().sum().backward()


def test_out_argument_refuses_autograd():
    a = torch.randn(4, 6).half().requires_grad_()
    with pytest.raises(RuntimeError, match=r"out=\.\.\. does not support autograd"):
        mpgemm.gemm(a, torch.randn(6, 3).half(), out=torch.empty(4, 3))
