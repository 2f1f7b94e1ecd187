"""mpgemm.nn.Linear as a drop-in torch.nn.Linear, and mpgemm.convert."""

import copy
import re

import pytest
import torch
import torch.nn.functional as F

import mpgemm
from mpgemm.testing import relative_error

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


class Model(torch.nn.Module):
    def __init__(self, width=32, depth=3, classes=10):
        super().__init__()
        self.embed = torch.nn.Linear(24, width)
        self.blocks = torch.nn.Sequential(*[Block(width) for _ in range(depth)])
        self.attention = torch.nn.MultiheadAttention(width, 4, batch_first=True)
        self.head = torch.nn.Linear(width, classes)

    def forward(self, x):
        h = self.blocks(self.embed(x))
        h = h + self.attention(h, h, h, need_weights=False)[0]
        return self.head(h)


def test_linear_is_a_drop_in():
    torch.manual_seed(0)
    ours = mpgemm.nn.Linear(20, 30)
    torch.manual_seed(0)
    theirs = torch.nn.Linear(20, 30)
    assert isinstance(ours, torch.nn.Linear)
    assert torch.equal(ours.weight, theirs.weight) and torch.equal(ours.bias, theirs.bias)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    x = torch.randn(4, 20)
    assert relative_error(ours(x), F.linear(x.half().double(), ours.weight.half().double(), ours.bias.double())) < 1e-5
    assert "backend=mpgemm" in repr(ours)


@pytest.mark.parametrize("bias", [True, False])
def test_state_dict_loads_both_ways(bias):
    ours, theirs = mpgemm.nn.Linear(8, 5, bias=bias), torch.nn.Linear(8, 5, bias=bias)
    ours.load_state_dict(theirs.state_dict())
    assert torch.equal(ours.weight, theirs.weight)
    fresh = torch.nn.Linear(8, 5, bias=bias)
    fresh.load_state_dict(ours.state_dict())
    assert torch.equal(fresh.weight, ours.weight)
    if bias:
        assert torch.equal(fresh.bias, ours.bias)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_linear_layer_trains(device, dtype):
    layer = mpgemm.nn.Linear(16, 8, device=device, dtype=dtype)
    x = torch.randn(10, 16, device=device, dtype=dtype)
    layer(x).float().square().mean().backward()
    assert layer.weight.grad.dtype == dtype and layer.bias.grad.dtype == dtype
    ref = torch.nn.Linear(16, 8, device=device, dtype=torch.float64)
    with torch.no_grad():
        ref.weight.copy_(layer.weight.half())
        ref.bias.copy_(layer.bias)
    ref(x.half().double()).square().mean().backward()
    assert relative_error(layer.weight.grad, ref.weight.grad) < 5e-3


def test_convert_keeps_outputs_and_shares_parameters():
    model = Model()
    reference = copy.deepcopy(model)
    params = {name: p for name, p in model.named_parameters()}
    x = torch.randn(2, 7, 24)
    assert mpgemm.convert(model) is model
    converted = mpgemm.converted_layers(model)
    assert converted == ["embed", "blocks.0.up", "blocks.0.down", "blocks.1.up", "blocks.1.down", "blocks.2.up",
                         "blocks.2.down", "head"]
    # MultiheadAttention's out_proj is a Linear subclass it never calls: left alone.
    assert type(model.attention.out_proj) is not mpgemm.nn.Linear
    assert all(p is params[name] for name, p in model.named_parameters())
    with torch.no_grad():
        assert relative_error(model(x), reference(x).double()) < 2e-3


def test_convert_is_idempotent_and_skips():
    model = Model()
    mpgemm.convert(model, skip=["head", "blocks.1"])
    first = mpgemm.converted_layers(model)
    assert "head" not in first and not any(name.startswith("blocks.1.") for name in first)
    mpgemm.convert(model, skip=["head", "blocks.1"])
    assert mpgemm.converted_layers(model) == first
    other = mpgemm.convert(Model(), skip=lambda name, module: module.out_features == 10)
    assert "head" not in mpgemm.converted_layers(other) and "embed" in mpgemm.converted_layers(other)


def test_convert_root_and_ineligible_layers():
    layer = torch.nn.Linear(3, 4)
    assert mpgemm.convert(layer) is layer and isinstance(layer, mpgemm.nn.Linear)
    double = torch.nn.Linear(3, 4, dtype=torch.float64)
    mpgemm.convert(double)
    assert type(double) is torch.nn.Linear


class TimmLinear(torch.nn.Linear):
    """timm.layers.Linear's forward (timm 1.0): the weight cast to the input's
    type only under TorchScript. Named as timm names it, for the machines
    where timm does not install (tests/amp/test_real_clients.py has timm's)."""

    def forward(self, input):
        if torch.jit.is_scripting():
            bias = self.bias.to(dtype=input.dtype) if self.bias is not None else None
            return F.linear(input, self.weight.to(dtype=input.dtype), bias=bias)
        return F.linear(input, self.weight, self.bias)


TimmLinear.__module__, TimmLinear.__qualname__ = "timm.layers.linear", "Linear"


class ClassifierHead(TimmLinear):  # inherits timm's forward
    pass


class ScaledLinear(torch.nn.Linear):
    def forward(self, input):
        return 2 * F.linear(input, self.weight, self.bias)


def test_convert_takes_timms_linear_and_warns_about_other_forwards(caplog):
    torch.manual_seed(0)
    model = torch.nn.Sequential(TimmLinear(16, 32), ClassifierHead(32, 8), ScaledLinear(8, 4))
    reference = copy.deepcopy(model)
    x = torch.randn(5, 16)
    with caplog.at_level("WARNING", logger="mpgemm.convert"):
        mpgemm.convert(model)
    assert mpgemm.converted_layers(model) == ["0", "1"]
    assert isinstance(model[0], TimmLinear) and isinstance(model[1], ClassifierHead)
    assert type(model[2]) is ScaledLinear
    assert re.search(r"1 \S*ScaledLinear \(overrides forward; include= converts it\)", caplog.text)
    assert "timm" not in caplog.text
    with torch.no_grad():
        assert relative_error(model(x), reference(x).double()) < 2e-3


def test_convert_bad_arguments():
    with pytest.raises(TypeError, match="mpgemm.convert: expected a torch.nn.Module, got list"):
        mpgemm.convert([torch.nn.Linear(2, 2)])
    with pytest.raises(TypeError, match="skip must be module names, module classes or a predicate"):
        mpgemm.convert(torch.nn.Linear(2, 2), skip=[3])
    with pytest.raises(TypeError, match="skip must be module names, module classes or a predicate"):
        mpgemm.convert(torch.nn.Linear(2, 2), skip=5)


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_training_step_matches_eager(device):
    def make():
        torch.manual_seed(0)
        model = mpgemm.convert(torch.nn.Sequential(
            torch.nn.Linear(24, 48), torch.nn.GELU(), torch.nn.Linear(48, 48), torch.nn.ReLU(), torch.nn.Linear(48, 6)
        )).to(device)
        return model, torch.optim.SGD(model.parameters(), lr=0.1)

    def step(model, optimizer, x, target):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), target)
        loss.backward()
        optimizer.step()
        return loss

    x = torch.randn(16, 24, device=device)
    target = torch.randint(0, 6, (16,), device=device)
    eager_model, eager_opt = make()
    compiled_model, compiled_opt = make()
    compiled_step = torch.compile(step)
    for _ in range(3):
        eager_loss = step(eager_model, eager_opt, x, target)
        compiled_loss = compiled_step(compiled_model, compiled_opt, x, target)
        torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-4, atol=1e-5)
    for p, q in zip(compiled_model.parameters(), eager_model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
