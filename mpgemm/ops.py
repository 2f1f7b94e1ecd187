"""Python entry points of the mpgemm operators.

In eager mode each public op is called through mpgemm._C's entry of the
same name (csrc/op_entry_py.cpp), which reads its arguments straight into
the op's C++ types and makes the dispatcher call that torch.ops would make,
without torch.ops's boxed parsing (1-3 µs a call; bench/NOTES.md, "The ops'
Python entry"). Where the entry cannot prove the call equal (a tensor
subclass with a __torch_function__ of its own, a torch function mode, an
argument of another Python type) it returns NotImplemented, and the op
takes the torch.ops call, as it always does while torch.compile or
torch.export traces, so that the graph holds the op itself.
"""

import numbers

import torch
from torch.compiler import is_compiling

from . import _C


def gemm(a, b, *, bias=None, activation=None, out_dtype=torch.float32, out=None):
    """Matrix product on Tensor Cores: ``activation(a @ b + bias)``.

    Semantics, identical on the CUDA and CPU backends: a and b are both fp16
    or both bf16 (bf16 Tensor Cores need sm_80 or newer) and products are
    summed in fp32. The bias is added and the activation applied in fp32, then
    the result is rounded once to ``out_dtype``.

    Args:
        a: float16 or bfloat16, (M, K) or (B, M, K).
        b: a's dtype, (K, N) or (B, K, N). A 2-D operand, or a batch of 1,
            broadcasts against the other's batch.
        bias: optional (N,), float16, bfloat16 or float32.
        activation: None, "relu" or "gelu" (the exact erf form, torch's default).
        out_dtype: torch.float32 (default) or the inputs' dtype.
        out: optional contiguous output of the result's shape and ``out_dtype``.

    Returns:
        (M, N), or (B, M, N) if either operand is 3-D.

    Row-major operands and column-major ones (views such as ``w.t()`` or
    ``x.transpose(-1, -2)``) are read in place. Any other strided layout is
    copied once to row-major before the product. Any M, N, K >= 0 works:
    an empty M or N gives an empty result, K = 0 gives bias (or zeros).

    Raises:
        TypeError: a or b not 16-bit, a and b of different dtypes, bias not
            float16, bfloat16 or float32.
        ValueError: wrong rank, mismatched inner dimensions, batch sizes that do
            not broadcast, bias of the wrong shape, tensors on different
            devices, unknown activation, out_dtype neither float32 nor the
            inputs' dtype.
    """
    if out is None:
        if not is_compiling():
            y = _C.gemm(a, b, bias, activation, out_dtype)
            if y is not NotImplemented:
                return y
        return torch.ops.mpgemm.gemm.default(a, b, bias, activation=activation, out_dtype=out_dtype)
    if out.dtype != out_dtype:
        raise ValueError(
            f"mpgemm.gemm: out has dtype {out.dtype} but out_dtype is {out_dtype}; pass out_dtype={out.dtype}"
        )
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (a, b, bias)):
        raise RuntimeError("mpgemm.gemm: out=... does not support autograd, and an input requires grad")
    torch.ops.mpgemm.gemm.out(a, b, bias, activation=activation, out=out)
    return out


def linear(x, weight, bias=None, *, activation=None, out_dtype=None):
    """``torch.nn.functional.linear`` on Tensor Cores, with a fused activation:
    ``activation(x @ weight.T + bias)``.

    Args:
        x: (..., in_features), float16, bfloat16 or float32; any number of
            leading dimensions.
        weight: (out_features, in_features), float16, bfloat16 or float32.
        bias: optional (out_features,), float16, bfloat16 or float32.
        activation: None, "relu" or "gelu" (the exact erf form).
        out_dtype: torch.float32 or the product's input type (below); defaults
            to ``x.dtype``.

    Returns:
        (..., out_features) of ``out_dtype``.

    The Tensor Core product takes bfloat16 if ``x`` or ``weight`` is bfloat16,
    else float16; an fp32 ``x`` or ``weight`` is rounded to that type (a
    temporary copy each call), so an fp32 weight stays its own master copy.
    float16 with bfloat16 is an error. Products are summed in fp32 and the
    epilogue runs in fp32, as in :func:`gemm`. Under ``torch.autocast`` the
    floating-point arguments are cast to autocast's dtype first, as for
    ``torch.nn.functional.linear``. Differentiable: gradients have the dtype of
    their input, and the bias gradient is accumulated in fp32.
    """
    if not is_compiling():
        y = _C.linear(x, weight, bias, activation, out_dtype)
        if y is not NotImplemented:
            return y
    return torch.ops.mpgemm.linear.default(x, weight, bias, activation=activation, out_dtype=out_dtype)


def mlp(x, w1, b1, w2, b2, *, activation="gelu"):
    """A transformer's MLP block on Tensor Cores:
    ``linear(activation(linear(x, w1, b1)), w2, b2)``, as one differentiable op.

    Args:
        x: (..., in_features), float16, bfloat16 or float32.
        w1: (hidden, in_features); b1: optional (hidden,).
        w2: (out_features, hidden); b2: optional (out_features,).
        activation: "gelu" (the exact erf form), "gelu_tanh" (GELU's tanh
            form, GPT-2's: torch's ``approximate="tanh"``) or "relu".

    Returns:
        (..., out_features) of x's dtype.

    Both products take one 16-bit type (bfloat16 if any of x, w1, w2 is,
    else float16; fp32 tensors rounded to it, float16 with bfloat16 an
    error); the hidden activation is stored in that type. Where nothing
    needs the activation's input for backward (no gradient asked of x, w1
    or b1), the forward is :func:`linear` twice, the first with its fused
    activation, and its values are those two calls' bit for bit (the tanh
    form: the first linear, torch's ``gelu`` of its output, the second
    linear). Where backward needs it, GELU's input is kept in that type, as
    torch.amp keeps it: from the first product's epilogue with
    ``MPGEMM_EPILOGUE_PRE_ACTIVATION=1`` set by name (for mlp the switch
    stays opt-in; the tanh form's GELU then comes from that epilogue too,
    rounded once, on sm_90's ping-pong pairs wherever the first product's
    plan is a whole-K Hopper one, from torch's pass over the product on
    other GPU plans, and rounded once on the CPU), else the first linear
    without its activation
    and torch's ``gelu`` of its output
    (GELU rounded twice, as under torch.amp; a pass over memory, cheaper
    than computing it again in backward with a product of its own). What
    one op buys is the backward: with ``MPGEMM_EPILOGUE_ACTIVATION_GRAD=1``
    the gradient of the activation's input comes from the product that
    gives the hidden activation's (``dY @ w2``), multiplied by the
    activation's derivative before it is rounded, so that GELU's (or
    ReLU's) backward is no pass over memory of its own (on sm_90 in the
    Hopper GEMM's epilogue, where its 128x256 tile or its ping-pong pairs
    take the product; elsewhere a pass after it, the bytes of torch's;
    opt-in until those kernels have passed the GPU tests); unset or "0", that product and
    torch's ``gelu_backward`` (``threshold_backward``) run apart.
    :func:`mpgemm.fuse` runs a model's linear -> activation -> linear
    blocks as this op. Under ``torch.autocast`` every floating-point
    argument is cast to autocast's dtype first.
    """
    if not is_compiling():
        y = _C.mlp(x, w1, b1, w2, b2, activation)
        if y is not NotImplemented:
            return y
    return torch.ops.mpgemm.mlp.default(x, w1, b1, w2, b2, activation=activation)


def gated_mlp(x, w_gate, b_gate, w_up, b_up, w_down, b_down, *, activation="silu"):
    """A gated MLP block (Llama's SwiGLU, Gemma's GeGLU) on Tensor Cores:
    ``linear(activation(linear(x, w_gate, b_gate)) * linear(x, w_up, b_up),
    w_down, b_down)``, as one differentiable op.

    Args:
        x: (..., in_features), float16, bfloat16 or float32.
        w_gate, w_up: (hidden, in_features); b_gate, b_up: optional (hidden,).
        w_down: (out_features, hidden); b_down: optional (out_features,).
        activation: "silu" (SwiGLU: Llama, Mistral, Qwen), "gelu" (the exact
            erf form) or "gelu_tanh" (GELU's tanh form: Gemma's).

    Returns:
        (..., out_features) of x's dtype.

    The three products take one 16-bit type (bfloat16 if any of x, w_gate,
    w_up, w_down is, else float16; fp32 tensors rounded to it, float16 with
    bfloat16 an error); the gate g, the up projection u and the product
    ``activation(g) * u`` are stored in that type. By default one pass
    computes ``activation(g) * u`` in fp32, rounded once, and backward's one
    pass gives both gradients and that product again from g and u: the
    block saves x, g and u alone (torch.amp: x, g, activation(g), u and the
    product) and moves 18 bytes an element of the hidden activation through
    memory where torch.amp's passes move 28. With ``MPGEMM_GATED_KERNEL=0``
    the gating runs as torch.amp runs it (torch's activation, then the
    multiply, each rounded; what backward needs saved as torch.amp saves
    it). Either way one op costs the host one call where the block took
    five.
    :func:`mpgemm.fuse` runs a model's gated MLP blocks as this op. Under
    ``torch.autocast`` every floating-point argument is cast to autocast's
    dtype first.
    """
    if not is_compiling():
        y = _C.gated_mlp(x, w_gate, b_gate, w_up, b_up, w_down, b_down, activation)
        if y is not NotImplemented:
            return y
    return torch.ops.mpgemm.gated_mlp.default(x, w_gate, b_gate, w_up, b_up, w_down, b_down, activation=activation)


def layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Layer norm over x's last dimensions, as ``F.layer_norm``, for 16-bit
    activations with fp32 (a prepared model's), fp16 or bf16 weights, as one
    differentiable op.

    Args:
        x: (..., *normalized_shape), float16 or bfloat16.
        normalized_shape: an int or the sizes of x's last dimensions.
        weight, bias: optional, of normalized_shape; float32, float16 or
            bfloat16. Their gradients have their dtype.
        eps: added to the variance.

    Returns:
        x's shape and dtype.

    Computed in fp32 from x as it is and rounded once: each row's mean and
    variance, every sum in one fixed order, set by the shape and the
    tensors' alignment (the same bits on every run, and on the CPU and a GPU
    alike for tensors alike aligned). torch.amp computes the layer in fp32
    on a widened copy of x (autocast's layer_norm), three passes forward and
    five backward; on a GPU this is one pass forward and two backward over
    the 16-bit tensors, and saves x (16-bit), the weight and two floats a
    row.
    Backward is not differentiable again. :class:`mpgemm.amp`'s prepared
    models run their ``torch.nn.LayerNorm`` layers on it where
    ``MPGEMM_LAYER_NORM_KERNEL=1``.
    """
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else normalized_shape
    if not is_compiling():
        y = _C.layer_norm(x, shape, weight, bias, eps)
        if y is not NotImplemented:
            return y
    return torch.ops.mpgemm.layer_norm.default(x, list(shape), weight, bias, eps)


def _pair(value, name):
    # What nn.Conv2d holds (a pair of ints) and a plain int first: the
    # abstract-class checks below cost microseconds a call.
    if type(value) is tuple and len(value) == 2 and type(value[0]) is int and type(value[1]) is int:
        return value
    if type(value) is int:
        return (value, value)
    if isinstance(value, numbers.Integral):
        return (int(value), int(value))
    pair = tuple(value) if isinstance(value, (tuple, list)) else ()
    if len(pair) != 2 or not all(isinstance(v, numbers.Integral) for v in pair):
        raise ValueError(f"mpgemm.conv2d: {name} must be an int or a pair of ints, got {value!r}")
    return tuple(int(v) for v in pair)


def _conv_padding(padding, weight, stride, dilation):
    """(top, bottom, left, right) for an int, a pair, "valid" or "same"."""
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0, 0, 0)
        if padding != "same":
            raise ValueError(f"mpgemm.conv2d: padding must be an int, a pair, 'valid' or 'same', got {padding!r}")
        if stride != (1, 1):
            raise ValueError("mpgemm.conv2d: padding='same' is not supported for strided convolutions")
        # An even dilated kernel pads one more at the bottom and right, as torch does.
        total = [d * (k - 1) for d, k in zip(dilation, weight.shape[-2:])]
        return (total[0] // 2, total[0] - total[0] // 2, total[1] // 2, total[1] - total[1] // 2)
    ph, pw = _pair(padding, "padding")
    return (ph, ph, pw, pw)


def conv2d(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1, *, out_dtype=None):
    """``torch.nn.functional.conv2d`` on Tensor Cores, as implicit GEMMs.

    Args:
        x: (N, C, H, W) or unbatched (C, H, W), float16, bfloat16 or float32,
            contiguous (NCHW) or channels_last.
        weight: (out_channels, C / groups, kH, kW), float16, bfloat16 or float32.
        bias: optional (out_channels,), float16, bfloat16 or float32, added in fp32.
        stride, dilation: an int or a pair. padding: an int, a pair, "valid"
            or "same" (stride 1; an even kernel pads one more at the bottom and
            right, as torch does). groups: divides C and out_channels.
        out_dtype: torch.float32 or the product's input type; defaults to
            ``x.dtype``.

    The dtype rule of :func:`linear`: every input is rounded to bfloat16 if x
    or weight is bfloat16, else to float16, and products are summed in fp32,
    on both backends; autocast casts the arguments first, as for
    ``torch.nn.functional.conv2d``. The output follows x's memory format. The
    kernels read NHWC: channels_last 16-bit tensors are used in place; a
    contiguous (NCHW) or fp32 x is converted once on the way in, and an NCHW
    output once on the way out.
    Depthwise convolutions (one channel per group, up to 15 filters each)
    run on direct CUDA-core kernels; other channel counts per group that are
    not multiples of 8 load 8-byte chunks (multiples of 4) or run on copies
    padded with zeros (C = 3). Differentiable, like :func:`linear`.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"mpgemm.conv2d: expected x to be a tensor, got {type(x).__name__}")
    if x.dim() == 3:
        return conv2d(x.unsqueeze(0), weight, bias, stride, padding, dilation, groups, out_dtype=out_dtype)[0]
    stride, dilation = _pair(stride, "stride"), _pair(dilation, "dilation")
    padding = _conv_padding(padding, weight, stride, dilation)
    if not is_compiling():
        y = _C.conv2d(x, weight, bias, stride, padding, dilation, groups, out_dtype)
        if y is not NotImplemented:
            return y
    return torch.ops.mpgemm.conv2d.default(x, weight, bias, stride, padding, dilation, groups, out_dtype=out_dtype)


def conv2d_batch_stats(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """:func:`conv2d`'s output y, in x's dtype, and its batch statistics for a
    training batch norm after it: a (2, out_channels) float32 tensor of each
    channel's mean and biased variance over (N, H, W) of y as stored (not
    differentiable: batch norm's backward differentiates them through y).
    x is 4-D. On CUDA the convolution's epilogue gathers them where its
    kernels can (the WMMA implicit GEMM on channels that are multiples of 8,
    the Hopper convolution's forward), so that no pass over y is needed;
    elsewhere they come from y.
    :func:`mpgemm.fuse`'s chains use it where MPGEMM_EPILOGUE_STATS=1."""
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise ValueError(f"mpgemm.conv2d_batch_stats: expected x to be a 4-D tensor, got "
                         f"{x.dim() if isinstance(x, torch.Tensor) else type(x).__name__}"
                         f"{'-D' if isinstance(x, torch.Tensor) else ''}")
    stride, dilation = _pair(stride, "stride"), _pair(dilation, "dilation")
    padding = _conv_padding(padding, weight, stride, dilation)
    return torch.ops.mpgemm.conv2d_batch_stats.default(x, weight, bias, stride, padding, dilation, groups)
