"""What the chain finders share: one module's own forward traced with
torch.fx one level deep (every child a leaf), the graph's nodes read as
modules and their users, and the hooks that keep a module out of a chain.
conv_chains.py, mlp_chains.py and gated_chains.py find their chains in such
a graph."""

import torch
import torch.nn.functional as F

from ..amp.prepare import CastInputs, CastOutputs

LOW_PRECISION = (torch.float16, torch.bfloat16)
RELUS = {F.relu, torch.relu, torch.relu_, F.relu_}
RELU_METHODS = {"relu", "relu_"}


class _OneLevelTracer(torch.fx.Tracer):
    """Traces the root's own forward: every module under it is a leaf."""

    def is_leaf_module(self, module, qualified_name):
        return True


def trace(module, forward):
    """The graph of `forward` (the function module's forward runs, unbound)
    called on module, its children leaves. The module's own attributes are
    put back afterwards: a forward that stores something on self (an
    attention map, a cache) would otherwise keep one of fx's proxies."""
    tracer = _OneLevelTracer()
    original, attributes = type(module).forward, dict(module.__dict__)
    # fx traces type(root).forward: point it at the forward to trace for the call.
    try:
        type(module).forward = forward
        graph = tracer.trace(module)
    finally:
        type(module).forward = original
        module.__dict__.clear()
        module.__dict__.update(attributes)
    return graph


def module_calls(graph):
    """{qualified name: how many nodes call that module} in graph."""
    uses = {}
    for node in graph.nodes:
        if node.op == "call_module":
            uses[node.target] = uses.get(node.target, 0) + 1
    return uses


def single_user(node):
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def module_of(root, node):
    """The module a call_module node calls, None for any other node."""
    return root.get_submodule(node.target) if node is not None and node.op == "call_module" else None


def is_plain(module, cls):
    """An instance of cls (or a subclass) that runs cls's own forward."""
    return isinstance(module, cls) and type(module).forward is cls.forward


def past(root, node, passable, skipped):
    """The step after node, passing over the modules `passable` accepts that
    each take the one before alone (appended to skipped, in order)."""
    while True:
        user = single_user(node)
        if user is None or user.op != "call_module" or not passable(module_of(root, user)):
            return node
        skipped.append(user)
        node = user


def replace_with_call(graph, nodes, function, arguments):
    """Puts one call of `function` in place of a chain's `nodes`, each used
    by nodes after it alone, the last's users given the call: its arguments
    are `arguments(module)`, module(name) a node that reads the submodule of
    that name."""
    with graph.inserting_before(nodes[-1]):
        call = graph.call_function(function, arguments(graph.get_attr))
    nodes[-1].replace_all_uses_with(call)
    for node in reversed(nodes):
        graph.erase_node(node)
    return call


def is_relu(root, node):
    """Whether node is a ReLU: torch's module, function or tensor method
    (F.relu's `inplace` aside, no other argument)."""
    if node.op == "call_module":
        return is_plain(module_of(root, node), torch.nn.ReLU)
    if node.op == "call_function":
        return node.target in RELUS and len(node.args) == 1 and set(node.kwargs) <= {"inplace"}
    return node.op == "call_method" and node.target in RELU_METHODS and len(node.args) == 1 and not node.kwargs


def global_hooks():
    """Whether a global module hook would see the calls a fused chain skips."""
    hooks = torch.nn.modules.module
    return bool(hooks._global_forward_hooks or hooks._global_forward_pre_hooks or hooks._global_backward_hooks
                or getattr(hooks, "_global_backward_pre_hooks", None))


def has_hooks(module):
    """Whether any hook would see the module's forward or backward."""
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks
                or getattr(module, "_backward_pre_hooks", None))


def hooked(module, dtype=None):
    """Whether a hook would see the module's forward, which a fused chain
    skips. prepare()'s cast of a batch norm's output to the model's 16-bit
    type changes nothing where the output has that type already (`dtype`;
    None: any of the 16-bit types)."""
    casts = all(isinstance(h, CastOutputs) and (h.dtype == dtype if dtype else h.dtype in LOW_PRECISION)
                for h in module._forward_hooks.values())
    return bool(not casts or module._forward_pre_hooks or module._backward_hooks
                or getattr(module, "_backward_pre_hooks", None))


def input_cast(module):
    """(whether a fused chain may stand in for the module's hooks, the dtype
    they cast its inputs to or None): prepare() gives a 16-bit layer a
    pre-hook that casts its inputs to the model's type, which a chain can
    apply itself; any other hook it cannot."""
    pre_hooks = list(module._forward_pre_hooks.values())
    dtypes = {h.dtype for h in pre_hooks if isinstance(h, CastInputs)}
    if module._forward_hooks or module._backward_hooks or getattr(module, "_backward_pre_hooks", None) or \
            len(dtypes) > 1 or not all(isinstance(h, CastInputs) for h in pre_hooks):
        return False, None
    return True, next(iter(dtypes), None)
