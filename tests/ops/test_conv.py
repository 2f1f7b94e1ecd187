"""mpgemm.conv2d, its gradients, mpgemm.nn.Conv2d and conversion, against
torch.nn.functional.conv2d in float64 on the same 16-bit values."""

import pytest
import torch
import torch.nn.functional as F

import mpgemm
from mpgemm.testing import TOLERANCE, relative_error
from mpgemm.tools import models
from mpgemm.tools.training import DispatchedOps

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
# dL/dy is rounded to the product's type (2**-11 for fp16, 2**-9 for bf16)
# for the Tensor Core products.
GRAD_TOLERANCE = {torch.float16: 5e-3, torch.bfloat16: 2e-2}

# Every distinct convolution of ResNet-50 at 224x224, read from the model that
# `bench train` trains and `bench conv` times (test_models.py checks the list):
# (in, out, kernel, stride, padding, input size).
RESNET50 = models.resnet50_convolutions()


def check_conv(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, out_dtype=None):
    """Forward and all gradients of mpgemm.conv2d against float64 F.conv2d on
    the values rounded to the product's type (bf16 if x or weight is)."""
    product = torch.bfloat16 if torch.bfloat16 in (x.dtype, weight.dtype) else torch.float16
    x = x.detach().requires_grad_()
    weight = weight.detach().requires_grad_()
    bias = None if bias is None else bias.detach().requires_grad_()
    out = mpgemm.conv2d(x, weight, bias, stride, padding, dilation, groups, out_dtype=out_dtype)
    x64, w64 = (t.detach().to(product).double().requires_grad_() for t in (x, weight))
    b64 = None if bias is None else bias.detach().double().requires_grad_()
    ref = F.conv2d(x64, w64, b64, stride, padding, dilation, groups)
    assert out.shape == ref.shape and out.dtype == (out_dtype or x.dtype)
    if x.dim() == 4:
        channels_last = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
        assert out.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    assert relative_error(out, ref.detach()) < TOLERANCE[out.dtype]
    grad = torch.randn(out.shape, device=x.device)
    out.backward(grad.to(out.dtype))
    ref.backward(grad.to(out.dtype).to(product).double())
    for t, r in [(x, x64), (weight, w64)] + ([(bias, b64)] if bias is not None else []):
        assert t.grad.dtype == t.dtype and t.grad.shape == t.shape
        assert relative_error(t.grad, r.grad) < GRAD_TOLERANCE[product], f"gradient of a {tuple(t.shape)} tensor"


def random(*shape, device="cpu", dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, device=device) * scale).to(dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("c, k, kernel, stride, padding, size", RESNET50,
                         ids=[f"{c}-{k}-{r}x{r}-s{s}-{n}" for c, k, r, s, _, n in RESNET50])
def test_resnet50_layers(device, c, k, kernel, stride, padding, size):
    if device == "cpu":  # scaled down in batch and spatial size
        batch, size = 2, max(kernel, size // 7 + (size // 7) % 2 + 1)
    else:
        batch = 8
    x = random(batch, c, size, size, device=device, dtype=torch.float16).to(memory_format=torch.channels_last)
    weight = random(k, c, kernel, kernel, device=device, scale=(c * kernel * kernel) ** -0.5)
    check_conv(x, weight, random(k, device=device), stride, padding)


CASES = [
    # x shape, out channels, kernel, keyword arguments
    ((2, 8, 9, 11), 16, 1, dict()),
    ((2, 8, 9, 11), 16, 3, dict(padding=1)),
    ((1, 16, 13, 12), 8, 7, dict(stride=2, padding=3)),
    ((2, 8, 15, 15), 8, 3, dict(dilation=2, padding=2)),
    ((2, 8, 10, 9), 8, 3, dict(padding="same")),
    ((2, 8, 10, 9), 8, 4, dict(padding="same", dilation=1)),
    ((2, 8, 10, 9), 8, 3, dict(padding="valid", stride=(2, 1))),
    ((3, 3, 17, 19), 16, 3, dict(stride=2, padding=(1, 2))),
    ((2, 16, 9, 9), 8, 3, dict(groups=2, padding=1)),
    ((2, 16, 9, 9), 16, 3, dict(groups=16, padding=1)),
    ((2, 8, 9, 9), 16, 3, dict(groups=8, stride=2)),
    # 8-byte chunks in place (4 channels per group), a 3-channel 7x7 first
    # layer (padded to 4 channels), and 65 channels (padded to 72).
    ((2, 16, 9, 9), 16, 3, dict(groups=4, padding=1)),
    ((2, 3, 24, 22), 64, 7, dict(stride=2, padding=3)),
    ((1, 65, 6, 7), 24, 3, dict(padding=1)),
    # Depthwise kernels: 8 channels a thread (a 7x7 window), one (12 channels,
    # stride 2), and 15 filters per channel, the most they take; 16 run as
    # padded implicit GEMMs.
    ((2, 24, 9, 10), 24, 7, dict(groups=24, padding=3)),
    ((2, 12, 11, 10), 12, 3, dict(groups=12, stride=2, padding=1)),
    ((1, 4, 7, 7), 60, 3, dict(groups=4, padding=1)),
    ((1, 4, 7, 7), 64, 3, dict(groups=4, padding=1)),
    # dgrad phases: stride 3 with dilation 2 (taps 3 rows apart), and a 1x1
    # stride-2 layer whose odd rows and columns no tap reaches (zeros in dx).
    ((2, 16, 11, 10), 16, 3, dict(stride=3, dilation=2, padding=1)),
    ((2, 8, 9, 9), 16, 1, dict(stride=2)),
    ((8, 7, 6), 5, 3, dict(padding=1)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("x_shape, k, kernel, kwargs", CASES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("channels_last", [False, True])
def test_conv_cases(device, x_shape, k, kernel, kwargs, dtype, channels_last):
    groups = kwargs.get("groups", 1)
    x = random(*x_shape, device=device, dtype=dtype)
    if channels_last and x.dim() == 4:
        x = x.to(memory_format=torch.channels_last)
    c = x_shape[-3]
    weight = random(k, c // groups, kernel, kernel, device=device, dtype=dtype, scale=(c * kernel) ** -0.5)
    check_conv(x, weight, random(k, device=device, dtype=dtype), **kwargs)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_conv_out_dtype_and_no_bias(device, dtype):
    x = random(2, 8, 7, 7, device=device)
    weight = random(8, 8, 3, 3, device=device, dtype=dtype)
    check_conv(x, weight, None, padding=1, out_dtype=dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("x_dtype, w_dtype, b_dtype", [
    (torch.float32, torch.bfloat16, torch.float16), (torch.bfloat16, torch.float32, torch.float32),
    (torch.float16, torch.float32, torch.bfloat16)])
def test_conv_mixed_dtypes_follow_the_rule(device, x_dtype, w_dtype, b_dtype):
    # The product takes bf16 if either is bf16; the bias may be any float type.
    x = random(2, 8, 7, 7, device=device, dtype=x_dtype).to(memory_format=torch.channels_last)
    weight = random(16, 8, 3, 3, device=device, dtype=w_dtype, scale=0.1)
    check_conv(x, weight, random(16, device=device, dtype=b_dtype), padding=1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("frozen", ["x", "weight"])
@pytest.mark.parametrize("c,k,kernel,stride,padding", [(8, 16, 3, 2, 1), (3, 8, 7, 2, 3)], ids=["3x3", "first-layer"])
def test_conv_gradient_of_one_operand(device, frozen, c, k, kernel, stride, padding):
    """Backward asks for one gradient where the other operand needs none (a
    network's input, as ResNet's first layer's image; a frozen filter): that
    one alone is computed (one op of its own, no dgrad for the image), and
    right."""
    x = random(2, c, 15, 15, device=device, dtype=torch.float16).requires_grad_(frozen != "x")
    weight = random(k, c, kernel, kernel, device=device, dtype=torch.float16).requires_grad_(frozen != "weight")
    out = mpgemm.conv2d(x, weight, stride=stride, padding=padding)
    x64, w64 = (t.detach().double().requires_grad_(t.requires_grad) for t in (x, weight))
    ref = F.conv2d(x64, w64, stride=stride, padding=padding)
    grad = torch.randn(out.shape, device=device).half()
    with DispatchedOps() as ops:
        out.backward(grad)
    mpgemm_ops = {name: n for name, n in ops.count.items() if name.startswith("conv2d")}
    assert mpgemm_ops == {"conv2d_grad_weight" if frozen == "x" else "conv2d_grad_input": 1}
    ref.backward(grad.double())
    trained, trained64 = (weight, w64) if frozen == "x" else (x, x64)
    assert relative_error(trained.grad, trained64.grad) < GRAD_TOLERANCE[torch.float16]
    assert (x.grad if frozen == "x" else weight.grad) is None


def test_conv_empty_batch():
    x = torch.empty(0, 8, 5, 5, requires_grad=True)
    weight = torch.randn(4, 8, 3, 3, requires_grad=True)
    out = mpgemm.conv2d(x, weight, padding=1)
    assert out.shape == (0, 4, 5, 5)
    out.sum().backward()
    assert torch.equal(weight.grad, torch.zeros_like(weight))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("x_shape, padding", [((1, 8, 0, 5), 1), ((2, 8, 3, 0), (0, 1)), ((1, 8, 0, 0), 2)])
def test_conv_input_of_no_rows_or_columns_convolves_its_padding(device, x_shape, padding):
    # torch's convolution refuses such an x; F.conv2d of x padded by hand is the reference.
    torch.manual_seed(14)
    x = torch.empty(x_shape, device=device, dtype=torch.float16, requires_grad=True)
    weight = random(4, 8, 2, 2, device=device, dtype=torch.float16).requires_grad_()
    bias = random(4, device=device).requires_grad_()
    out = mpgemm.conv2d(x, weight, bias, padding=padding)
    pads = {1: (1, 1, 1, 1), (0, 1): (1, 1, 0, 0), 2: (2, 2, 2, 2)}[padding]
    w64, b64 = weight.detach().double().requires_grad_(), bias.detach().double().requires_grad_()
    ref = F.conv2d(F.pad(x.detach().double(), pads), w64, b64)
    assert out.shape == ref.shape and relative_error(out, ref.detach()) < TOLERANCE[torch.float16]
    grad = random(*out.shape, device=device, dtype=torch.float16)
    out.backward(grad)
    ref.backward(grad.double())
    assert x.grad.shape == x.shape and torch.equal(weight.grad, torch.zeros_like(weight))
    assert relative_error(bias.grad, b64.grad) < 1e-6


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_opcheck_conv(device, dtype):
    x = random(2, 8, 7, 6, device=device, dtype=dtype).requires_grad_()
    w = random(16, 4, 3, 3, device=device).requires_grad_()
    b = random(16, device=device).requires_grad_()
    geometry = ([2, 1], [1, 0, 2, 1], [1, 1], 2)
    torch.library.opcheck(torch.ops.mpgemm.conv2d.default, (x, w, b, *geometry))
    torch.library.opcheck(torch.ops.mpgemm.conv2d.default, (x.detach().to(memory_format=torch.channels_last),
                                                            w.detach(), None, *geometry), {"out_dtype": torch.float32})
    grad_out = torch.ops.mpgemm.conv2d.default(x, w, b, *geometry).detach()
    for op in (torch.ops.mpgemm.conv2d_grad_input.default, torch.ops.mpgemm.conv2d_grad_weight.default,
               torch.ops.mpgemm.conv2d_backward.default):
        torch.library.opcheck(op, (grad_out, x.detach(), w.detach(), *geometry))
    # Both gradients in one call are the two single ones.
    grad_input, grad_weight = torch.ops.mpgemm.conv2d_backward(grad_out, x.detach(), w.detach(), *geometry)
    assert torch.equal(grad_input, torch.ops.mpgemm.conv2d_grad_input(grad_out, x.detach(), w.detach(), *geometry))
    assert torch.equal(grad_weight, torch.ops.mpgemm.conv2d_grad_weight(grad_out, x.detach(), w.detach(), *geometry))


def make_cnn():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1, bias=False), torch.nn.ReLU(), torch.nn.Flatten(),
        torch.nn.Linear(16 * 4 * 4, 10),
    )


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_cnn_training_step_matches_eager(device):
    def step(model, optimizer, x, y):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    x, y = torch.randn(8, 3, 8, 8, device=device), torch.randint(0, 10, (8,), device=device)
    models = [mpgemm.convert(make_cnn()).to(device) for _ in range(2)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]
    compiled = torch.compile(step)
    # Inductor's fused fp32 ops may differ from eager's by an ulp, which can
    # flip the fp16 rounding of an input: one element then moves by about
    # lr * 2**-11 * |activation|, so atol is a few times 1e-5.
    for _ in range(2):
        torch.testing.assert_close(compiled(models[0], optimizers[0], x, y), step(models[1], optimizers[1], x, y),
                                   rtol=1e-4, atol=5e-5)
    for p, q in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=5e-5)


def test_conv_layer_is_a_drop_in():
    torch.manual_seed(0)
    ours = mpgemm.nn.Conv2d(4, 8, 3, stride=2, padding=1, groups=2)
    torch.manual_seed(0)
    theirs = torch.nn.Conv2d(4, 8, 3, stride=2, padding=1, groups=2)
    assert torch.equal(ours.weight, theirs.weight) and list(ours.state_dict()) == list(theirs.state_dict())
    theirs.load_state_dict(ours.state_dict())
    theirs.double()
    with torch.no_grad():
        theirs.weight.copy_(ours.weight.half())  # the fp16 values the kernels see
    x = torch.randn(2, 4, 9, 9)
    assert relative_error(ours(x), theirs(x.half().double()).detach()) < 1e-5
    assert "backend=mpgemm" in repr(ours)


@pytest.mark.parametrize("padding_mode", ["reflect", "replicate", "circular"])
def test_conv_layer_padding_modes(padding_mode):
    torch.manual_seed(0)
    ours = mpgemm.nn.Conv2d(4, 8, 3, padding=1, padding_mode=padding_mode)
    theirs = torch.nn.Conv2d(4, 8, 3, padding=1, padding_mode=padding_mode).double()
    theirs.load_state_dict(ours.state_dict())
    with torch.no_grad():
        theirs.weight.copy_(ours.weight.half())
    x = torch.randn(2, 4, 7, 7)
    assert relative_error(ours(x), theirs(x.half().double()).detach()) < 1e-5


def test_convert_covers_conv2d():
    model = make_cnn()
    reference = make_cnn()
    assert mpgemm.converted_layers(mpgemm.convert(model)) == ["0", "4", "7"]
    x = torch.randn(4, 3, 8, 8)
    with torch.no_grad():
        assert relative_error(model(x), reference(x).double()) < 2e-3


def t(*shape):
    return torch.randn(*shape)


BAD = [
    ("channels", ValueError, r"x has 8 channels but weight expects 3 per group x 1 groups",
     lambda: mpgemm.conv2d(t(1, 8, 5, 5), t(4, 3, 3, 3))),
    ("groups divide", ValueError, r"groups \(3\) must divide the input channels \(8\) and the output channels \(6\)",
     lambda: mpgemm.conv2d(t(1, 8, 5, 5), t(6, 2, 3, 3), groups=3)),
    ("stride 0", ValueError, r"stride must be two positive integers, got \[0, 1\]",
     lambda: mpgemm.conv2d(t(1, 3, 5, 5), t(4, 3, 3, 3), stride=(0, 1))),
    ("negative padding", ValueError, r"padding must be non-negative",
     lambda: mpgemm.conv2d(t(1, 3, 5, 5), t(4, 3, 3, 3), padding=-1)),
    ("rank x", ValueError, r"expected x to be 4-D \(N, C, H, W\) or 3-D \(C, H, W\), got a 5-D tensor",
     lambda: mpgemm.conv2d(t(1, 1, 3, 5, 5), t(4, 3, 3, 3))),
    ("rank weight", ValueError, r"expected weight to be 4-D",
     lambda: mpgemm.conv2d(t(1, 3, 5, 5), t(4, 3, 3))),
    ("dtype", TypeError, r"expected x to be torch.float16, torch.bfloat16 or torch.float32, got torch.float64",
     lambda: mpgemm.conv2d(t(1, 3, 5, 5).double(), t(4, 3, 3, 3))),
    ("fp16 with bf16", TypeError, r"x is torch.bfloat16 but weight is torch.float16; expected both torch.float16 or "
     r"both torch.bfloat16", lambda: mpgemm.conv2d(t(1, 3, 5, 5).bfloat16(), t(4, 3, 3, 3).half())),
    ("out_dtype", ValueError, r"out_dtype must be torch.float32 or torch.bfloat16 \(the type of the product's inputs\), "
     r"got torch.float16", lambda: mpgemm.conv2d(t(1, 3, 5, 5), t(4, 3, 3, 3).bfloat16(), out_dtype=torch.float16)),
    ("too small", ValueError, r"the padded input \(2, 2\) is smaller than the dilated kernel \(3, 3\)",
     lambda: mpgemm.conv2d(t(1, 3, 2, 2), t(4, 3, 3, 3))),
    ("bias", ValueError, r"expected bias of shape \(out_channels,\) = \(4,\), got shape \(3,\)",
     lambda: mpgemm.conv2d(t(1, 3, 5, 5), t(4, 3, 3, 3), t(3))),
    ("same strided", ValueError, r"padding='same' is not supported for strided convolutions",
     lambda: mpgemm.conv2d(t(1, 3, 5, 5), t(4, 3, 3, 3), stride=2, padding="same")),
    ("padding string", ValueError, r"padding must be an int, a pair, 'valid' or 'same', got 'full'",
     lambda: mpgemm.conv2d(t(1, 3, 5, 5), t(4, 3, 3, 3), padding="full")),
    ("stride triple", ValueError, r"stride must be an int or a pair of ints",
     lambda: mpgemm.conv2d(t(1, 3, 5, 5), t(4, 3, 3, 3), stride=(1, 1, 1))),
    ("float padding", ValueError, r"padding must be an int or a pair of ints, got 1.5",
     lambda: mpgemm.conv2d(t(1, 3, 5, 5), t(4, 3, 3, 3), padding=1.5)),
    ("x not a tensor", TypeError, r"expected x to be a tensor, got list",
     lambda: mpgemm.conv2d([1.0], t(4, 3, 3, 3))),
    ("device", ValueError, r"expected weight on the same device as x \(cpu\), got weight on meta",
     lambda: mpgemm.conv2d(t(1, 3, 5, 5), torch.empty(4, 3, 3, 3, device="meta"))),
]


@pytest.mark.parametrize("name, error, message, call", BAD, ids=[b[0] for b in BAD])
def test_conv_bad_input(name, error, message, call):
    with pytest.raises(error, match="^mpgemm.conv2d: " + message):
        call()
