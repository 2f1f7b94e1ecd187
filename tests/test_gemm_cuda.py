"""The WMMA kernels against cuBLAS and float64 (skipped without a GPU).

Outputs are poisoned with NaN before every launch so an unwritten element
cannot pass."""

import random

import pytest
import torch

import mpgemm
from mpgemm.testing import random_operand, reference_gemm, relative_error

pytestmark = pytest.mark.gpu

TOLERANCE = 1e-3


def cublas_gemm(a, b):
    """cuBLAS doing the same computation: fp16 in, fp32 accumulate, fp32 out."""
    if a.dim() == 2 and b.dim() == 2:
        return torch.mm(a, b, out_dtype=torch.float32)
    batch = max(t.shape[0] for t in (a, b) if t.dim() == 3)
    a, b = (t.expand(batch, *t.shape[-2:]) for t in (a, b))
    return torch.bmm(a, b, out_dtype=torch.float32)


def poisoned_gemm(a, b, out_dtype=torch.float32, **kwargs):
    """mpgemm.gemm into an output filled with NaN."""
    shape = (*torch.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1])
    out = torch.full(shape, float("nan"), dtype=out_dtype, device=a.device)
    return mpgemm.gemm(a, b, out_dtype=out_dtype, out=out, **kwargs)


def random_cases(count, rng):
    """Shapes with every size from 1 to 300 in some dimension, then random
    ones; random layouts, batches (one operand may broadcast) and epilogues."""
    layouts = ["row", "col", "strided"]
    cases = []
    for i in range(count):
        m, n, k = (rng.randint(1, 300) for _ in range(3))
        if i < 300:
            m, n, k = [(i + 1, n, k), (m, i + 1, k), (m, n, i + 1)][i % 3]
        batch = rng.choice([None, None, 1, 3])
        batched = rng.choice(["a", "b", "both"]) if batch else ""
        cases.append(dict(
            a_shape=(batch, m, k) if batched in ("a", "both") else (m, k),
            b_shape=(batch, k, n) if batched in ("b", "both") else (k, n),
            a_layout=rng.choice(layouts), b_layout=rng.choice(layouts),
            bias=rng.choice([None, torch.float16, torch.float32]), activation=rng.choice([None, "relu", "gelu"]),
            out_dtype=rng.choice([torch.float32, torch.float16]),
        ))
    return cases


CASES = random_cases(320, random.Random(1234))


@pytest.mark.parametrize("case", CASES, ids=[f"{c['a_shape']}@{c['b_shape']}-{c['a_layout']}-{c['b_layout']}"
                                             for c in CASES])
def test_against_cublas_and_float64(case):
    a = random_operand(case["a_shape"], layout=case["a_layout"], device="cuda")
    b = random_operand(case["b_shape"], layout=case["b_layout"], device="cuda")
    n = case["b_shape"][-1]
    bias = None if case["bias"] is None else torch.randn(n, dtype=case["bias"], device="cuda")
    out = poisoned_gemm(a, b, bias=bias, activation=case["activation"], out_dtype=case["out_dtype"])
    assert not out.isnan().any(), "an output element was not written"
    ref64 = reference_gemm(a, b, bias, case["activation"])
    assert relative_error(out, ref64) < TOLERANCE
    cublas = cublas_gemm(a, b)
    if bias is not None:
        cublas = cublas + bias.float()
    cublas = {None: lambda t: t, "relu": torch.relu, "gelu": torch.nn.functional.gelu}[case["activation"]](cublas)
    assert relative_error(out, cublas.double().cpu()) < TOLERANCE


@pytest.mark.parametrize("m, n, k", [(4096, 4096, 4096), (4095, 4097, 4093), (8, 16384, 1024), (2048, 64, 8192)])
def test_large_shapes(m, n, k):
    a = random_operand((m, k), device="cuda")
    b = random_operand((k, n), layout="col", device="cuda")
    out = poisoned_gemm(a, b)
    assert not out.isnan().any()
    assert relative_error(out, cublas_gemm(a, b).double().cpu()) < TOLERANCE


def test_batch_beyond_the_grid_limit():
    a = random_operand((70000, 3, 8), device="cuda")
    b = random_operand((8, 5), device="cuda")
    out = poisoned_gemm(a, b)
    assert relative_error(out, reference_gemm(a, b)) < TOLERANCE


def test_non_default_stream_is_honoured():
    a = random_operand((512, 512), device="cuda")
    b = random_operand((512, 512), device="cuda")
    new_a = random_operand((512, 512), device="cuda")
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        # The copy waits behind a long sleep on `stream`; a kernel launched on
        # any other stream would read the old `a`.
        torch.cuda._sleep(100_000_000)
        a.copy_(new_a)
        out = mpgemm.gemm(a, b)
    stream.synchronize()
    assert relative_error(out, reference_gemm(new_a, b)) < TOLERANCE


def test_misaligned_views():
    base = random_operand((1, 64 * 40 + 1), device="cuda")
    a = base[0, 1:].view(64, 40)  # 2-byte offset: no 16-byte loads
    b = random_operand((40, 24), device="cuda")
    out = poisoned_gemm(a, b)
    assert relative_error(out, reference_gemm(a, b)) < TOLERANCE
