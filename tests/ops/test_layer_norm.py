"""mpgemm.layer_norm (16-bit x, weights in any float type, fp32 arithmetic
from x as it is) and its two internal ops, against float64 autograd and
torch's layer norm as autocast runs it, on every available backend (on CUDA
the kernels of csrc/kernels/norm/layer_norm.cu, their outputs' and
workspace's memory NaN before each call); and a prepared model's LayerNorm
on it where MPGEMM_LAYER_NORM_KERNEL=1."""

import pytest
import torch
import torch.nn.functional as F

import mpgemm
from mpgemm.testing import relative_error
from support import assert_compiled_grads_equal_eager, nan_filled_outputs

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
H, BF = torch.float16, torch.bfloat16
SWITCH = "MPGEMM_LAYER_NORM_KERNEL"
# (x's shape, normalized_shape): 16-byte runs (cols a multiple of 8), runs
# of one element (13, 5 x 6), several runs a lane (768: GPT-2's width), a
# row block's 8 rows left partial, and rows past one slab of the weights'
# sums (600 x 24: three slabs of 256).
SHAPES = [((5, 7, 64), (64,)), ((3, 13), (13,)), ((4, 5, 6), (5, 6)), ((9, 768), (768,)), ((600, 24), (24,)),
          ((2, 1), (1,))]


def layer_inputs(device, shape, normalized_shape, dtype, w_dtype=torch.float32, weight=True, bias=True):
    x = (torch.randn(shape, device=device) * 2 + 0.5).to(dtype)
    w = (torch.randn(normalized_shape, device=device) * 0.3 + 1).to(w_dtype) if weight else None
    b = torch.randn(normalized_shape, device=device).to(w_dtype) if bias else None
    return x, w, b


def within(got, want, rel, atol=1e-6):
    """Off by at most `rel` of want's largest magnitude, or `atol` (a row of
    one element has dx = 0, which float64 gives as 1e-16)."""
    return (got.double().cpu() - want.cpu()).abs().max().item() <= rel * want.abs().max().item() + atol


def float64_reference(x, w, b, normalized_shape, eps, grad):
    """y, dx, dw, db in float64 on the same values."""
    leaves = [None if t is None else t.detach().double().requires_grad_() for t in (x, w, b)]
    y = F.layer_norm(leaves[0], normalized_shape, leaves[1], leaves[2], eps)
    y.backward(grad.double())
    return [y.detach()] + [None if t is None else t.grad for t in leaves]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [H, BF])
@pytest.mark.parametrize("shape, normalized_shape", SHAPES)
@pytest.mark.parametrize("affine", ["weight and bias", "weight", "bias", "none", "bf16 weights"])
def test_against_float64(device, dtype, shape, normalized_shape, affine):
    """y within one rounding of float64's (plus fp32's slack), dx within two
    of the 16-bit type's steps, the weights' gradients (fp32 column sums)
    within fp32's slack of float64's."""
    w_dtype = BF if affine == "bf16 weights" else torch.float32
    x, w, b = layer_inputs(device, shape, normalized_shape, dtype, w_dtype, affine not in ("none", "bias"),
                           affine not in ("none", "weight"))
    leaves = [None if t is None else t.requires_grad_() for t in (x, w, b)]
    grad = torch.randn(shape, device=device).to(dtype)
    with nan_filled_outputs():
        y = mpgemm.layer_norm(x, normalized_shape, w, b, eps=1e-5)
        got = torch.autograd.grad(y, [t for t in leaves if t is not None], grad)
    want = float64_reference(x, w, b, normalized_shape, 1e-5, grad)
    assert y.dtype == dtype and y.shape == x.shape
    eps = torch.finfo(dtype).eps
    assert ((y.double().cpu() - want[0].cpu()).abs() <= want[0].abs().cpu() * eps / 2 + 1e-5).all()
    assert got[0].dtype == dtype and within(got[0], want[1], 2 * eps)
    for g, wanted, leaf in zip(got[1:], [t for t in want[2:] if t is not None], [t for t in (w, b) if t is not None]):
        assert g.dtype == leaf.dtype and g.shape == leaf.shape
        assert within(g, wanted, 1e-5 if leaf.dtype == torch.float32 else torch.finfo(leaf.dtype).eps)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [H, BF])
def test_beside_autocasts_layer_norm(device, dtype):
    """torch.amp's layer norm (fp32 on the widened x, rounded once): within
    one step of the 16-bit type, gradients within two."""
    x, w, b = layer_inputs(device, (33, 96), (96,), dtype)
    ours = [t.clone().requires_grad_() for t in (x, w, b)]
    theirs = [x.float().requires_grad_(), w.clone().requires_grad_(), b.clone().requires_grad_()]
    y = mpgemm.layer_norm(ours[0], 96, ours[1], ours[2])
    expected = F.layer_norm(theirs[0], (96,), theirs[1], theirs[2])
    torch.testing.assert_close(y.float(), expected.to(dtype).float(), rtol=torch.finfo(dtype).eps, atol=1e-5)
    grad = torch.randn(33, 96, device=device).to(dtype)
    y.backward(grad)
    expected.backward(grad.float())
    assert relative_error(ours[0].grad, theirs[0].grad) <= 2 * torch.finfo(dtype).eps
    for a, c in zip(ours[1:], theirs[1:]):
        assert relative_error(a.grad, c.grad) < 1e-5


@pytest.mark.parametrize("device", DEVICES)
def test_misaligned_views_and_every_run_width(device):
    """x one element past a 16-byte boundary takes runs of one element, as
    does a grad that is; results as the aligned copies' within fp32's slack
    (the sums' order differs), and every element written."""
    base = (torch.randn(4 * 64 + 1, device=device)).half()
    x = base[1:].view(4, 64)
    assert x.data_ptr() % 16 != 0
    w, b = torch.randn(64, device=device), torch.randn(64, device=device)
    with nan_filled_outputs():
        y, mean, rstd = torch.ops.mpgemm._layer_norm_forward(x, [64], w, b, 1e-5)
        y_aligned, _, _ = torch.ops.mpgemm._layer_norm_forward(x.clone(), [64], w, b, 1e-5)
        grad = torch.randn(4 * 64 + 1, device=device).half()[1:].view(4, 64)
        dx, dw, db = torch.ops.mpgemm._layer_norm_backward(grad, x, mean, rstd, [64], w, [True, True, True])
        dx_aligned, dw_aligned, db_aligned = torch.ops.mpgemm._layer_norm_backward(
            grad.clone(), x.clone(), mean, rstd, [64], w, [True, True, True])
    for got, want in ((y, y_aligned), (dx, dx_aligned)):
        assert not got.isnan().any()
        torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
    assert torch.equal(dw, dw_aligned) and torch.equal(db, db_aligned)  # column sums: one order either way


@pytest.mark.parametrize("device", DEVICES)
def test_the_same_bits_every_run(device):
    x, w, b = layer_inputs(device, (1100, 40), (40,), BF)
    grad = torch.randn(1100, 40, device=device).bfloat16()
    runs = []
    for _ in range(2):
        y, mean, rstd = torch.ops.mpgemm._layer_norm_forward(x, [40], w, b, 1e-6)
        runs.append([y, mean, rstd, *torch.ops.mpgemm._layer_norm_backward(grad, x, mean, rstd, [40], w,
                                                                            [True, True, True])])
    assert all(torch.equal(a, c) for a, c in zip(*runs))


def offset_view(t, offset, device):
    """t's values on `device`, starting `offset` elements past an allocation."""
    base = torch.empty(t.numel() + offset, dtype=t.dtype, device=device)
    view = base[offset:].view(t.shape)
    view.copy_(t)
    return view


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [H, BF])
@pytest.mark.parametrize("shape, normalized_shape", SHAPES + [((8192, 768), (768,))])
@pytest.mark.parametrize("affine, offset", [("fp32", 0), ("none", 0), ("bf16", 0), ("fp32", 1)])
def test_cuda_equals_the_cpu_backend_bit_for_bit(dtype, shape, normalized_shape, affine, offset):
    """The kernels and the CPU backend compute layer_norm_math.h's functions
    in one order: every result the same bits, with fp32, bf16 or no weights,
    and with tensors one element off a 16-byte boundary on both (runs of one
    element where the columns would allow 16 bytes)."""
    w_dtype = BF if affine == "bf16" else torch.float32
    x, w, b = layer_inputs("cpu", shape, normalized_shape, dtype, w_dtype, affine != "none", affine != "none")
    grad = torch.randn(shape).to(dtype)
    results = []
    for device in ("cpu", "cuda"):
        on = [None if t is None else t.to(device) for t in (w, b)]
        xd, gd = offset_view(x, offset, device), offset_view(grad, offset, device)
        with nan_filled_outputs():
            y, mean, rstd = torch.ops.mpgemm._layer_norm_forward(xd, list(normalized_shape), *on, 1e-5)
            grads = torch.ops.mpgemm._layer_norm_backward(gd, xd, mean, rstd, list(normalized_shape), on[0],
                                                          [True, True, True])
        results.append([t.cpu() for t in (y, mean, rstd, *grads)])
    for name, got, want in zip(("y", "mean", "rstd", "dx", "sum_dy_xhat", "sum_dy"), results[1], results[0]):
        assert torch.equal(got, want), name


@pytest.mark.parametrize("device", DEVICES)
def test_no_rows(device):
    """Rows of none: empty results, and the weights' gradients zeros, as torch's."""
    x, w, b = (t.requires_grad_() for t in layer_inputs(device, (0, 3, 24), (24,), H))
    with nan_filled_outputs():
        y = mpgemm.layer_norm(x, 24, w, b)
        dx, dw, db = torch.autograd.grad(y, (x, w, b), torch.empty_like(y))
    assert y.shape == dx.shape == (0, 3, 24) and torch.equal(dw, torch.zeros_like(w))
    assert torch.equal(db, torch.zeros_like(b))


@pytest.mark.parametrize("frozen", ["x", "weight", "bias", "weights"])
def test_gradients_of_what_requires_them(frozen):
    x, w, b = layer_inputs("cpu", (6, 16), (16,), H)
    leaves = {"x": x, "weight": w, "bias": b}
    for name, t in leaves.items():
        t.requires_grad_(name not in frozen.replace("weights", "weight bias").split())
    y = mpgemm.layer_norm(x, 16, w, b)
    grad = torch.randn(6, 16).half()
    asked = [name for name, t in leaves.items() if t.requires_grad]
    got = torch.autograd.grad(y, [leaves[name] for name in asked], grad)
    want = dict(zip(leaves, float64_reference(x, w, b, (16,), 1e-5, grad)[1:]))
    for g, name in zip(got, asked):
        assert relative_error(g, want[name]) <= 2 * torch.finfo(H).eps


def test_no_graph_without_gradients():
    x, w, b = layer_inputs("cpu", (6, 16), (16,), H)
    with torch.no_grad():
        assert mpgemm.layer_norm(x, 16, w.requires_grad_(), b).grad_fn is None
    y = mpgemm.layer_norm(x, 16, w.detach(), b)
    assert y.grad_fn is None and not y.requires_grad


def test_saves_x_the_weight_and_two_floats_a_row():
    x, w, b = layer_inputs("cpu", (12, 32), (32,), BF)
    x.requires_grad_(), w.requires_grad_(), b.requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        mpgemm.layer_norm(x, 32, w, b)
    assert sorted((tuple(t.shape), t.dtype) for t in saved) == sorted(
        [((12, 32), BF), ((32,), torch.float32), ((12,), torch.float32), ((12,), torch.float32)])


def test_double_backward_raises():
    x, w, b = layer_inputs("cpu", (4, 16), (16,), H)
    x.requires_grad_()
    (grad_x,) = torch.autograd.grad(mpgemm.layer_norm(x, 16, w, b).float().square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="mpgemm.layer_norm: double backward is not supported"):
        grad_x.float().sum().backward()


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x, w, b = layer_inputs(device, (3, 5, 24), (24,), H)
    torch.library.opcheck(torch.ops.mpgemm.layer_norm.default, (x.requires_grad_(), [24], w, b, 1e-5))
    torch.library.opcheck(torch.ops.mpgemm.layer_norm.default, (x.bfloat16(), [5, 24], None, None, 1e-6))
    y, mean, rstd = torch.ops.mpgemm._layer_norm_forward(x.detach(), [24], w, b, 1e-5)
    torch.library.opcheck(torch.ops.mpgemm._layer_norm_forward.default, (x.detach(), [24], w, b, 1e-5))
    for mask in ([True, True, True], [True, False, False], [False, True, True]):
        torch.library.opcheck(torch.ops.mpgemm._layer_norm_backward.default,
                              (torch.randn_like(y), x.detach(), mean, rstd, [24], w, mask))


def test_torch_compile_with_dynamic_shapes():
    torch._dynamo.reset()
    compiled = torch.compile(mpgemm.layer_norm, fullgraph=True, backend="aot_eager", dynamic=True)
    for rows in (6, 11):
        x, w, b = (t.requires_grad_() for t in layer_inputs("cpu", (rows, 24), (24,), H))
        grad = torch.randn(rows, 24).half()
        eager = torch.autograd.grad(mpgemm.layer_norm(x, 24, w, b), (x, w, b), grad)
        traced = torch.autograd.grad(compiled(x, 24, w, b), (x, w, b), grad)
        assert all(torch.equal(got, want) for got, want in zip(traced, eager))


def test_torch_compile_traces_it_as_eager():
    torch._dynamo.reset()
    x, w, b = (t.requires_grad_() for t in layer_inputs("cpu", (2, 6, 24), (24,), BF))
    assert_compiled_grads_equal_eager(lambda *args: mpgemm.layer_norm(args[0], 24, args[1], args[2]) * 2.0,
                                      [x, w, b], torch.randn(2, 6, 24).bfloat16())


@pytest.mark.parametrize("call, error, message", [
    (lambda x, w, b: mpgemm.layer_norm(x.float(), 24, w, b), TypeError,
     r"mpgemm.layer_norm: expected x to be torch.float16 or torch.bfloat16, got torch.float32"),
    (lambda x, w, b: mpgemm.layer_norm(x, 16, w, b), ValueError,
     r"expected x's last dimensions to be \[16\] \(normalized_shape\), got shape \(3, 24\)"),
    (lambda x, w, b: mpgemm.layer_norm(x, [], w, b), ValueError, r"expected normalized_shape of 1 to 2 dimensions"),
    (lambda x, w, b: mpgemm.layer_norm(x, 24, w[:12], b), ValueError,
     r"expected weight of shape \[24\] \(normalized_shape\), got shape \(12,\)"),
    (lambda x, w, b: mpgemm.layer_norm(x, 24, w, b.int()), TypeError, r"expected bias to be torch.float16"),
    (lambda x, w, b: mpgemm.layer_norm(x, 24, w, b, eps=-1.0), ValueError, r"expected eps >= 0, got -1"),
    (lambda x, w, b: mpgemm.layer_norm(x[:, :0], 0, None, None), ValueError,
     r"expected normalized_shape to hold at least one element"),
    (lambda x, w, b: torch.ops.mpgemm._layer_norm_backward(x, x, torch.zeros(2), torch.zeros(3), [24], w,
                                                           [True, True, True]), ValueError,
     r"expected mean of shape \(3,\) \(x's rows\), got shape \(2,\)"),
    (lambda x, w, b: torch.ops.mpgemm._layer_norm_backward(x.bfloat16(), x, torch.zeros(3), torch.zeros(3), [24],
                                                           w, [True, True, True]), TypeError,
     r"expected grad to have x's dtype \(torch.float16\), got torch.bfloat16"),
])
def test_errors(call, error, message):
    x, w, b = layer_inputs("cpu", (3, 24), (24,), H)
    with pytest.raises(error, match=message):
        call(x, w, b)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.gpu
def test_a_weight_on_another_device_is_refused():
    x, w, b = layer_inputs("cuda", (3, 24), (24,), H)
    with pytest.raises(ValueError, match="expected weight on the same device as x"):
        mpgemm.layer_norm(x, 24, w.cpu(), b)


# ---- A prepared model's LayerNorm with the switch --------------------------

def prepared_block(device, dtype):
    torch.manual_seed(0)
    block = torch.nn.Sequential(torch.nn.Linear(32, 48), torch.nn.LayerNorm(48), torch.nn.GELU(),
                                torch.nn.Linear(48, 8)).to(device)
    with torch.no_grad():
        block[1].weight.add_(torch.randn(48, device=device) * 0.2), block[1].bias.normal_()
    model, _, _ = mpgemm.amp.prepare(block, torch.optim.SGD(block.parameters(), lr=0.1), dtype=dtype)
    return model


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [H, BF])
def test_prepared_layer_norm_on_the_op_with_the_switch(device, dtype, monkeypatch):
    """With the switch: the op, and results within the 16-bit type's steps of
    the default way's (torch's fp32 layer norm on the widened input)."""
    x = torch.randn(10, 32, device=device)
    runs = {}
    for switch in ("0", "1"):
        monkeypatch.setenv(SWITCH, switch)
        model = prepared_block(device, dtype)
        out = model(x)
        out.float().square().mean().backward()
        norm_input = model[0](x.to(dtype))
        runs[switch] = (out, model[1].weight.grad, model[1].bias.grad, model[0].weight.grad,
                        type(model[1](norm_input).grad_fn).__name__, model[1](norm_input).grad_fn.name())
    assert runs["1"][5] == "MpgemmLayerNormBackward" and runs["0"][5] != "MpgemmLayerNormBackward"
    eps = torch.finfo(dtype).eps
    for got, want in zip(runs["1"][:4], runs["0"][:4]):
        assert relative_error(got, want) <= 4 * eps


def test_a_bad_switch_is_refused(monkeypatch):
    model = prepared_block("cpu", H)
    monkeypatch.setenv(SWITCH, "yes")
    with pytest.raises(ValueError, match=f"{SWITCH} must be '0' or '1', got 'yes'"):
        model(torch.randn(2, 32))
