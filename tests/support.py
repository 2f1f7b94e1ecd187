"""What the tests share besides fixtures: the repository's root, the run's
random seed, the rule for checks that need nvcc (a skip, or under
MPGEMM_REQUIRE_NVCC=1, as CI sets, a failure), a record of the mpgemm ops
that run, and the check that a compiled layer's gradients are eager's."""

import os
import random

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

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
