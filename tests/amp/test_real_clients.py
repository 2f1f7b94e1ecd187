"""Real clients: small BERT, GPT-2 and Llama models built from configs with
transformers (no downloads), and timm's ViT, ConvNeXt and MobileNetV3 where timm imports,
converted and prepared, trained a few steps next to fp32 and torch.amp.

transformers is a test dependency (Makefile); these tests never skip in CI.
timm needs torchvision, which does not install beside the CPU build of torch
used here: its tests run where it imports (the GPU machine's image)."""

import copy
import io
import logging

import pytest
import torch
import torch.nn.functional as F
import transformers

import mpgemm

STEPS = 6
VOCAB, SEQ, BATCH = 128, 16, 4


def bert():
    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=128, max_position_embeddings=SEQ, num_labels=1)
    return transformers.BertForSequenceClassification(config)


def gpt2():
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=2, n_positions=SEQ)
    return transformers.GPT2LMHeadModel(config)


def llama():
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ)
    return transformers.LlamaForCausalLM(config)


# name: (builder, matrix layers on mpgemm, fp32 norm layers)
MODELS = {"bert": (bert, 2 * 6 + 2, 2 * 2 + 1), "gpt2": (gpt2, 2 * 4 + 1, 2 * 2 + 1), "llama": (llama, 2 * 7 + 1, 2 * 2 + 1)}


def data(name, step):
    g = torch.Generator().manual_seed(100 + step % 2)  # two batches, learnt by heart
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    if name == "bert":  # regression on float targets that fp16 cannot hold
        return {"input_ids": ids, "labels": torch.randn(BATCH, generator=g) * 0.1 + 1.3}
    return {"input_ids": ids, "labels": ids}


def build(name):
    torch.manual_seed(0)
    return MODELS[name][0]().train()


def train_fp32(name):
    model = build(name)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(STEPS):
        loss = model(**data(name, step)).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def train_torch_amp(name, dtype=torch.float16):
    model = build(name)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", enabled=dtype == torch.float16)  # bf16 needs no loss scaling
    losses, skipped = [], 0
    for step in range(STEPS):
        with torch.autocast("cpu", dtype=dtype):
            loss = model(**data(name, step)).loss
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scale = scaler.get_scale()
        scaler.update()
        skipped += scaler.get_scale() < scale
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, skipped


def prepared(name, dtype=torch.float16):
    model = build(name)
    return mpgemm.amp.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3), dtype=dtype)


def train_mpgemm(name, micro_batches=1, dtype=torch.float16):
    model, optimizer, scaler = prepared(name, dtype)
    losses = []
    for step in range(STEPS):
        for _ in range(micro_batches):
            loss = model(**data(name, step)).loss
            scaler.scale(loss / micro_batches).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        model.zero_grad()  # the model's, as transformers' Trainer does
        losses.append(loss.item())
    return model, optimizer, scaler, losses


@pytest.mark.parametrize("name", MODELS)
def test_prepare_converts_every_matrix_layer_and_keeps_norms_fp32(name, caplog):
    with caplog.at_level(logging.WARNING, logger="mpgemm"):
        model, optimizer, _ = prepared(name)
    assert not [r for r in caplog.records if "left on torch" in r.getMessage()]
    _, converted, norms = MODELS[name]
    assert len(mpgemm.converted_layers(model)) == converted
    fp32 = [n for n, m in model.named_modules() if any(p.dtype == torch.float32 for p in m.parameters(False))]
    assert len(fp32) == norms, fp32
    assert all(b.dtype != torch.float16 for b in model.buffers())  # rotary inv_freq stays fp32
    if name == "gpt2":
        assert type(model.transformer.h[0].attn.c_attn).__mro__[2] is transformers.pytorch_utils.Conv1D
        assert model.lm_head.weight is model.transformer.wte.weight  # tied weights stay tied


@pytest.mark.parametrize("name", MODELS)
def test_bf16_training_follows_fp32_and_torch_amp_bf16(name):
    reference, (amp, amp_skipped) = train_fp32(name), train_torch_amp(name, torch.bfloat16)
    model, optimizer, scaler, ours = train_mpgemm(name, dtype=torch.bfloat16)
    assert not scaler.is_enabled() and scaler.skipped_steps == amp_skipped == 0
    _, converted, norms = MODELS[name]
    assert len(mpgemm.converted_layers(model)) == converted
    dtypes = [{p.dtype for p in m.parameters(False)} for _, m in model.named_modules()]
    assert dtypes.count({torch.float32}) == norms and {torch.float16} not in dtypes
    assert all(m.dtype == torch.float32 for m in optimizer.master_params())
    assert ours[-1] < 0.95 * ours[0]
    for a, b, c in zip(ours, amp, reference):
        assert a == pytest.approx(b, rel=0.01) and a == pytest.approx(c, rel=0.01)


@pytest.mark.parametrize("name", MODELS)
def test_training_follows_fp32_and_torch_amp(name):
    reference, (amp, amp_skipped) = train_fp32(name), train_torch_amp(name)
    model, optimizer, scaler, ours = train_mpgemm(name)
    assert scaler.skipped_steps == amp_skipped  # fp16 gradients overflow on the same steps
    assert ours[-1] < 0.95 * ours[0]
    for a, b in zip(ours, amp):
        assert a == pytest.approx(b, rel=0.02)
    if not amp_skipped:  # a skipped step leaves the mixed runs one step behind fp32
        for a, b in zip(ours, reference):
            assert a == pytest.approx(b, rel=0.02)


def test_gpt2_accumulation_clipping_and_state_dict_round_trip():
    model, optimizer, scaler, losses = train_mpgemm("gpt2", micro_batches=4)
    assert scaler.skipped_steps == 0 and losses[-1] < 0.9 * losses[0]
    # The standard clipping recipe and the optimizer's method agree on the norm.
    loss = model(**data("gpt2", 0)).loss
    scaler.scale(loss).backward()
    weight = model.transformer.h[0].mlp.c_fc.weight
    assert weight.dtype == torch.float16 and weight.grad.dtype == torch.float32  # the master's, summed in fp32
    scaler.unscale_(optimizer)
    norm = optimizer.clip_grad_norm_(float("inf"))
    assert torch.nn.utils.clip_grad_norm_(model.parameters(), float("inf")) == pytest.approx(norm.item(), rel=1e-5)
    optimizer.zero_grad()
    # state_dict -> a plain fp32 model, and pretrained fp32 weights -> a prepared model.
    fresh = gpt2()
    fresh.load_state_dict(model.state_dict())
    batch = data("gpt2", 1)
    with torch.no_grad():
        torch.testing.assert_close(fresh(**batch).loss, model(**batch).loss, rtol=2e-2, atol=0)
    pretrained = build("gpt2").state_dict()
    model.load_state_dict(pretrained)
    names = {id(p): n for n, p in model.named_parameters()}
    for param, master in zip(optimizer.model_params(), optimizer.master_params()):
        assert torch.equal(master, pretrained[names[id(param)]])


@pytest.mark.parametrize("name", MODELS)
def test_prepared_models_save_whole_and_deep_copy(name):
    model, *_ = train_mpgemm(name)
    model.eval()  # no dropout
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    batch = data(name, 2)
    with torch.no_grad():
        expected = model(**batch).logits
        for other in (torch.load(buffer, weights_only=False), copy.deepcopy(model)):
            assert torch.equal(other(**batch).logits, expected)


def test_float_labels_keep_their_values():
    model, *_ = prepared("bert")
    batch = data("bert", 0)
    with torch.no_grad():
        out = model(**batch)
    assert out.loss.item() == pytest.approx(F.mse_loss(out.logits.squeeze(-1), batch["labels"]).item(), rel=1e-6)
    rounded = F.mse_loss(out.logits.squeeze(-1), batch["labels"].half().float()).item()
    assert out.loss.item() != pytest.approx(rounded, rel=1e-6)


@pytest.mark.parametrize("arch", ["vit_tiny_patch16_224", "convnext_atto", "mobilenetv3_small_050"])
def test_timm_models_train_under_prepare_as_under_torch_amp(arch, caplog):
    timm = pytest.importorskip("timm", reason="timm needs torchvision, which does not install beside CPU torch here")
    size = {"img_size": 64} if arch.startswith("vit") else {}

    def build():
        torch.manual_seed(0)
        return timm.create_model(arch, pretrained=False, num_classes=10, **size)

    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(4, 3, 64, 64, generator=g), torch.randint(0, 10, (4,), generator=g)

    def train(model, optimizer, scaler, autocast):
        losses, skipped = [], 0
        for _ in range(5):
            with torch.autocast("cpu", dtype=torch.float16, enabled=autocast):
                loss = F.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scale = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            skipped += scaler.get_scale() < scale
            optimizer.zero_grad()
            losses.append(loss.item())
        return losses, skipped

    model = build()
    amp_losses, amp_skipped = train(model, torch.optim.AdamW(model.parameters(), lr=1e-3),
                                    torch.amp.GradScaler("cpu"), autocast=True)
    model = build()
    linears = sum(isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)) for m in model.modules())
    with caplog.at_level("WARNING", logger="mpgemm.convert"):
        model, optimizer, scaler = mpgemm.amp.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))
    assert "timm.layers.linear.Linear" not in caplog.text  # converted without include=
    assert len(mpgemm.converted_layers(model)) >= linears - 1
    losses, skipped = train(model, optimizer, scaler, autocast=False)
    # MobileNetV3 overflows fp16 at the default scale in its first steps, under torch.amp too.
    assert skipped == amp_skipped and losses[-1] < losses[0]
    assert losses == pytest.approx(amp_losses, rel=2e-2)
