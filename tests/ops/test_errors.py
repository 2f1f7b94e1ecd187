"""Every bad input to mpgemm.gemm gets a clear error naming the argument and
what was expected, on the real backend and on the Meta (torch.compile) path."""

import pytest
import torch

import mpgemm

H, B = torch.float16, torch.bfloat16


def bad_calls(device):
    def t(*shape, dtype=H):
        return torch.randn(*shape).to(dtype=dtype, device=device)

    return [
        ("a float32", TypeError, r"expected a to be torch\.float16 or torch\.bfloat16, got torch\.float32; convert "
         r"it with a\.half\(\) or a\.bfloat16\(\)", lambda: mpgemm.gemm(t(4, 5, dtype=torch.float32), t(5, 6))),
        ("b float64", TypeError, r"expected b to be torch\.float16 or torch\.bfloat16, got torch\.float64",
         lambda: mpgemm.gemm(t(4, 5, dtype=B), t(5, 6, dtype=torch.float64))),
        ("fp16 with bf16", TypeError, r"a is torch\.float16 but b is torch\.bfloat16; expected both torch\.float16 "
         r"or both torch\.bfloat16$", lambda: mpgemm.gemm(t(4, 5), t(5, 6, dtype=B))),
        ("bf16 with fp16", TypeError, r"a is torch\.bfloat16 but b is torch\.float16",
         lambda: mpgemm.gemm(t(4, 5, dtype=B), t(5, 6))),
        ("inner mismatch", ValueError, r"mismatched inner dimensions: a has shape \(4, 5\) and b has shape \(6, 7\)",
         lambda: mpgemm.gemm(t(4, 5), t(6, 7))),
        ("a 1-D", ValueError, r"expected a to be 2-D \(M, K\) or 3-D \(B, M, K\), got a 1-D tensor of shape \(5,\)",
         lambda: mpgemm.gemm(t(5), t(5, 6))),
        ("b 4-D", ValueError, r"expected b to be 2-D \(K, N\) or 3-D \(B, K, N\), got a 4-D tensor",
         lambda: mpgemm.gemm(t(4, 5), t(1, 2, 5, 6))),
        ("batch mismatch", ValueError, r"batch sizes do not broadcast: a has shape \(3, 4, 5\) and b has shape \(2, 5, 6\)",
         lambda: mpgemm.gemm(t(3, 4, 5), t(2, 5, 6))),
        ("bias shape", ValueError, r"expected bias of shape \(N,\) = \(6,\), got shape \(5,\)",
         lambda: mpgemm.gemm(t(4, 5), t(5, 6), bias=t(5))),
        ("bias 2-D", ValueError, r"expected bias of shape \(N,\) = \(6,\), got shape \(1, 6\)",
         lambda: mpgemm.gemm(t(4, 5), t(5, 6), bias=t(1, 6))),
        ("bias dtype", TypeError, r"expected bias to be torch\.float16, torch\.bfloat16 or torch\.float32, got "
         r"torch\.float64",
         lambda: mpgemm.gemm(t(4, 5), t(5, 6), bias=t(6, dtype=torch.float64))),
        ("activation", ValueError, r"activation must be None, 'relu' or 'gelu', got 'tanh'",
         lambda: mpgemm.gemm(t(4, 5), t(5, 6), activation="tanh")),
        ("out_dtype", ValueError, r"out_dtype must be torch\.float32 or torch\.float16 \(the type of the product's "
         r"inputs\), got torch\.bfloat16", lambda: mpgemm.gemm(t(4, 5), t(5, 6), out_dtype=B)),
        ("out_dtype bf16", ValueError, r"out_dtype must be torch\.float32 or torch\.bfloat16 \(the type of the "
         r"product's inputs\), got torch\.float16", lambda: mpgemm.gemm(t(4, 5, dtype=B), t(5, 6, dtype=B),
                                                                           out_dtype=H)),
        ("out shape", ValueError, r"expected out of shape \[4, 6\], got \[4, 7\]",
         lambda: mpgemm.gemm(t(4, 5), t(5, 6), out=torch.empty(4, 7, device=device))),
        ("out dtype", ValueError, r"out has dtype torch\.float16 but out_dtype is torch\.float32",
         lambda: mpgemm.gemm(t(4, 5), t(5, 6), out=torch.empty(4, 6, dtype=H, device=device))),
        ("out dtype op", ValueError, r"out_dtype must be torch\.float32 or torch\.float16 .*, got torch\.float64",
         lambda: torch.ops.mpgemm.gemm.out(t(4, 5), t(5, 6), out=torch.empty(4, 6, dtype=torch.float64,
                                                                               device=device))),
        ("out strided", ValueError, r"expected a contiguous out tensor",
         lambda: mpgemm.gemm(t(4, 5), t(5, 6), out=torch.empty(6, 4, device=device).t())),
    ]


CASES = bad_calls("cpu")


@pytest.mark.parametrize("name, error, message, call", CASES, ids=[c[0] for c in CASES])
def test_bad_input(name, error, message, call):
    with pytest.raises(error, match="^mpgemm.gemm: " + message):
        call()


META_CASES = [c for c in bad_calls("meta") if not c[0].startswith("out")]


@pytest.mark.parametrize("name, error, message, call", META_CASES, ids=[c[0] for c in META_CASES])
def test_bad_input_on_meta(name, error, message, call):
    with pytest.raises(error, match="^mpgemm.gemm: " + message):
        call()


def test_different_devices():
    a = torch.randn(4, 5).half()
    with pytest.raises(ValueError, match=r"^mpgemm.gemm: expected b on the same device as a \(cpu\), got b on meta"):
        mpgemm.gemm(a, torch.empty(5, 6, dtype=H, device="meta"))
    with pytest.raises(ValueError, match=r"expected bias on the same device as a \(cpu\), got bias on meta"):
        mpgemm.gemm(a, torch.randn(5, 6).half(), bias=torch.empty(6, device="meta"))


@pytest.mark.gpu
def test_cpu_and_cuda_operands():
    with pytest.raises(ValueError, match=r"expected b on the same device as a \(cpu\), got b on cuda"):
        mpgemm.gemm(torch.randn(4, 5).half(), torch.randn(5, 6, device="cuda").half())


def test_out_overlapping_input():
    a = torch.randn(4, 4).half()
    out = torch.empty(4, 4, dtype=H)
    with pytest.raises(RuntimeError, match="unsupported operation"):
        mpgemm.gemm(a, out, out=out, out_dtype=H)


def bad_linear_calls():
    def t(*shape, dtype=torch.float32):
        return torch.randn(*shape, dtype=dtype)

    return [
        ("x float64", TypeError, r"expected x to be torch\.float16, torch\.bfloat16 or torch\.float32, got "
         r"torch\.float64", lambda: mpgemm.linear(t(4, 5, dtype=torch.float64), t(6, 5))),
        ("fp16 with bf16", TypeError, r"x is torch\.float16 but weight is torch\.bfloat16; expected both "
         r"torch\.float16 or both torch\.bfloat16 \(an fp32 one is rounded to the other's type\)",
         lambda: mpgemm.linear(t(4, 5, dtype=H), t(6, 5, dtype=B))),
        ("bf16 out_dtype fp16", ValueError, r"out_dtype must be torch\.float32 or torch\.bfloat16 \(the type of "
         r"the product's inputs\), got torch\.float16",
         lambda: mpgemm.linear(t(4, 5), t(6, 5, dtype=B), out_dtype=H)),
        ("in_features", ValueError, r"x has shape \(4, 5\) but weight has shape \(6, 7\); x\.shape\[-1\] must "
         r"equal in_features = weight\.shape\[1\]", lambda: mpgemm.linear(t(4, 5), t(6, 7))),
        ("weight 1-D", ValueError, r"expected weight to be 2-D \(out_features, in_features\), got a 1-D tensor",
         lambda: mpgemm.linear(t(4, 5), t(5))),
        ("weight 3-D", ValueError, r"expected weight to be 2-D \(out_features, in_features\), got a 3-D tensor",
         lambda: mpgemm.linear(t(4, 5), t(2, 6, 5))),
        ("x 0-D", ValueError, r"expected x of shape \(\.\.\., in_features\), got a 0-D tensor",
         lambda: mpgemm.linear(torch.tensor(1.0), t(6, 5))),
        ("bias shape", ValueError, r"expected bias of shape \(out_features,\) = \(6,\), got shape \(5,\)",
         lambda: mpgemm.linear(t(4, 5), t(6, 5), t(5))),
        ("activation", ValueError, r"activation must be None, 'relu' or 'gelu', got 'silu'",
         lambda: mpgemm.linear(t(4, 5), t(6, 5), activation="silu")),
        ("out_dtype", ValueError, r"out_dtype must be torch\.float32 or torch\.float16 \(the type of the "
         r"product's inputs\), got torch\.float64", lambda: mpgemm.linear(t(4, 5), t(6, 5), out_dtype=torch.float64)),
        ("weight device", ValueError, r"expected weight on the same device as x \(cpu\), got weight on meta",
         lambda: mpgemm.linear(t(4, 5), torch.empty(6, 5, device="meta"))),
    ]


LINEAR_CASES = bad_linear_calls()


@pytest.mark.parametrize("name, error, message, call", LINEAR_CASES, ids=[c[0] for c in LINEAR_CASES])
def test_bad_linear_input(name, error, message, call):
    with pytest.raises(error, match="^mpgemm.linear: " + message):
        call()


def test_bad_linear_layer_input():
    layer = mpgemm.nn.Linear(5, 6)
    with pytest.raises(ValueError, match=r"^mpgemm.linear: x has shape \(2, 7\) but weight has shape \(6, 5\)"):
        layer(torch.randn(2, 7))
