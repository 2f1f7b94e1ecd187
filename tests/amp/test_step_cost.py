"""A training step under mpgemm.amp.prepare() costs no more than torch.amp's
on the same model and batch: bytes autograd saves for backward, aten ops
dispatched, and casts among them (bench/NOTES.md has the figures). Also: the
fp32 master update and the unscale stay one multi-tensor pass each."""

import functools

import pytest
import torch
import torch.nn.functional as F
import transformers

from mpgemm.tools import models, training

DTYPES = {torch.float16: ("torch.amp", "mpgemm"), torch.bfloat16: ("torch.amp bf16", "mpgemm bf16")}


class Logits(torch.nn.Module):
    """transformers' BERT for sequence classification, returning its logits."""

    def __init__(self):
        super().__init__()
        config = transformers.BertConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                                         intermediate_size=1024, max_position_embeddings=64)
        self.bert = transformers.BertForSequenceClassification(config)

    def forward(self, ids):
        return self.bert(input_ids=ids).logits


# name: (fp32 model, input, target, loss), each at a fixed small batch
WORKLOADS = {
    "resnet50": lambda g: (models.resnet50().to(memory_format=torch.channels_last),
                           torch.randn(4, 3, 32, 32, generator=g).to(memory_format=torch.channels_last),
                           torch.randint(0, 1000, (4,), generator=g), F.cross_entropy),
    "gpt2-block": lambda g: (models.TransformerBlock(), torch.randn(2, 32, 768, generator=g),
                             torch.randn(2, 32, 768, generator=g), F.mse_loss),
    "bert": lambda g: (Logits(), torch.randint(0, 1000, (4, 64), generator=g), torch.randint(0, 2, (4,), generator=g),
                       F.cross_entropy),
}


@functools.cache  # the tests compare the same runs: each is measured once
def step_cost(name, way):
    torch.manual_seed(0)
    model, x, target, loss_fn = WORKLOADS[name](torch.Generator().manual_seed(1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    with training.setup(way, model, optimizer, "cpu") as trainer:
        return training.measure_step_cost(trainer, x, target, loss_fn)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("name", WORKLOADS)
def test_step_costs_no_more_than_torch_amp(name, dtype):
    peer_way, our_way = DTYPES[dtype]
    peer, ours = step_cost(name, peer_way), step_cost(name, our_way)
    assert ours.saved_bytes <= peer.saved_bytes, (ours, peer)
    assert ours.ops <= peer.ops and ours.casts <= peer.casts, (ours, peer)


def test_resnet50_saves_no_fp32_activation():
    """BatchNorm takes the 16-bit activations: nothing 4-D is saved in fp32."""
    torch.manual_seed(0)
    model, x, target, loss_fn = WORKLOADS["resnet50"](torch.Generator().manual_seed(1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    saved = []
    with training.setup("mpgemm", model, optimizer, "cpu") as trainer:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append((t.dtype, t.dim())) or t, lambda t: t):
            trainer.step(x, target, loss_fn)
    assert (torch.float32, 4) not in saved and (torch.float16, 4) in saved


def test_master_update_and_unscale_are_one_pass_each():
    torch.manual_seed(0)
    model, x, target, loss_fn = WORKLOADS["gpt2-block"](torch.Generator().manual_seed(1))
    # foreach=True: torch picks it by default for CUDA parameters only.
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, foreach=True)
    with training.setup("mpgemm", model, optimizer, "cpu") as trainer:
        trainer.step(x, target, loss_fn)
        output = trainer.model(x)
        trainer.scaler.scale(loss_fn(output.float(), target)).backward()
        ops = training.DispatchedOps()
        with ops:
            trainer.scaler.step(trainer.optimizer)
    # One unscale and inf check over all gradients (the inverse scale made in
    # double, as GradScaler makes it: two one-element casts); SGD's foreach
    # update of all masters; one copy of all masters into the 16-bit model.
    assert ops.count["unscale_grads_"] == 1 and ops.count["_foreach_copy_"] == 1
    assert ops.count["_foreach_add_"] >= 1 and ops.count["_to_copy"] == 2
    per_tensor = [op for op in ops.count if not op.startswith("_foreach") and op.endswith("_")]
    assert per_tensor == ["unscale_grads_"], ops.count


def test_fused_step_costs_less_than_torch_amp():
    """mpgemm.fuse's chains save less than torch's batch norm and ReLU save
    (y, the statistics and the ReLU's bits; the output of a chain that feeds
    the next chain's convolution is recomputed in backward, not kept) and
    cast nothing more; they dispatch fewer ops than unfused."""
    peer, unfused, fused = (step_cost("resnet50", way) for way in ("torch.amp", "mpgemm", "mpgemm fused"))
    assert fused.saved_bytes < unfused.saved_bytes <= peer.saved_bytes and fused.casts <= peer.casts, (fused, peer)
    assert fused.ops < unfused.ops, (fused, unfused)
