"""mpgemm.fuse on transformers' MLP blocks (linear -> GELU or ReLU ->
linear), written as the bench's GPT-2 block, timm, torchvision and
transformers write them: which chains it finds, that a fused chain runs one
mpgemm.mlp and trains as the unfused layers do (outputs, every gradient and
parameter over several steps, against the unfused model and float64), and
that it runs the layers themselves wherever mlp would compute something
else (linears on torch, a dropout that drops, a hook, mixed weights)."""

import copy
import pickle
import warnings

import pytest
import torch
import torch.nn.functional as F

import mpgemm
from mpgemm.fusion import fuse, fusion_report
from mpgemm.testing import relative_error
from mpgemm.tools import models
from support import (assert_compiled_fused_trains_as_unfused, assert_fused_within_prepared_deviation, node_names,
                     output_of, train_fused_prepared_and_fp32)

MLP_NODE = "MpgemmMlpBackward"  # the autograd node of mpgemm.mlp's output


class TimmMlp(torch.nn.Module):
    """timm's Mlp: Dropout and Identity modules between the steps."""

    def __init__(self, d=16, hidden=40, act=torch.nn.GELU, drop=0.0):
        super().__init__()
        self.fc1 = torch.nn.Linear(d, hidden)
        self.act = act()
        self.drop1 = torch.nn.Dropout(drop)
        self.norm = torch.nn.Identity()
        self.fc2 = torch.nn.Linear(hidden, d)
        self.drop2 = torch.nn.Dropout(drop)

    def forward(self, x):
        x = self.fc1(x)
        x = self.act(x)
        x = self.drop1(x)
        x = self.norm(x)
        x = self.fc2(x)
        return self.drop2(x)


def torchvision_mlp_block(d=16, hidden=40):
    """torchvision's MLPBlock: a Sequential of Linear, GELU, Dropout, Linear, Dropout."""
    return torch.nn.Sequential(torch.nn.Linear(d, hidden), torch.nn.GELU(), torch.nn.Dropout(0.0),
                               torch.nn.Linear(hidden, d), torch.nn.Dropout(0.0))


class Functional(torch.nn.Module):
    """The activation as a function of the forward's: `how` picks which."""

    def __init__(self, how, d=16, hidden=40):
        super().__init__()
        self.how = how
        self.up, self.down = torch.nn.Linear(d, hidden), torch.nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        h = self.up(x)
        if self.how == "gelu_tanh":
            h = F.gelu(h, approximate="tanh")
        elif self.how == "relu_":
            h = F.relu(h, inplace=True)
        else:
            h = h.relu()
        return self.down(h)


def gpt2_block():
    return models.TransformerBlock(16, 2, 40)


def hf_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=50, n_positions=12, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


def tokens(batch=2, seq=6):
    return torch.randint(0, 50, (batch, seq))


# name: (builder, example input, [(fc1, activation, fc2)])
MODELS = {
    "gpt2 block": (gpt2_block, lambda: torch.randn(2, 5, 16), [("mlp.c_fc", "gelu_tanh", "mlp.c_proj")]),
    "timm mlp": (TimmMlp, lambda: torch.randn(3, 16), [("fc1", "gelu", "fc2")]),
    "timm mlp relu": (lambda: TimmMlp(act=torch.nn.ReLU), lambda: torch.randn(3, 16), [("fc1", "relu", "fc2")]),
    "torchvision mlp": (torchvision_mlp_block, lambda: torch.randn(3, 16), [("0", "gelu", "3")]),
    "F.gelu tanh": (lambda: Functional("gelu_tanh"), lambda: torch.randn(3, 16), [("up", "gelu_tanh", "down")]),
    "F.relu_": (lambda: Functional("relu_"), lambda: torch.randn(3, 16), [("up", "relu", "down")]),
    "Tensor.relu": (lambda: Functional("relu"), lambda: torch.randn(3, 16), [("up", "relu", "down")]),
    "transformers gpt2": (hf_gpt2, tokens, [(f"transformer.h.{i}.mlp.c_fc", "gelu_tanh", f"transformer.h.{i}.mlp.c_proj")
                                            for i in range(2)]),
}


def fused_copy(model, *example):
    fused = copy.deepcopy(model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing here is refused
        assert fuse(fused, *example) is fused
    return fused


@pytest.mark.parametrize("name", MODELS)
def test_finds_the_chains_and_runs_each_as_one_mlp(name):
    build, example, chains = MODELS[name]
    torch.manual_seed(0)
    model = mpgemm.convert(build())
    x = example()
    fused = fused_copy(model, x)
    report = fusion_report(fused)
    assert [(r["fc1"], r["activation"], r["fc2"]) for r in report] == chains
    assert all(r["fused"] and r["kind"] == "mlp" for r in report)
    # The module tree, names, classes and state_dict keys are the model's.
    assert [n for n, _ in fused.named_modules()] == [n for n, _ in model.named_modules()]
    assert all(isinstance(a, type(b)) for a, b in zip(fused.modules(), model.modules()))
    assert list(fused.state_dict()) == list(model.state_dict())
    out = output_of(fused, x)
    assert MLP_NODE in node_names(out)
    torch.testing.assert_close(out, output_of(model, x), rtol=2e-3, atol=2e-3)
    # Each chain's module computes exactly mpgemm.mlp of its layers' weights
    # (mlp itself is tested against float64 in tests/ops/test_mlp.py).
    for fc1, activation, fc2 in chains:
        block = fused.get_submodule(fc1.rpartition(".")[0])
        (w1, b1), (w2, b2) = (weight_and_bias(fused.get_submodule(n)) for n in (fc1, fc2))
        h = torch.randn(3, w1.shape[1])
        with torch.no_grad():
            assert torch.equal(block(h), mpgemm.mlp(h, w1, b1, w2, b2, activation=activation))


def weight_and_bias(layer):
    """A linear layer's weight as (out, in), and its bias (transformers' Conv1D holds (in, out))."""
    return (layer.weight if isinstance(layer, torch.nn.Linear) else layer.weight.t()), layer.bias


def train(model, batches, steps_out):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x in batches:
        x = x.detach().to(next(model.parameters()).dtype).requires_grad_()
        out = model(x)
        out.float().square().mean().backward()
        steps_out.append((out.detach(), x.grad))
        optimizer.step()
        optimizer.zero_grad()
    return model


@pytest.mark.parametrize("name", ["gpt2 block", "timm mlp", "F.relu_"])
def test_trains_as_the_unfused_layers_within_their_rounding(name):
    """Converted with fp32 weights: both round the products' operands to
    fp16; the layers keep GELU's input and output in fp32 (h rounded once,
    for the second product), the fused chain in fp16 as torch.amp keeps
    them (z rounded, then h). Both stay within fp16's rounding of the
    float64 model over four SGD steps, the fused one within a rounding of
    the layers' distance from it."""
    build, example, _ = MODELS[name]
    torch.manual_seed(1)
    base = build()
    assert_trains_as_the_layers(base, [example() for _ in range(4)])


def assert_trains_as_the_layers(base, batches, roundings=1):
    """`base` converted and fused, converted alone and in float64, trained
    on `batches`: the fused model's outputs, input gradients and parameters
    within fp16's rounding of float64's, and no further from them than the
    layers' but for `roundings` roundings (1e-3 each, about two of fp16's
    unit roundoff)."""
    runs = {}
    for way in ("fused", "layers", "float64"):
        model = copy.deepcopy(base)
        model = model.double() if way == "float64" else mpgemm.convert(model)
        if way == "fused":
            model = fused_copy(model, batches[0])
        runs[way] = (train(model, batches, steps := []), steps)
    (fused, fused_steps), (_, layer_steps), (exact, exact_steps) = runs["fused"], runs["layers"], runs["float64"]
    for (out, grad_x), (lout, lgrad_x), (eout, egrad_x) in zip(fused_steps, layer_steps, exact_steps):
        for got, ref in ((out, eout), (grad_x, egrad_x)):
            assert relative_error(got.double(), ref) < 4e-3
        for got, layer, ref in ((out, lout, eout), (grad_x, lgrad_x, egrad_x)):
            assert relative_error(got.double(), ref) <= relative_error(layer.double(), ref) + 1e-3 * roundings
    for (pname, p), q in zip(fused.named_parameters(), exact.parameters()):
        assert relative_error(p.double(), q) < 4e-3, pname


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fuse_first", [False, True])
def test_under_prepare_within_torch_amps_deviation(device, dtype, fuse_first):
    """transformers' GPT-2 in 16 bits (prepare(), fused before or after it)
    trains within the unfused prepared model's deviation from fp32, its
    MLPs as mpgemm.mlp (on CUDA, autocast computes NewGELUActivation's pow
    in fp32: prepare() casts its output back for c_proj)."""
    torch.manual_seed(0)
    batches = [tokens(4, 8).to(device) for _ in range(4)]

    def runs_mlp(loss):
        assert MLP_NODE in node_names(loss)

    runs = train_fused_prepared_and_fp32(hf_gpt2().to(device), batches, lambda model, ids: model(ids, labels=ids).loss,
                                         dtype, fuse_first, runs_mlp)
    assert_fused_within_prepared_deviation(runs)


def test_an_activation_whose_output_prepare_casts_back_is_fused(monkeypatch):
    """An activation computed in fp32 under autocast (transformers' GELUs on
    CUDA): prepare()'s cast of the second linear's input replaces its output
    before that linear runs; fuse() checks the chain ahead of the cast."""
    monkeypatch.setattr(torch.nn.GELU, "forward", lambda self, x: F.gelu(x, approximate=self.approximate).float())
    model = TimmMlp()
    model, _, _ = mpgemm.amp.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    fused = fused_copy(model, torch.randn(3, 16))  # refuses nothing
    assert MLP_NODE in node_names(fused(torch.randn(3, 16, requires_grad=True)))


def unconverted(model):
    return model  # the linears run torch's forward


def dropping(model):
    model.drop1.p = 0.5
    return model


def hooked_after_fuse(model):
    model.act.register_forward_hook(lambda m, i, o: o * 2)
    return model


def mixed_weights(model):
    model.fc1.to(torch.float16)
    model.fc2.to(torch.bfloat16)
    return model


def one_bf16_weight(model):
    """An fp32 x meets an fp16 product in fc1 and a bf16 one in fc2."""
    model.fc2.to(torch.bfloat16)
    return model


@pytest.mark.parametrize("change, reason", [
    (unconverted, "a linear runs on torch"),
    (dropping, "a dropout between its steps drops"),
    (hooked_after_fuse, "a hook on a module of the chain"),
    (mixed_weights, "its linears' weights do not make one mpgemm.mlp"),
    (one_bf16_weight, "its linears' weights do not make one mpgemm.mlp"),
])
def test_runs_the_layers_where_mlp_would_compute_something_else(change, reason):
    torch.manual_seed(2)
    base = TimmMlp()
    model = base if change is unconverted else mpgemm.convert(base)
    fused = fused_copy(model, torch.randn(3, 16))
    fused, model = change(fused), change(copy.deepcopy(model))
    [entry] = fusion_report(fused)
    assert not entry["fused"] and reason in entry["reason"]
    x = torch.randn(3, 16, requires_grad=True)
    torch.manual_seed(3)
    out = fused(x)
    torch.manual_seed(3)  # the same dropout mask
    ref = model(x)
    assert MLP_NODE not in node_names(out)
    assert torch.equal(out, ref)
    if change is dropping:  # in eval the dropout passes its input through: fused again
        fused.eval()
        model.eval()
        assert fusion_report(fused)[0]["fused"] and MLP_NODE in node_names(fused(x))


def test_a_gelu_changed_to_its_tanh_form_after_fuse_runs_that_form():
    torch.manual_seed(4)
    fused = fused_copy(mpgemm.convert(TimmMlp()), torch.randn(3, 16))
    fused.act.approximate = "tanh"
    x = torch.randn(3, 16, requires_grad=True)
    assert MLP_NODE in node_names(fused(x))
    operands = [t.detach() for t in (x, fused.fc1.weight, fused.fc1.bias, fused.fc2.weight, fused.fc2.bias)]
    with torch.no_grad():
        out = fused(operands[0])
        assert torch.equal(out, mpgemm.mlp(*operands, activation="gelu_tanh"))
        assert not torch.equal(out, mpgemm.mlp(*operands, activation="gelu"))


class SharedAct(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = (torch.nn.Linear(8, 8) for _ in range(3))
        self.act = torch.nn.GELU()

    def forward(self, x):
        return self.fc3(self.act(self.fc2(self.act(self.fc1(x)))))


def hooked_at_fuse():
    model = TimmMlp()
    model.fc1.register_forward_hook(lambda m, i, o: None)
    return model


@pytest.mark.parametrize("make, reason", [
    (SharedAct, "a module of the chain runs more than once per forward"),
    (hooked_at_fuse, "a hook on a module of the chain"),
])
def test_refused_chains_stay_unfused_and_are_named(make, reason):
    torch.manual_seed(5)
    model = mpgemm.convert(make())
    reference = copy.deepcopy(model)
    x = torch.randn(3, model.fc1.in_features)
    with pytest.warns(UserWarning, match=f"mpgemm.fuse: left unfused .*{reason}"):
        fuse(model, x)
    assert not any(r["fused"] for r in fusion_report(model))
    assert any(reason in r["reason"] for r in fusion_report(model))
    assert torch.equal(model(x), reference(x))


def test_checkpoints_move_both_ways_and_the_model_pickles_and_copies():
    torch.manual_seed(6)
    model = mpgemm.convert(gpt2_block())
    x = torch.randn(2, 5, 16)
    fused = fused_copy(model, x)
    plain = gpt2_block()
    plain.load_state_dict(fused.state_dict())
    fused.load_state_dict(model.state_dict())
    for clone in (pickle.loads(pickle.dumps(fused)), copy.deepcopy(fused)):
        assert [r["fused"] for r in fusion_report(clone)] == [True]
        assert torch.equal(clone(x), fused(x))


def test_torch_compile_trains_the_fused_block():
    torch.manual_seed(7)
    assert_compiled_fused_trains_as_unfused(mpgemm.convert(gpt2_block()), torch.randn(2, 5, 16), "mpgemm.mlp", 2e-3,
                                            2e-3)


class CachesOnSelf(torch.nn.Module):
    """An attention-like module: two linears, no activation, and a forward
    that keeps a tensor on self the first time it runs (a cache)."""

    def __init__(self):
        super().__init__()
        self.q, self.k = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.cache = None

    def forward(self, x):
        if self.cache is None:
            self.cache = self.k(x)
        return self.q(x) @ self.cache.transpose(-1, -2)


def test_tracing_leaves_what_a_forward_keeps_on_self_as_it_was():
    """fx traces the module's forward, which stores one of its proxies on
    self; fuse() puts the attribute back, so the example forward and every
    call after it compute the cache as the module would."""
    model, x = CachesOnSelf(), torch.randn(3, 8)
    fused = fused_copy(model, x)
    assert fusion_report(fused) == []
    with torch.no_grad():
        assert torch.equal(fused(x), model(x)) and torch.equal(fused.cache, model.cache)
