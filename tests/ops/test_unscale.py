"""The fused unscale op behind LossScaler: fp16/bf16/fp32 gradients into fp32
(or in place), times 1/scale, with an inf/NaN flag."""

import pytest
import torch

import mpgemm  # noqa: F401  (registers the ops)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
unscale_grads_ = torch.ops.mpgemm.unscale_grads_


def sample(device, with_overflow=False):
    grads = [torch.randn(70000, device=device).half() * 1000, torch.randn(3, 5, device=device),
             torch.randn(7, device=device).half(), torch.randn(300, device=device).bfloat16(),
             torch.randn(40, device=device).bfloat16() * 1000]
    if with_overflow:
        grads[0][12345] = float("inf")
    outs = [torch.full((70000,), float("nan"), device=device), grads[1],
            torch.full((7,), float("nan"), device=device).half(), torch.full((300,), float("nan"), device=device),
            grads[4]]
    return grads, outs


@pytest.mark.parametrize("device", DEVICES)
def test_unscale_values_and_flag(device):
    grads, outs = sample(device)
    expected = [g.double() / 1024 for g in grads]
    found_inf = torch.zeros(1, device=device)
    unscale_grads_(grads, outs, found_inf, torch.tensor(1 / 1024, device=device))
    assert found_inf.item() == 0.0
    for out, ref in zip(outs, expected):
        # 16-bit outputs round once (fp16 ones flush below its smallest
        # subnormal); fp32 ones are exact here (a power of two).
        rtol, atol = {torch.half: (1e-3, 6e-8), torch.bfloat16: (4e-3, 0)}.get(out.dtype, (0, 0))
        torch.testing.assert_close(out.double(), ref.view(out.shape), rtol=rtol, atol=atol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_unscale_flags_non_finite(device, bad):
    grads, outs = sample(device)
    grads[2][3] = bad
    found_inf = torch.zeros(1, device=device)
    unscale_grads_(grads, outs, found_inf, torch.tensor(0.5, device=device))
    assert found_inf.item() == 1.0


@pytest.mark.parametrize("device", DEVICES)
def test_unscale_opcheck(device):
    grads, outs = sample(device)
    torch.library.opcheck(unscale_grads_, (grads, outs, torch.zeros(1, device=device),
                                           torch.tensor(0.25, device=device)))


def test_unscale_bad_input():
    g, o = torch.randn(4), torch.empty(4)
    flag, inv = torch.zeros(1), torch.tensor(1.0)
    with pytest.raises(ValueError, match=r"^mpgemm.unscale_grads_: expected as many outs as grads, got 0 and 1"):
        unscale_grads_([g], [], flag, inv)
    with pytest.raises(TypeError, match=r"expected found_inf to be torch\.float32, got torch\.float64"):
        unscale_grads_([g], [o], flag.double(), inv)
    with pytest.raises(ValueError, match=r"expected inv_scale to hold one element"):
        unscale_grads_([g], [o], flag, torch.ones(2))
    with pytest.raises(TypeError, match=r"expected grads\[0\] and outs\[0\] to be torch\.float16, torch\.bfloat16 or torch\.float32"):
        unscale_grads_([g.double()], [o], flag, inv)
    with pytest.raises(ValueError, match=r"grads\[0\] has shape \(4,\) but outs\[0\] has shape \(5,\)"):
        unscale_grads_([g], [torch.empty(5)], flag, inv)
    with pytest.raises(ValueError, match=r"expected outs\[0\] to be dense"):
        unscale_grads_([torch.randn(2, 3)], [torch.empty(2, 6)[:, ::2]], flag, inv)
    with pytest.raises(ValueError, match=r"expected grads\[0\] on the same device as found_inf \(cpu\), got grads\[0\] on meta"):
        unscale_grads_([torch.empty(4, device="meta")], [o], flag, inv)


@pytest.mark.parametrize("device", DEVICES)
def test_unscale_dense_layouts(device):
    # channels_last and transposed gradients and outputs, in any combination.
    g = torch.randn(2, 8, 3, 3, device=device).half()
    layouts = [g, g.contiguous(memory_format=torch.channels_last)]
    for grad in layouts:
        for like in layouts:
            out = torch.full_like(like, float("nan"), dtype=torch.float32)
            unscale_grads_([grad], [out], torch.zeros(1, device=device), torch.tensor(0.5, device=device))
            assert torch.equal(out, g.float() * 0.5) and out.stride() == like.stride()
    t = torch.randn(6, 4, device=device).t()
    unscale_grads_([t], [t], torch.zeros(1, device=device), torch.tensor(2.0, device=device))
