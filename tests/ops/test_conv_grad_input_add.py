"""mpgemm._conv2d_grad_input_add: a conv2d's input gradient plus a second
term of x's shape (a ResNet block input's gradient from its residual),
against float64 torch on the same 16-bit values; on the CPU the sum rounded
once, bit for bit; its checks and opcheck. On a GPU (skipped without one)
the outputs start as NaN (support.nan_filled_outputs), and on Hopper with
MPGEMM_DGRAD_ADDEND=1 (opt-in until these tests pass there) dgrad at stride
1 must add it in its epilogue: one kernel, wgmma_dgrad_addend_kernel, and
no pass of its own."""

import pytest
import torch

import mpgemm  # noqa: F401  (registers the ops)
from mpgemm.testing import TOLERANCE, relative_error

from support import launches, nan_filled_outputs, set_environment

HAS_CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])
IS_HOPPER = HAS_CUDA and torch.cuda.get_device_capability() == (9, 0)
HAS_BF16 = HAS_CUDA and torch.cuda.get_device_capability() >= (8, 0)
OP = torch.ops.mpgemm._conv2d_grad_input_add
# (x shape, filters, kernel, stride, padding): a bottleneck's first 1x1 (the
# residual's), a 3x3, a strided 1x1 (a downsample, whose dgrad the epilogue
# does not take) and odd channels (WMMA's padded copies).
CASES = [((2, 64, 6, 5), 32, 1, 1, 0), ((2, 16, 7, 6), 24, 3, 1, 1), ((3, 32, 8, 8), 64, 1, 2, 0),
         ((2, 5, 5, 4), 8, 3, 1, 1)]
# Two roundings where the sum is not the epilogue's (the rounded gradient
# plus the addend), one where it is.
ADD_TOLERANCE = {torch.float16: 4e-3, torch.bfloat16: 2e-2, torch.float32: 1e-4}


def geometry(stride, padding):
    return [stride, stride], [padding] * 4, [1, 1], 1


def problem(device, x_shape, k, kernel, stride, padding, dtype, channels_last=False):
    """grad_out, x, weight and addend of one case (x, the addend and the gradient of x's dtype; the filters fp32
    beside an fp32 x, rounded to fp16 for the product, as mpgemm.conv2d's rule says)."""
    n, c, h, w = x_shape
    p, q = (h + 2 * padding - kernel) // stride + 1, (w + 2 * padding - kernel) // stride + 1
    x = torch.randn(x_shape, device=device).to(dtype)
    weight = (torch.randn(k, c, kernel, kernel, device=device) / (c * kernel * kernel) ** 0.5)
    weight = weight.to(torch.float16 if dtype == torch.float32 else dtype)
    grad_out = torch.randn(n, k, p, q, device=device).to(weight.dtype)
    addend = torch.randn(x_shape, device=device).to(dtype)
    if channels_last:
        x, grad_out, addend = (t.to(memory_format=torch.channels_last) for t in (x, grad_out, addend))
    return grad_out, x, weight, addend


def reference(grad_out, x, weight, addend, stride, padding):
    """The input gradient in float64 on the product's values, plus the addend."""
    grad = torch.nn.grad.conv2d_input(x.shape, weight.double(), grad_out.double(), stride, padding)
    return grad + addend.double()


# Devices and MPGEMM_DGRAD_ADDEND: on a GPU the default (unset) and the epilogue's addend.
DEVICE_SWITCHES = [("cpu", None)] + ([("cuda", None), ("cuda", "1")] if HAS_CUDA else [])


@pytest.mark.parametrize("device, switch", DEVICE_SWITCHES)
@pytest.mark.parametrize("case", CASES, ids=["1x1", "3x3", "1x1-s2", "odd"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("channels_last", [False, True])
def test_grad_input_add_against_float64(device, switch, case, dtype, channels_last, monkeypatch):
    if device == "cuda" and dtype == torch.bfloat16 and not HAS_BF16:
        pytest.skip("bf16 Tensor Cores need sm_80")
    set_environment(monkeypatch, "MPGEMM_DGRAD_ADDEND", switch)
    x_shape, k, kernel, stride, padding = case
    grad_out, x, weight, addend = problem(device, x_shape, k, kernel, stride, padding, dtype, channels_last)
    with nan_filled_outputs():
        out = OP(grad_out, x, weight, addend, *geometry(stride, padding))
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
    assert out.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    expected = reference(grad_out, x, weight, addend, stride, padding)
    assert relative_error(out, expected) < ADD_TOLERANCE[dtype]


@pytest.mark.parametrize("device, switch", DEVICE_SWITCHES)
@pytest.mark.parametrize("layout", ["other format", "misaligned"])
def test_an_addend_of_another_layout(device, switch, layout, monkeypatch):
    """An addend in the other memory format (NCHW beside a channels_last x:
    made channels_last for the epilogue), or one whose data starts 2 bytes
    past 16 (a view at an odd offset: the epilogue's pair loads need 16-byte
    alignment, so the sum is added after the pass), against float64."""
    set_environment(monkeypatch, "MPGEMM_DGRAD_ADDEND", switch)
    grad_out, x, weight, addend = problem(device, (2, 64, 6, 5), 32, 1, 1, 0, torch.float16, channels_last=True)
    if layout == "other format":
        addend = addend.contiguous()
    else:
        storage = torch.randn(addend.numel() + 1, device=device).half()
        addend = storage[1:].view(2, 6, 5, 64).permute(0, 3, 1, 2)  # channels_last, 2 bytes off
        assert addend.data_ptr() % 16 == 2 and addend.is_contiguous(memory_format=torch.channels_last)
    with nan_filled_outputs():
        out = OP(grad_out, x, weight, addend, *geometry(1, 0))
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert relative_error(out, reference(grad_out, x, weight, addend, 1, 0)) < ADD_TOLERANCE[torch.float16]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cpu_rounds_the_sum_once(dtype):
    """The CPU backend adds the addend to the fp32 gradient and rounds once,
    as the epilogue does: bit for bit the fp32 gradient plus the addend,
    rounded; not the rounded gradient plus the addend (which differs in some
    elements at these sizes)."""
    grad_out, x, weight, addend = problem("cpu", (2, 64, 6, 5), 32, 1, 1, 0, dtype)
    out = OP(grad_out, x, weight, addend, *geometry(1, 0))
    grad_fp32 = torch.ops.mpgemm.conv2d_grad_input(grad_out, x.float(), weight, *geometry(1, 0))
    assert torch.equal(out, (grad_fp32 + addend.float()).to(dtype))
    grad = torch.ops.mpgemm.conv2d_grad_input(grad_out, x, weight, *geometry(1, 0))
    assert torch.equal(grad, grad_fp32.to(dtype))
    assert not torch.equal(out, grad + addend)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_grad_input_add(device):
    grad_out, x, weight, addend = problem(device, (2, 16, 7, 6), 24, 3, 1, 1, torch.float16)
    torch.library.opcheck(OP.default, (grad_out, x, weight, addend, *geometry(1, 1)))


def call_with(addend, x=None):
    grad_out, x_, weight, _ = problem("cpu", (2, 16, 5, 5), 8, 3, 1, 1, torch.float16)
    return OP(grad_out, x_ if x is None else x, weight, addend, *geometry(1, 1))


@pytest.mark.parametrize("addend, error, message", [
    (torch.zeros(2, 16, 5, 5), TypeError, r"expected addend to have x's dtype torch.float16, got torch.float32"),
    (torch.zeros(2, 16, 5, 4, dtype=torch.float16), ValueError,
     r"expected addend of x's shape \(2, 16, 5, 5\), got \(2, 16, 5, 4\)"),
    (torch.zeros(2, 16, 5, 5, dtype=torch.float16, device="meta"), ValueError,
     r"expected addend on the same device as x \(cpu\), got addend on meta"),
], ids=["dtype", "shape", "device"])
def test_grad_input_add_refuses_a_bad_addend(addend, error, message):
    with pytest.raises(error, match="^mpgemm._conv2d_grad_input_add: " + message):
        call_with(addend)


@pytest.mark.gpu  # the switch is read where a CUDA dgrad is planned
def test_grad_input_add_refuses_a_bad_switch(monkeypatch):
    monkeypatch.setenv("MPGEMM_DGRAD_ADDEND", "yes")
    grad_out, x, weight, addend = problem("cuda", (2, 64, 6, 5), 32, 1, 1, 0, torch.float16)
    with pytest.raises(ValueError, match="MPGEMM_DGRAD_ADDEND must be '0' or '1', got 'yes'"):
        OP(grad_out, x, weight, addend, *geometry(1, 0))


@pytest.mark.gpu
@pytest.mark.skipif(not IS_HOPPER, reason="the dgrad addend's kernels need an sm_90 GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("channels", [64, 128, 256], ids=["n64", "n128", "wide"])
def test_hopper_dgrad_adds_in_its_epilogue(monkeypatch, dtype, channels):
    """A ResNet block's first 1x1 at batch 4 (dx of 64, 128 or 256 channels,
    on the narrow tiles and the wide one): with the switch, the addend
    kernel alone, and the sum within one rounding of float64's; without, the
    plain dgrad and a pass that adds."""
    grad_out, x, weight, addend = problem("cuda", (4, channels, 14, 14), 64, 1, 1, 0, dtype, channels_last=True)
    expected = reference(grad_out, x, weight, addend, 1, 0)
    for switch, ran in (("1", {"wgmma_dgrad_addend_kernel"}), ("0", {"wgmma_conv_kernel"})):
        monkeypatch.setenv("MPGEMM_DGRAD_ADDEND", switch)
        names = launches(lambda: OP(grad_out, x, weight, addend, *geometry(1, 0)))
        assert {kernel for kernel in ("wgmma_dgrad_addend_kernel", "wgmma_conv_kernel")
                if any(kernel in name for name in names)} == ran, names
        assert len(names) == (1 if switch == "1" else 2), names  # the sum's own pass without the switch
        with nan_filled_outputs():
            out = OP(grad_out, x, weight, addend, *geometry(1, 0))
        assert relative_error(out, expected) < TOLERANCE[dtype]
