"""mpgemm.mlp (linear, GELU or ReLU, linear as one op) and the op its backward
runs with MPGEMM_EPILOGUE_ACTIVATION_GRAD=1 (opt-in),
_gemm_activation_grad: (a @ b) times the activation's derivative, rounded
once. Against float64 autograd and torch's own gelu_backward and
threshold_backward, on every available backend."""

import pytest
import torch
import torch.nn.functional as F

import mpgemm
from mpgemm.testing import (TORCH_ACTIVATIONS, activation_grad_reference, random_operand, relative_error,
                            torch_activation_backward)
from support import MpgemmCalls, assert_compiled_grads_equal_eager

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
H, BF = torch.float16, torch.bfloat16
# As tests/ops/test_autograd.py's: dL/dz is rounded to the product's type,
# and 16-bit gradients once more on output.
GRAD_TOLERANCE = {H: 5e-3, BF: 2e-2}
SWITCH = "MPGEMM_EPILOGUE_ACTIVATION_GRAD"
ACTIVATIONS = list(TORCH_ACTIVATIONS)


def mlp_inputs(device, x_shape, hidden, out_features, dtype, w_dtype=None, biases=True):
    """x, w1, b1, w2, b2 requiring gradients; weights scaled as nn.Linear's."""
    x = torch.randn(x_shape, device=device).to(dtype).requires_grad_()
    w1 = (torch.randn(hidden, x_shape[-1], device=device) / x_shape[-1] ** 0.5).to(w_dtype or dtype)
    w2 = (torch.randn(out_features, hidden, device=device) / hidden ** 0.5).to(w_dtype or dtype)
    b1 = torch.randn(hidden, device=device).requires_grad_() if biases else None
    b2 = torch.randn(out_features, device=device).requires_grad_() if biases else None
    return x, w1.requires_grad_(), b1, w2.requires_grad_(), b2


def float64_mlp_grads(inputs, activation, grad_out, product):
    """The gradients of float64 autograd on the inputs as the products see
    them (rounded to `product`), biases as given."""
    x, w1, b1, w2, b2 = inputs
    x64, w164, w264 = (t.detach().to(product).double().requires_grad_() for t in (x, w1, w2))
    b64 = [b.detach().double().requires_grad_() if b is not None else None for b in (b1, b2)]
    y = F.linear(TORCH_ACTIVATIONS[activation](F.linear(x64, w164, b64[0])), w264, b64[1])
    y.backward(grad_out.double())
    return [t.grad if t is not None else None for t in (x64, w164, b64[0], w264, b64[1])]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype, w_dtype", [(H, H), (BF, BF), (torch.float32, BF), (torch.float32, "fp32, bf16")])
def test_forward_is_the_two_linears_bit_for_bit(device, activation, dtype, w_dtype):
    """y is linear(h, w2, b2) of the hidden activation h that linear (or, the
    tanh form, linear then torch's gelu) gives, in the block's one product
    type: bf16 where any of x, w1, w2 is, so that an fp32 w1 beside a bf16
    w2 is rounded to bf16 for its product too."""
    w_dtype, w2_dtype = (torch.float32, BF) if w_dtype == "fp32, bf16" else (w_dtype, w_dtype)
    x, w1, b1, w2, b2 = (t.detach() for t in mlp_inputs(device, (3, 11, 40), 72, 24, dtype, w_dtype))
    w2 = w2.to(w2_dtype)
    product = BF if BF in (dtype, w_dtype, w2_dtype) else H
    y = mpgemm.mlp(x, w1, b1, w2, b2, activation=activation)
    if w1.dtype == torch.float32 and x.dtype == torch.float32:
        w1 = w1.to(product)
    if activation == "gelu_tanh":
        h = F.gelu(mpgemm.linear(x, w1, b1, out_dtype=product), approximate="tanh")
    else:
        h = mpgemm.linear(x, w1, b1, activation=activation, out_dtype=product)
    assert y.dtype == dtype and y.shape == (3, 11, 24)
    assert torch.equal(y, mpgemm.linear(h, w2, b2, out_dtype=dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("x_shape, hidden, out_features, biases", [((33, 40), 72, 24, True),
                                                                   ((2, 9, 24), 40, 17, False)])
@pytest.mark.parametrize("dtype, w_dtype", [(H, H), (BF, BF), (BF, torch.float32), (torch.float32, "fp32, bf16")])
def test_gradients_against_float64(device, activation, x_shape, hidden, out_features, biases, dtype, w_dtype,
                                   monkeypatch):
    """Every input's gradient, with the derivative in the dgrad product and
    without, and with GELU's input from the first product's epilogue and
    from the linear before torch's gelu;
    an fp32 x and w1 beside a bf16 w2 computed in bf16 throughout."""
    w_dtype, w2_dtype = (torch.float32, BF) if w_dtype == "fp32, bf16" else (w_dtype, w_dtype)
    inputs = list(mlp_inputs(device, x_shape, hidden, out_features, dtype, w_dtype, biases))
    inputs[3] = inputs[3].detach().to(w2_dtype).requires_grad_()
    grad_out = torch.randn(*x_shape[:-1], out_features, device=device).to(dtype)
    product = BF if BF in (dtype, w_dtype, w2_dtype) else H
    want = float64_mlp_grads(inputs, activation, grad_out, product)
    wanted = [t for t in inputs if t is not None]
    for switch in ("0", "1"):
        for saved in ("0", "1"):
            monkeypatch.setenv(SWITCH, switch)
            monkeypatch.setenv("MPGEMM_EPILOGUE_PRE_ACTIVATION", saved)
            y = mpgemm.mlp(*inputs, activation=activation)
            got = iter(torch.autograd.grad(y, wanted, grad_out))
            for t, ref in zip(inputs, want):
                if t is None:
                    continue
                g = next(got)
                assert g.dtype == t.dtype and g.shape == t.shape
                assert relative_error(g, ref) < GRAD_TOLERANCE[product], (switch, saved)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("biases", ["b1", "b2"])
@pytest.mark.parametrize("frozen", ["x", "w1", "w2", "x and w1", "first"])
def test_gradients_of_what_requires_them(device, biases, frozen, monkeypatch):
    """One bias given (autograd numbers the edges by the tensors given) and
    some inputs frozen: the gradients of the rest, against float64; none
    asked of the frozen ones (the first linear's products skipped where
    neither x nor w1 nor b1 wants one, and GELU then in the first product's
    epilogue: nothing needs its input; else, by default, kept from the
    first linear and torch's gelu of it)."""
    monkeypatch.setenv(SWITCH, "1")
    x, w1, b1, w2, b2 = mlp_inputs(device, (2, 7, 24), 40, 16, H)
    inputs = [x, w1, b1 if biases == "b1" else None, w2, b2 if biases == "b2" else None]
    for i in {"x": (0,), "w1": (1,), "w2": (3,), "x and w1": (0, 1), "first": (0, 1, 2)}[frozen]:
        if inputs[i] is not None:
            inputs[i] = inputs[i].detach()
    grad_out = torch.randn(2, 7, 16, device=device).to(H)
    want = float64_mlp_grads(inputs, "gelu", grad_out, H)
    wanted = [(t, ref) for t, ref in zip(inputs, want) if t is not None and t.requires_grad]
    with MpgemmCalls() as calls:
        got = torch.autograd.grad(mpgemm.mlp(*inputs), [t for t, _ in wanted], grad_out)
    for g, (t, ref) in zip(got, wanted):
        assert g.shape == t.shape and relative_error(g, ref) < GRAD_TOLERANCE[H]
    first_wanted = any(t is not None and t.requires_grad for t in inputs[:3])  # b1 alone, where x and w1 are frozen
    assert ("_gemm_activation_grad" in calls.ops) == first_wanted
    assert ("gelu" in calls.aten) == first_wanted and "_linear_pre_activation" not in calls.ops


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [H, BF])
def test_activation_grad_op_against_torchs_backward(device, activation, dtype):
    """(a @ b) * activation'(z), rounded once: within a rounding of torch's
    gelu_backward (threshold_backward) of the fp32 product, and near float64,
    with zero and saturated slopes among z."""
    a = random_operand((37, 48), device=device, dtype=dtype)
    b = random_operand((48, 65), device=device, dtype=dtype)
    z = (torch.randn(37, 65, device=device) * 2).to(dtype)
    z[0, :8] = 0  # ReLU's slope at 0 is 0, as torch's
    z[1, :8], z[2, :8] = -6, 6  # GELU's saturated
    got = torch.ops.mpgemm._gemm_activation_grad(a, b, z, activation=activation)
    torch_grad = torch_activation_backward(a.float() @ b.float(), z.float(), activation)
    assert got.dtype == dtype and got.shape == (37, 65)
    ulp = 2 ** -10 if dtype == H else 2 ** -7
    # Saturated tanh (z below about -5) leaves torch's fp32 derivative 0 where ours is about 1e-6: a
    # floor of a ten-thousandth of the largest gradient.
    assert ((got.float() - torch_grad).abs() <= ulp * torch_grad.abs() + 1e-4 * torch_grad.abs().max()).all()
    assert relative_error(got, activation_grad_reference(a, b, z, activation)) < ulp
    if activation == "relu":
        assert torch.equal(got[z <= 0].float(), torch.zeros_like(got[z <= 0].float()))


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x, w1, b1, w2, b2 = (t.detach() for t in mlp_inputs(device, (2, 5, 24), 32, 16, H))
    torch.library.opcheck(torch.ops.mpgemm.mlp.default, (x, w1, b1, w2, b2), {"activation": "gelu"})
    torch.library.opcheck(torch.ops.mpgemm.mlp.default, (x.float(), w1.bfloat16(), None, w2.bfloat16(), b2),
                          {"activation": "relu"})
    a, b = random_operand((10, 24), device=device), random_operand((24, 9), layout="col", device=device)
    z = torch.randn(10, 9, device=device).half()
    torch.library.opcheck(torch.ops.mpgemm._gemm_activation_grad.default, (a, b, z), {"activation": "gelu"})


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("saved", ["1", "0"])
def test_backward_runs_no_activation_pass_with_the_switch(activation, saved, monkeypatch):
    """Counted at the dispatcher: with the switch, backward is four products
    (the second linear's weight gradient, the derivative's product, the
    first linear's two) and torch runs no gelu_backward or
    threshold_backward; without it, a plain product and torch's pass. GELU's
    input comes from the forward (the epilogue's, or the linear's before
    torch's gelu), never from a product again; GELU's tanh form as its erf
    form."""
    monkeypatch.setenv("MPGEMM_EPILOGUE_PRE_ACTIVATION", saved)
    x, w1, b1, w2, b2 = mlp_inputs("cpu", (6, 16), 32, 8, H)
    epilogue_pre_activation = activation != "relu" and saved == "1"
    for switch in ("1", "0"):
        monkeypatch.setenv(SWITCH, switch)
        with MpgemmCalls() as calls:
            y = mpgemm.mlp(x, w1, b1, w2, b2, activation=activation)
        assert calls.ops == ["_linear_pre_activation" if epilogue_pre_activation else "linear", "linear"]
        torch_gelu = activation != "relu" and saved == "0"
        assert ("gelu" in calls.aten) == torch_gelu
        with MpgemmCalls() as calls:
            y.backward(torch.randn_like(y))
        middle = "_gemm_activation_grad" if switch == "1" else "gemm"
        assert calls.ops == ["gemm", middle, "gemm", "gemm"]
        passes = {"gelu_backward", "threshold_backward"} & set(calls.aten)
        assert passes == (set() if switch == "1" else {"threshold_backward" if activation == "relu" else "gelu_backward"})


def test_saves_no_more_than_torch_amp():
    """The tensors of the hidden width that backward keeps: GELU's input and
    output (as torch's gelu and second linear keep them), ReLU's output
    alone (its derivative read off it)."""
    for activation, expected in (("gelu", 2), ("gelu_tanh", 2), ("relu", 1)):
        kept = []
        x, w1, b1, w2, b2 = mlp_inputs("cpu", (6, 16), 32, 8, H)
        with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
            mpgemm.mlp(x, w1, b1, w2, b2, activation=activation)
        hidden = {t.data_ptr() for t in kept if t.shape[-1:] == (32,) and t.shape[0] == 6}
        assert len(hidden) <= expected, activation


def test_errors():
    x, w1, b1, w2, b2 = (t.detach() for t in mlp_inputs("cpu", (4, 16), 32, 8, H))
    with pytest.raises(ValueError, match="mpgemm.mlp: activation must be 'relu', 'gelu' or 'gelu_tanh', got 'tanh'"):
        mpgemm.mlp(x, w1, b1, w2, b2, activation="tanh")
    with pytest.raises(ValueError, match=r"w2.shape\[1\] must equal w1.shape\[0\]"):
        mpgemm.mlp(x, w1, b1, w2[:, :31], b2)
    with pytest.raises(ValueError, match=r"x.shape\[-1\] must equal w1.shape\[1\]"):
        mpgemm.mlp(x[:, :15], w1, b1, w2, b2)
    with pytest.raises(TypeError, match="mpgemm.mlp: x is torch.float16 but w2 is torch.bfloat16"):
        mpgemm.mlp(x, w1, b1, w2.bfloat16(), b2)
    with pytest.raises(ValueError, match=r"mpgemm.mlp: expected b2 of shape \(w2.shape\[0\],\) = \(8,\), got shape"):
        mpgemm.mlp(x, w1, b1, w2, b2[:7])
    with pytest.raises(TypeError, match="mpgemm.mlp: expected b1 to be torch.float16, torch.bfloat16 or torch.float32"):
        mpgemm.mlp(x, w1, b1.double(), w2, b2)
    with pytest.raises(ValueError, match="mpgemm.mlp: expected w1 to be 2-D"):
        mpgemm.mlp(x, w1[None], b1, w2, b2)
    a, b, z = x, w1.t(), torch.zeros(4, 32).half()
    op = torch.ops.mpgemm._gemm_activation_grad
    with pytest.raises(ValueError, match=r"activation_input of shape \(M, N\) = \(4, 32\), got shape \(4, 31\)"):
        op(a, b, z[:, :31], activation="gelu")
    with pytest.raises(TypeError, match="expected activation_input to have a's dtype"):
        op(a, b, z.bfloat16(), activation="gelu")
    with pytest.raises(ValueError, match="activation must be 'relu', 'gelu' or 'gelu_tanh', got 'elu'"):
        op(a, b, z, activation="elu")
    with pytest.raises(ValueError, match="mpgemm.linear: activation must be None, 'relu' or 'gelu', got 'gelu_tanh'"):
        mpgemm.linear(x, w1, b1, activation="gelu_tanh")


@pytest.mark.parametrize("value", ["yes", "2"])
def test_a_bad_switch_is_refused(value, monkeypatch):
    monkeypatch.setenv(SWITCH, value)
    x, w1, b1, w2, b2 = mlp_inputs("cpu", (4, 16), 32, 8, H)
    y = mpgemm.mlp(x, w1, b1, w2, b2)
    with pytest.raises(ValueError, match=f"{SWITCH} must be '0' or '1', got '{value}'"):
        y.sum().backward()


@pytest.mark.parametrize("device", DEVICES)
def test_autocast(device, monkeypatch):
    monkeypatch.setenv(SWITCH, "1")
    x, w1, b1, w2, b2 = (t.detach().float().requires_grad_() for t in mlp_inputs(device, (5, 24), 32, 16, H))
    with torch.autocast(device, dtype=BF):
        y = mpgemm.mlp(x, w1, b1, w2, b2)
    assert y.dtype == BF
    grad_out = torch.randn(5, 16, device=device).to(BF)
    got = torch.autograd.grad(y, (x, w1, b1, w2, b2), grad_out)
    want = float64_mlp_grads((x, w1, b1, w2, b2), "gelu", grad_out, BF)
    for g, ref in zip(got, want):
        assert g.dtype == torch.float32 and relative_error(g, ref) < GRAD_TOLERANCE[BF]


def test_torch_compile_trains(monkeypatch):
    monkeypatch.setenv(SWITCH, "1")
    inputs = mlp_inputs("cpu", (2, 6, 24), 32, 16, BF)

    def block(*args):
        return mpgemm.mlp(*args) * 2.0

    assert_compiled_grads_equal_eager(block, inputs, torch.randn(2, 6, 16).bfloat16())
