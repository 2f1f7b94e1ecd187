"""GELU's input saved by the forward (MPGEMM_EPILOGUE_PRE_ACTIVATION unset
or "1", the default; "0" recomputes it in backward): the ops that return it beside y, and the backward of linear and gemm
that reads it instead of running the product again, against float64 autograd
and the recomputing backward, on every available backend."""

import pytest
import torch
import torch.nn.functional as F

import mpgemm
from mpgemm.testing import random_operand, relative_error
from support import MpgemmCalls, assert_compiled_grads_equal_eager, set_environment

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
H, BF = torch.float16, torch.bfloat16
# As tests/ops/test_autograd.py's: dL/dz is rounded to the product's type,
# and 16-bit gradients once more on output.
GRAD_TOLERANCE = {H: 5e-3, BF: 2e-2}
SWITCH = "MPGEMM_EPILOGUE_PRE_ACTIVATION"


def linear_inputs(device, x_shape, out_features, dtype, w_dtype=None):
    x = torch.randn(x_shape, device=device).to(dtype).requires_grad_()
    weight = (torch.randn(out_features, x_shape[-1], device=device) / x_shape[-1] ** 0.5).to(w_dtype or dtype)
    bias = torch.randn(out_features, device=device).requires_grad_()
    return x, weight.requires_grad_(), bias


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, out_dtype", [(H, None), (BF, None), (H, torch.float32), (BF, BF)])
def test_ops_return_y_and_the_pre_activation(device, dtype, out_dtype):
    """y is bitwise linear's and gemm's with GELU, and the pre-activation
    bitwise theirs with no activation: the same sums, rounded once."""
    x, weight, bias = (t.detach() for t in linear_inputs(device, (3, 37, 72), 40, dtype))
    y, z = torch.ops.mpgemm._linear_pre_activation(x, weight, bias, activation="gelu", out_dtype=out_dtype)
    assert torch.equal(y, mpgemm.linear(x, weight, bias, activation="gelu", out_dtype=out_dtype))
    assert torch.equal(z, mpgemm.linear(x, weight, bias, out_dtype=out_dtype))
    assert z.shape == y.shape and z.dtype == y.dtype and z.is_contiguous()
    a = random_operand((2, 33, 48), device=device, dtype=dtype)
    b = random_operand((48, 24), layout="col", device=device, dtype=dtype)
    kwargs = {"bias": bias[:24].half(), "out_dtype": out_dtype or torch.float32}
    y, z = torch.ops.mpgemm._gemm_pre_activation(a, b, activation="relu", **kwargs)
    assert torch.equal(y, mpgemm.gemm(a, b, activation="relu", **kwargs))
    assert torch.equal(z, mpgemm.gemm(a, b, **kwargs))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype, out_dtype", [(H, None), (BF, None), (H, torch.float32)])
def test_gelu_tanh_against_float64(device, dtype, out_dtype):
    """GELU's tanh form (mpgemm.mlp's, with MPGEMM_EPILOGUE_PRE_ACTIVATION=1),
    which gemm and linear do not take: the pre-activation bitwise the product
    with no activation, and y within one rounding (two where torch's pass
    runs) of torch's tanh GELU of the float64 product."""
    x, weight, bias = (t.detach() for t in linear_inputs(device, (3, 37, 72), 40, dtype))
    y, z = torch.ops.mpgemm._linear_pre_activation(x, weight, bias, activation="gelu_tanh", out_dtype=out_dtype)
    assert torch.equal(z, mpgemm.linear(x, weight, bias, out_dtype=out_dtype))
    assert y.shape == z.shape and y.dtype == z.dtype and y.is_contiguous()
    z64 = F.linear(x.double(), weight.double(), bias.double())
    assert relative_error(y, F.gelu(z64, approximate="tanh")) < (1e-6 if y.dtype == torch.float32 else
                                                                  2 * GRAD_TOLERANCE[dtype] / 5)
    a, b = random_operand((2, 33, 48), device=device, dtype=dtype), random_operand((48, 24), device=device,
                                                                                  dtype=dtype)
    y, z = torch.ops.mpgemm._gemm_pre_activation(a, b, activation="gelu_tanh", out_dtype=dtype)
    assert torch.equal(z, mpgemm.gemm(a, b, out_dtype=dtype))
    assert relative_error(y, F.gelu(torch.matmul(a.double(), b.double()), approximate="tanh")) < \
        2 * GRAD_TOLERANCE[dtype] / 5


def test_pre_activation_ops_name_their_activations():
    x, weight, bias = (t.detach() for t in linear_inputs("cpu", (4, 16), 8, H))
    for name, args in (("_linear_pre_activation", (x, weight, bias)), ("_gemm_pre_activation", (x, weight.t()))):
        with pytest.raises(ValueError, match=f"mpgemm.{name}: activation must be None, 'relu', 'gelu' or "
                                             "'gelu_tanh', got 'tanh'"):
            getattr(torch.ops.mpgemm, name)(*args, activation="tanh")
        with pytest.raises(ValueError, match=f"mpgemm.{name}: activation must be"):
            getattr(torch.ops.mpgemm, name)(*(a.to("meta") for a in args), activation="tanh")
    with pytest.raises(ValueError, match="activation must be None, 'relu' or 'gelu', got 'gelu_tanh'"):
        mpgemm.linear(x, weight, bias, activation="gelu_tanh")


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_pre_activation_ops(device):
    x, weight, bias = (t.detach() for t in linear_inputs(device, (2, 5, 24), 16, H))
    torch.library.opcheck(torch.ops.mpgemm._linear_pre_activation.default, (x, weight, bias),
                          {"activation": "gelu"})
    torch.library.opcheck(torch.ops.mpgemm._linear_pre_activation.default, (x.float(), weight.bfloat16(), None),
                          {"activation": "gelu", "out_dtype": torch.float32})
    torch.library.opcheck(torch.ops.mpgemm._linear_pre_activation.default, (x, weight, bias),
                          {"activation": "gelu_tanh"})
    a, b = random_operand((3, 10, 24), device=device), random_operand((24, 9), layout="col", device=device)
    torch.library.opcheck(torch.ops.mpgemm._gemm_pre_activation.default, (a, b, bias[:9]), {"activation": "gelu"})


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("x_shape, out_features", [((33, 65), 17), ((2, 9, 40), 24), ((40,), 12)])
@pytest.mark.parametrize("dtype, w_dtype, out_dtype", [(H, H, None), (BF, BF, None), (BF, torch.float32, None),
                                                      (H, torch.float32, torch.float32)])
def test_linear_gelu_gradients_from_the_saved_pre_activation(device, x_shape, out_features, dtype, w_dtype, out_dtype,
                                                             monkeypatch):
    x, weight, bias = linear_inputs(device, x_shape, out_features, dtype, w_dtype)
    grad_out = torch.randn(*x_shape[:-1], out_features, device=device)
    results = {}
    for saved in ("0", "1"):
        monkeypatch.setenv(SWITCH, saved)
        y = mpgemm.linear(x, weight, bias, activation="gelu", out_dtype=out_dtype)
        grads = torch.autograd.grad(y, (x, weight, bias), grad_out.to(y.dtype))
        results[saved] = y, grads
    assert torch.equal(results["0"][0], results["1"][0]), "y does not depend on what backward reads"
    product = BF if BF in (dtype, w_dtype) else H
    x64, w64 = (t.detach().to(product).double().requires_grad_() for t in (x, weight))
    b64 = bias.detach().double().requires_grad_()
    F.gelu(F.linear(x64, w64, b64)).backward(grad_out.to(results["1"][0].dtype).to(product).double())
    for got, ref, t in zip(results["1"][1], (x64.grad, w64.grad, b64.grad), (x, weight, bias)):
        assert got.dtype == t.dtype and got.shape == t.shape
        assert relative_error(got, ref) < GRAD_TOLERANCE[product]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("a_shape, b_shape", [((7, 12), (12, 9)), ((3, 7, 12), (12, 9)), ((1, 7, 12), (4, 12, 9))])
@pytest.mark.parametrize("dtype", [H, BF])
def test_gemm_gelu_gradients_from_the_saved_pre_activation(device, a_shape, b_shape, dtype, monkeypatch):
    monkeypatch.setenv(SWITCH, "1")
    a = random_operand(a_shape, layout="col", device=device, dtype=dtype).requires_grad_()
    b = random_operand(b_shape, device=device, dtype=dtype).requires_grad_()
    bias = torch.randn(b_shape[-1], device=device, dtype=dtype).requires_grad_()
    out = mpgemm.gemm(a, b, bias=bias, activation="gelu", out_dtype=dtype)
    grad_out = torch.randn(out.shape, device=device, dtype=dtype)
    out.backward(grad_out)
    a64, b64, bias64 = (t.detach().double().requires_grad_() for t in (a, b, bias))
    F.gelu(torch.matmul(a64, b64) + bias64).backward(grad_out.double())
    for t, ref in ((a, a64), (b, b64), (bias, bias64)):
        assert t.grad.dtype == t.dtype and relative_error(t.grad, ref.grad) < GRAD_TOLERANCE[dtype]


@pytest.mark.parametrize("saved", [None, "1"])
@pytest.mark.parametrize("op", ["linear", "gemm"])
def test_gelus_backward_runs_two_products_where_the_forward_saved_its_input(op, saved, monkeypatch):
    """Counted at the dispatcher: by default (or "1"), the forward is one
    call that returns y and z, and backward the two gradient products alone
    (with "0", one more: tests/ops/test_autograd.py)."""
    set_environment(monkeypatch, SWITCH, saved)
    x = torch.randn(6, 16).half().requires_grad_()
    w = torch.randn(8, 16).half().requires_grad_()
    bias = torch.randn(8, requires_grad=True)
    with MpgemmCalls() as calls:
        y = (mpgemm.linear(x, w, bias, activation="gelu") if op == "linear"
             else mpgemm.gemm(x, w.t(), bias=bias, activation="gelu"))
    assert calls.ops == [f"_{op}_pre_activation"]
    with MpgemmCalls() as calls:
        y.backward(torch.randn_like(y))
    assert calls.ops == ["gemm", "gemm"]


def test_the_switch_leaves_other_activations_and_inference_alone(monkeypatch):
    monkeypatch.setenv(SWITCH, "1")
    x, weight, bias = linear_inputs("cpu", (4, 16), 8, H)
    for activation in (None, "relu"):
        with MpgemmCalls() as calls:
            mpgemm.linear(x, weight, bias, activation=activation)
        assert calls.ops == ["linear"]
    with torch.no_grad(), MpgemmCalls() as calls:
        mpgemm.linear(x, weight, bias, activation="gelu")
    assert calls.ops == ["linear"], "no pre-activation is kept where no graph is recorded"


@pytest.mark.parametrize("value", ["yes", "2"])
def test_a_bad_switch_is_refused(value, monkeypatch):
    monkeypatch.setenv(SWITCH, value)
    x, weight, bias = linear_inputs("cpu", (4, 16), 8, H)
    with pytest.raises(ValueError, match=f"{SWITCH} must be '0' or '1', got '{value}'"):
        mpgemm.linear(x, weight, bias, activation="gelu")


def test_torch_compile_trains_with_the_saved_pre_activation(monkeypatch):
    monkeypatch.setenv(SWITCH, "1")
    x, weight, bias = linear_inputs("cpu", (2, 6, 24), 16, BF)

    def layer(x, weight, bias):
        return mpgemm.linear(x, weight, bias, activation="gelu") * 2.0

    assert_compiled_grads_equal_eager(layer, (x, weight, bias), torch.randn(2, 6, 16).bfloat16())


@pytest.mark.parametrize("device", DEVICES)
def test_under_autocast_the_saved_pre_activation_has_autocasts_dtype(device, monkeypatch):
    x, weight, bias = (t.detach().float().requires_grad_() for t in linear_inputs(device, (5, 24), 16, H))
    grad_out = torch.randn(5, 16, device=device)
    grads = {}
    for saved in ("0", "1"):
        monkeypatch.setenv(SWITCH, saved)
        kept = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
            with torch.autocast(device, dtype=BF):
                y = mpgemm.linear(x, weight, bias, activation="gelu")
        assert y.dtype == BF
        # Saved: x and W in autocast's dtype, and with the switch z of y's shape and dtype.
        assert [(tuple(t.shape), t.dtype) for t in kept if t.shape == y.shape] == ([(y.shape, BF)] if saved == "1"
                                                                                   else [])
        grads[saved] = torch.autograd.grad(y, (x, weight, bias), grad_out.to(BF))
    for on, off in zip(grads["1"], grads["0"]):
        assert on.dtype == torch.float32 and relative_error(on, off) < GRAD_TOLERANCE[BF]
