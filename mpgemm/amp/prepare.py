"""The whole mixed-precision recipe in one call, as Apex's O2 level did."""

import itertools
import warnings

import torch

from ..convert import convert, converted_class, module_selector
from .master import MasterWeightOptimizer, register_16_bit_params
from .master_grads import is_dtensor
from .norms import is_norm_layer, take_16_bit_input
from .scaler import LossScaler

HALF, BFLOAT, FLOAT = torch.float16, torch.bfloat16, torch.float32
LOW_PRECISION = (HALF, BFLOAT)

def _cast_floats(obj, dtype):
    """obj with every floating-point tensor in it (through tuples, lists and
    dicts) cast to dtype."""
    if isinstance(obj, torch.Tensor):
        return obj.to(dtype) if obj.is_floating_point() and obj.dtype != dtype else obj
    if isinstance(obj, (list, tuple)):
        cast = [_cast_floats(o, dtype) for o in obj]
        return type(obj)(*cast) if hasattr(obj, "_fields") else type(obj)(cast)
    if isinstance(obj, dict):
        return type(obj)((k, _cast_floats(v, dtype)) for k, v in obj.items())
    return obj


class CastInputs:
    """Forward pre-hook: the module's floating-point inputs in `dtype`. A class,
    not a closure, so that a prepared model pickles."""

    def __init__(self, dtype):
        self.dtype = dtype

    def __call__(self, module, args, kwargs):
        return _cast_floats(args, self.dtype), _cast_floats(kwargs, self.dtype)


class CastOutputs:
    """Forward hook: the module's floating-point outputs in `dtype`."""

    def __init__(self, dtype):
        self.dtype = dtype

    def __call__(self, module, args, output):
        return _cast_floats(output, self.dtype)


def _device_types(module, args, kwargs):
    """The device types torch.autocast needs: the module's first parameter's
    and its first tensor argument's (a model with its embedding on the CPU
    and the rest on a GPU has two), those autocast knows."""
    first_param = next(module.parameters(), None)
    first_arg = next((a for a in itertools.chain(args, kwargs.values()) if isinstance(a, torch.Tensor)), None)
    found = dict.fromkeys(t.device.type for t in (first_param, first_arg) if t is not None)
    return [device for device in found if torch.amp.is_autocast_available(device)]


def _under_autocast(forward, module, args, kwargs, **options):
    """forward(*args, **kwargs) under torch.autocast(**options) for module's
    device types (nested, not one `with` of two: torch.compile traces this)."""
    devices = _device_types(module, args, kwargs)
    if not devices:
        return forward(*args, **kwargs)
    with torch.autocast(devices[0], **options):
        if len(devices) == 1:
            return forward(*args, **kwargs)
        with torch.autocast(devices[1], **options):
            return forward(*args, **kwargs)


class AutocastForward(torch.nn.Module):
    """A prepared model's forward: its own, under torch.autocast in the
    model's 16-bit type, so that the ops on autocast's fp32 list (softmax,
    cross_entropy and the other losses, exp, pow, ...) compute in fp32 on
    16-bit activations as under torch.amp, also those the model calls itself
    (transformers' in-model losses). The matrix layers are 16-bit already and
    autocast leaves them so."""

    wraps_forward = True  # converted_class keeps the model's forward's signature

    def forward(self, *args, **kwargs):
        return _under_autocast(super().forward, self, args, kwargs, dtype=self._mpgemm_dtype)


class Fp32Forward(torch.nn.Module):
    """The forward of a module keep_fp32 picked: its own, with autocast off,
    so that everything in it computes in fp32."""

    wraps_forward = True

    def forward(self, *args, **kwargs):
        return _under_autocast(super().forward, self, args, kwargs, enabled=False)


def _swap_forward(module, forward):
    """module's class becomes one whose `forward` wraps its own (as convert()
    swaps a layer's), pickled by what it was made from. Warns where a forward
    set on the instance would bypass it."""
    if "forward" in module.__dict__:
        warnings.warn(f"mpgemm.amp.prepare: this {type(module).__name__}'s forward was replaced on the instance (a "
                      f"hook library's patch?), which bypasses the forward that prepare() gives its class, so its "
                      f"ops on autocast's fp32 list compute in 16 bits: prepare the model before patching it",
                      stacklevel=4)
    module.__class__ = converted_class(type(module), forward)


def _check(model, optimizer):
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"mpgemm.amp.prepare: expected a torch.nn.Module, got {type(model).__name__}")
    if isinstance(optimizer, MasterWeightOptimizer) or getattr(model, "_mpgemm_prepared", False):
        raise RuntimeError("mpgemm.amp.prepare: this model or optimizer was already prepared; call prepare() once")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"mpgemm.amp.prepare: expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
    params = list(model.parameters())
    if any(is_dtensor(p) for p in params):
        raise TypeError("mpgemm.amp.prepare: the model's parameters are sharded (fully_shard or DTensor). FSDP2 keeps "
                        "the fp32 parameters and computes in 16 bits itself: call mpgemm.convert(model) before "
                        "fully_shard(model, mp_policy=MixedPrecisionPolicy(...)) and leave prepare() out "
                        "(README, \"Scaling out\")")
    if not any(p.is_floating_point() for p in params):
        raise ValueError("mpgemm.amp.prepare: the model has no floating-point parameters to train")
    other_dtypes = {p.dtype for p in params if p.is_floating_point() and p.dtype not in (*LOW_PRECISION, FLOAT)}
    if other_dtypes:
        raise TypeError(f"mpgemm.amp.prepare: parameters must be torch.float32, torch.float16 or torch.bfloat16, "
                        f"found {sorted(map(str, other_dtypes))}")
    in_model = {id(p) for p in params}
    foreign = sum(id(p) not in in_model for group in optimizer.param_groups for p in group["params"])
    if foreign:
        raise ValueError(f"mpgemm.amp.prepare: the optimizer holds {foreign} parameter(s) that are not in the model")


def _fp32_subtrees(model, keep_fp32):
    """{id: module} of the modules whose parameters stay fp32: norm layers,
    the modules keep_fp32 picks, and everything under them; and the roots of
    those subtrees."""
    keep = module_selector(keep_fp32, "keep_fp32", "mpgemm.amp.prepare")
    kept, roots = {}, []
    for name, module in model.named_modules():
        if id(module) in kept:
            continue
        picked = keep(name, module)
        if not (picked or is_norm_layer(module)):
            continue
        roots.append((module, picked))
        kept.update((id(m), m) for m in module.modules())
    return kept, roots


def _hook_fp32_subtree(module, picked, dtype):
    """The casts at a kept subtree's edges: its output in `dtype`; its input in
    fp32, unless it is a norm layer that computes in fp32 from 16-bit input
    (mpgemm.amp.norms), which keep_fp32 did not pick. What keep_fp32 picked
    runs with autocast off."""
    if picked or not take_16_bit_input(module):
        module.register_forward_pre_hook(CastInputs(FLOAT), with_kwargs=True)
    module.register_forward_hook(CastOutputs(dtype))
    if picked:
        _swap_forward(module, Fp32Forward)


def _warn_about_casts(already_low, overflowed, dtype):
    if already_low:
        warnings.warn(f"mpgemm.amp.prepare: {already_low} parameter(s) were already 16-bit (a model cast with .half() "
                      f"or .bfloat16()?): their fp32 master weights start from those 16-bit values, and the fp32 "
                      f"layers were put back in fp32. Prepare the fp32 model to keep full precision.", stacklevel=3)
    if overflowed:
        name, count = overflowed[0]
        short = {HALF: "fp16", BFLOAT: "bf16"}[dtype]
        warnings.warn(f"mpgemm.amp.prepare: {name!r} has {count} value(s) beyond {short}'s range that are inf in the "
                      f"{short} model ({len(overflowed)} parameter(s) in all); their fp32 masters keep the values",
                      stacklevel=3)


def prepare(model, optimizer, *, dtype=HALF, keep_fp32=(), include=(), **scaler_options):
    """Sets up mixed-precision training: returns (model, optimizer, scaler).

    `dtype` is the model's 16-bit type: ``torch.float16`` (the default) or
    ``torch.bfloat16``, whose fp32-sized exponent needs no loss scaling.

    - converts the matrix layers to mpgemm layers (:func:`mpgemm.convert`,
      with `include`);
    - casts the parameters to `dtype`, except those of the layers that stay
      fp32 and return `dtype`: normalization layers (torch's, and classes
      whose name ends in ``Norm``, ``Norm1d``, ``Norm2d`` or ``Norm3d``, such
      as ``LlamaRMSNorm``), the modules `keep_fp32` picks (names, classes or a
      predicate ``(name, module)``), and everything under them. Batch norms
      take the 16-bit activations as they are; torch's LayerNorm, GroupNorm
      and RMSNorm compute in fp32 from them, saving the 16-bit input for
      backward; the others compute in fp32 on an fp32 copy of their input
      (:mod:`mpgemm.amp.norms`);
    - leaves floating-point buffers in fp32 (running statistics, rotary
      frequencies and tables are state, not activations; 16-bit ones are put
      back in fp32);
    - has each module that owns `dtype` parameters cast its floating-point
      inputs to `dtype` as it runs, so a float the model does not compute with
      (a regression target passed as ``labels=``) keeps its dtype, and makes
      the model's floating-point outputs fp32;
    - runs the model's forward under ``torch.autocast`` in `dtype`
      (:class:`AutocastForward`), so the ops on autocast's fp32 list compute
      in fp32 on 16-bit activations as under torch.amp, including a loss the
      model computes itself; the `keep_fp32` modules run with autocast off;
    - wraps the optimizer with fp32 master weights, initialised from the fp32
      weights before the cast, which ``model.state_dict()`` holds and
      ``model.load_state_dict()`` loads, so that a checkpoint resumes exactly
      in any load order (:class:`MasterWeightOptimizer`). Only this optimizer
      may step the model's 16-bit parameters: another raises at its first
      step;
    - returns a :class:`LossScaler` built with ``scaler_options``; for
      bfloat16 it is disabled unless ``enabled=True`` is passed
      (``is_enabled()`` is False, ``scale()`` returns its input, ``step()``
      steps), so the same training loop runs unchanged.

    Warns when the model was already 16-bit (the masters start from 16-bit
    values) and when a weight overflows `dtype`'s range.

    Refuses a model whose parameters are sharded (FSDP2: convert() it and
    use a MixedPrecisionPolicy instead; README, "Scaling out").

    The training loop is then torch.amp's, without autocast::

        loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)                   # to clip, as with GradScaler
        optimizer.clip_grad_norm_(max_norm)          # or torch.nn.utils.clip_grad_norm_(model.parameters(), ...)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    """
    if dtype not in LOW_PRECISION:
        raise ValueError(f"mpgemm.amp.prepare: dtype must be torch.float16 or torch.bfloat16, got {dtype}")
    _check(model, optimizer)
    kept, kept_roots = _fp32_subtrees(model, keep_fp32)
    convert(model, skip=lambda name, module: id(module) in kept, include=include)
    names = {id(p): name for name, p in model.named_parameters(remove_duplicate=False)}
    fp32_values, seen, already_low, overflowed, sixteen_bit = {}, set(), 0, [], []
    with torch.no_grad():
        for module in model.modules():
            target = FLOAT if id(module) in kept else dtype
            own = [p for p in module.parameters(recurse=False) if p.is_floating_point() and id(p) not in seen]
            seen.update(id(p) for p in own)
            for p in own:
                already_low += p.dtype in LOW_PRECISION
                if target == dtype and p.dtype != dtype:
                    # The master starts from the value before the cast (exact for a 16-bit one).
                    fp32_values[id(p)] = p.detach().to(FLOAT, copy=True)
                    p.data = p.data.to(dtype)
                    count = int(torch.isinf(p).sum() - torch.isinf(fp32_values[id(p)]).sum())
                    if count:
                        overflowed.append((names[id(p)], count))
                elif p.dtype != target:
                    p.data = p.data.to(target)
                if target == dtype:
                    sixteen_bit.append(p)
            for name, buffer in module.named_buffers(recurse=False):
                if buffer is not None and buffer.dtype in LOW_PRECISION:
                    setattr(module, name, buffer.to(FLOAT))
            if target == dtype and own:
                module.register_forward_pre_hook(CastInputs(dtype), with_kwargs=True)
    for module, picked in kept_roots:
        _hook_fp32_subtree(module, picked, dtype)
    model.register_forward_hook(CastOutputs(FLOAT))
    model._mpgemm_prepared = True
    if id(model) not in kept:
        runs = getattr(model, "_orig_mod", model)  # what a torch.compile'd model's forward calls
        runs._mpgemm_dtype = dtype
        _swap_forward(runs, AutocastForward)
    _warn_about_casts(already_low, overflowed, dtype)

    optimizer = MasterWeightOptimizer(optimizer, model)
    register_16_bit_params(sixteen_bit)
    with torch.no_grad():
        for model_param, master in zip(optimizer.model_params(), optimizer._masters()):
            if master is not model_param and id(model_param) in fp32_values:
                master.copy_(fp32_values[id(model_param)])
    scaler_options.setdefault("enabled", dtype == HALF)
    return model, optimizer, LossScaler(**scaler_options)
