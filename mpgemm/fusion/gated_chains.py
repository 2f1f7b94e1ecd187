"""Finding gated MLP blocks (``down(act(gate(x)) * up(x))``: Llama's SwiGLU,
Gemma's GeGLU, timm's SwiGLU) in one module's traced forward (graph.py),
and rewriting each into one call of :func:`run_gated_mlp`, which runs
:func:`mpgemm.gated_mlp` where the block's layers compute what gated_mlp
computes, and the layers themselves everywhere else.

The gate and the up projection are linear layers as mlp_chains.py takes
them, both called on the same x; the activation, on the gate's output, is
SiLU (torch's module or function, transformers' ``SiLUActivation``) or a
GELU mlp_chains.py recognizes; a multiply (``*``, ``torch.mul`` or
``Tensor.mul``, its factors in either order) takes the activation's output
and the up projection's, and the down projection its product. The gate's,
the activation's and the up projection's outputs must go to the next step
alone, and no module of the block may run twice in one forward. Identity
and Dropout modules between the multiply and the down projection (timm's
``drop1`` and ``norm``) are passed over, and whether the block runs fused is
decided at each call, by mlp_chains.py's rules for three linears
(:func:`mlp_chains.block_call`).
"""

import dataclasses
import operator

import torch

from ..ops import gated_mlp
from .graph import module_calls, passed_modules, past, replace_with_call, single_user
from .mlp_chains import (ACTIVATION_FUNCTIONS, Block, block_call, cast_input, is_linear_call, is_linear_layer,
                         is_passable, module_activation, node_activation, refusal, step_links)

MULS = {operator.mul, torch.mul}
MUL_METHODS = {"mul"}

GATED_MLP = Block("mpgemm.gated_mlp", frozenset({"silu", "gelu", "gelu_tanh"}),
                  lambda w_gate, w_up, w_down: w_gate.shape == w_up.shape and w_down.shape[-1] == w_gate.shape[0])


@dataclasses.dataclass
class GatedChain:
    """One gated MLP block, by the qualified names of its modules in the
    traced module; `act` names the activation module, or is None where a
    function computes it (`activation` says which in either case)."""
    gate: str
    up: str
    down: str
    activation: str  # as traced: "silu", "gelu" or "gelu_tanh"
    act: str = None
    after: tuple = ()  # Identity and Dropout modules passed over between the multiply and down
    up_step: int = 2  # when up runs as traced: 0 before the gate, 1 between the gate and the activation, 2 after

    def label(self, prefix=""):
        return f"{prefix}{self.gate} -> {self.activation} * {prefix}{self.up} -> {prefix}{self.down}"

    def links(self):
        """(producer, consumer, same tensor) of the steps the example forward
        checks: the activation module takes the gate's output; across the
        multiply, the next module runs after the activation and after up."""
        return step_links([self.gate, self.act, None, *self.after, self.down]) + \
            [(self.up, (*self.after, self.down)[0], False)]

    def report(self, module, prefix=""):
        reason, _ = fused_call(*(module.get_submodule(n) if n else None
                                 for n in (self.gate, self.up, self.down, self.act)),
                               [module.get_submodule(n) for n in self.after])
        entry = {"kind": "gated_mlp", "gate": prefix + self.gate, "up": prefix + self.up,
                 "activation": self.activation, "down": prefix + self.down, "fused": reason is None}
        return entry if reason is None else dict(entry, reason=reason)


def has_candidates(children):
    """Whether a module with these children may hold a block: three linear
    layers among them."""
    return sum(is_linear_layer(c) for c in children) >= 3


def expects_chains(children):
    """Whether a module whose forward cannot be traced is worth naming: it
    has an activation module gated_mlp computes beside its linears."""
    return has_candidates(children) and any(module_activation(c, GATED_MLP.activations) for c in children)


def fused_call(gate, up, down, act, passed):
    """block_call for a gated block: where it runs fused, gated_mlp's
    arguments but x (w_gate, b_gate, w_up, b_up, w_down, b_down), its
    activation and the dtype x is cast to."""
    return block_call(GATED_MLP, (gate, up), down, act, passed)


def run_gated_mlp(x, gate, up, act, down, after=(), up_step=2):
    """The block's forward: ``mpgemm.gated_mlp`` where fused_call finds the
    block computes what gated_mlp computes, else each step as its module or
    function computes it, in the traced order (`up_step`: GatedChain's).
    `act` is the activation module, or the name of the function the forward
    called; `after` are the modules passed over after the multiply."""
    module = None if isinstance(act, str) else act
    if isinstance(x, torch.Tensor):
        _, call = fused_call(gate, up, down, module, after)
        if call is not None:
            operands, activation, cast = call
            return gated_mlp(cast_input(x, cast), *operands, activation=activation or act)
    u = up(x) if up_step == 0 else None
    g = gate(x)
    if up_step == 1:
        u = up(x)
    h = ACTIVATION_FUNCTIONS[act](g) if module is None else module(g)
    if up_step == 2:
        u = up(x)
    h = h * u  # the factors in either order: a product rounds the same
    for step in after:
        h = step(h)
    return down(h)


def _other_factor(node, factor):
    """The other tensor of a multiply of `factor` and another, or None."""
    is_mul = (node.op == "call_function" and node.target in MULS) or \
        (node.op == "call_method" and node.target in MUL_METHODS)
    if not is_mul or node.kwargs or len(node.args) != 2 or factor not in node.args:
        return None
    other = node.args[1] if node.args[0] is factor else node.args[0]
    return other if isinstance(other, torch.fx.Node) and other is not factor else None


def _block_from(root, gate_node):
    """(activation node, its (activation, module name or None), multiply
    node, up node) of the block whose gate `gate_node` calls, or None."""
    if not is_linear_call(root, gate_node):
        return None
    for act_node in gate_node.users:
        activation = node_activation(root, act_node, GATED_MLP.activations)
        if activation is None:
            continue
        for mul_node in act_node.users:
            up_node = _other_factor(mul_node, act_node)
            if up_node is not None and up_node is not gate_node and is_linear_call(root, up_node) and \
                    up_node.args[0] is gate_node.args[0]:
                return act_node, activation, mul_node, up_node
    return None


def find_chains(root, graph):
    """(fusable blocks, [(GatedChain, reason)] refused) in root's traced
    graph: each block with the nodes it replaces, in graph order."""
    uses = module_calls(graph)
    order = {node: i for i, node in enumerate(graph.nodes)}
    found, refused = [], []
    for node in graph.nodes:
        block = _block_from(root, node)
        if block is None:
            continue
        act_node, (form, act), mul_node, up_node = block
        after = []
        end = past(root, mul_node, is_passable, after, functions=True)
        down_node = single_user(end)
        if not is_linear_call(root, down_node):
            continue
        chain = GatedChain(node.target, up_node.target, down_node.target, form, act, passed_modules(after),
                           sum(order[up_node] > order[n] for n in (node, act_node)))
        if not (single_user(node) is act_node and single_user(act_node) is mul_node and
                single_user(up_node) is mul_node):
            reason = "an output between its steps is used more than once"
        else:
            reason = refusal(root, uses, (chain.gate, chain.up, chain.down), ((act,) if act else ()) + chain.after)
        if reason is not None:
            refused.append((chain, reason))
            continue
        found.append((chain, node, [up_node, act_node, mul_node, *after, down_node]))
    return found, refused


def rewrite(graph, found):
    """Replaces each found block's nodes by one run_gated_mlp call."""
    for chain, gate_node, replaced in found:
        replace_with_call(graph, [gate_node, *replaced], run_gated_mlp, lambda module: (
            gate_node.args[0], module(chain.gate), module(chain.up),
            module(chain.act) if chain.act else chain.activation, module(chain.down),
            tuple(map(module, chain.after)), chain.up_step))
    graph.lint()
    return graph
