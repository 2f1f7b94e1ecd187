"""What torch.amp habits do after mpgemm.amp.prepare(): clipping, loading
weights, gradient accumulation, float inputs that are not activations, norm
layers and buffers, sparse gradients, .half() models, pickling, the fp16 range
check, GradScaler parity. References: fp32 torch and torch.amp.GradScaler."""

import copy
import io
import pickle
import warnings

import pytest
import torch
import torch.nn.functional as F

import mpgemm
from mpgemm.amp import LossScaler, MasterWeightOptimizer
from mpgemm.amp.master_grads import HookedGradient, MasterGrad, SharedGradient


def mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(12, 32), torch.nn.LayerNorm(32), torch.nn.GELU(),
                               torch.nn.Linear(32, 5))


@pytest.fixture(params=["one process", "distributed"])
def link(request, monkeypatch):
    """The way master gradients are linked (mpgemm.amp.master_grads): on one
    process, or as under torch.distributed (chosen when the optimizer is
    built), whose 16-bit gradients wait for the optimizer's flush."""
    if request.param == "distributed":
        monkeypatch.setattr(mpgemm.amp.master_grads, "process_group_up", lambda: True)
    return request.param


def batch(seed=1, n=16, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 12, generator=g) * scale, torch.randint(0, 5, (n,), generator=g)


# 1. Clipping


@pytest.mark.parametrize("recipe", ["torch", "optimizer"])
def test_clipping_clips_what_the_optimizer_steps_with(recipe):
    """The fp32 reference: gradients of the fp32 model, clipped to max_norm,
    one SGD step. Both recipes must step with those."""
    x, y = batch(scale=30.0)
    max_norm = 0.05
    reference = mlp()
    F.cross_entropy(reference(x), y).backward()
    expected_norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), max_norm)
    expected = [p - 0.1 * p.grad for p in reference.parameters()]

    model = mlp()
    model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    scaler.unscale_(optimizer)
    if recipe == "torch":
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    else:
        norm = optimizer.clip_grad_norm_(max_norm)
    assert torch.isfinite(norm) and norm.item() == pytest.approx(expected_norm.item(), rel=2e-2)
    assert norm.item() > 10 * max_norm  # the clip acts
    stepped_norm = torch.linalg.vector_norm(torch.stack([m.grad.norm() for m in optimizer.master_params()]))
    assert stepped_norm.item() == pytest.approx(max_norm, rel=1e-3)
    scaler.step(optimizer)
    for master, want in zip(optimizer.master_params(), expected):
        torch.testing.assert_close(master, want, atol=2e-3, rtol=2e-2)


def prepared_backward(link_type):
    """A prepared mlp after one backward, its gradient links of link_type."""
    model = mlp()
    model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                                  init_scale=8.0)
    assert all(isinstance(link, link_type) for link in optimizer._links)
    x, y = batch()
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    return model, optimizer, scaler


def test_model_gradient_is_the_master_gradient():
    model, optimizer, scaler = prepared_backward(SharedGradient)
    grad = model[0].weight.grad
    # Summed in fp32 by torch's own accumulation: no 16-bit gradient is kept, no hook runs.
    assert type(grad) is torch.Tensor and grad.dtype == torch.float32
    assert not model[0].weight._backward_hooks and not model[0].weight._post_accumulate_grad_hooks
    master = optimizer.master_params()[0]
    assert master.grad is grad
    scaler.unscale_(optimizer)
    assert model[0].weight.grad is grad and master.grad is grad
    scaler.step(optimizer)
    assert master.grad is None and model[0].weight.grad is grad  # the master lets go: model.zero_grad() frees it
    assert optimizer.master_params()[0].grad is grad  # and reading it through the optimizer ties it again


def test_model_gradient_stands_for_the_master_gradient_under_torch_distributed(monkeypatch):
    monkeypatch.setattr(mpgemm.amp.master_grads, "process_group_up", lambda: True)
    model, optimizer, scaler = prepared_backward(HookedGradient)
    assert model[0].weight.grad.dtype == torch.float16  # DDP reduces it as it is
    master = optimizer.master_params()[0]
    grad = model[0].weight.grad
    assert isinstance(grad, MasterGrad)
    with torch._C.DisableTorchFunctionSubclass():
        assert grad.untyped_storage().nbytes() == 2  # the fp16 gradient is freed
    assert torch.equal(grad * 1, master.grad) and master.grad.dtype == torch.float32
    scaler.unscale_(optimizer)
    assert torch.equal(grad.norm(), master.grad.norm())


def test_the_master_lets_go_after_a_step_and_a_skipped_step():
    """So that model.zero_grad() frees the gradients before the next
    backward, also where the step was skipped (an overflow, decided on the
    host for plain SGD)."""
    model = mlp()
    model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                                  init_scale=2.0**15)
    x, y = batch()
    for overflow in (False, True):
        loss = F.cross_entropy(model(x), y)
        scaler.scale(loss * (float("inf") if overflow else 1.0)).backward()
        scaler.step(optimizer)
        assert scaler.last_step_skipped is False  # update() not yet run
        scaler.update()
        assert scaler.last_step_skipped is overflow
        masters = optimizer._masters()
        assert all(m.grad is None for m, (p, _) in zip(masters, optimizer._pairs) if p.dtype == torch.float16)
        model.zero_grad()


def test_a_gradient_replaced_after_unscale_is_the_one_stepped():
    model = mlp()
    model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=1.0))
    x, y = batch()
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    scaler.unscale_(optimizer)
    before = optimizer.master_params()[0].detach().clone()
    model[0].weight.grad = torch.full_like(model[0].weight.grad, 0.25)  # a new tensor, not an in-place change
    scaler.step(optimizer)
    assert torch.equal(optimizer.master_params()[0], before - 0.25)


def test_a_16_bit_gradient_set_by_hand_is_refused_by_torch():
    """torch refuses a gradient of another dtype than grad_dtype, naming both."""
    model = torch.nn.Linear(4, 2).half()
    optimizer = MasterWeightOptimizer(torch.optim.SGD(model.parameters(), lr=1.0))
    with pytest.raises(RuntimeError, match="dtype 'c10::Half' to a tensor with grad_dtype 'Float'"):
        model.weight.grad = torch.ones(2, 4, dtype=torch.float16)
    del optimizer
    model.weight.grad = torch.ones(2, 4, dtype=torch.float16)  # a discarded optimizer hands the parameter back


# 2. Loading weights after prepare()


def test_load_state_dict_after_prepare_loads_the_masters():
    pretrained = mlp(seed=7)
    pretrained[0].weight.data[0, 0] = 1.0001  # not an fp16 value
    state = pretrained.state_dict()
    model = mlp(seed=0)
    model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.0))
    model.load_state_dict(state)
    for master, (name, value) in zip(optimizer.master_params(), state.items()):
        assert torch.equal(master, value), name  # exactly, fp32 values included
    x, y = batch()
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    scaler.step(optimizer)  # lr 0: the step writes the masters back unchanged
    assert torch.equal(model[0].weight, state["0.weight"].half())
    assert optimizer.master_params()[0][0, 0].item() == pytest.approx(1.0001)
    # A submodule's load_state_dict, and fp16 values.
    model[3].load_state_dict({k: v.half() for k, v in mlp(seed=3)[3].state_dict().items()})
    assert torch.equal(optimizer.master_params()[4], mlp(seed=3)[3].weight.half().float())


def test_load_state_dict_with_assign_is_refused():
    model = mlp()
    model, optimizer, _ = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(RuntimeError, match="assign=True\\) replaced the parameter 'weight'"):
        model.load_state_dict(mlp(seed=2).state_dict(), assign=True)


def test_weights_changed_in_the_model_reach_the_masters():
    model = mlp()
    model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.0))
    kept = optimizer.master_params()[0][1:].clone()
    with torch.no_grad():
        torch.nn.init.zeros_(model[3].weight)  # re-initialising a head after loading, say
        model[0].weight[0].fill_(0.5)
    x, y = batch()
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    scaler.step(optimizer)
    assert torch.equal(optimizer.master_params()[4], torch.zeros(5, 32))
    assert torch.equal(optimizer.master_params()[0][0], torch.full((12,), 0.5))
    assert torch.equal(optimizer.master_params()[0][1:], kept)  # untouched rows keep their fp32 values


# 3. Gradient accumulation


def accumulate(model, optimizer, scaler, micro_batches):
    for x, y in micro_batches:
        scaler.scale(2.0 * F.cross_entropy(model(x), y)).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()


def test_accumulation_sums_in_fp32_and_does_not_skip():
    # Each micro-batch's scaled fp16 gradient fits fp16; the sum of 8 does not.
    micro_batches = [batch(seed=s) for s in range(8)]
    reference = mlp()
    torch_amp = mlp()
    grad_scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=1e-2)
    amp_optimizer = torch.optim.SGD(torch_amp.parameters(), lr=1e-2)
    accumulate(reference, reference_optimizer, LossScaler(enabled=False), micro_batches)
    accumulate(torch_amp, amp_optimizer, grad_scaler, micro_batches)
    assert grad_scaler.get_scale() == 2.0**16  # torch.amp does not skip

    model = mlp()
    model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=1e-2))
    one = mlp()
    scaled = [torch.autograd.grad(2.0**16 * 2.0 * F.cross_entropy(one(x), y), list(one.parameters()))
              for x, y in micro_batches]
    # The premise: each micro-batch's scaled gradients fit fp16, their sum does not.
    assert max(g.abs().max() for grads in scaled for g in grads) < 65504
    assert max(sum(grads).abs().max() for grads in zip(*scaled)) > 65504
    accumulate(model, optimizer, scaler, micro_batches)
    assert not scaler.last_step_skipped and scaler.get_scale() == 2.0**16
    for master, want in zip(optimizer.master_params(), reference.parameters()):
        torch.testing.assert_close(master, want.detach(), atol=1e-3, rtol=1e-2)


def test_model_zero_grad_clears_the_master_gradients():
    model = mlp()
    model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = batch()
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    model.zero_grad()  # the model's, as Hugging Face's Trainer does
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    fresh = mlp()
    fresh, fresh_optimizer, fresh_scaler = mpgemm.amp.prepare(fresh, torch.optim.SGD(fresh.parameters(), lr=0.1))
    fresh_scaler.scale(F.cross_entropy(fresh(x), y)).backward()
    for a, b in zip(optimizer.master_params(), fresh_optimizer.master_params()):
        assert torch.equal(a.grad, b.grad)
    # zero_grad(set_to_none=False) zeroes them.
    optimizer.zero_grad(set_to_none=False)
    assert all(m.grad is not None and not m.grad.any() for m in optimizer.master_params())


def test_model_zero_grad_clears_the_master_gradients_kept_for_ddp(monkeypatch):
    """Under torch.distributed the 16-bit gradients stay on the parameters
    until the optimizer flushes them: after a flushed backward and one more
    (accumulating), a model.zero_grad() still leaves the next backward's
    gradients alone in the masters."""
    monkeypatch.setattr(mpgemm.amp.master_grads, "process_group_up", lambda: True)
    x, y = batch()
    runs = []
    for clear_between in (True, None):
        model = mlp()
        model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        if clear_between:
            scaler.scale(F.cross_entropy(model(x), y)).backward()
            optimizer._flush_grads()
            scaler.scale(F.cross_entropy(model(x), y)).backward()
            model.zero_grad()
        scaler.scale(F.cross_entropy(model(x), y)).backward()
        optimizer._flush_grads()
        runs.append([m.grad.clone() for m in optimizer.master_params()])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_torch_autograd_grad_leaves_the_gradients_alone(link):
    model = mlp()
    model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = batch()
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    before = optimizer.master_params()[0].grad.clone()
    torch.autograd.grad(F.cross_entropy(model(x), y), [model[0].weight])
    assert torch.equal(optimizer.master_params()[0].grad, before)
    if link == "distributed":
        assert isinstance(model[0].weight.grad, MasterGrad)
    else:
        assert model[0].weight.grad is optimizer.master_params()[0].grad


class GradientOnFirstCallOnly(torch.autograd.Function):
    """Hands back no gradient (None) when asked to: a later micro-batch that
    gives a parameter nothing must leave its accumulated gradient alone."""

    @staticmethod
    def forward(ctx, x, drop):
        ctx.drop = drop
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return (None if ctx.drop else grad), None


def test_a_micro_batch_without_gradient_keeps_the_accumulated_one():
    def run(prepare):
        torch.manual_seed(0)
        model = torch.nn.Module()
        model.lin, model.extra = torch.nn.Linear(4, 3), torch.nn.Parameter(torch.randn(3))
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        if prepare:
            model, optimizer, _ = mpgemm.amp.prepare(model, optimizer)
        x = torch.randn(2, 4)
        for drop in (False, True):
            (model.lin(x).float() * GradientOnFirstCallOnly.apply(model.extra, drop).float()).sum().backward()
        return model.lin.weight.grad * 1

    torch.testing.assert_close(run(True), run(False), atol=1e-3, rtol=1e-3)


def test_in_place_arithmetic_on_the_model_gradient_acts_on_the_master(link):
    model = mlp()
    model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = batch()
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    before = optimizer.master_params()[0].grad.clone()
    grad = model[0].weight.grad
    model[0].weight.grad *= 0.5
    assert model[0].weight.grad is grad  # still the master's (or its stand-in)
    assert torch.equal(optimizer.master_params()[0].grad, before * 0.5)


def test_gradients_cleared_through_the_optimizers_param_groups_stay_cleared():
    model = mlp()
    model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = batch()
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    optimizer.master_params()
    for master in optimizer.param_groups[0]["params"]:
        master.grad = None
    assert all(m.grad is None for m in optimizer.master_params())
    assert all(p.grad is None for p in model.parameters())


def test_unfrozen_parameters_and_partial_optimizers():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    model[0].weight.requires_grad_(False)
    with torch.no_grad():  # building the optimizer under no_grad works too
        model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    model[0].weight.requires_grad_(True)  # unfrozen for fine-tuning
    x = torch.randn(4, 8)
    for _ in range(2):
        scaler.scale(model(x).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
        model.zero_grad(set_to_none=False)
    assert optimizer.master_params()[0].grad is not None
    # An optimizer over the biases only (BitFit): loading weights still works.
    state = model.state_dict()
    other = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    other, other_optimizer, _ = mpgemm.amp.prepare(
        other, torch.optim.SGD([p for n, p in other.named_parameters() if n.endswith("bias")], lr=0.1))
    other.load_state_dict(state)
    assert torch.equal(other_optimizer.master_params()[0], state["0.bias"].float())


def test_a_discarded_optimizer_leaves_no_hooks_running():
    import gc
    import weakref

    layer = torch.nn.Linear(16, 16).half()
    first = MasterWeightOptimizer(torch.optim.SGD(layer.parameters(), lr=0.1))
    master = weakref.ref(first.master_params()[0])
    del first
    gc.collect()
    assert master() is None
    second = MasterWeightOptimizer(torch.optim.SGD(layer.parameters(), lr=0.1))
    layer(torch.randn(2, 16).half()).float().sum().backward()
    assert second.master_params()[0].grad is not None
    # An optimizer replaced by a new one over the same parameters (built
    # before the old one goes) leaves the new one's link in place.
    second = MasterWeightOptimizer(torch.optim.SGD(layer.parameters(), lr=0.1))
    gc.collect()
    second.zero_grad()
    layer(torch.randn(2, 16).half()).float().sum().backward()
    assert layer.weight.grad.dtype == torch.float32 and second.master_params()[0].grad is layer.weight.grad
    # A second optimizer over the same parameters, dropped while the first
    # trains on, leaves the first one's link in place.
    third = MasterWeightOptimizer(torch.optim.SGD(layer.parameters(), lr=0.1))
    del third
    gc.collect()
    second.zero_grad()
    layer(torch.randn(2, 16).half()).float().sum().backward()
    assert layer.weight.grad.dtype == torch.float32 and second.master_params()[0].grad is layer.weight.grad
    second.step()
    del second
    gc.collect()
    assert layer.weight.grad.dtype == torch.float16 and layer.weight.grad_dtype == torch.float16  # handed back


# 4. Float inputs that are not activations; 6. norm layers and buffers


class Regressor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = mlp()
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, 8, 2).float() / 8))

    def forward(self, x, labels=None):
        out = self.body(x)[:, 0]
        self.seen_labels = labels
        return out if labels is None else F.mse_loss(out, labels)


def test_float_inputs_that_are_not_activations_keep_their_values():
    model = Regressor()
    model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    labels = torch.full((4,), 100.3)
    loss = model(torch.randn(4, 12), labels=labels)
    assert model.seen_labels is labels and loss.dtype == torch.float32
    assert model.inv_freq.dtype == torch.float32


class LlamaStyleRMSNorm(torch.nn.Module):  # transformers' LlamaRMSNorm, in brief
    def __init__(self, n):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))

    def forward(self, x):
        self.input_dtype = x.dtype
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))


def test_norm_layers_by_name_and_keep_fp32_stay_fp32():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), LlamaStyleRMSNorm(8), torch.nn.Linear(8, 8),
                                torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()))
    model, optimizer, _ = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), keep_fp32=["3"])
    assert model[1].weight.dtype == torch.float32 and model[3][0].weight.dtype == torch.float32
    assert model[0].weight.dtype == torch.float16 and model[2].weight.dtype == torch.float16
    assert mpgemm.converted_layers(model) == ["0", "2"]  # the kept Linear stays on torch, in fp32
    assert model(torch.randn(2, 8)).dtype == torch.float32 and model[1].input_dtype == torch.float32
    # A wrapper named like a norm layer is not one: what it wraps is converted.
    class PreNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.fn = torch.nn.LayerNorm(8), torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.fn(self.norm(x))

    wrapped = torch.nn.Sequential(PreNorm(), torch.nn.Linear(8, 2))
    wrapped, _, _ = mpgemm.amp.prepare(wrapped, torch.optim.SGD(wrapped.parameters(), lr=0.1))
    assert mpgemm.converted_layers(wrapped) == ["0.fn", "1"] and wrapped[0].norm.weight.dtype == torch.float32
    with pytest.raises(TypeError, match="keep_fp32 must be module names, module classes or a predicate"):
        other = mlp()
        mpgemm.amp.prepare(other, torch.optim.SGD(other.parameters(), lr=0.1), keep_fp32=[1])


# 7. Sparse gradients


@pytest.mark.parametrize("prepared", [False, True])
def test_sparse_gradients_are_unscaled_like_grad_scaler(prepared):
    def run(scaler_factory, prepare):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Embedding(20, 6, sparse=True), torch.nn.Linear(6, 3))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        scaler = scaler_factory()
        if prepare:
            model, optimizer, scaler = mpgemm.amp.prepare(model, optimizer, init_scale=64.0)
        ids = torch.tensor([[1, 2, 2, 5], [5, 5, 0, 19]])
        for _ in range(2):  # the repeated ids leave duplicates in the sparse gradient
            loss = model(ids).float().square().mean()
            scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        weights = optimizer.master_params() if prepare else list(model.parameters())
        return [w.detach().float().clone() for w in weights]

    ours = run(lambda: LossScaler(init_scale=64.0), prepared)
    theirs = run(lambda: torch.amp.GradScaler("cpu", init_scale=64.0), False)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, atol=2e-3, rtol=1e-2)


# 8. A model already cast with .half()


def test_prepare_on_a_half_model_restores_norm_layers_and_warns():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2)).half()
    with pytest.warns(UserWarning, match="were already 16-bit.*masters? weights start from those 16-bit"):
        model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert model[1].weight.dtype == torch.float32 and model[1].running_mean.dtype == torch.float32
    loss = F.cross_entropy(model(torch.randn(4, 8)), torch.tensor([0, 1, 1, 0]))
    scaler.scale(loss).backward()
    scaler.step(optimizer)


def test_prepare_warns_when_a_weight_overflows_fp16():
    model = mlp()
    with torch.no_grad():
        model[3].weight[0, :3] = 1e5
    with pytest.warns(UserWarning, match="'3.weight' has 3 value\\(s\\) beyond fp16's range"):
        mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))


# 9. Pickling


def test_prepared_model_pickles_and_saves_whole():
    model = mlp()
    model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = batch()
    scaler.scale(F.cross_entropy(model(x), y)).backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        restored = pickle.loads(pickle.dumps(model))
        buffer = io.BytesIO()
        torch.save(model, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    with torch.no_grad():
        for other in (restored, loaded, copy.deepcopy(model)):
            assert torch.equal(other(x), model(x))
            other.load_state_dict(mlp(seed=4).state_dict())  # inert hooks: no optimizer behind them


def test_a_converted_layer_pickled_before_norm_layers_shared_the_class_swap_loads():
    # Such a pickle names the source class alone: (_new_converted, (cls,), state).
    layer = mpgemm.convert(torch.nn.Sequential(torch.nn.modules.linear.NonDynamicallyQuantizableLinear(4, 4)))[0]

    class OldPickle:
        def __reduce_ex__(self, protocol):
            return mpgemm.convert.__globals__["_new_converted"], (layer._mpgemm_source[0],), layer.__getstate__()

    restored = pickle.loads(pickle.dumps(OldPickle()))
    assert type(restored) is type(layer) and torch.equal(restored.weight, layer.weight)


# 12. The fp16 range check


def test_fp16_range_check_names_the_first_layer_that_loses_values():
    model = mlp()
    model, _, _ = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, _ = batch()
    with mpgemm.amp.fp16_range_check(model) as report:
        model(x)
    assert report == [] and report.first is None
    x[0, 0], x[1, 1], x[2, 2] = 1e6, -1e6, 1e-9
    with pytest.warns(UserWarning, match="layer '0', input 0: 2 value\\(s\\) beyond fp16's range become inf"):
        with mpgemm.amp.fp16_range_check(model) as report:
            model(x)
    assert (report.first.layer, report.first.overflow, report.first.flush) == ("0", 2, 1)
    assert report.first.largest == 1e6
    # Converted (not prepared) fp32 layers round their weights.
    converted = mpgemm.convert(torch.nn.Linear(4, 2))
    with torch.no_grad():
        converted.weight[0, 0] = 7e4
    with pytest.warns(UserWarning, match="layer '<root>', weight: 1 value"):
        with mpgemm.amp.fp16_range_check(converted):
            converted(torch.randn(3, 4))
    assert not converted._forward_pre_hooks  # removed on exit


# 10. An empty feature dimension


@pytest.mark.parametrize("in_features,out_features", [(0, 3), (5, 0)])
def test_linear_with_an_empty_feature_dimension_has_zero_gradients(in_features, out_features):
    x = torch.randn(4, in_features, requires_grad=True)
    weight = torch.randn(out_features, in_features, requires_grad=True)
    bias = torch.randn(out_features, requires_grad=True)
    mpgemm.linear(x, weight, bias).sum().backward()
    expected = [t.detach().clone().requires_grad_() for t in (x, weight, bias)]
    F.linear(*expected).sum().backward()
    for ours, theirs in zip((x, weight, bias), expected):
        assert torch.equal(ours.grad, theirs.grad)


# 11. GradScaler parity


def test_scaler_getters_setters_and_iterables_match_grad_scaler():
    ours, theirs = LossScaler(), torch.amp.GradScaler("cpu")
    for scaler in (ours, theirs):
        scaler.set_growth_factor(3.0)
        scaler.set_backoff_factor(0.25)
        scaler.set_growth_interval(7)
    for name in ("growth_factor", "backoff_factor", "growth_interval"):
        assert getattr(ours, f"get_{name}")() == getattr(theirs, f"get_{name}")()
    assert ours.state_dict() | theirs.state_dict() == ours.state_dict()
    losses = [torch.tensor(1.5), torch.tensor(2.0)]
    for container in (tuple, list, iter):
        a, b = ours.scale(container(losses)), theirs.scale(container(losses))
        assert type(a) is type(b) and [t.item() for t in a] == [t.item() for t in b]
    with pytest.raises(ValueError, match="growth_interval must be a positive int, got 0"):
        ours.set_growth_interval(0)
    with pytest.raises(ValueError, match="backoff_factor must be in \\(0, 1\\), got 1.5"):
        ours.set_backoff_factor(1.5)


def test_step_before_any_scale_raises_as_grad_scaler_does():
    w = torch.nn.Parameter(torch.randn(3))
    w.grad = torch.randn(3)
    optimizer = torch.optim.SGD([w], lr=0.1)
    with pytest.raises(AssertionError, match="_scale is None"):
        torch.amp.GradScaler("cpu").step(optimizer)
    with pytest.raises(RuntimeError, match="step\\(\\) was called before any scale\\(\\)"):
        LossScaler().step(optimizer)
    with pytest.raises(RuntimeError, match="unscale_\\(\\) was called before any scale\\(\\)"):
        LossScaler().unscale_(optimizer)
    assert LossScaler(enabled=False).step(optimizer) is None  # a disabled scaler just steps


def test_master_optimizer_copies_follow_their_own_parameters():
    model = torch.nn.Linear(4, 2).half()
    optimizer = MasterWeightOptimizer(torch.optim.SGD(model.parameters(), lr=1.0))
    clone = copy.deepcopy(optimizer)
    clone.model_params()[0].grad = torch.ones(2, 4)  # a 16-bit parameter with a master takes fp32 gradients
    clone.step()
    assert torch.equal(clone.master_params()[0], optimizer.master_params()[0] - 1)
    assert model.weight.grad is None


# 13. Steps that would bypass the masters


def trained_step(model, optimizer, scaler, seed=1):
    x, y = batch(seed)
    scaler.scale(F.cross_entropy(model(x), y)).backward()


def test_an_optimizer_built_after_prepare_is_refused_at_its_first_step():
    model = mlp()
    model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=1e-4))
    late = torch.optim.SGD(model.parameters(), lr=1e-4)
    trained_step(model, optimizer, scaler)
    weights = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(RuntimeError, match="this SGD steps 4 16-bit parameter\\(s\\) of a model that .*"
                                           "before prepare\\(\\), pass it in"):
        late.step()
    assert all(torch.equal(a, b) for a, b in zip(weights, model.parameters()))
    # Also once the optimizer prepare() returned is gone.
    del optimizer
    with pytest.raises(RuntimeError, match="this SGD steps 4 16-bit parameter"):
        late.step()
    # An optimizer over the fp32 parameters alone (the norm layer's) steps.
    norm_only = torch.optim.SGD(model[1].parameters(), lr=1e-4)
    model[1].weight.grad = torch.ones_like(model[1].weight)
    norm_only.step()
    assert torch.equal(model[1].weight, weights[2] - 1e-4)


def test_the_wrapped_optimizer_stepped_on_its_own_is_refused():
    model = mlp()
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer, scaler = mpgemm.amp.prepare(model, inner)
    trained_step(model, optimizer, scaler)
    with pytest.raises(RuntimeError, match="steps the fp32 masters of a MasterWeightOptimizer directly"):
        inner.step()
    scaler.step(optimizer)  # the returned optimizer steps the same inner one
    scaler.update()
    assert not torch.equal(optimizer.master_params()[0], mlp()[0].weight)


@pytest.mark.parametrize("zero_grad", [False, True])
def test_a_second_step_after_update_is_refused_at_once(zero_grad):
    model = mlp()
    model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    trained_step(model, optimizer, scaler)
    scaler.step(optimizer)
    scaler.update()
    if zero_grad:
        optimizer.zero_grad()
    masters = [m.detach().clone() for m in optimizer.master_params()]
    for method in ("step", "unscale_"):
        refused = f"{method}\\(\\) was called after update\\(\\) with no scale\\(\\) since"
        with pytest.raises(RuntimeError, match=refused):
            getattr(scaler, method)(optimizer)
    assert all(torch.equal(a, b) for a, b in zip(masters, optimizer.master_params()))
    # The next iteration runs as usual.
    optimizer.zero_grad()
    trained_step(model, optimizer, scaler, seed=2)
    scaler.step(optimizer)
    scaler.update()
    assert not all(torch.equal(a, b) for a, b in zip(masters, optimizer.master_params()))


def test_a_step_after_the_models_parameters_were_replaced_is_refused():
    """fully_shard replaces them after prepare() (tests/amp/test_fsdp.py); so
    does assigning new ones. The masters would no longer be the model's."""
    model = mlp()
    model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for layer in (model[0], model[3]):
        layer.weight = torch.nn.Parameter(layer.weight.detach().clone())
        layer.bias = torch.nn.Parameter(layer.bias.detach().clone())
    trained_step(model, optimizer, scaler)
    with pytest.raises(RuntimeError, match="4 of the model's 16-bit parameters with masters are no longer in"):
        scaler.step(optimizer)


def test_a_second_optimizer_over_parameters_prepare_made_16_bit_is_refused():
    """prepare() takes one optimizer; parameters only another one holds are
    made 16-bit without masters, and that optimizer would step them so."""
    model = mlp()
    head = torch.optim.SGD(model[3].parameters(), lr=0.1)  # built before prepare(), as a second optimizer
    model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model[0].parameters(), lr=0.1))
    trained_step(model, optimizer, scaler)
    scaler.step(optimizer)
    with pytest.raises(RuntimeError, match="this SGD steps 2 16-bit parameter\\(s\\) of a model that "
                                           "mpgemm.amp.prepare\\(\\) made 16-bit.*one optimizer over every parameter"):
        head.step()


def test_an_optimizer_found_clean_is_checked_again_when_it_grows():
    model = mlp()
    model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    other = torch.nn.Linear(3, 3)
    separate = torch.optim.SGD(other.parameters(), lr=0.1)
    other(torch.randn(2, 3)).sum().backward()
    separate.step()  # another model's optimizer steps as usual
    separate.add_param_group({"params": [model[0].weight]})
    with pytest.raises(RuntimeError, match="steps 1 16-bit parameter"):
        separate.step()


def test_replacing_some_of_the_models_parameters_is_refused_at_the_first_step():
    model = mlp()
    model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    model[3].weight = torch.nn.Parameter(model[3].weight.detach().clone())  # the other layer keeps its own
    trained_step(model, optimizer, scaler)
    with pytest.raises(RuntimeError, match="1 of the model's 16-bit parameters with masters are no longer in"):
        scaler.step(optimizer)
