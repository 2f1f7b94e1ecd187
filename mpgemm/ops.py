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
        return torch.ops.mpgemm.gemm.default(a, b, bias=bias, activation=activation, out_dtype=out_dtype)
    if out.dtype != out_dtype:
        raise ValueError(
            f"mpgemm.gemm: out has dtype {out.dtype} but out_dtype is {out_dtype}; pass out_dtype={out.dtype}"
        )
    torch.ops.mpgemm.gemm.out(a, b, bias=bias, activation=activation, out=out)
    return out
