"""What the tests share besides fixtures: the repository's root, the run's
random seed, the rule for checks that need nvcc (a skip, or under
MPGEMM_REQUIRE_NVCC=1, as CI sets, a failure), a record of the mpgemm ops
that run, the CUDA work a call launches, outputs that start as NaN, the
check that a compiled layer's gradients are eager's, and the training runs
that mpgemm.fuse's tests compare."""

import contextlib
import copy
import os
import random
import warnings

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import mpgemm
from mpgemm.testing import relative_error

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Fresh inputs every run; the seed is printed so a failure can be replayed
# with MPGEMM_TEST_SEED=<seed>.
SEED = int(os.environ.get("MPGEMM_TEST_SEED", random.SystemRandom().randrange(2**31)))


def require_nvcc():
    """True when the nvcc-based checks must run rather than skip (CI sets it)."""
    return os.environ.get("MPGEMM_REQUIRE_NVCC") == "1"


def skip_or_fail(reason):
    if require_nvcc():
        pytest.fail(f"{reason} (MPGEMM_REQUIRE_NVCC=1 makes this a failure)")
    pytest.skip(reason)


def set_environment(monkeypatch, name, value):
    """`name` set to `value` for the test, or unset where value is None (its
    default)."""
    if value is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, value)


def launches(fn):
    """The names of the CUDA kernels (and copies and memsets) fn launches, once a launch (torch.profiler)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [event.name for event in prof.events() if event.device_type == torch.autograd.DeviceType.CUDA]


@contextlib.contextmanager
def nan_filled_outputs():
    """Inside, every new tensor's memory starts as NaN (torch's deterministic
    mode fills what at::empty hands out, whichever block the caching
    allocator picks), an op's outputs among them: an element its kernels do
    not write stays NaN. mpgemm's kernels and plans do not depend on the mode."""
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    fill = torch.utils.deterministic.fill_uninitialized_memory
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = fill


def assert_compiled_grads_equal_eager(layer, inputs, grad_out):
    """`layer(*inputs)`'s gradients as torch.compile traces it (fullgraph,
    aot_eager: the ops and their autograd as traced, no codegen) bitwise
    equal to eager's."""
    eager = torch.autograd.grad(layer(*inputs), inputs, grad_out)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    traced = torch.autograd.grad(compiled(*inputs), inputs, grad_out)
    for got, want in zip(traced, eager):
        assert torch.equal(got, want)


class MpgemmCalls(TorchDispatchMode):
    """The mpgemm ops called at the dispatcher inside the block, in order:
    `calls` holds each one's name and its tensor arguments' dtypes, `ops` the
    names alone; `aten` the names of torch's own ops called beside them (not
    those the ops call inside)."""

    def __init__(self):
        super().__init__()
        self.calls = []
        self.aten = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if func.namespace == "mpgemm":
            self.calls.append((name, [a.dtype for a in args if isinstance(a, torch.Tensor)]))
        elif func.namespace == "aten":
            self.aten.append(name)
        return func(*args, **(kwargs or {}))

    @property
    def ops(self):
        return [name for name, _ in self.calls]


def output_of(model, *args, **kwargs):
    """A model's output tensor: transformers' logits, or the output itself."""
    out = model(*args, **kwargs)
    return out.logits if hasattr(out, "logits") else out


def node_names(tensor):
    """The autograd nodes that made `tensor`, by name, back to its leaves."""
    seen, todo = set(), [tensor.grad_fn]
    while todo:
        node = todo.pop()
        if node is not None and node not in seen:
            seen.add(node)
            todo += [n for n, _ in node.next_functions]
    return " ".join(sorted({node.name() for node in seen}))


def train_fused_prepared_and_fp32(base, batches, loss_of, dtype, fuse_first, check_fused_loss=None):
    """{way: (model, losses)}: copies of `base` trained with SGD on the same
    batches in fp32, under mpgemm.amp.prepare(dtype) unfused, and prepared
    and fused on the first batch (mpgemm.fuse before prepare() where
    `fuse_first`, else after it, refusing nothing). `loss_of(model, batch)`
    gives a step's loss; `check_fused_loss(loss)` looks at the fused way's."""
    runs = {}
    for way in ("fused", "prepared", "fp32"):
        model = copy.deepcopy(base)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        if way == "fused" and fuse_first:
            mpgemm.fuse(model, batches[0])
        scaler = None
        if way != "fp32":
            model, optimizer, scaler = mpgemm.amp.prepare(model, optimizer, dtype=dtype, init_scale=2.0**10)
        if way == "fused" and not fuse_first:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                mpgemm.fuse(model, batches[0])
        losses = []
        for batch in batches:
            loss = loss_of(model, batch)
            if way == "fused" and check_fused_loss is not None:
                check_fused_loss(loss)
            (scaler.scale(loss) if scaler else loss).backward()
            (scaler.step if scaler else lambda o: o.step())(optimizer)
            if scaler:
                scaler.update()
            optimizer.zero_grad()
            losses.append(loss.item())
        runs[way] = model, torch.tensor(losses)
    return runs


def assert_fused_within_prepared_deviation(runs):
    """The fused way deviates from fp32 no more than the unfused 16-bit way
    does, with room for rounding."""
    fp32 = runs["fp32"][1]
    deviation = (runs["prepared"][1] - fp32).abs().max()
    assert (runs["fused"][1] - fp32).abs().max() <= 2 * deviation + 1e-2 * fp32.abs().max()


def assert_compiled_fused_trains_as_unfused(model, x, fused_op, rtol, atol):
    """A converted model fused on x and compiled (fullgraph, aot_eager)
    calls the fused op (`fused_op`, e.g. "mpgemm.mlp", in the graph dynamo
    traced) and computes what the unfused one does, and its gradients: the
    converted layers round their operands to 16 bits, so a last-bit
    difference upstream may round one element the other way."""
    from torch._dynamo.backends.registry import lookup_backend

    reference = copy.deepcopy(model)
    mpgemm.fuse(model, x)
    traced = []

    def backend(graph_module, example_inputs):
        traced.extend(str(node.target) for m in graph_module.modules() if isinstance(m, torch.fx.GraphModule)
                      for node in m.graph.nodes)
        return lookup_backend("aot_eager")(graph_module, example_inputs)

    compiled = torch.compile(model, backend=backend, fullgraph=True)
    out, ref = compiled(x), reference(x)
    assert any(fused_op in target for target in traced), sorted(set(traced))
    out.sum().backward()
    ref.sum().backward()
    torch.testing.assert_close(out, ref, rtol=rtol, atol=atol)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert relative_error(p.grad, q.grad) < 1e-2
