"""mpgemm.fuse with MPGEMM_DGRAD_ADDEND=1 (opt-in): a ResNet block's input,
read by its first chain's convolution and by one later node (the residual
add, or the downsample), reaches that node from the chain's call, so that
backward sums its two gradients in the convolution's dgrad
(mpgemm._conv2d_grad_input_add) and not in an add of autograd's. Against
the same model fused without the switch (outputs, every gradient, the
model's state over several steps), under prepare() within torch.amp's
deviation, and the cases left as they were."""

import copy
import re

import pytest
import torch

import mpgemm
from mpgemm.fusion import fusion_report, input_gradient
from support import MpgemmCalls, assert_fused_within_prepared_deviation, train_fused_prepared_and_fp32
from test_fuse import assert_same_state, fused_copy, tiny_resnet, train_together

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# tiny_resnet's blocks, whose first chains' inputs the residual (3, 5) or the downsample (4) reads too.
FIRST_CHAINS = {"3.conv1", "4.conv1", "5.conv1"}


@pytest.fixture
def dgrad_addend(monkeypatch):
    monkeypatch.setenv("MPGEMM_DGRAD_ADDEND", "1")


def test_each_blocks_first_chain_sums_its_inputs_gradients(dgrad_addend):
    model = mpgemm.convert(tiny_resnet())
    x = torch.randn(2, 3, 8, 8)
    fused = fused_copy(model, x)
    report = fusion_report(fused)
    assert {r["conv"] for r in report if r["sums_input_gradient"]} == FIRST_CHAINS
    with MpgemmCalls() as calls:
        fused(x.requires_grad_()).square().sum().backward()
    # A block's first convolution: the sum and its wgrad; the other chains' dgrad and wgrad in one op, as before.
    assert calls.ops.count("_conv2d_grad_input_add") == calls.ops.count("conv2d_grad_weight") == len(FIRST_CHAINS)
    assert calls.ops.count("conv2d_backward") == len(report) - len(FIRST_CHAINS)


def test_without_the_switch_nothing_is_handed_on(monkeypatch):
    monkeypatch.delenv("MPGEMM_DGRAD_ADDEND", raising=False)
    fused = fused_copy(mpgemm.convert(tiny_resnet()), torch.randn(2, 3, 8, 8))
    assert not any(r["sums_input_gradient"] for r in fusion_report(fused))
    with MpgemmCalls() as calls:
        fused(torch.randn(2, 3, 8, 8, requires_grad=True)).square().sum().backward()
    assert "_conv2d_grad_input_add" not in calls.ops


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("channels_last", [False, True])
def test_trains_as_the_model_fused_without_it(device, channels_last, monkeypatch):
    """fp32 activations (the products' operands rounded to fp16, as mpgemm's
    layers do): the switch changes only where the block input's gradient is
    rounded (once, after both terms, where the dgrad adds them)."""
    torch.manual_seed(0)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = mpgemm.convert(tiny_resnet(channels=(3, 8, 16))).to(device).to(memory_format=fmt)
    batches = [torch.randn(3, 3, 9, 9, device=device).to(memory_format=fmt) for _ in range(3)]
    monkeypatch.setenv("MPGEMM_DGRAD_ADDEND", "1")
    summed = fused_copy(model, batches[0])
    monkeypatch.delenv("MPGEMM_DGRAD_ADDEND")
    plain = fused_copy(model, batches[0])
    models = [summed, plain]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in models]
    monkeypatch.setenv("MPGEMM_DGRAD_ADDEND", "1")  # read again at each call
    for (out, grad_x), (ref_out, ref_grad_x) in train_together(models, optimizers, batches):
        torch.testing.assert_close(out, ref_out, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(grad_x, ref_grad_x, rtol=1e-4, atol=1e-6)
    assert_same_state(summed, plain, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_under_prepare_within_torch_amps_deviation(device, dtype, dgrad_addend):
    torch.manual_seed(0)
    base = tiny_resnet(channels=(3, 8, 16)).to(device)
    x = [torch.randn(4, 3, 8, 8, device=device).to(memory_format=torch.channels_last) for _ in range(4)]
    runs = train_fused_prepared_and_fp32(base, x, lambda model, xb: model(xb).float().square().mean(), dtype, False)
    fused = runs["fused"][0]
    assert {r["conv"] for r in fusion_report(fused) if r["sums_input_gradient"]} == FIRST_CHAINS
    assert_fused_within_prepared_deviation(runs)
    # prepare()'s forward runs under autocast, whose casts leave the blocks' 16-bit inputs and weights as they are.
    with MpgemmCalls() as calls:
        fused(x[0]).float().square().mean().backward()
    assert calls.ops.count("_conv2d_grad_input_add") == len(FIRST_CHAINS)


class OneChain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(8)


class ReadsItsInputThrice(OneChain):
    """A block whose input a third node reads: x's gradients have three terms."""

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x))) + x + x.square()


class ReadsItsInputFirst(OneChain):
    """A block whose other reader of x runs before the chain."""

    def forward(self, x):
        shortcut = x.square()
        return torch.relu(self.bn(self.conv(x))) + shortcut


class ReturnsItsInput(OneChain):
    """A block whose caller gets x itself (and may write to it)."""

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x))), x


class WritesToItsInput(OneChain):
    """A block whose other reader writes to x in place (which its backward refuses, as torch's would)."""

    def forward(self, x):
        y = torch.relu(self.bn(self.conv(x)))
        x.mul_(2)
        return y


@pytest.mark.parametrize("make", [ReadsItsInputThrice, ReadsItsInputFirst, ReturnsItsInput, WritesToItsInput])
def test_other_readers_leave_the_chain_as_it_was(make, dgrad_addend):
    model = mpgemm.convert(make())
    fused = fused_copy(model, torch.randn(2, 8, 5, 5))
    assert [r["sums_input_gradient"] for r in fusion_report(fused)] == [False]
    x = torch.randn(2, 8, 5, 5)
    torch.testing.assert_close(fused(x.clone()), model(x.clone()))


def test_a_hooked_or_autocast_convolution_takes_the_module_path(dgrad_addend):
    """Where the call cannot stand in for the convolution's module (a hook
    on it, autocast, no gradient), the chain calls the module and hands on
    x itself: autograd adds its gradients, as without the switch."""
    model = mpgemm.convert(tiny_resnet())
    x = torch.randn(2, 3, 8, 8)
    fused = fused_copy(model, x)
    seen = []
    handle = fused[3].conv1.register_forward_hook(lambda module, inputs, out: seen.append(out.shape))
    with MpgemmCalls() as calls:
        fused(x.clone().requires_grad_()).square().sum().backward()
    handle.remove()
    assert seen and calls.ops.count("_conv2d_grad_input_add") == len(FIRST_CHAINS) - 1
    # Autocast that casts (fp32 x and weights to bf16): the module; one that casts nothing (bf16 ones): the call.
    with torch.autocast("cpu", dtype=torch.bfloat16), MpgemmCalls() as calls:
        fused(x.clone().requires_grad_()).float().square().sum().backward()
    assert "_conv2d_grad_input_add" not in calls.ops
    bf16 = copy.deepcopy(fused).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16), MpgemmCalls() as calls:
        bf16(x.bfloat16().requires_grad_()).float().square().sum().backward()
    assert calls.ops.count("_conv2d_grad_input_add") == len(FIRST_CHAINS)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), copy.deepcopy(model)(x), rtol=1e-3, atol=1e-3)


def test_the_graph_hands_the_input_to_its_other_reader(dgrad_addend):
    """In the traced blocks, the residual (3, 5) or the downsample (4) takes
    the first chain's last output, x again, not the block's input."""
    fused = fused_copy(mpgemm.convert(tiny_resnet()), torch.randn(2, 3, 8, 8))
    for block, reader in ((3, r"run_chain\(conv2_1, bn2_1, \w+, {}"), (4, r"self\.downsample\({}\)"),
                          (5, r"run_chain\(conv3_1, bn3_1, aa, {}")):
        code = fused[block]._mpgemm_fusion.code
        again = re.search(r"(\w+) = run_chain\[2\]", code).group(1)
        assert "gives_input = True" in code and re.search(reader.format(again), code), code


def test_the_sum_is_once_differentiable(dgrad_addend):
    """The call's backward runs ops with no autograd of their own: asked to
    differentiate its gradients again, it refuses (as mpgemm.conv2d does)."""
    x = torch.randn(2, 8, 5, 5, requires_grad=True)
    weight = torch.randn(8, 8, 1, 1, requires_grad=True)
    y, again, _ = input_gradient.ConvGivingInput.apply(x, weight, None, [1, 1], [0] * 4, [1, 1], 1, False)
    (grad,) = torch.autograd.grad((y.square() + again).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        grad.sum().backward()


def test_a_bad_switch_is_refused(monkeypatch):
    monkeypatch.setenv("MPGEMM_DGRAD_ADDEND", "yes")
    with pytest.raises(ValueError, match="MPGEMM_DGRAD_ADDEND must be '0' or '1', got 'yes'"):
        mpgemm.fuse(mpgemm.convert(tiny_resnet()), torch.randn(2, 3, 8, 8))
