"""mpgemm.fuse on the layers of transformers' encoders and decoders: an MLP
block split between two children (BERT's Intermediate and Output, traced in
place as the layer's "halves"), a forward that passes its **kwargs on to its
attention module, transformers' gradient checkpointing wrapper, and a
dropout function that returns its input (BART's and OPT's layers). Which
chains it finds, that they run as one mpgemm.mlp and train as the layers do,
that the keywords, hooks and checkpointing still reach what they reached,
and that a layer whose halves, keywords or dropout changed since fuse() runs
its own forward."""

import copy
import functools
import pickle
import warnings

import pytest
import torch
import torch.nn.functional as F

import mpgemm
from mpgemm.fusion import fuse, fusion_report
from support import (assert_compiled_fused_trains_as_unfused, assert_fused_within_prepared_deviation, node_names,
                     output_of, train_fused_prepared_and_fp32)

MLP_NODE = "MpgemmMlpBackward"


class Attention(torch.nn.Module):
    """An attention stand-in taking keywords, as transformers' do: its
    output and its scores, as a tuple."""

    def __init__(self, d):
        super().__init__()
        # k without a bias, which softmax takes away (its gradient is zero).
        self.q, self.k = torch.nn.Linear(d, d), torch.nn.Linear(d, d, bias=False)

    def forward(self, x, mask=None, scale=1.0, **kwargs):
        scores = self.q(x) @ self.k(x).transpose(-1, -2) * scale
        return torch.softmax(scores.float(), -1).to(x.dtype) @ x, scores


class Intermediate(torch.nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.dense, self.act = torch.nn.Linear(d, hidden), torch.nn.GELU()

    def forward(self, x):
        return self.act(self.dense(x))


class Output(torch.nn.Module):
    def __init__(self, hidden, d):
        super().__init__()
        self.dense, self.dropout, self.norm = torch.nn.Linear(hidden, d), torch.nn.Dropout(0.0), torch.nn.LayerNorm(d)

    def forward(self, h, x):
        return self.norm(self.dropout(self.dense(h)) + x)


class SplitLayer(torch.nn.Module):
    """BERT's layer as transformers writes it: attention taking the layer's
    keywords, then the MLP block split between two children."""

    def __init__(self, d=16, hidden=40):
        super().__init__()
        self.attention, self.intermediate, self.output = Attention(d), Intermediate(d, hidden), Output(hidden, d)

    def forward(self, x, mask=None, **kwargs):
        a, _ = self.attention(x, mask, **kwargs)
        return self.output(self.intermediate(a), a)


class DropoutFunction(torch.nn.Module):
    """BART's feed-forward: F.dropout (or torch.dropout) on the activation,
    its p and training read off the module."""

    def __init__(self, p=0.0, d=16, hidden=40, dropout=F.dropout):
        super().__init__()
        self.p, self.dropout = p, dropout
        self.fc1, self.fc2 = torch.nn.Linear(d, hidden), torch.nn.Linear(hidden, d)

    def forward(self, x):
        h = F.gelu(self.fc1(x))
        if self.dropout is F.dropout:
            h = F.dropout(h, p=self.p, training=self.training)
        else:
            h = torch.dropout(h, self.p, self.training)
        return self.fc2(h)


class OptionalContext(torch.nn.Module):
    """A decoder layer's shape: cross-attention where encoder states are
    given, a flag that returns early; then the MLP block."""

    def __init__(self, d=16, hidden=40):
        super().__init__()
        self.cross = torch.nn.Linear(d, d)
        self.fc1, self.act, self.fc2 = torch.nn.Linear(d, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, d)

    def forward(self, x, context=None, skip=False):
        if skip:
            return x
        if context is not None:
            x = x + self.cross(context)
        return self.fc2(self.act(self.fc1(x)))


class WithTorchAttention(torch.nn.Module):
    """A hand-written encoder layer: torch's MultiheadAttention (which holds
    one linear, out_proj) beside the MLP's linears."""

    def __init__(self, d=16, hidden=40):
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(d, 2, batch_first=True)
        self.fc1, self.act, self.fc2 = torch.nn.Linear(d, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, d)

    def forward(self, x):
        a, _ = self.attn(x, x, x, need_weights=False)
        return self.fc2(self.act(self.fc1(a + x)))


def tokens(batch=2, seq=6):
    return torch.randint(0, 50, (batch, seq))


def bert():
    from transformers import BertConfig, BertForMaskedLM

    return BertForMaskedLM(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                      intermediate_size=40, max_position_embeddings=16, hidden_dropout_prob=0.0,
                                      attention_probs_dropout_prob=0.0, attn_implementation="eager"))


def albert():
    from transformers import AlbertConfig, AlbertForMaskedLM

    return AlbertForMaskedLM(AlbertConfig(vocab_size=50, embedding_size=8, hidden_size=16, num_hidden_layers=2,
                                          num_attention_heads=2, intermediate_size=40, max_position_embeddings=16,
                                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))


def opt():
    from transformers import OPTConfig, OPTForCausalLM

    return OPTForCausalLM(OPTConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, ffn_dim=40,
                                    num_attention_heads=2, word_embed_proj_dim=16, max_position_embeddings=16,
                                    dropout=0.0, bos_token_id=0, eos_token_id=0, pad_token_id=1))


def bart():
    from transformers import BartConfig, BartForConditionalGeneration

    return BartForConditionalGeneration(BartConfig(vocab_size=50, d_model=16, encoder_layers=1, decoder_layers=1,
                                                   encoder_attention_heads=2, decoder_attention_heads=2,
                                                   encoder_ffn_dim=40, decoder_ffn_dim=40, max_position_embeddings=16,
                                                   dropout=0.0, bos_token_id=0, eos_token_id=2, pad_token_id=1,
                                                   decoder_start_token_id=2))


def hidden(batch=2, seq=5):
    return torch.randn(batch, seq, 16)


def per_layer(pattern, count, activation):
    return [(pattern[0].format(i=i), activation, pattern[1].format(i=i)) for i in range(count)]


# name: (builder, example arguments, [(fc1, activation, fc2)], what is left unfused, and why)
MODELS = {
    "split layer": (SplitLayer, lambda: (hidden(),), [("intermediate.dense", "gelu", "output.dense")], None),
    "dropout function": (DropoutFunction, lambda: (hidden(),), [("fc1", "gelu", "fc2")], None),
    "torch.dropout": (lambda: DropoutFunction(dropout=torch.dropout), lambda: (hidden(),), [("fc1", "gelu", "fc2")],
                      None),
    "optional context": (OptionalContext, lambda: (hidden(),), [("fc1", "gelu", "fc2")], None),
    "torch attention beside": (WithTorchAttention, lambda: (hidden(),), [("fc1", "gelu", "fc2")], None),
    "transformers bert": (bert, lambda: (tokens(),),
                          per_layer(("bert.encoder.layer.{i}.intermediate.dense",
                                     "bert.encoder.layer.{i}.output.dense"), 2, "gelu"), None),
    "transformers albert": (albert, lambda: (tokens(),),
                            [("albert.encoder.albert_layer_groups.0.albert_layers.0.ffn", "gelu_tanh",
                              "albert.encoder.albert_layer_groups.0.albert_layers.0.ffn_output")], None),
    "transformers opt": (opt, lambda: (tokens(),),
                         per_layer(("model.decoder.layers.{i}.fc1", "model.decoder.layers.{i}.fc2"), 2, "relu"), None),
    # BART's encoder layer clamps fp16 activations on a test of their values, which fx cannot trace.
    "transformers bart": (bart, lambda: (tokens(),),
                          [("model.decoder.layers.0.fc1", "gelu", "model.decoder.layers.0.fc2")],
                          ("model.encoder.layers.0", "its forward cannot be traced")),
}


def fused_copy(model, *example, left=None):
    fused = copy.deepcopy(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert fuse(fused, *example) is fused
    messages = [str(w.message) for w in caught if "mpgemm.fuse" in str(w.message)]
    if left is None:
        assert messages == []
    else:
        assert len(messages) == 1 and left[0] in messages[0] and left[1] in messages[0], messages
    return fused


@pytest.mark.parametrize("name", MODELS)
def test_finds_the_chains_and_runs_each_as_one_mlp(name):
    build, example, chains, left = MODELS[name]
    model = mpgemm.convert(build())
    args = example()
    fused = fused_copy(model, *args, left=left)
    report = [r for r in fusion_report(fused) if "kind" in r]
    assert [(r["fc1"], r["activation"], r["fc2"]) for r in report] == chains
    assert all(r["fused"] and r["kind"] == "mlp" for r in report)
    assert [n for n, _ in fused.named_modules()] == [n for n, _ in model.named_modules()]
    assert all(isinstance(a, type(b)) for a, b in zip(fused.modules(), model.modules()))
    assert list(fused.state_dict()) == list(model.state_dict())
    out = output_of(fused, *args)
    assert MLP_NODE in node_names(out)
    torch.testing.assert_close(out, output_of(model, *args), rtol=2e-3, atol=2e-3)


def run_fused(module, *args, **kwargs):
    """module's output, which must come from its fused forward: one mpgemm.mlp, and no warning that
    the module ran its own forward (on a CPU the two are often the same bits)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = output_of(module, *args, **kwargs)
    assert MLP_NODE in node_names(out)
    return out.detach()


def split_layer_by_mlp(layer, x, *args, **kwargs):
    """What a fused SplitLayer computes: its attention, then mpgemm.mlp of
    its halves' weights (detached)."""
    a, _ = layer.attention(x, *args, **kwargs)
    operands = (layer.intermediate.dense.weight, layer.intermediate.dense.bias, layer.output.dense.weight,
                layer.output.dense.bias)
    return layer.output.norm(mpgemm.mlp(a, *operands, activation="gelu") + a).detach()


def test_a_split_layer_computes_mlp_of_its_halves_weights():
    fused = fused_copy(mpgemm.convert(SplitLayer()), hidden())
    assert [h for h, _ in fused._mpgemm_fusion.halves] == ["intermediate", "output"]
    x = hidden()
    # Both with gradients, where mlp keeps GELU's input (torch's gelu) rather than applying it in the epilogue.
    assert torch.equal(run_fused(fused, x), split_layer_by_mlp(fused, x))


def test_only_the_halves_a_chain_goes_through_run_in_place():
    """torch's MultiheadAttention holds one linear: traced in place it would
    take the layer's trace with it, and its hooks would not run. It stays a
    module of its own, hooks and all."""
    fused = fused_copy(mpgemm.convert(WithTorchAttention()), hidden())
    assert fused._mpgemm_fusion.halves == ()
    calls = []
    fused.attn.register_forward_hook(lambda m, i, o: calls.append(1))
    assert MLP_NODE in node_names(fused(hidden()))
    assert calls == [1]


def test_keywords_reach_the_attention_module():
    model = mpgemm.convert(SplitLayer())
    fused = fused_copy(model, hidden())
    x = hidden()
    outputs = [run_fused(fused, x, None, scale=scale) for scale in (0.5, 2.0)]
    for out, scale in zip(outputs, (0.5, 2.0)):
        assert torch.equal(out, split_layer_by_mlp(model, x, None, scale=scale))
    assert not torch.equal(*outputs)


def test_bert_passes_its_layers_keywords_to_their_attention():
    """transformers' encoder gives each layer keywords (position_ids, ...),
    which the layer passes on to its attention module."""
    model = mpgemm.convert(bert())
    fused = fused_copy(model, tokens())
    given = {}
    for name, m in (("layers", model), ("fused", fused)):
        m.bert.encoder.layer[0].attention.register_forward_pre_hook(
            lambda module, args, kwargs, name=name: given.__setitem__(name, sorted(kwargs)), with_kwargs=True)
    ids = tokens()
    run_fused(fused, ids), model(ids)
    assert given["fused"] == given["layers"] and "position_ids" in given["layers"]


class Child(torch.nn.Module):
    def forward(self, x, module=None, keywords=None, scale=1.0):
        return x * scale


class KeywordsNamedAsCallArguments(torch.nn.Module):
    """Keywords named as call_with_keywords's own arguments reach the child."""

    def __init__(self, d=16, hidden=40):
        super().__init__()
        self.child = Child()
        self.fc1, self.act, self.fc2 = torch.nn.Linear(d, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, d)

    def forward(self, x, **kwargs):
        return self.fc2(self.act(self.fc1(self.child(x, module="m", **kwargs))))


def test_keywords_named_as_the_call_helpers_arguments_are_passed_on():
    model = mpgemm.convert(KeywordsNamedAsCallArguments())
    fused = fused_copy(model, hidden())
    x = hidden()
    out = run_fused(fused, x, keywords="k", scale=2.0)
    operands = (fused.fc1.weight, fused.fc1.bias, fused.fc2.weight, fused.fc2.bias)
    assert torch.equal(out, mpgemm.mlp(x * 2.0, *operands, activation="gelu"))


def scaled(h, **options):
    return h * options.get("scale", 1.0)


class InspectsKeywords(SplitLayer):
    def forward(self, x, mask=None, **kwargs):
        if kwargs.get("skip_mlp"):
            return x
        return super().forward(x, mask)


class ReadsKeywordsInAHelper(SplitLayer):
    """A Python function of the forward's that reads a key of the dict: it
    would read it as missing in the trace."""

    def forward(self, x, mask=None, **kwargs):
        a = scaled(x, **kwargs)
        return self.output(self.intermediate(a), a)


class ReadsAndPassesKeywordsOn(SplitLayer):
    def forward(self, x, mask=None, **kwargs):
        return self.attend(x, **kwargs)

    def attend(self, x, **kwargs):
        a, _ = self.attention(scaled(x, **kwargs), **kwargs)
        return self.output(self.intermediate(a), a)


class ReadsACopy(SplitLayer):
    """A copy of the dict, read, then passed on: the call that takes it is
    not the one the forward passed the dict to."""

    def forward(self, x, mask=None, **kwargs):
        options = dict(**kwargs)
        a, _ = self.attention(scaled(x, **options), **options)
        return self.output(self.intermediate(a), a)


@pytest.mark.parametrize("make", [InspectsKeywords, ReadsKeywordsInAHelper, ReadsAndPassesKeywordsOn, ReadsACopy])
def test_keywords_used_otherwise_leave_the_layer_untraced_and_named(make):
    model = mpgemm.convert(make())
    reference = copy.deepcopy(model)
    with pytest.warns(UserWarning, match="mpgemm.fuse: left unfused .*its forward cannot be traced"):
        fuse(model, hidden())
    assert [r["chain"] for r in fusion_report(model)] == ["the model"]
    x = hidden()
    assert torch.equal(model(x, scale=2.0), reference(x, scale=2.0))


def test_arguments_none_or_a_bool_are_traced_as_the_example_gave_them():
    """The graph has the example's branches: called with context or skip,
    the layer runs its own forward."""
    model = mpgemm.convert(OptionalContext())
    fused = fused_copy(model, hidden())
    assert "cross" not in fused._mpgemm_fusion.code
    x = hidden()
    with torch.no_grad():
        operands = (fused.fc1.weight, fused.fc1.bias, fused.fc2.weight, fused.fc2.bias)
        assert torch.equal(fused(x), mpgemm.mlp(x, *operands, activation="gelu"))
        assert torch.equal(fused(x, None, False), fused(x))
    for args, kwargs, message in (((x,), {"context": x}, "called with context a value where the example forward "
                                                           "gave it None"),
                                  ((x, None, True), {}, "called with skip True where the example forward gave it "
                                                        "False")):
        once = copy.deepcopy(fused)
        with pytest.warns(UserWarning, match=message):
            out = once(*args, **kwargs)
        assert MLP_NODE not in node_names(out)
        assert torch.equal(out, model(*args, **kwargs))


def test_checkpointed_bert_recomputes_the_fused_forward():
    """transformers wraps each layer's forward for gradient checkpointing;
    the fused layer's class gets the wrapper around its own forward."""
    model = mpgemm.convert(bert())
    fused = fused_copy(model, tokens())
    ids = tokens()
    plain_loss = fused(ids, labels=ids).loss
    plain_loss.backward()
    plain = [p.grad.clone() for p in fused.parameters()]
    fused.zero_grad()
    # transformers 5 names it activation checkpointing; earlier ones, gradient checkpointing.
    (getattr(fused, "activation_checkpointing_enable", None) or fused.gradient_checkpointing_enable)()
    calls = []
    fused.bert.encoder.layer[0].attention.register_forward_hook(lambda m, i, o: calls.append(1))
    loss = fused(ids, labels=ids).loss
    assert MLP_NODE in node_names(loss)
    loss.backward()
    assert len(calls) == 2  # the forward, and its recomputation in backward
    assert torch.equal(loss, plain_loss)
    assert all(torch.equal(p.grad, g) for p, g in zip(fused.parameters(), plain))


def hook_on_intermediate(layer):
    layer.intermediate.register_forward_hook(lambda m, i, o: None)


def subclass_output(layer):
    layer.output.__class__ = type("OutputSubclass", (Output,), {})


def forward_on_output(layer):
    layer.output.forward = layer.output.forward


def new_intermediate_child(layer):
    layer.intermediate.dense = copy.deepcopy(layer.intermediate.dense)


@pytest.mark.parametrize("change", [hook_on_intermediate, subclass_output, forward_on_output, new_intermediate_child])
def test_a_half_changed_after_fuse_runs_the_layers_own_forward(change):
    fused = fused_copy(mpgemm.convert(SplitLayer()), hidden())
    change(fused)
    x = hidden()
    reference = copy.deepcopy(fused)
    reference.__class__ = SplitLayer
    with pytest.warns(UserWarning, match="changed since fuse"):
        out = fused(x)
    assert MLP_NODE not in node_names(out)
    assert torch.equal(out, reference(x))


def test_an_argument_a_layer_only_passes_on_may_differ_from_the_example():
    """BERT's layer passes its attention mask on to its attention module:
    fused on a batch without one, it runs fused on a padded batch."""
    model = mpgemm.convert(bert())
    fused = fused_copy(model, tokens())
    assert fused.bert.encoder.layer[0]._mpgemm_fusion.arguments == ()
    ids, mask = tokens(), torch.ones(2, 6, dtype=torch.long)
    mask[0, 3:] = 0
    masks = []
    fused.bert.encoder.layer[0].attention.register_forward_pre_hook(lambda m, args: masks.append(args[1]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no layer runs its own forward
        out = fused(ids, attention_mask=mask).logits
    assert MLP_NODE in node_names(out)
    assert masks[0] is not None  # the padded batch's mask reached the attention
    torch.testing.assert_close(out, model(ids, attention_mask=mask).logits, rtol=2e-3, atol=2e-3)


class KeywordOnlyAfterArgs(torch.nn.Module):
    def __init__(self, d=16, hidden=40):
        super().__init__()
        self.fc1, self.act, self.fc2 = torch.nn.Linear(d, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, d)

    def forward(self, x, *unused, scale=1.0):
        return self.fc2(self.act(self.fc1(x * scale)))


def test_a_positional_argument_past_the_named_ones_runs_the_own_forward():
    """fx puts keyword-only parameters before *args: a further positional
    argument would bind to scale in the graph's function."""
    model = mpgemm.convert(KeywordOnlyAfterArgs())
    fused = fused_copy(model, hidden())
    x, extra = hidden(), torch.full((1,), 3.0)
    run_fused(fused, x, scale=2.0)
    with pytest.warns(UserWarning, match="called with 2 positional arguments"):
        out = fused(x, extra)
    assert torch.equal(out, model(x, extra))


def decorated(forward):
    @functools.wraps(forward)
    def wrapper(self, *args, old_context=None, **kwargs):
        return forward(self, *args, **kwargs)
    return wrapper


class DecoratedForward(OptionalContext):
    forward = decorated(OptionalContext.forward)


def test_an_example_call_that_does_not_bind_to_the_forward_is_named():
    """Its arguments' kinds are unknown, so none could be traced as given."""
    model = mpgemm.convert(DecoratedForward())
    with pytest.warns(UserWarning, match="its example call does not bind to its forward's parameters"):
        fuse(model, hidden(), old_context=None)
    assert [r["fused"] for r in fusion_report(model)] == [False]


def test_a_global_module_hook_runs_the_layers_own_forward():
    """A global hook sees every module's call, the halves' included, which
    the graph runs in place."""
    fused = fused_copy(mpgemm.convert(SplitLayer()), hidden())
    seen = []
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, i, o: seen.append(type(m).__name__))
    try:
        with pytest.warns(UserWarning, match="a global module hook is set"):
            fused(hidden())
    finally:
        handle.remove()
    assert "Intermediate" in seen and "Output" in seen


def test_a_dropout_function_after_a_batch_norm_leaves_its_chain_as_it_was():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.bn = torch.nn.Conv2d(4, 4, 3, padding=1), torch.nn.BatchNorm2d(4)

        def forward(self, x):
            return F.relu(F.dropout(self.bn(self.conv(x)), p=0.1, training=self.training))

    fused = fused_copy(Block().eval(), torch.randn(1, 4, 8, 8))
    assert [(r["kind"], r["fused"], r["relu"]) for r in fusion_report(fused)] == [("batch_norm", True, False)]


def test_a_half_hooked_at_fuse_leaves_its_chain_named_and_its_hook_running():
    model = mpgemm.convert(SplitLayer())
    calls = []
    model.output.register_forward_pre_hook(lambda m, i: calls.append(1))
    with pytest.warns(UserWarning, match="mpgemm.fuse: left unfused .*a hook on a module of the chain"):
        fuse(model, hidden())
    assert [r["fused"] for r in fusion_report(model)] == [False]
    calls.clear()
    assert MLP_NODE not in node_names(model(hidden()))
    assert calls == [1]


def test_a_dropout_function_that_drops_keeps_the_chain_apart():
    """p > 0 in training drops: no chain at fuse(); one fused in eval runs
    the layers' own forward once training or p changes."""
    model = mpgemm.convert(DropoutFunction(p=0.5))
    assert fusion_report(fused_copy(model, hidden())) == []
    fused = fused_copy(model.eval(), hidden())
    assert [r["fused"] for r in fusion_report(fused)] == [True]
    assert MLP_NODE in node_names(fused(hidden()))
    fused.train()
    with pytest.warns(UserWarning, match=r"\.training changed since fuse"):
        assert MLP_NODE not in node_names(fused(hidden()))
    zero = fused_copy(mpgemm.convert(DropoutFunction(p=0.0)), hidden())
    zero.p = 0.1
    with pytest.warns(UserWarning, match=r"\.p changed since fuse"):
        assert MLP_NODE not in node_names(zero(hidden()))


@pytest.mark.parametrize("dtype, fuse_first", [(torch.float16, False), (torch.bfloat16, True)])
def test_bert_under_prepare_within_torch_amps_deviation(dtype, fuse_first):
    batches = [tokens(4, 8) for _ in range(4)]

    def runs_mlp(loss):
        assert MLP_NODE in node_names(loss)

    runs = train_fused_prepared_and_fp32(bert(), batches, lambda model, ids: model(ids, labels=ids).loss, dtype,
                                         fuse_first, runs_mlp)
    assert_fused_within_prepared_deviation(runs)


def test_fused_bert_pickles_copies_and_loads_checkpoints_both_ways():
    model = mpgemm.convert(bert())
    fused = fused_copy(model, tokens())
    plain = bert()
    plain.load_state_dict(fused.state_dict())
    fused.load_state_dict(model.state_dict())
    ids = tokens()
    for clone in (pickle.loads(pickle.dumps(fused)), copy.deepcopy(fused)):
        assert [r["fused"] for r in fusion_report(clone)] == [True, True]
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no layer runs its own forward
            out = clone(ids).logits
        assert MLP_NODE in node_names(out)
        assert torch.equal(out, fused(ids).logits)


def test_torch_compile_trains_the_fused_split_layer():
    # A head after the LayerNorm, whose outputs' sum would give no gradient.
    model = torch.nn.Sequential(SplitLayer(), torch.nn.Linear(16, 3))
    assert_compiled_fused_trains_as_unfused(mpgemm.convert(model), hidden(), "mpgemm.mlp", 2e-3, 2e-3)
