"""mpgemm.gemm against a float64 reference on the same fp16 or bf16 inputs, on
every available backend (the CPU reference always, the WMMA kernels where a
GPU is)."""

import pytest
import torch

import mpgemm
from mpgemm.testing import random_operand, reference_gemm, relative_error, tolerance

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
LAYOUTS = ["row", "col", "strided"]
DTYPES = [torch.float16, torch.bfloat16]


def check(out, a, b, bias=None, activation=None, out_dtype=torch.float32):
    ref = reference_gemm(a, b, bias, activation)
    assert out.shape == ref.shape
    assert out.dtype == out_dtype
    assert out.device == a.device
    assert not out.isnan().any()
    err = relative_error(out, ref)
    assert err < tolerance(out_dtype, a.device), f"relative error {err:.3g}"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("a_layout", LAYOUTS)
@pytest.mark.parametrize("b_layout", LAYOUTS)
@pytest.mark.parametrize("m, n, k", [(1, 1, 1), (7, 13, 5), (16, 16, 16), (33, 65, 17), (64, 48, 80), (129, 67, 131)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_shapes_and_layouts(device, a_layout, b_layout, m, n, k, dtype):
    a = random_operand((m, k), layout=a_layout, device=device, dtype=dtype)
    b = random_operand((k, n), layout=b_layout, device=device, dtype=dtype)
    check(mpgemm.gemm(a, b), a, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bias_dtype", [None, torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", ["float32", "inputs'"])
def test_epilogue(device, bias_dtype, activation, dtype, out_dtype):
    out_dtype = torch.float32 if out_dtype == "float32" else dtype
    a = random_operand((45, 37), device=device, dtype=dtype)
    b = random_operand((37, 70), layout="col", device=device, dtype=dtype)
    bias = None if bias_dtype is None else torch.randn(70, dtype=bias_dtype, device=device)
    out = mpgemm.gemm(a, b, bias=bias, activation=activation, out_dtype=out_dtype)
    check(out, a, b, bias, activation, out_dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "a_shape, b_shape",
    [
        ((3, 20, 24), (3, 24, 9)),
        ((4, 20, 24), (24, 9)),
        ((20, 24), (5, 24, 9)),
        ((1, 20, 24), (6, 24, 9)),
        ((6, 20, 24), (1, 24, 9)),
    ],
)
@pytest.mark.parametrize("layout", ["row", "col"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_broadcast(device, a_shape, b_shape, layout, dtype):
    a = random_operand(a_shape, layout=layout, device=device, dtype=dtype)
    b = random_operand(b_shape, layout=layout, device=device, dtype=dtype)
    bias = torch.randn(b_shape[-1], device=device)
    check(mpgemm.gemm(a, b, bias=bias, activation="gelu"), a, b, bias, "gelu")


@pytest.mark.parametrize("device", DEVICES)
def test_batched_transposed_views(device):
    x = random_operand((5, 19, 23), device=device)
    w = random_operand((31, 23), device=device)
    check(mpgemm.gemm(x, w.t()), x, w.t())
    check(mpgemm.gemm(x.transpose(-1, -2).contiguous().transpose(-1, -2), w.t()), x, w.t())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16])
def test_k_zero_gives_bias(device, out_dtype):
    a = torch.empty(6, 0, dtype=torch.float16, device=device)
    b = torch.empty(0, 9, dtype=torch.float16, device=device)
    bias = torch.randn(9, device=device)
    out = mpgemm.gemm(a, b, bias=bias, activation="relu", out_dtype=out_dtype)
    expected = torch.relu(bias).expand(6, 9).to(out_dtype)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    assert torch.equal(mpgemm.gemm(a, b), torch.zeros(6, 9, device=device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("a_shape, b_shape, out_shape", [((0, 5), (5, 7), (0, 7)), ((4, 5), (5, 0), (4, 0)),
                                                         ((0, 3, 5), (5, 7), (0, 3, 7))])
def test_empty(device, a_shape, b_shape, out_shape):
    out = mpgemm.gemm(random_operand(a_shape, device=device), random_operand(b_shape, device=device))
    assert out.shape == out_shape


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16])
def test_out_argument(device, out_dtype):
    a = random_operand((3, 21, 30), device=device)
    b = random_operand((30, 12), layout="col", device=device)
    bias = torch.randn(12, dtype=torch.float16, device=device)
    out = torch.full((3, 21, 12), float("nan"), dtype=out_dtype, device=device)
    result = mpgemm.gemm(a, b, bias=bias, activation="relu", out_dtype=out_dtype, out=out)
    assert result is out
    check(out, a, b, bias, "relu", out_dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_inputs_unchanged(device):
    a = random_operand((17, 9), layout="strided", device=device)
    b = random_operand((9, 11), layout="col", device=device)
    a_before, b_before = a.clone(), b.clone()
    mpgemm.gemm(a, b, activation="gelu")
    assert torch.equal(a, a_before) and torch.equal(b, b_before)


@pytest.mark.parametrize("device", DEVICES)
def test_nan_propagates_through_relu(device):
    a = random_operand((4, 8), device=device)
    a[1, 3] = float("nan")
    out = mpgemm.gemm(a, random_operand((8, 5), device=device), activation="relu")
    assert out[1].isnan().all() and not out[[0, 2, 3]].isnan().any()


def test_cpu_reference_uses_fp32_accumulation():
    # 2048 + 1 + 1 + ... : each +1 is lost in fp16 but kept in fp32.
    k = 64
    a = torch.ones(1, k, dtype=torch.float16)
    b = torch.ones(k, 1, dtype=torch.float16)
    b[0, 0] = 2048
    assert mpgemm.gemm(a, b).item() == 2048 + k - 1


def test_build_info():
    info = mpgemm.build_info()
    assert info["backend"] in ("cpu", "cuda")
    assert info["torch_version"] == torch.__version__
    if info["backend"] == "cuda":
        assert info["cuda_archs"] and all(arch.startswith("sm_") for arch in info["cuda_archs"])
    else:
        assert info["cuda_archs"] == [] and info["cuda_available"] is False
