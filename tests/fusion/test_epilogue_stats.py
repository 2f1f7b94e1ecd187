"""Batch statistics from the convolution's epilogue (MPGEMM_EPILOGUE_STATS=1,
opt-in): mpgemm.ops.conv2d_batch_stats against conv2d and float64
statistics, its autograd, schema and errors, and fused models that take
their chains' statistics from it training as they do with batch norm's own
pass over y, on every backend here."""

import copy

import pytest
import torch

import mpgemm
from mpgemm import nn
from mpgemm.fusion import conv_chains, fuse, fusion_report
from mpgemm.fusion.batch_norm import batch_norm_act as chains_batch_norm_act
from mpgemm.ops import conv2d_batch_stats

from test_fuse import DEVICES, EXPECTED, assert_same_state, fused_copy, tiny_resnet


def reference_stats(y):
    y64 = y.double()
    return torch.stack([y64.mean((0, 2, 3)), y64.var((0, 2, 3), unbiased=False)])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("c, k, kernel, stride, groups", [(16, 24, 3, 1, 1), (3, 8, 7, 2, 1), (16, 32, 1, 2, 2)])
def test_conv2d_batch_stats_is_conv2d_and_its_statistics(device, dtype, c, k, kernel, stride, groups):
    x = (torch.randn(3, c, 11, 11, device=device) + 2.0).to(dtype).to(memory_format=torch.channels_last)
    weight = torch.randn(k, c // groups, kernel, kernel, device=device, dtype=dtype)
    bias = torch.randn(k, device=device)
    y, stats = conv2d_batch_stats(x, weight, bias, stride, kernel // 2, 1, groups)
    assert torch.equal(y, mpgemm.conv2d(x, weight, bias, stride, kernel // 2, 1, groups))
    assert y.is_contiguous(memory_format=torch.channels_last) and stats.dtype == torch.float32
    want = reference_stats(y)
    torch.testing.assert_close(stats.double(), want, rtol=1e-5, atol=1e-5 * want[1].max().sqrt().item())


def test_conv2d_batch_stats_differentiates_y_alone():
    x = torch.randn(2, 8, 6, 6, requires_grad=True)
    weight = torch.randn(16, 8, 3, 3, requires_grad=True)
    y, stats = conv2d_batch_stats(x, weight, None, 1, 1)
    assert y.requires_grad and not stats.requires_grad
    grad = torch.randn_like(y)
    y.backward(grad)
    x2, w2 = x.detach().requires_grad_(), weight.detach().requires_grad_()
    mpgemm.conv2d(x2, w2, None, 1, 1).backward(grad)
    assert torch.equal(x.grad, x2.grad) and torch.equal(weight.grad, w2.grad)
    torch.library.opcheck(torch.ops.mpgemm.conv2d_batch_stats.default,
                          (x.detach().requires_grad_(), weight.detach().requires_grad_(), None, [1, 1], [1, 1, 1, 1],
                           [1, 1], 1))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="expected x to be a 4-D tensor"):
        conv2d_batch_stats(torch.randn(8, 6, 6), torch.randn(16, 8, 3, 3))
    y = torch.randn(2, 8, 4, 4)
    args = (None, None, None, None, None, True, 0.1, 1e-5, False)
    with pytest.raises(ValueError, match=r"batch_mean_var of shape \(2, 8\)"):
        torch.ops.mpgemm.batch_norm_act(y, *args, torch.zeros(2, 7))
    with pytest.raises(TypeError, match="batch_mean_var to be torch.float32"):
        torch.ops.mpgemm.batch_norm_act(y, *args, torch.zeros(2, 8, dtype=torch.float64))
    running = (torch.zeros(8), torch.ones(8))
    with pytest.raises(ValueError, match="batch_mean_var only with batch statistics"):
        torch.ops.mpgemm.batch_norm_act(y, None, None, None, *running, False, 0.1, 1e-5, False, torch.zeros(2, 8))


def test_the_switch_is_checked(monkeypatch):
    model = fused_copy(mpgemm.convert(tiny_resnet()), torch.randn(2, 3, 8, 8))
    monkeypatch.setenv("MPGEMM_EPILOGUE_STATS", "yes")
    with pytest.raises(ValueError, match="MPGEMM_EPILOGUE_STATS must be '0' or '1', got 'yes'"):
        model(torch.randn(2, 3, 8, 8))


def counting_batch_stats(monkeypatch):
    """The calls of conv2d_batch_stats, and of the chains' batch norm with statistics given."""
    calls, given = [], []

    def counted(*args):
        calls.append(args[0].shape)
        return conv2d_batch_stats(*args)

    def batch_norm_act(y, bn, residual=None, relu=False, batch_mean_var=None, **kwargs):
        given.append(batch_mean_var is not None)
        return chains_batch_norm_act(y, bn, residual, relu, batch_mean_var, **kwargs)

    monkeypatch.setattr(nn, "conv2d_batch_stats", counted)
    monkeypatch.setattr(conv_chains, "batch_norm_act", batch_norm_act)
    return calls, given


@pytest.mark.parametrize("device", DEVICES)
def test_fused_chains_train_on_epilogue_statistics_as_on_their_own(device, monkeypatch):
    torch.manual_seed(0)
    model = mpgemm.convert(tiny_resnet(channels=(3, 8, 16))).to(device)
    models = [fused_copy(model, torch.randn(3, 3, 8, 8, device=device)) for _ in range(2)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in models]
    calls, given = counting_batch_stats(monkeypatch)
    for step in range(3):
        x = torch.randn(3, 3, 8, 8, device=device).to(memory_format=torch.channels_last)
        results = []
        # Model 0 takes its statistics from the convolutions, model 1 from batch norm's pass over y.
        for switch, m, optimizer in zip(("1", "0"), models, optimizers):
            monkeypatch.setenv("MPGEMM_EPILOGUE_STATS", switch)
            xi = x.detach().requires_grad_()
            out = m(xi)
            out.float().square().mean().backward()
            results.append((out.detach(), xi.grad))
            optimizer.step()
            optimizer.zero_grad()
        (out, grad_x), (other_out, other_grad_x) = results
        # On a GPU the convolution's statistics come from its fp32 sums, batch norm's from y rounded to
        # 16 bits: the outputs differ by a few of their ulps (3e-4 at 0.2, H200, 2026-11-29).
        torch.testing.assert_close(out, other_out, rtol=4e-3, atol=1e-3)
        torch.testing.assert_close(grad_x, other_grad_x, rtol=1e-3, atol=1e-5)
    assert len(calls) == len(EXPECTED) * 3, calls
    # Every chain of model 0 took the statistics, none of model 1's.
    assert given == ([True] * len(EXPECTED) + [False] * len(EXPECTED)) * 3, given
    assert_same_state(models[0], models[1], rtol=1e-3, atol=1e-4)
    assert not nn.batch_stats_requests


def scale_in_place(module, args, out):
    out.mul_(2.0)


@pytest.mark.parametrize("hook", [lambda module, args, out: out * 2.0, scale_in_place], ids=["replaces", "in place"])
def test_a_hook_that_changes_the_output_keeps_the_pass_over_it(hook, monkeypatch):
    torch.manual_seed(0)
    model = fused_copy(mpgemm.convert(tiny_resnet()), torch.randn(2, 3, 8, 8))
    model[0].register_forward_hook(hook)
    plain = copy.deepcopy(model)
    _, given = counting_batch_stats(monkeypatch)
    monkeypatch.setenv("MPGEMM_EPILOGUE_STATS", "1")
    x = torch.randn(2, 3, 8, 8)
    out = model(x)
    assert not given[0] and all(given[1:]), given  # the hooked chain's statistics are y's own
    monkeypatch.setenv("MPGEMM_EPILOGUE_STATS", "0")
    torch.testing.assert_close(out, plain(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model[1].running_var, plain[1].running_var, rtol=1e-6, atol=1e-7)


def test_a_convolution_run_again_inside_the_chain_gets_its_own_output(monkeypatch):
    torch.manual_seed(0)
    model = fused_copy(mpgemm.convert(tiny_resnet()), torch.randn(2, 3, 8, 8))
    seen = []

    def run_again(module, args, out):
        if not seen:  # once: the hook runs again in its own call
            seen.append(None)
            seen[0] = module(args[0] * 0.5)

    model[0].register_forward_hook(run_again)
    monkeypatch.setenv("MPGEMM_EPILOGUE_STATS", "1")
    x = torch.randn(2, 3, 8, 8)
    model(x)
    # The hook's own call of the convolution is not the chain's: it computes its own input's output.
    del model[0]._forward_hooks[next(iter(model[0]._forward_hooks))]
    torch.testing.assert_close(seen[0], model[0](x * 0.5))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_under_prepare_the_chains_take_epilogue_statistics(dtype, monkeypatch):
    torch.manual_seed(0)
    base = tiny_resnet(channels=(3, 8, 16))
    x = [torch.randn(4, 3, 8, 8).to(memory_format=torch.channels_last) for _ in range(3)]
    calls, given = counting_batch_stats(monkeypatch)
    losses = {}
    for stats in ("0", "1"):
        monkeypatch.setenv("MPGEMM_EPILOGUE_STATS", stats)
        model = copy.deepcopy(base)
        model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.05),
                                                      dtype=dtype, init_scale=2.0**10)
        fuse(model, x[0])
        losses[stats] = []
        for xb in x:
            loss = model(xb).float().square().mean()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            losses[stats].append(loss.item())
        assert all(r["fused"] for r in fusion_report(model))
    assert len(calls) == len(EXPECTED) * len(x) and sum(given) == len(calls)
    torch.testing.assert_close(torch.tensor(losses["1"]), torch.tensor(losses["0"]), rtol=2e-2, atol=1e-3)
