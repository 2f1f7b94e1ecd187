"""An opt-in check for the values that rounding to fp16 loses.

mpgemm rounds fp32 inputs and weights to fp16 for the Tensor Cores, as
documented: a magnitude beyond 65504 becomes inf and one below 2**-25
becomes 0, silently. Inside :func:`fp16_range_check`, every layer that rounds
counts what it loses, and the first layer that loses anything is named in a
warning.
"""

import contextlib
import dataclasses
import warnings

import torch

from ..convert import FORWARD_CLASSES
from .prepare import CastInputs

HALF = torch.float16


@dataclasses.dataclass
class RangeFinding:
    layer: str  # the module's name in the model
    tensor: str  # "input 0", "input 'labels'", "weight"
    overflow: int  # finite values that become inf in fp16
    flush: int  # nonzero values that become 0 in fp16
    largest: float  # the largest magnitude

    def __str__(self):
        return (f"layer {self.layer!r}, {self.tensor}: {self.overflow} value(s) beyond fp16's range become inf "
                f"(largest magnitude {self.largest:.4g}), {self.flush} nonzero value(s) flush to zero")


class RangeReport(list):
    """The RangeFindings of one fp16_range_check, in the order the layers ran."""

    @property
    def first(self):
        return self[0] if self else None


def _named_tensors(obj, label):
    if isinstance(obj, torch.Tensor):
        yield label, obj
    elif isinstance(obj, (list, tuple)):
        for i, item in enumerate(obj):
            yield from _named_tensors(item, f"{label}[{i}]")
    elif isinstance(obj, dict):
        for key, item in obj.items():
            yield from _named_tensors(item, f"{label}[{key!r}]")


def _rounds_to_fp16(module):
    return isinstance(module, FORWARD_CLASSES) or any(
        isinstance(hook, CastInputs) and hook.dtype == HALF for hook in module._forward_pre_hooks.values())


class _Checker:
    def __init__(self, name, report):
        self.name, self.report = name, report

    @torch.no_grad()
    def __call__(self, module, args, kwargs):
        tensors = [pair for i, arg in enumerate(args) for pair in _named_tensors(arg, f"input {i}")]
        tensors += [pair for key, value in kwargs.items() for pair in _named_tensors(value, f"input {key!r}")]
        if isinstance(module, FORWARD_CLASSES):
            tensors.append(("weight", module.weight))
            if any(t.dtype == torch.bfloat16 for _, t in tensors):
                return  # the layer's product is in bf16: nothing is rounded to fp16
        for label, t in tensors:
            if not t.is_floating_point() or t.dtype == HALF or t.numel() == 0:
                continue
            rounded = t.to(HALF)
            overflow = int((torch.isinf(rounded) & torch.isfinite(t)).sum())
            flush = int(((rounded == 0) & (t != 0)).sum())
            if overflow or flush:
                finding = RangeFinding(self.name, label, overflow, flush, t.abs().max().item())
                if not self.report:
                    warnings.warn(f"mpgemm.amp.fp16_range_check: {finding}", stacklevel=2)
                self.report.append(finding)


@contextlib.contextmanager
def fp16_range_check(model):
    """Within the block, each layer of `model` that rounds floating-point inputs
    or weights to fp16 (mpgemm layers, and the layers of a prepared model)
    counts the values that become inf or 0; the first finding is warned about.

    Yields a RangeReport (a list of RangeFinding)::

        with mpgemm.amp.fp16_range_check(model) as report:
            loss = loss_fn(model(x), y)
        if report:
            print(report.first)

    Costs a pass over every rounded tensor: for debugging, not training.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"mpgemm.amp.fp16_range_check: expected a torch.nn.Module, got {type(model).__name__}")
    report = RangeReport()
    handles = [module.register_forward_pre_hook(_Checker(name or "<root>", report), with_kwargs=True, prepend=True)
               for name, module in model.named_modules() if _rounds_to_fp16(module)]
    try:
        yield report
    finally:
        for handle in handles:
            handle.remove()
