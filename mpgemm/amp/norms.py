"""How the norm layers of a prepared model meet its 16-bit activations.

Mixed precision saves memory only if the activations stay 16-bit end to end,
and a ResNet's or a transformer's norm layers touch every one of them. So,
under :func:`mpgemm.amp.prepare`, with their weights, biases and running
statistics in fp32:

- batch norms (torch's BatchNorm1d/2d/3d, SyncBatchNorm and InstanceNorm, their
  subclasses that keep torch's forward, and by name FrozenBatchNorm2d and
  timm's BatchNormAct2d) take the 16-bit activations as they come, as under
  torch.amp: torch's batch_norm accumulates in fp32 with fp32 weights and
  statistics and returns the input's type, and autograd saves the 16-bit
  input;
- torch's LayerNorm, GroupNorm and RMSNorm compute in fp32, as autocast has
  them do, but from the 16-bit input: autograd saves that input, not an fp32
  copy of it, and backward widens it again (the functions below). The result
  has the input's type. With MPGEMM_LAYER_NORM_KERNEL=1, LayerNorm runs as
  :func:`mpgemm.layer_norm` instead, which widens nothing;
- any other norm layer (a Python class named like one, such as transformers'
  LlamaRMSNorm) computes in fp32 on an fp32 copy of its input, made by a
  forward pre-hook.
"""

import math
import os
import re

import torch
from torch.autograd.function import once_differentiable

from ..convert import converted_class
from ..ops import layer_norm

aten = torch.ops.aten
FLOAT = torch.float32
LOW_PRECISION = (torch.float16, torch.bfloat16)
# Norm layers: torch's, and any class named like one that holds no layers with
# parameters (transformers' LlamaRMSNorm and T5LayerNorm, timm's RmsNorm,
# torchvision's FrozenBatchNorm2d).
NORM_LAYERS = tuple(
    cls for cls in (torch.nn.modules.batchnorm._NormBase, torch.nn.LayerNorm, torch.nn.GroupNorm,
                    getattr(torch.nn, "RMSNorm", None)) if cls is not None
)
NORM_NAME = re.compile(r"Norm([123][dD])?$")
BATCH_NORMS = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.modules.instancenorm._InstanceNorm)
# Batch norms with a forward of their own, known to take 16-bit input as
# torch's does: FrozenBatchNorm2d (torchvision's, timm's, detectron2's: an
# affine map from fp32 buffers) and timm's norm-act layers (F.batch_norm, then
# an activation).
BATCH_NORMS_BY_NAME = re.compile(r"^(FrozenBatchNorm2d|FrozenBatchNormAct2d|BatchNormAct2d|SyncBatchNormAct)$")


def is_norm_layer(module):
    """torch's norm layers, and modules named like one that hold no layers with
    parameters (a PreNorm(dim, fn) wrapper is not one)."""
    if isinstance(module, NORM_LAYERS):
        return True
    return bool(NORM_NAME.search(type(module).__name__)) and not any(
        True for child in module.children() for _ in child.parameters())


def _compute_type(x):
    return FLOAT if x.dtype in LOW_PRECISION else x.dtype


def _widened(t, dtype):
    return None if t is None else t.to(dtype)


def _like(grad, operand):
    """A gradient in its operand's type, or None where none was asked for."""
    return None if grad is None or operand is None else grad.to(operand.dtype)


def _memory_format(x):
    """The memory format torch's group_norm gives its input and output:
    channels-last where the input is, on the CPU alone; its kernels elsewhere
    take contiguous tensors only."""
    if x.device.type != "cpu":
        return torch.contiguous_format
    if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
        return torch.channels_last
    if x.dim() == 5 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last_3d):
        return torch.channels_last_3d
    return torch.contiguous_format


def layer_norm_kernel():
    """MPGEMM_LAYER_NORM_KERNEL: "1" runs LayerNorm on 16-bit input as
    :func:`mpgemm.layer_norm` (its own passes over the 16-bit tensors, its
    autograd in C++; backward not differentiable again); unset, empty or "0"
    as below (torch's fp32 layer norm on a widened copy, as autocast runs
    it). Opt-in until its CUDA kernels pass the GPU tests. Asked at each
    call (torch.compile asks once, when it traces)."""
    value = os.environ.get("MPGEMM_LAYER_NORM_KERNEL", "")
    if value not in ("", "0", "1"):
        raise ValueError(f"MPGEMM_LAYER_NORM_KERNEL must be '0' or '1', got {value!r}")
    return value == "1"


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, normalized_shape, eps):
        dtype = _compute_type(x)
        out, mean, rstd = aten.native_layer_norm(x.to(dtype), normalized_shape, _widened(weight, dtype),
                                                 _widened(bias, dtype), eps)
        ctx.normalized_shape = normalized_shape
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        return out.to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        dtype = _compute_type(x)
        grad_x, grad_weight, grad_bias = aten.native_layer_norm_backward(
            grad.to(dtype), x.to(dtype), ctx.normalized_shape, mean, rstd, _widened(weight, dtype),
            _widened(bias, dtype), list(ctx.needs_input_grad[:3]))
        return _like(grad_x, x), _like(grad_weight, weight), _like(grad_bias, bias), None, None


class _GroupNorm(torch.autograd.Function):
    """aten has no derivative of group norm's backward: differentiating it
    again raises."""

    @staticmethod
    def forward(ctx, x, weight, bias, groups, eps):
        dtype, memory_format = _compute_type(x), _memory_format(x)
        ctx.sizes = (x.shape[0], x.shape[1], math.prod(x.shape[2:]), groups)
        ctx.memory_format = memory_format
        out, mean, rstd = aten.native_group_norm(x.to(dtype).contiguous(memory_format=memory_format),
                                                 _widened(weight, dtype), _widened(bias, dtype), *ctx.sizes, eps)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        return out.to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        dtype, memory_format = _compute_type(x), ctx.memory_format
        # Both in the input's memory format: native_group_norm_backward reads them as laid out alike.
        grad_x, grad_weight, grad_bias = aten.native_group_norm_backward(
            grad.to(dtype).contiguous(memory_format=memory_format), x.to(dtype).contiguous(memory_format=memory_format),
            mean, rstd, _widened(weight, dtype), *ctx.sizes, list(ctx.needs_input_grad[:3]))
        return _like(grad_x, x), _like(grad_weight, weight), _like(grad_bias, bias), None, None


class _RMSNorm(torch.autograd.Function):
    """y = x / sqrt(mean(x^2) + eps) * weight over the normalized dimensions,
    written out (torch has no public op that returns the statistics). Its
    backward takes the saved statistic as a constant, so differentiating it
    again raises rather than answer wrong."""

    @staticmethod
    def forward(ctx, x, weight, normalized_shape, eps):
        dims = tuple(range(-len(normalized_shape), 0))
        if tuple(x.shape[x.dim() - len(normalized_shape):]) != tuple(normalized_shape):
            raise RuntimeError(f"RMSNorm: given normalized_shape={list(normalized_shape)}, expected an input of "
                               f"shape [*, {', '.join(map(str, normalized_shape))}], got {list(x.shape)}")
        dtype = _compute_type(x)
        wide = x.to(dtype)
        rstd = torch.rsqrt(wide.square().mean(dims, keepdim=True) + (torch.finfo(dtype).eps if eps is None else eps))
        out = wide * rstd
        if weight is not None:
            out = out * weight.to(dtype)
        ctx.dims = dims
        ctx.save_for_backward(x, weight, rstd)
        return out.to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        x, weight, rstd = ctx.saved_tensors
        dtype = _compute_type(x)
        normalized = x.to(dtype) * rstd
        grad_normalized = grad.to(dtype)
        grad_weight = None
        if weight is not None:
            if ctx.needs_input_grad[1]:
                grad_weight = (grad_normalized * normalized).sum_to_size(weight.shape)
            grad_normalized = grad_normalized * weight.to(dtype)
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = rstd * (grad_normalized - normalized * (grad_normalized * normalized).mean(ctx.dims, keepdim=True))
        return _like(grad_x, x), _like(grad_weight, weight), None, None


class LayerNorm(torch.nn.LayerNorm):
    """``torch.nn.LayerNorm`` computed in fp32 on 16-bit input (module docstring)."""

    def forward(self, input):
        if input.dtype in LOW_PRECISION and layer_norm_kernel():
            return layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)
        return _LayerNorm.apply(input, self.weight, self.bias, tuple(self.normalized_shape), self.eps)


class GroupNorm(torch.nn.GroupNorm):
    """``torch.nn.GroupNorm`` computed in fp32 on 16-bit input (module docstring)."""

    def forward(self, input):
        if input.dim() < 2 or input.shape[1] != self.num_channels:
            raise RuntimeError(f"GroupNorm: expected an input of shape (N, {self.num_channels}, *), "
                               f"got {list(input.shape)}")
        return _GroupNorm.apply(input, self.weight, self.bias, self.num_groups, self.eps)


class RMSNorm(getattr(torch.nn, "RMSNorm", torch.nn.Module)):
    """``torch.nn.RMSNorm`` computed in fp32 on 16-bit input (module docstring)."""

    def forward(self, input):
        return _RMSNorm.apply(input, self.weight, tuple(self.normalized_shape), self.eps)


FP32_FORWARDS = tuple((cls.__bases__[0], cls) for cls in (LayerNorm, GroupNorm, RMSNorm)
                      if cls.__bases__[0] is not torch.nn.Module)


def take_16_bit_input(module):
    """Lets norm layer `module` take 16-bit activations as they come, as the
    module docstring says: batch norms as they are (torch's forward, or one
    BATCH_NORMS_BY_NAME names); torch's LayerNorm, GroupNorm and RMSNorm, and
    their subclasses that keep torch's forward, by a forward that computes in
    fp32 (the module's class changes, as :func:`mpgemm.convert` changes a
    matrix layer's). Returns False for the norm layers that need an fp32 copy
    of their input."""
    cls = type(module)
    # A subclass with its own forward may compute anything: it keeps the fp32 copy.
    if (isinstance(module, BATCH_NORMS) and cls.forward.__module__.startswith("torch.nn.")) or \
            BATCH_NORMS_BY_NAME.search(cls.__name__):
        return True
    for base, forward in FP32_FORWARDS:
        if isinstance(module, forward):
            return True
        if isinstance(module, base) and cls.forward is base.forward:
            module.__class__ = converted_class(cls, forward)
            return True
    return False
