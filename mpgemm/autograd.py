"""Backward formulas of the mpgemm ops, registered with torch.library so that
they work in eager mode and under torch.compile.

For y = activation(a @ b + bias) (gemm, linear) the gradients are
    dz = dy * activation'(z)       (fp32; z recomputed, not stored)
    da = dz @ b^T,  db = a^T @ dz  (on the mpgemm kernels, dz rounded to the
                                    product's input type, fp16 or bf16;
                                    transposes read in place)
    dbias = sum(dz)                (accumulated in fp32)
and each gradient has the dtype of its input. conv2d's are its dgrad and
wgrad implicit GEMMs (one op, conv2d_backward, where both are wanted) and
an fp32 sum for the bias. Each saves its operands, and the bias only where an
activation is recomputed. They are computed once, without a graph:
differentiating them again raises an error.
"""

import functools

import torch

FLOAT = torch.float32


def _not_twice_differentiable(op_name):
    def decorate(backward):
        @functools.wraps(backward)
        def run(ctx, *grads):
            with torch.no_grad():
                grads_in = backward(ctx, *grads)
            if not torch.is_grad_enabled():
                return grads_in
            # Grad mode in a backward means create_graph=True: hand back
            # gradients whose own backward raises.
            raise_on_backward = torch._C._functions.DelayedError(
                f"{op_name}: double backward is not supported; its gradients are computed without a graph".encode(),
                len(grads_in),
            )
            detached = [None if g is None else g.detach().requires_grad_() for g in grads_in]
            return raise_on_backward(*detached)

        return run

    return decorate


def _pre_activation_grad(grad_out, activation, recompute_pre_activation):
    """dL/dz for y = activation(z), in fp32, or grad_out itself without an activation."""
    if activation is None:
        return grad_out
    z = recompute_pre_activation()
    if activation == "relu":
        return torch.ops.aten.threshold_backward(grad_out.to(FLOAT), z, 0)
    return torch.ops.aten.gelu_backward(grad_out.to(FLOAT), z)


def _sum_to(t, dims, dtype):
    """t summed over dims, accumulated in fp32, in dtype: one op where t has
    that dtype (torch's sums of fp16 and bf16 accumulate in fp32), not a sum
    in fp32 and a cast."""
    return t.sum(dims) if t.dtype == dtype else t.sum(dims, dtype=FLOAT).to(dtype)


def _bias_grad(grad_z, bias_dtype):
    return _sum_to(grad_z.reshape(grad_z.shape[:-1].numel(), grad_z.shape[-1]), 0, bias_dtype)


def _save_operands(ctx, first, second, bias, activation):
    """Saves the two operands, and the bias only where backward recomputes
    the pre-activation: the bias's gradient needs no more than its dtype."""
    ctx.activation = activation
    ctx.bias_dtype = None if bias is None else bias.dtype
    ctx.save_for_backward(first, second, bias if activation is not None else None)


# gemm(a, b, bias, *, activation, out_dtype)


def _gemm_setup_context(ctx, inputs, keyword_only_inputs, output):
    _save_operands(ctx, *inputs, keyword_only_inputs.get("activation"))


def _product_dtype(x, weight):
    """The 16-bit type linear and conv2d compute in (csrc/checks.cpp has the rule)."""
    return torch.bfloat16 if torch.bfloat16 in (x.dtype, weight.dtype) else torch.float16


def _operand_grad(x, y, operand_shape):
    """x @ y as the gradient of a 16-bit operand of `operand_shape` and x's
    dtype, summed over the batch it was broadcast across."""
    full_shape = torch.broadcast_shapes(x.shape[:-2], y.shape[:-2]) + (x.shape[-2], y.shape[-1])
    if full_shape == operand_shape:
        return torch.ops.mpgemm.gemm(x, y, out_dtype=x.dtype)
    return torch.ops.mpgemm.gemm(x, y, out_dtype=FLOAT).sum_to_size(operand_shape).to(x.dtype)


@_not_twice_differentiable("mpgemm.gemm")
def _gemm_backward(ctx, grad_out):
    a, b, bias = ctx.saved_tensors
    grad_z = _pre_activation_grad(
        grad_out, ctx.activation, lambda: torch.ops.mpgemm.gemm(a, b, bias, out_dtype=FLOAT))
    grad_z16 = grad_z.to(a.dtype)
    grad_a = grad_b = grad_bias = None
    if ctx.needs_input_grad[0]:
        grad_a = _operand_grad(grad_z16, b.transpose(-1, -2), a.shape)
    if ctx.needs_input_grad[1]:
        if b.dim() == 2 and a.dim() == 3:
            # One GEMM over the flattened batch instead of a batched one and a sum.
            (k, n), rows = b.shape, a.shape[:-1].numel()
            grad_b = torch.ops.mpgemm.gemm(a.reshape(rows, k).t(), grad_z16.reshape(rows, n), out_dtype=a.dtype)
        else:
            grad_b = _operand_grad(a.transpose(-1, -2), grad_z16, b.shape)
    if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
        grad_bias = _bias_grad(grad_z, ctx.bias_dtype)
    return grad_a, grad_b, grad_bias


# linear(x, weight, bias, *, activation, out_dtype)


def _linear_setup_context(ctx, inputs, keyword_only_inputs, output):
    _save_operands(ctx, *inputs, keyword_only_inputs.get("activation"))


@_not_twice_differentiable("mpgemm.linear")
def _linear_backward(ctx, grad_out):
    x, weight, bias = ctx.saved_tensors
    out_features, in_features = weight.shape
    rows = x.shape[:-1].numel()  # not -1: an empty feature dimension leaves -1 ambiguous
    grad_z = _pre_activation_grad(
        grad_out, ctx.activation, lambda: torch.ops.mpgemm.linear(x, weight, bias, out_dtype=FLOAT))
    dtype = _product_dtype(x, weight)
    grad_z16 = grad_z.reshape(rows, out_features).to(dtype)
    grad_x = grad_weight = grad_bias = None
    if ctx.needs_input_grad[0]:
        grad_x = torch.ops.mpgemm.gemm(grad_z16, weight.to(dtype), out_dtype=x.dtype).view(x.shape)
    if ctx.needs_input_grad[1]:
        x16 = x.reshape(rows, in_features).to(dtype)
        grad_weight = torch.ops.mpgemm.gemm(grad_z16.t(), x16, out_dtype=weight.dtype)
    if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
        grad_bias = _bias_grad(grad_z, ctx.bias_dtype)
    return grad_x, grad_weight, grad_bias


# conv2d(x, weight, bias, stride, padding, dilation, groups, *, out_dtype)


def _conv2d_setup_context(ctx, inputs, keyword_only_inputs, output):
    x, weight, bias, stride, padding, dilation, groups = inputs
    ctx.geometry = (stride, padding, dilation, groups)
    ctx.bias_dtype = None if bias is None else bias.dtype
    ctx.save_for_backward(x, weight)


@_not_twice_differentiable("mpgemm.conv2d")
def _conv2d_backward(ctx, grad_out):
    x, weight = ctx.saved_tensors
    grad_x = grad_weight = grad_bias = None
    if ctx.needs_input_grad[0] and ctx.needs_input_grad[1]:
        grad_x, grad_weight = torch.ops.mpgemm.conv2d_backward(grad_out, x, weight, *ctx.geometry)
    elif ctx.needs_input_grad[0]:
        grad_x = torch.ops.mpgemm.conv2d_grad_input(grad_out, x, weight, *ctx.geometry)
    elif ctx.needs_input_grad[1]:
        grad_weight = torch.ops.mpgemm.conv2d_grad_weight(grad_out, x, weight, *ctx.geometry)
    if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
        grad_bias = _sum_to(grad_out, (0, 2, 3), ctx.bias_dtype)
    return grad_x, grad_weight, grad_bias, None, None, None, None


torch.library.register_autograd("mpgemm::gemm", _gemm_backward, setup_context=_gemm_setup_context)
torch.library.register_autograd("mpgemm::linear", _linear_backward, setup_context=_linear_setup_context)
torch.library.register_autograd("mpgemm::conv2d", _conv2d_backward, setup_context=_conv2d_setup_context)
