"""Checkpoints of a prepared model: the model's, optimizer's and scaler's
state dicts resume bitwise exactly whatever order they load in, fp16 and
bf16, a CNN with batch norms and a transformers model; the model's state
dict holds the fp32 masters and loads into the plain fp32 model. Reference:
the same run, not interrupted."""

import io
import itertools

import pytest
import torch
import torch.nn.functional as F
import transformers

import mpgemm

SAVE_AFTER, RESUMED_STEPS = 4, 3


def cnn():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16), torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1), torch.nn.BatchNorm2d(32), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10))


def qwen2():
    torch.manual_seed(0)
    config = transformers.Qwen2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    return transformers.Qwen2ForCausalLM(config).train()


def loss_at(name, model, step):
    g = torch.Generator().manual_seed(1000 + step)
    if name == "cnn":
        x, y = torch.randn(8, 3, 12, 12, generator=g), torch.randint(0, 10, (8,), generator=g)
        return F.cross_entropy(model(x), y)
    ids = torch.randint(0, 128, (4, 16), generator=g)
    return model(input_ids=ids, labels=ids).loss


BUILD = {"cnn": cnn, "qwen2": qwen2}


def prepared(name, dtype):
    model = BUILD[name]()
    return mpgemm.amp.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-2), dtype=dtype,
                              init_scale=2.0**10, growth_interval=2)


def train(name, model, optimizer, scaler, steps, first_step):
    losses = []
    for step in range(first_step, first_step + steps):
        loss = loss_at(name, model, step)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def checkpoint(model, optimizer, scaler):
    """The three state dicts as a checkpoint file holds them."""
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict()},
               buffer)
    return buffer.getvalue()


def load(saved):
    """A checkpoint as torch.load's default (weights_only) loader reads it.
    Read once per resume: a loaded optimizer shares the dict's state tensors
    and steps them in place, as torch's optimizers do."""
    return torch.load(io.BytesIO(saved))


def state(model, optimizer, scaler):
    return (list(model.state_dict(keep_vars=True).values()) + optimizer.master_params(),
            scaler.state_dict())


ORDERS = {"cnn": list(itertools.permutations(("model", "optimizer", "scaler"))),
          "qwen2": [("model", "optimizer", "scaler"), ("optimizer", "scaler", "model")]}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", ["cnn", "qwen2"])
def test_resume_is_exact_in_any_load_order(name, dtype):
    model, optimizer, scaler = prepared(name, dtype)
    train(name, model, optimizer, scaler, SAVE_AFTER, 0)
    saved = checkpoint(model, optimizer, scaler)
    expected_losses = train(name, model, optimizer, scaler, RESUMED_STEPS, SAVE_AFTER)
    expected_tensors, expected_scaler = state(model, optimizer, scaler)

    for order in ORDERS[name]:
        resumed = dict(zip(("model", "optimizer", "scaler"), prepared(name, dtype)))
        checkpointed = load(saved)
        for part in order:
            resumed[part].load_state_dict(checkpointed[part])
        losses = train(name, *resumed.values(), RESUMED_STEPS, SAVE_AFTER)
        tensors, scaler_state = state(*resumed.values())
        assert losses == expected_losses, order
        assert scaler_state == expected_scaler, order
        for a, b in zip(expected_tensors, tensors, strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b), order


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_model_state_dict_holds_the_fp32_masters(dtype):
    model, optimizer, scaler = prepared("cnn", dtype)
    train("cnn", model, optimizer, scaler, 3, 0)
    masters = {id(p): m for p, m in zip(optimizer.model_params(), optimizer.master_params())}
    named = dict(model.named_parameters())
    state = model.state_dict()
    for key, value in state.items():
        param = named.get(key)
        if param is not None and id(param) in masters and param.dtype == dtype:
            assert value.dtype == torch.float32 and torch.equal(value, masters[id(param)]), key
            assert not torch.equal(value, param.float()), f"{key}: the 16-bit rounding, not the master"
        elif param is not None:
            assert value.dtype == param.dtype and torch.equal(value, param), key
    # keep_vars=True gives the parameters themselves, as torch does.
    assert all(v is named[k] for k, v in model.state_dict(keep_vars=True).items() if k in named)

    # Into the plain fp32 model: every value exact.
    plain = cnn()
    plain.load_state_dict(state)
    for (key, value), loaded in zip(state.items(), plain.state_dict().values(), strict=True):
        assert torch.equal(loaded, value.to(loaded.dtype)), key
        assert loaded.dtype != torch.float32 or torch.equal(loaded, value), key


def test_a_16_bit_model_state_dict_keeps_masters_the_optimizer_loaded():
    """A checkpoint whose model entries are 16-bit (written before the state
    dict held the masters, or cast by hand) loaded after the optimizer: the
    masters keep their fp32 values wherever the entry is their rounding, and
    take the entry elsewhere."""
    model, optimizer, scaler = prepared("cnn", torch.float16)
    train("cnn", model, optimizer, scaler, 3, 0)
    saved = load(checkpoint(model, optimizer, scaler))
    with_masters = {k for k, p in model.named_parameters() if p.dtype == torch.float16}
    half_state = {k: v.half() if k in with_masters else v for k, v in saved["model"].items()}
    other = cnn()[0].weight.detach().half()
    half_state["0.weight"] = other

    resumed, resumed_opt, _ = prepared("cnn", torch.float16)
    resumed_opt.load_state_dict(saved["optimizer"])
    resumed.load_state_dict(half_state)
    for master, expected in zip(resumed_opt.master_params()[1:], optimizer.master_params()[1:], strict=True):
        assert master.dtype == torch.float32 and torch.equal(master, expected)
    assert any(not torch.equal(m, m.half().float()) for m in optimizer.master_params()[1:]), "masters are 16-bit values"
    # The first conv's entry is another model's weights: taken where they differ.
    first = resumed_opt.master_params()[0]
    differs = other != optimizer.master_params()[0].half()
    assert differs.any()
    assert torch.equal(first[differs], other.float()[differs])
    assert torch.equal(first[~differs], optimizer.master_params()[0][~differs])


def test_a_model_only_checkpoint_loads_exactly_whatever_its_dtype():
    """Weights alone (a published fp16 or float64 checkpoint, no optimizer
    state): the masters take the values, as the plain model would."""
    source = cnn()
    for dtype in (torch.float16, torch.float64):
        state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in source.state_dict().items()}
        model, optimizer, scaler = prepared("cnn", torch.float16)
        train("cnn", model, optimizer, scaler, 2, 0)  # masters away from their initial values
        model.load_state_dict(state)
        named = dict(model.named_parameters())
        for param, master in zip(optimizer.model_params(), optimizer.master_params()):
            name = next(k for k, p in named.items() if p is param)
            assert torch.equal(master, state[name].float()), (dtype, name)
