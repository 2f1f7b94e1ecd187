"""The ops' Python entry (mpgemm._C.<op>, csrc/op_entry_py.cpp): in eager
mode mpgemm's public ops call it instead of torch.ops.mpgemm.<op>.default,
and it must make the very call torch.ops makes (the same outputs, graph
node and gradients, bit for bit; the same errors; dispatch modes, autocast
and fake tensors reached), or decline with NotImplemented wherever it cannot
prove that, leaving the call to torch.ops (tensor subclasses with a
__torch_function__, torch function modes, arguments of other Python types,
torch.compile's tracing)."""

import threading
import warnings

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

import mpgemm
import mpgemm.ops
from mpgemm import _C
from support import nan_filled_outputs

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
H, BF = torch.float16, torch.bfloat16


def leaf(*shape, device, dtype=H, channels_last=False, scale=1.0):
    t = (torch.randn(*shape, device=device) * scale).to(dtype)
    return (t.to(memory_format=torch.channels_last) if channels_last else t).requires_grad_()


def calls(device):
    """(name, the entry's positional arguments, torch.ops's call of the same
    op as (args, kwargs)), fresh random tensors each; every schema argument
    kind of each entry, None and given."""
    x, w, b = leaf(3, 5, 24, device=device), leaf(16, 24, device=device), leaf(16, device=device, dtype=torch.float32)
    xb, wb = leaf(7, 32, device=device, dtype=BF), leaf(8, 32, device=device, dtype=BF)
    w1, b1, w2 = leaf(32, 24, device=device, scale=0.3), leaf(32, device=device), leaf(24, 32, device=device, scale=0.3)
    gate, up, down = (leaf(*s, device=device, scale=0.3) for s in ((32, 24), (32, 24), (24, 32)))
    image = leaf(2, 16, 7, 9, device=device, channels_last=True)
    filters = leaf(8, 16, 3, 3, device=device, channels_last=True, scale=0.2)
    grouped = leaf(12, 4, 3, 1, device=device, scale=0.2)
    plain_image = leaf(2, 16, 7, 9, device=device)
    norm_w, norm_b = leaf(24, device=device, dtype=torch.float32), leaf(24, device=device, dtype=torch.float32)
    ops = torch.ops.mpgemm
    return [
        ("gemm", (x[0], w.t(), None, None, torch.float32),
         (ops.gemm.default, (x[0], w.t(), None), {"out_dtype": torch.float32})),
        ("gemm bias gelu fp16 out", (x, w.t(), b, "gelu", H),
         (ops.gemm.default, (x, w.t(), b), {"activation": "gelu", "out_dtype": H})),
        ("linear", (x, w, b, None, None), (ops.linear.default, (x, w, b), {})),
        ("linear relu fp32 out", (x, w, None, "relu", torch.float32),
         (ops.linear.default, (x, w, None), {"activation": "relu", "out_dtype": torch.float32})),
        ("linear bf16 gelu", (xb, wb, None, "gelu", None),
         (ops.linear.default, (xb, wb, None), {"activation": "gelu"})),
        ("mlp", (x, w1, b1, w2, None, "gelu_tanh"),
         (ops.mlp.default, (x, w1, b1, w2, None), {"activation": "gelu_tanh"})),
        ("gated_mlp", (x, gate, None, up, None, down, None, "silu"),
         (ops.gated_mlp.default, (x, gate, None, up, None, down, None), {"activation": "silu"})),
        ("layer_norm", (x, (24,), norm_w, norm_b, 1e-5), (ops.layer_norm.default, (x, [24], norm_w, norm_b, 1e-5), {})),
        ("layer_norm list, int eps, no weights", (x, [5, 24], None, None, 1),
         (ops.layer_norm.default, (x, [5, 24], None, None, 1.0), {})),
        ("conv2d", (image, filters, None, (1, 1), (1, 1, 1, 1), (1, 1), 1, None),
         (ops.conv2d.default, (image, filters, None, [1, 1], [1, 1, 1, 1], [1, 1], 1), {})),
        ("conv2d strided grouped nchw fp32 out", (plain_image, grouped, b[:12], [2, 1], [0, 1, 1, 0], [1, 2], 4,
                                                  torch.float32),
         (ops.conv2d.default, (plain_image, grouped, b[:12], [2, 1], [0, 1, 1, 0], [1, 2], 4),
          {"out_dtype": torch.float32})),
    ]


def leaves_of(args):
    """The leaf tensors behind args (a view's base), each once."""
    leaves = {}
    for a in args:
        if isinstance(a, torch.Tensor):
            root = a if a._base is None else a._base
            leaves[id(root)] = root
    assert all(t.is_leaf and t.requires_grad for t in leaves.values())
    return list(leaves.values())


def result_and_grads(run, args):
    for t in leaves_of(args):
        t.grad = None
    with nan_filled_outputs():
        y = run()
    grad = torch.randn(y.shape, device=y.device).to(y.dtype)
    y.backward(grad)
    return y, type(y.grad_fn).__name__, [t.grad.clone() for t in leaves_of(args)], grad


@pytest.mark.parametrize("device", DEVICES)
def test_entry_makes_the_torch_ops_call(device):
    torch.manual_seed(7)
    for name, entry_args, (op, args, kwargs) in calls(device):
        entry = getattr(_C, name.split()[0])
        y, node, grads, grad = result_and_grads(lambda: entry(*entry_args), entry_args)
        assert isinstance(y, torch.Tensor), name  # taken, not declined
        for t in leaves_of(args):
            t.grad = None
        want = op(*args, **kwargs)
        want.backward(grad)
        assert node == type(want.grad_fn).__name__, name
        assert (y.dtype, y.shape, y.stride()) == (want.dtype, want.shape, want.stride()), name
        assert torch.equal(y, want), name
        for got, expected in zip(grads, [t.grad for t in leaves_of(args)]):
            assert torch.equal(got, expected), name


class CountingEntries:
    """mpgemm._C seen by mpgemm.ops, counting the calls of each entry."""

    def __init__(self, decline=False):
        self.calls, self.decline = {}, decline

    def __getattr__(self, name):
        def entry(*args):
            self.calls[name] = self.calls.get(name, 0) + 1
            return NotImplemented if self.decline else getattr(_C, name)(*args)
        return entry


def public_calls(device):
    x, w, b = leaf(4, 24, device=device), leaf(16, 24, device=device), leaf(16, device=device)
    image, filters = leaf(1, 8, 6, 6, device=device, channels_last=True), leaf(8, 8, 3, 3, device=device)
    return {
        "gemm": lambda: mpgemm.gemm(x, w.t(), bias=b, activation="relu"),
        "linear": lambda: mpgemm.linear(x, w, b, out_dtype=torch.float32),
        "mlp": lambda: mpgemm.mlp(x, w, b, w.t().contiguous(), None, activation="relu"),
        "gated_mlp": lambda: mpgemm.gated_mlp(x, w, None, w, None, w.t().contiguous(), None),
        "layer_norm": lambda: mpgemm.layer_norm(x, 24),
        "conv2d": lambda: mpgemm.conv2d(image, filters, stride=(2, 1), padding="valid"),
    }


@pytest.mark.parametrize("device", DEVICES)
def test_public_ops_take_the_entry_and_fall_back_where_it_declines(device, monkeypatch):
    torch.manual_seed(8)
    for name, run in public_calls(device).items():
        monkeypatch.setattr(mpgemm.ops, "_C", CountingEntries())
        y = run()
        assert mpgemm.ops._C.calls == {name: 1}, name
        monkeypatch.setattr(mpgemm.ops, "_C", CountingEntries(decline=True))
        assert torch.equal(run(), y), name  # torch.ops's call, the same bits
        assert mpgemm.ops._C.calls == {name: 1}, name


class Shape(tuple):
    """A tuple subclass, which torch.ops reads through its own protocol."""


class Logged(torch.Tensor):
    """A subclass with a __torch_function__ of its own."""
    seen = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.seen.append(func)
        return super().__torch_function__(func, types, args, kwargs or {})


class Logging:
    """A mode that notes each function it is handed, then calls it."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def run(self, func, args, kwargs):
        self.seen.append(func)
        return func(*args, **(kwargs or {}))


class LoggingMode(Logging, TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return self.run(func, args, kwargs)


class DispatchLog(Logging, TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self.run(func, args, kwargs)


def test_entry_declines_what_only_torch_ops_may_take():
    torch.manual_seed(9)
    x, w = leaf(4, 24, device="cpu"), leaf(16, 24, device="cpu")
    image, filters = leaf(1, 8, 6, 6, device="cpu"), leaf(8, 8, 3, 3, device="cpu")
    geometry = ((1, 1), (1, 1, 1, 1), (1, 1))
    declined = {
        "a subclass with __torch_function__": lambda: _C.linear(x.as_subclass(Logged), w, None, None, None),
        "a subclass as the bias": lambda: _C.linear(x, w, torch.zeros(16, dtype=H).as_subclass(Logged), None, None),
        "a numpy int in a list": lambda: _C.conv2d(image, filters, None, (np.int64(1), 1), *geometry[1:], 1, None),
        "a bool as groups": lambda: _C.conv2d(image, filters, None, *geometry, True, None),
        "a float in a list": lambda: _C.conv2d(image, filters, None, (1.0, 1), *geometry[1:], 1, None),
        "an int too large": lambda: _C.conv2d(image, filters, None, (2**64, 1), *geometry[1:], 1, None),
        "a list as x": lambda: _C.linear([[1.0]], w, None, None, None),
        "a str as out_dtype": lambda: _C.linear(x, w, None, None, "float32"),
        "bytes as activation": lambda: _C.linear(x, w, None, b"relu", None),
        "a str as eps": lambda: _C.layer_norm(x, (24,), None, None, "1e-5"),
        "a set as normalized_shape": lambda: _C.layer_norm(x, {24}, None, None, 1e-5),
        "a tuple subclass as normalized_shape": lambda: _C.layer_norm(x, Shape((24,)), None, None, 1e-5),
        "too few arguments": lambda: _C.linear(x, w, None, None),
        "too many arguments": lambda: _C.linear(x, w, None, None, None, None),
    }
    for reason, call in declined.items():
        assert call() is NotImplemented, reason
    with LoggingMode():
        assert _C.linear(x, w, None, None, None) is NotImplemented
    with torch._C.DisableTorchFunctionSubclass():  # torch.ops then takes the subclass as a tensor
        assert _C.linear(x.as_subclass(Logged), w, None, None, None) is NotImplemented
        assert type(mpgemm.linear(x.as_subclass(Logged), w)) is torch.Tensor
    # torch.Size is taken, as is a plain tuple.
    assert isinstance(_C.layer_norm(x, x.shape[-1:], None, None, 1e-5), torch.Tensor)
    # nn.Parameter disables __torch_function__: taken.
    assert isinstance(_C.linear(x, torch.nn.Parameter(w.detach()), None, None, None), torch.Tensor)


def test_subclasses_and_modes_still_see_the_op():
    torch.manual_seed(10)
    x, w = leaf(4, 24, device="cpu"), leaf(16, 24, device="cpu")
    Logged.seen.clear()
    y = mpgemm.linear(x.as_subclass(Logged), w)
    assert type(y) is Logged and torch.ops.mpgemm.linear.default in Logged.seen
    assert torch.equal(y.as_subclass(torch.Tensor), mpgemm.linear(x, w))
    with LoggingMode() as mode:
        mpgemm.conv2d(leaf(1, 8, 5, 5, device="cpu"), leaf(8, 8, 1, 1, device="cpu"))
    assert torch.ops.mpgemm.conv2d.default in mode.seen


def test_the_entrys_call_goes_through_the_dispatcher():
    torch.manual_seed(11)
    x, w = leaf(4, 24, device="cpu"), leaf(16, 24, device="cpu")
    with DispatchLog() as log:
        y = _C.linear(x, w, None, None, None)
    assert isinstance(y, torch.Tensor) and torch.ops.mpgemm.linear.default in log.seen
    with torch.autocast("cpu", dtype=BF):  # autocast's kernel casts fp32 arguments first
        y = _C.linear(torch.randn(4, 24), torch.randn(16, 24), None, None, None)
    assert y.dtype == BF
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        fake = _C.conv2d(torch.empty(2, 8, 9, 9, dtype=H), torch.empty(4, 8, 3, 3, dtype=H), None, (2, 2),
                         (1, 1, 1, 1), (1, 1), 1, None)
    assert fake.shape == (2, 4, 5, 5)
    with warnings.catch_warnings():  # torch.jit.trace is deprecated, and still traces
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(lambda a, b: mpgemm.linear(a, b), (x.detach(), w.detach()))
    assert "mpgemm::linear" in str(traced.graph)
    other = torch.randn(4, 24, dtype=H)
    assert torch.equal(traced(other, w.detach()), mpgemm.linear(other, w.detach()))


def test_errors_are_torch_ops_errors():
    x, w = torch.randn(4, 24, dtype=H), torch.randn(16, 25, dtype=H)
    bad = [
        ((x, w, None, None, None), (x, w, None), {}),
        ((x, w.T, None, "tanh", None), (x, w.T, None), {"activation": "tanh"}),
        ((x.float(), w, None, None, torch.int32), (x.float(), w, None), {"out_dtype": torch.int32}),
    ]
    for entry_args, args, kwargs in bad:
        with pytest.raises(Exception) as from_ops:
            torch.ops.mpgemm.linear.default(*args, **kwargs)
        with pytest.raises(from_ops.type) as from_entry:
            _C.linear(*entry_args)
        assert str(from_entry.value) == str(from_ops.value)


def test_torch_compile_traces_the_op():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm

    def layer(x, w, image, filters):
        return mpgemm.linear(x, w, activation="relu").sum() + mpgemm.conv2d(image, filters, padding=1).sum()

    torch.manual_seed(12)
    inputs = (torch.randn(4, 24, dtype=H), torch.randn(16, 24, dtype=H), torch.randn(1, 8, 6, 6, dtype=H),
              torch.randn(8, 8, 3, 3, dtype=H))
    out = torch.compile(layer, fullgraph=True, backend=backend)(*inputs)
    targets = {node.target for node in graphs[0].graph.nodes if node.op == "call_function"}
    assert {torch.ops.mpgemm.linear.default, torch.ops.mpgemm.conv2d.default} <= targets
    assert torch.equal(out, layer(*inputs))


def test_threads_calling_at_once_get_their_own_results():
    torch.manual_seed(13)
    inputs = [(torch.randn(64, 96, dtype=H), torch.randn(48, 96, dtype=H)) for _ in range(4)]
    want = [torch.ops.mpgemm.linear.default(x, w, None) for x, w in inputs]
    got = [None] * len(inputs)

    def run(i):
        for _ in range(50):
            got[i] = mpgemm.linear(*inputs[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(g, w) for g, w in zip(got, want))
