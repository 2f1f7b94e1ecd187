"""The stem's max pool fused into batch norm and ReLU:
mpgemm.batch_norm_relu_max_pool (one pass forward) and
mpgemm.max_pool_window_backward (the pool's and ReLU's gradient, a gather),
on every backend. The forward gives the bits of torch's max pool of
batch_norm_act's output (the first maximum, the last NaN) and its window
bytes name torch's indices; the gradient is torch's pool and ReLU gradient
summed in fp32 (against float64 on the CPU, bit for bit against torch's CUDA
pool on the GPU, whose sums are fp32 too); bad windows are named."""

import itertools

import pytest
import torch
import torch.nn.functional as F

import mpgemm  # noqa: F401  (registers the ops)
from support import launches, nan_filled_outputs

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DTYPES = [torch.float16, torch.bfloat16, torch.float32]
ops = torch.ops.mpgemm
MOMENTUM, EPS = 0.1, 1e-5
# (kernel_size, stride, padding, dilation, ceil_mode): ResNet's stem, windows that do not overlap, a
# dilated one, ceil_mode's partial last windows, an asymmetric one, and ceil_mode's window that would start
# in the padding (dropped: 9 rows give 5, not 6).
WINDOWS = [([3, 3], [2, 2], [1, 1], [1, 1], False), ([2, 2], [2, 2], [0, 0], [1, 1], False),
           ([3, 3], [1, 1], [1, 1], [2, 2], False), ([3, 3], [2, 2], [0, 0], [1, 1], True),
           ([3, 2], [2, 1], [1, 0], [1, 2], True), ([2, 2], [2, 2], [1, 1], [1, 1], True)]


def chain_inputs(shape, dtype, device, channels_last=True, nans=0):
    """y of few distinct values (windows tie), a few NaNs where asked, and the
    per-channel parameters."""
    y = torch.randint(-3, 4, shape, device=device).to(dtype) / 4
    if nans:
        y.view(-1)[torch.randperm(y.numel(), device=device)[:nans]] = float("nan")
    y = y.contiguous(memory_format=torch.channels_last) if channels_last else y
    c = shape[1]
    return y, torch.rand(c, device=device) + 0.5, torch.randn(c, device=device)


def torch_pool(out, window):
    kernel, stride, padding, dilation, ceil_mode = window
    return F.max_pool2d_with_indices(out, kernel, stride, padding, dilation, ceil_mode)


def assert_bytes_name_the_first_maximum(taps, out, full, window):
    """Each window byte, read on its own: the tap it names holds the pooled
    value (the last NaN where there is one, else the first maximum: no
    earlier tap as large), its top bit set where that value is above zero."""
    kernel, stride, padding, dilation, _ = window
    n, c, h, w = full.shape
    rows, columns = out.shape[2:]
    reach = [(o - 1) * s + (k - 1) * d + 1 for o, s, k, d in zip((rows, columns), stride, kernel, dilation)]
    padded = F.pad(full.double(), (padding[1], max(0, reach[1] - padding[1] - w),
                                   padding[0], max(0, reach[0] - padding[0] - h)), value=float("-inf"))
    values = F.unfold(padded, kernel, dilation=dilation, stride=stride)
    values = values.view(n, c, kernel[0] * kernel[1], -1)
    extent = [(p - (k - 1) * d - 1) // s + 1 for p, k, d, s in zip(padded.shape[2:], kernel, dilation, stride)]
    values = values.view(n, c, -1, *extent)[..., :rows, :columns]
    tap = (taps & 127).long().unsqueeze(2)
    chosen = values.gather(2, tap).squeeze(2)
    assert torch.equal(chosen.nan_to_num(-1), out.double().nan_to_num(-1))
    order = torch.arange(values.shape[2], device=values.device).view(1, 1, -1, 1, 1)
    before, after = order < tap, order > tap
    nan = chosen.isnan().unsqueeze(2)
    assert not ((values >= chosen.unsqueeze(2)) & before & ~nan).any()  # the first maximum
    assert not (values.isnan() & after & nan).any()  # the last NaN
    assert not (values.isnan() & ~nan).any(dim=2).logical_and(~chosen.isnan()).any()  # NaN wins
    assert torch.equal(taps >= 128, out > 0)


def taps_of(indices, pooled, window, width):
    """torch's flat indices (h * W + w) as the fused pool's window bytes."""
    kernel, stride, padding, dilation, _ = window
    oh = torch.arange(pooled.shape[2], device=pooled.device).view(1, 1, -1, 1)
    ow = torch.arange(pooled.shape[3], device=pooled.device).view(1, 1, 1, -1)
    row = (indices // width - (oh * stride[0] - padding[0])) // dilation[0]
    column = (indices % width - (ow * stride[1] - padding[1])) // dilation[1]
    return (row * kernel[1] + column + 128 * (pooled > 0)).to(torch.uint8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_forward_is_torchs_pool_of_the_chains_output(device, dtype, monkeypatch):
    # On CUDA, on the default finish and on the finish by lines (MPGEMM_BATCH_NORM_FINISH_BY_LINES=1), both ops.
    for finish_by_lines, (i, window) in itertools.product(["0", "1"] if device == "cuda" else ["0"],
                                                           enumerate(WINDOWS)):
        monkeypatch.setenv("MPGEMM_BATCH_NORM_FINISH_BY_LINES", finish_by_lines)
        y, weight, bias = chain_inputs((2, 16, 9, 11), dtype, device, channels_last=i != 3, nans=2 * (i == 0))
        running = [torch.randn(16, device=device), torch.rand(16, device=device) + 0.5]
        running_after = [r.clone() for r in running]
        with nan_filled_outputs():
            out, mean, invstd, scale, shift, taps = ops.batch_norm_relu_max_pool(
                y, weight, bias, *running, True, MOMENTUM, EPS, *window)
        full, *statistics = ops.batch_norm_act(y, weight, bias, None, *running_after, True, MOMENTUM, EPS, True)[:5]
        pooled, indices = torch_pool(full, window)
        assert torch.equal(out.nan_to_num(-1), pooled.nan_to_num(-1))
        assert out.isnan().any() == (i == 0)  # the NaNs, where there are some, reach the output
        assert out.is_contiguous(memory_format=torch.channels_last if i != 3 else torch.contiguous_format)
        assert taps.dtype == torch.uint8 and taps.shape == out.shape
        assert taps.is_contiguous(memory_format=torch.channels_last)
        assert torch.equal(taps, taps_of(indices, pooled, window, y.shape[3])), window
        assert_bytes_name_the_first_maximum(taps, out, full, window)
        for got, want in zip([mean, invstd, scale, shift, *running], statistics + running_after):
            torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)  # NaN where a channel holds one


def gradient_reference(full, grad_out, window):
    """torch's pool and ReLU gradient, in float64."""
    x = full.double().requires_grad_()
    kernel, stride, padding, dilation, ceil_mode = window
    F.max_pool2d(x, kernel, stride, padding, dilation, ceil_mode).backward(grad_out.double())
    return torch.where(full > 0, x.grad, 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_is_the_pools_and_relus_gradient(device, dtype):
    for window in WINDOWS:
        y, weight, bias = chain_inputs((2, 16, 9, 11), dtype, device)
        out, *_, taps = ops.batch_norm_relu_max_pool(y, weight, bias, None, None, True, MOMENTUM, EPS, *window)
        full = ops.batch_norm_act(y, weight, bias, None, None, None, True, MOMENTUM, EPS, True)[0]
        grad_out = (torch.randint(-64, 64, out.shape, device=device) / 16).to(dtype)
        with nan_filled_outputs():
            grad = ops.max_pool_window_backward(grad_out, taps, list(y.shape[2:]), *window)
        assert grad.dtype == dtype and grad.shape == y.shape
        assert grad.is_contiguous(memory_format=torch.channels_last)
        # Sixteenths: every sum exact, so the float64 one (the order of the sums is the GPU test's to check).
        assert torch.equal(grad, gradient_reference(full, grad_out, window).to(dtype)), window


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_gives_torchs_bits_and_the_cpu_backends(dtype):
    # ResNet-50's stem at batch 2 in 16-byte runs; 36 channels (runs of one) and a misaligned pooled
    # gradient, over the stem's window.
    window = WINDOWS[0]
    for shape, skewed in (((2, 64, 112, 112), False), ((3, 36, 15, 17), True)):
        y, weight, bias = chain_inputs(shape, dtype, "cuda", nans=3)
        y = y + torch.randn_like(y) / 64  # values that do not all tie
        with nan_filled_outputs():
            out, mean, invstd, scale, shift, taps = ops.batch_norm_relu_max_pool(
                y, weight, bias, None, None, True, MOMENTUM, EPS, *window)
        full = ops.batch_norm_act(y, weight, bias, None, None, None, True, MOMENTUM, EPS, True)[0]
        pooled, indices = torch_pool(full, window)
        assert torch.equal(out.nan_to_num(-1), pooled.nan_to_num(-1))
        assert torch.equal(taps, taps_of(indices, pooled, window, shape[3]))
        assert_bytes_name_the_first_maximum(taps, out, full, window)
        grad_out = torch.randn_like(out)
        if skewed:
            flat = torch.empty(grad_out.numel() + 1, dtype=dtype, device="cuda")[1:]
            n, c, h, w = grad_out.shape
            flat.view(n, h, w, c).permute(0, 3, 1, 2).copy_(grad_out)
            grad_out = flat.view(n, h, w, c).permute(0, 3, 1, 2)
        with nan_filled_outputs():
            grad = ops.max_pool_window_backward(grad_out, taps, list(shape[2:]), *window)
        # torch's CUDA pool adds its gradients in fp32, in the same order: the same bits.
        x = full.detach().requires_grad_()
        F.max_pool2d(x, *window[:4], ceil_mode=window[4]).backward(grad_out)
        assert torch.equal(grad, torch.where(full > 0, x.grad, 0))
        names = launches(lambda: ops.max_pool_window_backward(grad_out, taps, list(shape[2:]), *window))
        assert any("max_pool_grad_kernel" in n for n in names) and not any("max_pool_backward" in n for n in names)
        cpu = ops.batch_norm_relu_max_pool(y.cpu(), weight.cpu(), bias.cpu(), None, None, True, MOMENTUM, EPS,
                                           *window)
        # The statistics to fp32's rounding (the CPU's sums are fp64), the pooled output to the type's.
        torch.testing.assert_close(cpu[3], scale.cpu(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(cpu[0].double().nan_to_num(-1), out.cpu().double().nan_to_num(-1),
                                   rtol=1e-2, atol=1e-2)
        cpu_grad = ops.max_pool_window_backward(grad_out.cpu(), taps.cpu(), list(shape[2:]), *window)
        assert torch.equal(cpu_grad, grad.cpu())


@pytest.mark.parametrize("device", DEVICES)
def test_a_window_with_no_tap_inside_the_input(device):
    # Kernel 2, padding 1, dilation 3 over 2 columns: each window's taps fall at -1 and 2. torch gives -inf
    # there (its backward would write through the index it keeps); the byte is 0 on every backend, and no
    # gradient reaches the input.
    window = ([1, 2], [1, 2], [0, 1], [1, 3], False)
    y, weight, bias = chain_inputs((2, 8, 3, 2), torch.float16, device)
    out, *_, taps = ops.batch_norm_relu_max_pool(y, weight, bias, None, None, True, MOMENTUM, EPS, *window)
    full = ops.batch_norm_act(y, weight, bias, None, None, None, True, MOMENTUM, EPS, True)[0]
    assert torch.equal(out, torch_pool(full, window)[0]) and out.isneginf().all()
    assert torch.equal(taps, torch.zeros_like(taps))
    with nan_filled_outputs():
        grad = ops.max_pool_window_backward(torch.ones_like(out), taps, [3, 2], *window)
    assert torch.equal(grad, torch.zeros_like(y))


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batch_and_running_statistics(device):
    y = torch.empty(0, 8, 6, 6, device=device)
    out, mean, *_, taps = ops.batch_norm_relu_max_pool(y, None, None, None, None, True, MOMENTUM, EPS, *WINDOWS[0])
    assert out.shape == taps.shape == (0, 8, 3, 3) and mean.isnan().all()
    y, weight, bias = chain_inputs((2, 8, 6, 6), torch.float16, device)
    running = [torch.randn(8, device=device), torch.rand(8, device=device) + 0.5]
    out = ops.batch_norm_relu_max_pool(y, weight, bias, *running, False, MOMENTUM, EPS, *WINDOWS[0])[0]
    full = ops.batch_norm_act(y, weight, bias, None, *running, False, MOMENTUM, EPS, True)[0]
    assert torch.equal(out, torch_pool(full, WINDOWS[0])[0])


def test_bad_windows_are_named():
    y, c = torch.randn(2, 3, 8, 8), torch.randn(3)

    def forward(kernel=(3, 3), stride=(2, 2), padding=(1, 1), dilation=(1, 1), y=y):
        return ops.batch_norm_relu_max_pool(y, c, c, None, None, True, MOMENTUM, EPS, kernel, stride, padding,
                                            dilation, False)

    with pytest.raises(ValueError, match=r"batch_norm_relu_max_pool: expected kernel_size > 0, got \[0, 3\]"):
        forward(kernel=(0, 3))
    with pytest.raises(ValueError, match=r"expected stride > 0"):
        forward(stride=(2, 0))
    with pytest.raises(ValueError, match=r"expected at most 128 taps in the window .* got kernel_size \[12, 11\]"):
        forward(kernel=(12, 11))
    with pytest.raises(ValueError, match=r"expected padding at most half of kernel_size .* got padding \[2, 1\]"):
        forward(padding=(2, 1))
    with pytest.raises(ValueError, match=r"expected stride, padding and dilation at most 65535"):
        forward(dilation=(1, 70000))
    with pytest.raises(ValueError, match=r"the pooled output of a 8 x 8 input would be empty"):
        forward(kernel=(9, 9), stride=(1, 1), padding=(0, 0))
    with pytest.raises(ValueError, match=r"expected y to be 4-D"):
        forward(y=y[0])
    with pytest.raises(ValueError, match=r"expected stride of 2 values \(height, width\), got \[\]"):
        forward(stride=[])
    with pytest.raises(ValueError, match=r"expected kernel_size of 2 values \(height, width\), got \[3, 3, 3\]"):
        forward(kernel=[3, 3, 3])
    g, taps = torch.randn(2, 3, 4, 4), torch.zeros(2, 3, 4, 4, dtype=torch.uint8)
    window = WINDOWS[0]
    with pytest.raises(TypeError, match=r"max_pool_window_backward: expected window to be torch.uint8"):
        ops.max_pool_window_backward(g, taps.float(), [8, 8], *window)
    with pytest.raises(ValueError, match=r"expected window of grad_out's shape \[2, 3, 4, 4\], got \[2, 3, 4, 3\]"):
        ops.max_pool_window_backward(g, taps[..., :3], [8, 8], *window)
    with pytest.raises(ValueError, match=r"expected grad_out of 5 x 5 pixels \(the window over input_size "
                                         r"\[9, 9\]\), got 4 x 4"):
        ops.max_pool_window_backward(g, taps, [9, 9], *window)
    with pytest.raises(TypeError, match=r"expected grad_out to be torch.float32, torch.float16 or torch.bfloat16"):
        ops.max_pool_window_backward(g.double(), taps, [8, 8], *window)
    with pytest.raises(ValueError, match=r"expected input_size \(height, width\) > 0"):
        ops.max_pool_window_backward(g, taps, [0, 8], *window)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    y, weight, bias = chain_inputs((2, 8, 7, 6), torch.float16, device)
    y32, c5 = chain_inputs((2, 5, 5, 5), torch.float32, device, channels_last=False)[0], torch.randn(5, device=device)
    taps = ops.batch_norm_relu_max_pool(y, weight, bias, None, None, True, MOMENTUM, EPS, *WINDOWS[0])[5]
    samples = [
        (ops.batch_norm_relu_max_pool.default, (y, weight, bias, torch.zeros(8, device=device),
                                                torch.ones(8, device=device), True, MOMENTUM, EPS, *WINDOWS[0])),
        (ops.batch_norm_relu_max_pool.default, (y32, c5, None, None, None, True, MOMENTUM, EPS, *WINDOWS[4])),
        (ops.max_pool_window_backward.default, (torch.randn(taps.shape, device=device).half(), taps, [7, 6],
                                                *WINDOWS[0])),
    ]
    for op, args in samples:
        torch.library.opcheck(op, args)


def test_compiles_with_a_dynamic_batch():
    # The fake kernels keep the batch symbolic (the window's sizes are specialized): three batches, one graph.
    from mpgemm.fusion import batch_norm_relu_max_pool

    bn, pool = torch.nn.BatchNorm2d(8), torch.nn.MaxPool2d(3, 2, 1)
    frames = []

    def backend(graph_module, example_inputs):
        frames.append(graph_module)
        return graph_module.forward

    compiled = torch.compile(lambda y: batch_norm_relu_max_pool(y, bn, pool), backend=backend, dynamic=True,
                             fullgraph=True)
    for n in (2, 3, 5):
        y = chain_inputs((n, 8, 9, 9), torch.float16, "cpu")[0]
        with torch.no_grad():
            assert torch.equal(compiled(y), batch_norm_relu_max_pool(y, bn, pool))
    assert len(frames) == 1
