"""mpgemm.fuse on ResNet blocks written as torchvision and timm write them:
what it fuses and what it refuses, training against the unfused modules
(outputs, every gradient, running statistics, num_batches_tracked over
several optimizer steps), batch norm's options, the model's state and
identity, and the ways a model is used (prepare(), torch.compile, pickling,
copying, checkpoints both ways)."""

import copy
import math
import pickle
import warnings

import pytest
import torch
import torch.nn.functional as F

import mpgemm
from mpgemm.fusion import fuse, fusion_report
from mpgemm.tools import training
from support import (assert_compiled_fused_trains_as_unfused, assert_fused_within_prepared_deviation,
                     train_fused_prepared_and_fp32)


class BasicBlock(torch.nn.Module):
    """torchvision's: one ReLU module used twice, `out += identity`."""

    def __init__(self, cin, cout, stride=1, norm=torch.nn.BatchNorm2d):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = norm(cout)
        self.relu = torch.nn.ReLU(inplace=True)
        self.conv2 = torch.nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = norm(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = torch.nn.Sequential(torch.nn.Conv2d(cin, cout, 1, stride, bias=False), norm(cout))

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class TimmBottleneck(torch.nn.Module):
    """timm's: Identity modules between the steps, functional-style residual."""

    def __init__(self, c, mid):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(c, mid, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(mid)
        self.act1 = torch.nn.ReLU(inplace=True)
        self.conv2 = torch.nn.Conv2d(mid, mid, 3, padding=1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(mid)
        self.drop_block = torch.nn.Identity()
        self.act2 = torch.nn.ReLU(inplace=True)
        self.aa = torch.nn.Identity()
        self.conv3 = torch.nn.Conv2d(mid, c, 1, bias=False)
        self.bn3 = torch.nn.BatchNorm2d(c)
        self.act3 = torch.nn.ReLU(inplace=True)
        self.grad_checkpointing = False

    def forward(self, x):
        shortcut = x
        x = self.act1(self.bn1(self.conv1(x)))
        x = self.aa(self.act2(self.drop_block(self.bn2(self.conv2(x)))))
        x = self.bn3(self.conv3(x))
        if self.grad_checkpointing:
            x = x * 1.0
        return self.act3(x + shortcut)


def tiny_resnet(channels=(3, 8, 12), norm=torch.nn.BatchNorm2d):
    c_in, c1, c2 = channels
    return torch.nn.Sequential(
        torch.nn.Conv2d(c_in, c1, 3, padding=1, bias=False), norm(c1), torch.nn.ReLU(inplace=True),
        BasicBlock(c1, c1, norm=norm), BasicBlock(c1, c2, stride=2, norm=norm), TimmBottleneck(c2, 5),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(c2, 4))


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture
def ieee_fp32():
    """cuDNN's convolutions in IEEE fp32 (torch lets them use TF32), for comparisons with float64."""
    with training.ieee_fp32():
        yield
EXPECTED = {  # conv -> bn: (residual, relu)
    ("0", "1"): (False, True), ("3.conv1", "3.bn1"): (False, True), ("3.conv2", "3.bn2"): (True, True),
    ("4.conv1", "4.bn1"): (False, True), ("4.conv2", "4.bn2"): (True, True),
    ("4.downsample.0", "4.downsample.1"): (False, False), ("5.conv1", "5.bn1"): (False, True),
    ("5.conv2", "5.bn2"): (False, True), ("5.conv3", "5.bn3"): (True, True),
}


def fused_copy(model, *example, **kwargs):
    fused = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing here is refused
        assert fuse(fused, *example, **kwargs) is fused
    return fused


def train_together(models, optimizers, batches, loss_fn=lambda out: out.float().square().mean()):
    """Steps each model on the same batches; yields the models' outputs and
    input gradients after each step."""
    for x in batches:
        results = []
        for model, optimizer in zip(models, optimizers):
            xi = x.detach().to(next(model.parameters()).dtype).requires_grad_()
            out = model(xi)
            loss_fn(out).backward()
            results.append((out.detach(), xi.grad))
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
        yield results


# A ReLU's input this close to zero (relative to the largest of that ReLU's
# inputs) may round to either side in fp32: a fused chain rounds its
# normalization differently from torch's (y * scale + shift against
# (y - mean) * invstd * weight + bias), and both differ from float64 by a few
# times 1e-7 of the largest input. Where one rounds it across zero, the
# element's whole gradient passes in one model and not in the other, a
# difference no rounding tolerance covers. At fresh random inputs such a draw
# came about once in 150 runs (seed 482695034, batch 2, channels_last: an
# input of -3.9e-7 beside a largest of 3.1).
RELU_KINK_MARGIN = 1e-5


def relu_kink_distance(model, x):
    """The smallest |input| of model's ReLU modules on x, each relative to
    that ReLU's largest, from a forward of a copy (the model's running
    statistics stay as they were)."""
    probe, distances = copy.deepcopy(model), []

    def record(module, args):
        z = args[0].detach().abs()
        assert z.isfinite().all(), "a ReLU input of the reference is not finite"
        distances.append(float(z.min() / z.max()) if z.max() > 0 else math.inf)

    for m in probe.modules():
        if isinstance(m, torch.nn.ReLU):
            m.register_forward_pre_hook(record)
    with torch.no_grad():
        probe(x.to(next(probe.parameters()).dtype))
    assert distances, "the reference runs no ReLU module"
    return min(distances)


def batches_clear_of_relu_kinks(reference, draw, steps):
    """`steps` inputs from `draw()`, each drawn again while one of the
    reference's ReLU inputs on it lies within RELU_KINK_MARGIN of zero. Lazy:
    each is drawn after the step before it, so train_together probes the
    reference as that step left it."""
    for _ in range(steps):
        for _ in range(50):
            x = draw()
            if relu_kink_distance(reference, x) >= RELU_KINK_MARGIN:
                break
        else:
            raise AssertionError("50 draws in a row put a ReLU input within the margin of zero")
        yield x


def assert_same_state(a, b, rtol, atol):
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=rtol, atol=atol, msg=name)
    for (name, s), t in zip(a.state_dict().items(), b.state_dict().values()):
        if s.dtype == torch.long:
            assert torch.equal(s, t), name
        else:
            torch.testing.assert_close(s, t, rtol=rtol, atol=atol, msg=name)


def test_fuses_the_chains_of_torchvision_and_timm_blocks():
    model = tiny_resnet()
    fused = fused_copy(model, torch.randn(2, 3, 8, 8))
    report = fusion_report(fused)
    assert {(r["conv"], r["bn"]): (r["residual"], r["relu"]) for r in report} == EXPECTED
    assert all(r["fused"] for r in report)
    # The module tree, names, classes and state_dict keys are the model's.
    assert [n for n, _ in fused.named_modules()] == [n for n, _ in model.named_modules()]
    for (name, a), b in zip(fused.named_modules(), model.modules()):
        assert isinstance(a, type(b)) and type(a).__name__ == type(b).__name__, name
    assert list(fused.state_dict()) == list(model.state_dict())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch", [2, 3])
@pytest.mark.parametrize("channels_last", [False, True])
def test_trains_as_the_unfused_model_in_fp32(device, batch, channels_last, ieee_fp32):
    model = tiny_resnet(channels=(3, 7, 13)).to(device)
    fused = fused_copy(model, torch.randn(batch, 3, 9, 9, device=device))
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    fused = fused.to(memory_format=fmt)
    reference = copy.deepcopy(model).double().to(memory_format=fmt)
    models = [fused, reference]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in models]
    batches = batches_clear_of_relu_kinks(
        reference, lambda: torch.randn(batch, 3, 9, 9, device=device).to(memory_format=fmt), steps=4)
    for (out, grad_x), (ref_out, ref_grad_x) in train_together(models, optimizers, batches):
        # The fused model computes in fp32 on fp64 values cast down: float64-backed tolerances.
        torch.testing.assert_close(out.double(), ref_out, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(grad_x.double(), ref_grad_x, rtol=1e-3, atol=1e-5)
    assert_same_state(copy.deepcopy(fused).double(), reference, rtol=1e-3, atol=1e-4)
    for m in models:
        m.eval()
    with torch.no_grad():
        x = torch.randn(batch, 3, 9, 9, device=device, dtype=torch.float64).to(memory_format=fmt)
        torch.testing.assert_close(fused(x.float()).double(), reference(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("options", [
    {"momentum": None}, {"track_running_stats": False}, {"affine": False}, {"momentum": 0.5, "eps": 1e-2}])
def test_batch_norm_options(options):
    model = tiny_resnet(norm=lambda c: torch.nn.BatchNorm2d(c, **options))
    fused = fused_copy(model, torch.randn(2, 3, 8, 8))
    models = [fused, model]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.05) for m in models]
    batches = batches_clear_of_relu_kinks(model, lambda: torch.randn(3, 3, 8, 8), steps=3)
    for (out, grad_x), (ref_out, ref_grad_x) in train_together(models, optimizers, batches):
        torch.testing.assert_close(out, ref_out, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(grad_x, ref_grad_x, rtol=1e-3, atol=1e-6)
    assert_same_state(fused, model, rtol=1e-4, atol=1e-5)
    for m in models:
        m.eval()
    x = next(batches_clear_of_relu_kinks(model, lambda: torch.randn(2, 3, 8, 8), steps=1)).requires_grad_()
    out, ref = fused(x), model(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
    # Eval backward (running statistics, or batch ones without them).
    grads = [torch.autograd.grad(o.sum(), [x] + list(m.parameters())) for o, m in ((out, fused), (ref, model))]
    for g, r in zip(*grads):
        torch.testing.assert_close(g, r, rtol=1e-3, atol=1e-5)


def test_one_value_per_channel_is_refused_in_training_as_torch_refuses_it():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    fused = fused_copy(model, torch.randn(2, 3, 2, 2))
    x = torch.randn(1, 3, 1, 1)
    with pytest.raises(ValueError, match="Expected more than 1 value per channel when training"):
        model(x)
    with pytest.raises(ValueError, match="Expected more than 1 value per channel when training"):
        fused(x)
    fused.eval()
    model.eval()
    torch.testing.assert_close(fused(x), model(x))


class UsesConvTwice(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        y = self.conv(x)
        return self.bn(y) + y


class SharedNorm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = torch.nn.Conv2d(3, 4, 1), torch.nn.Conv2d(4, 4, 1)
        self.bn = torch.nn.BatchNorm2d(4)

    def forward(self, x):
        return self.bn(self.conv2(self.bn(self.conv1(x))))


class DataDependent(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4)

    def forward(self, x):
        if x.sum() > 0:
            x = -x
        return self.bn(self.conv(x))


def hooked_bn():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    model[1].register_forward_hook(lambda m, i, o: None)
    return model


def hooked_relu():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    model[2].register_forward_pre_hook(lambda m, i: None)
    return model


def sync_bn():
    return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.SyncBatchNorm(4), torch.nn.ReLU())


@pytest.mark.parametrize("make, reason", [
    (UsesConvTwice, "the convolution's output is used more than once"),
    (SharedNorm, "a module of the chain runs more than once per forward"),
    (DataDependent, "its forward cannot be traced"),
    (hooked_bn, "a hook on the batch norm"),
    (hooked_relu, "a hook on the ReLU"),
])
def test_refused_chains_stay_unfused_and_are_named(make, reason):
    model = make()
    reference = copy.deepcopy(model)
    with pytest.warns(UserWarning, match=f"mpgemm.fuse: left unfused .*{reason}"):
        fuse(model, torch.randn(2, 3, 4, 4))
    assert [r for r in fusion_report(model) if r["fused"]] == []
    assert any(reason in r["reason"] for r in fusion_report(model))
    x = torch.randn(2, 3, 4, 4)
    torch.testing.assert_close(model(x), reference(x))


def test_sync_batch_norm_is_not_a_chain():
    model = sync_bn()
    fuse(model, torch.randn(2, 3, 4, 4))
    assert fusion_report(model) == []


def test_a_module_the_example_forward_does_not_run_stays_unfused():
    model = torch.nn.ModuleDict({"used": torch.nn.Linear(3, 3),
                                 "unused": torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4))})
    model.forward = lambda x: model["used"](x)
    with pytest.warns(UserWarning, match="did not run in the example forward"):
        fuse(model, torch.randn(2, 3))


def test_the_example_forward_leaves_the_model_as_it_was():
    model = tiny_resnet()
    model(torch.randn(2, 3, 8, 8)).sum().backward()
    state = copy.deepcopy(model.state_dict())
    grads = [p.grad.clone() for p in model.parameters()]
    example = torch.randn(4, 3, 8, 8)
    rng = torch.get_rng_state()
    fuse(model, example)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), state.values()))
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads))
    assert torch.equal(torch.get_rng_state(), rng)


def test_a_changed_attribute_runs_the_module_unfused():
    model = tiny_resnet()
    reference = copy.deepcopy(model)
    fuse(model, torch.randn(2, 3, 8, 8))
    model[5].grad_checkpointing = reference[5].grad_checkpointing = True
    x = torch.randn(2, 3, 8, 8)
    with pytest.warns(UserWarning, match=r"5.grad_checkpointing changed since fuse\(\)"):
        out = model(x)
    torch.testing.assert_close(out, reference(x))
    # A child replaced: the graph would call the new one where it expects a ReLU.
    model[3].relu = reference[3].relu = torch.nn.GELU()
    with pytest.warns(UserWarning, match=r"the children of 3 changed"):
        out = model(x)
    torch.testing.assert_close(out, reference(x))


def test_checkpoints_move_both_ways_and_the_model_pickles_and_copies():
    model = tiny_resnet()
    x = torch.randn(2, 3, 8, 8)
    fused = fused_copy(model, x)
    fused(x).sum().backward()  # statistics and gradients of its own
    plain = tiny_resnet()
    plain.load_state_dict(fused.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(plain.state_dict().values(), fused.state_dict().values()))
    model.load_state_dict(plain.state_dict())
    fused.load_state_dict(model.state_dict())
    for clone in (pickle.loads(pickle.dumps(fused)), copy.deepcopy(fused)):
        assert len(fusion_report(clone)) == len(EXPECTED)
        for m in (clone, fused, model):
            m.eval()
        torch.testing.assert_close(clone(x), model(x), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(clone(x), fused(x), rtol=0, atol=0)
        fused.train()
        model.train()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fuse_first", [False, True])
def test_under_prepare_within_torch_amps_deviation(device, dtype, fuse_first):
    torch.manual_seed(0)
    base = tiny_resnet(channels=(3, 8, 16)).to(device)
    x = [torch.randn(4, 3, 8, 8, device=device).to(memory_format=torch.channels_last) for _ in range(4)]
    runs = train_fused_prepared_and_fp32(base, x, lambda model, xb: model(xb).float().square().mean(), dtype,
                                         fuse_first)
    assert len([r for r in fusion_report(runs["fused"][0]) if r["fused"]]) == len(EXPECTED)
    assert_fused_within_prepared_deviation(runs)


def test_torch_compile_trains_the_fused_model():
    torch.manual_seed(0)
    assert_compiled_fused_trains_as_unfused(mpgemm.convert(tiny_resnet()), torch.randn(2, 3, 8, 8),
                                            "mpgemm.batch_norm_act", 1e-4, 1e-5)


def test_fuse_refuses_what_is_not_a_module():
    with pytest.raises(TypeError, match="mpgemm.fuse: expected a torch.nn.Module, got function"):
        fuse(F.relu)


def test_a_forward_replaced_on_the_instance_is_named_and_left_alone():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4), torch.nn.ReLU())
    model.forward = lambda x: model[2](model[1](model[0](x))) * 2
    with pytest.warns(UserWarning, match="its forward is replaced on the instance"):
        fuse(model, torch.randn(2, 3, 4, 4))
    assert not any(r["fused"] for r in fusion_report(model))


class LeakyReLU(torch.nn.ReLU):
    def forward(self, x):
        return F.leaky_relu(x, 0.1)


def test_a_relu_subclass_with_its_own_forward_stays_after_the_chain():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 1), torch.nn.BatchNorm2d(4), LeakyReLU())
    reference = copy.deepcopy(model)
    fuse(model, torch.randn(2, 3, 4, 4))
    assert [(r["fused"], r["relu"]) for r in fusion_report(model)] == [(True, False)]
    x = torch.randn(2, 3, 4, 4)
    torch.testing.assert_close(model(x), reference(x))


class ResidualThenSharedNorm(torch.nn.Module):
    """A chain with a residual add, then a chain whose batch norm's output is
    used twice (no step after it joins): the second takes no residual."""

    def __init__(self):
        super().__init__()
        self.conv1, self.bn1 = torch.nn.Conv2d(6, 6, 3, padding=1, bias=False), torch.nn.BatchNorm2d(6)
        self.conv2, self.bn2 = torch.nn.Conv2d(6, 6, 1, bias=False), torch.nn.BatchNorm2d(6)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)) + x)
        t = self.bn2(self.conv2(x))
        return torch.relu(t) * t


def test_a_chain_after_a_residual_chain_takes_no_residual_of_its_own():
    torch.manual_seed(0)
    model = mpgemm.convert(ResidualThenSharedNorm())
    x = torch.randn(2, 6, 5, 5)
    fused = fused_copy(model, x)
    assert [r["residual"] for r in fusion_report(fused)] == [True, False]
    torch.testing.assert_close(fused(x), model(x), rtol=1e-5, atol=1e-5)
