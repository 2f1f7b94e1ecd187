"""Swapping torch layers for their mpgemm counterparts in an existing model."""

import logging

import torch

from . import nn

logger = logging.getLogger(__name__)

# torch layer class -> mpgemm subclass with the same parameters and state.
CONVERSIONS = {torch.nn.Linear: nn.Linear, torch.nn.Conv2d: nn.Conv2d}
ELIGIBLE_DTYPES = (torch.float16, torch.float32)


def _skipped(name, module, skip):
    if callable(skip):
        return bool(skip(name, module))
    names = [skip] if isinstance(skip, str) else list(skip)
    return any(name == s or name.startswith(s + ".") for s in names)


def convert(model, *, skip=()):
    """Replaces eligible layers of `model` with mpgemm layers, in place.

    A module is converted when its type is exactly one of CONVERSIONS' keys
    (subclasses may compute differently and are left alone) and its weight is
    fp16 or fp32. The module object is kept and only its class changes, so
    parameters, buffers and hooks are shared, not copied. Converting twice
    changes nothing.

    Args:
        model: the root module (itself converted if eligible).
        skip: module names to leave alone, with everything under them (e.g.
            ``["head", "blocks.3"]``), or a predicate ``skip(name, module)``.

    Returns:
        `model`. :func:`converted_layers` lists what now runs on mpgemm.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"mpgemm.convert: expected a torch.nn.Module, got {type(model).__name__}")
    if not (callable(skip) or isinstance(skip, str)
            or (isinstance(skip, (list, tuple, set, frozenset)) and all(isinstance(s, str) for s in skip))):
        raise TypeError("mpgemm.convert: skip must be module names or a predicate skip(name, module)")
    for name, module in model.named_modules():
        target = CONVERSIONS.get(type(module))
        if target is None or _skipped(name, module, skip):
            continue
        if module.weight.dtype not in ELIGIBLE_DTYPES:
            logger.info("mpgemm.convert: leaving %s (%s weight)", name or "<root>", module.weight.dtype)
            continue
        module.__class__ = target
        logger.info("mpgemm.convert: %s -> %s", name or "<root>", target.__qualname__)
    return model


def converted_layers(model):
    """Names of the modules of `model` that run on mpgemm ("" for the root)."""
    targets = tuple(CONVERSIONS.values())
    return [name for name, module in model.named_modules() if isinstance(module, targets)]
