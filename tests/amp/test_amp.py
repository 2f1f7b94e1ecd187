"""mpgemm.amp: the loss scaler against torch.amp.GradScaler, master weights,
prepare(), and the mixed-precision training recipe end to end (CPU reference
backend here; the WMMA kernels where a GPU is)."""

import copy

import pytest
import torch
import torch.nn.functional as F

import mpgemm
from mpgemm.amp import LossScaler, MasterWeightOptimizer

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def grad_sequence(length, overflow_at):
    """Random gradients, with inf or NaN at the given steps."""
    grads = []
    for i in range(length):
        g = torch.randn(5)
        if i in overflow_at:
            g[i % 5] = float("inf") if i % 2 else float("nan")
        grads.append(g)
    return grads


def run_scaler(scaler, grads):
    w = torch.nn.Parameter(torch.randn(5))
    optimizer = torch.optim.SGD([w], lr=0.1)
    scales, stepped = [], []
    for g in grads:
        optimizer.zero_grad()
        before = w.detach().clone()
        scaler.scale((w * g).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale())
        stepped.append(not torch.equal(before, w.detach()))
    return scales, stepped


def test_scaler_matches_grad_scaler():
    grads = grad_sequence(40, overflow_at={2, 3, 9, 10, 11, 25, 33})
    options = dict(init_scale=2.0**10, growth_factor=2.0, backoff_factor=0.5, growth_interval=4)
    ours = run_scaler(LossScaler(**options, min_scale=1e-30), grads)
    theirs = run_scaler(torch.amp.GradScaler("cpu", **options), grads)
    assert ours == theirs
    assert ours[1].count(False) == 7


def test_scaler_defaults_and_state_dict_round_trip():
    scaler = LossScaler()
    state = scaler.state_dict()
    assert state["scale"] == 2.0**16 and state["growth_factor"] == 2.0 and state["backoff_factor"] == 0.5
    assert state["growth_interval"] == 2000 and state["min_scale"] == 1.0 and state["hysteresis"] == 1
    run_scaler(scaler, grad_sequence(6, overflow_at={1, 4}))
    restored = LossScaler()
    restored.load_state_dict(scaler.state_dict())
    assert restored.state_dict() == scaler.state_dict()
    assert restored.skipped_steps == 2
    # A GradScaler state_dict loads too.
    restored.load_state_dict(torch.amp.GradScaler("cpu", init_scale=8.0).state_dict())
    assert restored.get_scale() == 8.0


def test_min_scale_floor():
    scales, stepped = run_scaler(LossScaler(init_scale=8.0, min_scale=2.0), grad_sequence(6, set(range(6))))
    assert scales == [4.0, 2.0, 2.0, 2.0, 2.0, 2.0] and not any(stepped)


def test_hysteresis():
    scaler = LossScaler(init_scale=64.0, hysteresis=3, growth_interval=100)
    scales, stepped = run_scaler(scaler, grad_sequence(8, overflow_at={0, 1, 3, 4, 5, 6}))
    # Two overflows, a good step (resets the count), then three in a row back off once.
    assert scales == [64.0, 64.0, 64.0, 64.0, 64.0, 32.0, 32.0, 32.0]
    assert stepped == [False, False, True, False, False, False, False, True]
    assert scaler.skipped_steps == 6


def test_static_scale_and_skip_tracking():
    scaler = LossScaler(init_scale=128.0, dynamic=False, growth_interval=1)
    scales, stepped = run_scaler(scaler, grad_sequence(5, overflow_at={3}))
    assert scales == [128.0] * 5
    assert stepped == [True, True, True, False, True]
    assert scaler.skipped_steps == 1 and not scaler.last_step_skipped


def test_update_with_new_scale_and_disabled_scaler():
    scaler = LossScaler(init_scale=4.0)
    scaler.update(new_scale=1024.0)
    assert scaler.get_scale() == 1024.0
    off = LossScaler(enabled=False)
    loss = torch.tensor(3.0)
    assert off.scale(loss) is loss and off.get_scale() == 1.0 and not off.is_enabled()


def test_unscale_then_clip_matches_grad_scaler():
    torch.manual_seed(0)
    results = []
    for scaler in (LossScaler(init_scale=512.0), torch.amp.GradScaler("cpu", init_scale=512.0)):
        torch.manual_seed(1)
        model = torch.nn.Linear(6, 3)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        x = torch.randn(4, 6) * 10
        for micro_batch in x.split(2):  # gradient accumulation
            scaler.scale(model(micro_batch).square().sum()).backward()
        scaler.unscale_(optimizer)
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        results.append((norm, model.weight.detach().clone()))
    torch.testing.assert_close(results[0], results[1])


def test_scaler_unscales_fp16_gradients_that_grad_scaler_refuses():
    w = torch.nn.Parameter(torch.randn(8).half())
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        scaler = torch.amp.GradScaler("cpu")
        scaler.scale((w.float() * 2).sum()).backward()
        scaler.unscale_(torch.optim.SGD([w], lr=1.0))
    w.grad = None
    scaler = LossScaler(init_scale=256.0)
    scaler.scale((w.float() * 2).sum()).backward()
    scaler.unscale_(torch.optim.SGD([w], lr=1.0))
    assert w.grad.dtype == torch.float16 and torch.equal(w.grad, torch.full_like(w.grad, 2.0))


def test_scaler_misuse():
    w = torch.nn.Parameter(torch.randn(3))
    optimizer = torch.optim.SGD([w], lr=0.1)
    scaler = LossScaler()
    scaler.scale(w.sum()).backward()
    scaler.unscale_(optimizer)
    with pytest.raises(RuntimeError, match="unscale_\\(\\) has already been called"):
        scaler.unscale_(optimizer)
    scaler.step(optimizer)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(optimizer)
    with pytest.raises(ValueError, match="hysteresis must be a positive int"):
        LossScaler(hysteresis=0)
    with pytest.raises(ValueError, match="backoff_factor must be in"):
        LossScaler(backoff_factor=2.0)
    with pytest.raises(TypeError, match="expected a tensor or an iterable of tensors, got str"):
        scaler.scale("loss")


# Master weights and prepare()


def make_model(seed=0, width=32):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(16, width), torch.nn.LayerNorm(width), torch.nn.GELU(),
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 4),
    )


def make_data(seed=1, n=256):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    y = (x[:, :4].argmax(1) + (x[:, 4] > 1).long()) % 4
    return x, y


def train(model, optimizer, scaler, x, y, steps, batch=64):
    for step in range(steps):
        i = (step * batch) % len(x)
        loss = F.cross_entropy(model(x[i:i + batch]), y[i:i + batch])
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        optimizer.zero_grad()
    with torch.no_grad():
        return F.cross_entropy(model(x), y).item()


@pytest.mark.parametrize("device", DEVICES)
def test_prepare_casts_and_keeps_norms_fp32(device):
    model = make_model().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model, optimizer, scaler = mpgemm.amp.prepare(model, optimizer, init_scale=1024.0)
    assert isinstance(optimizer, MasterWeightOptimizer) and isinstance(scaler, LossScaler)
    assert scaler.get_scale() == 1024.0
    assert mpgemm.converted_layers(model) == ["0", "3", "5"]
    assert model[0].weight.dtype == torch.float16 and model[1].weight.dtype == torch.float32
    assert all(m.dtype == torch.float32 for m in optimizer.master_params())
    for x in (torch.randn(3, 16, device=device), torch.randn(3, 16, device=device).half()):
        assert model(x).dtype == torch.float32


def test_prepare_keeps_batchnorm_statistics_fp32():
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    model[1].running_var.fill_(1.0001)  # not representable in fp16
    model, optimizer, _ = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert model[1].running_var.dtype == torch.float32 and model[1].running_var[0].item() == pytest.approx(1.0001)
    model(torch.randn(5, 8))
    assert model[1].running_mean.dtype == torch.float32


def test_masters_start_from_the_fp32_weights():
    model = make_model()
    fp32_weight = model[0].weight.detach().clone()
    _, optimizer, _ = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert torch.equal(optimizer.master_params()[0], fp32_weight)


@pytest.mark.parametrize("device", DEVICES)
def test_master_weight_training_matches_fp32(device):
    x, y = (t.to(device) for t in make_data())
    fp32 = make_model().to(device)
    fp32_loss = train(fp32, torch.optim.SGD(fp32.parameters(), lr=0.05), None, x, y, steps=40)
    mixed = make_model().to(device)
    model, optimizer, scaler = mpgemm.amp.prepare(mixed, torch.optim.SGD(mixed.parameters(), lr=0.05))
    mixed_loss = train(model, optimizer, scaler, x, y, steps=40)
    assert mixed_loss == pytest.approx(fp32_loss, rel=0.05, abs=0.02)
    for master, reference in zip(optimizer.master_params(), fp32.parameters()):
        assert torch.linalg.vector_norm(master - reference) <= 0.02 * torch.linalg.vector_norm(reference)


def test_loss_scaling_is_necessary():
    # A loss so small that its fp16 gradients underflow to zero unscaled.
    def run(scaler_enabled):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
        x, target = torch.randn(64, 16), torch.randn(64, 1)
        model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=3e7),
                                                      enabled=scaler_enabled)
        before = [m.detach().clone() for m in optimizer.master_params()]
        losses = []
        for _ in range(30):
            loss = 1e-8 * F.mse_loss(model(x), target)
            losses.append(loss.item())
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
        moved = any(not torch.equal(b, m) for b, m in zip(before, optimizer.master_params()))
        return losses, moved

    unscaled_losses, unscaled_moved = run(False)
    assert not unscaled_moved, "fp16 gradients should have flushed to zero"
    assert unscaled_losses[-1] == unscaled_losses[0]
    scaled_losses, scaled_moved = run(True)
    assert scaled_moved and scaled_losses[-1] < 0.8 * scaled_losses[0]


def test_bitwise_resume(tmp_path):
    x, y = make_data()

    def fresh():
        model = make_model()
        return mpgemm.amp.prepare(model, torch.optim.Adam(model.parameters(), lr=1e-2), init_scale=2.0**20,
                                  growth_interval=3)

    model, optimizer, scaler = fresh()
    train(model, optimizer, scaler, x, y, steps=7)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict()},
               tmp_path / "ckpt.pt")
    train(model, optimizer, scaler, x, y, steps=5)

    resumed, resumed_opt, resumed_scaler = fresh()
    ckpt = torch.load(tmp_path / "ckpt.pt")
    resumed.load_state_dict(ckpt["model"])
    resumed_opt.load_state_dict(ckpt["optimizer"])
    resumed_scaler.load_state_dict(ckpt["scaler"])
    train(resumed, resumed_opt, resumed_scaler, x, y, steps=5)
    for a, b in zip(list(model.parameters()) + optimizer.master_params(),
                    list(resumed.parameters()) + resumed_opt.master_params()):
        assert torch.equal(a, b)
    assert scaler.state_dict() == resumed_scaler.state_dict()


def test_lr_scheduler_acts_on_masters():
    model = make_model()
    model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=1.0))
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    x, y = make_data(n=64)
    train(model, optimizer, scaler, x, y, steps=1)
    scheduler.step()
    assert optimizer.param_groups[0]["lr"] == 0.5 and optimizer.optimizer.param_groups[0]["lr"] == 0.5


def test_master_optimizer_without_scaler_steps_and_clips():
    model = torch.nn.Linear(4, 2).half()
    optimizer = MasterWeightOptimizer(torch.optim.SGD(model.parameters(), lr=1.0))
    model(torch.randn(3, 4).half()).float().sum().backward()
    expected = optimizer.master_params()[0] - model.weight.grad.float()
    optimizer.step()
    assert torch.equal(optimizer.master_params()[0], expected)
    assert torch.equal(model.weight, expected.half())


def test_prepare_bad_input():
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="the optimizer holds 1 parameter\\(s\\) that are not in the model"):
        mpgemm.amp.prepare(model, torch.optim.SGD([torch.nn.Parameter(torch.randn(2))], lr=0.1))
    with pytest.raises(ValueError, match="no floating-point parameters"):
        mpgemm.amp.prepare(torch.nn.ReLU(), optimizer)
    with pytest.raises(TypeError, match="expected a torch.optim.Optimizer, got list"):
        mpgemm.amp.prepare(model, [1, 2])
    prepared, wrapped, _ = mpgemm.amp.prepare(model, optimizer)
    with pytest.raises(RuntimeError, match="already prepared"):
        mpgemm.amp.prepare(prepared, optimizer)
    with pytest.raises(RuntimeError, match="already prepared"):
        mpgemm.amp.prepare(make_model(), wrapped)
    with pytest.raises(TypeError, match=r"must be torch.float32, torch.float16 or torch.bfloat16, found \['torch.float64'\]"):
        m = torch.nn.Linear(2, 2).double()
        mpgemm.amp.prepare(m, torch.optim.SGD(m.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="dtype must be torch.float16 or torch.bfloat16, got torch.float32"):
        m = torch.nn.Linear(2, 2)
        mpgemm.amp.prepare(m, torch.optim.SGD(m.parameters(), lr=0.1), dtype=torch.float32)


def test_master_optimizer_bad_input():
    p = torch.nn.Parameter(torch.randn(3).half())
    optimizer = torch.optim.Adam([p])
    p.grad = torch.ones_like(p)
    optimizer.step()
    with pytest.raises(ValueError, match="wrap the optimizer before its first step"):
        MasterWeightOptimizer(optimizer)
    with pytest.raises(TypeError, match="expected a torch.optim.Optimizer"):
        MasterWeightOptimizer(object())


def test_scaler_refuses_inconsistent_settings_and_update_without_step():
    with pytest.raises(ValueError, match=r"init_scale \(0.5\) must be at least min_scale \(1.0\)"):
        LossScaler(init_scale=0.5)
    assert LossScaler(init_scale=0.5, dynamic=False).get_scale() == 0.5
    with pytest.raises(RuntimeError, match="update\\(\\) found no step"):
        LossScaler().update()


def test_channels_last_cnn_trains_with_prepare_and_with_a_plain_optimizer():
    def cnn():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.GroupNorm(2, 8), torch.nn.ReLU(),
                                   torch.nn.Conv2d(8, 8, 3), torch.nn.InstanceNorm2d(8, affine=True),
                                   torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 3)).to(memory_format=torch.channels_last)

    x = torch.randn(4, 3, 6, 6).to(memory_format=torch.channels_last)
    y = torch.randint(0, 3, (4,))
    model = cnn()
    model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert model[1].weight.dtype == torch.float32 and model[4].weight.dtype == torch.float32
    before = [m.detach().clone() for m in optimizer.master_params()]
    train(model, optimizer, scaler, x, y, steps=2, batch=4)
    assert all(not torch.equal(b, m) for b, m in zip(before, optimizer.master_params()))
    plain = cnn()
    plain_optimizer = torch.optim.SGD(plain.parameters(), lr=0.1)
    train(plain, plain_optimizer, LossScaler(), x, y, steps=2, batch=4)


def test_unused_parameters_keep_their_values():
    model = torch.nn.ModuleDict({"a": torch.nn.Linear(4, 4), "b": torch.nn.Linear(4, 4)})
    model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x = torch.randn(3, 4)
    scaler.scale(model["b"](model["a"](x)).float().sum()).backward()
    scaler.step(optimizer)
    scaler.update()
    model.zero_grad()  # the model's, not the optimizer's: masters keep their old gradients
    b_weight = model["b"].weight.detach().clone()
    scaler.scale(model["a"](x).float().sum()).backward()  # "b" unused this step
    scaler.step(optimizer)
    scaler.update()
    assert torch.equal(model["b"].weight, b_weight)


def test_master_optimizer_hooks_copy_and_state_shape_check():
    model = torch.nn.Linear(4, 2).half()
    optimizer = MasterWeightOptimizer(torch.optim.SGD(model.parameters(), lr=1.0))
    calls = []
    optimizer.register_step_pre_hook(lambda *args: calls.append("pre"))
    optimizer.register_step_post_hook(lambda *args: calls.append("post"))
    model(torch.randn(3, 4).half()).float().sum().backward()
    optimizer.step()
    assert calls == ["pre", "post"]
    clone = copy.deepcopy(optimizer)
    assert torch.equal(clone.master_params()[0], optimizer.master_params()[0])
    other = MasterWeightOptimizer(torch.optim.SGD(torch.nn.Linear(5, 2).half().parameters(), lr=1.0))
    with pytest.raises(ValueError, match="a saved master weight has shape \\(2, 4\\), this optimizer's has \\(2, 5\\)"):
        other.load_state_dict(optimizer.state_dict())
