"""The mma.sync ceiling op (`bench ceiling`): every slot of out holds
iterations rounds of acc += a @ b in fp32, on the CPU reference and on the
GPU kernel; its registration passes opcheck; bad arguments get clear errors."""

import pytest
import torch

import mpgemm

TILE = mpgemm.build_info()["mma_ceiling"]
A_SHAPE = (TILE["warp_m"], TILE["k"])
B_SHAPE = (TILE["k"], TILE["warp_n"])
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def out_shape(blocks):
    return (blocks, TILE["warps"], TILE["warp_m"], TILE["warp_n"])


def small_integers(shape, device):
    """fp16 integers in [-3, 3]: every sum of the ceiling stays exact in fp32."""
    return torch.randint(-3, 4, shape, device=device).half()


def ceiling(a, b, iterations, blocks):
    out = torch.full(out_shape(blocks), float("nan"), device=a.device)
    torch.ops.mpgemm._mma_ceiling(a, b, iterations, out=out)
    return out


def test_tile_matches_the_large_gemm_tile():
    # 8 warps of 64x32 fp32 accumulators, stepping K by one 16-deep fragment.
    assert TILE == {"warps": 8, "warp_m": 64, "warp_n": 64, "k": 16}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("iterations, blocks", [(0, 1), (1, 1), (7, 3), (1000, 2)])
def test_every_slot_holds_iterations_times_the_product(device, iterations, blocks):
    a, b = small_integers(A_SHAPE, device), small_integers(B_SHAPE, device)
    out = ceiling(a, b, iterations, blocks)
    expected = iterations * (a.double().cpu() @ b.double().cpu())
    assert torch.equal(out.double().cpu(), expected.expand(out_shape(blocks)))


@pytest.mark.parametrize("device", DEVICES)
def test_random_values_within_fp32_accumulation_error(device):
    a = torch.randn(A_SHAPE, device=device).half()
    b = torch.randn(B_SHAPE, device=device).half()
    iterations = 300
    out = ceiling(a, b, iterations, 2).double().cpu()
    ref64 = iterations * (a.double() @ b.double()).cpu()
    # Each round adds one fp32 rounding of the running sum: to nearest, at most
    # 2^-24 of it, on the CPU. Tensor Cores align the products to the largest
    # addend and truncate instead of rounding (Fasi et al., "Numerical behavior
    # of NVIDIA tensor cores", PeerJ CS 2021), so allow 2^-22 on a GPU: still
    # a thousandth of one round's product.
    per_round = 2.0**-24 if device == "cpu" else 2.0**-22
    bound = iterations * per_round * (iterations * (a.double().abs() @ b.double().abs()).cpu())
    worst = ((out - ref64).abs() / bound).max().item()
    assert worst <= 1, f"error {worst:.2f}x the bound"


@pytest.mark.gpu
def test_gpu_fills_every_slot_of_many_blocks():
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    a, b = small_integers(A_SHAPE, "cuda"), small_integers(B_SHAPE, "cuda")
    out = ceiling(a, b, 5, 2 * sms + 1)
    assert torch.equal(out, ceiling(a.cpu(), b.cpu(), 5, 2 * sms + 1).cuda())


def test_opcheck():
    a, b = torch.randn(A_SHAPE).half(), torch.randn(B_SHAPE).half()
    torch.library.opcheck(torch.ops.mpgemm._mma_ceiling.default, (a, b, 3), {"out": torch.empty(out_shape(2))})


def bad_calls(device):
    def half(shape):
        return torch.randn(shape).half().to(device)

    def out(blocks=1, dtype=torch.float32):
        return torch.empty(out_shape(blocks), dtype=dtype, device=device)

    op = torch.ops.mpgemm._mma_ceiling
    wm, wn, k = TILE["warp_m"], TILE["warp_n"], TILE["k"]
    return [
        ("a float32", TypeError, r"expected a and b to be torch\.float16, got torch\.float32 and torch\.float16",
         lambda: op(half(A_SHAPE).float(), half(B_SHAPE), 1, out=out())),
        ("a shape", ValueError, rf"expected a of shape \({wm}, {k}\) \(one warp tile's A\), got shape \(32, {k}\)",
         lambda: op(half((32, k)), half(B_SHAPE), 1, out=out())),
        ("b shape", ValueError, rf"expected b of shape \({k}, {wn}\) \(one warp tile's B\), got shape \({k}, 8\)",
         lambda: op(half(A_SHAPE), half((k, 8)), 1, out=out())),
        ("out dtype", TypeError, r"expected out to be torch\.float32, got torch\.float16",
         lambda: op(half(A_SHAPE), half(B_SHAPE), 1, out=out(dtype=torch.float16))),
        ("no blocks", ValueError, rf"expected out of shape \(blocks, {TILE['warps']}, {wm}, {wn}\) with 1 <= blocks",
         lambda: op(half(A_SHAPE), half(B_SHAPE), 1, out=out(blocks=0))),
        ("out 3-D", ValueError, r"expected out of shape \(blocks, ",
         lambda: op(half(A_SHAPE), half(B_SHAPE), 1, out=out()[0])),
        ("b strided", ValueError, r"expected a, b and out to be contiguous",
         lambda: op(half(A_SHAPE), half((wn, k)).t(), 1, out=out())),
        ("iterations", ValueError, r"expected 0 <= iterations <= 2\^31 - 1, got -1",
         lambda: op(half(A_SHAPE), half(B_SHAPE), -1, out=out())),
        ("iterations too many", ValueError, r"expected 0 <= iterations <= 2\^31 - 1, got 2147483648",
         lambda: op(half(A_SHAPE), half(B_SHAPE), 2**31, out=out())),
    ]


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("case", range(len(bad_calls("cpu"))), ids=[c[0] for c in bad_calls("cpu")])
def test_bad_input(device, case):
    _, error, message, call = bad_calls(device)[case]
    with pytest.raises(error, match="^mpgemm._mma_ceiling: " + message):
        call()


def test_out_on_another_device():
    with pytest.raises(ValueError, match=r"expected out on the same device as a \(cpu\), got out on meta"):
        torch.ops.mpgemm._mma_ceiling(torch.randn(A_SHAPE).half(), torch.randn(B_SHAPE).half(), 1,
                                      out=torch.empty(out_shape(1), device="meta"))
