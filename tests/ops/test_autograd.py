"""Gradients of mpgemm.linear and mpgemm.gemm against float64 autograd on the
same 16-bit values (fp16 or bf16), on every available backend."""

import pytest
import torch
import torch.nn.functional as F

import mpgemm
from mpgemm.testing import TOLERANCE, random_operand
from support import MpgemmCalls

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# dL/dz is rounded to the product's type for the Tensor Core products (2**-11
# for fp16, 2**-9 for bf16), and 16-bit gradients are rounded once more on output.
GRAD_TOLERANCE = {torch.float16: 5e-3, torch.bfloat16: 2e-2}
ACTIVATIONS = {None: lambda t: t, "relu": torch.relu, "gelu": F.gelu}
H, BF = torch.float16, torch.bfloat16

# GELU below about z = -5 is 0.5·z·(1 + erf(z/√2)) with 1 + erf cancelling in
# fp32 (in torch's fp32 GELU as in ours, to the bit): its value and its
# derivative there carry an absolute error of about fp32's epsilon (of z, of
# 1), which a lone output in that tail shows as a relative error near 1.
FP32_EPS = torch.finfo(torch.float32).eps


def product_dtype(*tensors):
    return BF if any(t.dtype == BF for t in tensors) else H


def float64_leaf(t, product=H):
    """The 16-bit value the kernels see, as a float64 leaf."""
    return t.detach().to(product).double().requires_grad_()


def assert_grads_close(tensors, references, product=H, floors=None):
    """Each gradient within GRAD_TOLERANCE of its float64 reference's norm,
    plus, where floors are given, each gradient's floor (an absolute norm)."""
    for i, (t, ref) in enumerate(zip(tensors, references)):
        assert t.grad is not None
        assert t.grad.dtype == t.dtype, "a gradient must have its input's dtype"
        assert t.grad.shape == t.shape
        floor = 0.0 if floors is None else floors[i]
        err = torch.linalg.vector_norm(t.grad.double() - ref.grad).item()
        norm = torch.linalg.vector_norm(ref.grad).item()
        assert err <= GRAD_TOLERANCE[product] * norm + floor, (
            f"relative error {err / max(norm, 1e-300):.3g} for a {tuple(t.shape)} gradient")


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
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_linear_gradients(device, x_shape, out_features, activation, has_bias, dtype):
    in_features = x_shape[-1]
    x = torch.randn(x_shape, device=device).to(dtype).requires_grad_()
    weight = (torch.randn(out_features, in_features, device=device) / in_features**0.5).to(dtype).requires_grad_()
    bias = torch.randn(out_features, device=device).to(dtype).requires_grad_() if has_bias else None
    grad_out = torch.randn(*x_shape[:-1], out_features, device=device)

    y = mpgemm.linear(x, weight, bias, activation=activation)
    assert y.dtype == dtype
    y.backward(grad_out.to(dtype))

    product = product_dtype(x, weight)
    x64, w64 = float64_leaf(x, product), float64_leaf(weight, product)
    b64 = bias.detach().double().requires_grad_() if has_bias else None
    z64 = F.linear(x64, w64, b64)
    y64 = ACTIVATIONS[activation](z64)
    grad64 = grad_out.to(dtype).to(product).double()
    # Floors for GELU's fp32 tail (FP32_EPS): z for y, for the gradients
    # those of the linear alone (GELU's derivative at most 1.13). And GELU's
    # derivative is taken at z as the forward keeps it, in y's dtype (as
    # torch.amp's gelu keeps its input): off by at most max|gelu''| (0.8)
    # times half a step of z, which the linear's products carry on (bounded
    # with absolute values).
    floors = None
    if activation == "gelu":
        params64 = [x64, w64] + ([b64] if has_bias else [])
        plain = torch.autograd.grad(z64, params64, grad64, retain_graph=True)
        absolute = [t.detach().abs().requires_grad_() for t in params64]
        rounded = torch.autograd.grad(F.linear(*absolute), absolute, (grad64 * z64.detach()).abs())
        eps = torch.finfo(dtype).eps
        floors = [2 * FP32_EPS * torch.linalg.vector_norm(g).item() + 0.4 * eps * torch.linalg.vector_norm(r).item()
                  for g, r in zip(plain, rounded)]
    y64.backward(grad64)
    error = torch.linalg.vector_norm(y.double() - y64.detach()).item()
    y_floor = 0.0 if floors is None else FP32_EPS * torch.linalg.vector_norm(z64.detach()).item()
    tolerance = TOLERANCE[dtype if dtype != torch.float32 else H]
    assert error <= tolerance * torch.linalg.vector_norm(y64.detach()).item() + y_floor
    params = [x, weight] + ([bias] if has_bias else [])
    assert_grads_close(params, [x64, w64] + ([b64] if has_bias else []), product, floors)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("x_dtype, w_dtype", [(H, torch.float32), (BF, torch.float32), (torch.float32, BF)])
def test_linear_mixed_dtypes(device, x_dtype, w_dtype):
    # 16-bit activations with fp32 master weights, or the other way round: each
    # gradient in its input's dtype, the products in the 16-bit one's.
    x = torch.randn(6, 20, device=device).to(x_dtype).requires_grad_()
    weight = torch.randn(11, 20, device=device).to(w_dtype).requires_grad_()
    bias = torch.randn(11, device=device).requires_grad_()
    y = mpgemm.linear(x, weight, bias, activation="gelu", out_dtype=torch.float32)
    assert y.dtype == torch.float32
    grad_out = torch.randn(6, 11, device=device)
    y.backward(grad_out)
    product = product_dtype(x, weight)
    x64, w64, b64 = float64_leaf(x, product), float64_leaf(weight, product), bias.detach().double().requires_grad_()
    F.gelu(F.linear(x64, w64, b64)).backward(grad_out.to(product).double())
    assert_grads_close([x, weight, bias], [x64, w64, b64], product)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "a_shape, b_shape",
    [((7, 12), (12, 9)), ((3, 7, 12), (3, 12, 9)), ((3, 7, 12), (12, 9)), ((7, 12), (4, 12, 9)),
     ((1, 7, 12), (5, 12, 9)), ((5, 7, 12), (1, 12, 9))],
)
@pytest.mark.parametrize("activation", [None, "relu", "gelu"])
@pytest.mark.parametrize("bias_dtype", [None, torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("dtype", [H, BF])
def test_gemm_gradients(device, a_shape, b_shape, activation, bias_dtype, dtype):
    a = random_operand(a_shape, layout="col", device=device, dtype=dtype).requires_grad_()
    b = random_operand(b_shape, device=device, dtype=dtype).requires_grad_()
    n = b_shape[-1]
    bias = None if bias_dtype is None else torch.randn(n, dtype=bias_dtype, device=device).requires_grad_()
    out = mpgemm.gemm(a, b, bias=bias, activation=activation)
    grad_out = torch.randn(out.shape, device=device)
    out.backward(grad_out)

    a64, b64 = float64_leaf(a, dtype), float64_leaf(b, dtype)
    bias64 = None if bias is None else bias.detach().double().requires_grad_()
    ref = torch.matmul(a64, b64) + (0 if bias64 is None else bias64)
    ACTIVATIONS[activation](ref).backward(grad_out.to(dtype).double())
    tensors = [a, b] + ([bias] if bias is not None else [])
    assert_grads_close(tensors, [a64, b64] + ([bias64] if bias is not None else []), dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_only_bias_requires_grad(device):
    a, b = random_operand((4, 8), device=device), random_operand((8, 5), device=device)
    bias = torch.randn(5, device=device, requires_grad=True)
    mpgemm.gemm(a, b, bias=bias, activation="relu").sum().backward()
    z = a.double() @ b.double() + bias.detach().double()
    torch.testing.assert_close(bias.grad.double(), (z > 0).double().sum(0))


@pytest.mark.parametrize("op", ["linear", "gemm"])
@pytest.mark.parametrize("activation, recomputed", [(None, 0), ("relu", 0), ("gelu", 1)])
def test_backward_runs_the_two_gradient_products_and_recomputes_only_gelus_input(op, activation, recomputed,
                                                                                 monkeypatch):
    """With MPGEMM_EPILOGUE_PRE_ACTIVATION=0 (the pre-activation not kept:
    test_pre_activation.py has the default), backward runs dx's and dW's
    products, and one more only for GELU, whose derivative needs the
    pre-activation: ReLU's mask is read off the saved output, as torch's
    relu does. Counted at the dispatcher."""
    monkeypatch.setenv("MPGEMM_EPILOGUE_PRE_ACTIVATION", "0")
    x = torch.randn(6, 16).half().requires_grad_()
    w = torch.randn(8, 16).half().requires_grad_()
    bias = torch.randn(8, requires_grad=True)
    y = (mpgemm.linear(x, w, bias, activation=activation) if op == "linear"
         else mpgemm.gemm(x, w.t(), bias=bias, activation=activation))
    with MpgemmCalls() as products:
        y.backward(torch.randn_like(y))
    assert sorted(products.ops) == sorted(["gemm", "gemm"] + [op] * recomputed), products.ops


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


# The graph a call records: each op sets a node of its own as the output's
# history (csrc/autograd.cpp, csrc/gated_mlp.cpp), as torch's generated code does.
def _recorded_call(op, biases=True):
    """(call, inputs): one call of `op` on fresh 16-bit leaves (fp32
    biases), the inputs in its node's edge order, None for each bias left
    out where not `biases`."""
    def leaf(*shape):
        return torch.randn(*shape).half().requires_grad_()

    def bias(n):
        return torch.randn(n, requires_grad=True) if biases else None

    if op == "conv2d":
        image = torch.randn(2, 8, 5, 5).half().to(memory_format=torch.channels_last).requires_grad_()
        return lambda x, w, b: mpgemm.conv2d(x, w, b, padding=1), (image, leaf(8, 8, 3, 3), bias(8))
    if op == "gemm":
        return lambda x, w, b: mpgemm.gemm(x, w.t(), bias=b, activation="relu"), (leaf(5, 16), leaf(8, 16), bias(8))
    if op == "linear":
        return lambda x, w, b: mpgemm.linear(x, w, b, activation="gelu"), (leaf(5, 16), leaf(8, 16), bias(8))
    if op == "mlp":
        return mpgemm.mlp, (leaf(5, 16), leaf(32, 16), bias(32), leaf(8, 32), bias(8))
    if op == "layer_norm":
        weight = (torch.randn(16) * 0.3 + 1).requires_grad_()
        return lambda x, w, b: mpgemm.layer_norm(x, 16, w, b), (leaf(5, 16), weight, bias(16))
    return mpgemm.gated_mlp, (leaf(5, 16), leaf(32, 16), bias(32), leaf(32, 16), bias(32), leaf(8, 32), bias(8))


NODE_NAMES = {"linear": "MpgemmLinearBackward", "gemm": "MpgemmGemmBackward", "conv2d": "MpgemmConv2dBackward",
              "mlp": "MpgemmMlpBackward", "gated_mlp": "MpgemmGatedMlpBackward",
              "layer_norm": "MpgemmLayerNormBackward"}


@pytest.mark.parametrize("op", NODE_NAMES)
def test_node_is_named_and_links_each_input(op):
    call, inputs = _recorded_call(op)
    y = call(*inputs)
    assert y.grad_fn.name() == NODE_NAMES[op]
    edges = [next_fn for next_fn, _ in y.grad_fn.next_functions]
    # gemm's b is w.t(): its edge goes through the transpose's node to w's.
    if op == "gemm":
        edges[1] = edges[1].next_functions[0][0]
    assert len(edges) == len(inputs) and all(edge.variable is t for edge, t in zip(edges, inputs))
    call, inputs = _recorded_call(op, biases=False)
    assert [fn is None for fn, _ in call(*inputs).grad_fn.next_functions] == [t is None for t in inputs]


@pytest.mark.parametrize("op", NODE_NAMES)
def test_saved_tensors_are_released_after_backward_and_kept_with_retain_graph(op):
    call, inputs = _recorded_call(op)
    y = call(*inputs)
    grad = torch.randn_like(y)
    y.backward(grad, retain_graph=True)
    first = [t.grad.clone() for t in inputs]
    for t in inputs:
        t.grad = None
    y.backward(grad)
    for t, g in zip(inputs, first):
        torch.testing.assert_close(t.grad, g, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        y.backward(grad)


def _product(op, x, w, activation):
    if op == "conv2d":
        return mpgemm.conv2d(x, w, padding=1)
    if op == "gemm":
        return mpgemm.gemm(x, w.t(), activation=activation, out_dtype=torch.float16)
    return mpgemm.linear(x, w, activation=activation)


@pytest.mark.parametrize("op, activation, saved", [
    ("linear", None, ["x", "w"]), ("linear", "relu", ["x", "w", "y"]), ("linear", "gelu", ["x", "w", "z"]),
    ("gemm", "gelu", ["x", "w^T", "z"]), ("conv2d", None, ["x", "w"]),
])
def test_saved_tensor_hooks_see_what_backward_needs(op, activation, saved):
    """Saved-tensor hooks (offloading, checkpointing) pack each saved tensor,
    GELU's input z or ReLU's output y besides the operands, and backward
    gives the gradients of the tensors the hooks gave back."""
    if op == "conv2d":
        x, w = torch.randn(2, 8, 4, 4).half().to(memory_format=torch.channels_last), torch.randn(8, 8, 3, 3).half()
    else:
        x, w = torch.randn(5, 16).half(), torch.randn(8, 16).half()
    x.requires_grad_(), w.requires_grad_()
    packed = []

    def pack(t):
        packed.append(t)
        return t.clone()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = _product(op, x, w, activation)
    names = {id(x): "x", id(w): "w", id(y): "y"}
    described = []
    for t in packed:
        if id(t) in names:
            described.append(names[id(t)])
        elif t.shape == w.t().shape and torch.equal(t, w.t()):
            described.append("w^T")
        elif t.shape == y.shape:
            described.append("z")
    assert described == saved
    y.backward(torch.ones_like(y))
    reference_x, reference_w = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    reference = _product(op, reference_x, reference_w, activation)
    reference.backward(torch.ones_like(reference))
    torch.testing.assert_close(x.grad, reference_x.grad, rtol=0, atol=0)
    torch.testing.assert_close(w.grad, reference_w.grad, rtol=0, atol=0)


@pytest.mark.parametrize("op", NODE_NAMES)
def test_an_undefined_output_gradient_gives_none_as_torch_does(op):
    """A consumer whose backward gives y no gradient: the inputs get none,
    as with torch's own ops (F.linear), not zeros."""
    class NoGradient(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.clone()

        @staticmethod
        def backward(ctx, grad):
            return None

    call, inputs = _recorded_call(op)
    NoGradient.apply(call(*inputs)).float().sum().backward()
    assert all(t.grad is None for t in inputs)
    x, w = torch.randn(5, 16, requires_grad=True), torch.randn(8, 16, requires_grad=True)
    NoGradient.apply(F.linear(x, w)).sum().backward()
    assert x.grad is None and w.grad is None


@pytest.mark.parametrize("op", NODE_NAMES)
def test_forward_mode_ad_is_refused(op):
    """As torch refuses it for its ops without a forward derivative, with
    gradients on or off: a dual tensor's tangent is never dropped."""
    import torch.autograd.forward_ad as fwAD

    call, inputs = _recorded_call(op)
    with fwAD.dual_level():
        for grad_mode in (True, False):
            dual = fwAD.make_dual(inputs[0].detach(), torch.ones_like(inputs[0]))
            with torch.set_grad_enabled(grad_mode), pytest.raises(
                    NotImplementedError, match=f"mpgemm.{op}: forward-mode AD is not supported"):
                call(dual, *inputs[1:])


@pytest.mark.parametrize("op", NODE_NAMES)
def test_compiled_autograd_gives_the_eager_gradients(op):
    """torch._dynamo.compiled_autograd runs each node as one opaque call, as
    it runs a C++ autograd Function's: the same gradients, bit for bit, and
    the graph's second run (its cache) too."""
    from torch._dynamo import compiled_autograd

    call, inputs = _recorded_call(op)
    grad = torch.randn_like(call(*inputs))
    call(*inputs).backward(grad)
    eager = [t.grad for t in inputs]
    for _ in range(2):
        for t in inputs:
            t.grad = None
        with compiled_autograd._enable(torch.compile(backend="eager")):
            call(*inputs).backward(grad)
        for t, expected in zip(inputs, eager):
            torch.testing.assert_close(t.grad, expected, rtol=0, atol=0)


@pytest.mark.skipif(not hasattr(torch.autograd.graph, "node_creation_hook"),
                    reason="torch.autograd.graph.node_creation_hook is new in torch 2.15")
@pytest.mark.parametrize("op", NODE_NAMES)
def test_node_creation_hooks_see_each_node_complete(op):
    """torch 2.15's node-creation hooks run for each op's node once its
    edges and saved tensors are in place, as for torch's own ops."""
    call, inputs = _recorded_call(op)
    seen = []
    with torch.autograd.graph.node_creation_hook(lambda node: seen.append((node.name(), len(node.next_functions)))):
        y = call(*inputs)
    assert (NODE_NAMES[op], len(inputs)) in seen and y.grad_fn.name() == NODE_NAMES[op]
