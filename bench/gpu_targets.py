"""Small GPU programs for the tools that watch another program run, used by
bench/gpu_check.py:

  python3 bench/gpu_targets.py sanitize
      one call of each kernel family under compute-sanitizer: the WMMA GEMM
      (16-byte cp.async path with bias and GELU; one-element path, fp16 out),
      each Hopper GEMM on sm_90 (blocks alone, pairs, ping-pong, the narrow
      128 x 128 and 128 x 64 tiles), and the forward, backward-data and
      backward-filter passes of convolutions on the large tile, with stride
      2, depthwise, with 3 channels (padded copies) and a 1x1 as GEMMs
      (MPGEMM_CONV_PATH=gemm), fprop and dgrad on the 128 x 16 tile
      (MPGEMM_CONV_N16_TILE=1: grouped, and 3 channels), and on sm_90 the
      Hopper convolution's three passes (MPGEMM_CONV_PATH=wgmma, wgrad
      split; dgrad's phases at stride 2, their rows from registers and,
      with MPGEMM_STAGED_ROW_STORES=1, through shared memory, a launch a
      phase and, with MPGEMM_DGRAD_ONE_LAUNCH=1 (the default), all in one
      launch; a first layer's fprop and wgrad on folded taps, x folded a
      thread per element and, with MPGEMM_CHUNKED_FOLD=1 (the default), per
      16 bytes; dgrad of a 1x1 adding an addend to dx with
      MPGEMM_DGRAD_ADDEND=1), on its wide tile and with
      MPGEMM_NARROW_TILES=1 on the narrow ones; the fused batch norm's
      forward and backward (16-byte runs and one-element ones), also with
      MPGEMM_BATCH_NORM_LOADS_AHEAD=1 and with
      MPGEMM_BATCH_NORM_FINISH_BY_LINES=1, and with a stem's max pool in its
      pass (MPGEMM_FUSED_MAX_POOL's kernels); the gated
      MLP's two passes (likewise); layer norm's three (mpgemm.layer_norm:
      forward, dx, the weights' sums; likewise); every result is checked
      against float64.
  python3 bench/gpu_targets.py conv-tiles
      the Hopper convolution's probe (sm_90, MPGEMM_CONV_PATH=wgmma): one
      128 x 256 tile of each pass (fprop; dgrad and wgrad of a 1x1), then
      one dgrad tile per phase at stride 2, each checked against float64,
      and its three kernels seen running.
  python3 bench/gpu_targets.py profile [--size N] [--warmup W]
      W calls of the N^3 GEMM (fp16 in, fp32 out), then the one that
      `ncu --launch-skip W --launch-count 1` reads.
  python3 bench/gpu_targets.py profile --without-ncu --json PATH
      where ncu cannot run: the same GEMM's kernel time from torch.profiler
      (CUPTI) and the SM clock from NVML right after, as cycles per call.
"""

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mpgemm  # noqa: E402
from mpgemm.fusion import batch_norm_act, batch_norm_relu_max_pool  # noqa: E402
from mpgemm.testing import activation_grad_reference, gated_reference, reference_gemm, relative_error  # noqa: E402
from mpgemm.tools import gpu_state, timing  # noqa: E402

TOLERANCE = 1e-3


def _check(name, out, ref):
    error = relative_error(out, ref)
    print(f"{name}: relative error {error:.3g}")
    if not error < TOLERANCE:
        raise SystemExit(f"{name}: relative error {error:.3g} is not below {TOLERANCE}")


def _gemm_on(path, m, n, k, label="", **kwargs):
    """One GEMM with MPGEMM_GEMM_PATH=path, checked against float64;
    `label` names what else its line should say (a switch set)."""
    os.environ["MPGEMM_GEMM_PATH"] = path
    a, b = torch.randn(m, k, device="cuda").half(), torch.randn(k, n, device="cuda").half()
    bias = torch.randn(n, device="cuda") if kwargs.pop("bias", False) else None
    out = mpgemm.gemm(a, b, bias=bias, **kwargs)
    torch.cuda.synchronize()
    options = "".join(f", {key}={value}" for key, value in kwargs.items())
    _check(f"gemm {m}x{n}x{k} on {path}{' ' + label if label else ''}{options}", out,
           reference_gemm(a, b, bias, kwargs.get("activation")))


def _pre_activation_gemm(m, n, k, activation="gelu"):
    """linear + GELU storing its pre-activation beside y from the wide Hopper
    tile's epilogue (the kernel MPGEMM_EPILOGUE_PRE_ACTIVATION=1 runs), or
    for GELU's tanh form from its own kernel on ping-pong pairs (mlp's, with
    that switch), y and the pre-activation each checked against float64."""
    path = os.environ["MPGEMM_GEMM_PATH"] = "wgmma_pingpong" if activation == "gelu_tanh" else "wgmma"
    # The epilogue's kernel runs on that plan alone (else the product and a pass would, unsanitized).
    if mpgemm.gemm_plan(m, n, k).config != path:
        raise SystemExit(f"{activation}'s pre-activation: the plan of {m}x{n}x{k} is not {path}")
    x, w = torch.randn(m, k, device="cuda").half(), torch.randn(n, k, device="cuda").half()
    bias = torch.randn(n, device="cuda")
    y, z = torch.ops.mpgemm._linear_pre_activation(x, w, bias, activation=activation, out_dtype=torch.float32)
    torch.cuda.synchronize()
    name = f"linear {m}x{n}x{k} with {activation}'s pre-activation"
    _check(f"{name}, y", y, reference_gemm(x, w.t(), bias, activation))
    _check(f"{name}, the pre-activation", z, reference_gemm(x, w.t(), bias))


def _row_sums_gemm(m, n, k, split, path="wgmma"):
    """linear's weight gradient with its bias's (the kernels
    MPGEMM_EPILOGUE_BIAS_GRAD=1 runs): dz^T (column-major) times x
    (row-major) on the Hopper tile `path` names, whole K or (split:
    MPGEMM_WGMMA_SPLIT_K=1, the wide tile alone) split-K; D and A's row sums each checked against
    float64."""
    os.environ["MPGEMM_GEMM_PATH"] = path
    if split:
        os.environ["MPGEMM_WGMMA_SPLIT_K"] = "1"
    dz, x = torch.randn(k, m, device="cuda").half(), torch.randn(k, n, device="cuda").half()
    y, sums = torch.ops.mpgemm._gemm_row_sums(dz.t(), x, out_dtype=torch.float32)
    torch.cuda.synchronize()
    os.environ.pop("MPGEMM_WGMMA_SPLIT_K", None)
    name = f"row sums GEMM {m}x{n}x{k} on {path}{' split' if split else ''}"
    _check(f"{name}, D", y, reference_gemm(dz.t(), x))
    _check(f"{name}, the row sums", sums, dz.double().sum(0).cpu())


def _activation_grad_gemm(m, n, k, activation, path="wgmma"):
    """An MLP's dgrad times its activation's derivative (the op
    MPGEMM_EPILOGUE_ACTIVATION_GRAD=1 runs): dY (row-major) times W2
    (row-major) on the Hopper tile `path` forces, whole K (the wide tile of
    blocks alone, or ping-pong pairs: the kernels whose epilogue reads Z);
    checked against float64."""
    os.environ["MPGEMM_GEMM_PATH"] = path
    dy, w2 = torch.randn(m, k, device="cuda").half(), torch.randn(k, n, device="cuda").half()
    z = torch.randn(m, n, device="cuda").half()
    out = torch.ops.mpgemm._gemm_activation_grad(dy, w2, z, activation=activation)
    torch.cuda.synchronize()
    _check(f"activation grad GEMM {m}x{n}x{k} ({activation}) on {path}", out,
           activation_grad_reference(dy, w2, z, activation))


def _conv_passes(name, x_shape, w_shape, **conv_args):
    """A convolution's forward, backward-data and backward-filter passes,
    each checked against float64 on the CPU."""
    x = torch.randn(*x_shape, device="cuda").half().to(memory_format=torch.channels_last).requires_grad_()
    fan_in = w_shape[1] * w_shape[2] * w_shape[3]
    w = (torch.randn(*w_shape, device="cuda") / fan_in**0.5).half().requires_grad_()
    y = mpgemm.conv2d(x, w, **conv_args)
    grad = torch.randn_like(y)
    gx, gw = torch.autograd.grad(y, (x, w), grad)
    torch.cuda.synchronize()
    x64, w64 = x.detach().double().cpu().requires_grad_(), w.detach().double().cpu().requires_grad_()
    y64 = F.conv2d(x64, w64, **conv_args)
    gx64, gw64 = torch.autograd.grad(y64, (x64, w64), grad.double().cpu())
    for pass_name, out, ref in (("fprop", y, y64.detach()), ("dgrad", gx, gx64), ("wgrad", gw, gw64)):
        _check(f"conv2d {name} {pass_name}", out, ref)


def _dgrad_addend(name, x_shape, filters):
    """A 1x1's input gradient plus an addend of x's shape, added by the
    Hopper dgrad's epilogue (MPGEMM_DGRAD_ADDEND=1's kernel,
    mpgemm._conv2d_grad_input_add), checked against float64 on the CPU, and
    against the sum without the switch (the gradient rounded, then the
    addend added): rounded once, it must differ somewhere, or the epilogue
    did not add it."""
    x = torch.randn(*x_shape, device="cuda").half().to(memory_format=torch.channels_last)
    w = (torch.randn(filters, x_shape[1], 1, 1, device="cuda") / x_shape[1] ** 0.5).half()
    grad = torch.randn(x_shape[0], filters, *x_shape[2:], device="cuda").half()
    addend = torch.randn_like(x)
    args = (grad, x, w, addend, [1, 1], [0, 0, 0, 0], [1, 1], 1)
    os.environ["MPGEMM_DGRAD_ADDEND"] = "1"
    try:
        out = torch.ops.mpgemm._conv2d_grad_input_add(*args)
    finally:
        os.environ.pop("MPGEMM_DGRAD_ADDEND")
    rounded_twice = torch.ops.mpgemm._conv2d_grad_input_add(*args)
    torch.cuda.synchronize()
    if torch.equal(out, rounded_twice):
        raise SystemExit(f"conv2d {name}: the sum is the one rounded twice: the epilogue did not add the addend")
    ref = torch.nn.grad.conv2d_input(x_shape, w.double().cpu(), grad.double().cpu()) + addend.double().cpu()
    _check(f"conv2d {name} dgrad plus addend", out, ref)


def _epilogue_statistics(name, x_shape, w_shape):
    """conv2d_batch_stats (MPGEMM_EPILOGUE_STATS's op): y and its batch
    statistics, checked against float64 on the CPU."""
    x = torch.randn(*x_shape, device="cuda").half().to(memory_format=torch.channels_last)
    weight = torch.randn(*w_shape, device="cuda").half()
    y, stats = mpgemm.ops.conv2d_batch_stats(x, weight, None, 1, w_shape[-1] // 2)
    torch.cuda.synchronize()
    y64 = F.conv2d(x.double().cpu(), weight.double().cpu(), padding=w_shape[-1] // 2)
    _check(f"conv2d_batch_stats {name} y", y, y64)
    got = y.double().cpu()
    _check(f"conv2d_batch_stats {name} statistics", stats,
           torch.stack([got.mean((0, 2, 3)), got.var((0, 2, 3), unbiased=False)]))


def _gated_passes(name, count, offset, dtype, activation):
    """The gated MLP's two passes (MPGEMM_GATED_KERNEL=1's: act(g) * u, then
    dg, du and the product again) over `count` elements starting `offset`
    elements past an allocation (0: 16-byte runs and a tail; 1: one element
    a thread), each checked against float64 on the CPU."""
    dp, g, u = (torch.randn(count + offset, device="cuda").to(dtype)[offset:] for _ in range(3))
    p = torch.ops.mpgemm._gated_activation(g, u, activation=activation)
    dg, du, p_again = torch.ops.mpgemm._gated_activation_backward(dp, g, u, activation=activation)
    torch.cuda.synchronize()
    want = gated_reference(dp, g, u, activation)
    for pass_name, got, ref in (("forward", p, want["p"]), ("gate grad", dg, want["grad_gate"]),
                                ("up grad", du, want["grad_up"]), ("forward again", p_again, want["p"])):
        _check(f"gated {name} {pass_name}", got, ref)


def _layer_norm_passes(name, rows, cols, offset, dtype):
    """mpgemm.layer_norm's passes (forward; dx; the weights' column sums over
    slabs of rows) on `rows` x `cols` starting `offset` elements past an
    allocation (cols a multiple of 8, so 0: 16-byte runs; 1: one element a
    lane), each checked against float64 on the CPU."""
    x, dy = ((torch.randn(rows * cols + offset, device="cuda") * 2 + 1).to(dtype)[offset:].view(rows, cols)
             for _ in range(2))
    w, b = torch.randn(cols, device="cuda") * 0.3 + 1, torch.randn(cols, device="cuda")
    y, mean, rstd = torch.ops.mpgemm._layer_norm_forward(x, [cols], w, b, 1e-5)
    dx, dw, db = torch.ops.mpgemm._layer_norm_backward(dy, x, mean, rstd, [cols], w, [True, True, True])
    torch.cuda.synchronize()
    leaves = [t.double().cpu().requires_grad_() for t in (x, w, b)]
    want = torch.nn.functional.layer_norm(leaves[0], (cols,), leaves[1], leaves[2], 1e-5)
    want.backward(dy.double().cpu())
    for pass_name, got, ref in (("forward", y, want.detach()), ("dx", dx, leaves[0].grad),
                                ("weight's sums", dw, leaves[1].grad), ("bias's sums", db, leaves[2].grad)):
        _check(f"layer norm {name} {pass_name}", got, ref)


def _batch_norm_passes(name, shape):
    """Batch norm with a residual add and a ReLU in training, forward and
    backward (mpgemm.fuse's passes), and a chain's output without the
    residual recomputed from the forward's scale and shift (batch_norm_apply),
    each checked against float64 on the CPU."""
    bn = torch.nn.BatchNorm2d(shape[1]).cuda()
    y = torch.randn(*shape, device="cuda").half().to(memory_format=torch.channels_last).requires_grad_()
    residual = torch.randn_like(y).requires_grad_()
    out = batch_norm_act(y, bn, residual, relu=True)
    grad = torch.randn_like(out)
    gy, gr = torch.autograd.grad(out, (y, residual), grad)
    torch.cuda.synchronize()
    y64, r64 = y.detach().double().cpu().requires_grad_(), residual.detach().double().cpu().requires_grad_()
    out64 = torch.relu(F.batch_norm(y64, None, None, training=True) + r64)
    gy64, gr64 = torch.autograd.grad(out64, (y64, r64), grad.double().cpu())
    scale, shift = torch.ops.mpgemm.batch_norm_act(y.detach(), bn.weight, bn.bias, None, None, None, True, 0.1,
                                                   bn.eps, True)[3:5]
    applied = torch.ops.mpgemm.batch_norm_apply(y.detach(), scale, shift, True)
    applied64 = torch.relu(F.batch_norm(y64.detach(), None, None, training=True))
    for pass_name, got, ref in (("forward", out, out64.detach()), ("dgrad", gy, gy64), ("residual grad", gr, gr64),
                                ("recomputed output", applied, applied64)):
        _check(f"batch norm {name} {pass_name}", got, ref)


def _fused_max_pool_passes(name, shape):
    """A stem's batch norm, ReLU and max pool in one pass forward and its
    gather backward (MPGEMM_FUSED_MAX_POOL's kernels), against float64: the
    forward against torch's ops on y, backward through torch's pool of the
    chain's own 16-bit output (whose ties decide where each gradient goes)."""
    bn, pool = torch.nn.BatchNorm2d(shape[1]).cuda(), torch.nn.MaxPool2d(3, 2, 1)
    y = torch.randn(*shape, device="cuda").half().to(memory_format=torch.channels_last).requires_grad_()
    out = batch_norm_relu_max_pool(y, bn, pool)
    grad = torch.randn_like(out)
    (gy,) = torch.autograd.grad(out, (y,), grad)
    torch.cuda.synchronize()
    y64 = y.detach().double().cpu().requires_grad_()
    normalized64 = F.batch_norm(y64, None, None, training=True)
    out64 = pool(torch.relu(normalized64.detach()))
    chain = torch.ops.mpgemm.batch_norm_act(y.detach(), bn.weight, bn.bias, None, None, None, True, 0.1, bn.eps,
                                            True)[0]
    taken = chain.detach().double().cpu().requires_grad_()
    (dz64,) = torch.autograd.grad(pool(taken), (taken,), grad.double().cpu())
    (gy64,) = torch.autograd.grad(normalized64, (y64,), torch.where(taken > 0, dz64, 0))
    for pass_name, got, ref in (("forward", out, out64), ("dgrad", gy, gy64)):
        _check(f"fused max pool {name} {pass_name}", got, ref)


def _loss_scaling():
    """Loss scaling's two kernels: the unscale pass over gradients of three
    types, one of them non-finite, and the scale's update from its flag (the
    one-thread kernel, the default)."""
    grads = [torch.randn(70000, device="cuda").half(), torch.randn(33, 5, device="cuda"),
             torch.randn(1000, device="cuda").bfloat16()]
    grads[1][3, 2] = float("inf")
    outs = [torch.empty_like(g, dtype=torch.float32) for g in grads]
    found_inf, inv_scale = torch.zeros((), device="cuda"), torch.full((), 1 / 1024, device="cuda")
    torch.ops.mpgemm.unscale_grads_(grads, outs, found_inf, inv_scale)
    scale, counters = torch.full((), 1024.0, device="cuda"), torch.zeros(4, dtype=torch.int64, device="cuda")
    torch.ops.mpgemm.update_loss_scale_(scale, counters, found_inf, 2.0, 0.5, 100, 1.0, 1, True)
    torch.cuda.synchronize()
    finite = [0, 2]
    _check("unscale", torch.cat([outs[i].flatten() for i in finite]),
           torch.cat([grads[i].double().flatten() / 1024 for i in finite]).cpu())
    # Scale, growth tracker, overflows in a row, skipped steps, last step skipped, the flag: exactly.
    got, expected = [scale.item(), *counters.tolist(), found_inf.item()], [512.0, 0, 0, 1, 1, 1.0]
    if got != expected:
        raise SystemExit(f"loss scale update: got {got}, expected {expected}")
    print("loss scale update: relative error 0 (exact)")


def sanitize():
    """One call of each kernel family: the WMMA GEMM on its 16-byte and its
    one-element paths, each Hopper GEMM (sm_90, the narrow tiles', split-K's,
    stream-K's on the wide tile and on 128 x 64, one on padded copies of
    odd-pitched operands, those that store GELU's pre-activation too (the
    erf form's on the wide tile, the tanh form's on ping-pong pairs), those
    that sum A's rows, whole K on each tile and split, and the one that
    multiplies by an activation's derivative), and
    convolutions whose passes run on the large tile, on dgrad's phases
    (stride 2), on the depthwise kernels (wgrad, and fprop and dgrad, on the sliding windows too), on the padded copies (3
    channels) and as GEMMs (a 1x1), and the Hopper convolution's three
    passes (sm_90; a first layer's on folded taps, x folded both ways;
    strided dgrad's rows staged; dgrad adding an addend), on its wide tile and, under
    MPGEMM_NARROW_TILES=1, its narrow
    ones; the fused batch norm's passes (with and without loads ahead); the gated MLP's; fprop's batch
    statistics from the
    WMMA epilogue and (sm_90) the Hopper one; and loss scaling's unscale and
    scale update."""
    torch.manual_seed(0)
    _gemm_on("wmma", 256, 192, 128, bias=True, activation="gelu")
    _gemm_on("wmma", 33, 47, 29, out_dtype=torch.float16)
    if torch.cuda.get_device_capability() == (9, 0):
        for path in ("wgmma", "wgmma_2x1", "wgmma_pingpong", "wgmma_n128", "wgmma_n64"):
            _gemm_on(path, 520, 1032, 264, bias=True, activation="relu")
        # Split-K on the Hopper block ("1": where the model splits, the wide tile forced): two tiles, K split
        # 13 ways of 5 slices, the last slice partly past K.
        os.environ["MPGEMM_WGMMA_SPLIT_K"] = "1"
        _gemm_on("wgmma", 128, 264, 4104, bias=True, activation="gelu")
        os.environ.pop("MPGEMM_WGMMA_SPLIT_K")
        # Stream-K on the Hopper block (opt-in): the same two tiles' 65 slices in 32 runs of 4 or 5, each tile
        # split over 16 or 17 of them, summed from their slots by the block that ends it.
        os.environ["MPGEMM_STREAM_K"] = "1"
        if not mpgemm.gemm_plan(128, 264, 4104).stream_k_blocks:
            raise SystemExit("stream-K: the plan of 128x264x4104 is not stream-K")
        _gemm_on("wgmma", 128, 264, 4104, bias=True, activation="gelu", label="stream-K")
        # And on a narrow tile: 16 ragged tiles of 128 x 64 over the device's blocks.
        os.environ["MPGEMM_GEMM_PATH"] = "wgmma_n64"
        if not mpgemm.gemm_plan(2000, 40, 3000).stream_k_blocks:
            raise SystemExit("stream-K: the plan of 2000x40x3000 is not stream-K on wgmma_n64")
        _gemm_on("wgmma_n64", 2000, 40, 3000, bias=True, activation="relu", label="stream-K")
        os.environ.pop("MPGEMM_STREAM_K")
        # Operands of odd pitches on copies at aligned ones (opt-in), the wide tile forced.
        os.environ["MPGEMM_PADDED_OPERANDS"] = "1"
        _gemm_on("wgmma", 301, 259, 131, bias=True, activation="gelu")
        os.environ.pop("MPGEMM_PADDED_OPERANDS")
        _pre_activation_gemm(300, 1032, 264)
        _pre_activation_gemm(300, 1032, 264, "gelu_tanh")
        # Whole K on 3 x 5 tiles, the last row and column ragged, on each Hopper tile; split 13 ways as the
        # split-K target above.
        for path in ("wgmma", "wgmma_2x1", "wgmma_pingpong", "wgmma_n128", "wgmma_n64"):
            _row_sums_gemm(304, 1032, 264, split=False, path=path)
        _row_sums_gemm(128, 264, 4104, split=True)
        # Whole K on 3 x 5 tiles, the last row and column ragged, Z read in pairs (with 1030 columns, D's
        # pitch not 16-byte: stored from registers); each derivative; and on ping-pong pairs.
        _activation_grad_gemm(304, 1032, 264, "gelu")
        _activation_grad_gemm(304, 1032, 264, "gelu_tanh")
        _activation_grad_gemm(300, 1030, 264, "relu")
        _activation_grad_gemm(304, 1032, 264, "gelu_tanh", path="wgmma_pingpong")
    os.environ.pop("MPGEMM_GEMM_PATH")
    # 196 tiles of 128x128 for fprop and dgrad: the large tile, as on ResNet-50's layers.
    _conv_passes("large tile", (8, 64, 56, 56), (128, 64, 3, 3), padding=1)
    _conv_passes("stride 2", (2, 32, 15, 15), (64, 32, 3, 3), stride=2, padding=1)
    _conv_passes("depthwise", (2, 32, 14, 14), (32, 1, 3, 3), padding=1, groups=32)
    # Depthwise wgrad on the sliding window (MPGEMM_DEPTHWISE_SLIDING_WGRAD=1): 7x7 over 160 channels (two
    # tiles of lanes), its 2 x 14 output rows split; 5x5 at column stride 2 over 36 channels.
    os.environ["MPGEMM_DEPTHWISE_SLIDING_WGRAD"] = "1"
    _conv_passes("depthwise sliding 7x7", (2, 160, 14, 14), (160, 1, 7, 7), padding=3, groups=160)
    _conv_passes("depthwise sliding 5x5 stride 2", (2, 36, 15, 15), (36, 1, 5, 5), stride=2, padding=2, groups=36)
    os.environ.pop("MPGEMM_DEPTHWISE_SLIDING_WGRAD")
    # The depthwise gather on the sliding window (MPGEMM_DEPTHWISE_SLIDING_GATHER=1): fprop and dgrad of a 7x7
    # over 264 channels (two tiles of lanes), its window past x's edges on both sides; fprop of a 3x3 at
    # stride 2 (its dgrad's phases on the gather kernel).
    os.environ["MPGEMM_DEPTHWISE_SLIDING_GATHER"] = "1"
    _conv_passes("depthwise sliding gather 7x7", (2, 264, 10, 10), (264, 1, 7, 7), padding=3, groups=264)
    _conv_passes("depthwise sliding gather 3x3 stride 2", (2, 48, 15, 15), (48, 1, 3, 3), stride=2, padding=1,
                 groups=48)
    os.environ.pop("MPGEMM_DEPTHWISE_SLIDING_GATHER")
    # The WMMA kernels' 128 x 16 tile (MPGEMM_CONV_N16_TILE=1): a grouped 3x3 of 8 channels a group (fprop and
    # dgrad in place on 16-byte chunks), and 16 filters over 3 channels, 7x7 at stride 2 (fprop and dgrad on
    # the padded copy, 8-byte chunks).
    os.environ["MPGEMM_CONV_N16_TILE"] = "1"
    os.environ["MPGEMM_CONV_PATH"] = "wmma"
    _conv_passes("n16 grouped", (2, 128, 9, 9), (128, 8, 3, 3), padding=1, groups=16)
    _conv_passes("n16 3 channels", (2, 3, 20, 20), (16, 3, 7, 7), stride=2, padding=3)
    os.environ.pop("MPGEMM_CONV_PATH")
    os.environ.pop("MPGEMM_CONV_N16_TILE")
    _conv_passes("3 channels", (2, 3, 32, 32), (16, 3, 7, 7), stride=2, padding=3)
    # A 1x1 as GEMMs (MPGEMM_CONV_PATH=gemm): wgrad's K (the 2 x 28 x 28 pixels) split.
    os.environ["MPGEMM_CONV_PATH"] = "gemm"
    _conv_passes("1x1 as GEMMs", (2, 64, 28, 28), (72, 64, 1, 1))
    os.environ.pop("MPGEMM_CONV_PATH")
    # The fused batch norm: 16-byte runs (64 channels) and one element a thread (37); then with the sums and
    # the input gradient loading rows ahead (MPGEMM_BATCH_NORM_LOADS_AHEAD=1), 256 channels among them.
    _batch_norm_passes("64 channels", (8, 64, 28, 28))
    _batch_norm_passes("37 channels", (3, 37, 9, 9))
    os.environ["MPGEMM_BATCH_NORM_LOADS_AHEAD"] = "1"
    try:
        _batch_norm_passes("loads ahead 64 channels", (8, 64, 28, 28))
        _batch_norm_passes("loads ahead 256 channels", (4, 256, 13, 9))
        _batch_norm_passes("loads ahead 37 channels", (3, 37, 9, 9))
    finally:
        os.environ.pop("MPGEMM_BATCH_NORM_LOADS_AHEAD")
    # The finish reading its partials by whole sectors (MPGEMM_BATCH_NORM_FINISH_BY_LINES=1): 512 row blocks (4
    # a lane) of 16 channels; 2 row blocks of 37 channels (their fifth block of 8 channels short).
    os.environ["MPGEMM_BATCH_NORM_FINISH_BY_LINES"] = "1"
    try:
        _batch_norm_passes("finish by lines 16 channels", (64, 16, 32, 32))
        _batch_norm_passes("finish by lines 37 channels", (3, 37, 9, 9))
    finally:
        os.environ.pop("MPGEMM_BATCH_NORM_FINISH_BY_LINES")
    # The stem's max pool fused into its chain: 16-byte runs (ResNet's 64 channels), one element a thread (37).
    _fused_max_pool_passes("64 channels", (8, 64, 56, 56))
    _fused_max_pool_passes("37 channels", (3, 37, 15, 17))
    # The gated MLP's passes: 16-byte runs over 65 blocks' threads and a tail of 5; one element a thread.
    _gated_passes("16-byte runs", 8 * 256 * 65 + 5, 0, torch.float16, "silu")
    _gated_passes("off 16 bytes", 3001, 1, torch.float16, "gelu_tanh")
    # Layer norm's passes: GPT-2's width on 16-byte runs over rows past two slabs of the weights' sums; one
    # element a lane.
    _layer_norm_passes("16-byte runs", 600, 768, 0, torch.float16)
    _layer_norm_passes("off 16 bytes", 37, 104, 1, torch.float16)
    # fprop with its batch statistics from the WMMA epilogue's column moments, and on sm_90 the Hopper one's.
    os.environ["MPGEMM_CONV_PATH"] = "wmma"
    try:
        _epilogue_statistics("WMMA epilogue", (8, 64, 28, 28), (64, 64, 3, 3))
    finally:
        os.environ.pop("MPGEMM_CONV_PATH")
    if torch.cuda.get_device_capability() == (9, 0):
        _epilogue_statistics("Hopper epilogue", (8, 64, 28, 28), (128, 64, 3, 3))
    _loss_scaling()
    if torch.cuda.get_device_capability() == (9, 0):
        # 64 channels (wgrad's boxes): every pass on the Hopper kernels, wgrad's 18 K slices split; then
        # dgrad's four phases at stride 2, and a 1x1 at stride 2 whose three unreached phases are zeroed.
        # On the wide tile, dx's rows from registers, a launch a phase, x folded a thread per element (the
        # narrow tiles, staged rows, one launch's phases and the chunked fold are the defaults).
        os.environ.update(MPGEMM_CONV_PATH="wgmma", MPGEMM_NARROW_TILES="0", MPGEMM_STAGED_ROW_STORES="0",
                          MPGEMM_DGRAD_ONE_LAUNCH="0", MPGEMM_CHUNKED_FOLD="0")
        _conv_passes("Hopper", (2, 64, 24, 24), (72, 64, 3, 3), padding=1)
        _conv_passes("Hopper stride 2", (2, 64, 15, 15), (72, 64, 3, 3), stride=2, padding=1)
        _conv_passes("Hopper 1x1 stride 2", (2, 64, 14, 14), (72, 64, 1, 1), stride=2)
        # A first layer (3 channels, 7x7 at stride 2): fprop and wgrad on folded taps (dgrad on WMMA).
        _conv_passes("Hopper folded taps", (2, 3, 32, 32), (16, 3, 7, 7), stride=2, padding=3)
        # The same, x folded in 16-byte chunks (MPGEMM_CHUNKED_FOLD=1).
        os.environ["MPGEMM_CHUNKED_FOLD"] = "1"
        _conv_passes("Hopper folded taps in chunks", (2, 3, 32, 32), (16, 3, 7, 7), stride=2, padding=3)
        os.environ["MPGEMM_CHUNKED_FOLD"] = "0"
        # The same, x's fold gathered by the producer (MPGEMM_GATHERED_FOLD=1): no copy of x.
        os.environ["MPGEMM_GATHERED_FOLD"] = "1"
        _conv_passes("Hopper folded taps gathered", (2, 3, 32, 32), (16, 3, 7, 7), stride=2, padding=3)
        os.environ.pop("MPGEMM_GATHERED_FOLD")
        # dgrad of a 1x1 at stride 1 adding an addend in its epilogue (MPGEMM_DGRAD_ADDEND=1): 264 channels of dx
        # on the wide tile (its last columns ragged), 64 on 128 x 64 tiles, over 2 x 15 x 15 pixels (the last
        # tile's rows ragged).
        _dgrad_addend("Hopper addend", (2, 264, 15, 15), 72)
        os.environ["MPGEMM_NARROW_TILES"] = "1"
        _dgrad_addend("Hopper narrow addend", (2, 64, 15, 15), 72)
        os.environ["MPGEMM_NARROW_TILES"] = "0"
        # The narrow tiles: fprop of 72 filters on 128 x 64 tiles (9 tiles of 128 x 128 would fill too few),
        # dgrad of 64 channels on them, wgrad (9 x 64 columns) on the wide tile; a 1x1 of 128 filters over
        # 16 x 32 x 32 pixels, fprop on 128 x 128 tiles (128 of them), dgrad and wgrad (64 columns) on 128 x 64.
        os.environ["MPGEMM_NARROW_TILES"] = "1"
        _conv_passes("Hopper narrow", (2, 64, 24, 24), (72, 64, 3, 3), padding=1)
        _conv_passes("Hopper narrow stride 2", (2, 64, 15, 15), (72, 64, 3, 3), stride=2, padding=1)
        _conv_passes("Hopper narrow 1x1", (16, 64, 32, 32), (128, 64, 1, 1))
        os.environ["MPGEMM_NARROW_TILES"] = "0"
        # dgrad's phases with their rows staged through shared memory (MPGEMM_STAGED_ROW_STORES=1), on the
        # wide tile and on a narrow one.
        os.environ["MPGEMM_STAGED_ROW_STORES"] = "1"
        _conv_passes("Hopper staged rows stride 2", (2, 64, 15, 15), (72, 64, 3, 3), stride=2, padding=1)
        _conv_passes("Hopper staged rows 1x1 stride 2", (2, 264, 14, 14), (72, 264, 1, 1), stride=2)
        os.environ["MPGEMM_NARROW_TILES"] = "1"
        _conv_passes("Hopper narrow staged rows stride 2", (2, 64, 15, 15), (72, 64, 3, 3), stride=2, padding=1)
        # 128 channels over 4 x 48 x 48 pixels of dx: 72 tiles of 128 x 128, enough to keep that tile.
        _conv_passes("Hopper n128 staged rows stride 2", (4, 128, 48, 48), (72, 128, 3, 3), stride=2, padding=1)
        # A strided dgrad's phases in one launch (MPGEMM_DGRAD_ONE_LAUNCH=1): a 3x3's four on the wide tile and a
        # 1x1's (three of them stored as zeros) on a narrow one.
        os.environ["MPGEMM_DGRAD_ONE_LAUNCH"] = "1"
        _conv_passes("Hopper one-launch 1x1 stride 2", (2, 64, 14, 14), (72, 64, 1, 1), stride=2)
        os.environ["MPGEMM_NARROW_TILES"] = "0"
        _conv_passes("Hopper one-launch stride 2", (2, 264, 15, 15), (72, 264, 3, 3), stride=2, padding=1)
        # wgrad of 64 filters on the 64-row tile (MPGEMM_M64_TILE=1): 7x7 taps of 1024 channels over 64 pixels,
        # 196 tiles of one K slice, more than the blocks, so that each block's consumers take turns.
        os.environ["MPGEMM_M64_TILE"] = "1"
        _conv_passes("Hopper m64 wgrad", (1, 1024, 8, 8), (64, 1024, 7, 7), padding=3)
        os.environ.pop("MPGEMM_M64_TILE")
        os.environ.pop("MPGEMM_DGRAD_ONE_LAUNCH")
        os.environ.pop("MPGEMM_CHUNKED_FOLD")
        os.environ.pop("MPGEMM_NARROW_TILES")
        os.environ.pop("MPGEMM_STAGED_ROW_STORES")
        os.environ.pop("MPGEMM_CONV_PATH")
    torch.cuda.synchronize()


def conv_tiles():
    """One tile of each pass on the Hopper convolution: fprop of 2 x 8 x 8
    pixels by 256 filters; dgrad (2 x 8 x 8 pixels of dx by 256 channels)
    and wgrad (128 filters by 256 channels) of a 1x1; then dgrad at stride
    2, one tile per phase of dx (2 x 8 x 8 pixels each by 256 channels)."""
    if torch.cuda.get_device_capability() != (9, 0):
        raise SystemExit("conv-tiles needs an sm_90 GPU")
    torch.manual_seed(0)
    # The wide tile, dx's rows stored from registers: the mainloop's three kernels.
    os.environ.update(MPGEMM_CONV_PATH="wgmma", MPGEMM_NARROW_TILES="0", MPGEMM_STAGED_ROW_STORES="0")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        _conv_passes("one fprop tile", (2, 64, 8, 8), (256, 64, 3, 3), padding=1)
        _conv_passes("one dgrad and one wgrad tile", (2, 256, 8, 8), (128, 256, 1, 1))
        _conv_passes("one dgrad tile per phase at stride 2", (2, 256, 16, 16), (64, 256, 3, 3), stride=2, padding=1)
    ran = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and
           "wgmma_conv_kernel" in e.name}
    print(f"Hopper convolution kernels that ran: {len(ran)}")
    if len(ran) != 3:
        raise SystemExit(f"expected the Hopper convolution's 3 kernels (fprop, dgrad, wgrad) to run, saw {sorted(ran)}")


def profile(size, warmup, without_ncu, json_path):
    a, b = torch.randn(size, size, device="cuda").half(), torch.randn(size, size, device="cuda").half()
    for _ in range(warmup):
        mpgemm.gemm(a, b)
    torch.cuda.synchronize()
    if not without_ncu:
        mpgemm.gemm(a, b)
        torch.cuda.synchronize()
        return
    kernel_ms = timing.profiled_kernel_ms(mpgemm.gemm, [(a, b)], reps=20)
    # Read right after the calls, while the clock is still the one they ran at.
    after = gpu_state.read()
    clock = after.get("sm_clock_mhz") if after else None
    result = {"source": "torch.profiler kernel time x NVML SM clock read right after (ncu unavailable)",
              "size": size, "kernel_ms": kernel_ms, "tflops": 2 * size**3 / (kernel_ms * 1e-3) / 1e12,
              "sm_clock_mhz": clock, "cycles": kernel_ms * 1e3 * clock if clock else None, "gpu_state": after}
    print(json.dumps(result, indent=1))
    with open(json_path, "w") as f:
        json.dump(result, f, indent=1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("sanitize")
    commands.add_parser("conv-tiles")
    p = commands.add_parser("profile")
    p.add_argument("--size", type=int, default=4096)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--without-ncu", action="store_true")
    p.add_argument("--json", metavar="PATH")
    args = parser.parse_args()
    if not torch.cuda.is_available() or mpgemm.build_info()["backend"] != "cuda":
        raise SystemExit("gpu_targets.py needs a GPU and a CUDA build of mpgemm")
    if args.command == "sanitize":
        sanitize()
    elif args.command == "conv-tiles":
        conv_tiles()
    elif args.without_ncu and not args.json:
        parser.error("--without-ncu needs --json PATH")
    else:
        profile(args.size, args.warmup, args.without_ncu, args.json)


if __name__ == "__main__":
    main()
