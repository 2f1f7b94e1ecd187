"""Inside a prepared model the ops on autocast's fp32 list (cross_entropy and
the other losses on a CPU; softmax, exp, pow and more on CUDA) compute in
fp32 on 16-bit activations, as under torch.amp, whether torch's layers, the
model's own code or a user's module calls them; what keep_fp32 picks stays
fp32 throughout. References: torch.autocast on the same 16-bit values,
float64, and torch.amp training transformers' T5, whose loss is computed
inside its forward."""

import copy

import pytest
import torch
import torch.nn.functional as F
import transformers

import mpgemm

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
HALF, FLOAT = torch.float16, torch.float32


class OpsInForward(torch.nn.Module):
    """A user's module that computes losses and other fp32-list ops itself."""

    def __init__(self, classes=10):
        super().__init__()
        self.gain = torch.nn.Parameter(torch.rand(classes) * 8 + 1)  # a 16-bit parameter: inputs arrive in 16 bits

    def forward(self, x, y):
        h = x * self.gain
        return {"h": h, "cross_entropy": F.cross_entropy(h, y), "nll_loss": F.nll_loss(h, y),
                "mse_loss": F.mse_loss(h, torch.ones_like(h)), "log_softmax": F.log_softmax(h, -1),
                "softmax": h.softmax(-1), "exp": h.exp(), "pow": h.pow(2), "sum": h.sum()}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("device", DEVICES)
def test_ops_in_the_models_forward_follow_autocast(device, dtype):
    torch.manual_seed(0)
    model = OpsInForward().to(device)
    model, *_ = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), dtype=dtype)
    reference = copy.deepcopy(model)  # the same 16-bit values, run under torch.autocast as torch.amp would
    x, y = torch.randn(64, 10, device=device) * 4, torch.randint(0, 10, (64,), device=device)
    with torch.no_grad():
        got = model(x, y)
        with torch.autocast(device, dtype=dtype):
            expected = OpsInForward.forward(reference, x.to(dtype), y)
    assert got["h"].dtype == FLOAT  # the model's outputs are fp32
    h = expected["h"].double()
    in_fp32 = 0
    for name, value in expected.items():
        assert torch.equal(got[name], value.float()), name
        if value.dtype == FLOAT:  # on the list: fp32 from the 16-bit values, so within fp32's rounding of float64
            in_fp32 += 1
            exact = {"cross_entropy": lambda: F.cross_entropy(h, y), "nll_loss": lambda: F.nll_loss(h, y),
                     "mse_loss": lambda: F.mse_loss(h, torch.ones_like(h)),
                     "log_softmax": lambda: F.log_softmax(h, -1), "softmax": lambda: h.softmax(-1),
                     "exp": lambda: h.exp(), "pow": lambda: h.pow(2), "sum": lambda: h.sum()}[name]()
            # torch's CUDA cross-entropy (fp32 from 16-bit logits near 100) was 4e-5 to 8e-5 off
            # float64 on an H200, 2026-11-26: still far inside a 16-bit result's rounding.
            rtol = 1e-5 if device == "cpu" else 2e-4
            torch.testing.assert_close(got[name].double(), exact, rtol=rtol, atol=1e-6)
    assert in_fp32 >= 3  # the losses everywhere; more on CUDA


def test_what_keep_fp32_picks_stays_fp32_under_the_models_autocast():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    fp32_head = copy.deepcopy(model[2])
    seen = []
    model[2].register_forward_hook(lambda module, args, out: seen.append((args[0], out)))
    mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), keep_fp32=["2"])
    with torch.no_grad():
        model(torch.randn(4, 16))
    x, out = seen[0]
    assert x.dtype == FLOAT and model[2].weight.dtype == FLOAT
    assert torch.equal(out, fp32_head(x))  # not autocast's 16-bit linear


def t5():
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=128, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2,
                                   num_heads=4, decoder_start_token_id=0, pad_token_id=0)
    return transformers.T5ForConditionalGeneration(config).train()


def t5_batch(step):
    g = torch.Generator().manual_seed(step)
    return {"input_ids": torch.randint(1, 128, (4, 16), generator=g),
            "labels": torch.randint(1, 128, (4, 8), generator=g)}


STEPS = 4


def test_t5_in_fp16_at_the_default_scale_skips_what_torch_amp_skips():
    """T5 computes its cross-entropy in forward. Computed in fp16 its
    gradient starts at the loss scale, 65536, beyond fp16's range: every
    first step was skipped."""
    model = t5()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    amp_losses, amp_skipped = [], []
    for step in range(STEPS):
        with torch.autocast("cpu", dtype=HALF):
            loss = model(**t5_batch(step)).loss
        scaler.scale(loss).backward()
        scale = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        amp_losses.append(loss.item())
        amp_skipped.append(scaler.get_scale() < scale)

    model = t5()
    model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    losses, skipped = [], []
    for step in range(STEPS):
        out = model(**t5_batch(step))
        # The loss is fp32 computed from the 16-bit logits, not an fp16 value widened.
        labels = t5_batch(step)["labels"]
        exact = F.cross_entropy(out.logits.double().flatten(0, 1), labels.flatten())
        assert out.loss.item() == pytest.approx(exact.item(), rel=1e-6)
        scaler.scale(out.loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        losses.append(out.loss.item())
        skipped.append(scaler.last_step_skipped)
    assert skipped == amp_skipped == [False] * STEPS
    assert scaler.get_scale() == 2.0**16
    assert losses == pytest.approx(amp_losses, rel=2e-3)


def test_the_models_forward_keeps_its_signature():
    """transformers reads it: Trainer keeps the dataset columns the forward
    takes, generate() builds an attention mask where it takes one."""
    import inspect

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=2,
                                                                 n_positions=16))
    before = inspect.signature(model.forward)
    model, *_ = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert inspect.signature(model.forward) == before
    assert "attention_mask" in inspect.signature(model.forward).parameters


def test_a_compiled_model_runs_its_forward_under_autocast():
    torch.manual_seed(0)
    model = OpsInForward()
    eager = copy.deepcopy(model)
    eager, *_ = mpgemm.amp.prepare(eager, torch.optim.SGD(eager.parameters(), lr=0.1))
    compiled = torch.compile(model)
    compiled, *_ = mpgemm.amp.prepare(compiled, torch.optim.SGD(compiled.parameters(), lr=0.1))
    x, y = torch.randn(8, 10) * 4, torch.randint(0, 10, (8,))
    with torch.no_grad():
        expected, got = eager(x, y), compiled(x, y)
    torch.testing.assert_close(got["cross_entropy"], expected["cross_entropy"], rtol=1e-6, atol=1e-6)


def test_a_forward_set_on_the_instance_is_warned_about():
    model = OpsInForward()
    model.forward = model.forward  # as hook libraries patch a module
    with pytest.warns(UserWarning, match="forward was replaced on the instance .* compute in 16 bits"):
        mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
