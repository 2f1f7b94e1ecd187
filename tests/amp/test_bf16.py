"""bfloat16 end to end: the dtype rule's rounding, torch.autocast around
converted models, convert() of bf16 models, and prepare(dtype=torch.bfloat16)
training next to fp32. The ops' bf16 values against float64 are in
test_gemm.py, test_autograd.py and test_conv.py."""

import copy

import pytest
import torch
import torch.nn.functional as F

import mpgemm
from mpgemm.testing import TOLERANCE, relative_error
from support import MpgemmCalls

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
H, BF, FLOAT = torch.float16, torch.bfloat16, torch.float32


def between_bf16_values(n, device):
    """fp32 values that bf16 cannot hold: many halfway between two bf16 values
    (ties, which round to the even one), the rest anywhere between."""
    base = torch.randn(n, device=device).bfloat16().float()
    ulp = base.abs() * 2.0**-7  # within a factor of two of the spacing around each value
    halfway = base + torch.ldexp(torch.ones_like(base), torch.frexp(base).exponent - 9)
    anywhere = base + ulp * torch.rand(n, device=device)
    return torch.where(torch.arange(n, device=device) % 2 == 0, halfway, anywhere)


def test_ties_round_to_even():
    one = 1.0
    assert torch.tensor([one + 2**-8]).bfloat16().item() == one  # halfway to 1 + 2**-7: even wins
    assert torch.tensor([one + 3 * 2**-8]).bfloat16().item() == one + 2**-6


@pytest.mark.parametrize("device", DEVICES)
def test_fp32_inputs_are_rounded_to_bf16_to_nearest_even(device):
    # With the identity as the other operand the product is exactly the
    # rounded input, for both operands and both ops.
    x = between_bf16_values(64 * 48, device).view(64, 48)
    assert not torch.equal(x.bfloat16().float(), x)
    eye = torch.eye(48, device=device, dtype=BF)
    assert torch.equal(mpgemm.linear(x, eye), x.bfloat16().float())
    assert torch.equal(mpgemm.linear(eye, x).t(), x.bfloat16().float())
    image = x.view(1, 48, 8, 8)
    assert torch.equal(mpgemm.conv2d(image, eye.view(48, 48, 1, 1)), image.bfloat16().float())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("activation", [None, "relu"])
def test_bf16_output_is_one_rounding_of_the_fp32_sum(device, activation):
    # Multiples of 1/8 below 2: every partial sum is exact in fp32, so the
    # output must be the exact result rounded once to bf16.
    a = (torch.randint(-16, 16, (70, 96), device=device) / 8).to(BF)
    b = (torch.randint(-16, 16, (96, 50), device=device) / 8).to(BF)
    bias = torch.randn(50, device=device)
    exact = a.double() @ b.double() + bias.double()
    if activation == "relu":
        exact = exact.relu()
    out = mpgemm.gemm(a, b, bias=bias, activation=activation, out_dtype=BF)
    assert out.dtype == BF
    assert torch.equal(out, exact.float().bfloat16())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [H, BF])
def test_ops_follow_autocast_like_torch(device, dtype):
    x, w, b = torch.randn(6, 20, device=device), torch.randn(9, 20, device=device), torch.randn(9, device=device)
    image, filters = torch.randn(2, 8, 5, 5, device=device), torch.randn(4, 8, 3, 3, device=device)
    with torch.autocast(device, dtype=dtype):
        y, y_torch = mpgemm.linear(x, w, b), F.linear(x, w, b)
        z, z_torch = mpgemm.conv2d(image, filters, padding=1), F.conv2d(image, filters, padding=1)
        product = mpgemm.gemm(x, w.t())  # fp32 operands are cast, as torch.mm's are
    assert y.dtype == y_torch.dtype == dtype and z.dtype == z_torch.dtype == dtype
    assert product.dtype == FLOAT  # gemm's own default output
    assert torch.equal(y, mpgemm.linear(x.to(dtype), w.to(dtype), b.to(dtype)))
    assert torch.equal(z, mpgemm.conv2d(image.to(dtype), filters.to(dtype), padding=1))
    assert torch.equal(product, mpgemm.gemm(x.to(dtype), w.t().to(dtype)))
    # An explicit out_dtype is kept; outside the block nothing is cast.
    with torch.autocast(device, dtype=dtype):
        assert mpgemm.linear(x, w, out_dtype=FLOAT).dtype == FLOAT
    assert mpgemm.linear(x, w).dtype == FLOAT


def cnn():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(16 * 4 * 4, 10))


def gpt2():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=2, n_positions=16)
    return transformers.GPT2LMHeadModel(config).eval()  # no dropout: both models see the same function


MODELS = {
    # builder, inputs, the output to compare, how many mpgemm layers run per forward
    "cnn": (cnn, lambda device: (torch.randn(4, 3, 8, 8, device=device),), lambda out: out, 3),
    "gpt2": (gpt2, lambda device: (torch.randint(0, 128, (2, 16), device=device),), lambda out: out.logits, 9),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("dtype", [H, BF])
def test_converted_model_runs_under_autocast_like_the_unconverted_one(device, name, dtype):
    build, inputs, output, layers = MODELS[name]
    theirs = build().to(device)
    ours = mpgemm.convert(copy.deepcopy(theirs))
    args = inputs(device)
    with torch.autocast(device, dtype=dtype):
        expected = output(theirs(*args))
        with MpgemmCalls() as recorder:
            got = output(ours(*args))
    # Every matrix layer ran on mpgemm, on inputs in autocast's dtype.
    forward = [c for c in recorder.calls if c[0] in ("linear", "conv2d")]
    assert len(forward) == layers and all(set(dtypes[:2]) == {dtype} for _, dtypes in forward), recorder.calls
    assert got.dtype == expected.dtype
    # Both compute in the 16-bit type: they differ by its roundings.
    assert relative_error(got.float(), expected.double()) < 4 * TOLERANCE[dtype]
    loss, expected_loss = got.float().square().mean(), expected.float().square().mean()
    loss.backward()
    expected_loss.backward()
    assert all(p.grad.dtype == q.grad.dtype == FLOAT for p, q in zip(ours.parameters(), theirs.parameters()))
    # All gradients as one vector (a bias that a norm layer follows has a
    # gradient of rounding noise alone), each against the float64 model's: a
    # 16-bit rounding that moves a max-pool's argmax or a ReLU's sign sends a
    # gradient elsewhere in torch's run as in ours, so ours may err as much as
    # torch.amp's own, not less.
    reference = copy.deepcopy(theirs).double()
    reference.zero_grad(set_to_none=True)
    output(reference(*(a.double() if a.is_floating_point() else a for a in args))).square().mean().backward()
    grads, expected_grads, exact_grads = (torch.cat([p.grad.flatten().double() for p in m.parameters()])
                                          for m in (ours, theirs, reference))
    torch_error = relative_error(expected_grads, exact_grads)
    assert relative_error(grads, exact_grads) < max(2 * torch_error, 0.05), torch_error


@pytest.mark.parametrize("device", DEVICES)
def test_convert_takes_bf16_models_and_a_cast_after_convert(device):
    x = torch.randn(4, 3, 8, 8, device=device, dtype=BF)
    for model in (mpgemm.convert(cnn().bfloat16()), mpgemm.convert(cnn()).to(BF)):
        model.to(device)
        assert len(mpgemm.converted_layers(model)) == 3
        out = model(x)
        assert out.dtype == BF
        # torch's own layers in float64 on the same bf16 parameters; the bf16
        # model rounds each layer's output once more.
        reference = torch.nn.Sequential(*map(_torch_twin, copy.deepcopy(model))).double()
        assert relative_error(out, reference(x.double())) < 4 * TOLERANCE[BF]
        out.float().sum().backward()
        assert all(p.grad.dtype == BF for p in model.parameters())


def _torch_twin(module):
    """The module with torch's own layer class (same parameters)."""
    for cls in (torch.nn.Conv2d, torch.nn.Linear):
        if isinstance(module, cls):
            module.__class__ = cls
    return module


def regression_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.LayerNorm(64), torch.nn.GELU(),
                               torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))


def train(model, optimizer, scaler, steps=40):
    """The torch.amp training loop, unchanged for every way of training."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 16, generator=g)
    y = torch.sin(x[:, :4].sum(1, keepdim=True))
    losses = []
    for _ in range(steps):
        loss = F.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def test_prepare_bf16_trains_next_to_fp32():
    reference = regression_model()
    fp32 = train(reference, torch.optim.Adam(reference.parameters(), lr=3e-3), mpgemm.amp.LossScaler(enabled=False))
    model = regression_model()
    model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.Adam(model.parameters(), lr=3e-3), dtype=BF)

    assert not scaler.is_enabled() and scaler.get_scale() == 1.0
    loss = torch.tensor(2.5)
    assert scaler.scale(loss) is loss
    assert [p.dtype for p in model.parameters()] == [BF, BF, FLOAT, FLOAT, BF, BF, BF, BF]  # LayerNorm stays fp32
    assert all(m.dtype == FLOAT for m in optimizer.master_params())

    ours = train(model, optimizer, scaler)
    assert scaler.skipped_steps == 0
    assert ours[-1] < 0.3 * ours[0]
    for step, (a, b) in enumerate(zip(ours, fp32)):
        assert a == pytest.approx(b, rel=0.05), f"step {step}: bf16 {a:.5g}, fp32 {b:.5g}"
    # The bf16 weights are the fp32 masters' rounding.
    for p, master in zip(optimizer.model_params(), optimizer.master_params()):
        assert torch.equal(p, master.to(p.dtype))


def test_prepare_bf16_of_an_fp16_model_keeps_its_values_in_the_masters():
    model = regression_model().half()
    values = [p.detach().clone() for p in model.parameters()]
    with pytest.warns(UserWarning, match="already 16-bit"):
        model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), dtype=BF)
    linear_masters = [m for p, m in zip(optimizer.model_params(), optimizer.master_params()) if p.dtype == BF]
    linear_values = [v for v, p in zip(values, model.parameters()) if p.dtype == BF]
    assert all(torch.equal(m, v.float()) for m, v in zip(linear_masters, linear_values))


def test_prepare_bf16_scaler_can_be_enabled():
    model = regression_model()
    _, _, scaler = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), dtype=BF, enabled=True,
                                      init_scale=256.0)
    assert scaler.is_enabled() and scaler.get_scale() == 256.0


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_converted_model_under_autocast_matches_eager(device):
    torch.manual_seed(0)
    model = mpgemm.convert(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8)))
    model.to(device)
    x = torch.randn(4, 16, device=device)
    compiled = torch.compile(model)
    with torch.autocast(device, dtype=BF):
        got, expected = compiled(x), model(x)
    assert got.dtype == expected.dtype == BF
    assert torch.equal(got, expected)
