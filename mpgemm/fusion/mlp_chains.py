"""Finding linear -> activation -> linear chains (a transformer's MLP block:
GELU in either form, or ReLU, between two linear layers) in one module's
traced forward (graph.py), and rewriting each into one call of
:func:`run_mlp`, which runs :func:`mpgemm.mlp` where the chain's layers
compute what mlp computes, and the layers themselves everywhere else.

The linears are torch's ``Linear`` or transformers' ``Conv1D`` (GPT-2's,
weight (in, out)), the activation torch's ``GELU`` or ``ReLU`` module or
function, or a GELU module of transformers or timm named in
NAMED_ACTIVATIONS. Identity and Dropout modules between the steps are passed
over (timm's ``drop1`` and ``norm``, torchvision's ``MLPBlock``); a dropout
that would drop (p > 0 in training) runs the chain unfused. A dropout
function that returns its input as traced (graph.returns_its_input: BART's
activation dropout) is passed over too. In a module whose block is split
between two children (BERT's Intermediate and Output), fuse.py traces those
children in place, so that the chain's names reach into them
("intermediate.dense"). As for the
convolution's chains, the first linear's output must go to the activation
alone, the activation's to the second linear alone, and no module of the
chain may run twice in one forward.

Whether the chain runs fused is decided at each call, since fuse() may come
before convert() or prepare(): both linears must run mpgemm's forward
(mpgemm.nn.Linear's or Conv1D's), with no hooks but prepare()'s cast of
their inputs.

gated_chains.py finds gated MLP blocks with the same linears, activations
(SiLU too), passed modules and rules, for three linears (:func:`block_call`).
"""

import dataclasses

import torch
import torch.nn.functional as F

from .. import nn
from ..convert import forward_owner, qualified_name, transformers_conv1d
from ..ops import mlp
from .graph import (global_hooks, has_hooks, input_cast, is_plain, is_relu, module_calls, module_of, passed_modules,
                    past, replace_with_call, single_user)

GELU_FORMS = {"none": "gelu", "tanh": "gelu_tanh"}  # torch's `approximate` -> mlp's activation
# Activation modules of other libraries, by the class that defines their
# forward: each computes GELU (the erf form, or the tanh form) or SiLU of
# its one input, in the input's dtype (some through ops that autocast
# computes in fp32); mpgemm.mlp and gated_mlp compute the same function with
# torch's gelu (silu) on the 16-bit product, or in fp32 in an epilogue or a
# pass of their own, rounded once.
NAMED_ACTIVATIONS = {
    "transformers.activations.GELUActivation": "gelu",
    "transformers.activations.NewGELUActivation": "gelu_tanh",  # GPT-2's "gelu_new"
    "transformers.activations.GELUTanh": "gelu_tanh",
    "transformers.activations.SiLUActivation": "silu",  # Llama's ACT2FN["silu"]
    "timm.layers.activations.GELU": "gelu",
    "timm.layers.activations.GELUTanh": "gelu_tanh",
}


@dataclasses.dataclass(frozen=True)
class Block:
    """An op that runs a chain of linear layers whole: its name (for the
    reasons a chain runs unfused), the activations it computes, and whether
    the linears' weights, as (out, in) in the chain's order, fit one call."""
    name: str
    activations: frozenset
    fits: object


MLP = Block("mpgemm.mlp", frozenset({"gelu", "gelu_tanh", "relu"}), lambda w1, w2: w1.shape[0] == w2.shape[-1])


@dataclasses.dataclass
class MlpChain:
    """One chain, by the qualified names of its modules in the traced module;
    `act` names the activation module, or is None where a function computes
    it (`activation` says which in either case)."""
    fc1: str
    fc2: str
    activation: str  # as traced: "gelu", "gelu_tanh" or "relu"
    act: str = None
    before: tuple = ()  # Identity and Dropout modules passed over between fc1 and the activation
    after: tuple = ()  # and between the activation and fc2

    def label(self, prefix=""):
        return f"{prefix}{self.fc1} -> {self.activation} -> {prefix}{self.fc2}"

    def links(self):
        """(producer, consumer, same tensor) of the steps the example forward
        checks (step_links)."""
        return step_links([self.fc1, *self.before, self.act, *self.after, self.fc2])

    def report(self, module, prefix=""):
        reason, _ = fused_call(*(module.get_submodule(n) if n else None for n in (self.fc1, self.fc2, self.act)),
                               [module.get_submodule(n) for n in self.before + self.after])
        entry = {"kind": "mlp", "fc1": prefix + self.fc1, "activation": self.activation, "fc2": prefix + self.fc2,
                 "fused": reason is None}
        return entry if reason is None else dict(entry, reason=reason)


def has_candidates(children):
    """Whether a module with these children may hold a chain: two linear
    layers among them (attention modules too, whose forward may call no
    activation; expects_chains tells them apart)."""
    return sum(is_linear_layer(c) for c in children) >= 2


def expects_chains(children):
    """Whether a module whose forward cannot be traced is worth naming: it
    has an activation module mlp computes beside its linears. (One that
    calls an activation function cannot be told from an attention module
    without its trace.)"""
    return has_candidates(children) and any(module_activation(c, MLP.activations) for c in children)


def is_linear_layer(module):
    """torch's Linear or transformers' Conv1D (or a subclass, converted or not)."""
    conv1d = transformers_conv1d()
    return isinstance(module, (torch.nn.Linear, nn.Conv1D)) or (conv1d is not None and isinstance(module, conv1d))


def is_linear_call(root, node):
    """Whether node calls a linear layer on one argument alone."""
    return is_linear_layer(module_of(root, node)) and len(node.args) == 1 and not node.kwargs


def _linear_operands(module):
    """(weight as (out, in), bias) of a linear layer that runs mpgemm's
    forward, None for one that runs another."""
    forward = type(module).forward
    if forward is nn.Linear.forward:
        return module.weight, module.bias
    if forward is nn.Conv1D.forward:
        return module.weight.t(), module.bias
    return None


def module_activation(module, activations):
    """The name of what an activation module computes where it is one of
    `activations` (a Block's), None otherwise."""
    owner = forward_owner(type(module))
    if owner is torch.nn.GELU:
        name = GELU_FORMS.get(module.approximate)
    elif owner is torch.nn.ReLU:
        name = "relu"
    elif owner is torch.nn.SiLU:
        name = "silu"
    else:
        name = NAMED_ACTIVATIONS.get(qualified_name(owner))
    return name if name in activations else None


def is_passable(module):
    """Whether a module between two steps passes its input on (Identity, Dropout)."""
    return is_plain(module, torch.nn.Identity) or is_plain(module, torch.nn.Dropout)


def _drops(module):
    """Whether a passed module changes its input: a dropout with p > 0 in training."""
    return isinstance(module, torch.nn.Dropout) and module.training and module.p > 0


def node_activation(root, node, activations):
    """(activation, module name or None) for a node that computes one of
    `activations` (a Block's): a module, F.gelu of either form, F.silu, or a
    ReLU; None otherwise."""
    if node.op == "call_module":
        module = module_of(root, node)
        activation = module_activation(module, activations)
        return (activation, node.target) if activation and len(node.args) == 1 and not node.kwargs else None
    if node.op == "call_function" and node.target is F.gelu and len(node.args) == 1 and \
            set(node.kwargs) <= {"approximate"}:
        form = GELU_FORMS.get(node.kwargs.get("approximate", "none"))
        return (form, None) if form in activations else None
    if node.op == "call_function" and node.target is F.silu and len(node.args) == 1 and \
            set(node.kwargs) <= {"inplace"}:
        return ("silu", None) if "silu" in activations else None
    return ("relu", None) if "relu" in activations and is_relu(root, node) else None


def step_links(steps):
    """(producer, consumer, same tensor) of a path of steps (module names,
    None for a function) that the example forward checks: each module takes
    the one before's output, or, across a function, runs after it."""
    links, producer, same = [], steps[0], True
    for step in steps[1:]:
        if step is None:
            same = False
            continue
        links.append((producer, step, same))
        producer, same = step, True
    return links


def refusal(root, uses, linears, others):
    """Why fuse() leaves a chain unfused whatever happens later, or None:
    `linears` and `others` name its linear layers and its other modules."""
    if any(uses[name] > 1 for name in (*linears, *others)):
        return "a module of the chain runs more than once per forward"
    if not all(input_cast(root.get_submodule(n))[0] for n in linears) or \
            any(has_hooks(root.get_submodule(n)) for n in others):
        return "a hook on a module of the chain"
    return None


def block_call(block, firsts, last, act, passed):
    """(why a chain of linears would run unfused now, or None; and where it
    runs as one `block`, its arguments but x (each linear's weight and bias,
    in the chain's order), its activation and the dtype x is cast to, or
    None). `firsts` are the linears that take the chain's x, `last` the one
    that gives its output; `act` is the activation module, None for a
    function; `passed` the Identity and Dropout modules between the steps."""
    if global_hooks():
        return "a global module hook is set", None
    linears = (*firsts, last)
    operands = [_linear_operands(m) for m in linears]
    if any(o is None for o in operands):
        return "a linear runs on torch (mpgemm.convert or mpgemm.amp.prepare puts it on mpgemm)", None
    casts = [input_cast(m) for m in linears]
    cast = casts[0][1]
    # The block casts x once, for all of `firsts`; the last linear casting
    # its input where they did not cast x would give y another dtype than the
    # block's (x's).
    if not all(ok for ok, _ in casts) or any(c != cast for _, c in casts[1:-1]) or casts[-1][1] not in (None, cast) \
            or (act is not None and has_hooks(act)) or any(has_hooks(m) for m in passed):
        return "a hook on a module of the chain", None
    activation = module_activation(act, block.activations) if act is not None else None
    if act is not None and activation is None:
        return f"its activation module changed to one {block.name} does not compute", None
    if any(_drops(m) for m in passed):
        return "a dropout between its steps drops (p > 0 in training)", None
    weights = [w for w, _ in operands]
    # The block takes one product type, bf16 where any operand is; each
    # linear takes its own, bf16 where its x or weight is. Where one weight
    # is bf16 and another not, an fp32 x would meet two product types
    # unfused: those layers, and layers that do not chain, run (or fail) as
    # they are.
    if len({w.dtype == torch.bfloat16 for w in weights}) > 1 or not block.fits(*weights):
        return f"its linears' weights do not make one {block.name}", None
    return None, ([t for pair in operands for t in pair], activation, cast)


def cast_input(x, dtype):
    """x as prepare()'s hooks give it to the chain's first linears: in
    `dtype` where they cast (a floating-point x), else as it is."""
    return x.to(dtype) if dtype is not None and x.is_floating_point() and x.dtype != dtype else x


def fused_call(fc1, fc2, act, passed):
    """block_call for an MLP chain: where it runs fused, mlp's arguments
    but x (w1, b1, w2, b2), its activation and the dtype x is cast to."""
    return block_call(MLP, (fc1,), fc2, act, passed)


def run_mlp(x, fc1, act, fc2, before=(), after=()):
    """The chain's forward: ``mpgemm.mlp`` where fused_call finds the chain
    computes what mlp computes, else each step as its module or function
    computes it. `act` is the activation module, or mlp's name of the
    function the forward called; `before` and `after` are the modules passed
    over before and after it."""
    module = None if isinstance(act, str) else act
    if isinstance(x, torch.Tensor):
        _, call = fused_call(fc1, fc2, module, before + after)
        if call is not None:
            operands, activation, cast = call
            return mlp(cast_input(x, cast), *operands, activation=activation or act)
    h = fc1(x)
    for step in before:
        h = step(h)
    h = ACTIVATION_FUNCTIONS[act](h) if module is None else module(h)
    for step in after:
        h = step(h)
    return fc2(h)


# What an activation function a traced forward called computes, by its name.
ACTIVATION_FUNCTIONS = {"gelu": F.gelu, "gelu_tanh": lambda h: F.gelu(h, approximate="tanh"), "relu": torch.relu,
                        "silu": F.silu}


def find_chains(root, graph):
    """(fusable chains, [(MlpChain, reason)] refused) in root's traced
    graph: each chain with the nodes it replaces, in graph order."""
    uses = module_calls(graph)
    found, refused, taken = [], [], set()
    for node in graph.nodes:
        if node in taken or not is_linear_call(root, node):
            continue
        before = []
        end = past(root, node, is_passable, before, functions=True)
        act_node = single_user(end)
        activation = node_activation(root, act_node, MLP.activations) if act_node is not None else None
        if activation is None:
            continue
        after = []
        end = past(root, act_node, is_passable, after, functions=True)
        fc2_node = single_user(end)
        if not is_linear_call(root, fc2_node):
            continue
        form, act = activation
        chain = MlpChain(node.target, fc2_node.target, form, act, passed_modules(before), passed_modules(after))
        reason = refusal(root, uses, (chain.fc1, chain.fc2), ((act,) if act else ()) + chain.before + chain.after)
        if reason is not None:
            refused.append((chain, reason))
            continue
        taken.add(fc2_node)
        found.append((chain, node, before + [act_node] + after + [fc2_node]))
    return found, refused


def rewrite(graph, found):
    """Replaces each found chain's nodes by one run_mlp call."""
    for chain, fc1_node, replaced in found:
        replace_with_call(graph, [fc1_node, *replaced], run_mlp, lambda module: (
            fc1_node.args[0], module(chain.fc1), module(chain.act) if chain.act else chain.activation,
            module(chain.fc2), tuple(map(module, chain.before)), tuple(map(module, chain.after))))
    graph.lint()
    return graph
