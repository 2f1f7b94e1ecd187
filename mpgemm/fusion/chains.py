"""Finding conv -> batch norm (-> residual add) (-> ReLU) chains in one
module's own forward, traced with torch.fx one level deep (every child a
leaf), and rewriting each into one call of :func:`run_chain`.

A chain is fused only where the trace proves it safe: the convolution's
output goes to the batch norm alone, the batch norm's (and the add's) to the
next step alone, and no module of the chain appears twice. Identity modules
between the steps (timm's drop_block and aa when disabled) are passed over.
"""

import dataclasses
import operator
import os
import threading

import torch
import torch.nn.functional as F

from .. import nn
from ..amp.prepare import CastOutputs
from .batch_norm import batch_norm_act

FLOAT = torch.float32
LOW_PRECISION = (torch.float16, torch.bfloat16)
ADDS = {operator.add, operator.iadd, torch.add}
RELUS = {F.relu, torch.relu, torch.relu_, F.relu_}
RELU_METHODS = {"relu", "relu_"}
ADD_METHODS = {"add", "add_"}


@dataclasses.dataclass
class Chain:
    """One chain, by the qualified names of its modules in the traced module."""
    conv: str
    bn: str
    residual: bool = False
    relu: bool = False


def is_fusable_batch_norm(module):
    """torch's BatchNorm2d, or a subclass that keeps its forward. SyncBatchNorm
    reduces across processes: it stays on torch."""
    return (isinstance(module, torch.nn.BatchNorm2d) and not isinstance(module, torch.nn.SyncBatchNorm)
            and type(module).forward is torch.nn.BatchNorm2d.forward)


def epilogue_stats_enabled():
    """Whether a chain's batch statistics come from its convolution's
    epilogue (MPGEMM_EPILOGUE_STATS=1, opt-in until its kernels have passed
    the GPU tests) rather than from a pass over its output ("0" or unset)."""
    value = os.environ.get("MPGEMM_EPILOGUE_STATS", "")
    if value not in ("", "0", "1"):
        raise ValueError(f"MPGEMM_EPILOGUE_STATS must be '0' or '1', got {value!r}")
    return value == "1"


def _conv_with_stats(conv, bn, x):
    """conv(x), its hooks run, and where the chain may take them (an
    mpgemm Conv2d, batch statistics normalizing, epilogue_stats_enabled),
    y's batch statistics from the same call: (y, statistics or None)."""
    uses_batch_stats = bn.training or (bn.running_mean is None and bn.running_var is None)
    if (torch.compiler.is_compiling() or not uses_batch_stats or type(conv).forward is not nn.Conv2d.forward
            or not epilogue_stats_enabled()):
        return conv(x), None
    key, answer = (threading.get_ident(), id(conv)), []
    nn.batch_stats_requests[key] = answer
    try:
        y = conv(x)
    finally:
        nn.batch_stats_requests.pop(key, None)  # the forward took it out, unless it did not run
    # A forward hook that replaced y (a cast) or changed it in place leaves
    # statistics of another tensor.
    if not answer:
        return y, None
    forward_y, stats, version = answer[0]
    return y, stats if forward_y is y and y._version == version else None


def run_chain(conv, bn, x, residual=None, *, relu=False):
    """The chain's forward: the convolution as its module computes it (its
    hooks run), then batch norm, the residual add and the ReLU in mpgemm's
    passes, with batch statistics from the convolution's epilogue where
    epilogue_stats_enabled; as torch would compute them wherever the fused
    passes do not apply (a hook added since fuse(), a residual of another
    shape or type)."""
    y, batch_mean_var = _conv_with_stats(conv, bn, x)
    if _fused_now(bn, y, residual):
        return batch_norm_act(y, bn, residual, relu, batch_mean_var)
    out = bn(y)
    if residual is not None:
        out = out + residual
    return torch.relu(out) if relu else out


def _fused_now(bn, y, residual):
    if not isinstance(y, torch.Tensor) or y.dim() != 4 or y.dtype not in (torch.float16, torch.bfloat16, FLOAT):
        return False
    if hooked(bn, y.dtype) or _global_hooks():
        return False
    # The passes take fp32 parameters and statistics (prepare() keeps them so); a .half() batch norm stays on torch.
    if any(t is not None and (t.dtype != FLOAT or t.device != y.device)
           for t in (bn.weight, bn.bias, bn.running_mean, bn.running_var)):
        return False
    return residual is None or (isinstance(residual, torch.Tensor) and residual.shape == y.shape
                                and residual.dtype == y.dtype and residual.device == y.device)


def _global_hooks():
    hooks = torch.nn.modules.module
    return bool(hooks._global_forward_hooks or hooks._global_forward_pre_hooks)


def hooked(module, dtype=None):
    """Whether a hook would see the module's forward, which a fused chain
    skips. prepare()'s cast of a batch norm's output to the model's 16-bit
    type changes nothing where the output has that type already (`dtype`;
    None: any of the 16-bit types)."""
    casts = all(isinstance(h, CastOutputs) and (h.dtype == dtype if dtype else h.dtype in LOW_PRECISION)
                for h in module._forward_hooks.values())
    return bool(not casts or module._forward_pre_hooks or module._backward_hooks
                or getattr(module, "_backward_pre_hooks", None))


class _OneLevelTracer(torch.fx.Tracer):
    """Traces the root's own forward: every module under it is a leaf."""

    def is_leaf_module(self, module, qualified_name):
        return True


def trace(module, forward):
    """The graph of `forward` (the function module's forward runs, unbound)
    called on module, its children leaves."""
    tracer = _OneLevelTracer()
    original = type(module).forward
    # fx traces type(root).forward: point it at the forward to trace for the call.
    try:
        type(module).forward = forward
        graph = tracer.trace(module)
    finally:
        type(module).forward = original
    return graph


def _single_user(node):
    users = list(node.users)
    return users[0] if len(users) == 1 else None


def _module(root, node):
    return root.get_submodule(node.target) if node.op == "call_module" else None


def _is_plain(module, cls):
    """An instance of cls (or a subclass) that runs cls's own forward."""
    return isinstance(module, cls) and type(module).forward is cls.forward


def _is_relu(root, node):
    if node.op == "call_module":
        return _is_plain(_module(root, node), torch.nn.ReLU)
    if node.op == "call_function":
        return node.target in RELUS and len(node.args) == 1
    return node.op == "call_method" and node.target in RELU_METHODS and len(node.args) == 1


def _residual_of(node, current):
    """The other operand of an add of `current` and another tensor, or None."""
    is_add = (node.op == "call_function" and node.target in ADDS) or \
        (node.op == "call_method" and node.target in ADD_METHODS)
    if not is_add or node.kwargs or len(node.args) != 2:
        return None
    first, second = node.args
    other = second if first is current else first if second is current else None
    return other if isinstance(other, torch.fx.Node) and other is not current else None


def _past_identities(root, node, skipped):
    """The step after node, passing over Identity modules it feeds alone."""
    while True:
        user = _single_user(node)
        if user is None or user.op != "call_module" or not _is_plain(_module(root, user), torch.nn.Identity):
            return node
        skipped.append(user)
        node = user


def find_chains(root, graph):
    """(fusable chains, [(Chain, reason)] refused) in root's traced graph:
    each chain with the nodes it replaces, in graph order."""
    uses = {}
    for node in graph.nodes:
        if node.op == "call_module":
            uses[node.target] = uses.get(node.target, 0) + 1
    found, refused = [], []
    for node in graph.nodes:
        conv = _module(root, node)
        if not isinstance(conv, torch.nn.Conv2d) or len(node.args) != 1 or node.kwargs:
            continue
        bn_node = _single_user(node)
        if bn_node is None or not is_fusable_batch_norm(_module(root, bn_node)):
            if any(is_fusable_batch_norm(_module(root, user)) for user in node.users):
                refused.append((Chain(node.target, next(u.target for u in node.users
                                                        if is_fusable_batch_norm(_module(root, u)))),
                                "the convolution's output is used more than once"))
            continue
        chain = Chain(node.target, bn_node.target)
        if len(bn_node.args) != 1 or bn_node.kwargs:
            continue
        if uses[node.target] > 1 or uses[bn_node.target] > 1:
            refused.append((chain, "a module of the chain runs more than once per forward"))
            continue
        if hooked(_module(root, bn_node)):
            refused.append((chain, "a hook on the batch norm"))
            continue
        skipped, replaced = [], [bn_node]
        end = _past_identities(root, bn_node, skipped)
        user = _single_user(end)
        if user is not None and (residual := _residual_of(user, end)) is not None:
            replaced += skipped + [user]
            skipped_after = []
            end = _past_identities(root, user, skipped_after)
            skipped += skipped_after
            chain.residual = True
        user = _single_user(end)
        if user is not None and _is_relu(root, user):
            relu_module = _module(root, user)
            if relu_module is not None and hooked(relu_module):
                refused.append((chain, "a hook on the ReLU"))
                continue
            # Identity modules passed over after the last step stay where they are.
            replaced += [n for n in skipped if n not in replaced] + [user]
            chain.relu = True
        if any(hooked(_module(root, n)) for n in skipped if n in replaced):
            refused.append((chain, "a hook on an Identity module between its steps"))
            continue
        found.append((chain, node, replaced, residual))
    return found, refused


def rewrite(graph, found):
    """Replaces each found chain's nodes by one run_chain call."""
    for chain, conv_node, replaced, residual in found:
        last = replaced[-1]
        with graph.inserting_before(last):
            conv = graph.get_attr(chain.conv)
            bn = graph.get_attr(chain.bn)
            fused = graph.call_function(run_chain, (conv, bn, conv_node.args[0], residual), {"relu": chain.relu})
        last.replace_all_uses_with(fused)
        for node in reversed(replaced):
            graph.erase_node(node)
        if not conv_node.users:
            graph.erase_node(conv_node)
    graph.lint()
    return graph
