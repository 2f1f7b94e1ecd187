"""The GEMM kernels against cuBLAS and float64, in fp16 and in bf16 (skipped
without a GPU; bf16 needs sm_80). On an sm_90 GPU with a build holding sm_90a
code, random cases and the large shapes also run with each path forced
(MPGEMM_GEMM_PATH=wgmma: the Hopper kernel wherever it can run; wgmma_2x1: the
same on pairs of blocks that multicast B; wgmma_pingpong: on pairs whose
consumers take tiles in turn; wgmma_n128 and wgmma_n64: on blocks alone over
the narrow tiles, 128 x 128 and 128 x 64; wmma: never), outputs of at
most 128 columns on the narrow tiles the heuristic picks by default, and
without them (MPGEMM_NARROW_TILES=0), and few tiles with long K split on
the Hopper block (where it pays, by default; MPGEMM_WGMMA_SPLIT_K=1
wherever its cost model splits) or run as stream-K
(MPGEMM_STREAM_K=1), and operands of odd pitches on the Hopper kernels
through aligned copies (MPGEMM_PADDED_OPERANDS=1).

Outputs are poisoned with NaN before every launch so an unwritten element
cannot pass."""

import math
import random
import re

import pytest
import torch

import mpgemm
from mpgemm.testing import (TORCH_ACTIVATIONS, activation_grad_reference, random_operand, reference_gemm,
                            relative_error, torch_activation_backward)

from support import launches, nan_filled_outputs, set_environment

pytestmark = pytest.mark.gpu

HAS_BF16 = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 0)
needs_bf16 = pytest.mark.skipif(not HAS_BF16, reason="bf16 Tensor Cores need sm_80")
DTYPES = [torch.float16, pytest.param(torch.bfloat16, marks=needs_bf16)]
HAS_HOPPER_PATH = (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
                   and "sm_90a" in mpgemm.build_info()["cuda_archs"])
needs_hopper_path = pytest.mark.skipif(not HAS_HOPPER_PATH, reason="the Hopper path needs sm_90 and sm_90a code")
# MPGEMM_GEMM_PATH values: the default everywhere, each path forced on Hopper.
HOPPER_PATHS = ("wgmma", "wgmma_2x1", "wgmma_pingpong", "wgmma_n128", "wgmma_n64", "wmma")
PATHS = ["auto"] + [pytest.param(path, marks=needs_hopper_path) for path in HOPPER_PATHS]

# Bounds on ||out - ref|| / ||ref|| against float64 and against cuBLAS (fp32
# out) on the same inputs. fp32 outputs differ only in fp32 accumulation, fp16
# ones add one rounding to 11 significant bits. bf16 keeps 8: rounding to it
# errs by up to 2**-8 = 3.9e-3 of each element (about 2**-9 on average), so the
# norm-wise error of a bf16 output stays below that plus the fp32 sums' error.
TOLERANCE = 1e-3
BF16_OUT_TOLERANCE = 5e-3


def tolerance(out_dtype):
    return BF16_OUT_TOLERANCE if out_dtype == torch.bfloat16 else TOLERANCE


def operand(shape, layout="row", dtype=torch.float16):
    return random_operand(shape, layout=layout, device="cuda", dtype=dtype)


def cublas_gemm(a, b):
    """cuBLAS doing the same computation: fp16 or bf16 in, fp32 accumulate, fp32 out."""
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


def random_cases(count, rng, dtype=torch.float16):
    """Shapes with every size from 1 to `count` (at most 300) in some
    dimension, then random ones; random layouts, batches (one operand may
    broadcast) and epilogues, for inputs of `dtype`."""
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
            bias=rng.choice([None, torch.float16, torch.bfloat16, torch.float32]),
            activation=rng.choice([None, "relu", "gelu"]), out_dtype=rng.choice([torch.float32, dtype]), dtype=dtype,
        ))
    return cases


def case_params(cases):
    return dict(argvalues=[pytest.param(c, marks=needs_bf16) if c["dtype"] == torch.bfloat16 else c for c in cases],
                ids=[f"{c['a_shape']}@{c['b_shape']}-{c['a_layout']}-{c['b_layout']}-{str(c['dtype'])[6:]}"
                     for c in cases])


CASES = random_cases(320, random.Random(1234)) + random_cases(160, random.Random(4321), torch.bfloat16)
HOPPER_CASES = random_cases(40, random.Random(90)) + random_cases(20, random.Random(91), torch.bfloat16)


@pytest.mark.parametrize("case", **case_params(CASES))
def test_against_cublas_and_float64(case):
    check_case(case)


@needs_hopper_path
@pytest.mark.parametrize("path", HOPPER_PATHS)
@pytest.mark.parametrize("case", **case_params(HOPPER_CASES))
def test_each_path_on_hopper_against_cublas_and_float64(case, path, monkeypatch):
    monkeypatch.setenv("MPGEMM_GEMM_PATH", path)
    check_case(case)


def check_case(case):
    a = operand(case["a_shape"], case["a_layout"], case["dtype"])
    b = operand(case["b_shape"], case["b_layout"], case["dtype"])
    n = case["b_shape"][-1]
    bias = None if case["bias"] is None else torch.randn(n, dtype=case["bias"], device="cuda")
    out = poisoned_gemm(a, b, bias=bias, activation=case["activation"], out_dtype=case["out_dtype"])
    assert not out.isnan().any(), "an output element was not written"
    ref64 = reference_gemm(a, b, bias, case["activation"])
    assert relative_error(out, ref64) < tolerance(case["out_dtype"])
    cublas = cublas_gemm(a, b)
    if bias is not None:
        cublas = cublas + bias.float()
    cublas = {None: lambda t: t, "relu": torch.relu, "gelu": torch.nn.functional.gelu}[case["activation"]](cublas)
    assert relative_error(out, cublas.double().cpu()) < tolerance(case["out_dtype"])


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, n, k", [(4096, 4096, 4096), (4095, 4097, 4093), (8, 16384, 1024), (2048, 64, 8192)])
def test_large_shapes(m, n, k, dtype, path, monkeypatch):
    monkeypatch.setenv("MPGEMM_GEMM_PATH", path)
    a = operand((m, k), dtype=dtype)
    b = operand((k, n), "col", dtype)
    for out_dtype in (torch.float32, dtype):
        out = poisoned_gemm(a, b, out_dtype=out_dtype)
        assert not out.isnan().any()
        assert relative_error(out, cublas_gemm(a, b).double().cpu()) < tolerance(out_dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_batch_beyond_the_grid_limit(dtype):
    a = operand((70000, 3, 8), dtype=dtype)
    b = operand((8, 5), dtype=dtype)
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


@pytest.mark.parametrize("dtype", DTYPES)
def test_misaligned_views(dtype):
    base = operand((1, 64 * 40 + 1), dtype=dtype)
    a = base[0, 1:].view(64, 40)  # 2-byte offset: no 16-byte loads
    b = operand((40, 24), dtype=dtype)
    out = poisoned_gemm(a, b)
    assert relative_error(out, reference_gemm(a, b)) < TOLERANCE


def narrow_operand(shape, layout, dtype, align):
    """A (rows, cols) operand whose rows (layout "row") or columns ("col") lie a
    multiple of `align` elements apart, but not of 8, from a base `align`
    elements past a 16-byte boundary: the launcher's loads then take chunks of
    exactly `align` elements (4 bytes for 2, 8 for 4) where the contiguous
    extent is a multiple of `align`."""
    rows, cols = shape
    inner, outer = (cols, rows) if layout == "row" else (rows, cols)
    ld = -(-inner // align) * align
    ld += align if ld % 8 == 0 else 0
    flat = operand((align + outer * ld,), dtype=dtype)
    stored = flat[align:].view(outer, ld)[:, :inner]
    return stored if layout == "row" else stored.t()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, n, k, a_layout, b_layout, align", [
    (4095, 4097, 4094, "row", "col", 2),   # K contiguous in both, M and N odd
    (4095, 4097, 4092, "row", "col", 4),
    (1024, 1026, 1027, "col", "row", 2),   # M and N contiguous, K odd: its remainder in slice 0
    (1020, 1028, 1027, "col", "row", 4),
    (1023, 1026, 1028, "row", "row", 2),
    (1028, 1025, 1020, "col", "col", 4),
    (4095, 4097, 4093, "row", "col", 2),   # odd K: one-element loads, padded rows
])
def test_odd_shapes_on_narrow_loads(m, n, k, a_layout, b_layout, align, dtype):
    a = narrow_operand((m, k), a_layout, dtype, align)
    b = narrow_operand((k, n), b_layout, dtype, align)
    for out_dtype in (torch.float32, dtype):
        out = poisoned_gemm(a, b, out_dtype=out_dtype)
        assert not out.isnan().any()
        assert relative_error(out, cublas_gemm(a, b).double().cpu()) < tolerance(out_dtype)


@needs_bf16
def test_bf16_linear_rounds_fp32_operands_to_bf16():
    x, weight = torch.randn(33, 40, device="cuda"), torch.randn(24, 40, device="cuda").bfloat16()
    out = mpgemm.linear(x, weight, out_dtype=torch.float32)
    assert relative_error(out, reference_gemm(x.bfloat16(), weight.t())) < TOLERANCE


@pytest.mark.skipif(not torch.cuda.is_available() or HAS_BF16, reason="checks a GPU older than sm_80")
def test_bf16_before_sm80_is_refused_with_a_clear_error():
    a = torch.randn(16, 16, device="cuda", dtype=torch.bfloat16)
    major, minor = torch.cuda.get_device_capability()
    device = f"{a.device} ({torch.cuda.get_device_name()}) is {major}.{minor}"
    for op, call in [
        ("mpgemm.gemm", lambda: mpgemm.gemm(a, a)),
        ("mpgemm.gemm", lambda: mpgemm.gemm(a, a, out=torch.empty(16, 16, device="cuda"))),
        ("mpgemm.linear", lambda: mpgemm.linear(a.float(), a)),
    ]:
        message = (f"{op}: torch.bfloat16 inputs need bf16 Tensor Cores (compute capability 8.0 or newer); "
                   f"{device}")
        with pytest.raises(RuntimeError, match=re.escape(message)):
            call()


# Split-K (small outputs, long K: the heuristic splits them on any GPU with
# more than a few multiprocessors), and grouped tile orders over shapes that
# are not multiples of the tiles, so the last group of tile rows is partial.
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, n, k", [(64, 64, 16384), (128, 256, 8192), (16, 4096, 4096), (61, 67, 10007),
                                     (1, 8, 65536)])
def test_split_k_shapes(m, n, k, dtype):
    a = operand((m, k), dtype=dtype)
    b = operand((k, n), "col", dtype)
    bias = torch.randn(n, device="cuda")
    plan = mpgemm.gemm_plan(m, n, k, load_width=math.gcd(k, 8))  # both operands' contiguous extent is k
    if (m, n) in [(64, 64), (128, 256)] and mpgemm.plan.device_limits()["multiprocessors"] >= 16:
        assert plan.split_k > 1, plan
    for out_dtype in (torch.float32, dtype):
        mpgemm.reset_workspace_stats()
        out = poisoned_gemm(a, b, bias=bias, activation="gelu", out_dtype=out_dtype)
        # The partial sums, counted: one workspace of the plan's size, or none.
        assert mpgemm.workspace_stats() == ({"calls": 1, "bytes": plan.workspace_bytes,
                                             "largest_bytes": plan.workspace_bytes}
                                            if plan.split_k > 1 else {"calls": 0, "bytes": 0, "largest_bytes": 0})
        assert not out.isnan().any()
        cublas = torch.nn.functional.gelu(cublas_gemm(a, b) + bias)
        assert relative_error(out, cublas.double().cpu()) < tolerance(out_dtype)
        # Deterministic: the splits are summed in a fixed order.
        assert torch.equal(out, poisoned_gemm(a, b, bias=bias, activation="gelu", out_dtype=out_dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, n, k", [(2000, 3000, 256), (4095, 4097, 512), (1100, 9000, 128), (9000, 1100, 128)])
def test_grouped_tile_order_covers_partial_groups(m, n, k, dtype):
    a = operand((m, k), dtype=dtype)
    b = operand((k, n), "col", dtype)
    out = poisoned_gemm(a, b)
    assert not out.isnan().any()
    assert relative_error(out, cublas_gemm(a, b).double().cpu()) < TOLERANCE


def test_every_candidate_plan_matches_cublas():
    """Each configuration the device holds, with each split count, through the tuned table."""
    m, n, k = 200, 300, 2048
    a, b = operand((m, k)), operand((k, n), "col")
    want = cublas_gemm(a, b).double().cpu()
    try:
        for plan in mpgemm.plan.candidate_plans(m, n, k):
            mpgemm._C.set_tuned_gemm_plan(1, m, n, k, plan.config, plan.split_k)
            assert mpgemm.gemm_plan(m, n, k).tuned
            out = poisoned_gemm(a, b)
            assert not out.isnan().any(), plan
            assert relative_error(out, want) < TOLERANCE, plan
    finally:
        mpgemm._C.clear_tuned_gemm_plans()


# The type each Hopper tile's kernels are named by (kernels::WgmmaTile, ...).
TILE_TYPES = {"wgmma": "WgmmaTile", "wgmma_n128": "WgmmaN128Tile", "wgmma_n64": "WgmmaN64Tile"}
# The Hopper block's two ways of sharing a tile's K between blocks: the
# switch and its value (None: unset, the default), the kernel that runs,
# and whether a reduction kernel follows.
K_SHARED = {"split-K": ("MPGEMM_WGMMA_SPLIT_K", "1", "wgmma_splitk_gemm_kernel", True),
            "split-K by default": ("MPGEMM_WGMMA_SPLIT_K", None, "wgmma_splitk_gemm_kernel", True),
            "stream-K": ("MPGEMM_STREAM_K", "1", "wgmma_stream_k_gemm_kernel", False)}


@needs_hopper_path
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("way, m, n, k, a_layout, b_layout", [
    ("split-K", 128, 4096, 4096, "row", "col"), ("split-K", 1024, 1024, 16384, "col", "row"),
    ("split-K", 1000, 264, 8200, "row", "row"), ("split-K", 304, 600, 3000, "col", "col"),
    ("split-K by default", 768, 768, 16384, "col", "row"), ("split-K by default", 768, 768, 8192, "col", "row"),
    ("split-K by default", 3072, 768, 16384, "col", "row"), ("split-K by default", 128, 4096, 4096, "row", "col"),
    ("stream-K", 768, 768, 16384, "col", "row"), ("stream-K", 2048, 2304, 768, "row", "col"),
    ("stream-K", 2048, 768, 3072, "row", "row"), ("stream-K", 1000, 600, 5000, "col", "col"),
    ("stream-K", 4096, 128, 4096, "row", "col"), ("stream-K", 4096, 64, 4096, "col", "row"),
    ("stream-K", 1000, 104, 5000, "row", "row"), ("stream-K", 2000, 40, 3000, "col", "col")])
def test_k_shared_between_blocks_on_the_hopper_block(way, m, n, k, a_layout, b_layout, dtype, monkeypatch):
    """Outputs of few tiles: MPGEMM_WGMMA_SPLIT_K=1 splits K on the Hopper
    block's 128 x 256 tile wherever its cost model splits, the splits' fp32
    sums reduced in split order by a kernel of their own, and the default
    where the split pays (GPT-2 small's attention wgrad at 16k and 8k
    tokens, its MLP wgrad at 16k; 128 x 4096 x 4096); MPGEMM_STREAM_K=1
    (opt-in; GPT-2 small's
    attention wgrad at 16k tokens, its qkv forward and MLP dgrad at 2k, a
    ragged one; and on the narrow tiles, 4096 x 128 x 4096 and 4096 x 64 x
    4096 and two ragged ones) gives each block an equal run of the tiles' K
    slices, a tile split between runs summed by the block that ends it, no
    reduction kernel. Either way: its kernel runs, on the tile the plan
    names, its partial sums take the plan's workspace, the result matches
    cuBLAS (bias and GELU applied once, after the sum) and is bitwise the
    same on a second run."""
    switch, value, kernel, reduced = K_SHARED[way]
    for name in ("MPGEMM_GEMM_PATH", "MPGEMM_NARROW_TILES", "MPGEMM_PADDED_OPERANDS"):
        monkeypatch.delenv(name, raising=False)
    for name in ("MPGEMM_WGMMA_SPLIT_K", "MPGEMM_STREAM_K"):
        set_environment(monkeypatch, name, value if name == switch else "0")
    a = operand((m, k), a_layout, dtype)
    b = operand((k, n), b_layout, dtype)
    bias = torch.randn(n, device="cuda")
    plan = mpgemm.gemm_plan(m, n, k)
    tile = "wgmma" if n > 128 else "wgmma_n128" if n > 64 else "wgmma_n64"
    assert plan.config == tile and (plan.split_k > 1 if reduced else plan.stream_k_blocks > 0), plan
    for out_dtype in (torch.float32, dtype):
        mpgemm.reset_workspace_stats()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            out = poisoned_gemm(a, b, bias=bias, activation="gelu", out_dtype=out_dtype)
            torch.cuda.synchronize()
        names = [event.name for event in prof.events()]
        assert any(kernel in name and f"::{TILE_TYPES[tile]}," in name for name in names), names
        assert any("splitk_reduce" in name for name in names) == reduced, names
        assert mpgemm.workspace_stats()["largest_bytes"] == plan.workspace_bytes
        assert not out.isnan().any()
        cublas = torch.nn.functional.gelu(cublas_gemm(a, b) + bias)
        assert relative_error(out, cublas.double().cpu()) < tolerance(out_dtype)
        assert torch.equal(out, poisoned_gemm(a, b, bias=bias, activation="gelu", out_dtype=out_dtype))


@needs_hopper_path
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, n, k, a_layout, b_layout, path, split", [
    (4095, 4097, 4093, "row", "col", "auto", False), (2047, 2049, 2045, "col", "row", "auto", False),
    (300, 257, 129, "row", "row", "wgmma", False), (33, 9, 17, "col", "col", "wgmma", False),
    (128, 4097, 4093, "row", "col", "wgmma", True)])
def test_padded_operands_on_the_hopper_block(m, n, k, a_layout, b_layout, path, split, dtype, monkeypatch):
    """MPGEMM_PADDED_OPERANDS=1 (opt-in): operands the copy engine cannot
    describe (odd leading dimensions; A's base 2 bytes off as well) run the
    Hopper kernel on copies at aligned pitches, where the copies pay or a
    Hopper kernel is forced, and with MPGEMM_WGMMA_SPLIT_K=1 split K too
    (the copies and the partial sums in one workspace): no WMMA GEMM kernel
    runs, the operands are left as they were, and the result matches
    cuBLAS."""
    monkeypatch.setenv("MPGEMM_GEMM_PATH", path)
    monkeypatch.setenv("MPGEMM_PADDED_OPERANDS", "1")
    monkeypatch.setenv("MPGEMM_WGMMA_SPLIT_K", "1" if split else "0")
    a = operand((m, k + 1), a_layout, dtype)[:, 1:]
    b = operand((k, n), b_layout, dtype)
    a_before, b_before = a.clone(), b.clone()
    bias = torch.randn(n, device="cuda")
    plan = mpgemm.gemm_plan(m, n, k, load_width=1)
    assert plan.config.startswith("wgmma") and plan.padded_operands and (plan.split_k > 1) == split, plan
    for out_dtype in (torch.float32, dtype):
        mpgemm.reset_workspace_stats()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            out = poisoned_gemm(a, b, bias=bias, activation="relu", out_dtype=out_dtype)
            torch.cuda.synchronize()
        kernels = [event.name for event in prof.events() if "kernel" in event.name]
        hopper_kernel = "wgmma_splitk_gemm_kernel" if split else "wgmma_gemm_kernel"
        assert any(hopper_kernel in name for name in kernels), kernels
        assert not any("wmma_gemm_kernel" in name for name in kernels), kernels
        # At most the plan's bytes: the plan counts both operands copied, the launcher copies what it must.
        assert 0 < mpgemm.workspace_stats()["largest_bytes"] <= plan.workspace_bytes
        assert not out.isnan().any()
        assert torch.equal(a, a_before) and torch.equal(b, b_before)
        cublas = torch.relu(cublas_gemm(a, b) + bias)
        assert relative_error(out, cublas.double().cpu()) < tolerance(out_dtype)


def kernels_of(call):
    """The names of the kernels that call() ran (not its copies or memsets)."""
    return [name for name in launches(call) if not name.startswith(("Memcpy", "Memset"))]


def poisoned_pre_activation(x, weight, bias, out_dtype, activation="gelu"):
    """torch.ops.mpgemm._linear_pre_activation into outputs that start as NaN."""
    with nan_filled_outputs():
        return torch.ops.mpgemm._linear_pre_activation(x, weight, bias, activation=activation, out_dtype=out_dtype)


def pre_activation_runs(m, n, k, dtype, activation, monkeypatch):
    """For each output dtype (the inputs', fp32): (x, weight, bias, out_dtype,
    y, z, the GEMM kernels that ran) of poisoned_pre_activation on fresh
    (m, k) and (n, k) operands, with the heuristic's plan."""
    for name in ("MPGEMM_GEMM_PATH", "MPGEMM_WGMMA_SPLIT_K", "MPGEMM_PADDED_OPERANDS"):
        monkeypatch.delenv(name, raising=False)
    x = operand((m, k), dtype=dtype)
    weight = operand((n, k), dtype=dtype)
    bias = torch.randn(n, device="cuda")
    for out_dtype in (None, torch.float32):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            y, z = poisoned_pre_activation(x, weight, bias, out_dtype, activation)
            torch.cuda.synchronize()
        yield x, weight, bias, out_dtype, y, z, [event.name for event in prof.events() if "gemm_kernel" in event.name]


@needs_hopper_path
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, n, k, kernels", [(2048, 1536, 512, 1), (4096, 3072, 768, 1), (1100, 2055, 264, 1),
                                              (256, 512, 136, 2)])
def test_pre_activation_from_the_hopper_epilogue(m, n, k, kernels, dtype, monkeypatch):
    """GELU's input saved by the forward (the default; "0" recomputes it in
    backward): where the wide tile takes the problem, one kernel stores y and
    the pre-activation (through the copy engine, or from registers where
    an odd N leaves the outputs' rows unaligned); elsewhere (ping-pong on a
    few tiles) the product runs again. Either way y is bitwise the plain
    op's and the pre-activation bitwise the product with no activation, and
    both match cuBLAS."""
    for x, weight, bias, out_dtype, y, z, ran in pre_activation_runs(m, n, k, dtype, "gelu", monkeypatch):
        assert len(ran) == kernels and (kernels == 2) != any("wgmma_pre_activation_gemm_kernel" in n for n in ran), ran
        assert not y.isnan().any() and not z.isnan().any()
        assert torch.equal(y, mpgemm.linear(x, weight, bias, activation="gelu", out_dtype=out_dtype))
        assert torch.equal(z, mpgemm.linear(x, weight, bias, out_dtype=out_dtype))
        cublas = cublas_gemm(x, weight.t()) + bias
        assert relative_error(z, cublas.double().cpu()) < tolerance(z.dtype)
        assert relative_error(y, torch.nn.functional.gelu(cublas).double().cpu()) < tolerance(y.dtype)


@needs_hopper_path
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, n, k, from_epilogue", [(2048, 1536, 512, True), (1100, 2055, 264, True),
                                                    (256, 512, 136, True), (4096, 96, 256, False)])
def test_gelu_tanh_pre_activation_from_the_hopper_epilogue(m, n, k, from_epilogue, dtype, monkeypatch):
    """GELU's tanh form (mpgemm.mlp's with MPGEMM_EPILOGUE_PRE_ACTIVATION=1,
    opt-in until this passes on a GPU): where the heuristic's plan is a
    whole-K Hopper one (the 128 x 256 tile, or ping-pong pairs on a few
    tiles), its own kernel on ping-pong pairs
    (wgmma_pre_activation_gelu_tanh_gemm_kernel) stores y = gelu_tanh(z),
    rounded once, and z (from registers where an odd N leaves the rows
    unaligned); elsewhere (the 128 x 64 tile of a 96-column output) the
    product alone into z, then torch's gelu of it. z is bitwise the product
    with no activation, y within rounding of torch's tanh GELU of cuBLAS's
    product, and bitwise torch's of z where its pass ran."""
    for x, weight, bias, out_dtype, y, z, ran in pre_activation_runs(m, n, k, dtype, "gelu_tanh", monkeypatch):
        assert len(ran) == 1 and ("wgmma_pre_activation_gelu_tanh_gemm_kernel" in ran[0]) == from_epilogue, ran
        assert not y.isnan().any() and not z.isnan().any()
        assert torch.equal(z, mpgemm.linear(x, weight, bias, out_dtype=out_dtype))
        if not from_epilogue:
            assert torch.equal(y, torch.nn.functional.gelu(z, approximate="tanh"))
        cublas = cublas_gemm(x, weight.t()) + bias
        assert relative_error(z, cublas.double().cpu()) < tolerance(z.dtype)
        want = torch.nn.functional.gelu(cublas, approximate="tanh")
        assert relative_error(y, want.double().cpu()) < tolerance(y.dtype)


@needs_hopper_path
@pytest.mark.parametrize("dtype", DTYPES)
def test_gpt2_mlp_with_gelu_tanh_from_the_epilogue(dtype, monkeypatch):
    """mpgemm.mlp with GELU's tanh form and MPGEMM_EPILOGUE_PRE_ACTIVATION=1
    (GPT-2's MLP, 2048 tokens of 256 features into 1024): its first product
    on the tanh form's kernel, y and every gradient within rounding of
    float64 autograd's and of the default's (torch's gelu pass over the
    first linear's product)."""
    for name in ("MPGEMM_GEMM_PATH", "MPGEMM_WGMMA_SPLIT_K", "MPGEMM_EPILOGUE_ACTIVATION_GRAD"):
        monkeypatch.delenv(name, raising=False)
    x = operand((2048, 256), dtype=dtype).requires_grad_()
    w1, w2 = operand((1024, 256), dtype=dtype) / 16, operand((256, 1024), dtype=dtype) / 32
    w1, w2 = w1.requires_grad_(), w2.requires_grad_()
    b1, b2 = torch.randn(1024, device="cuda", requires_grad=True), torch.randn(256, device="cuda", requires_grad=True)
    grad_y = operand((2048, 256), dtype=dtype)
    results = {}
    for saved in ("0", "1"):
        monkeypatch.setenv("MPGEMM_EPILOGUE_PRE_ACTIVATION", saved)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            y = mpgemm.mlp(x, w1, b1, w2, b2, activation="gelu_tanh")
            torch.cuda.synchronize()
        ran = [event.name for event in prof.events() if "wgmma_pre_activation_gelu_tanh_gemm_kernel" in event.name]
        assert len(ran) == (saved == "1"), ran
        results[saved] = (y, *torch.autograd.grad(y, (x, w1, b1, w2, b2), grad_y))
    inputs64 = [t.detach().double().requires_grad_() for t in (x, w1, b1, w2, b2)]
    x64, w164, b164, w264, b264 = inputs64
    y64 = torch.nn.functional.linear(
        torch.nn.functional.gelu(torch.nn.functional.linear(x64, w164, b164), approximate="tanh"), w264, b264)
    want = (y64, *torch.autograd.grad(y64, inputs64, grad_y.double()))
    # tests/ops/test_mlp.py's: dL/dz is rounded to the product's type, and 16-bit gradients once more on output.
    bound = 5e-3 if dtype == torch.float16 else 2e-2
    for got, default, ref in zip(results["1"], results["0"], want):
        assert relative_error(got, ref.cpu()) < bound
        assert relative_error(got, default.double().cpu()) < bound


@needs_hopper_path
@pytest.mark.parametrize("dtype", DTYPES)
def test_batched_pre_activation_from_the_hopper_epilogue(dtype, monkeypatch):
    """A batch of A against one column-major B (broadcast) on the
    pre-activation kernel: y and the pre-activation bitwise gemm's with GELU
    and without an activation."""
    for name in ("MPGEMM_GEMM_PATH", "MPGEMM_WGMMA_SPLIT_K", "MPGEMM_PADDED_OPERANDS"):
        monkeypatch.delenv(name, raising=False)
    a, b = operand((3, 1000, 512), dtype=dtype), operand((512, 1544), "col", dtype)
    bias = torch.randn(1544, device="cuda", dtype=dtype)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        y, z = torch.ops.mpgemm._gemm_pre_activation(a, b, bias, activation="gelu", out_dtype=dtype)
        torch.cuda.synchronize()
    ran = [event.name for event in prof.events() if "gemm_kernel" in event.name]
    assert len(ran) == 1 and "wgmma_pre_activation_gemm_kernel" in ran[0], ran
    assert torch.equal(y, mpgemm.gemm(a, b, bias=bias, activation="gelu", out_dtype=dtype))
    assert torch.equal(z, mpgemm.gemm(a, b, bias=bias, out_dtype=dtype))


def poisoned_row_sums(a, b, out_dtype):
    """torch.ops.mpgemm._gemm_row_sums into outputs that start as NaN, and
    the kernels a second call runs."""
    with nan_filled_outputs():
        y, sums = torch.ops.mpgemm._gemm_row_sums(a, b, out_dtype=out_dtype)
    return y, sums, kernels_of(lambda: torch.ops.mpgemm._gemm_row_sums(a, b, out_dtype=out_dtype))


@needs_hopper_path
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m, n, k, path, split, tile", [
    (3072, 768, 4096, None, 1, "WgmmaTile"),                # GPT-2 small's MLP wgrads: the wide tile
    (1096, 2056, 264, None, 1, "WgmmaTile"),                # partial tiles
    (768, 768, 16384, None, 7, "WgmmaTile"),                # split by default
    (768, 768, 8192, None, 7, "WgmmaTile"),                 # GPT-2 small's attention-out wgrad at 8k tokens
    (2304, 768, 8192, None, 1, "WgmmaPingPongTile"),        # its qkv wgrad: few tiles, whole K
    # Partial tiles; the last pair's second block all past M (1088 rows: 64 past 4 x 256, and past 8 x 128).
    (1088, 1032, 264, "wgmma_pingpong", 1, "WgmmaPingPongTile"),
    (1088, 1032, 264, "wgmma_2x1", 1, "WgmmaPairTile"),
    (8192, 64, 1024, None, 1, "WgmmaN64Tile"),              # narrow outputs
    (16384, 128, 1024, None, 1, "WgmmaN128Tile"),
    (1096, 200, 520, "wgmma_n128", 1, "WgmmaN128Tile"),
    (1096, 200, 520, "wgmma_n64", 1, "WgmmaN64Tile"),
])
def test_row_sums_from_the_hopper_mainloop(m, n, k, path, split, tile, dtype, monkeypatch):
    """linear's weight gradient with its bias's (MPGEMM_EPILOGUE_BIAS_GRAD=1,
    opt-in): dz^T (column-major, so M a multiple of 8: a pitch the copy
    engine describes) times x (row-major), on each Hopper tile as the plan
    picks it or forced, whole K, or split on the wide tile where the
    default splits: the tile's one kernel sums A's rows beside D (the
    split's partial sums reduced after it), and torch sums nothing. D is
    bitwise gemm's; the sums match float64, and are the same bits as the
    wide tile's whole-K sums (a split's: as its own on a second run)."""
    for name in ("MPGEMM_PADDED_OPERANDS", "MPGEMM_NARROW_TILES", "MPGEMM_WGMMA_SPLIT_K"):
        monkeypatch.delenv(name, raising=False)
    set_environment(monkeypatch, "MPGEMM_GEMM_PATH", path)
    assert (mpgemm.gemm_plan(m, n, k).split_k > 1) == (split > 1)  # the count: 7 on 132 multiprocessors
    a, b = operand((m, k), "col", dtype), operand((k, n), "row", dtype)
    row_sums_kernel = "wgmma_splitk_row_sums_gemm_kernel" if split > 1 else "wgmma_row_sums_gemm_kernel"
    for out_dtype in (None, torch.float32):
        y, sums, kernels = poisoned_row_sums(a, b, out_dtype)
        ran = [name for name in kernels if "gemm_kernel" in name]
        assert len(ran) == 1 and row_sums_kernel in ran[0] and f"::{tile}," in ran[0], kernels
        assert split > 1 or len(kernels) == 1, kernels
        assert not any("at::native" in name and "reduce_kernel" in name for name in kernels), kernels
        assert not y.isnan().any() and not sums.isnan().any()
        assert torch.equal(y, mpgemm.gemm(a, b, out_dtype=out_dtype))
        assert relative_error(sums, a.double().sum(-1).cpu()) < 1e-5
        if split == 1:
            monkeypatch.setenv("MPGEMM_GEMM_PATH", "wgmma")
            monkeypatch.setenv("MPGEMM_WGMMA_SPLIT_K", "0")
        assert torch.equal(sums, torch.ops.mpgemm._gemm_row_sums(a, b, out_dtype=out_dtype)[1])
        set_environment(monkeypatch, "MPGEMM_GEMM_PATH", path)
        monkeypatch.delenv("MPGEMM_WGMMA_SPLIT_K", raising=False)


@needs_hopper_path
def test_linear_backward_sums_its_bias_in_the_weights_product(monkeypatch):
    """With MPGEMM_EPILOGUE_BIAS_GRAD=1, linear's backward (no activation, an
    fp32 bias) runs two products and no other kernel: dz is grad_out itself,
    and the row sums kernel gives the bias's gradient."""
    for name in ("MPGEMM_GEMM_PATH", "MPGEMM_WGMMA_SPLIT_K", "MPGEMM_PADDED_OPERANDS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MPGEMM_EPILOGUE_BIAS_GRAD", "1")
    x = operand((4096, 768)).requires_grad_()
    weight = (operand((3072, 768)) / 32).requires_grad_()
    bias = torch.randn(3072, device="cuda", requires_grad=True)
    y = mpgemm.linear(x, weight, bias)
    grad = torch.randn_like(y)
    kernels = kernels_of(lambda: y.backward(grad))
    assert len(kernels) == 2 and any("wgmma_row_sums_gemm_kernel" in name for name in kernels), kernels
    assert relative_error(bias.grad, grad.double().sum(0).cpu()) < 1e-5


@needs_hopper_path
@pytest.mark.parametrize("m, n, tile", [(8192, 64, "WgmmaN64Tile"), (16384, 128, "WgmmaN128Tile"),
                                        (8192, 128, "WgmmaN64Tile"), (16384, 256, "WgmmaTile")])
def test_narrow_tiles_by_default(m, n, tile, monkeypatch):
    """By default (and with MPGEMM_NARROW_TILES=1): 64 columns on 128 x 64
    tiles; 128 on 128 x 128 ones where those fill more than half of an
    H100's or H200's 132 multiprocessors (128 tiles), else on 128 x 64 (64
    of them would be 64 tiles); 256 on the wide tile (128 tiles of 128 x
    256). MPGEMM_NARROW_TILES=0: no narrow tile. Right against cuBLAS."""
    monkeypatch.delenv("MPGEMM_GEMM_PATH", raising=False)
    a = operand((m, 1024))
    b = operand((1024, n), "col")
    for narrow in (None, "1", "0"):
        set_environment(monkeypatch, "MPGEMM_NARROW_TILES", narrow)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            out = poisoned_gemm(a, b)
            torch.cuda.synchronize()
        ran = [event.name for event in prof.events() if "wgmma_gemm_kernel" in event.name]
        if narrow == "0":
            assert ran and not any("WgmmaN" in name for name in ran), ran
        else:
            assert ran and all(tile in name for name in ran), ran
        assert relative_error(out, cublas_gemm(a, b).double().cpu()) < TOLERANCE


def poisoned_activation_grad(a, b, z, activation):
    """torch.ops.mpgemm._gemm_activation_grad into an output that starts as
    NaN, and the kernels a second call runs."""
    with nan_filled_outputs():
        out = torch.ops.mpgemm._gemm_activation_grad(a, b, z, activation=activation)
    return out, kernels_of(lambda: torch.ops.mpgemm._gemm_activation_grad(a, b, z, activation=activation))


# The kernels (parts of one name) that an activation derivative's product runs.
BLOCKS_ALONE_EPILOGUE = ("wgmma_activation_grad_gemm_kernel", "WgmmaTile,")
PING_PONG_EPILOGUE = ("wgmma_activation_grad_gemm_kernel", "WgmmaPingPongTile,")
PASS_AFTER = ("activation_grad_pass_kernel",)


@needs_hopper_path
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu"])
@pytest.mark.parametrize("m, n, k, path, kernel", [
    (4096, 3072, 768, None, BLOCKS_ALONE_EPILOGUE),          # GPT-2 small's MLP dgrad
    (1100, 2056, 264, None, BLOCKS_ALONE_EPILOGUE),          # partial tiles
    (1100, 2056, 264, "odd z", BLOCKS_ALONE_EPILOGUE),       # Z's pairs misaligned: read one at a time
    (1000, 1032, 264, None, PING_PONG_EPILOGUE),             # ping-pong's plan (few tiles), partial tiles
    (4096, 3072, 768, "wgmma_pingpong", PING_PONG_EPILOGUE),  # ping-pong forced on GPT-2 small's
    (4096, 3072, 768, "wmma", PASS_AFTER),                   # the WMMA tiles' product, then the pass
    (8192, 64, 1024, None, PASS_AFTER)])                     # a narrow tile's plan, then the pass
def test_activation_grad_from_the_hopper_epilogue(m, n, k, path, kernel, activation, dtype, monkeypatch):
    """An MLP's dgrad times the activation's derivative at Z (the op that
    MPGEMM_EPILOGUE_ACTIVATION_GRAD=1 has mlp's backward run): dY (row-major)
    times W2 (row-major) on a whole-K plan of the wide tile or of ping-pong
    pairs multiplies in its epilogue, Z read in pairs or (its base 2 bytes
    off) one at a time; other plans store the product and a pass multiplies
    it. The output, in memory that held NaN, matches float64 and torch's own
    backward of the fp32 product, and is the same bits again."""
    for name in ("MPGEMM_WGMMA_SPLIT_K", "MPGEMM_PADDED_OPERANDS", "MPGEMM_NARROW_TILES"):
        monkeypatch.delenv(name, raising=False)
    set_environment(monkeypatch, "MPGEMM_GEMM_PATH", path if path in ("wmma", "wgmma_pingpong") else None)
    a, b = operand((m, k), "row", dtype), operand((k, n), "row", dtype)
    z = (torch.randn(m * n + 1, device="cuda") * 2).to(dtype)
    z = z[1:].view(m, n) if path == "odd z" else z[:-1].view(m, n)
    out, ran = poisoned_activation_grad(a, b, z, activation)
    assert any(all(part in name for part in kernel) for name in ran), ran
    assert not any("at::native" in name for name in ran), ran
    assert not out.isnan().any()
    assert relative_error(out, activation_grad_reference(a, b, z, activation)) < tolerance(dtype)
    torch_grad = torch_activation_backward(a.float() @ b.float(), z.float(), activation)
    assert relative_error(out, torch_grad.double().cpu()) < tolerance(dtype)
    assert torch.equal(out, torch.ops.mpgemm._gemm_activation_grad(a, b, z, activation=activation))


@needs_hopper_path
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu"])
def test_mlp_backward_multiplies_in_the_dgrad_epilogue(activation, monkeypatch):
    """mpgemm.mlp at GPT-2 small's widths with MPGEMM_EPILOGUE_ACTIVATION_GRAD=1
    (and GELU's input saved by the forward): backward runs the activation
    derivative's kernel and no elementwise pass of torch's for the
    activation; gradients match float64 as closely as with the switch off."""
    for name in ("MPGEMM_GEMM_PATH", "MPGEMM_WGMMA_SPLIT_K", "MPGEMM_PADDED_OPERANDS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MPGEMM_EPILOGUE_PRE_ACTIVATION", "1")
    x = operand((4096, 768)).requires_grad_()
    w1, w2 = (operand(shape) / shape[1] ** 0.5 for shape in ((3072, 768), (768, 3072)))
    w1, w2 = w1.requires_grad_(), w2.requires_grad_()
    b1, b2 = (torch.randn(n, device="cuda", requires_grad=True) for n in (3072, 768))
    grad = torch.randn(4096, 768, device="cuda").half()
    x64, w164, w264, b164, b264 = (t.detach().double().requires_grad_() for t in (x, w1, w2, b1, b2))
    act = TORCH_ACTIVATIONS[activation]
    torch.nn.functional.linear(act(torch.nn.functional.linear(x64, w164, b164)), w264, b264).backward(grad.double())
    errors = {}
    for switch in ("0", "1"):
        monkeypatch.setenv("MPGEMM_EPILOGUE_ACTIVATION_GRAD", switch)
        y = mpgemm.mlp(x, w1, b1, w2, b2, activation=activation)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            grads = torch.autograd.grad(y, (x, w1, b1, w2, b2), grad)
            torch.cuda.synchronize()
        ran = [event.name for event in prof.events() if "kernel" in event.name.lower()]
        fused = any("wgmma_activation_grad_gemm_kernel" in name for name in ran)
        # torch's kernels: GeluBackwardCUDAKernelImpl's, threshold_backward's.
        torch_pass = any(s in name.lower() for name in ran for s in ("gelubackward", "gelu_backward", "threshold"))
        assert fused == (switch == "1") and torch_pass == (switch == "0"), ran
        errors[switch] = [relative_error(g, ref.grad) for g, ref in zip(grads, (x64, w164, b164, w264, b264))]
    for on, off in zip(errors["1"], errors["0"]):
        assert on < max(1.5 * off, 1e-3), errors
