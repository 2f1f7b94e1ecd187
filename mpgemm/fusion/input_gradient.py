"""A chain's input read by one more node, its two gradients summed by the
chain's dgrad (MPGEMM_DGRAD_ADDEND=1, opt-in).

A ResNet block's input goes to its first chain's convolution and to its
residual (the add, or the downsample's convolution). Autograd then sums
the input's two gradients in an elementwise add of their own: a pass that
reads two activations and writes a third (16 such adds in ResNet-50's step,
1.95 ms of it at batch 256 on an H200, fe39419; bench/NOTES.md). Here the
chain's call returns the input again, a view from its convolution's own
autograd node (ConvGivingInput), and the other node takes that view: its
gradient of the input then reaches the convolution's backward, which hands
it to its dgrad as an addend (torch.ops.mpgemm._conv2d_grad_input_add,
added in the epilogue on the Hopper convolution at stride 1), and no add
runs. Where the call cannot stand in for the convolution's module, the
chain hands on the input itself and autograd adds, as without the switch.
"""

import operator
import os

import torch

from .. import nn
from .graph import global_hooks, input_cast

FLOAT = torch.float32


def dgrad_addend_enabled():
    """Whether chains hand their input on and sum its two gradients in their
    convolution's dgrad (MPGEMM_DGRAD_ADDEND=1, opt-in until the Hopper
    dgrad's addend kernels have passed the GPU tests; the same switch picks
    them) or leave them to autograd's add ("0" or unset): read when fuse()
    rewrites a module, and again at each call."""
    value = os.environ.get("MPGEMM_DGRAD_ADDEND", "")
    if value not in ("", "0", "1"):
        raise ValueError(f"MPGEMM_DGRAD_ADDEND must be '0' or '1', got {value!r}")
    return value == "1"


class ConvGivingInput(torch.autograd.Function):
    """y = mpgemm's conv2d(x, weight, bias) (with its batch statistics where
    asked), and x again, a view of it, for the one other node that reads x:
    x's gradient from that node reaches this call's backward, which adds it
    to the dgrad's (mpgemm._conv2d_grad_input_add) instead of autograd
    adding the two in a pass of its own. Backward otherwise as the conv2d
    op's own: dgrad and wgrad of the saved x and weight, the bias's gradient
    summed in fp32."""

    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding, dilation, groups, with_stats):
        ctx.set_materialize_grads(False)
        if with_stats:
            y, stats = torch.ops.mpgemm.conv2d_batch_stats(x, weight, bias, stride, padding, dilation, groups)
            ctx.mark_non_differentiable(stats)
        else:
            y, stats = torch.ops.mpgemm.conv2d(x, weight, bias, stride, padding, dilation, groups), None
        ctx.save_for_backward(x, weight)
        ctx.geometry = (stride, padding, dilation, groups)
        ctx.bias_dtype = None if bias is None else bias.dtype
        return y, x, stats

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_y, grad_x_again, _):
        x, weight = ctx.saved_tensors
        wants_x, wants_weight, wants_bias = ctx.needs_input_grad[:3]
        grad_x = grad_weight = grad_bias = None
        if grad_y is None:
            grad_x = grad_x_again if wants_x else None
        else:
            if wants_x:
                grad_x = (torch.ops.mpgemm.conv2d_grad_input(grad_y, x, weight, *ctx.geometry) if grad_x_again is None
                          else torch.ops.mpgemm._conv2d_grad_input_add(grad_y, x, weight, grad_x_again, *ctx.geometry))
            if wants_weight:
                grad_weight = torch.ops.mpgemm.conv2d_grad_weight(grad_y, x, weight, *ctx.geometry)
            if wants_bias:
                grad_bias = grad_y.sum((0, 2, 3), dtype=FLOAT).to(ctx.bias_dtype)
        return grad_x, grad_weight, grad_bias, None, None, None, None, None


def _autocast_casts_nothing(conv, x):
    """Whether autocast, if on, leaves the convolution's arguments as they
    are (prepare()'s forward: x, the weight and the bias already of its
    dtype): its casts, which the op's own autograd would record, are then
    none, and ConvGivingInput saves what that node would."""
    device = x.device.type
    if not torch.is_autocast_enabled(device):
        return True
    dtype = torch.get_autocast_dtype(device)
    return x.dtype == conv.weight.dtype == dtype and (conv.bias is None or conv.bias.dtype == dtype)


def _stands_in(conv, x):
    """Whether ConvGivingInput may stand in for the convolution's module: the
    switch on, a graph recorded for x, an mpgemm Conv2d with
    padding_mode="zeros" and its padding given as numbers (not "same"), no
    hook but prepare()'s input cast to x's own dtype, no cast of autocast's,
    not compiling."""
    if not dgrad_addend_enabled() or not torch.is_grad_enabled() or not isinstance(x, torch.Tensor):
        return False
    casts, dtype = input_cast(conv)
    return (x.requires_grad and x.dim() == 4 and type(conv).forward is nn.Conv2d.forward
            and conv.padding_mode == "zeros" and not isinstance(conv.padding, str) and casts
            and (dtype is None or x.dtype == dtype) and not global_hooks() and _autocast_casts_nothing(conv, x)
            and not torch.compiler.is_compiling())


def conv_giving_input(conv, x, with_stats):
    """(y, its batch statistics where `with_stats`, else None, x again) from
    ConvGivingInput where it may stand in for `conv`'s module; None where
    not (the chain then calls the module and hands on x itself)."""
    if not _stands_in(conv, x):
        return None
    (pad_h, pad_w), (stride_h, stride_w), (dilation_h, dilation_w) = conv.padding, conv.stride, conv.dilation
    y, x_again, stats = ConvGivingInput.apply(x, conv.weight, conv.bias, [stride_h, stride_w],
                                              [pad_h, pad_h, pad_w, pad_w], [dilation_h, dilation_w], conv.groups,
                                              with_stats)
    return y, stats, x_again


# The augmented assignments (x += y and the like), as fx traces them.
AUGMENTED = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv, operator.imod,
             operator.ipow, operator.imatmul, operator.iand, operator.ior, operator.ixor, operator.ilshift,
             operator.irshift}


def _writes_to(node, x):
    """Whether a traced call writes to x in place: an augmented assignment
    to it, or a tensor method of its ending in "_"."""
    in_place = ((node.op == "call_function" and node.target in AUGMENTED)
                or (node.op == "call_method" and node.target.endswith("_")))
    return in_place and bool(node.args) and node.args[0] is x


def hand_on_inputs(graph, chains):
    """Makes each run_chain node of `chains` ({node: its ConvChain}) whose
    convolution's input (its third argument) has one other reader, later in
    the graph, return that input again (gives_input, as its last output),
    and hands the other reader that copy in its place. Not where that reader
    is the graph's output (the caller gets x itself) or writes to it in
    place: an autograd Function's view refuses that in the forward, where x
    itself would be refused only by the backward that needs it."""
    order = {node: i for i, node in enumerate(graph.nodes)}
    for fused, chain in chains.items():
        x = fused.args[2]
        if fused.kwargs.get("pool") is not None or not isinstance(x, torch.fx.Node) or len(x.users) != 2:
            continue
        other = next(user for user in x.users if user is not fused)
        if order[other] < order[fused] or other.op == "output" or _writes_to(other, x):
            continue
        recipe = fused.kwargs.get("recipe", False)
        fused.kwargs = {**fused.kwargs, "gives_input": True}
        if not recipe:  # its readers take the output, now the first of two
            with graph.inserting_after(fused):
                out = graph.call_function(operator.getitem, (fused, 0))
            fused.replace_all_uses_with(out, delete_user_cb=lambda user: user is not out)
        with graph.inserting_after(fused):
            x_again = graph.call_function(operator.getitem, (fused, 2 if recipe else 1))
        other.replace_input_with(x, x_again)
        chain.sums_input_gradient = True
