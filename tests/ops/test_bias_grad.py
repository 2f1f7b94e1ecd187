"""linear's bias gradient summed by its weight gradient's product
(MPGEMM_EPILOGUE_BIAS_GRAD=1, opt-in): the op that returns a @ b and a's row
sums, and linear's backward that takes dbias from it rather than from a sum
of dz apart, against float64 autograd and the unfused backward, on every
available backend."""

import pytest
import torch
import torch.nn.functional as F

import mpgemm
from mpgemm.testing import random_operand, relative_error
from support import MpgemmCalls, assert_compiled_grads_equal_eager

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
H, BF = torch.float16, torch.bfloat16
# As tests/ops/test_autograd.py's: dL/dz is rounded to the product's type,
# and 16-bit gradients once more on output.
GRAD_TOLERANCE = {H: 5e-3, BF: 2e-2}
SWITCH = "MPGEMM_EPILOGUE_BIAS_GRAD"


def linear_inputs(device, x_shape, out_features, dtype, w_dtype=None, bias_dtype=torch.float32):
    x = torch.randn(x_shape, device=device).to(dtype).requires_grad_()
    weight = (torch.randn(out_features, x_shape[-1], device=device) / x_shape[-1] ** 0.5).to(w_dtype or dtype)
    bias = torch.randn(out_features, device=device).to(bias_dtype).requires_grad_()
    return x, weight.requires_grad_(), bias


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [H, BF])
@pytest.mark.parametrize("m, n, k, layouts", [(24, 40, 300, ("col", "row")), (130, 72, 520, ("col", "row")),
                                              (17, 9, 33, ("row", "col")), (8, 16, 64, ("row", "row"))])
def test_op_returns_the_product_and_the_row_sums_of_a(device, dtype, m, n, k, layouts):
    """y is bitwise gemm's; the row sums are a's over K in fp32, on every
    layout (where the kernels cannot sum them, torch sums a)."""
    a = random_operand((m, k), layout=layouts[0], device=device, dtype=dtype)
    b = random_operand((k, n), layout=layouts[1], device=device, dtype=dtype)
    for out_dtype in (None, torch.float32, dtype):
        y, sums = torch.ops.mpgemm._gemm_row_sums(a, b, out_dtype=out_dtype)
        assert torch.equal(y, mpgemm.gemm(a, b, out_dtype=out_dtype))
        assert sums.shape == (m,) and sums.dtype == torch.float32 and sums.device == a.device
        assert relative_error(sums, a.double().sum(-1)) < 1e-6


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_row_sums_op(device):
    a = random_operand((12, 40), layout="col", device=device)
    b = random_operand((40, 20), device=device)
    torch.library.opcheck(torch.ops.mpgemm._gemm_row_sums.default, (a, b))
    torch.library.opcheck(torch.ops.mpgemm._gemm_row_sums.default, (a.bfloat16(), b.bfloat16()),
                          {"out_dtype": torch.bfloat16})


def test_row_sums_op_refuses_batches():
    a, b = torch.randn(2, 4, 8).half(), torch.randn(8, 3).half()
    with pytest.raises(ValueError, match=r"mpgemm._gemm_row_sums: expected 2-D a and b, got 3-D and 2-D"):
        torch.ops.mpgemm._gemm_row_sums(a, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
@pytest.mark.parametrize("x_shape, out_features", [((67, 40), 24), ((3, 21, 48), 16)])
@pytest.mark.parametrize("dtype, w_dtype, bias_dtype", [(H, H, H), (BF, BF, torch.float32),
                                                        (BF, torch.float32, torch.float32)])
def test_linear_gradients_with_the_bias_summed_by_the_weights_product(device, activation, x_shape, out_features,
                                                                      dtype, w_dtype, bias_dtype, monkeypatch):
    """Every gradient against float64 autograd; x's and the weight's bitwise
    those of the unfused backward (the same products), the bias's within a
    rounding of dz to the product's type of them."""
    x, weight, bias = linear_inputs(device, x_shape, out_features, dtype, w_dtype, bias_dtype)
    grad_out = torch.randn(*x_shape[:-1], out_features, device=device)
    grads = {}
    for fused in ("0", "1"):
        monkeypatch.setenv(SWITCH, fused)
        y = mpgemm.linear(x, weight, bias, activation=activation)
        grads[fused] = torch.autograd.grad(y, (x, weight, bias), grad_out.to(y.dtype))
    product = BF if BF in (dtype, w_dtype) else H
    x64, w64 = (t.detach().to(product).double().requires_grad_() for t in (x, weight))
    b64 = bias.detach().double().requires_grad_()
    z64 = F.linear(x64, w64, b64)
    y64 = {None: z64, "relu": F.relu(z64), "gelu": F.gelu(z64)}[activation]
    y64.backward(grad_out.to(y.dtype).to(product).double())
    for got, ref, t in zip(grads["1"], (x64.grad, w64.grad, b64.grad), (x, weight, bias)):
        assert got.dtype == t.dtype and got.shape == t.shape
        assert relative_error(got, ref) < GRAD_TOLERANCE[product]
    assert torch.equal(grads["1"][0], grads["0"][0]) and torch.equal(grads["1"][1], grads["0"][1])
    assert relative_error(grads["1"][2], grads["0"][2].double()) < GRAD_TOLERANCE[product]


@pytest.mark.parametrize("wanted", ["all", "weight and bias", "x and bias", "bias"])
def test_backward_sums_no_bias_apart_where_the_weights_product_runs(wanted, monkeypatch):
    """Counted at the dispatcher: with the switch, where the weight's gradient
    is wanted its product returns the bias's (no sum of dz beside it);
    where it is not, dz is summed as without the switch."""
    monkeypatch.setenv(SWITCH, "1")
    x, weight, bias = linear_inputs("cpu", (2, 6, 16), 8, H)
    x.requires_grad_(wanted in ("all", "x and bias"))
    weight.requires_grad_(wanted in ("all", "weight and bias"))
    y = mpgemm.linear(x, weight, bias)
    with MpgemmCalls() as calls:
        y.backward(torch.randn_like(y))
    weights_product = "weight" in wanted or wanted == "all"
    assert calls.ops == ([] if wanted in ("weight and bias", "bias") else ["gemm"]) + (
        ["_gemm_row_sums"] if weights_product else [])
    assert ("sum" in calls.aten) != weights_product, calls.aten
    assert bias.grad is not None and bias.grad.dtype == bias.dtype


def test_gemms_bias_is_summed_apart(monkeypatch):
    """gemm's bias sums dz's columns, which its products read as B: the
    switch leaves its backward as it was."""
    monkeypatch.setenv(SWITCH, "1")
    a = torch.randn(6, 16).half().requires_grad_()
    b = torch.randn(16, 8).half().requires_grad_()
    bias = torch.randn(8, requires_grad=True)
    y = mpgemm.gemm(a, b, bias=bias)
    with MpgemmCalls() as calls:
        y.backward(torch.randn_like(y))
    assert calls.ops == ["gemm", "gemm"] and "sum" in calls.aten


@pytest.mark.parametrize("value", ["yes", "2"])
def test_a_bad_switch_is_refused(value, monkeypatch):
    monkeypatch.setenv(SWITCH, value)
    x, weight, bias = linear_inputs("cpu", (4, 16), 8, H)
    y = mpgemm.linear(x, weight, bias)
    with pytest.raises(ValueError, match=f"{SWITCH} must be '0' or '1', got '{value}'"):
        y.backward(torch.ones_like(y))


def test_torch_compile_trains_with_the_bias_summed_by_the_weights_product(monkeypatch):
    monkeypatch.setenv(SWITCH, "1")
    x, weight, bias = linear_inputs("cpu", (2, 6, 24), 16, BF)

    def layer(x, weight, bias):
        return mpgemm.linear(x, weight, bias, activation="relu") * 2.0

    assert_compiled_grads_equal_eager(layer, (x, weight, bias), torch.randn(2, 6, 16).bfloat16())


@pytest.mark.parametrize("device", DEVICES)
def test_under_autocast_the_bias_gradient_keeps_the_bias_dtype(device, monkeypatch):
    x, weight, bias = (t.detach().float().requires_grad_() for t in linear_inputs(device, (37, 24), 16, H))
    grad_out = torch.randn(37, 16, device=device)
    grads = {}
    for fused in ("0", "1"):
        monkeypatch.setenv(SWITCH, fused)
        with torch.autocast(device, dtype=BF):
            y = mpgemm.linear(x, weight, bias, activation="gelu")
        grads[fused] = torch.autograd.grad(y, (x, weight, bias), grad_out.to(BF))
    for on, off in zip(grads["1"], grads["0"]):
        assert on.dtype == torch.float32 and relative_error(on, off) < GRAD_TOLERANCE[BF]
