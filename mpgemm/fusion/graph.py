"""What the chain finders share: one module's own forward traced with
torch.fx one level deep (every child a leaf, but the children named to be
inlined, whose own forwards are traced in place with their children leaves),
the graph's nodes read as modules and their users, and the hooks that keep a
module out of a chain. conv_chains.py, mlp_chains.py and gated_chains.py
find their chains in such a graph.

A forward that takes ``**kwargs`` and passes them on to a child
(transformers' layers pass theirs to their attention module) is traced with
the dict passed on whole: the graph's function takes ``**kwargs`` too and
gives that child what it was given (call_with_keywords). Given to a Python
function (which could read a key of it as missing), the dict makes the
forward untraceable; read in any other way, it is fx's: a call on it, or
untraceable (_OneLevelTracer)."""

import bisect
import dis
import inspect
import os
import sys

import torch
import torch.nn.functional as F

from ..amp.prepare import CastInputs, CastOutputs

LOW_PRECISION = (torch.float16, torch.bfloat16)
RELUS = {F.relu, torch.relu, torch.relu_, F.relu_}
RELU_METHODS = {"relu", "relu_"}
# Dropout functions, by their parameters' names in order.
DROPOUT_PARAMETERS = {F.dropout: ("input", "p", "training", "inplace"), torch.dropout: ("input", "p", "train")}


# The key a traced forward's **kwargs stand under where they are passed on
# to a call (`child(x, **kwargs)`): the value is the dict itself.
PASSED_KEYWORDS = "_mpgemm_passed_keywords"
# The instructions by which Python passes a mapping on as a call's keywords.
KEYWORD_MERGES = {"CALL_FUNCTION_EX", "DICT_MERGE"}
FX_FILES = (os.path.dirname(torch.fx.__file__), __file__)  # frames of fx's and of this file's


def _instructions(frame):
    """(frame's instructions, the index of the one it is at), as fx's
    Proxy.__iter__ finds it."""
    instructions = list(dis.get_instructions(frame.f_code))
    if sys.version_info >= (3, 11):
        return instructions, bisect.bisect_left([i.offset for i in instructions], frame.f_lasti)
    return instructions, frame.f_lasti // 2


def _call_taking_keywords(frame):
    """The offset of the call to which `frame`, at a merge of keywords
    (KEYWORD_MERGES), passes them: that instruction if it is the call, else
    the first call taking a mapping after it. None at any other
    instruction."""
    instructions, at = _instructions(frame)
    if at >= len(instructions) or instructions[at].opname not in KEYWORD_MERGES:
        return None
    return next((i.offset for i in instructions[at:] if i.opname == "CALL_FUNCTION_EX"), None)


def _offset(frame):
    instructions, at = _instructions(frame)
    return instructions[at].offset if at < len(instructions) else None


def _user_frame():
    """The innermost frame outside fx and this file: the traced code's."""
    frame = inspect.currentframe()
    while frame is not None and frame.f_code.co_filename.startswith(FX_FILES):
        frame = frame.f_back
    return frame


class _OneLevelTracer(torch.fx.Tracer):
    """Traces the root's own forward: every module under it is a leaf but
    the children named in `inlined`, whose forwards are traced in place.

    The forward's ``**kwargs``, passed on as a call's keywords, hold one key,
    PASSED_KEYWORDS, whose value is the dict itself (a getitem of it), so
    that the module or method called records it; pass_keywords_on then
    passes the dict on whole. The call that records it must be the one the
    forward passed it to, at that instruction of that frame: a function of
    Python's that took the dict, or a copy of it (either might read a key,
    which would read as missing), makes the forward untraceable. Read in any
    other way, the dict is a Proxy as fx traces any."""

    def __init__(self, inlined=()):
        super().__init__()
        self.inlined = frozenset(inlined)
        self.passed_on = []  # (frame, offset of the call) where the **kwargs were passed on, not yet called

    def is_leaf_module(self, module, qualified_name):
        return qualified_name not in self.inlined

    def call_module(self, module, forward, args, kwargs):
        # An inlined child's forward alone: its hooks, which fuse refuses
        # chains through, would see fx's proxies.
        if not self.is_leaf_module(module, self.path_of_module(module)):
            forward = module.forward
        return super().call_module(module, forward, args, kwargs)

    def keys(self, obj):
        node = obj.node
        if node.op == "placeholder" and str(node.target).startswith("**"):
            frame = _user_frame()
            call = _call_taking_keywords(frame) if frame is not None else None
            if call is not None:
                self.passed_on.append((frame, call))
                return (PASSED_KEYWORDS,)
        return super().keys(obj)

    def create_proxy(self, kind, target, args, kwargs, *rest, **named):
        if PASSED_KEYWORDS in kwargs:
            frame = _user_frame()
            site = (frame, _offset(frame)) if frame is not None else None
            if kind not in ("call_module", "call_method") or site not in self.passed_on:
                raise torch.fx.proxy.TraceError("a forward's **kwargs reach a call fuse cannot pass them to")
            self.passed_on.remove(site)
        return super().create_proxy(kind, target, args, kwargs, *rest, **named)


def call_with_keywords(module, keywords, /, *args, **named):
    """A child's call to which a traced forward passed its **kwargs on."""
    return module(*args, **named, **keywords)


def call_method_with_keywords(method, obj, keywords, /, *args, **named):
    """A method's call to which a traced forward passed its **kwargs on."""
    return getattr(obj, method)(*args, **named, **keywords)


def pass_keywords_on(graph):
    """Each call that took a forward's **kwargs (PASSED_KEYWORDS) made a
    call that passes the dict on: a child's through call_with_keywords, a
    method's through call_method_with_keywords."""
    for node in list(graph.nodes):
        if PASSED_KEYWORDS not in node.kwargs:
            continue
        keywords = node.kwargs[PASSED_KEYWORDS].args[0]  # the getitem's dict: the **kwargs placeholder
        named = {k: v for k, v in node.kwargs.items() if k != PASSED_KEYWORDS}
        with graph.inserting_before(node):
            if node.op == "call_module":
                call = graph.call_function(call_with_keywords, (graph.get_attr(node.target), keywords, *node.args),
                                           named)
            else:
                call = graph.call_function(call_method_with_keywords, (node.target, node.args[0], keywords,
                                                                       *node.args[1:]), named)
        getitem = node.kwargs[PASSED_KEYWORDS]
        node.replace_all_uses_with(call)
        graph.erase_node(node)
        if not getitem.users:
            graph.erase_node(getitem)
    return graph


def _unspecialized(graph, concrete):
    """graph with the placeholders fx made of the `concrete` arguments
    named as the forward names them (fx suffixes them, which keyword calls
    would miss), and without fx's assertions of their values, the only
    nodes that read them (fuse's guards check the values before the graph
    runs)."""
    renamed = {f"{name}_1": name for name in concrete}
    read = {n for n in graph.nodes if n.op == "placeholder" and n.target in renamed}
    for node in read:
        node.target = renamed[node.target]
    assertions = []
    for node in graph.nodes:
        if node.op != "placeholder" and not read.isdisjoint(node.all_input_nodes):
            read.add(node)
            assertions.append(node)
    for node in reversed(assertions):
        graph.erase_node(node)
    return graph


def trace(module, forward, inlined=(), concrete=None):
    """The graph of `forward` (the function module's forward runs, unbound)
    called on module, its children leaves but those named in `inlined`
    (their own forwards traced in place, their children leaves), the
    arguments named in `concrete` taken as those values (None, a bool). The
    attributes of module and of the inlined children are put back
    afterwards: a forward that stores something on self (an attention map,
    a cache) would otherwise keep one of fx's proxies."""
    parameters = inspect.signature(forward).parameters
    if any(f"{name}_1" in parameters for name in concrete or {}):
        # fx names the placeholder of a concrete argument so (_unspecialized).
        raise torch.fx.proxy.TraceError("a parameter's name is another's with fx's suffix")
    tracer = _OneLevelTracer(inlined)
    kept = [(m, dict(m.__dict__)) for m in (module, *(module.get_submodule(n) for n in inlined))]
    original = type(module).forward
    # fx traces type(root).forward: point it at the forward to trace for the call.
    try:
        type(module).forward = forward
        graph = tracer.trace(module, concrete_args=concrete or None)
    finally:
        type(module).forward = original
        for m, attributes in kept:
            m.__dict__.clear()
            m.__dict__.update(attributes)
    if tracer.passed_on:
        raise torch.fx.proxy.TraceError("a forward's **kwargs reach a function fuse cannot follow")
    return pass_keywords_on(_unspecialized(graph, concrete or {}))


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


def returns_its_input(node, previous):
    """Whether node is a dropout function of `previous` that returns it as it
    is: p of 0, or not training (BART's and Whisper's activation dropout),
    as traced. Where they come from the module's plain attributes (BART's
    `self.activation_dropout`, `self.training`) fuse's guards hold them; a
    value read off another object (a config) is taken as fuse saw it."""
    if node.op != "call_function" or node.target not in DROPOUT_PARAMETERS or not node.args or \
            node.args[0] is not previous:
        return False
    names = DROPOUT_PARAMETERS[node.target]
    values = dict(zip(names, node.args))
    values.update(node.kwargs)
    if not set(values) <= set(names):
        return False
    p, training = values.get("p", 0.5), values.get(names[2], True)
    return isinstance(p, (int, float)) and isinstance(training, bool) and (p == 0 or not training)


def past(root, node, passable, skipped, functions=False):
    """The step after node, passing over the modules `passable` accepts and,
    where `functions`, the dropout functions that return their input
    (returns_its_input), each taking the one before alone (appended to
    skipped, in order)."""
    while True:
        user = single_user(node)
        if user is None or not ((user.op == "call_module" and passable(module_of(root, user))) or
                                (functions and returns_its_input(user, node))):
            return node
        skipped.append(user)
        node = user


def passed_modules(nodes):
    """The names of the modules among nodes that past() passed over."""
    return tuple(n.target for n in nodes if n.op == "call_module")


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
