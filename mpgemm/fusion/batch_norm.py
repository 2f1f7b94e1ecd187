"""Training batch norm on mpgemm's passes, with the residual add and ReLU
that follow it in a ResNet block: ``relu(batch_norm(y) + residual)`` in one
pass forward and two backward (csrc/kernels/norm/batch_norm.cu).

:func:`batch_norm_act` has torch's ``BatchNorm2d`` semantics: batch
statistics in training (the biased variance normalizes, the unbiased one
enters ``running_var``), ``momentum`` with ``momentum=None`` as a cumulative
average over ``num_batches_tracked``, ``track_running_stats=False``,
``affine=False``, and the running statistics in eval. It saves for backward
less than torch's batch norm and ReLU save: y and the statistics, and where
the chain ends in a ReLU, its mask as bits (16-bit y, channels a multiple of
8) or else its output (which the next convolution saves anyway). With
``recipe=True`` it also says how to make its output again from what it keeps
(recompute.py: the next convolution then need not keep it).

:func:`batch_norm_relu_max_pool` is ``max_pool(relu(batch_norm(y)))`` (a
ResNet's stem) in the same one pass: the chain's output is never made, and
backward keeps y, the statistics and a byte per pooled element naming its
maximum in the window, where torch's pool keeps its input and int64 indices.
"""

import torch
from torch.autograd.function import once_differentiable

from .recompute import Recipe

FLOAT = torch.float32
ops = torch.ops.mpgemm


class _BatchNormAct(torch.autograd.Function):
    """out = relu?(y * scale + shift + residual), scale and shift from gamma,
    beta and the statistics (batch ones in training, which update the
    running ones in the op); one op forward, one backward."""

    @staticmethod
    def forward(ctx, y, weight, bias, residual, running_mean, running_var, batch_stats, momentum, eps, relu,
                batch_mean_var):
        out, mean, invstd, scale, shift, relu_mask = ops.batch_norm_act(y, weight, bias, residual, running_mean,
                                                                        running_var, batch_stats, momentum, eps,
                                                                        relu, batch_mean_var)
        ctx.batch_stats, ctx.relu = batch_stats, relu
        ctx.dtypes = tuple(None if t is None else t.dtype for t in (weight, bias))
        # The ReLU's mask: its bits where the op gave them, else the output itself.
        bits = relu_mask if relu_mask.numel() else None
        keeps_out = relu and bits is None
        ctx.save_for_backward(y, out if keeps_out else None, bits, mean, invstd, scale)
        ctx.mark_non_differentiable(scale, shift)
        return out, scale, shift, keeps_out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out, _grad_scale, _grad_shift, _grad_keeps_out):
        y, out, relu_mask, mean, invstd, scale = ctx.saved_tensors
        need_y, need_weight, need_bias, need_residual = ctx.needs_input_grad[:4]
        # Without a ReLU the residual's gradient is grad_out itself.
        mask = [need_y, need_weight or need_bias, need_residual and ctx.relu]
        grad_y, sum_dz, sum_dz_xhat, grad_z = ops.batch_norm_act_backward(grad_out, out, relu_mask, y, mean, invstd,
                                                                          scale, ctx.batch_stats, mask)
        weight_dtype, bias_dtype = ctx.dtypes
        return (grad_y if need_y else None,
                sum_dz_xhat.to(weight_dtype) if need_weight else None,
                sum_dz.to(bias_dtype) if need_bias else None,
                (grad_z if ctx.relu else grad_out) if need_residual else None,
                None, None, None, None, None, None, None)


class _BatchNormReluMaxPool(torch.autograd.Function):
    """max_pool(relu(y * scale + shift)): one op forward; backward the
    pool's and ReLU's gradient from the window bytes, then batch norm's."""

    @staticmethod
    def forward(ctx, y, weight, bias, running_mean, running_var, batch_stats, momentum, eps, batch_mean_var, window):
        out, mean, invstd, scale, _shift, taps = ops.batch_norm_relu_max_pool(
            y, weight, bias, running_mean, running_var, batch_stats, momentum, eps, *window, batch_mean_var)
        ctx.batch_stats, ctx.window = batch_stats, window
        ctx.dtypes = tuple(None if t is None else t.dtype for t in (weight, bias))
        ctx.save_for_backward(y, taps, mean, invstd, scale)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        y, taps, mean, invstd, scale = ctx.saved_tensors
        need_y, need_weight, need_bias = ctx.needs_input_grad[:3]
        dz = ops.max_pool_window_backward(grad_out, taps, list(y.shape[2:]), *ctx.window)
        grad_y, sum_dz, sum_dz_xhat, _ = ops.batch_norm_act_backward(
            dz, None, None, y, mean, invstd, scale, ctx.batch_stats, [need_y, need_weight or need_bias, False])
        weight_dtype, bias_dtype = ctx.dtypes
        return (grad_y if need_y else None,
                sum_dz_xhat.to(weight_dtype) if need_weight else None,
                sum_dz.to(bias_dtype) if need_bias else None,
                None, None, None, None, None, None, None)


MAX_POOL_TAPS = 128  # a window byte names a tap in 7 bits (kernels/norm/max_pool_window.h)
MAX_POOL_STEP = 65535
INT_MAX = 2**31 - 1


def _pair_of(value):
    """A pool's argument as torch reads it: an int, or a sequence of one
    (both dimensions) or two; [] where empty (a stride: the kernel's), None
    where neither."""
    if value is None or isinstance(value, int):
        return [] if value is None else [value, value]
    value = list(value)
    return value * 2 if len(value) == 1 else value if len(value) in (0, 2) else None


def max_pool_window(pool, y=None):
    """A MaxPool2d's (kernel_size, stride, padding, dilation, ceil_mode) as
    the fused ops take them (stride None or empty: the kernel's), or None
    where they cannot: indices returned, an argument of neither one nor two
    ints, more taps than a window byte names, steps past
    MAX_POOL_STEP, or (given the input y) an image or batch past the
    kernels' 32-bit indexing (kernels::max_pool_window_fits, with room for
    the padding and the output's size)."""
    kernel, stride = _pair_of(pool.kernel_size), _pair_of(pool.stride)
    window = (kernel, kernel if stride == [] else stride, _pair_of(pool.padding), _pair_of(pool.dilation),
              bool(pool.ceil_mode))
    if pool.return_indices or not all(window[:4]) or not all(isinstance(v, int) for v in sum(window[:4], [])):
        return None
    if kernel[0] * kernel[1] > MAX_POOL_TAPS or max(sum(window[1:4], [])) > MAX_POOL_STEP:
        return None
    if y is not None:
        n, c, h, w = y.shape
        reach = MAX_POOL_TAPS * MAX_POOL_STEP + 3 * MAX_POOL_STEP  # a window's extent, padding and stride at most
        if n > INT_MAX or (h + 2) * (w + 2) * c > INT_MAX or max(h, w) + reach > INT_MAX:
            return None
    return window


def _batch_norm_factors(bn, y):
    """torch's _BatchNorm.forward up to its call: (momentum factor, batch
    statistics or not, running mean, running var), num_batches_tracked
    counted as torch counts it."""
    if y.dim() != 4:
        raise ValueError(f"expected 4D input (got {y.dim()}D input)")
    factor = 0.0 if bn.momentum is None else bn.momentum
    if bn.training and bn.track_running_stats and bn.num_batches_tracked is not None:
        bn.num_batches_tracked.add_(1)
        factor = 1.0 / float(bn.num_batches_tracked) if bn.momentum is None else bn.momentum
    use_batch_stats = bn.training or (bn.running_mean is None and bn.running_var is None)
    running_mean = bn.running_mean if not bn.training or bn.track_running_stats else None
    running_var = bn.running_var if not bn.training or bn.track_running_stats else None
    if use_batch_stats and y.numel() // max(y.shape[1], 1) <= 1:
        raise ValueError(f"Expected more than 1 value per channel when training, got input size {y.shape}")
    return factor, use_batch_stats, running_mean, running_var


def batch_norm_relu_max_pool(y, bn, pool, batch_mean_var=None):
    """``pool(relu(bn(y)))`` for a ``BatchNorm2d`` bn and a ``MaxPool2d``
    pool that :func:`max_pool_window` takes, in one pass forward, with
    torch's effect on bn's running statistics and ``num_batches_tracked``
    and the bits of torch's pool of :func:`batch_norm_act`'s output (its
    first maximum, its last NaN; backward sums each input's windows in
    torch's order). y is 4-D, fp32, fp16 or bf16; the result has its dtype
    and memory format. batch_mean_var as for :func:`batch_norm_act`."""
    if y.dim() != 4:
        raise ValueError(f"expected 4D input (got {y.dim()}D input)")
    window = max_pool_window(pool, y)
    if window is None:
        raise ValueError("batch_norm_relu_max_pool: expected a max pool without return_indices, with at most "
                         f"{MAX_POOL_TAPS} taps and steps of at most {MAX_POOL_STEP}, over images of at most "
                         f"2^31 - 1 elements, got {pool} over {tuple(y.shape)}")
    factor, use_batch_stats, running_mean, running_var = _batch_norm_factors(bn, y)
    return _BatchNormReluMaxPool.apply(y, bn.weight, bn.bias, running_mean, running_var, use_batch_stats, factor,
                                       bn.eps, batch_mean_var if use_batch_stats else None, window)


def batch_norm_act(y, bn, residual=None, relu=False, batch_mean_var=None, *, recipe=False):
    """``relu(bn(y) + residual)`` (each part optional) for a ``BatchNorm2d``
    bn, as torch's forward computes it and with the same effect on bn's
    running statistics and ``num_batches_tracked``; y is 4-D (N, C, H, W),
    fp32, fp16 or bf16, and the result has its dtype and memory format. A
    residual has y's shape and dtype (torch would promote another dtype:
    :func:`~mpgemm.fuse`'s chains leave such an add to torch).
    batch_mean_var: y's batch statistics where they are known
    (:func:`mpgemm.ops.conv2d_batch_stats`), used in place of y's own where
    batch statistics normalize; ignored where the running ones do.
    recipe=True (without a residual): returns (out, a
    :class:`~mpgemm.fusion.recompute.Recipe` that makes out again from what
    backward keeps, or None where backward keeps nothing or keeps out)."""
    factor, use_batch_stats, running_mean, running_var = _batch_norm_factors(bn, y)
    if recipe and residual is not None:
        raise ValueError("batch_norm_act: a recipe makes out again from y alone, so expected no residual")
    out, scale, shift, keeps_out = _BatchNormAct.apply(y, bn.weight, bn.bias, residual, running_mean, running_var,
                                                       use_batch_stats, factor, bn.eps, relu,
                                                       batch_mean_var if use_batch_stats else None)
    if not recipe:
        return out
    # Where backward keeps out itself (a ReLU's mask without bits), out costs nothing more to keep.
    return out, Recipe(y, scale, shift, relu, out) if out.requires_grad and not keeps_out else None
