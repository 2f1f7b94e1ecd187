"""Finding conv -> batch norm (-> residual add) (-> ReLU) chains in one
module's traced forward (graph.py), and rewriting each into one call of
:func:`run_chain`. A chain without a residual whose output goes to the next
chain's convolution alone, or to a max pool alone (a ResNet's stem), hands
it the recipe of its output, which that call then saves in the output's
place (recompute.py); with MPGEMM_FUSED_MAX_POOL=1 a chain ending in a ReLU
takes such a max pool into its own pass instead (batch_norm.py's
batch_norm_relu_max_pool). With MPGEMM_DGRAD_ADDEND=1 (opt-in) a chain
whose convolution's input one later node alone reads besides (a ResNet
block's input) hands that node the input again, so that backward sums the
input's two gradients in the convolution's dgrad (input_gradient.py).

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
from . import input_gradient, recompute
from .batch_norm import batch_norm_act, batch_norm_relu_max_pool, max_pool_window
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
    output_recomputable: bool = False  # by the next chain's convolution or a max pool, in backward
    pool: str = ""  # the max pool that alone takes the output, if one does
    pool_fused: bool = False  # that pool runs in the chain's pass (fused_max_pool_enabled, a ReLU, a window it takes)
    # The input's other gradient (a residual's) summed by the convolution's dgrad: its input goes to one later node
    # besides, which takes it from the chain's call.
    sums_input_gradient: bool = False

    def label(self, prefix=""):
        return f"{prefix}{self.conv} -> {prefix}{self.bn}"

    def links(self):
        """(producer, consumer, same tensor) of the steps the example forward checks."""
        return [(self.conv, self.bn, True)]

    def report(self, module, prefix=""):
        return {"kind": "batch_norm", "conv": prefix + self.conv, "bn": prefix + self.bn,
                "residual": self.residual, "relu": self.relu, "output_recomputable": self.output_recomputable,
                "max_pool": prefix + self.pool if self.pool_fused else None,
                "sums_input_gradient": self.sums_input_gradient, "fused": True}


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


def fused_max_pool_enabled():
    """Whether fuse() takes a chain's max pool into its pass
    (MPGEMM_FUSED_MAX_POOL=1, opt-in until its kernels have passed the GPU
    tests) or leaves it to torch ("0" or unset)."""
    value = os.environ.get("MPGEMM_FUSED_MAX_POOL", "")
    if value not in ("", "0", "1"):
        raise ValueError(f"MPGEMM_FUSED_MAX_POOL must be '0' or '1', got {value!r}")
    return value == "1"


def _uses_batch_stats(bn):
    return bn.training or (bn.running_mean is None and bn.running_var is None)


def _conv_with_stats(conv, bn, x):
    """conv(x), its hooks run, and where the chain may take them (an
    mpgemm Conv2d, batch statistics normalizing, epilogue_stats_enabled),
    y's batch statistics from the same call: (y, statistics or None)."""
    if (torch.compiler.is_compiling() or not _uses_batch_stats(bn) or type(conv).forward is not nn.Conv2d.forward
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


def run_chain(conv, bn, x, residual=None, *, relu=False, x_recipe=None, recipe=False, pool=None,
              gives_input=False):
    """The chain's forward: the convolution as its module computes it (its
    hooks run), then batch norm, the residual add and the ReLU in mpgemm's
    passes, with batch statistics from the convolution's epilogue where
    epilogue_stats_enabled; as torch would compute them wherever the fused
    passes do not apply (a hook added since fuse(), a residual of another
    shape or type). x_recipe: how the chain before made its output (x,
    or x past Identity modules), which the convolution then saves in that
    output's place; recipe=True: returns (out, its recipe, or None where
    there is none). pool: a max pool after the ReLU, run in the same pass
    where it can be (no hook on it), else called on the output.
    gives_input=True: returns x again after those (x's one other reader's
    copy, input_gradient.py)."""
    if pool is not None and (recipe or residual is not None or gives_input):
        raise ValueError("run_chain: a chain that ends in a max pool takes no residual and gives neither a recipe "
                         "nor its input")
    with recompute.saved_as_recipe(x_recipe):
        given = (input_gradient.conv_giving_input(conv, x, _uses_batch_stats(bn) and epilogue_stats_enabled())
                 if gives_input else None)
        y, batch_mean_var, x_again = given if given is not None else (*_conv_with_stats(conv, bn, x), x)
    if pool is not None:
        return _normalize_and_pool(bn, y, relu, batch_mean_var, pool)
    out = _normalize(bn, y, residual, relu, batch_mean_var, recipe)
    if not gives_input:
        return out
    return (*out, x_again) if recipe else (out, x_again)


def _normalize_and_pool(bn, y, relu, batch_mean_var, pool):
    """The chain's steps after its convolution, then its max pool: in one
    pass where it can be (no hook on the pool, a window it takes)."""
    fused = _fused_now(bn, y, None)
    if fused and relu and not hooked(pool, y.dtype) and max_pool_window(pool, y) is not None:
        return batch_norm_relu_max_pool(y, bn, pool, batch_mean_var)
    return pool(batch_norm_act(y, bn, None, relu, batch_mean_var) if fused else torch.relu(bn(y)) if relu
                else bn(y))


def _normalize(bn, y, residual, relu, batch_mean_var, recipe):
    """The chain's steps after its convolution: batch norm, the residual add
    and the ReLU in mpgemm's passes, or torch's where those do not apply;
    with `recipe`, (out, its recipe or None)."""
    fused = _fused_now(bn, y, residual)
    if fused:
        return batch_norm_act(y, bn, residual, relu, batch_mean_var, recipe=recipe)
    out = bn(y)
    if residual is not None:
        out = out + residual
    out = torch.relu(out) if relu else out
    return (out, None) if recipe else out


def pool_with_recipe(pool, x, x_recipe):
    """pool(x) (a max pool after a chain), saving the chain's recipe in its output's place."""
    with recompute.saved_as_recipe(x_recipe):
        return pool(x)


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
        skipped, replaced, residual = [], [bn_node], None
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
        pool = single_user(replaced[-1])
        if (not chain.residual and pool is not None and is_plain(module_of(root, pool), torch.nn.MaxPool2d)
                and len(pool.args) == 1 and not pool.kwargs):
            chain.pool = pool.target
            pool_module = module_of(root, pool)
            # Whether the chain could take the pool (rewrite() does where fused_max_pool_enabled).
            chain.pool_fused = chain.relu and not hooked(pool_module) and max_pool_window(pool_module) is not None
        found.append((chain, node, replaced, residual, _identities_before(root, node)))
    return found, refused


def _identities_before(root, conv_node):
    """The unhooked Identity modules (timm's aa when unused) that alone pass
    the convolution its input, nearest first: an output they pass on is the
    same tensor."""
    identities, node = [], conv_node.args[0]
    while (isinstance(node, torch.fx.Node) and _is_identity(module_of(root, node))
           and not hooked(module_of(root, node)) and len(node.users) == 1 and len(node.args) == 1
           and not node.kwargs):
        identities.append(node)
        node = node.args[0]
    return identities


def _with_recipe(graph, fused, chain, user):
    """Makes the run_chain node `fused` return (out, recipe) where its chain
    has no residual and `user` alone takes its output, which then takes out:
    (the out node, the recipe node), or None."""
    if chain.residual or single_user(fused) is not user:
        return None
    fused.kwargs = {**fused.kwargs, "recipe": True}
    with graph.inserting_after(fused):
        recipe = graph.call_function(operator.getitem, (fused, 1))
    with graph.inserting_after(fused):
        out = graph.call_function(operator.getitem, (fused, 0))
    user.replace_input_with(fused, out)
    chain.output_recomputable = True
    return out, recipe


def rewrite(graph, found):
    """Replaces each found chain's nodes by one run_chain call; where
    recompute_enabled, a chain whose output the next chain's convolution
    or a max pool alone takes hands that call its recipe; where
    fused_max_pool_enabled, a chain that find_chains found able to take
    its pool takes it into its call instead; then, where
    dgrad_addend_enabled, a chain whose input one later node alone reads
    besides hands that node its input (input_gradient.hand_on_inputs)."""
    chain_of = {}  # run_chain node: its chain
    every_chain = {}
    recomputing, fusing_pools = recompute.recompute_enabled(), fused_max_pool_enabled()
    for chain, conv_node, replaced, residual, identities in found:
        last = replaced[-1]
        source, taker = conv_node.args[0], conv_node
        while source in identities:
            source, taker = source.args[0], source
        kwargs = {"relu": chain.relu}
        linked = _with_recipe(graph, source, chain_of[source], taker) if recomputing and source in chain_of else None
        if linked is not None:
            kwargs["x_recipe"] = linked[1]
        x = conv_node.args[0]
        with graph.inserting_before(last):
            conv = graph.get_attr(chain.conv)
            bn = graph.get_attr(chain.bn)
            fused = graph.call_function(run_chain, (conv, bn, x, residual), kwargs)
        chain_of[fused] = every_chain[fused] = chain
        last.replace_all_uses_with(fused)
        for node in reversed(replaced):
            graph.erase_node(node)
        if not conv_node.users:
            graph.erase_node(conv_node)
        pool = single_user(fused)
        chain.pool_fused = chain.pool_fused and fusing_pools
        if not (chain.pool and pool is not None and pool.op == "call_module" and pool.target == chain.pool):
            chain.pool_fused = False
            continue
        if chain.pool_fused:
            with graph.inserting_before(fused):
                fused.kwargs = {**fused.kwargs, "pool": graph.get_attr(pool.target)}
            pool.replace_all_uses_with(fused)
            graph.erase_node(pool)
            del chain_of[fused]  # its output, pooled, has no recipe to hand the next chain
        elif recomputing:
            out, recipe = _with_recipe(graph, fused, chain, pool)
            with graph.inserting_before(pool):
                pooled = graph.call_function(pool_with_recipe, (graph.get_attr(pool.target), out, recipe))
            pool.replace_all_uses_with(pooled)
            graph.erase_node(pool)
    if input_gradient.dgrad_addend_enabled():
        input_gradient.hand_on_inputs(graph, every_chain)
    graph.lint()
    return graph
