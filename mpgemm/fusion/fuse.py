"""mpgemm.fuse: a model's conv -> batch norm (-> residual add) (-> ReLU)
chains run on mpgemm's fused batch-norm passes, its linear -> GELU or ReLU
-> linear chains as one mpgemm.mlp, and its gated MLP blocks
(down(act(gate(x)) * up(x))) as one mpgemm.gated_mlp, the model otherwise
as it was.

Each module whose children could hold a chain (a Conv2d and a BatchNorm2d,
or two linear layers, or two halves of an MLP block: children that hold one
linear layer each, as BERT's Intermediate and Output) has its own forward
traced one level deep (torch.fx, children as leaves, the halves traced in
place; conv_chains.py, mlp_chains.py and gated_chains.py find the chains),
its arguments that are None or a bool taken as a first forward on the
example arguments gave them (a decoder layer's encoder states, an
``output_attentions`` flag), but those it only passes on whatever they are
(_passed_on: an attention mask). A second example forward checks the trace
against what runs: each step of every chain must take exactly the step
before's output (or, across an activation function, run after it), once per
call of its module. A module that passes gets a class whose forward runs the
rewritten graph (the module's class stays in its MRO, so isinstance holds;
its name, children, parameters and state_dict keys are unchanged). That
forward checks, at each call, the plain attributes the traced forward read
(``self.training``, a ``grad_checkpointing`` flag, a child that is None),
that the halves traced in place are as they were (their class, their
children, no hooks, no global hook) and that its arguments are None, or the
same bool, where the example's were: where one is not, the module runs its
own forward, unfused, and says so once.

transformers' layers wrap their forward for gradient checkpointing
(GradientCheckpointingLayer): fuse() traces the forward inside, and the fused
class, a subclass, gets transformers' wrapper around its own forward, so
that a checkpointed layer recomputes the fused forward.
"""

import copy
import dataclasses
import importlib
import inspect
import sys
import types
import warnings

import torch

from ..convert import converted_class
from . import conv_chains, gated_chains, graph as fx_graph, mlp_chains

# Each finds its chains in a traced graph and rewrites them. A linear may end
# one kind's chain and start another's (a gated block's down projection,
# then GELU and a linear): the kind listed first keeps it.
CHAIN_KINDS = (conv_chains, gated_chains, mlp_chains)

PLAIN = (bool, int, float, str, type(None))
_NOT_NONE = "<not None>"


class FusedForward(torch.nn.Module):
    """The forward fuse() gives a module: the rewritten graph where the
    attributes its trace read are as they were, the module's own otherwise."""

    wraps_forward = True  # converted_class keeps the module's forward's signature

    def forward(self, *args, **kwargs):
        plan = self.__dict__.get("_mpgemm_fusion")
        if plan is not None and plan.holds_for(self, args, kwargs):
            return plan.function(self, *args, **kwargs)
        return super().forward(*args, **kwargs)


def _guard_value(value):
    return value if isinstance(value, PLAIN) else _NOT_NONE


NOT_NONE = "not None"  # an argument's kind: neither None nor a bool
_KIND_NAMES = {None: "None", NOT_NONE: "a value"}


def _kind(value):
    """An argument's kind, as the fused forward assumes it: None, the bool
    itself, or NOT_NONE."""
    return value if value is None or isinstance(value, bool) else NOT_NONE


@dataclasses.dataclass
class FusionPlan:
    """One module's rewritten forward: its source (fx's code and globals,
    kept so that the plan pickles and copies), the attribute values it
    assumes, and its chains (by their names in the module)."""
    name: str
    code: str
    code_globals: dict
    guards: tuple  # (attribute, value as traced); "half.attribute" for a half's
    children: tuple  # the module's children when traced, which the graph calls by name
    chains: list
    halves: tuple = ()  # (name, class) of the children whose forwards the graph runs in place
    half_children: tuple = ()  # their children when traced, a tuple each
    # (name, position or None, its default's kind, its kind in the example
    # forward) of the forward's named arguments, a kind being None, True,
    # False or NOT_NONE (_kind); those of kind None or a bool traced as given.
    arguments: tuple = ()
    positional_limit: int = None  # _positional_limit
    function: object = None
    warned: bool = False

    def __post_init__(self):
        self.function = self._compile()

    def _compile(self):
        namespace = dict(self.code_globals)
        exec(compile(self.code, f"<mpgemm.fuse {self.name or 'model'}>", "exec"), namespace)
        return namespace["forward"]

    def holds_for(self, module, args=(), kwargs=None):
        what = self._changed(module, args, kwargs or {})
        if what is None:
            return True
        if not self.warned:
            self.warned = True
            warnings.warn(f"mpgemm.fuse: {what}: this module runs its own forward, unfused", stacklevel=3)
        return False

    def _changed(self, module, args, kwargs):
        """What is not as traced, or None (it runs at every call: plain loops)."""
        for attribute, value in self.guards:
            current = getattr(module, attribute, None) if "." not in attribute else _attribute(module, attribute)
            if _guard_value(current) != value:
                return f"{self.name or 'the model'}.{attribute} changed since fuse()"
        children = module._modules
        if tuple(children.values()) != self.children:  # tuples of modules compare by identity
            return f"the children of {self.name or 'the model'} changed since fuse()"
        for (half_name, cls), traced in zip(self.halves, self.half_children):
            half = children.get(half_name)
            if type(half) is not cls or "forward" in half.__dict__ or fx_graph.has_hooks(half) or \
                    tuple(half._modules.values()) != traced:
                return f"{self.name or 'the model'}.{half_name} changed since fuse() (its class, forward, hooks " \
                       f"or children)"
        if self.halves and fx_graph.global_hooks():
            return f"a global module hook is set, which would not see the children {self.name or 'the model'} " \
                   f"runs in place"
        if self.positional_limit is not None and len(args) > self.positional_limit:
            return f"{self.name or 'the model'} was called with {len(args)} positional arguments, more than its " \
                   f"forward names"
        for argument, position, default, kind in self.arguments:
            given = _kind(args[position]) if position is not None and position < len(args) else \
                _kind(kwargs[argument]) if argument in kwargs else default
            if given != kind:
                return f"{self.name or 'the model'} was called with {argument} {_KIND_NAMES.get(given, given)} " \
                       f"where the example forward gave it {_KIND_NAMES.get(kind, kind)}"
        return None

    def __getstate__(self):
        # fx's globals hold Python modules (torch, operator), which pickle by name only.
        state = dict(self.__dict__, function=None)
        state["code_globals"] = {k: _ModuleName(v.__name__) if isinstance(v, types.ModuleType) else v
                                 for k, v in self.code_globals.items()}
        return state

    def __setstate__(self, state):
        state["code_globals"] = {k: importlib.import_module(v) if isinstance(v, _ModuleName) else v
                                 for k, v in state["code_globals"].items()}
        self.__dict__.update(state)
        self.function = self._compile()

    def __deepcopy__(self, memo):
        plan = copy.copy(self)
        plan.children = copy.deepcopy(self.children, memo)
        plan.half_children = copy.deepcopy(self.half_children, memo)
        return plan


def _attribute(module, name):
    """module's attribute `name` ("child.attribute" for a child's), None where there is none."""
    *path, last = name.split(".")
    for step in path:
        module = module._modules.get(step)
    return getattr(module, last, None)


class _ModuleName(str):
    """A Python module in a pickled plan's globals, by name."""


class _AttributeReads:
    """The plain attributes a forward reads from its module while traced."""

    def __init__(self):
        self.active = False
        self.values = {}


def _recording_class(cls, reads, prefix=""):
    class Recording(cls):
        def __getattribute__(self, name):
            value = super().__getattribute__(name)
            key = prefix + name
            if reads.active and not name.startswith("_") and not callable(value) and key not in reads.values:
                reads.values[key] = _guard_value(value)
            return value

    return Recording


def _own_forward(cls):
    """The forward under the wrappers mpgemm puts on a class (prepare()'s
    autocast, fuse's own) and transformers' gradient checkpointing wrapper
    (which the fused class gets again): the module's own."""
    source = cls.__dict__.get("_mpgemm_source")
    while source is not None and getattr(source[1], "wraps_forward", False):
        cls = source[0]
        source = cls.__dict__.get("_mpgemm_source")
    forward = cls.forward
    checkpointing = getattr(sys.modules.get("transformers.modeling_layers"), "GradientCheckpointingLayer", None)
    while checkpointing is not None and issubclass(cls, checkpointing) and hasattr(forward, "__wrapped__") and \
            getattr(getattr(forward, "__code__", None), "co_name", None) == "forward_with_checkpointing":
        forward = forward.__wrapped__
    return forward


def _fused_class(cls):
    """cls with FusedForward under any wrapper of prepare()'s, or cls itself
    where it has one already."""
    source = cls.__dict__.get("_mpgemm_source")
    if source is not None and source[1] is FusedForward:
        return cls
    if source is not None and getattr(source[1], "wraps_forward", False):
        return converted_class(_fused_class(source[0]), source[1])
    return converted_class(cls, FusedForward)


def _traced(module, halves, concrete):
    """(graph, guards) of module's own forward, one level deep, the halves
    (their names) traced in place, the `concrete` arguments as given."""
    reads = _AttributeReads()
    recorded = [(module, "")] + [(module.get_submodule(name), f"{name}.") for name in halves]
    originals = [m.__class__ for m, _ in recorded]
    for (m, prefix), cls in zip(recorded, originals):
        m.__class__ = _recording_class(cls, reads, prefix)
    try:
        reads.active = True
        graph = fx_graph.trace(module, _own_forward(originals[0]), halves, concrete)
    finally:
        reads.active = False
        for (m, _), cls in zip(recorded, originals):
            m.__class__ = cls
    return graph, tuple(sorted(reads.values.items()))


def _expects_chains(module, halves):
    """Whether a module fuse cannot trace is worth naming (each kind's
    expects_chains, over its children and its halves')."""
    children = list(module.children()) + [c for h in halves for c in module.get_submodule(h).children()]
    return any(kind.expects_chains(children) for kind in CHAIN_KINDS)


def _halves(module):
    """The children of module that hold half of a chain each, to be traced
    in place: one linear layer among their own children, no chain of their
    own, and their class's forward (none of mpgemm's wrappers, none set on
    the instance). BERT's and RoBERTa's layers split their MLP
    block between two such children (Intermediate: dense, activation;
    Output: dense, dropout, the residual add and LayerNorm)."""
    halves = []
    for name, child in module.named_children():
        grandchildren = list(child.children())
        if sum(map(mlp_chains.is_linear_layer, grandchildren)) == 1 and not mlp_chains.is_linear_layer(child) and \
                not any(kind.has_candidates(grandchildren) for kind in CHAIN_KINDS) and \
                "_mpgemm_source" not in type(child).__dict__ and "forward" not in child.__dict__:
            halves.append(name)
    return tuple(halves)


def _candidates(model):
    """(name, module, halves) of the modules whose children could hold a
    chain of one of the CHAIN_KINDS, or whose halves could make one."""
    for name, module in model.named_modules():
        children = list(module.children())
        halves = _halves(module)
        if any(kind.has_candidates(children) for kind in CHAIN_KINDS) or \
                (halves and len(halves) + sum(map(mlp_chains.is_linear_layer, children)) >= 2):
            yield name, module, halves


class _ArgumentKinds:
    """Hooks that record, from one forward, each watched module's forward's
    named arguments at its first call (FusionPlan.arguments), or None where
    they do not bind to its signature."""

    def __init__(self):
        self.arguments = {}
        self.handles = []

    def watch(self, module):
        self.handles.append(module.register_forward_pre_hook(self._record, with_kwargs=True))

    def _record(self, module, args, kwargs):
        if module not in self.arguments:
            self.arguments[module] = _argument_kinds(module, args, kwargs)

    def close(self):
        for handle in self.handles:
            handle.remove()


def _argument_kinds(module, args, kwargs):
    signature = inspect.signature(_own_forward(type(module)))
    try:
        bound = signature.bind(module, *args, **kwargs)
    except TypeError:
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return tuple((p.name, i if p.kind in positional else None, _kind(None if p.default is p.empty else p.default),
                  _kind(bound.arguments.get(p.name, p.default)))
                 for i, p in enumerate(list(signature.parameters.values())[1:])  # self's aside
                 if p.kind in (*positional, inspect.Parameter.KEYWORD_ONLY))


def _positional_limit(module):
    """How many positional arguments the rewritten graph's function takes
    as the forward does, where it could take more otherwise: fx puts a
    forward's keyword-only parameters before its *args, so that a further
    positional argument would bind to one of them. None elsewhere."""
    parameters = list(inspect.signature(_own_forward(type(module))).parameters.values())[1:]
    kinds = {p.kind for p in parameters}
    if inspect.Parameter.VAR_POSITIONAL not in kinds or inspect.Parameter.KEYWORD_ONLY not in kinds:
        return None
    return sum(p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
               for p in parameters)


class _ExampleRun:
    """Hooks that watch one forward: how often each candidate module runs and
    whether each step of each chain takes the output of the step before (or
    runs after it, across a function)."""

    def __init__(self):
        self.calls = {}
        self.mismatched = set()  # ids of the chains whose steps did not run as traced
        self.handles = []
        self._latest = {}

    def watch(self, module, chains):
        self.handles.append(module.register_forward_pre_hook(lambda m, args: self._count(m)))
        for chain in chains:
            for producer, consumer, same in chain.links():
                producer, consumer = module.get_submodule(producer), module.get_submodule(consumer)
                self.handles.append(producer.register_forward_hook(
                    lambda m, args, out: self._latest.__setitem__(m, out)))
                # First among the consumer's pre-hooks: it sees the producer's output
                # before prepare()'s cast of the consumer's inputs replaces it.
                self.handles.append(consumer.register_forward_pre_hook(
                    lambda m, args, producer=producer, same=same, key=id(chain): self._check(producer, args, same,
                                                                                             key), prepend=True))

    def _count(self, module):
        self.calls[module] = self.calls.get(module, 0) + 1

    def _check(self, producer, args, same, key):
        latest = self._latest.pop(producer, None)
        if latest is None or (same and (not args or latest is not args[0])):
            self.mismatched.add(key)

    def close(self):
        for handle in self.handles:
            handle.remove()


def _run_example(model, args, kwargs):
    """model(*args, **kwargs) without a graph, its buffers, parameters and the
    random number generators left as they were."""
    saved = [(t, t.detach().clone()) for t in model.buffers()]
    devices = sorted({t.device.index for t in model.parameters() if t.device.type == "cuda"})
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            model(*args, **kwargs)
    finally:
        with torch.no_grad():
            for t, value in saved:
                t.copy_(value)


def _found(module, halves, concrete):
    """(graph, guards, [(kind, chain found)], [(chain, reason)] refused) in
    module's forward traced with `halves` in place and the `concrete`
    arguments as given. A chain through a half with hooks is refused: the
    graph would not run them."""
    graph, guards = _traced(module, halves, concrete)
    hooked = {h for h in halves if fx_graph.has_hooks(module.get_submodule(h))}
    found, refused, taken = [], [], set()
    for kind in CHAIN_KINDS:
        fusable, not_fused = kind.find_chains(module, graph)
        refused += not_fused
        for f in fusable:  # (chain, its first node, the nodes it replaces, ...)
            steps = {f[1], *f[2]}
            if _through(f[0], hooked):
                refused.append((f[0], "a hook on a module of the chain"))
            elif not taken.isdisjoint(steps):
                refused.append((f[0], "it shares a step with another chain"))
            else:
                taken |= steps
                found.append((kind, f))
    return graph, guards, found, refused


def _through(chain, halves):
    """Whether one of chain's steps is a module of one of `halves`."""
    return any(step.partition(".")[0] in halves for link in chain.links() for step in link[:2])


def _passed_on(module, halves, arguments, concrete):
    """The arguments, None or not in the example forward, that module's
    forward passes on (to a child, a function) whatever they are: traced
    with one as None and as fx's proxy, the two graphs differ only where the
    one has None and the other the argument, so that no branch depends on
    whether it is None. They need not be as the example gave them (an
    attention mask that a batch without padding leaves None)."""
    passed = set()
    for name, _, _, kind in arguments:
        if kind not in (None, NOT_NONE):
            continue  # a bool stays as given: fx cannot branch on its proxy
        others = {a: k for a, k in concrete.items() if a != name and a not in passed}
        try:
            as_none, _ = _traced(module, halves, {**others, name: None})
            as_given, _ = _traced(module, halves, others)
        except Exception:  # noqa: BLE001 (as in fuse(): not traceable one way)
            continue
        if _same_but_for(as_none, as_given, name):
            passed.add(name)
    return passed


def _same_but_for(as_none, as_given, name):
    """Whether two graphs run the same calls in the same order on the same
    arguments, but where the first has None and the second the placeholder
    `name`."""
    placeholder = next((n for n in as_given.nodes if n.op == "placeholder" and n.target == name), None)
    first = [n for n in as_none.nodes if n.op != "placeholder"]
    second = [n for n in as_given.nodes if n.op != "placeholder"]
    if placeholder is None or len(first) != len(second):
        return False
    matched = {}

    def same(a, b):
        if isinstance(b, torch.fx.Node):
            if b is placeholder:
                return a is None
            if b.op == "placeholder":
                return isinstance(a, torch.fx.Node) and a.op == "placeholder" and a.target == b.target
            return matched.get(b) is a
        if isinstance(b, (tuple, list)):
            return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
        if isinstance(b, dict):
            return isinstance(a, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in b)
        if isinstance(b, torch.Tensor):  # a constant: == would compare its elements
            return a is b
        return type(a) is type(b) and a == b

    for a, b in zip(first, second):
        if (a.op, a.target) != (b.op, b.target) or not (same(a.args, b.args) and same(a.kwargs, b.kwargs)):
            return False
        matched[b] = a
    return True


def _chains(module, halves, concrete):
    """_found's (graph, guards, found, refused), and the halves the graph
    runs in place: only those a chain found goes through, so that the
    others stay modules of their own (their hooks run; an attention module
    holding one linear is not traced through). Where the halves' forwards
    cannot be traced, the module's own is traced with none in place."""
    if halves:
        try:
            graph, guards, found, refused = _found(module, halves, concrete)
        except Exception:  # noqa: BLE001 (as in fuse(): not traceable)
            found = None
        if found is not None:
            needed = tuple(h for h in halves if any(_through(f[0], {h}) for _, f in found))
            if needed == halves:
                return graph, guards, found, refused, halves
            # A chain through a half left out is named from this trace alone.
            left_out = set(halves) - set(needed)
            named = [(c, reason) for c, reason in refused if _through(c, left_out)]
            graph, guards, found, refused = _found(module, needed, concrete)
            return graph, guards, found, refused + named, needed
    return (*_found(module, (), concrete), ())


def fuse(model, *example_args, **example_kwargs):
    """Runs each Conv2d -> BatchNorm2d (-> residual add) (-> ReLU) chain of
    `model` on mpgemm's fused batch-norm passes, each linear -> GELU or
    ReLU -> linear chain (a transformer's MLP block) as one
    :func:`mpgemm.mlp`, and each gated MLP block (``down(act(gate(x)) *
    up(x))``, SiLU or GELU: Llama's, Gemma's, timm's SwiGLU) as one
    :func:`mpgemm.gated_mlp`; returns `model` itself.

    Two forwards on the example arguments (no graph; the model's buffers,
    parameters, gradients and random state are left as they were) give each
    module's arguments, traced as given where None or a bool, and check that
    each chain found in its module's traced forward runs as traced. A
    chain it cannot prove safe stays unfused and is named in a warning: a
    convolution whose output is used twice, a module that runs twice in one
    forward, a hook on the batch norm or the ReLU (on any module of an MLP
    chain or gated block, or on a half of a split block), a gated block
    output used outside it, a module whose forward cannot be traced or did
    not run as traced, SyncBatchNorm.
    An MLP chain or gated block runs fused where, at that call, its linears
    run mpgemm's forward and nothing between them would change
    (mlp_chains.py, gated_chains.py); elsewhere its layers run as they
    would. A block split between two children (BERT's Intermediate and
    Output) is found in their parent, a forward's **kwargs passed on to a
    child reach it, and a layer transformers checkpoints still is; a module
    runs fused where its arguments are None, or the same bool, where the
    example forward's were. The module tree, its names and classes
    (isinstance), parameters and ``state_dict()`` keys do not change, so
    checkpoints load either way; :func:`fusion_report` says what was fused.
    Works before or after :func:`mpgemm.convert` and
    :func:`mpgemm.amp.prepare`; wrap the model in DDP or torch.compile after.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"mpgemm.fuse: expected a torch.nn.Module, got {type(model).__name__}")
    candidates = list(_candidates(model))
    # A first example forward gives each module's arguments: fuse traces it
    # with those that are None or a bool as given (a branch on one is then
    # the example's), and its fused forward runs where they are so again.
    kinds = _ArgumentKinds()
    for _, module, _ in candidates:
        kinds.watch(module)
    try:
        if candidates:
            _run_example(model, example_args, example_kwargs)
    finally:
        kinds.close()
    refused, plans = [], []
    for name, module, halves in candidates:
        prefix = f"{name}." if name else ""
        arguments = kinds.arguments.get(module, ())
        if "forward" in module.__dict__:
            refused.append((name or "the model", "its forward is replaced on the instance (a patch fuse cannot see)"))
            continue
        if arguments is None:
            if _expects_chains(module, halves):
                refused.append((name or "the model", "its example call does not bind to its forward's parameters"))
            continue
        concrete = {a: kind for a, _, _, kind in arguments if kind != NOT_NONE}
        try:
            graph, guards, found, not_fused, halves = _chains(module, halves, concrete)
        except Exception as error:  # noqa: BLE001 (fx raises many kinds; each means "not traceable")
            if not _expects_chains(module, halves):
                continue
            refused.append((f"{name or 'the model'}", f"its forward cannot be traced ({type(error).__name__}: "
                            f"{str(error).splitlines()[0] if str(error) else ''})"))
            continue
        passed = _passed_on(module, halves, arguments, concrete) if found else set()
        if passed:
            concrete = {a: kind for a, kind in concrete.items() if a not in passed}
            graph, guards, found, not_fused = _found(module, halves, concrete)
            arguments = tuple(a for a in arguments if a[0] not in passed)
        refused += [(c.label(prefix), reason) for c, reason in not_fused]
        if found:
            plans.append((name, module, graph, guards, found, halves, arguments))
    run = _ExampleRun()
    for _, module, _, _, found, _, _ in plans:
        run.watch(module, [f[0] for _, f in found])
    try:
        if plans:
            _run_example(model, example_args, example_kwargs)
    finally:
        run.close()
    for name, module, graph, guards, found, halves, arguments in plans:
        prefix = f"{name}." if name else ""
        if not run.calls.get(module):
            refused += [(f[0].label(prefix), "its module did not run in the example forward") for _, f in found]
            continue
        refused += [(f[0].label(prefix), "it did not run as traced in the example forward")
                    for _, f in found if id(f[0]) in run.mismatched]
        proven = [(kind, f) for kind, f in found if id(f[0]) not in run.mismatched]
        if not proven:
            continue
        for kind in CHAIN_KINDS:
            kind.rewrite(graph, [f for k, f in proven if k is kind])
        code = graph.python_code(root_module="self")
        halves = tuple((h, type(module.get_submodule(h))) for h in halves)
        plan = FusionPlan(name, code.src, dict(code.globals), guards, tuple(module._modules.values()),
                          [f[0] for _, f in proven], halves,
                          tuple(tuple(module.get_submodule(h)._modules.values()) for h, _ in halves), arguments,
                          _positional_limit(module))
        module.__class__ = _fused_class(type(module))
        module._mpgemm_fusion = plan
    model._mpgemm_fusion_refused = refused
    if refused:
        warnings.warn(_refusals(refused), stacklevel=2)
    return model


def _refusals(refused, shown=4):
    """One line per reason, naming the first few chains (fusion_report has them all)."""
    by_reason = {}
    for what, why in refused:
        by_reason.setdefault(why, []).append(what)
    parts = [f"{why}: {', '.join(names[:shown])}" + (f" and {len(names) - shown} more" if len(names) > shown else "")
             for why, names in by_reason.items()]
    return "mpgemm.fuse: left unfused (mpgemm.fusion_report lists them): " + "; ".join(parts)


def fusion_report(model):
    """What :func:`fuse` did to `model`: a list of dicts, one per chain, with
    its ``kind``, ``fused`` (with the ``reason`` where it is not) and the
    qualified names of its modules: for ``"batch_norm"`` chains ``conv`` and
    ``bn``, whether a ``residual`` add and a ``relu`` joined them, and
    whether the call that alone takes its output (the next chain's
    convolution, a max pool) is handed its recipe
    (``output_recomputable``): backward then makes the output again rather
    than keeping it, wherever the chain's own backward keeps no copy (16-bit
    with a multiple of 8 channels, or no ReLU), and the ``max_pool`` its
    pass takes in (MPGEMM_FUSED_MAX_POOL=1), or None, and whether its
    convolution's dgrad sums its input's gradients, the input's other
    reader taking it from the chain's call (``sums_input_gradient``,
    MPGEMM_DGRAD_ADDEND=1); for
    ``"mlp"`` chains ``fc1``, ``fc2`` and the ``activation`` as traced, and
    whether it runs fused now (its linears on mpgemm, no hook, no dropout
    that drops between its steps); for ``"gated_mlp"`` chains ``gate``,
    ``up``, ``down`` and the ``activation`` as traced, and whether it runs
    fused now, as for ``"mlp"``. A chain fuse() left alone has ``chain``
    (its modules) in place of the names."""
    report = []
    for name, module in model.named_modules():
        plan = module.__dict__.get("_mpgemm_fusion")
        if plan is not None:
            report += [c.report(module, f"{name}." if name else "") for c in plan.chains]
    report += [{"chain": what, "fused": False, "reason": why}
               for what, why in getattr(model, "_mpgemm_fusion_refused", [])]
    return report
