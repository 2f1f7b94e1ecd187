"""Finding conv -> batch norm (-> residual add) (-> ReLU) chains in one
module's traced forward (graph.py), and rewriting each into one call of
:func:`run_chain`.

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

from .. import nn
from .batch_norm import batch_norm_act
from .graph import global_hooks, hooked, is_plain, is_relu, module_calls, module_of, past, single_user

FLOAT = torch.float32
ADDS = {operator.add, operator.iadd, torch.add}
ADD_METHODS = {"add", "add_"}


@dataclasses.dataclass
class ConvChain:
    """One chain, by the qualified names of its modules in the traced module."""
    conv: str
    bn: str
    residual: bool = False
    relu: bool = False

    def label(self, prefix=""):
        return f"{prefix}{self.conv} -> {prefix}{self.bn}"

    def links(self):
        """(producer, consumer, same tensor) of the steps the example forward checks."""
        return [(self.conv, self.bn, True)]

    def report(self, module, prefix=""):
        return {"kind": "batch_norm", "conv": prefix + self.conv, "bn": prefix + self.bn,
                "residual": self.residual, "relu": self.relu, "fused": True}


def is_fusable_batch_norm(module):
    """torch's BatchNorm2d, or a subclass that keeps its forward. SyncBatchNorm
    reduces across processes: it stays on torch."""
    return (isinstance(module, torch.nn.BatchNorm2d) and not isinstance(module, torch.nn.SyncBatchNorm)
            and type(module).forward is torch.nn.BatchNorm2d.forward)


def has_candidates(children):
    """Whether a module with these children may hold a chain: a Conv2d and a
    batch norm fuse() can take among them."""
    return any(isinstance(c, torch.nn.Conv2d) for c in children) and any(is_fusable_batch_norm(c) for c in children)


expects_chains = has_candidates  # a module that could hold a chain and cannot be traced is named


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
    if hooked(bn, y.dtype) or global_hooks():
        return False
    # The passes take fp32 parameters and statistics (prepare() keeps them so); a .half() batch norm stays on torch.
    if any(t is not None and (t.dtype != FLOAT or t.device != y.device)
           for t in (bn.weight, bn.bias, bn.running_mean, bn.running_var)):
        return False
    return residual is None or (isinstance(residual, torch.Tensor) and residual.shape == y.shape
                                and residual.dtype == y.dtype and residual.device == y.device)


def _residual_of(node, current):
    """The other operand of an add of `current` and another tensor, or None."""
    is_add = (node.op == "call_function" and node.target in ADDS) or \
        (node.op == "call_method" and node.target in ADD_METHODS)
    if not is_add or node.kwargs or len(node.args) != 2:
        return None
    first, second = node.args
    other = second if first is current else first if second is current else None
    return other if isinstance(other, torch.fx.Node) and other is not current else None


def _is_identity(module):
    return is_plain(module, torch.nn.Identity)


def find_chains(root, graph):
    """(fusable chains, [(ConvChain, reason)] refused) in root's traced graph:
    each chain with the nodes it replaces, in graph order."""
    uses = module_calls(graph)
    found, refused = [], []
    for node in graph.nodes:
        conv = module_of(root, node)
        if not isinstance(conv, torch.nn.Conv2d) or len(node.args) != 1 or node.kwargs:
            continue
        bn_node = single_user(node)
        if bn_node is None or not is_fusable_batch_norm(module_of(root, bn_node)):
            if any(is_fusable_batch_norm(module_of(root, user)) for user in node.users):
                refused.append((ConvChain(node.target, next(u.target for u in node.users
                                                        if is_fusable_batch_norm(module_of(root, u)))),
                                "the convolution's output is used more than once"))
            continue
        chain = ConvChain(node.target, bn_node.target)
        if len(bn_node.args) != 1 or bn_node.kwargs:
            continue
        if uses[node.target] > 1 or uses[bn_node.target] > 1:
            refused.append((chain, "a module of the chain runs more than once per forward"))
            continue
        if hooked(module_of(root, bn_node)):
            refused.append((chain, "a hook on the batch norm"))
            continue
        skipped, replaced = [], [bn_node]
        end = past(root, bn_node, _is_identity, skipped)
        user = single_user(end)
        if user is not None and (residual := _residual_of(user, end)) is not None:
            replaced += skipped + [user]
            skipped_after = []
            end = past(root, user, _is_identity, skipped_after)
            skipped += skipped_after
            chain.residual = True
        user = single_user(end)
        if user is not None and is_relu(root, user):
            relu_module = module_of(root, user)
            if relu_module is not None and hooked(relu_module):
                refused.append((chain, "a hook on the ReLU"))
                continue
            # Identity modules passed over after the last step stay where they are.
            replaced += [n for n in skipped if n not in replaced] + [user]
            chain.relu = True
        if any(hooked(module_of(root, n)) for n in skipped if n in replaced):
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
