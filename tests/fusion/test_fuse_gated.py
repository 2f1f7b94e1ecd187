"""mpgemm.fuse on gated MLP blocks (``down(act(gate(x)) * up(x))``), written
as transformers' Llama and Gemma, timm's SwiGLU and by hand: which blocks it
finds, that a fused block runs one mpgemm.gated_mlp and trains as the
unfused layers do (outputs, every gradient and parameter over several
steps, against the unfused model and float64), and that it runs the layers
themselves, in the traced order, wherever gated_mlp would compute something
else (linears on torch, a dropout that drops, a hook, mixed weights)."""

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

import mpgemm
from mpgemm.fusion import fuse, fusion_report
from support import (assert_compiled_fused_trains_as_unfused, assert_fused_within_prepared_deviation,
                     train_fused_prepared_and_fp32)
from test_fuse_mlp import (assert_trains_as_the_layers, dropping, fused_copy, hooked_after_fuse, node_names,
                           unconverted)

GATED_NODE = "MpgemmGatedMlpBackward"  # the autograd node of mpgemm.gated_mlp's output
D, HIDDEN = 16, 40


class OpCalls(TorchFunctionMode):
    """The mpgemm ops called from Python inside the block, by name, in order.
    (support.MpgemmCalls, at the dispatcher, sees the ops gated_mlp calls
    inside it instead: its autograd kernel calls its forward directly.)"""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if isinstance(func, torch._ops.OpOverload) and func.namespace == "mpgemm":
            self.ops.append(func.__name__.split(".")[0])
        return func(*args, **(kwargs or {}))


class Llama(torch.nn.Module):
    """Llama's MLP by hand, its gating written as `how` picks."""

    def __init__(self, how="module", act=torch.nn.SiLU):
        super().__init__()
        self.how = how
        self.gate, self.up = torch.nn.Linear(D, HIDDEN), torch.nn.Linear(D, HIDDEN)
        self.down = torch.nn.Linear(HIDDEN, D, bias=False)
        self.act = act()

    def forward(self, x):
        if self.how == "module":
            return self.down(self.act(self.gate(x)) * self.up(x))
        if self.how == "F.silu":
            return self.down(F.silu(self.gate(x)) * self.up(x))
        if self.how == "up first":
            return self.down(self.up(x) * F.silu(self.gate(x), inplace=True))
        if self.how == "torch.mul":
            return self.down(torch.mul(F.gelu(self.gate(x)), self.up(x)))
        return self.down(F.gelu(self.gate(x), approximate="tanh").mul(self.up(x)))


class TimmSwiGLU(torch.nn.Module):
    """timm's SwiGLU: the up projection before the activation, Dropout and
    Identity modules between the multiply and fc2."""

    def __init__(self, drop=0.0):
        super().__init__()
        self.fc1_g, self.fc1_x = torch.nn.Linear(D, HIDDEN), torch.nn.Linear(D, HIDDEN)
        self.act = torch.nn.SiLU()
        self.drop1 = torch.nn.Dropout(drop)
        self.norm = torch.nn.Identity()
        self.fc2 = torch.nn.Linear(HIDDEN, D)
        self.drop2 = torch.nn.Dropout(drop)

    def forward(self, x):
        x_gate = self.fc1_g(x)
        x = self.fc1_x(x)
        x = self.act(x_gate) * x
        x = self.drop1(x)
        x = self.norm(x)
        x = self.fc2(x)
        return self.drop2(x)


def llama_config(**options):
    from transformers import LlamaConfig

    return LlamaConfig(hidden_size=D, intermediate_size=HIDDEN, num_hidden_layers=1, num_attention_heads=2,
                       num_key_value_heads=2, vocab_size=50, max_position_embeddings=16, bos_token_id=0,
                       eos_token_id=0, pad_token_id=0, **options)


def llama_mlp(hidden_act="silu", bias=False):
    """transformers' LlamaMLP (Gemma's GeGLU with "gelu_pytorch_tanh") after
    a norm, so that its modules' names have a prefix."""
    from transformers.models.llama.modeling_llama import LlamaMLP

    return torch.nn.Sequential(torch.nn.LayerNorm(D), LlamaMLP(llama_config(hidden_act=hidden_act, mlp_bias=bias)))


def hf_llama():
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM(llama_config())


def rows():
    return torch.randn(3, D)


HF = ("1.gate_proj", "1.up_proj", "1.down_proj")
# name: (builder, example input, [(gate, activation, up, down)])
MODELS = {
    "llama by hand": (Llama, rows, [("gate", "silu", "up", "down")]),
    "F.silu": (lambda: Llama("F.silu"), rows, [("gate", "silu", "up", "down")]),
    "up first": (lambda: Llama("up first"), rows, [("gate", "silu", "up", "down")]),
    "torch.mul gelu": (lambda: Llama("torch.mul"), rows, [("gate", "gelu", "up", "down")]),
    "Tensor.mul gelu_tanh": (lambda: Llama("Tensor.mul"), lambda: torch.randn(2, 3, D),
                             [("gate", "gelu_tanh", "up", "down")]),
    "transformers llama": (llama_mlp, rows, [(HF[0], "silu", HF[1], HF[2])]),
    "transformers llama bias": (lambda: llama_mlp(bias=True), rows, [(HF[0], "silu", HF[1], HF[2])]),
    "transformers gemma": (lambda: llama_mlp("gelu_pytorch_tanh", bias=True), rows,
                           [(HF[0], "gelu_tanh", HF[1], HF[2])]),
    "timm swiglu": (TimmSwiGLU, rows, [("fc1_g", "silu", "fc1_x", "fc2")]),
}


def operands(model, gate, up, down):
    """gated_mlp's arguments but x from the named linears."""
    return [t for name in (gate, up, down) for t in (model.get_submodule(name).weight, model.get_submodule(name).bias)]


@pytest.mark.parametrize("name", MODELS)
def test_finds_the_blocks_and_runs_each_as_one_gated_mlp(name):
    build, example, blocks = MODELS[name]
    model = mpgemm.convert(build())
    x = example()
    fused = fused_copy(model, x)
    report = fusion_report(fused)
    assert [(r["gate"], r["activation"], r["up"], r["down"]) for r in report] == blocks
    assert all(r["fused"] and r["kind"] == "gated_mlp" and len(r) == 6 for r in report)  # no "reason"
    # The module tree, names, classes and state_dict keys are the model's.
    assert [n for n, _ in fused.named_modules()] == [n for n, _ in model.named_modules()]
    assert all(isinstance(a, type(b)) for a, b in zip(fused.modules(), model.modules()))
    assert list(fused.state_dict()) == list(model.state_dict())
    with OpCalls() as calls:
        out = fused(x)
    assert calls.ops == ["gated_mlp"] * len(blocks) and GATED_NODE in node_names(out)
    torch.testing.assert_close(out, model(x), rtol=2e-3, atol=2e-3)
    # Each block's module computes exactly mpgemm.gated_mlp of its layers'
    # weights (gated_mlp itself is tested against float64 in tests/ops).
    for gate, activation, up, down in blocks:
        block = fused.get_submodule(gate.rpartition(".")[0])
        h = example()
        with torch.no_grad():
            assert torch.equal(block(h), mpgemm.gated_mlp(h, *operands(fused, gate, up, down), activation=activation))


@pytest.mark.parametrize("name", ["llama by hand", "timm swiglu", "transformers gemma"])
def test_trains_as_the_unfused_layers_within_their_rounding(name):
    """Converted with fp32 weights: both round the products' operands to
    fp16; the layers keep the gate, the up projection and their product in
    fp32 (rounded once, for the down projection), the fused block in fp16
    as torch.amp keeps them. Both stay within fp16's rounding of the float64
    model over four SGD steps, the fused one within a rounding of the
    layers' distance from it."""
    build, example, _ = MODELS[name]
    # The block rounds g, u and p where the layers round p alone: over 150
    # seeds the fused block came up to 1.1e-3 further than the layers.
    assert_trains_as_the_layers(build(), [example() for _ in range(4)], roundings=2)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fuse_first", [False, True])
def test_under_prepare_within_torch_amps_deviation(dtype, fuse_first):
    """transformers' Llama in 16 bits (prepare(), fused before or after it:
    its MLP's linears cast their inputs, its RMSNorm stays fp32) trains
    within the unfused prepared model's deviation from fp32, its MLP as
    mpgemm.gated_mlp."""
    batches = [torch.randint(0, 50, (2, 6)) for _ in range(3)]

    def runs_gated_mlp(loss):
        assert GATED_NODE in node_names(loss)

    runs = train_fused_prepared_and_fp32(hf_llama(), batches, lambda model, ids: model(ids, labels=ids).loss, dtype,
                                         fuse_first, runs_gated_mlp)
    assert [r["fused"] for r in fusion_report(runs["fused"][0])] == [True]
    assert_fused_within_prepared_deviation(runs)


def one_bf16_weight(model):
    """An fp32 x meets a bf16 product in the gate and fp16 ones in the others."""
    model.fc1_g.to(torch.bfloat16)
    return model


@pytest.mark.parametrize("change, reason", [
    (unconverted, "a linear runs on torch"),
    (dropping, "a dropout between its steps drops"),
    (hooked_after_fuse, "a hook on a module of the chain"),
    (one_bf16_weight, "its linears' weights do not make one mpgemm.gated_mlp"),
])
def test_runs_the_layers_where_gated_mlp_would_compute_something_else(change, reason):
    base = TimmSwiGLU()
    model = base if change is unconverted else mpgemm.convert(base)
    fused = fused_copy(model, rows())
    fused, model = change(fused), change(copy.deepcopy(model))
    [entry] = fusion_report(fused)
    assert not entry["fused"] and reason in entry["reason"]
    x = rows().requires_grad_()
    torch.manual_seed(3)
    out = fused(x)
    torch.manual_seed(3)  # the same dropout masks
    ref = model(x)
    assert GATED_NODE not in node_names(out)
    assert torch.equal(out, ref)
    if change is dropping:  # in eval the dropout passes its input through: fused again
        fused.eval()
        assert fusion_report(fused)[0]["fused"] and GATED_NODE in node_names(fused(x))


@pytest.mark.parametrize("name", ["llama by hand", "up first", "timm swiglu"])
def test_unfused_its_layers_run_in_the_traced_order(name):
    """A hook added after fuse() keeps the block unfused; its layers then run
    in the order the forward calls them (the activation before up, up
    first, up between the gate and the activation)."""
    build, example, _ = MODELS[name]
    model = mpgemm.convert(build())
    fused = fused_copy(model, example())
    calls = {}
    for way, m in (("fused", fused), ("model", model)):
        calls[way] = []
        for child_name, child in m.named_children():
            child.register_forward_pre_hook(lambda _, args, n=child_name, seen=calls[way]: seen.append(n))
    x = example()
    assert torch.equal(fused(x), model(x))
    assert calls["fused"] == calls["model"] and len(calls["model"]) >= 3


class ActTwice(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate, self.up, self.down = (torch.nn.Linear(D, D) for _ in range(3))
        self.act = torch.nn.SiLU()

    def forward(self, x):
        return self.down(self.act(self.gate(x)) * self.up(x)) + self.act(x)


class ActOutputTwice(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.gate, self.up, self.down = (torch.nn.Linear(D, D) for _ in range(3))

    def forward(self, x):
        h = F.silu(self.gate(x))
        return self.down(h * self.up(x)) + h


def hooked_at_fuse():
    model = Llama()
    model.up.register_forward_hook(lambda m, i, o: None)
    return model


@pytest.mark.parametrize("make, reason", [
    (ActTwice, "a module of the chain runs more than once per forward"),
    (hooked_at_fuse, "a hook on a module of the chain"),
    (ActOutputTwice, "an output between its steps is used more than once"),
])
def test_refused_blocks_stay_unfused_and_are_named(make, reason):
    model = mpgemm.convert(make())
    reference = copy.deepcopy(model)
    x = rows()
    with pytest.warns(UserWarning, match=f"mpgemm.fuse: left unfused .*{reason}"):
        fuse(model, x)
    [entry] = fusion_report(model)
    assert not entry["fused"] and reason in entry["reason"] and "gate -> silu * up -> down" in entry["chain"]
    assert torch.equal(model(x), reference(x))


class NotGated(torch.nn.Module):
    """Three linears, SiLU and a multiply that do not make a gated block."""

    def __init__(self, how):
        super().__init__()
        self.how = how
        self.gate, self.up, self.down = (torch.nn.Linear(D, D) for _ in range(3))

    def forward(self, x):
        if self.how == "up on another input":
            return self.down(F.silu(self.gate(x)) * self.up(x * 2))
        if self.how == "a scalar factor":
            return self.down(F.silu(self.gate(x)) * 2.0) + self.up(x)
        return self.down(torch.mul(F.silu(self.gate(x)), self.up(x), out=None))  # a keyword argument


@pytest.mark.parametrize("how", ["up on another input", "a scalar factor", "a keyword argument"])
def test_what_is_not_a_gated_block_is_left_alone(how):
    model = mpgemm.convert(NotGated(how))
    fused = fused_copy(model, rows())
    assert fusion_report(fused) == []
    x = rows()
    assert torch.equal(fused(x), model(x))


def test_an_activation_swapped_after_fuse_for_one_gated_mlp_lacks_runs_the_layers():
    model = mpgemm.convert(Llama())
    fused = fused_copy(model, rows())
    fused.act = model.act = torch.nn.ReLU()
    [entry] = fusion_report(fused)
    assert not entry["fused"] and "its activation module changed" in entry["reason"]
    x = rows()
    with pytest.warns(UserWarning, match="the children of the model changed since fuse"):
        out = fused(x)
    assert torch.equal(out, model(x))


class GatedThenMlp(torch.nn.Module):
    """A gated block whose down projection also starts a linear -> GELU ->
    linear chain: one of the two chains keeps it."""

    def __init__(self):
        super().__init__()
        self.gate, self.up = torch.nn.Linear(D, HIDDEN), torch.nn.Linear(D, HIDDEN)
        self.down, self.head = torch.nn.Linear(HIDDEN, D), torch.nn.Linear(D, D)

    def forward(self, x):
        return self.head(F.gelu(self.down(F.silu(self.gate(x)) * self.up(x))))


def test_a_linear_two_chains_share_runs_in_one_of_them():
    model = mpgemm.convert(GatedThenMlp())
    x = rows()
    fused = copy.deepcopy(model)
    with pytest.warns(UserWarning, match="it shares a step with another chain: down -> gelu -> head"):
        fuse(fused, x)
    assert [(r.get("kind"), r["fused"]) for r in fusion_report(fused)] == [("gated_mlp", True), (None, False)]
    out = fused(x)
    assert GATED_NODE in node_names(out)
    torch.testing.assert_close(out, model(x), rtol=2e-3, atol=2e-3)


def test_checkpoints_move_both_ways_and_the_model_pickles_and_copies():
    model = mpgemm.convert(llama_mlp())
    x = rows()
    fused = fused_copy(model, x)
    plain = llama_mlp()
    plain.load_state_dict(fused.state_dict())
    assert list(plain.state_dict()) == list(fused.state_dict())
    fused.load_state_dict(model.state_dict())
    for clone in (pickle.loads(pickle.dumps(fused)), copy.deepcopy(fused)):
        assert [r["fused"] for r in fusion_report(clone)] == [True]
        assert torch.equal(clone(x), fused(x))


def test_torch_compile_trains_the_fused_block():
    assert_compiled_fused_trains_as_unfused(mpgemm.convert(TimmSwiGLU()), torch.randn(2, 5, D), "mpgemm.gated_mlp",
                                            2e-3, 2e-3)
