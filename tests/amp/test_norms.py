"""Norm layers under mpgemm.amp.prepare(): 16-bit activations in and out,
fp32 weights and statistics, fp32 compute, and no fp32 copy of an activation
saved for backward. References: the same layer in fp32 on the same 16-bit
values (what torch.amp computes), float64, and torch's own batch_norm."""

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F

import mpgemm
from mpgemm.amp import norms
from mpgemm.amp.prepare import Fp32Forward
from mpgemm.testing import relative_error

DTYPES = [torch.float16, torch.bfloat16]
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
FLOAT = torch.float32


class FrozenBatchNorm2d(torch.nn.Module):  # torchvision's, in brief: buffers, no parameters
    def __init__(self, n):
        super().__init__()
        for name, value in (("weight", torch.rand(n) + 0.5), ("bias", torch.randn(n)),
                            ("running_mean", torch.randn(n)), ("running_var", torch.rand(n) + 0.5)):
            self.register_buffer(name, value)

    def forward(self, x):
        scale = self.weight * (self.running_var + 1e-5).rsqrt()
        return x * scale.reshape(1, -1, 1, 1) + (self.bias - self.running_mean * scale).reshape(1, -1, 1, 1)


class BatchNormAct2d(torch.nn.BatchNorm2d):  # timm's, in brief: batch_norm, then an activation
    def forward(self, x):
        return F.relu(F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, self.training,
                                   self.momentum, self.eps))


class LayerNormSubclass(torch.nn.LayerNorm):  # keeps torch's forward: computed in fp32 from 16-bit input
    pass


class LayerNormOwnForward(torch.nn.LayerNorm):  # its own forward: an fp32 copy of its input, as before
    def forward(self, x):
        self.input_dtype = x.dtype
        return super().forward(x)


def _randomized(norm):
    with torch.no_grad():
        for p in norm.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if p.dim() and p is getattr(norm, "weight", None) else 0.0))
    return norm


# name: (norm layer, input shape)
NORMS = {
    "BatchNorm1d": (lambda: torch.nn.BatchNorm1d(16), (6, 16)),
    "BatchNorm2d": (lambda: torch.nn.BatchNorm2d(16), (3, 16, 5, 5)),
    "BatchNorm3d": (lambda: torch.nn.BatchNorm3d(16), (2, 16, 3, 3, 3)),
    "SyncBatchNorm": (lambda: torch.nn.SyncBatchNorm(16), (3, 16, 5, 5)),
    "InstanceNorm2d": (lambda: torch.nn.InstanceNorm2d(16, affine=True), (3, 16, 5, 5)),
    "FrozenBatchNorm2d": (lambda: FrozenBatchNorm2d(16), (3, 16, 5, 5)),
    "BatchNormAct2d": (lambda: BatchNormAct2d(16), (3, 16, 5, 5)),
    "LayerNorm": (lambda: torch.nn.LayerNorm(16), (3, 7, 16)),
    "LayerNorm2": (lambda: torch.nn.LayerNorm((5, 16)), (3, 5, 16)),
    "LayerNormNoBias": (lambda: torch.nn.LayerNorm(16, bias=False), (3, 7, 16)),
    "LayerNormSubclass": (lambda: LayerNormSubclass(16), (3, 7, 16)),
    "GroupNorm": (lambda: torch.nn.GroupNorm(4, 16), (3, 16, 5, 5)),
    "GroupNorm3d": (lambda: torch.nn.GroupNorm(2, 16), (3, 16, 9)),
    "RMSNorm": (lambda: torch.nn.RMSNorm(16), (3, 7, 16)),
    "RMSNorm2": (lambda: torch.nn.RMSNorm((5, 16), eps=1e-6), (3, 5, 16)),
    "RMSNormNoWeight": (lambda: torch.nn.RMSNorm(16, elementwise_affine=False), (3, 7, 16)),
}


def _prepared_norm(name, dtype, device="cpu"):
    """The norm layer of a prepared Sequential(norm, Linear), and an input for it."""
    torch.manual_seed(0)
    make, shape = NORMS[name]
    with torch.device(device):
        norm = _randomized(make())
        model = torch.nn.Sequential(norm, torch.nn.Linear(shape[-1], 4))
        x = torch.randn(shape).to(dtype)
    reference = copy.deepcopy(norm)
    mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), dtype=dtype)
    if x.dim() == 4:
        x = x.to(memory_format=torch.channels_last)
    return model[0], reference, x


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", NORMS)
def test_norm_takes_16_bit_input_and_computes_as_in_fp32(name, dtype, device):
    norm, reference, x = _prepared_norm(name, dtype, device)
    assert all(t.dtype == FLOAT for t in [*norm.parameters(), *norm.buffers()] if t.is_floating_point())
    seen = []
    norm.register_forward_pre_hook(lambda module, args: seen.append(args[0].dtype))
    x = x.requires_grad_()
    out = norm(x)
    assert seen == [dtype] and out.dtype == dtype and out.shape == x.shape
    # The reference: the fp32 layer on the same 16-bit values (what autocast
    # computes), rounded to the output's type; gradients in float64.
    x32 = x.detach().float().requires_grad_()
    expected = reference(x32)
    assert relative_error(out.float(), expected.detach()) <= torch.finfo(dtype).eps
    grad = torch.randn(out.shape, device=device).to(dtype)
    out.backward(grad)
    expected.backward(grad.float())
    assert x.grad.dtype == dtype
    assert relative_error(x.grad.float(), x32.grad) <= 2 * torch.finfo(dtype).eps
    # torch's batch_norm on 16-bit input may round its weight gradient's terms
    # to the input's type (its CPU kernel for channels_last bf16 does); the
    # norms mpgemm computes keep them in fp32.
    ours_in_fp32 = isinstance(norm, tuple(forward for _, forward in norms.FP32_FORWARDS))
    for ours, theirs in zip(norm.parameters(), reference.parameters()):
        tolerance = 1e-5 if ours_in_fp32 else torch.finfo(dtype).eps
        assert ours.grad.dtype == FLOAT and relative_error(ours.grad, theirs.grad) < tolerance
    for ours, theirs in zip(norm.buffers(), reference.buffers()):  # running statistics, updated in fp32
        assert ours.dtype == theirs.dtype and torch.allclose(ours.float(), theirs.float(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", NORMS)
def test_norm_saves_no_fp32_copy_of_its_input(name, dtype):
    norm, _, x = _prepared_norm(name, dtype)
    x.requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        norm(x)
    state = {t.data_ptr() for t in [*norm.parameters(), *norm.buffers()]}
    activations = [t for t in saved if t.data_ptr() not in state and t.numel() >= x.numel()]
    # 16-bit activations (the input, a norm-act layer's output, InstanceNorm's
    # NCHW copy of a channels_last input, as torch makes it); besides them,
    # per-channel or per-row statistics.
    assert all(t.dtype == dtype for t in activations), [t.dtype for t in activations]


def test_layer_norm_results_are_autocasts_bit_for_bit():
    """LayerNorm and GroupNorm compute what autocast has them compute: the
    fp32 op on the widened 16-bit input."""
    for name in ("LayerNorm", "GroupNorm"):
        norm, reference, x = _prepared_norm(name, torch.float16)
        x = x.requires_grad_()
        x32 = x.detach().float().requires_grad_()
        out, expected = norm(x), reference(x32)
        assert torch.equal(out, expected.half())
        grad = torch.randn(out.shape).half()
        out.backward(grad)
        expected.backward(grad.float())
        assert torch.equal(x.grad, x32.grad.half())
        assert all(torch.equal(a.grad, b.grad) for a, b in zip(norm.parameters(), reference.parameters()))


def test_rms_norm_against_float64():
    norm, _, x = _prepared_norm("RMSNorm", torch.bfloat16)
    x = x.requires_grad_()
    x64, w64 = x.detach().double().requires_grad_(), norm.weight.detach().double().requires_grad_()
    out = norm(x)
    expected = x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + torch.finfo(FLOAT).eps) * w64
    assert relative_error(out.double(), expected.detach()) <= torch.finfo(torch.bfloat16).eps
    grad = torch.randn(out.shape).bfloat16()
    out.backward(grad)
    expected.backward(grad.double())
    assert relative_error(x.grad.double(), x64.grad) <= 2 * torch.finfo(torch.bfloat16).eps
    assert relative_error(norm.weight.grad.double(), w64.grad) < 1e-5


def test_fp32_input_gives_a_16_bit_output():
    norm, _, x = _prepared_norm("LayerNorm", torch.float16)
    assert norm(x.float()).dtype == torch.float16


class BatchNormOwnForward(torch.nn.BatchNorm1d):
    def forward(self, x):
        self.input_dtype = x.dtype
        return super().forward(x)


def test_norms_with_their_own_forward_or_kept_fp32_get_an_fp32_copy():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), LayerNormOwnForward(8), torch.nn.Linear(8, 8),
                                BatchNormOwnForward(8), torch.nn.Linear(8, 8), torch.nn.LayerNorm(8),
                                torch.nn.Linear(8, 2))
    mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), keep_fp32=["5"])
    seen = []
    model[5].register_forward_pre_hook(lambda module, args: seen.append(args[0].dtype))
    assert model(torch.randn(4, 8)).dtype == FLOAT
    assert model[1].input_dtype == model[3].input_dtype == FLOAT and seen == [FLOAT]
    # torch's forward on the fp32 copy (with autocast off, as keep_fp32 picked it), not mpgemm's.
    assert type(model[1]) is LayerNormOwnForward and not isinstance(model[5], norms.LayerNorm)
    assert isinstance(model[5], Fp32Forward)
    assert model[2].weight.dtype == torch.float16 and model[3].weight.dtype == FLOAT


def test_double_backward_is_right_or_refused():
    """LayerNorm's twice-differentiated gradient is torch's (aten derives its
    backward); GroupNorm's and RMSNorm's backward raise if differentiated."""
    norm, reference, x = _prepared_norm("LayerNorm", torch.float16)
    x = x.requires_grad_()
    x32 = x.detach().float().requires_grad_()
    c, d = torch.randn(x.shape), torch.randn(x.shape)
    for layer, inp in ((norm, x), (reference, x32)):
        (grad,) = torch.autograd.grad((layer(inp).float() * c).sum(), inp, create_graph=True)
        (grad.float() * d).sum().backward()
    assert relative_error(x.grad.float(), x32.grad) <= 4 * torch.finfo(torch.float16).eps
    for name in ("GroupNorm", "RMSNorm"):
        norm, _, x = _prepared_norm(name, torch.float16)
        x = x.requires_grad_()
        (grad,) = torch.autograd.grad(norm(x).float().square().sum(), x, create_graph=True)
        with pytest.raises(RuntimeError, match="once_differentiable"):
            grad.float().sum().backward()


def test_swapped_norm_classes_keep_their_identity_and_pickle():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), LayerNormSubclass(8), torch.nn.Linear(8, 8),
                                torch.nn.GroupNorm(2, 8), torch.nn.Linear(8, 2))
    model, _, _ = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert isinstance(model[1], LayerNormSubclass) and isinstance(model[3], torch.nn.GroupNorm)
    assert type(model[1]).__name__ == "LayerNormSubclass" and type(model[3]) is norms.GroupNorm
    assert list(model.state_dict()) == list(torch.nn.Sequential(
        torch.nn.Linear(8, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 8), torch.nn.GroupNorm(2, 8),
        torch.nn.Linear(8, 2)).state_dict())
    x = torch.randn(3, 8)
    for other in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert type(other[1]) is type(model[1]) and torch.equal(other(x), model(x))


@pytest.mark.parametrize("name, call, message", [
    ("LayerNorm", lambda norm: norm(torch.randn(3, 8).half()), "normalized_shape"),
    ("GroupNorm", lambda norm: norm(torch.randn(3, 12, 5).half()), r"expected an input of shape \(N, 16, \*\)"),
    ("RMSNorm", lambda norm: norm(torch.randn(3, 8).half()), r"expected an input of shape \[\*, 16\], got \[3, 8\]"),
])
def test_bad_input_is_refused_clearly(name, call, message):
    norm, _, _ = _prepared_norm(name, torch.float16)
    with pytest.raises(RuntimeError, match=message):
        call(norm)


def test_group_norm_keeps_channels_last():
    norm, reference, x = _prepared_norm("GroupNorm", torch.float16)
    out = norm(x)
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(out, reference(x.float()).half())


def test_compiled_prepared_block_matches_eager():
    def step(model, x):
        out = model(x)
        out.float().square().mean().backward()
        return out

    models = []
    for _ in range(2):
        torch.manual_seed(0)
        block = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.LayerNorm(16), torch.nn.GELU(),
                                    torch.nn.Linear(16, 16), torch.nn.RMSNorm(16))
        models.append(mpgemm.amp.prepare(block, torch.optim.SGD(block.parameters(), lr=0.1))[0])
    x = torch.randn(4, 16)
    eager, compiled = step(models[0], x), torch.compile(step)(models[1], x)
    torch.testing.assert_close(compiled, eager, rtol=2e-3, atol=2e-3)
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=2e-3, atol=2e-3)
