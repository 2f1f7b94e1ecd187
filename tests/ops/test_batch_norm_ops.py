"""The batch-norm ops (csrc/batch_norm_ops.cpp) on each backend: the forward
(statistics, running statistics, out) and backward (input gradient, gamma's
and beta's, the residual's) against float64 formulas; the elementwise steps
against the same fp32 steps in torch (bitwise: both round each step in fp32);
CUDA against the CPU backend and against itself (the sums' order is fixed);
the loads-ahead kernels (MPGEMM_BATCH_NORM_LOADS_AHEAD=1) bitwise the
default's, and the finish by lines (MPGEMM_BATCH_NORM_FINISH_BY_LINES=1) the
default's to fp32's last bits and bitwise its own; bad arguments; the
registrations (opcheck). Outputs start as NaN (support.nan_filled_outputs):
an element a kernel does not write stays NaN."""

import numpy as np
import pytest
import torch

import mpgemm  # noqa: F401  (registers the ops)
from support import launches, nan_filled_outputs

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
ops = torch.ops.mpgemm
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (N, C, H, W): odd channel counts, one pixel, more channels than a block's 32.
SHAPES = [(2, 5, 3, 7), (3, 64, 4, 4), (4, 37, 1, 1), (2, 96, 5, 3)]
EPS, MOMENTUM = 1e-5, 0.1


def activation(shape, dtype, device, channels_last, offset=0.0):
    t = (torch.randn(shape, device=device) * 2 + offset).to(dtype)
    return t.to(memory_format=torch.channels_last) if channels_last else t


def memory_format(t):
    return torch.channels_last if t.is_contiguous(memory_format=torch.channels_last) and not t.is_contiguous() \
        else torch.contiguous_format


def per_channel(t):
    return t.view(1, -1, 1, 1)


def forward_reference(y, weight, bias, residual, running_mean, running_var, batch_stats, relu):
    """float64 batch norm (+ residual) (+ ReLU); the running statistics' update."""
    values = y.double()
    if batch_stats:
        var, mean = torch.var_mean(values, dim=(0, 2, 3), unbiased=False)
        rows = y.numel() // y.shape[1]
        new_running = (MOMENTUM * mean + (1 - MOMENTUM) * running_mean.double(),
                       MOMENTUM * var * rows / (rows - 1) + (1 - MOMENTUM) * running_var.double())
    else:
        mean, var = running_mean.double(), running_var.double()
        new_running = (running_mean.double(), running_var.double())
    invstd = (var + EPS).rsqrt()
    scale = invstd * weight.double()
    z = values * per_channel(scale) + per_channel(bias.double() - mean * scale)
    if residual is not None:
        z = z + residual.double()
    return (z.clamp_min(0) if relu else z), mean, invstd, scale, new_running


def every_case(test):
    """test on each device, dtype and memory format."""
    for name, values in (("channels_last", [False, True]), ("dtype", DTYPES), ("device", DEVICES)):
        test = pytest.mark.parametrize(name, values)(test)
    return test


def relu_bits(out):
    """out > 0 as bits, bit e of byte j for element 8j + e in NHWC order (numpy's little-endian packbits)."""
    passed = (out > 0).permute(0, 2, 3, 1).reshape(-1).cpu().numpy()
    return torch.from_numpy(np.packbits(passed, bitorder="little"))


def tolerance(dtype):
    return {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]


@every_case
def test_forward_against_float64(device, dtype, channels_last):
    for shape in SHAPES:
        c = shape[1]
        # A mean large against the spread: the statistics must not cancel.
        y = activation(shape, dtype, device, channels_last, offset=50.0)
        weight, bias = torch.rand(c, device=device) + 0.5, torch.randn(c, device=device)
        residual = activation(shape, dtype, device, not channels_last)  # the other layout: copied in
        for batch_stats, res, relu in [(True, None, False), (True, residual, True), (False, residual, False),
                                       (False, None, True)]:
            running_mean, running_var = torch.randn(c, device=device), torch.rand(c, device=device) + 0.5
            running = (running_mean.clone(), running_var.clone())
            with nan_filled_outputs():
                out, mean, invstd, scale, shift, relu_mask = ops.batch_norm_act(y, weight, bias, res, *running,
                                                                                batch_stats, MOMENTUM, EPS, relu)
            # With a ReLU, its mask as bits where 16-bit elements and 8 | C allow.
            bits = relu and dtype != torch.float32 and c % 8 == 0
            assert relu_mask.dtype == torch.uint8 and relu_mask.numel() == (y.numel() // 8 if bits else 0)
            if bits:
                assert torch.equal(relu_mask.cpu(), relu_bits(out))
            ref, ref_mean, ref_invstd, ref_scale, ref_running = forward_reference(
                y, weight, bias, res, running_mean, running_var, batch_stats, relu)
            assert out.dtype == dtype and out.is_contiguous(memory_format=memory_format(y))
            for got, want in [(mean, ref_mean), (invstd, ref_invstd), (scale, ref_scale), *zip(running, ref_running)]:
                assert got.dtype == torch.float32
                torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
            # y * scale and the shift cancel to z in fp32, each rounded near |y| * |scale| (y's mean is 50):
            # a channel whose few values lie close (a large scale) loses that much more.
            cancelled = 4 * torch.finfo(torch.float32).eps * y.double().abs().amax(dim=(0, 2, 3)) * ref_scale.abs()
            excess = (out.double() - ref).abs() - (tolerance(dtype) * 4 + per_channel(cancelled) +
                                                   tolerance(dtype) * ref.abs())
            assert excess.max() <= 0, f"out off float64's by {excess.max().item():.3g} past the bound"
            # Given its statistics, the elementwise step is torch's fp32 arithmetic, bit for bit.
            assert torch.equal(shift, bias - mean * scale)
            z = y.float() * per_channel(scale) + per_channel(shift)
            if res is not None:
                z = z + res.float()
            if relu:
                z = torch.where(z < 0, 0.0, z)
            assert torch.equal(out, z.to(dtype)), (shape, batch_stats, relu)
            # The elementwise step alone (a fused chain's output recomputed) gives it again.
            if res is None:
                with nan_filled_outputs():
                    again = ops.batch_norm_apply(y, scale, shift, relu)
                assert torch.equal(again, out) and again.is_contiguous(memory_format=memory_format(y))


def backward_reference(grad_out, out, y, mean, invstd, scale, batch_stats):
    g = grad_out.double()
    dz = g if out is None else torch.where(out > 0, g, 0.0)
    xhat = (y.double() - per_channel(mean.double())) * per_channel(invstd.double())
    sum_dz, sum_dz_xhat = dz.sum((0, 2, 3)), (dz * xhat).sum((0, 2, 3))
    rows = y.numel() // y.shape[1]
    grad_y = per_channel(scale.double()) * dz
    if batch_stats:
        mean_dz, mean_dz_xhat = per_channel(sum_dz) / rows, per_channel(sum_dz_xhat) / rows
        grad_y = per_channel(scale.double()) * (dz - mean_dz - xhat * mean_dz_xhat)
    return grad_y, sum_dz, sum_dz_xhat, dz


@every_case
def test_backward_against_float64(device, dtype, channels_last):
    for shape in SHAPES:
        c = shape[1]
        y, grad_out = activation(shape, dtype, device, channels_last), activation(shape, dtype, device, channels_last)
        mean, invstd = torch.randn(c, device=device), torch.rand(c, device=device) + 0.5
        scale = torch.rand(c, device=device) + 0.5
        for out in (None, activation(shape, dtype, device, channels_last)):
            for batch_stats in (True, False):
                with nan_filled_outputs():
                    grad_y, sum_dz, sum_dz_xhat, grad_z = ops.batch_norm_act_backward(
                        grad_out, out, None, y, mean, invstd, scale, batch_stats, [True, True, True])
                if out is not None and c % 8 == 0:  # the same from the mask's bits
                    from_bits = ops.batch_norm_act_backward(grad_out, None, relu_bits(out).to(device), y, mean,
                                                            invstd, scale, batch_stats, [True, True, True])
                    assert all(torch.equal(a, b) for a, b in zip(from_bits, (grad_y, sum_dz, sum_dz_xhat, grad_z)))
                ref = backward_reference(grad_out, out, y, mean, invstd, scale, batch_stats)
                assert grad_y.dtype == grad_z.dtype == dtype
                assert grad_y.is_contiguous(memory_format=memory_format(y))
                torch.testing.assert_close(grad_y.double(), ref[0], rtol=tolerance(dtype), atol=tolerance(dtype))
                torch.testing.assert_close(sum_dz.double(), ref[1], rtol=1e-5, atol=1e-4)
                torch.testing.assert_close(sum_dz_xhat.double(), ref[2], rtol=1e-5, atol=1e-4)
                assert torch.equal(grad_z.double(), ref[3])
                # What is not asked for is not computed.
                for mask in ([True, False, False], [False, True, False], [False, False, True]):
                    results = ops.batch_norm_act_backward(grad_out, out, None, y, mean, invstd, scale, batch_stats,
                                                          mask)
                    wanted = [mask[0], mask[1], mask[1], mask[2]]
                    assert [r.numel() > 0 for r in results] == wanted
                    full = (grad_y, sum_dz, sum_dz_xhat, grad_z)
                    assert all(torch.equal(r, f) for r, f, w in zip(results, full, wanted) if w)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_matches_the_cpu_backend_and_itself(dtype):
    shape = (8, 48, 9, 11)
    y = activation(shape, dtype, "cuda", True)
    grad_out, residual = activation(shape, dtype, "cuda", True), activation(shape, dtype, "cuda", True)
    weight, bias = torch.rand(48, device="cuda") + 0.5, torch.randn(48, device="cuda")
    running = [torch.zeros(48, device="cuda"), torch.ones(48, device="cuda")]
    results = ops.batch_norm_act(y, weight, bias, residual, *running, True, MOMENTUM, EPS, True)
    again = ops.batch_norm_act(y, weight, bias, residual, None, None, True, MOMENTUM, EPS, True)
    # The sums in a fixed order: bitwise the same on every run.
    assert all(torch.equal(a, b) for a, b in zip(results, again))
    out, mean, invstd, scale, shift, relu_mask = results
    # The elementwise step alone, from the forward's scale and shift: the same bits as the forward without a
    # residual, and as torch's fp32 arithmetic.
    plain = ops.batch_norm_act(y, weight, bias, None, None, None, True, MOMENTUM, EPS, True)
    with nan_filled_outputs():
        applied = ops.batch_norm_apply(y, plain[3], plain[4], True)
    z = y.float() * per_channel(plain[3]) + per_channel(plain[4])
    assert torch.equal(applied, plain[0]) and torch.equal(applied, torch.where(z < 0, 0.0, z).to(dtype))
    grads = ops.batch_norm_act_backward(grad_out, out, None, y, mean, invstd, scale, True, [True, True, True])
    assert all(torch.equal(a, b) for a, b in zip(grads, ops.batch_norm_act_backward(
        grad_out, out, None, y, mean, invstd, scale, True, [True, True, True])))
    if dtype != torch.float32:  # the bits, and backward from them, as from the output
        assert torch.equal(relu_mask.cpu(), relu_bits(out))
        assert all(torch.equal(a, b) for a, b in zip(grads, ops.batch_norm_act_backward(
            grad_out, None, relu_mask, y, mean, invstd, scale, True, [True, True, True])))
    cpu = ops.batch_norm_act(y.cpu(), weight.cpu(), bias.cpu(), residual.cpu(), None, None, True, MOMENTUM, EPS, True)
    for a, b in zip(results[:5], cpu[:5]):
        torch.testing.assert_close(a.cpu().double(), b.double(), rtol=tolerance(dtype), atol=tolerance(dtype))
    cpu_grads = ops.batch_norm_act_backward(grad_out.cpu(), out.cpu(), None, y.cpu(), mean.cpu(), invstd.cpu(),
                                            scale.cpu(), True, [True, True, True])
    # From the same statistics: the elementwise steps bit for bit, the sums to fp32's rounding.
    assert torch.equal(grads[3].cpu(), cpu_grads[3])
    for a, b in zip(grads[1:3], cpu_grads[1:3]):
        torch.testing.assert_close(a.cpu(), b, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(grads[0].cpu().double(), cpu_grads[0].double(), rtol=tolerance(dtype),
                               atol=tolerance(dtype))


def misaligned(t):
    """t's values, channels_last, in memory that starts one element past an allocation's start."""
    n, c, h, w = t.shape
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[1:]
    view = flat.view(n, h, w, c).permute(0, 3, 1, 2)
    view.copy_(t)
    return view


def chain_inputs(shape, dtype, offset=0.0):
    """A chain's y (its values about `offset`), residual and gradient on the GPU, channels_last; gamma and beta."""
    y, residual = activation(shape, dtype, "cuda", True, offset), activation(shape, dtype, "cuda", True)
    grad_out = activation(shape, dtype, "cuda", True)
    return y, residual, grad_out, torch.rand(shape[1], device="cuda") + 0.5, torch.randn(shape[1], device="cuda")


def off_and_on(monkeypatch, switch, run, runs_on=1):
    """run()'s results with `switch` unset, then `runs_on` times with it "1", outputs NaN-filled."""
    monkeypatch.delenv(switch, raising=False)
    with nan_filled_outputs():
        off = run()
    monkeypatch.setenv(switch, "1")
    with nan_filled_outputs():
        return off, [run() for _ in range(runs_on)]


def batch_norm_both_ways(y, weight, bias, residual, grad_out):
    """Every output of the forward (batch statistics, residual and ReLU) and of
    backward from its output, from its bits, with running statistics, and
    without a ReLU; then each of backward's outputs asked for alone; then
    forwards that update running statistics, normalize with them, and take
    the batch's statistics as given."""
    out, mean, invstd, scale, shift, relu_mask = ops.batch_norm_act(y, weight, bias, residual, None, None, True,
                                                                    MOMENTUM, EPS, True)
    results = [out, mean, invstd, scale, shift, relu_mask]
    for out_given, mask_given, batch_stats in ((out, None, True), (None, relu_mask, True), (out, None, False),
                                               (None, None, True)):
        if mask_given is not None and mask_given.numel() == 0:
            continue
        results += ops.batch_norm_act_backward(grad_out, out_given, mask_given, y, mean, invstd, scale, batch_stats,
                                               [True, True, True])
    for alone in ([True, False, False], [False, True, False], [False, False, True]):
        results += ops.batch_norm_act_backward(grad_out, out, None, y, mean, invstd, scale, True, alone)
    running_mean, running_var = torch.zeros_like(weight), torch.ones_like(weight)
    for batch_stats in (True, False):
        results += ops.batch_norm_act(y, weight, bias, None, running_mean, running_var, batch_stats, MOMENTUM, EPS,
                                      False)[:5]
        results += [running_mean.clone(), running_var.clone()]
    var, batch_mean = torch.var_mean(y.float(), dim=(0, 2, 3), unbiased=False)
    results += ops.batch_norm_act(y, weight, bias, None, None, None, True, MOMENTUM, EPS, False,
                                  torch.stack([batch_mean, var]))[:5]
    return results


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_loads_ahead_give_the_defaults_bits(dtype, monkeypatch):
    # 64 and 256 channels in 16-byte runs, 2048 over several blocks of channels, 37 and a misaligned grad_out
    # one element at a time; 3 to 11 rows a thread, so partial groups of 4 rows, whole ones, and several.
    for shape, skewed in (((8, 64, 9, 11), False), ((2, 256, 7, 5), False), ((4, 2048, 3, 3), False),
                          ((3, 37, 5, 5), False), ((2, 64, 6, 7), True)):
        y, residual, grad_out, weight, bias = chain_inputs(shape, dtype)
        grad_out = misaligned(grad_out) if skewed else grad_out
        default, (ahead,) = off_and_on(monkeypatch, "MPGEMM_BATCH_NORM_LOADS_AHEAD",
                                       lambda: batch_norm_both_ways(y, weight, bias, residual, grad_out))
        names = launches(lambda: batch_norm_both_ways(y, weight, bias, residual, grad_out))
        assert any("sums_ahead_kernel" in n for n in names) and any("grad_input_ahead_kernel" in n for n in names)
        assert not any("sums_kernel<" in n or "grad_input_kernel<" in n for n in names), names
        assert len(default) == len(ahead)
        for i, (d, a) in enumerate(zip(default, ahead)):
            assert torch.equal(d, a) and not a.isnan().any(), (shape, skewed, i)
    monkeypatch.setenv("MPGEMM_BATCH_NORM_LOADS_AHEAD", "2")
    with pytest.raises(ValueError, match=r"MPGEMM_BATCH_NORM_LOADS_AHEAD must be '0' or '1', got '2'"):
        batch_norm_both_ways(y, weight, bias, residual, grad_out)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_finish_by_lines_gives_the_defaults_results(dtype, monkeypatch):
    # The finish by lines (MPGEMM_BATCH_NORM_FINISH_BY_LINES=1) sums the same fp32 partials in fp64 in another
    # fixed order: its results are the default's to fp32's last bits, and the same bits on every run. Row
    # blocks: one; 50; 256 and 392 (several a lane); 1024, the most (8 a lane). Channels: 5 and 37 (a block of
    # channels short), 2048 (256 blocks of them), 16, 64 and 256 in 16-byte runs; with the loads ahead too.
    eps = torch.finfo(dtype).eps
    for shape, ahead in (((2, 5, 3, 7), False), ((4, 37, 40, 40), True), ((32, 64, 32, 32), False),
                         ((128, 16, 32, 32), False), ((4, 2048, 7, 7), True), ((64, 256, 28, 28), True)):
        y, residual, grad_out, weight, bias = chain_inputs(shape, dtype, offset=3.0)
        monkeypatch.setenv("MPGEMM_BATCH_NORM_LOADS_AHEAD", str(int(ahead)))
        default, (lines, again) = off_and_on(monkeypatch, "MPGEMM_BATCH_NORM_FINISH_BY_LINES",
                                             lambda: batch_norm_both_ways(y, weight, bias, residual, grad_out), 2)
        names = launches(lambda: batch_norm_both_ways(y, weight, bias, residual, grad_out))
        assert any("line_finish_kernel" in n for n in names), names
        assert not any("finish_kernel<" in n and "line_finish" not in n for n in names), names
        assert len(default) == len(lines) == len(again)
        for i, (d, a, b) in enumerate(zip(default, lines, again)):
            assert torch.equal(a, b) and not a.isnan().any(), (shape, i)
            if d.dtype == torch.uint8:  # the ReLU's bits
                assert (d != a).sum() <= d.numel() // 1000, (shape, i)
                continue
            # fp32 statistics and sums within 1e-5 (the order moves their last bit or two; a row block left out
            # of 1024 moves the sums by 1e-3); 16-bit tensors computed from them to about their last bit (an
            # fp32 scale a bit apart may round an element the other way).
            rtol = 1e-5 if d.dtype == torch.float32 else 2 * eps
            torch.testing.assert_close(a, d, rtol=rtol, atol=rtol * d.abs().max().item(), msg=f"{shape} {i}")
    monkeypatch.setenv("MPGEMM_BATCH_NORM_FINISH_BY_LINES", "yes")
    with pytest.raises(ValueError, match=r"MPGEMM_BATCH_NORM_FINISH_BY_LINES must be '0' or '1', got 'yes'"):
        batch_norm_both_ways(y, weight, bias, residual, grad_out)


@pytest.mark.parametrize("device", DEVICES)
def test_empty_batches(device):
    y = torch.empty(0, 3, 4, 4, device=device)
    out, mean, invstd, scale, shift, _ = ops.batch_norm_act(y, None, None, None, None, None, True, MOMENTUM, EPS,
                                                            False)
    assert out.shape == y.shape and mean.isnan().all() and shift.isnan().all()
    assert ops.batch_norm_apply(y, scale, shift, True).shape == y.shape
    c = torch.ones(3, device=device)
    grad_y, sum_dz, sum_dz_xhat, _ = ops.batch_norm_act_backward(y, None, None, y, c, c, c, True,
                                                                 [True, True, False])
    assert grad_y.shape == y.shape and torch.equal(sum_dz, torch.zeros(3, device=device))


def test_bad_arguments_are_named():
    y, c = torch.randn(2, 3, 4, 4), torch.randn(3)

    def forward(y=y, weight=c, bias=c, residual=None, running_mean=None, running_var=None, batch_stats=True, eps=EPS):
        return ops.batch_norm_act(y, weight, bias, residual, running_mean, running_var, batch_stats, MOMENTUM, eps,
                                  False)

    with pytest.raises(ValueError, match=r"expected y to be 4-D"):
        forward(y=y[0])
    with pytest.raises(TypeError, match=r"expected y to be torch.float16, torch.bfloat16 or torch.float32"):
        forward(y=y.double())
    with pytest.raises(ValueError, match=r"expected bias of shape \(C,\) = \(3,\), got shape \(4,\)"):
        forward(bias=torch.randn(4))
    with pytest.raises(TypeError, match=r"expected weight to be torch.float32, got torch.float16"):
        forward(weight=c.half())
    with pytest.raises(ValueError, match=r"expected residual of y's shape \(2, 3, 4, 4\), got shape \(2, 3, 4, 5\)"):
        forward(residual=torch.randn(2, 3, 4, 5))
    with pytest.raises(TypeError, match=r"expected residual to have y's dtype \(torch.float32\), got torch.float16"):
        forward(residual=y.half())
    with pytest.raises(ValueError, match=r"running_mean and running_var both given or both None"):
        forward(running_mean=c)
    with pytest.raises(ValueError, match=r"expected running_mean and running_var without batch statistics"):
        forward(batch_stats=False)
    with pytest.raises(ValueError, match=r"expected eps >= 0, got -1"):
        forward(eps=-1.0)
    with pytest.raises(ValueError, match=r"expected out of y's shape"):
        ops.batch_norm_act_backward(y, y[:1], None, y, c, c, c, True, [True, True, True])
    y8, c8 = torch.randn(2, 8, 3, 3), torch.randn(8)
    with pytest.raises(ValueError, match=r"the ReLU's out or its relu_mask, not both"):
        ops.batch_norm_act_backward(y8, y8, torch.zeros(18, dtype=torch.uint8), y8, c8, c8, c8, True, [True] * 3)
    with pytest.raises(TypeError, match=r"expected relu_mask to be torch.uint8"):
        ops.batch_norm_act_backward(y8, None, torch.zeros(18), y8, c8, c8, c8, True, [True] * 3)
    with pytest.raises(ValueError, match=r"expected relu_mask to be y's elements as contiguous bits \(144 / 8"):
        ops.batch_norm_act_backward(y8, None, torch.zeros(17, dtype=torch.uint8), y8, c8, c8, c8, True, [True] * 3)
    with pytest.raises(ValueError, match=r"batch_norm_apply: expected shift of shape \(C,\) = \(3,\), got"):
        ops.batch_norm_apply(y, c, c8, True)
    with pytest.raises(TypeError, match=r"batch_norm_apply: expected scale to be torch.float32, got torch.float16"):
        ops.batch_norm_apply(y, c.half(), c, True)
    with pytest.raises(ValueError, match=r"batch_norm_apply: expected y to be 4-D"):
        ops.batch_norm_apply(y[0], c, c, False)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    def t(*shape, dtype=torch.float32, channels_last=False):
        value = torch.randn(*shape, device=device).to(dtype)
        return value.to(memory_format=torch.channels_last) if channels_last else value

    y, c = t(2, 5, 3, 4, dtype=torch.float16, channels_last=True), t(5)
    y8, c8 = t(2, 8, 3, 4, dtype=torch.bfloat16, channels_last=True), t(8)
    bits8 = torch.randint(0, 256, (24,), dtype=torch.uint8, device=device)
    samples = [
        (ops.batch_norm_act.default, (y, c, c, t(2, 5, 3, 4, dtype=torch.float16), t(5), t(5).abs(), True, 0.1,
                                      1e-5, True)),
        (ops.batch_norm_act.default, (t(3, 4, 2, 2), None, None, None, None, None, True, 0.1, 1e-5, False)),
        (ops.batch_norm_act.default, (y, c, None, None, t(5), t(5).abs(), False, 0.1, 1e-3, False)),
        (ops.batch_norm_act_backward.default, (y, y, None, y, c, c.abs(), c, True, [True, True, True])),
        (ops.batch_norm_act_backward.default, (y, None, None, y, c, c.abs(), c, False, [True, False, False])),
        (ops.batch_norm_act.default, (y8, c8, c8, None, None, None, True, 0.1, 1e-5, True)),
        (ops.batch_norm_act_backward.default, (y8, None, bits8, y8, c8, c8.abs(), c8, True, [True, True, True])),
        (ops.batch_norm_apply.default, (y, c, c, True)),
        (ops.batch_norm_apply.default, (t(3, 4, 2, 2), t(4), t(4), False)),
    ]
    for op, args in samples:
        torch.library.opcheck(op, args)
