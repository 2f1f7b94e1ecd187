"""Python entry points of the mpgemm operators."""

import torch


def gemm(a, b, *, bias=None, activation=None, out_dtype=torch.float32, out=None):
    """Matrix product on Tensor Cores: ``activation(a @ b + bias)``.

    Semantics, identical on the CUDA and CPU backends: every input element is an
    fp16 value and products are summed in fp32. The bias is added and the
    activation applied in fp32, then the result is rounded once to ``out_dtype``.

    Args:
        a: float16, (M, K) or (B, M, K).
        b: float16, (K, N) or (B, K, N). A 2-D operand, or a batch of 1,
            broadcasts against the other's batch.
        bias: optional (N,), float16 or float32.
        activation: None, "relu" or "gelu" (the exact erf form, torch's default).
        out_dtype: torch.float32 (default) or torch.float16.
        out: optional contiguous output of the result's shape and ``out_dtype``.

    Returns:
        (M, N), or (B, M, N) if either operand is 3-D.

    Row-major operands and column-major ones (views such as ``w.t()`` or
    ``x.transpose(-1, -2)``) are read in place. Any other strided layout is
    copied once to row-major before the product. Any M, N, K >= 0 works:
    an empty M or N gives an empty result, K = 0 gives bias (or zeros).

    Raises:
        TypeError: a or b not float16, bias neither float16 nor float32.
        ValueError: wrong rank, mismatched inner dimensions, batch sizes that do
            not broadcast, bias of the wrong shape, tensors on different
            devices, unknown activation, out_dtype other than float16/float32.
    """
    if out is None:
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
        x: (..., in_features), float16 or float32; any number of leading dimensions.
        weight: (out_features, in_features), float16 or float32.
        bias: optional (out_features,), float16 or float32.
        activation: None, "relu" or "gelu" (the exact erf form).
        out_dtype: torch.float16 or torch.float32; defaults to ``x.dtype``.

    Returns:
        (..., out_features) of ``out_dtype``.

    An fp32 ``x`` or ``weight`` is rounded to fp16 for the Tensor Core product
    (a temporary copy each call), so an fp32 weight stays its own master copy.
    Products are summed in fp32 and the epilogue runs in fp32, as in
    :func:`gemm`. Differentiable: gradients have the dtype of their input, and
    the bias gradient is accumulated in fp32.
    """
    return torch.ops.mpgemm.linear.default(x, weight, bias, activation=activation, out_dtype=out_dtype)
