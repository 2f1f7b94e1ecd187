"""The stem's max pool taken into its chain (MPGEMM_FUSED_MAX_POOL=1 at
fuse): which pools join, training as with torch's pool after the chain (bit
for bit where torch's sums are fp32: its CUDA pool, or windows that do not
overlap), what autograd keeps, hooks, pools it leaves to torch, and the
switch's bad values."""

import pytest
import torch

import mpgemm
from mpgemm.fusion import fusion_report
from support import assert_compiled_fused_trains_as_unfused
from test_fuse import DEVICES, TimmBottleneck, tiny_resnet
from test_recompute import batches, train_both
from test_recompute import prepared_and_fused as fused_with_switch

SWITCH = "MPGEMM_FUSED_MAX_POOL"
STEM_POOL = (3, 2, 1)  # ResNet's: kernel, stride, padding
APART = (2, 2, 0)  # windows that do not overlap


def model_with_pool(device, pool=STEM_POOL):
    """tiny_resnet with a max pool after its stem chain (conv, batch norm, ReLU), as torchvision's ResNets."""
    torch.manual_seed(0)
    layers = list(tiny_resnet(channels=(3, 8, 16)))
    layers[5] = TimmBottleneck(16, 8)
    pool = pool if isinstance(pool, torch.nn.Module) else torch.nn.MaxPool2d(*pool)
    return torch.nn.Sequential(*layers[:3], pool, *layers[3:]).to(device).to(memory_format=torch.channels_last)


def prepared_and_fused(base, x, dtype, on, monkeypatch):
    return fused_with_switch(base, x, dtype, on, monkeypatch, switch=SWITCH)


def pools_fused(model):
    return {r["conv"]: r["max_pool"] for r in fusion_report(model) if r["kind"] == "batch_norm"}


def test_the_stems_pool_joins_its_chain(monkeypatch):
    base, x = model_with_pool("cpu"), batches("cpu", 1)[0]
    fused, _, _ = prepared_and_fused(base, x, torch.float16, True, monkeypatch)
    assert {conv: pool for conv, pool in pools_fused(fused).items() if pool} == {"0": "3"}
    # The modules and the checkpoint's keys as they were; the pool no longer recomputes the chain's output.
    assert isinstance(fused[3], torch.nn.MaxPool2d) and fused.state_dict().keys() == base.state_dict().keys()
    assert not next(r for r in fusion_report(fused) if r["conv"] == "0")["output_recomputable"]
    for off in (False, None):  # "0", and unset
        unfused, _, _ = prepared_and_fused(base, x, torch.float16, off, monkeypatch)
        assert not any(pools_fused(unfused).values())
        assert next(r for r in fusion_report(unfused) if r["conv"] == "0")["output_recomputable"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("window", [STEM_POOL, APART])
def test_trains_as_torchs_pool_after_the_chain(device, dtype, window, monkeypatch):
    base, data = model_with_pool(device, window), batches(device, 3)
    runs = [prepared_and_fused(base, data[0], dtype, on, monkeypatch) for on in (True, False)]
    if device == "cuda" or window == APART:
        train_both(runs, data, dtype)
        return
    # torch's CPU pool adds a 16-bit input's overlapping windows' gradients in its type, the fused one in
    # fp32: the forward bit for bit, the gradients to a 16-bit rounding.
    outs, grads = [], []
    for model, _, _ in runs:
        out = model(data[0].to(dtype))
        out.float().square().mean().backward()
        outs.append(out.detach())
        grads.append([p.grad.float() for p in model.parameters()])
    assert torch.equal(*outs)
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-3)


def saved_by_forward(model, x):
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    return saved


@pytest.mark.parametrize("device", DEVICES)
def test_the_chain_keeps_a_byte_per_pooled_element_not_torchs_indices(device, monkeypatch):
    base, x = model_with_pool(device), batches(device, 1)[0].half()
    kept = {}
    for on in (True, False):
        model, _, _ = prepared_and_fused(base, x, torch.float16, on, monkeypatch)
        kept[on] = saved_by_forward(model, x.requires_grad_())
    stem, pooled = (4, 8, 8, 8), (4, 8, 4, 4)
    assert not any(t.dtype == torch.int64 for t in kept[True])
    assert any(t.dtype == torch.uint8 and t.shape == pooled for t in kept[True])
    assert any(t.dtype == torch.int64 and t.shape == pooled for t in kept[False])  # torch's pool's indices
    # The stem's y alone of its size in 16 bits: no output, no mask.
    assert sum(t.shape == stem for t in kept[True]) == 1


def test_hooks_on_the_pool_leave_it_to_torch(monkeypatch):
    x = batches("cpu", 1)[0]
    hooked = model_with_pool("cpu")
    calls = []
    hooked[3].register_forward_hook(lambda *args: calls.append(1))
    model, _, _ = prepared_and_fused(hooked, x, torch.float16, True, monkeypatch)
    assert not any(pools_fused(model).values())
    # A hook added after fuse(): the chain calls the pool, which runs it.
    plain, _, _ = prepared_and_fused(model_with_pool("cpu"), x, torch.float16, False, monkeypatch)
    fused, _, _ = prepared_and_fused(model_with_pool("cpu"), x, torch.float16, True, monkeypatch)
    fused[3].register_forward_pre_hook(lambda *args: calls.append(2))
    calls.clear()
    assert torch.equal(fused(x.half()), plain(x.half())) and calls == [2]


@pytest.mark.parametrize("pool", [torch.nn.MaxPool2d((12, 11), 1, 0), torch.nn.MaxPool2d(2, 70000)],
                         ids=["more taps than a byte names", "a stride past 65535"])
def test_pools_it_cannot_take_stay_with_torch(pool, monkeypatch):
    x = batches("cpu", 1, batch=2)[0]
    x = torch.nn.functional.interpolate(x, size=(16, 16)).contiguous(memory_format=torch.channels_last)
    base = model_with_pool("cpu", pool)
    runs = [prepared_and_fused(base, x, torch.float16, on, monkeypatch) for on in (True, False)]
    assert not any(pools_fused(runs[0][0]).values())
    assert torch.equal(runs[0][0](x.half()), runs[1][0](x.half()))


def stem_then_chain():
    """A stem whose pooled output goes to one convolution alone (VGG-BN's
    pattern), whose chain would otherwise take the stem's recipe."""
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
        torch.nn.MaxPool2d(3, 2, 1), torch.nn.Conv2d(8, 8, 3, padding=1, bias=False), torch.nn.BatchNorm2d(8),
        torch.nn.ReLU()).to(memory_format=torch.channels_last)


@pytest.mark.parametrize("recomputing", [True, False])
def test_a_pooled_output_taken_by_one_chain_alone(recomputing, monkeypatch):
    base, data = stem_then_chain(), batches("cpu", 2)
    monkeypatch.setenv("MPGEMM_RECOMPUTE_CHAIN_OUTPUTS", "1" if recomputing else "0")
    runs = [prepared_and_fused(base, data[0], torch.float16, on, monkeypatch) for on in (True, False)]
    report = {r["conv"]: r for r in fusion_report(runs[0][0])}
    assert report["0"]["max_pool"] == "3" and not report["0"]["output_recomputable"]
    # Windows that overlap: torch's CPU pool adds the gradients in 16 bits, so one step, outputs bit for bit.
    outs = [model(data[0].half()) for model, _, _ in runs]
    assert torch.equal(*outs)
    for out in outs:
        out.float().square().mean().backward()
    for p, q in zip(runs[0][0].parameters(), runs[1][0].parameters()):
        torch.testing.assert_close(p.grad.float(), q.grad.float(), rtol=2e-2, atol=2e-3)


def test_in_eval_the_running_statistics_normalize(monkeypatch):
    base, data = model_with_pool("cpu", APART), batches("cpu", 2)
    runs = [prepared_and_fused(base, data[0], torch.float16, on, monkeypatch) for on in (True, False)]
    train_both(runs, data, torch.float16)  # running statistics that are not the initial ones
    outs = []
    for model, _, _ in runs:
        model.eval()
        with torch.no_grad():
            outs.append(model(data[1].half()))
    assert torch.equal(*outs)


def test_arguments_of_one_value_and_an_empty_stride_as_torch_reads_them(monkeypatch):
    # [3] is 3 x 3, stride [] the kernel's: windows that do not overlap, so the same bits on the CPU.
    base, data = model_with_pool("cpu", torch.nn.MaxPool2d([3], [], [1])), batches("cpu", 2)
    runs = [prepared_and_fused(base, data[0], torch.float16, on, monkeypatch) for on in (True, False)]
    assert pools_fused(runs[0][0])["0"] == "3"
    train_both(runs, data, torch.float16)


def test_a_chain_without_a_relu_keeps_torchs_pool(monkeypatch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
                                torch.nn.MaxPool2d(3, 2, 1), torch.nn.Conv2d(8, 4, 1))
    model, _, _ = prepared_and_fused(model, batches("cpu", 1)[0], torch.float16, True, monkeypatch)
    assert pools_fused(model) == {"0": None}


def test_a_bad_switch_is_named(monkeypatch):
    monkeypatch.setenv(SWITCH, "yes")
    with pytest.raises(ValueError, match=r"MPGEMM_FUSED_MAX_POOL must be '0' or '1', got 'yes'"):
        mpgemm.fuse(model_with_pool("cpu"), batches("cpu", 1)[0])


def test_torch_compile_trains_the_fused_pool(monkeypatch):
    monkeypatch.setenv(SWITCH, "1")
    torch.manual_seed(0)
    assert_compiled_fused_trains_as_unfused(mpgemm.convert(model_with_pool("cpu")),
                                            torch.randn(2, 3, 8, 8).to(memory_format=torch.channels_last),
                                            "mpgemm.batch_norm_relu_max_pool", 1e-4, 1e-5)
