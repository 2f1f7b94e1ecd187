"""mpgemm.gated_mlp (a gated MLP: SwiGLU, GeGLU) and the two ops its gating
runs by default (MPGEMM_GATED_KERNEL unset or "1"; "0": torch's activation
and multiply), _gated_activation and
_gated_activation_backward: against float64 autograd and torch's own ops,
on every available backend (on CUDA the kernels of csrc/kernels/gated/,
their outputs' memory NaN before each call)."""

import pytest
import torch
import torch.nn.functional as F

import mpgemm
from mpgemm.testing import GATE_ACTIVATIONS as GATES, gated_reference, relative_error, torch_activation_backward
from support import MpgemmCalls, assert_compiled_grads_equal_eager, nan_filled_outputs, set_environment

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
H, BF = torch.float16, torch.bfloat16
GRAD_TOLERANCE = {H: 5e-3, BF: 2e-2}  # as test_mlp.py's
SWITCH = "MPGEMM_GATED_KERNEL"
ACTIVATIONS = list(GATES)


def gated_inputs(device, x_shape, hidden, out_features, dtype, w_dtype=None, biases=(True, True, True)):
    """x, w_gate, b_gate, w_up, b_up, w_down, b_down requiring gradients;
    weights scaled as nn.Linear's, biases fp32 (b_up in x's dtype)."""
    d = x_shape[-1]
    x = torch.randn(x_shape, device=device).to(dtype).requires_grad_()
    w = [(torch.randn(o, i, device=device) / i ** 0.5).to(w_dtype or dtype).requires_grad_()
         for o, i in ((hidden, d), (hidden, d), (out_features, hidden))]
    b = [torch.randn(n, device=device).to(bias_dtype).requires_grad_() if given else None
         for n, given, bias_dtype in zip((hidden, hidden, out_features), biases, (torch.float32, dtype, torch.float32))]
    return x, w[0], b[0], w[1], b[1], w[2], b[2]


def float64_block(inputs, activation, product):
    """The block in float64 on its inputs as the products see them (rounded
    to `product`; biases as given), and those float64 leaves."""
    leaves = [None if t is None else (t.detach().to(product) if t.dim() == 2 or i == 0 else t.detach()).double()
              .requires_grad_() for i, t in enumerate(inputs)]
    x, wg, bg, wu, bu, wd, bd = leaves
    return F.linear(GATES[activation](F.linear(x, wg, bg)) * F.linear(x, wu, bu), wd, bd), leaves


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype, w_dtype", [(H, H), (BF, BF), (torch.float32, BF), (torch.float32, "fp32, bf16")])
def test_forward_is_the_linears_and_torchs_gating_bit_for_bit(device, activation, dtype, w_dtype, monkeypatch):
    """By default y is linear(act(g) * u) of the linears' g and u with
    torch's activation and multiply, in the block's one product type (bf16
    where any of x and the weights is: an fp32 w_gate and w_up beside a bf16
    w_down rounded to bf16); with the switch, the gating is
    _gated_activation's."""
    w_dtype, down_dtype = (torch.float32, BF) if w_dtype == "fp32, bf16" else (w_dtype, w_dtype)
    x, wg, bg, wu, bu, wd, bd = (None if t is None else t.detach()
                                 for t in gated_inputs(device, (3, 11, 40), 72, 24, dtype, w_dtype))
    wd = wd.to(down_dtype)
    product = BF if BF in (dtype, w_dtype, down_dtype) else H
    weights = [w.to(product) if w.dtype == torch.float32 and x.dtype == torch.float32 else w for w in (wg, wu)]
    g = mpgemm.linear(x, weights[0], bg, out_dtype=product)
    u = mpgemm.linear(x, weights[1], bu, out_dtype=product)
    for switch, p in (("0", GATES[activation](g) * u),
                      ("1", torch.ops.mpgemm._gated_activation(g, u, activation=activation))):
        monkeypatch.setenv(SWITCH, switch)
        y = mpgemm.gated_mlp(x, wg, bg, wu, bu, wd, bd, activation=activation)
        assert y.dtype == dtype and y.shape == (3, 11, 24)
        assert torch.equal(y, mpgemm.linear(p, wd, bd, out_dtype=dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("x_shape, hidden, out_features, biases", [((33, 40), 72, 24, (True, True, True)),
                                                                   ((2, 9, 24), 40, 17, (False, True, False)),
                                                                   ((24,), 40, 17, (True, False, True))])
@pytest.mark.parametrize("dtype, w_dtype", [(H, H), (BF, BF), (torch.float32, BF)])
@pytest.mark.parametrize("switch", ["0", "1"])
def test_gradients_against_float64(device, activation, x_shape, hidden, out_features, biases, dtype, w_dtype, switch,
                                   monkeypatch):
    monkeypatch.setenv(SWITCH, switch)
    inputs = gated_inputs(device, x_shape, hidden, out_features, dtype, w_dtype, biases)
    product = BF if BF in (dtype, w_dtype) else H
    y = mpgemm.gated_mlp(*inputs, activation=activation)
    grad_out = torch.randn_like(y)
    ref, leaves = float64_block(inputs, activation, product)
    ref.backward(grad_out.double())
    assert relative_error(y, ref) < GRAD_TOLERANCE[product]
    given = [t for t in inputs if t is not None]
    for got, t, leaf in zip(torch.autograd.grad(y, given, grad_out), given, [t for t in leaves if t is not None]):
        assert got.dtype == t.dtype and got.shape == t.shape
        assert relative_error(got, leaf.grad) < GRAD_TOLERANCE[product]


@pytest.mark.parametrize("switch", ["0", "1"])
@pytest.mark.parametrize("biases", [(True, False, True), (False, True, False)])
@pytest.mark.parametrize("frozen", ["x", "gate", "up", "down", "weights", "x, gate and up", "all but x",
                                    "all but b_down"])
def test_gradients_of_what_requires_them(switch, biases, frozen, monkeypatch):
    """Each subset: the others' gradients as with all of them (autograd's
    edges counted past the biases given), none for the frozen ones."""
    monkeypatch.setenv(SWITCH, switch)
    inputs = gated_inputs("cpu", (7, 16), 24, 8, H, biases=biases)
    names = ["x", "w_gate", "b_gate", "w_up", "b_up", "w_down", "b_down"]
    if frozen == "all but b_down" and not biases[2]:
        pytest.skip("no b_down")
    frozen_names = {"x": {"x"}, "gate": {"w_gate", "b_gate"}, "up": {"w_up", "b_up"}, "down": {"w_down", "b_down"},
                    "weights": {"w_gate", "w_up", "w_down"}, "x, gate and up": {"x", "w_gate", "b_gate", "w_up"},
                    "all but x": set(names) - {"x"}, "all but b_down": set(names) - {"b_down"}}
    grad_out = torch.randn(7, 8).half()
    y = mpgemm.gated_mlp(*inputs)
    everything = dict(zip([n for n, t in zip(names, inputs) if t is not None],
                          torch.autograd.grad(y, [t for t in inputs if t is not None], grad_out)))
    wanted = [(n, t.detach().requires_grad_(n not in frozen_names[frozen]) if t is not None else None)
              for n, t in zip(names, inputs)]
    y = mpgemm.gated_mlp(*[t for _, t in wanted])
    asked = [(n, t) for n, t in wanted if t is not None and t.requires_grad]
    for (n, _), got in zip(asked, torch.autograd.grad(y, [t for _, t in asked], grad_out)):
        assert torch.equal(got, everything[n]), n


def elementwise_inputs(device, dtype, shape=(37, 29)):
    """dp, g, u with g across the activation's curve, saturated tails and zero included."""
    g = torch.randn(shape, device=device) * 3
    ends = torch.tensor([0.0, -30.0, 30.0, -6.0])
    g.view(-1)[:4] = ends[:g.numel()]
    return [t.to(dtype) for t in (torch.randn(shape, device=device), g, torch.randn(shape, device=device))]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [H, BF])
@pytest.mark.parametrize("shape, misaligned", [((37, 29), False), ((4, 64), True), ((1, 7), False), ((0, 8), False)])
def test_gating_ops_within_one_rounding_of_float64(device, activation, dtype, shape, misaligned):
    """act(g) * u, dg = dp * u * act'(g) and du = dp * act(g), each rounded
    once from float64's value (the kernels' fp32 is off by a few fp32 ulps at
    most), where torch's two or three passes round each step; sizes whose
    16-byte runs leave a tail, and views one element off a 16-byte boundary
    (one element at a time)."""
    count = shape[0] * shape[1] + (1 if misaligned else 0)
    dp, g, u = (t.reshape(-1)[:count][1 if misaligned else 0:].reshape(shape)
                for t in elementwise_inputs(device, dtype, (count,)))
    with nan_filled_outputs():
        p = torch.ops.mpgemm._gated_activation(g, u, activation=activation)
        dg, du, p_again = torch.ops.mpgemm._gated_activation_backward(dp, g, u, activation=activation)
    wants = gated_reference(dp, g, u, activation)
    eps, subnormal = torch.finfo(dtype).eps, torch.finfo(dtype).tiny * torch.finfo(dtype).eps
    fp32 = 8 * torch.finfo(torch.float32).eps
    # fp32's slack: a few of its steps of the result, and for GELU a few of
    # the operands' size: 1 + erf(g / sqrt(2)) (1 + tanh(...) for the tanh
    # form) cancels in fp32 for g < -4, in torch's fp32 GELU too, so that
    # act(g) is off by about |g| fp32 steps, which u (p) and dp (du) scale,
    # and act'(g) by about (1 + |g|), which dp * u (dg) scales.
    dp64, g64, u64 = (t.double().cpu() for t in (dp, g, u))
    tail = (1 + g64.abs()) * (u64.abs() + dp64.abs() + (dp64 * u64).abs()) if activation != "silu" else 0
    for name, got, want in (("p", p, wants["p"]), ("dg", dg, wants["grad_gate"]), ("du", du, wants["grad_up"]),
                            ("p again", p_again, wants["p"])):
        assert got.dtype == dtype and got.shape == shape and got.is_contiguous()
        # One rounding of float64's value: half a step, relative or, below
        # the normal range, of the subnormals'.
        bound = want.abs() * (eps / 2 + fp32) + subnormal / 2 + fp32 * tail
        assert ((got.double().cpu() - want).abs() <= bound).all(), name
    assert torch.equal(p, p_again)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_gating_ops_against_torchs_passes(device, activation):
    """Beside torch's passes in fp16 (each step rounded): within two
    roundings of them."""
    dp, g, u = elementwise_inputs(device, H)
    a = GATES[activation](g)
    want = {"p": a * u, "dg": torch_activation_backward(dp * u, g, activation), "du": dp * a}
    got = dict(zip(("dg", "du", "p"), torch.ops.mpgemm._gated_activation_backward(dp, g, u, activation=activation)))
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=2e-3, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("switch", ["0", "1"])
def test_opcheck(device, switch, monkeypatch):
    """The op with inputs requiring gradients too (its autograd under
    aot_autograd, dynamic shapes included: the gating ops' checks on
    symbolic sizes), and its two gating ops."""
    monkeypatch.setenv(SWITCH, switch)
    torch.library.opcheck(torch.ops.mpgemm.gated_mlp.default, gated_inputs(device, (2, 5, 24), 32, 16, H),
                          {"activation": "silu"})
    inputs = [None if t is None else t.detach() for t in gated_inputs(device, (2, 5, 24), 32, 16, H)]
    torch.library.opcheck(torch.ops.mpgemm.gated_mlp.default, tuple(inputs), {"activation": "silu"})
    x, wg, bg, wu, bu, wd, bd = inputs
    torch.library.opcheck(torch.ops.mpgemm.gated_mlp.default, (x.float(), wg.bfloat16(), None, wu.bfloat16(), bu,
                                                               wd.float(), None), {"activation": "gelu_tanh"})
    dp, g, u = elementwise_inputs(device, BF)
    torch.library.opcheck(torch.ops.mpgemm._gated_activation.default, (g, u), {"activation": "gelu"})
    torch.library.opcheck(torch.ops.mpgemm._gated_activation_backward.default, (dp, g, u), {"activation": "silu"})


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_the_ops_each_way_runs(activation, monkeypatch):
    """Counted at the dispatcher. By default (or "1"): the gating one op each
    way, no torch pass. With "0": three linears beside torch's activation
    and multiply, backward six products beside torch's three passes."""
    inputs = gated_inputs("cpu", (6, 16), 32, 8, H)
    torch_forward = {"silu" if activation == "silu" else "gelu", "mul"}
    torch_backward = {"silu_backward" if activation == "silu" else "gelu_backward", "mul"}
    for switch in ("0", "1", None):
        set_environment(monkeypatch, SWITCH, switch)
        fused = switch != "0"
        with MpgemmCalls() as calls:
            y = mpgemm.gated_mlp(*inputs, activation=activation)
        assert calls.ops == ["linear", "linear"] + (["_gated_activation"] if fused else []) + ["linear"]
        assert (torch_forward <= set(calls.aten)) == (not fused)
        with MpgemmCalls() as calls:
            y.backward(torch.randn_like(y))
        gating = ["_gated_activation_backward"] if fused else []
        assert calls.ops == ["gemm"] + gating + ["gemm"] * 5
        assert (not torch_backward & set(calls.aten)) == fused


@pytest.mark.parametrize("switch, expected", [("0", 4), ("1", 2), (None, 2)])
def test_saves_what_torch_amp_saves_or_half_of_it(switch, expected, monkeypatch):
    """The tensors of the hidden width backward keeps: g and u alone by
    default (or "1"); g, act(g), u and p with "0" (what torch.amp's SiLU,
    multiply and down projection keep)."""
    set_environment(monkeypatch, SWITCH, switch)
    kept = []
    inputs = gated_inputs("cpu", (6, 16), 32, 8, H)
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        mpgemm.gated_mlp(*inputs)
    assert len({t.data_ptr() for t in kept if t.shape == (6, 32)}) == expected


def test_errors(monkeypatch):
    x, wg, bg, wu, bu, wd, bd = (None if t is None else t.detach() for t in gated_inputs("cpu", (4, 16), 32, 8, H))
    op = "mpgemm.gated_mlp"
    cases = [
        ((x, wg, bg, wu, bu, wd, bd), "relu", ValueError, f"{op}: activation must be 'silu', 'gelu' or 'gelu_tanh', "
                                                          "got 'relu'"),
        ((x[:, :15], wg, bg, wu, bu, wd, bd), "silu", ValueError, r"x.shape\[-1\] must equal w_gate.shape\[1\]"),
        ((x, wg, bg, wu[:31], bu, wd, bd), "silu", ValueError, "w_gate has shape .* but w_up has shape .*; expected "
                                                               "the same shape"),
        ((x, wg, bg, wu, bu, wd[:, :31], bd), "silu", ValueError, r"w_down.shape\[1\] must equal w_gate.shape\[0\]"),
        ((x, wg, bg, wu.bfloat16(), bu, wd, bd), "silu", TypeError, f"{op}: x is torch.float16 but w_up is "
                                                                    "torch.bfloat16"),
        ((x.float(), wg, bg, wu.bfloat16(), bu, wd, bd), "silu", TypeError, "w_gate is torch.float16 but w_up is "
                                                                            "torch.bfloat16"),
        ((x, wg, bg, wu, bu[:7], wd, bd), "silu", ValueError, r"expected b_up of shape \(w_up.shape\[0\],\) = \(32,\)"),
        ((x, wg, bg.double(), wu, bu, wd, bd), "silu", TypeError, f"{op}: expected b_gate to be torch.float16"),
        ((x, wg, bg, wu, bu, wd, bd[:3]), "silu", ValueError, r"expected b_down of shape \(w_down.shape\[0\],\)"),
        ((x, wg, bg, wu, bu, wd[None], bd), "silu", ValueError, f"{op}: expected w_down to be 2-D"),
    ]
    for args, activation, error, message in cases:
        with pytest.raises(error, match=message):
            mpgemm.gated_mlp(*args, activation=activation)
    dp, g, u = elementwise_inputs("cpu", H)
    with pytest.raises(ValueError, match=r"_gated_activation: expected up of gate's shape \(37, 29\), got shape"):
        torch.ops.mpgemm._gated_activation(g, u[:, :5], activation="silu")
    with pytest.raises(TypeError, match="_gated_activation_backward: expected gate to have grad's dtype"):
        torch.ops.mpgemm._gated_activation_backward(dp, g.bfloat16(), u, activation="silu")
    with pytest.raises(TypeError, match="expected gate to be torch.float16 or torch.bfloat16, got torch.float32"):
        torch.ops.mpgemm._gated_activation(g.float(), u.float(), activation="silu")
    with pytest.raises(ValueError, match="activation must be 'silu', 'gelu' or 'gelu_tanh', got 'tanh'"):
        torch.ops.mpgemm._gated_activation(g, u, activation="tanh")
    monkeypatch.setenv(SWITCH, "yes")
    with pytest.raises(ValueError, match=f"{SWITCH} must be '0' or '1', got 'yes'"):
        mpgemm.gated_mlp(x, wg, bg, wu, bu, wd, bd)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("switch", ["0", "1"])
def test_autocast(device, switch, monkeypatch):
    monkeypatch.setenv(SWITCH, switch)
    inputs = [None if t is None else t.detach().float().requires_grad_()
              for t in gated_inputs(device, (5, 24), 32, 16, H)]
    with torch.autocast(device, dtype=BF):
        y = mpgemm.gated_mlp(*inputs)
    assert y.dtype == BF
    grad_out = torch.randn(5, 16, device=device).to(BF)
    ref, leaves = float64_block(inputs, "silu", BF)
    ref.backward(grad_out.double())
    for got, leaf in zip(torch.autograd.grad(y, inputs, grad_out), leaves):
        assert got.dtype == torch.float32 and relative_error(got, leaf.grad) < GRAD_TOLERANCE[BF]


def test_double_backward_raises():
    inputs = gated_inputs("cpu", (4, 16), 32, 8, H)
    y = mpgemm.gated_mlp(*inputs)
    (grad_x,) = torch.autograd.grad(y.sum(), inputs[0], create_graph=True)
    with pytest.raises(RuntimeError, match="mpgemm.gated_mlp: double backward is not supported"):
        grad_x.sum().backward()


@pytest.mark.parametrize("switch", ["0", "1"])
def test_torch_compile_with_dynamic_shapes(switch, monkeypatch):
    """Traced once for symbolic shapes, the gating ops' Meta kernels included,
    then run on two sizes: as eager."""
    monkeypatch.setenv(SWITCH, switch)
    torch._dynamo.reset()
    compiled = torch.compile(mpgemm.gated_mlp, fullgraph=True, backend="aot_eager", dynamic=True)
    for rows in (6, 11):
        inputs = gated_inputs("cpu", (rows, 24), 32, 16, H)
        grad_out = torch.randn(rows, 16).half()
        eager = torch.autograd.grad(mpgemm.gated_mlp(*inputs), [t for t in inputs if t is not None], grad_out)
        traced = torch.autograd.grad(compiled(*inputs), [t for t in inputs if t is not None], grad_out)
        for got, want in zip(traced, eager):
            assert torch.equal(got, want)


@pytest.mark.parametrize("switch", ["0", "1"])
def test_torch_compile_trains(switch, monkeypatch):
    """Either way as traced (the switch is read when torch.compile traces:
    dynamo's cache is cleared so that each way is traced anew)."""
    monkeypatch.setenv(SWITCH, switch)
    torch._dynamo.reset()
    inputs = gated_inputs("cpu", (2, 6, 24), 32, 16, BF)

    def block(*args):
        return mpgemm.gated_mlp(*args, activation="gelu_tanh") * 2.0

    assert_compiled_grads_equal_eager(block, inputs, torch.randn(2, 6, 16).bfloat16())
