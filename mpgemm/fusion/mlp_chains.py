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
that would drop (p > 0 in training) runs the chain unfused. As for the
convolution's chains, the first linear's output must go to the activation
alone, the activation's to the second linear alone, and no module of the
chain may run twice in one forward.

Whether the chain runs fused is decided at each call, since fuse() may come
before convert() or prepare(): both linears must run mpgemm's forward
(mpgemm.nn.Linear's or Conv1D's), with no hooks but prepare()'s cast of
their inputs.
"""

import dataclasses

import torch
import torch.nn.functional as F

from .. import nn
from ..convert import forward_owner, qualified_name, transformers_conv1d
from ..ops import mlp
from .graph import (global_hooks, has_hooks, input_cast, is_plain, is_relu, module_calls, module_of, past,
                    single_user)

GELU_FORMS = {"none": "gelu", "tanh": "gelu_tanh"}  # torch's `approximate` -> mlp's activation
# GELU modules of other libraries, by the class that defines their forward:
# each computes GELU (the erf form, or the tanh form) of its one input, in
# the input's dtype (some through ops that autocast computes in fp32);
# mpgemm.mlp computes the same function with torch's gelu on the 16-bit
# product, or in the first product's epilogue, in fp32, rounded once, where
# nothing needs GELU's input.
NAMED_ACTIVATIONS = {
    "transformers.activations.GELUActivation": "gelu",
    "transformers.activations.NewGELUActivation": "gelu_tanh",  # GPT-2's "gelu_new"
    "transformers.activations.GELUTanh": "gelu_tanh",
    "timm.layers.activations.GELU": "gelu",
    "timm.layers.activations.GELUTanh": "gelu_tanh",
}


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
        checks: each module takes the one before's output, or, across an
        activation function, runs after it."""
        steps = [self.fc1, *self.before, self.act, *self.after, self.fc2]
        links, producer, same = [], steps[0], True
        for step in steps[1:]:
            if step is None:
                same = False
                continue
            links.append((producer, step, same))
            producer, same = step, True
        return links

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
    return has_candidates(children) and any(module_activation(c) for c in children)


def is_linear_layer(module):
    """torch's Linear or transformers' Conv1D (or a subclass, converted or not)."""
    conv1d = transformers_conv1d()
    return isinstance(module, (torch.nn.Linear, nn.Conv1D)) or (conv1d is not None and isinstance(module, conv1d))


def _linear_operands(module):
    """(weight as (out, in), bias) of a linear layer that runs mpgemm's
    forward, None for one that runs another."""
    forward = type(module).forward
    if forward is nn.Linear.forward:
        return module.weight, module.bias
    if forward is nn.Conv1D.forward:
        return module.weight.t(), module.bias
    return None


def module_activation(module):
    """mlp's name for what an activation module computes, None where mlp has none."""
    owner = forward_owner(type(module))
    if owner is torch.nn.GELU:
        return GELU_FORMS.get(module.approximate)
    if owner is torch.nn.ReLU:
        return "relu"
    return NAMED_ACTIVATIONS.get(qualified_name(owner))


def _is_passable(module):
    return is_plain(module, torch.nn.Identity) or is_plain(module, torch.nn.Dropout)


def _drops(module):
    """Whether a passed module changes its input: a dropout with p > 0 in training."""
    return isinstance(module, torch.nn.Dropout) and module.training and module.p > 0


def _node_activation(root, node):
    """(activation, module name or None) for a node that computes one mlp
    takes: a module, F.gelu of either form, or a ReLU; None otherwise."""
    if node.op == "call_module":
        module = module_of(root, node)
        activation = module_activation(module)
        return (activation, node.target) if activation and len(node.args) == 1 and not node.kwargs else None
    if node.op == "call_function" and node.target is F.gelu and len(node.args) == 1 and \
            set(node.kwargs) <= {"approximate"}:
        form = GELU_FORMS.get(node.kwargs.get("approximate", "none"))
        return (form, None) if form else None
    return ("relu", None) if is_relu(root, node) else None


def fused_call(fc1, fc2, act, passed):
    """(why the chain of these modules would run unfused now, or None; and
    where it runs fused, mlp's arguments but x: (w1, b1, w2, b2,
    activation) and the dtype x is cast to, or None). `act` is the
    activation module, None for a function; `passed` the Identity and
    Dropout modules between the steps."""
    if global_hooks():
        return "a global module hook is set", None
    first, second = _linear_operands(fc1), _linear_operands(fc2)
    if first is None or second is None:
        return "a linear runs on torch (mpgemm.convert or mpgemm.amp.prepare puts it on mpgemm)", None
    (ok1, cast1), (ok2, cast2) = input_cast(fc1), input_cast(fc2)
    # fc2 casting h where fc1 did not cast x would give y another dtype than mlp's (x's).
    if not (ok1 and ok2) or cast2 not in (None, cast1) or (act is not None and has_hooks(act)) or \
            any(has_hooks(m) for m in passed):
        return "a hook on a module of the chain", None
    activation = module_activation(act) if act is not None else None
    if act is not None and activation is None:
        return "its activation module changed to one mpgemm.mlp does not compute", None
    if any(_drops(m) for m in passed):
        return "a dropout between its steps drops (p > 0 in training)", None
    (w1, b1), (w2, b2) = first, second
    # mlp takes one product type, bf16 where any operand is; each linear
    # takes its own, bf16 where its x or weight is. Where one weight is bf16
    # and the other not, an fp32 x would meet two product types unfused:
    # those layers, and layers that do not chain, run (or fail) as they are.
    if (w1.dtype == torch.bfloat16) != (w2.dtype == torch.bfloat16) or w1.shape[0] != w2.shape[-1]:
        return "its linears' weights do not make one mpgemm.mlp", None
    return None, ((w1, b1, w2, b2, activation), cast1)


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
            (w1, b1, w2, b2, activation), cast = call
            if cast is not None and x.is_floating_point() and x.dtype != cast:
                x = x.to(cast)
            return mlp(x, w1, b1, w2, b2, activation=activation or act)
    h = fc1(x)
    for step in before:
        h = step(h)
    h = _ACTIVATION_FUNCTIONS[act](h) if module is None else module(h)
    for step in after:
        h = step(h)
    return fc2(h)


_ACTIVATION_FUNCTIONS = {"gelu": F.gelu, "gelu_tanh": lambda h: F.gelu(h, approximate="tanh"), "relu": torch.relu}


def find_chains(root, graph):
    """(fusable chains, [(MlpChain, reason)] refused) in root's traced
    graph: each chain with the nodes it replaces, in graph order."""
    uses = module_calls(graph)
    found, refused, taken = [], [], set()
    for node in graph.nodes:
        if node in taken or not is_linear_layer(module_of(root, node)) or len(node.args) != 1 or node.kwargs:
            continue
        before = []
        end = past(root, node, _is_passable, before)
        act_node = single_user(end)
        activation = _node_activation(root, act_node) if act_node is not None else None
        if activation is None:
            continue
        after = []
        end = past(root, act_node, _is_passable, after)
        fc2_node = single_user(end)
        if fc2_node is None or not is_linear_layer(module_of(root, fc2_node)) or len(fc2_node.args) != 1 or \
                fc2_node.kwargs:
            continue
        form, act = activation
        chain = MlpChain(node.target, fc2_node.target, form, act, tuple(n.target for n in before),
                         tuple(n.target for n in after))
        names = [node.target, fc2_node.target] + ([act] if act else []) + list(chain.before + chain.after)
        if any(uses[name] > 1 for name in names):
            refused.append((chain, "a module of the chain runs more than once per forward"))
            continue
        fc1, fc2 = module_of(root, node), module_of(root, fc2_node)
        if not (input_cast(fc1)[0] and input_cast(fc2)[0]) or \
                any(has_hooks(root.get_submodule(n)) for n in names[2:]):
            refused.append((chain, "a hook on a module of the chain"))
            continue
        taken.add(fc2_node)
        found.append((chain, node, before + [act_node] + after + [fc2_node]))
    return found, refused


def rewrite(graph, found):
    """Replaces each found chain's nodes by one run_mlp call."""
    for chain, fc1_node, replaced in found:
        last = replaced[-1]
        with graph.inserting_before(last):
            fc1, fc2 = graph.get_attr(chain.fc1), graph.get_attr(chain.fc2)
            act = graph.get_attr(chain.act) if chain.act else chain.activation
            before = tuple(graph.get_attr(n) for n in chain.before)
            after = tuple(graph.get_attr(n) for n in chain.after)
            fused = graph.call_function(run_mlp, (fc1_node.args[0], fc1, act, fc2, before, after))
        last.replace_all_uses_with(fused)
        for node in reversed(replaced):
            graph.erase_node(node)
        graph.erase_node(fc1_node)
    graph.lint()
    return graph
