"""The ops' registrations: schema, fake (Meta) kernels and tracing, checked by
torch.library.opcheck and torch.compile."""

import pytest
import torch

import mpgemm
from mpgemm.testing import random_operand, reference_gemm, relative_error, tolerance

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def gemm_samples(device):
    a = random_operand((3, 10, 24), device=device)
    b = random_operand((24, 9), layout="col", device=device)
    bias16 = torch.randn(9, device=device).half()
    bias32 = torch.randn(9, device=device)
    return [
        ((a[0], b), {}),
        ((a, b), {"bias": bias32, "activation": "gelu"}),
        ((a, b.expand(3, 24, 9)), {"bias": bias16, "activation": "relu", "out_dtype": torch.float16}),
        ((random_operand((7, 5), layout="strided", device=device), random_operand((5, 11), device=device)), {}),
        ((a.bfloat16(), b.bfloat16()), {"bias": bias16, "activation": "gelu", "out_dtype": torch.bfloat16}),
        ((a[1].bfloat16(), b.bfloat16()), {"bias": bias32.bfloat16()}),
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_gemm(device):
    for args, kwargs in gemm_samples(device):
        torch.library.opcheck(torch.ops.mpgemm.gemm.default, args, kwargs)


def linear_samples(device, requires_grad):
    def t(*shape, dtype=torch.float32):
        return torch.randn(*shape, device=device).to(dtype).requires_grad_(requires_grad)

    return [
        ((t(6, 20), t(9, 20)), {}),
        ((t(2, 5, 20, dtype=torch.float16), t(9, 20), t(9)), {"activation": "gelu"}),
        ((t(3, 20), t(9, 20, dtype=torch.float16), t(9, dtype=torch.float16)),
         {"activation": "relu", "out_dtype": torch.float16}),
        ((t(20), t(9, 20)), {}),
        ((t(2, 5, 20, dtype=torch.bfloat16), t(9, 20), t(9, dtype=torch.bfloat16)), {"activation": "gelu"}),
        ((t(3, 20), t(9, 20, dtype=torch.bfloat16), t(9)), {"out_dtype": torch.bfloat16}),
    ]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("requires_grad", [False, True])
def test_opcheck_linear(device, requires_grad):
    for args, kwargs in linear_samples(device, requires_grad):
        torch.library.opcheck(torch.ops.mpgemm.linear.default, args, kwargs)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_gemm_with_grad(device):
    for args, kwargs in gemm_samples(device):
        args = tuple(t.detach().requires_grad_() for t in args)
        kwargs = {k: v.detach().requires_grad_() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        torch.library.opcheck(torch.ops.mpgemm.gemm.default, args, kwargs)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_gemm_out(device):
    for args, kwargs in gemm_samples(device):
        out_dtype = kwargs.pop("out_dtype", torch.float32)
        shape = torch.ops.mpgemm.gemm.default(*args, **kwargs).shape
        out = torch.empty(shape, dtype=out_dtype, device=device)
        torch.library.opcheck(torch.ops.mpgemm.gemm.out, args, {**kwargs, "out": out})


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    def layer(x, w, bias):
        return mpgemm.gemm(x, w.t(), bias=bias, activation="gelu") * 0.5 + 1.0

    compiled = torch.compile(layer, fullgraph=True)
    x = random_operand((4, 12, 40), device=device)
    w = random_operand((24, 40), device=device)
    bias = torch.randn(24, device=device)
    out = compiled(x, w, bias)
    torch.testing.assert_close(out, layer(x, w, bias))
    ref = reference_gemm(x, w.t(), bias, "gelu") * 0.5 + 1.0
    assert relative_error(out, ref) < tolerance(torch.float32, device)
