"""Swapping torch layers for their mpgemm counterparts in an existing model."""

import collections
import functools
import logging
import sys

import torch

from . import nn

logger = logging.getLogger(__name__)

ELIGIBLE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# mpgemm classes whose forward runs on mpgemm's kernels; a converted layer is an instance of one.
FORWARD_CLASSES = (nn.Linear, nn.Conv2d, nn.Conv1D)
# Subclasses whose forward computes what their torch base's does, by the name
# of the class that defines it: timm's Linear only casts the weight and bias
# to the input's type under TorchScript, to work around torch.addmm under
# autocast (MobileNetV3's and EfficientNet's classifiers).
SAME_FORWARD_AS_BASE = {"timm.layers.linear.Linear", "timm.models.layers.linear.Linear"}
# Layers with matrix products that stay on torch, and why (for the summary warning).
LEFT_ON_TORCH = (
    (torch.nn.MultiheadAttention, "torch computes its attention from the weights"),
    (torch.nn.modules.conv._ConvNd, "no mpgemm kernel for this convolution"),
    (torch.nn.Bilinear, "no mpgemm kernel"),
)


def transformers_conv1d():
    """transformers' Conv1D class where transformers is imported (a model
    that holds one has imported it), else None: mpgemm does not import it."""
    return getattr(sys.modules.get("transformers.pytorch_utils"), "Conv1D", None)


def forward_owner(cls):
    """The class in cls's MRO that defines the forward its instances run."""
    return next(c for c in cls.__mro__ if "forward" in c.__dict__)


def qualified_name(cls):
    return f"{cls.__module__}.{cls.__qualname__}"


def _convertible():
    """(layer class, mpgemm forward class) for each layer family convert() takes."""
    families = [(torch.nn.Linear, nn.Linear), (torch.nn.Conv2d, nn.Conv2d)]
    conv1d = transformers_conv1d()
    if conv1d is not None:
        families.append((conv1d, nn.Conv1D))
    return families


_CONVERTED_CLASSES = {}  # (class, forward class) -> the class a layer of that class gets


def converted_class(cls, forward=None):
    """The class a layer of class `cls` gets: `forward`'s class (by default
    mpgemm's for cls's family) first in its MRO, everything else (methods,
    isinstance checks) still `cls`'s. `forward` itself where it subclasses
    `cls` alone (torch.nn.Linear gets mpgemm.nn.Linear). A `forward` class
    that sets ``wraps_forward`` wraps cls's forward, keeping its signature."""
    if forward is None:
        forward = next(f for base, f in _convertible() if issubclass(cls, base))
    if forward.__bases__ == (cls,):
        return forward
    if (cls, forward) not in _CONVERTED_CLASSES:
        namespace = {"__module__": __name__, "__qualname__": f"converted_class({cls.__qualname__})",
                     "_mpgemm_source": (cls, forward), "__reduce_ex__": _reduce_converted}
        if getattr(forward, "wraps_forward", False):
            namespace["forward"] = _with_signature_of(cls.forward, forward.forward)
        _CONVERTED_CLASSES[cls, forward] = type(cls.__name__, (forward, cls), namespace)
    return _CONVERTED_CLASSES[cls, forward]


def _with_signature_of(wrapped, forward):
    """`forward` (a forward(self, *args, **kwargs) that calls the one it
    wraps) as a function of its own that reports `wrapped`'s signature:
    transformers reads a model's forward's parameters (Trainer's dataset
    columns, generate()'s attention mask)."""
    def wrapper(self, *args, **kwargs):
        return forward(self, *args, **kwargs)
    return functools.wraps(wrapped)(wrapper)


def _reduce_converted(module, protocol):
    # A class made at run time cannot be pickled by name: rebuild it from its source.
    source, forward = type(module)._mpgemm_source
    return _new_converted, (_picklable(source), forward), module.__getstate__()


def _picklable(cls):
    """cls, or for a class made here the (source, forward) pair that makes it."""
    source = cls.__dict__.get("_mpgemm_source")
    return cls if source is None else (_picklable(source[0]), source[1])


def _class_of(source):
    """The class a _picklable() value stands for."""
    return source if isinstance(source, type) else converted_class(_class_of(source[0]), source[1])


def _new_converted(source, forward=None):
    # forward=None: a pickle made before norm layers shared this (a matrix layer's class).
    cls = converted_class(_class_of(source), forward)
    return cls.__new__(cls)


def _forward_is_base(cls, base):
    """Whether cls computes its base's forward: inherits it, or takes it from
    a class of SAME_FORWARD_AS_BASE."""
    owner = forward_owner(cls)
    return owner is base or qualified_name(owner) in SAME_FORWARD_AS_BASE


def module_selector(option, option_name, where):
    """A predicate (name, module) for an option that picks modules: a module
    name (with everything under it), a module class, a list of those, or a
    predicate option(name, module)."""
    if callable(option) and not isinstance(option, type):
        return lambda name, module: bool(option(name, module))
    items = [option] if isinstance(option, (str, type)) else option
    if not (isinstance(items, (list, tuple, set, frozenset)) and all(isinstance(i, (str, type)) for i in items)):
        raise TypeError(f"{where}: {option_name} must be module names, module classes or a predicate "
                        f"{option_name}(name, module), got {option!r}")
    names = [i for i in items if isinstance(i, str)]
    classes = tuple(i for i in items if isinstance(i, type))
    return lambda name, module: isinstance(module, classes) or any(
        name == n or name.startswith(n + ".") for n in names)


def convert(model, *, skip=(), include=()):
    """Replaces the matrix layers of `model` with mpgemm layers, in place.

    Converted: ``torch.nn.Linear``, ``torch.nn.Conv2d`` and transformers'
    ``Conv1D`` (GPT-2's layers, weight of shape (in, out), read in place as the
    transposed operand), and their subclasses that do not override
    ``forward`` or take it from a class that computes the same (timm's
    ``Linear``: ``SAME_FORWARD_AS_BASE``), with fp16, bf16 or fp32 weights (a
    converted model may be cast to another of these afterwards, e.g.
    ``model.to(torch.bfloat16)``). Any other subclass that overrides
    ``forward`` may compute something else and is left alone unless `include`
    names it. The module object is kept and only its class changes (to a
    subclass of its own class), so parameters, buffers, hooks and isinstance
    checks stay. Converting twice changes nothing.

    One WARNING line sums up the matrix layers left on torch and why (other
    convolutions, attention, overridden forwards, other dtypes).

    Args:
        model: the root module (itself converted if eligible).
        skip: layers to leave alone: names (with everything under them, e.g.
            ``["head", "blocks.3"]``), classes, or a predicate
            ``skip(name, module)``, asked about each layer it could convert.
        include: subclasses to convert although they override ``forward``
            (e.g. ``[timm.layers.Linear]``): classes, names or a predicate.

    Returns:
        `model`. :func:`converted_layers` lists what now runs on mpgemm.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"mpgemm.convert: expected a torch.nn.Module, got {type(model).__name__}")
    skipped = module_selector(skip, "skip", "mpgemm.convert")
    included = module_selector(include, "include", "mpgemm.convert")
    families = _convertible()
    left = collections.Counter()
    used_functionally = set()  # layers whose parent reads their weights without calling them
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.MultiheadAttention):
            used_functionally.update(id(m) for m in module.modules() if m is not module)
        base = next((base for base, _ in families if isinstance(module, base)), None)
        if isinstance(module, FORWARD_CLASSES) or id(module) in used_functionally:
            continue
        if base is None:
            reason = next((why for cls, why in LEFT_ON_TORCH if isinstance(module, cls)), None)
            if reason is not None:
                left[type(module).__qualname__, reason] += 1
            continue
        if skipped(name, module):
            logger.info("mpgemm.convert: skipping %s", name or "<root>")
            continue
        cls = type(module)
        if not _forward_is_base(cls, base) and not included(name, module):
            left[f"{cls.__module__}.{cls.__qualname__}", "overrides forward; include= converts it"] += 1
            continue
        if module.weight.dtype not in ELIGIBLE_DTYPES:
            left[cls.__qualname__, f"{module.weight.dtype} weight"] += 1
            continue
        module.__class__ = converted_class(cls)
        logger.info("mpgemm.convert: %s -> %s on mpgemm", name or "<root>", cls.__qualname__)
    if left:
        logger.warning("mpgemm.convert: %d matrix layer(s) left on torch: %s", sum(left.values()),
                       "; ".join(f"{count} {layer} ({why})" for (layer, why), count in left.items()))
    return model


def converted_layers(model):
    """Names of the modules of `model` that run on mpgemm ("" for the root)."""
    return [name for name, module in model.named_modules() if isinstance(module, FORWARD_CLASSES)]
