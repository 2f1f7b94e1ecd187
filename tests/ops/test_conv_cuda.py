"""The convolution kernels against cuDNN and float64, in fp16 and in bf16
(skipped without a GPU; bf16 needs sm_80).

The ops allocate their outputs, which start as NaN inside
support.nan_filled_outputs (torch's deterministic fill of new memory):
an element the kernels do not write stays NaN.

With MPGEMM_CONV_PATH=gemm, 1x1 convolutions at stride 1 without padding
run as GEMMs on every GPU (opt-in: slower than the Hopper convolution).

On Hopper GPUs the default takes the Hopper convolution for the passes it
measured faster on: on its narrow tiles (128 x 128 and 128 x 64) for passes
whose N is at most 128, with strided dgrad storing dx's rows through shared
memory, and fprop and wgrad of few input channels (a first layer's) through
copies with their taps folded into the channels (x folded a thread per 16 bytes),
a strided dgrad's phases, their rows staged, in one launch
(MPGEMM_CHUNKED_FOLD=0 and MPGEMM_DGRAD_ONE_LAUNCH=0 turn those two off).
Each case also runs with
MPGEMM_CONV_PATH=wgmma (the Hopper convolution wherever its geometry
allows) on its wide tile with dx's rows stored from registers
(MPGEMM_NARROW_TILES=0, MPGEMM_STAGED_ROW_STORES=0), with that on the narrow
tiles (MPGEMM_NARROW_TILES=1), and with =wmma (the WMMA kernels alone, the
default of every other GPU). With MPGEMM_M64_TILE=1 (opt-in until these
tests pass on a GPU), wgrad of at most 64 filters runs on the 64-row tile;
with MPGEMM_GATHERED_FOLD=1 (opt-in too), the folded taps' producer gathers
x's fold itself. With MPGEMM_DEPTHWISE_SLIDING_WGRAD=1 (opt-in, every GPU),
depthwise wgrad runs on the sliding window, with
MPGEMM_DEPTHWISE_SLIDING_GATHER=1 (opt-in, every GPU) depthwise fprop and
dgrad; with MPGEMM_CONV_N16_TILE=1
(opt-in, sm_80 and newer), fprop and dgrad of at most 16 filters or
channels per group run on the WMMA kernels' 128 x 16 tile."""

import re

import pytest
import torch
import torch.nn.functional as F

import mpgemm
from mpgemm.testing import relative_error

from support import launches, nan_filled_outputs, set_environment
from test_conv import CASES, RESNET50

pytestmark = pytest.mark.gpu

HAS_BF16 = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 0)
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="bf16 Tensor Cores need sm_80")
DTYPES = [torch.float16, pytest.param(torch.bfloat16, marks=needs_bf16)]
IS_HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
needs_hopper = pytest.mark.skipif(not IS_HOPPER, reason="the Hopper convolution needs an sm_90 GPU")
# MPGEMM_CONV_PATH values: the defaults everywhere, each path forced on
# Hopper; "wgmma" on the wide tile with dx's rows from registers,
# "wgmma_narrow" the same on the narrow tiles.
CONV_PATHS = ["auto"] + [pytest.param(path, marks=needs_hopper) for path in ("wgmma", "wgmma_narrow", "wmma")]


@pytest.fixture(params=CONV_PATHS)
def conv_path(request, monkeypatch):
    monkeypatch.setenv("MPGEMM_CONV_PATH", request.param.removesuffix("_narrow"))
    if request.param.startswith("wgmma"):
        monkeypatch.setenv("MPGEMM_NARROW_TILES", "1" if request.param.endswith("_narrow") else "0")
        monkeypatch.setenv("MPGEMM_STAGED_ROW_STORES", "0")
    else:
        monkeypatch.delenv("MPGEMM_NARROW_TILES", raising=False)
        monkeypatch.delenv("MPGEMM_STAGED_ROW_STORES", raising=False)
    return request.param

# Per input type: (reference, bound on ||out - ref|| / ||ref|| for the fp32
# output, bound for the gradients), the references on the same rounded inputs
# and output gradient. Against float64 mpgemm's output differs only in fp32
# accumulation. cuDNN in the input type rounds its own output to it: fp16 keeps
# 11 significant bits, bf16 8, so one bf16 rounding errs by up to 2**-8 = 3.9e-3
# of an element (about 2**-9 on average). The gradients of 16-bit tensors are
# 16-bit themselves, one more such rounding on mpgemm's side: looser bounds.
REFERENCES = {
    torch.float16: [(torch.float64, 1e-3, 5e-3), (torch.float16, 3e-3, 1.5e-2)],
    torch.bfloat16: [(torch.float64, 1e-3, 1e-2), (torch.bfloat16, 8e-3, 2e-2)],
}


def compare(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """mpgemm.conv2d and both gradients against cuDNN and float64. x's dtype
    (fp16 or bf16) is the products' input type; weight may be fp32."""
    dtype = x.dtype
    x = x.detach().requires_grad_()
    weight = weight.detach().requires_grad_()
    xq, wq = x.detach().to(dtype), weight.detach().to(dtype)  # the values the Tensor Cores see
    out_shape = F.conv2d(x.to("meta"), weight.to("meta"), None, stride, padding, dilation, groups).shape
    with nan_filled_outputs():
        out = mpgemm.conv2d(x, weight, bias, stride, padding, dilation, groups, out_dtype=torch.float32)
    assert not out.isnan().any(), "an output element was not written"
    grad = torch.randn_like(out).to(dtype)  # the ops round dL/dy to the input type
    with nan_filled_outputs():
        grad_x, grad_w = torch.autograd.grad(out, (x, weight), grad.float())
    assert not grad_x.isnan().any() and not grad_w.isnan().any(), "a gradient element was not written"
    for ref_dtype, out_tolerance, grad_tolerance in REFERENCES[dtype]:
        xr, wr = xq.to(ref_dtype).requires_grad_(), wq.to(ref_dtype).requires_grad_()
        ref = F.conv2d(xr, wr, None if bias is None else bias.to(ref_dtype), stride, padding, dilation, groups)
        ref_x, ref_w = torch.autograd.grad(ref, (xr, wr), grad.to(ref_dtype))
        assert relative_error(out, ref.detach().double()) < out_tolerance, ref_dtype
        assert relative_error(grad_x, ref_x.double()) < grad_tolerance, f"grad x against {ref_dtype}"
        assert relative_error(grad_w, ref_w.double()) < grad_tolerance, f"grad weight against {ref_dtype}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c, k, kernel, stride, padding, size", RESNET50)
@pytest.mark.parametrize("batch", [1, 32])
def test_resnet50_layers_against_cudnn(c, k, kernel, stride, padding, size, batch, dtype, conv_path):
    x = torch.randn(batch, c, size, size, device="cuda").to(dtype).to(memory_format=torch.channels_last)
    weight = torch.randn(k, c, kernel, kernel, device="cuda") * (c * kernel * kernel) ** -0.5
    compare(x, weight, torch.randn(k, device="cuda"), stride, padding)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("x_shape, k, kernel, kwargs", CASES)
@pytest.mark.parametrize("channels_last", [False, True])
def test_cases_against_cudnn(x_shape, k, kernel, kwargs, channels_last, dtype, conv_path):
    x = torch.randn(*x_shape, device="cuda").to(dtype)
    if channels_last and x.dim() == 4:
        x = x.to(memory_format=torch.channels_last)
    c = x_shape[-3]
    weight = torch.randn(k, c // kwargs.get("groups", 1), kernel, kernel, device="cuda") * (c * kernel) ** -0.5
    compare(x, weight, torch.randn(k, device="cuda"), **kwargs)


@pytest.mark.parametrize("dtype", DTYPES)
def test_misaligned_channels_last_view(dtype):
    base = torch.randn(2 * 16 * 9 * 9 + 1, device="cuda").to(dtype)
    x = base[1:].view(2, 9, 9, 16).permute(0, 3, 1, 2)  # channels_last, 2-byte offset: the padded copy
    compare(x, torch.randn(8, 16, 3, 3, device="cuda") / 12, None, 1, 1)


@pytest.mark.skipif(not torch.cuda.is_available() or HAS_BF16, reason="checks a GPU older than sm_80")
def test_bf16_before_sm80_is_refused_with_a_clear_error():
    x = torch.randn(2, 8, 5, 5, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(8, 8, 3, 3, device="cuda")
    grad_out = torch.randn(2, 8, 3, 3, device="cuda")
    geometry = ([1, 1], [0, 0, 0, 0], [1, 1], 1)
    major, minor = torch.cuda.get_device_capability()
    device = f"{x.device} ({torch.cuda.get_device_name()}) is {major}.{minor}"
    for op, call in [
        ("mpgemm.conv2d", lambda: mpgemm.conv2d(x, weight)),
        ("mpgemm.conv2d backward", lambda: torch.ops.mpgemm.conv2d_grad_input(grad_out, x, weight, *geometry)),
        ("mpgemm.conv2d backward", lambda: torch.ops.mpgemm.conv2d_grad_weight(grad_out, x, weight, *geometry)),
        ("mpgemm.conv2d backward", lambda: torch.ops.mpgemm.conv2d_backward(grad_out, x, weight, *geometry)),
    ]:
        message = (f"{op}: torch.bfloat16 inputs need bf16 Tensor Cores (compute capability 8.0 or newer); "
                   f"{device}")
        with pytest.raises(RuntimeError, match=re.escape(message)):
            call()


def kernels_run(fn):
    """The names of the CUDA kernels fn launches."""
    return set(launches(fn))


def hopper_conv_kernels(names):
    """The Hopper convolution's kernels among `names`: the mainloop's, and
    strided dgrad's that stage dx's rows through shared memory (a launch a
    phase, or all phases in one)."""
    kernels = ("wgmma_conv_kernel", "wgmma_dgrad_staged_rows_kernel", "wgmma_dgrad_phases_kernel")
    return {name for name in names if any(kernel in name for kernel in kernels)}


@needs_hopper
@pytest.mark.parametrize("stride", [1, 2])  # 2: dgrad's phases of dx (in one launch by default)
@pytest.mark.parametrize("dtype", DTYPES)
def test_wgmma_conv_path_runs_the_hopper_kernels_for_every_pass(monkeypatch, dtype, stride):
    x = torch.randn(4, 64, 14, 14, device="cuda").to(dtype).to(memory_format=torch.channels_last).requires_grad_()
    weight = (torch.randn(128, 64, 3, 3, device="cuda") / 24).requires_grad_()

    def step():
        mpgemm.conv2d(x, weight, None, stride, 1).float().sum().backward()

    monkeypatch.setenv("MPGEMM_CONV_PATH", "wgmma")
    hopper = hopper_conv_kernels(kernels_run(step))
    assert len(hopper) == 3, hopper  # fprop, dgrad and wgrad
    monkeypatch.setenv("MPGEMM_CONV_PATH", "wmma")
    assert not any("wgmma" in name for name in kernels_run(step))
    # The default on Hopper: every pass of a convolution with taps.
    monkeypatch.delenv("MPGEMM_CONV_PATH")
    assert len(hopper_conv_kernels(kernels_run(step))) == 3


@needs_hopper
@pytest.mark.parametrize("narrow, small_wgrad_on_hopper", [(None, True), ("0", False)])
def test_the_hopper_default_takes_1x1_wgrads_on_narrow_tiles(monkeypatch, narrow, small_wgrad_on_hopper):
    """wgrad of a 1x1 with fewer than 2^19 filters x channels ran faster on
    the narrow Hopper tiles than on the WMMA kernels, and slower on the wide
    tile (H100, 2026-11-27 and -28): by default every pass on the Hopper
    kernels; with MPGEMM_NARROW_TILES=0 that wgrad on WMMA, and at 512 x
    1024 all three either way."""
    monkeypatch.delenv("MPGEMM_CONV_PATH", raising=False)
    set_environment(monkeypatch, "MPGEMM_NARROW_TILES", narrow)
    for channels, filters, hopper_passes in ((64, 128, 2 + small_wgrad_on_hopper), (512, 1024, 3)):
        x = torch.randn(2, channels, 8, 8, device="cuda").half().to(memory_format=torch.channels_last)
        weight = (torch.randn(filters, channels, 1, 1, device="cuda") / channels**0.5).half()
        x.requires_grad_(), weight.requires_grad_()

        def step():
            mpgemm.conv2d(x, weight).float().sum().backward()

        ran = kernels_run(step)
        assert len(hopper_conv_kernels(ran)) == hopper_passes, ran


@needs_hopper
@pytest.mark.parametrize("filters, tile", [(64, "WgmmaN64Tile"), (128, "WgmmaN128Tile"), (256, "WgmmaTile")])
def test_narrow_tiles_run_where_asked_for(monkeypatch, filters, tile):
    """The narrow tiles (by default, or MPGEMM_NARROW_TILES=1) put fprop on
    the tile its filters fill (196 tiles of 128 x 128, enough to keep the
    128-column tile; dgrad: its 64 channels, wgrad: 9 x 64 columns on the
    wide tile); with '0', every pass on the wide tile. Right against float32
    either way."""
    monkeypatch.setenv("MPGEMM_CONV_PATH", "wgmma")
    x = torch.randn(32, 64, 28, 28, device="cuda").half().to(memory_format=torch.channels_last).requires_grad_()
    weight = (torch.randn(filters, 64, 3, 3, device="cuda") / 24).half().requires_grad_()
    expected = F.conv2d(x.float(), weight.float(), None, 1, 1)
    for narrow, tiles in ((None, {tile, "WgmmaN64Tile", "WgmmaTile"}), ("1", {tile, "WgmmaN64Tile", "WgmmaTile"}),
                          ("0", {"WgmmaTile"})):
        set_environment(monkeypatch, "MPGEMM_NARROW_TILES", narrow)
        out = []

        def step():
            y = mpgemm.conv2d(x, weight, None, 1, 1)
            out.append(y.float())
            y.float().sum().backward()

        ran = hopper_conv_kernels(kernels_run(step))
        assert {t for t in ("WgmmaTile", "WgmmaN128Tile", "WgmmaN64Tile") if any(t in name for name in ran)} == tiles
        assert relative_error(out[0], expected) < 1e-3


# wgrad of at most 64 filters over more than 128 columns: ResNet-50's
# 64-filter 3x3 (576 columns) and 256 to 64 1x1 (256), 40 filters over
# 3x3 of 24 channels (each tap padded to 64: 576), 8 filters over 5x5 of
# 8; the first layer, whose folded wgrad is 64 filters over 256 columns;
# and 7x7 taps of 1024 channels over 64 pixels: 196 tiles of one K slice,
# more than a GPU's blocks, so that each block's consumers take turns.
M64_WGRADS = [(64, 64, 3, 1, 1, 56, 4), (256, 64, 1, 1, 0, 56, 4), (24, 40, 3, 2, 1, 17, 3), (8, 8, 5, 1, 2, 9, 2),
              (3, 64, 7, 2, 3, 224, 2), (1024, 64, 7, 1, 3, 8, 1)]


@needs_hopper
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c, k, kernel, stride, padding, size, batch", M64_WGRADS)
def test_m64_tile_takes_wgrad_of_few_filters(monkeypatch, c, k, kernel, stride, padding, size, batch, dtype):
    """MPGEMM_M64_TILE=1: wgrad of at most 64 filters over more than 128
    columns runs on the 64-row tile (WgmmaM64Tile, its consumers taking
    64 x 256 tiles in turn; only wgrad has kernels on it), on the default
    path and forced, right against cuDNN and float64; unset, never; a bad
    value refused."""
    x = torch.randn(batch, c, size, size, device="cuda").to(dtype).to(memory_format=torch.channels_last)
    weight = torch.randn(k, c, kernel, kernel, device="cuda") * (c * kernel * kernel) ** -0.5
    for path in ("wgmma", None):
        set_environment(monkeypatch, "MPGEMM_CONV_PATH", path)
        monkeypatch.setenv("MPGEMM_M64_TILE", "1")
        compare(x, weight, None, stride, padding)
        w = weight.to(dtype).requires_grad_()

        def step():
            mpgemm.conv2d(x, w, None, stride, padding).float().sum().backward()

        ran = hopper_conv_kernels(kernels_run(step))  # fprop and wgrad (x needs no gradient)
        assert len(ran) == 2 and sum("WgmmaM64Tile" in name for name in ran) == 1, ran
        monkeypatch.delenv("MPGEMM_M64_TILE")
        assert not any("WgmmaM64Tile" in name for name in hopper_conv_kernels(kernels_run(step))), path
    monkeypatch.setenv("MPGEMM_M64_TILE", "yes")
    with pytest.raises(ValueError, match="MPGEMM_M64_TILE"):
        mpgemm.conv2d(x, weight.to(dtype).requires_grad_(), None, stride, padding).sum().backward()


# Few-channel layers whose fprop and wgrad fold their taps: ResNet's first
# layer, a CIFAR stem, odd ones.
FOLDED = [(3, 64, 7, 2, 3, 224, 8), (3, 16, 3, 1, 1, 32, 16), (4, 24, 5, 2, 2, 33, 4), (1, 8, 7, 3, 0, 20, 2)]


@needs_hopper
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c, k, kernel, stride, padding, size, batch", FOLDED)
def test_few_channels_fold_their_taps(monkeypatch, c, k, kernel, stride, padding, size, batch, dtype):
    """MPGEMM_CONV_PATH=wgmma: fprop and wgrad of few input channels
    (ResNet's first layer, a CIFAR stem, odd ones) run on the Hopper
    convolution of copies with their taps folded into the channels
    (conv/folded_taps.h), right against cuDNN and float64; a training step
    whose image needs no gradient runs no dgrad; x is folded in 16-byte
    chunks (the default). By default the same kernels run: fprop and wgrad
    fold their taps (wgrad's filter gradient unfolded)."""
    monkeypatch.setenv("MPGEMM_CONV_PATH", "wgmma")
    x = torch.randn(batch, c, size, size, device="cuda").to(dtype).to(memory_format=torch.channels_last)
    weight = torch.randn(k, c, kernel, kernel, device="cuda") * (c * kernel * kernel) ** -0.5
    compare(x, weight, torch.randn(k, device="cuda"), stride, padding)
    weight = weight.to(dtype).requires_grad_()

    def step():
        mpgemm.conv2d(x, weight, None, stride, padding).float().sum().backward()

    ran = {name for name in kernels_run(step) if "mpgemm" in name}
    folds = [name for name in ran if "fold_input" in name]
    assert len(folds) == 1 and "fold_input_chunks_kernel" in folds[0], ran
    assert any("fold_filters_kernel" in name for name in ran) and any("unfold_filter" in name for name in ran), ran
    assert len(hopper_conv_kernels(ran)) == 2, ran  # fprop and wgrad, no dgrad
    assert not any("conv2d_kernel" in name or "padded_copy" in name for name in ran), ran
    monkeypatch.delenv("MPGEMM_CONV_PATH")
    assert {name for name in kernels_run(step) if "mpgemm" in name} == ran


def checked_layer(c, k, kernel, stride, padding, size, batch, dtype):
    """A layer's x, filters and dy, random (x channels_last, the filters a
    leaf that requires its gradient), the layer checked first by compare on
    the path the environment names."""
    x = torch.randn(batch, c, size, size, device="cuda").to(dtype).to(memory_format=torch.channels_last)
    weight = torch.randn(k, c, kernel, kernel, device="cuda") * (c * kernel * kernel) ** -0.5
    compare(x, weight, torch.randn(k, device="cuda"), stride, padding)
    weight = weight.to(dtype).requires_grad_()
    y_shape = F.conv2d(x.to("meta"), weight.to("meta"), None, stride, padding).shape
    return x, weight, torch.randn(y_shape, device="cuda").to(dtype)


@needs_hopper
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c, k, kernel, stride, padding, size, batch", FOLDED)
def test_x_folded_in_chunks(monkeypatch, c, k, kernel, stride, padding, size, batch, dtype):
    """By default (MPGEMM_CHUNKED_FOLD unset or "1"), fprop and wgrad on
    folded taps fold x a thread per 16 bytes of the copy
    (fold_input_chunks_kernel), right against cuDNN and float64, and y and
    dw are bitwise the fold a thread per element's ("0": that one)."""
    monkeypatch.setenv("MPGEMM_CONV_PATH", "wgmma")
    monkeypatch.setenv("MPGEMM_CHUNKED_FOLD", "1")
    x, weight, dy = checked_layer(c, k, kernel, stride, padding, size, batch, dtype)
    results = {}
    for chunked in ("1", "0", None):
        set_environment(monkeypatch, "MPGEMM_CHUNKED_FOLD", chunked)
        weight.grad = None

        def step():
            y = mpgemm.conv2d(x, weight, None, stride, padding)
            y.backward(dy)
            results[chunked] = (y.detach(), weight.grad)

        with nan_filled_outputs():
            names = launches(step)
        # x folded twice, for fprop and for wgrad, by the kernel asked for; wgrad's gradient unfolded.
        kernel = "fold_input_kernel" if chunked == "0" else "fold_input_chunks_kernel"
        assert sum("fold_input" in name for name in names) == sum(kernel in name for name in names) == 2, names
        assert sum("unfold_filter" in name for name in names) == 1, names
    for y, dw in results.values():
        assert torch.equal(y, results["1"][0]) and torch.equal(dw, results["1"][1])


@needs_hopper
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c, k, kernel, stride, padding, size, batch", FOLDED)
def test_x_fold_gathered_by_the_producer(monkeypatch, c, k, kernel, stride, padding, size, batch, dtype):
    """MPGEMM_GATHERED_FOLD=1 (opt-in): fprop and wgrad on folded taps copy
    no fold of x; the Hopper convolution's producer gathers it into each
    stage itself (wgmma_gathered_fold_kernel), on the forced path and by
    default, the 64-row tile's wgrad included where asked. Right against
    cuDNN and float64, and y and dw bitwise those of x folded in chunks (the
    same folded problem, tiles and sums: only where the stage's bytes come
    from differs)."""
    monkeypatch.setenv("MPGEMM_CONV_PATH", "wgmma")
    monkeypatch.setenv("MPGEMM_GATHERED_FOLD", "1")
    x, weight, dy = checked_layer(c, k, kernel, stride, padding, size, batch, dtype)
    results = {}
    for path, gathered, m64 in (("wgmma", "1", None), ("auto", "1", None), ("wgmma", "1", "1"),
                                ("wgmma", None, None), ("wgmma", None, "1")):
        monkeypatch.setenv("MPGEMM_CONV_PATH", path)
        set_environment(monkeypatch, "MPGEMM_GATHERED_FOLD", gathered)
        set_environment(monkeypatch, "MPGEMM_M64_TILE", m64)
        weight.grad = None

        def step():
            y = mpgemm.conv2d(x, weight, None, stride, padding)
            y.backward(dy)
            results[path, gathered, m64] = (y.detach(), weight.grad)

        with nan_filled_outputs():
            names = launches(step)
        gathering = [name for name in names if "wgmma_gathered_fold_kernel" in name]
        if gathered:
            assert len(gathering) == 2 and not any("fold_input" in name for name in names), names
        else:
            assert not gathering and sum("fold_input_chunks_kernel" in name for name in names) == 2, names
        assert sum("unfold_filter" in name for name in names) == 1, names
    for (path, gathered, m64), (y, dw) in results.items():
        want = results["wgmma", None, m64]
        assert torch.equal(y, want[0]) and torch.equal(dw, want[1]), (path, gathered, m64)


def test_bad_gathered_fold_is_refused_with_a_clear_error(monkeypatch):
    x = torch.randn(2, 8, 5, 5, device="cuda").half()
    monkeypatch.setenv("MPGEMM_GATHERED_FOLD", "yes")
    with pytest.raises(ValueError, match="MPGEMM_GATHERED_FOLD must be '0' or '1', got 'yes'"):
        mpgemm.conv2d(x, torch.randn(8, 8, 3, 3, device="cuda"))


# Depthwise layers for the sliding-window wgrad: x's shape, the window (r, s)
# and conv2d's stride, padding and dilation: ConvNeXt's 7x7, MobileNet's 3x3
# at strides 1 and 2, EfficientNet's 5x5 at stride 2, a 7x7 over images
# smaller than it, a rectangular window with a row stride and dilation over
# 36 channels (a multiple of 4, not of 8), 132 channels (two tiles of 17 and
# 16 lanes) and 11 filter rows (at most 23 lanes a block: two tiles of 12).
SLIDING = [
    ((4, 96, 28, 28), (7, 7), dict(padding=3)),
    ((4, 144, 28, 28), (3, 3), dict(padding=1)),
    ((4, 144, 28, 28), (3, 3), dict(stride=2, padding=1)),
    ((4, 240, 14, 14), (5, 5), dict(stride=2, padding=2)),
    ((8, 384, 5, 5), (7, 7), dict(padding=3)),
    ((2, 36, 13, 11), (3, 5), dict(stride=(2, 1), padding=(2, 2), dilation=(2, 1))),
    ((2, 132, 10, 10), (3, 3), dict(padding=1)),
    ((2, 96, 20, 12), (11, 3), dict(padding=(5, 1))),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("x_shape, window, kwargs", SLIDING)
def test_depthwise_wgrad_on_the_sliding_window(monkeypatch, x_shape, window, kwargs, dtype):
    """MPGEMM_DEPTHWISE_SLIDING_WGRAD=1 (opt-in): depthwise wgrad runs
    depthwise_sliding_wgrad_kernel, once a backward, right against cuDNN and
    float64, and gives the same bits on a second run; without the switch it
    does not run."""
    c = x_shape[1]
    x = torch.randn(*x_shape, device="cuda").to(dtype).to(memory_format=torch.channels_last)
    weight = torch.randn(c, 1, *window, device="cuda") * (window[0] * window[1]) ** -0.5
    monkeypatch.setenv("MPGEMM_DEPTHWISE_SLIDING_WGRAD", "1")
    compare(x, weight, torch.randn(c, device="cuda"), groups=c, **kwargs)
    x = x.detach().requires_grad_()
    weight = weight.detach().requires_grad_()
    dy = torch.randn_like(mpgemm.conv2d(x.detach(), weight.detach(), groups=c, **kwargs)).to(dtype)
    grads = []
    for switch in ("1", "1", "0"):
        monkeypatch.setenv("MPGEMM_DEPTHWISE_SLIDING_WGRAD", switch)
        weight.grad = None

        def step():
            mpgemm.conv2d(x, weight, groups=c, **kwargs).backward(dy)

        with nan_filled_outputs():
            names = launches(step)
        grads.append(weight.grad)
        sliding = sum("depthwise_sliding_wgrad_kernel" in name for name in names)
        assert sliding == (switch == "1"), names
    assert torch.equal(grads[0], grads[1]), "two runs of the sliding window differ"
    assert relative_error(grads[0], grads[2].double()) < 1e-3


# Depthwise layers for the sliding gather (fprop; dgrad at column stride 1):
# x's shape, the window (r, s) and conv2d's stride, padding and dilation:
# ConvNeXt-T's two 7x7s, MobileNetV2's 3x3s at strides 1 and 2 (stride 2:
# fprop alone on the window), EfficientNet's 5x5 at stride 2, a 7x7 over
# images smaller than it, a row stride and dilation with 5 taps a row, 264
# channels (two tiles of lanes at 7 taps), and 40 channels of a 3x3 whose
# column dilation no kernel of the window takes.
SLIDING_GATHER = [
    ((4, 96, 28, 28), (7, 7), dict(padding=3)),
    ((8, 384, 14, 14), (7, 7), dict(padding=3)),
    ((4, 144, 28, 28), (3, 3), dict(padding=1)),
    ((4, 144, 28, 28), (3, 3), dict(stride=2, padding=1)),
    ((4, 240, 14, 14), (5, 5), dict(stride=2, padding=2)),
    ((8, 64, 5, 5), (7, 7), dict(padding=3)),
    ((2, 48, 13, 11), (3, 5), dict(stride=(2, 1), padding=(2, 2), dilation=(2, 1))),
    ((2, 264, 10, 10), (7, 7), dict(padding=3)),
    ((2, 40, 10, 10), (3, 3), dict(padding=2, dilation=2)),
]


def _sliding_gather_passes(stride, dilation):
    """The passes the sliding gather takes for conv2d's stride and dilation."""
    stride_w = stride[1] if isinstance(stride, tuple) else stride
    dilation_w = dilation[1] if isinstance(dilation, tuple) else dilation
    if dilation_w != 1:
        return set()
    return {"fprop", "dgrad"} if stride_w == 1 else {"fprop"}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("x_shape, window, kwargs", SLIDING_GATHER)
def test_depthwise_gather_on_the_sliding_window(monkeypatch, x_shape, window, kwargs, dtype):
    """MPGEMM_DEPTHWISE_SLIDING_GATHER=1 (opt-in): depthwise fprop (at column
    stride 1 and 2) and dgrad (at column stride 1) run
    depthwise_sliding_gather_kernel, right against cuDNN and float64, and give
    the gather kernel's bits (the switch off: the same products in the same
    order); where the window does not fit, the gather kernel runs."""
    c = x_shape[1]
    x = torch.randn(*x_shape, device="cuda").to(dtype).to(memory_format=torch.channels_last)
    weight = torch.randn(c, 1, *window, device="cuda") * (window[0] * window[1]) ** -0.5
    bias = torch.randn(c, device="cuda")
    monkeypatch.setenv("MPGEMM_DEPTHWISE_SLIDING_GATHER", "1")
    compare(x, weight, bias, groups=c, **kwargs)
    x = x.detach().requires_grad_()
    weight = weight.detach()
    dy = torch.randn_like(mpgemm.conv2d(x.detach(), weight, groups=c, **kwargs)).to(dtype)
    taken = _sliding_gather_passes(kwargs.get("stride", 1), kwargs.get("dilation", 1))
    results, counts = {}, {}
    for switch in ("1", "0"):
        monkeypatch.setenv("MPGEMM_DEPTHWISE_SLIDING_GATHER", switch)
        x.grad = None
        outputs = []

        def step():
            y = mpgemm.conv2d(x, weight, bias, groups=c, **kwargs)
            y.backward(dy)
            outputs.append(y.detach())

        with nan_filled_outputs():
            names = launches(step)
        results[switch] = (outputs[0], x.grad)
        counts[switch] = (sum("depthwise_sliding_gather_kernel" in name for name in names),
                          sum("depthwise_gather_kernel" in name for name in names))
    # Every launch of the gather (fprop's, and one a dgrad phase) on one kernel or the other.
    assert counts["0"][0] == 0 and sum(counts["1"]) == counts["0"][1], counts
    assert (counts["1"][0] > 0) == bool(taken) and (counts["1"][1] == 0) == (taken == {"fprop", "dgrad"}), counts
    for on, off in zip(results["1"], results["0"]):
        assert torch.equal(on, off), "the sliding gather's bits are not the gather kernel's"


def test_bad_depthwise_sliding_gather_is_refused_with_a_clear_error(monkeypatch):
    x = torch.randn(2, 8, 5, 5, device="cuda").half()
    monkeypatch.setenv("MPGEMM_DEPTHWISE_SLIDING_GATHER", "yes")
    with pytest.raises(ValueError, match="MPGEMM_DEPTHWISE_SLIDING_GATHER must be '0' or '1', got 'yes'"):
        mpgemm.conv2d(x, torch.randn(8, 1, 3, 3, device="cuda"), groups=8)


def test_bad_depthwise_sliding_wgrad_is_refused_with_a_clear_error(monkeypatch):
    x = torch.randn(2, 8, 5, 5, device="cuda").half()
    monkeypatch.setenv("MPGEMM_DEPTHWISE_SLIDING_WGRAD", "yes")
    with pytest.raises(ValueError, match="MPGEMM_DEPTHWISE_SLIDING_WGRAD must be '0' or '1', got 'yes'"):
        mpgemm.conv2d(x, torch.randn(8, 1, 3, 3, device="cuda"), groups=8)


# The 128 x 16 tile (MPGEMM_CONV_N16_TILE=1): ResNeXt-50 32x4d's grouped 3x3s
# (4 channels a group, on 8-byte chunks in place; 8, the first of its stage
# at stride 2, and 16, on 16-byte ones), a first layer's dgrad (3 channels:
# the padded copy, 8-byte chunks), an output layer of 3 filters (a U-Net's
# or a diffusion model's), 12 channels in 3 groups at stride 4 (dgrad
# phases that no tap of the 3x3 reaches) and one 5x5 filter over 16
# channels. (c, k, kernel, stride, padding, size, batch, groups)
N16_LAYERS = [(128, 128, 3, 1, 1, 28, 4, 32), (256, 256, 3, 2, 1, 28, 4, 32), (512, 512, 3, 1, 1, 7, 4, 32),
              (3, 64, 7, 2, 3, 64, 2, 1), (64, 3, 3, 1, 1, 32, 2, 1), (12, 12, 3, 4, 1, 17, 2, 3),
              (16, 1, 5, 1, 2, 12, 2, 1)]
HAS_N16 = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 0)


def passes_on_n16(names):
    """The passes (0 fprop, 1 dgrad) of the 128 x 16 tile's kernels among `names`, one a launch."""
    return sorted(int(m[1]) for name in names if (m := re.search(r"N16Tile, \(mpgemm::kernels::ConvPass\)(\d)", name)))


@pytest.mark.parametrize("path", ["wmma", "auto"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c, k, kernel, stride, padding, size, batch, groups", N16_LAYERS)
def test_n16_tile_takes_passes_of_at_most_16_columns(monkeypatch, c, k, kernel, stride, padding, size, batch, groups,
                                                     dtype, path):
    """MPGEMM_CONV_N16_TILE=1 (opt-in; sm_80 and newer, below which the
    plans keep the other tiles): where the WMMA kernels run fprop of at most
    16 filters per group or dgrad of at most 16 channels per group (forced,
    or by default: on Hopper what the Hopper convolution does not take),
    they run on the 128 x 16 tile, right against cuDNN and float64, the same
    bits on a second run; without the switch the tile does not run."""
    monkeypatch.setenv("MPGEMM_CONV_PATH", path)
    x = torch.randn(batch, c, size, size, device="cuda").to(dtype).to(memory_format=torch.channels_last)
    weight = torch.randn(k, c // groups, kernel, kernel, device="cuda") * (c // groups * kernel * kernel) ** -0.5
    monkeypatch.setenv("MPGEMM_CONV_N16_TILE", "1")
    compare(x, weight, torch.randn(k, device="cuda"), stride, padding, groups=groups)
    x = x.detach().requires_grad_()
    weight = weight.detach().to(dtype).requires_grad_()
    dy = torch.randn_like(mpgemm.conv2d(x.detach(), weight.detach(), None, stride, padding, 1, groups))
    n16_passes = {p for p, n in ((0, k), (1, c)) if n // groups <= 16} if HAS_N16 else set()
    # By default on sm_90 the Hopper convolution takes these layers' passes of one group whose channels it
    # reads in 16-byte chunks: fprop where x's are, dgrad where dy's are too. (Folded taps take fprop of a
    # few channels, none of whose N here is at most 16.)
    if path == "auto" and IS_HOPPER and groups == 1 and c % 8 == 0:
        n16_passes -= {0} | ({1} if k % 8 == 0 else set())
    results = []
    for switch in ("1", "1", "0"):
        monkeypatch.setenv("MPGEMM_CONV_N16_TILE", switch)
        x.grad = weight.grad = None
        outputs = []

        def step():
            y = mpgemm.conv2d(x, weight, None, stride, padding, 1, groups)
            y.backward(dy)
            outputs.append(y.detach())

        with nan_filled_outputs():
            names = launches(step)
        results.append((outputs[0], x.grad, weight.grad))
        assert set(passes_on_n16(names)) == (n16_passes if switch == "1" else set()), names
    for first, second in zip(results[0], results[1]):
        assert torch.equal(first, second), "two runs of the 128 x 16 tile differ"
    for n16, other in zip(results[0], results[2]):
        assert relative_error(n16, other.double()) < 1e-2


def test_bad_n16_tile_is_refused_with_a_clear_error(monkeypatch):
    x = torch.randn(2, 8, 5, 5, device="cuda").half()
    monkeypatch.setenv("MPGEMM_CONV_N16_TILE", "yes")
    with pytest.raises(ValueError, match="MPGEMM_CONV_N16_TILE must be '0' or '1', got 'yes'"):
        mpgemm.conv2d(x, torch.randn(8, 8, 3, 3, device="cuda"))


STRIDED = [(c, k, kernel, stride, padding, size) for c, k, kernel, stride, padding, size in RESNET50 if stride > 1]


# Strided dgrad on the Hopper convolution: ResNet-50's strided layers, strides
# of 3 (9 phases) and 2 x 3 (6), a 1x1 at stride 2 whose unreached phases must
# be zeros, and on each narrow tile (MPGEMM_NARROW_TILES=1: 128 channels over
# 196 tiles, 64 over 4).
STRIDED_DGRAD_CASES = ([layer + (8, "WgmmaTile") for layer in STRIDED if layer[0] > 3] +
                       [(16, 16, 3, 3, 1, 11, 2, "WgmmaTile"), (24, 40, 1, 2, 0, 9, 3, "WgmmaTile"),
                        (8, 8, 5, (2, 3), 2, 13, 2, "WgmmaTile"),
                        (128, 128, 3, 2, 1, 56, 8, "WgmmaN128Tile"), (64, 72, 3, 2, 1, 15, 2, "WgmmaN64Tile")])


def strided_dgrad_case(monkeypatch, c, k, kernel, stride, padding, size, batch, tile, dtype):
    """A STRIDED_DGRAD_CASES case on the Hopper convolution forced (on `tile`),
    right against cuDNN and float64 as the environment now asks; x (requiring
    its gradient) and the filters."""
    monkeypatch.setenv("MPGEMM_CONV_PATH", "wgmma")
    monkeypatch.setenv("MPGEMM_NARROW_TILES", "0" if tile == "WgmmaTile" else "1")
    x = torch.randn(batch, c, size, size, device="cuda").to(dtype).to(memory_format=torch.channels_last)
    weight = torch.randn(k, c, kernel, kernel, device="cuda") * (c * kernel * kernel) ** -0.5
    compare(x, weight, None, stride, padding)
    return x.requires_grad_(), weight.to(dtype)


@needs_hopper
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c, k, kernel, stride, padding, size, batch, tile", STRIDED_DGRAD_CASES)
def test_staged_row_stores(monkeypatch, c, k, kernel, stride, padding, size, batch, tile, dtype):
    """By default (or MPGEMM_STAGED_ROW_STORES=1), strided dgrad on the
    Hopper convolution stores each phase's rows of dx through shared memory,
    on its own kernel (ResNet-50's strided layers, strides of 3 and 2 x 3, a
    1x1 at stride 2 whose unreached phases must be zeros, and on each narrow
    tile), right against cuDNN and float64; '0' keeps the registers'
    stores. A launch a phase (MPGEMM_DGRAD_ONE_LAUNCH=0; the default's one
    launch has its own test below)."""
    monkeypatch.setenv("MPGEMM_STAGED_ROW_STORES", "1")
    monkeypatch.setenv("MPGEMM_DGRAD_ONE_LAUNCH", "0")
    x, weight = strided_dgrad_case(monkeypatch, c, k, kernel, stride, padding, size, batch, tile, dtype)

    def step():
        mpgemm.conv2d(x, weight, None, stride, padding).float().sum().backward()

    for staged in (None, "1", "0"):
        set_environment(monkeypatch, "MPGEMM_STAGED_ROW_STORES", staged)
        ran = {name for name in kernels_run(step) if "wgmma_dgrad_staged_rows_kernel" in name}
        assert len(ran) == (staged != "0") and all(tile in name for name in ran), ran


@needs_hopper
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c, k, kernel, stride, padding, size, batch, tile", STRIDED_DGRAD_CASES)
def test_dgrad_phases_in_one_launch(monkeypatch, c, k, kernel, stride, padding, size, batch, tile, dtype):
    """By default (MPGEMM_DGRAD_ONE_LAUNCH unset or "1"), strided dgrad on the Hopper
    convolution, its rows staged, runs all its phases in one launch of its
    own kernel where it has at most four (a stride of 2 x 2), with no memset
    of dx (the phases no tap reaches are stored as zeros by that launch),
    right against cuDNN and float64; more phases (strides of 3, 2 x 3) keep
    a launch a phase, as does '0'."""
    monkeypatch.setenv("MPGEMM_DGRAD_ONE_LAUNCH", "1")
    x, weight = strided_dgrad_case(monkeypatch, c, k, kernel, stride, padding, size, batch, tile, dtype)
    y = mpgemm.conv2d(x, weight, None, stride, padding)
    dy = torch.randn_like(y)
    strides = stride if isinstance(stride, tuple) else (stride, stride)
    fits = strides[0] * strides[1] <= 4

    def dgrad():
        torch.autograd.grad(y, x, dy, retain_graph=True)

    for one_launch in ("1", "0", None):
        set_environment(monkeypatch, "MPGEMM_DGRAD_ONE_LAUNCH", one_launch)
        names = launches(dgrad)
        once = sum("wgmma_dgrad_phases_kernel" in name for name in names)
        phases = sum("wgmma_dgrad_staged_rows_kernel" in name for name in names)
        if one_launch != "0" and fits:
            assert once == 1 and phases == 0 and not any("emset" in name for name in names), names
        else:
            assert once == 0 and phases > 0, names


def test_bad_chunked_fold_is_refused_with_a_clear_error(monkeypatch):
    x = torch.randn(2, 8, 5, 5, device="cuda").half()
    monkeypatch.setenv("MPGEMM_CHUNKED_FOLD", "yes")
    with pytest.raises(ValueError, match="MPGEMM_CHUNKED_FOLD must be '0' or '1', got 'yes'"):
        mpgemm.conv2d(x, torch.randn(8, 8, 3, 3, device="cuda"))


def test_bad_dgrad_one_launch_is_refused_with_a_clear_error(monkeypatch):
    x = torch.randn(2, 8, 5, 5, device="cuda").half()
    monkeypatch.setenv("MPGEMM_DGRAD_ONE_LAUNCH", "yes")
    with pytest.raises(ValueError, match="MPGEMM_DGRAD_ONE_LAUNCH must be '0' or '1', got 'yes'"):
        mpgemm.conv2d(x, torch.randn(8, 8, 3, 3, device="cuda"))


def test_bad_staged_row_stores_is_refused_with_a_clear_error(monkeypatch):
    x = torch.randn(2, 8, 5, 5, device="cuda").half()
    monkeypatch.setenv("MPGEMM_STAGED_ROW_STORES", "yes")
    with pytest.raises(ValueError, match="MPGEMM_STAGED_ROW_STORES must be '0' or '1', got 'yes'"):
        mpgemm.conv2d(x, torch.randn(8, 8, 3, 3, device="cuda"))


ONE_BY_ONE = [(c, k, size) for c, k, kernel, stride, padding, size in RESNET50 if kernel == 1 and stride == 1]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c, k, size", ONE_BY_ONE + [(3, 5, 9), (20, 36, 7)])
@pytest.mark.parametrize("batch", [1, 8])
def test_one_by_one_convolutions_as_gemms(c, k, size, batch, dtype, monkeypatch):
    """MPGEMM_CONV_PATH=gemm: a 1x1 at stride 1 without padding runs every
    pass as the GEMM it is (ResNet-50's, and channels no 16-byte chunk
    divides), on the GEMM's kernels and no convolution kernel, right against
    cuDNN and float64."""
    monkeypatch.setenv("MPGEMM_CONV_PATH", "gemm")
    x = torch.randn(batch, c, size, size, device="cuda").to(dtype).to(memory_format=torch.channels_last)
    weight = torch.randn(k, c, 1, 1, device="cuda") * c**-0.5
    # mpgemm's kernels (the references' cuDNN ones aside).
    ran = {name for name in kernels_run(lambda: compare(x, weight, torch.randn(k, device="cuda")))
           if "mpgemm" in name}
    assert not any("conv" in name for name in ran), ran
    assert any("gemm_kernel" in name for name in ran), ran


def test_bad_conv_path_is_refused_with_a_clear_error(monkeypatch):
    x = torch.randn(2, 8, 5, 5, device="cuda").half()
    monkeypatch.setenv("MPGEMM_CONV_PATH", "hopper")
    with pytest.raises(ValueError, match="MPGEMM_CONV_PATH must be 'auto', 'wgmma', 'wmma' or 'gemm', got 'hopper'"):
        mpgemm.conv2d(x, torch.randn(8, 8, 3, 3, device="cuda"))


@pytest.mark.parametrize("path", ["wmma", "auto"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("c, k, kernel, stride", [(64, 64, 3, 1), (256, 128, 1, 2), (3, 64, 7, 2), (64, 40, 3, 1)])
def test_conv2d_batch_stats_from_the_epilogue(monkeypatch, path, dtype, c, k, kernel, stride):
    """fprop with its batch statistics: gathered in the epilogue by the WMMA
    implicit GEMM (channels multiples of 8) and on sm_90 by the Hopper
    convolution (its default, first layers on folded taps included), from
    y elsewhere (the padded path). y is conv2d's, bit for bit; the
    statistics match float64 ones of y (a constant channel's variance 0)
    and are the same bits on every run."""
    monkeypatch.setenv("MPGEMM_CONV_PATH", path)
    x = (torch.randn(8, c, 28, 28, device="cuda") + 1.0).to(dtype).to(memory_format=torch.channels_last)
    weight = torch.randn(k, c, kernel, kernel, device="cuda", dtype=dtype) / (c * kernel * kernel) ** 0.5
    weight[0] = 0  # channel 0 of y is all zeros
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        y, stats = mpgemm.ops.conv2d_batch_stats(x, weight, None, stride, kernel // 2)
        torch.cuda.synchronize()
    moments_kernels = [e.name for e in profile.events() if "moments_kernel" in e.name]
    assert bool(moments_kernels) == (c % 8 == 0 or (IS_HOPPER and path == "auto")), moments_kernels
    assert torch.equal(y, mpgemm.conv2d(x, weight, None, stride, kernel // 2))
    y64 = y.double()
    want = torch.stack([y64.mean((0, 2, 3)), y64.var((0, 2, 3), unbiased=False)])
    torch.testing.assert_close(stats.double(), want, rtol=1e-5, atol=1e-6)
    assert stats[0, 0] == 0 and stats[1, 0] == 0
    for _ in range(3):
        assert torch.equal(mpgemm.ops.conv2d_batch_stats(x, weight, None, stride, kernel // 2)[1], stats)
