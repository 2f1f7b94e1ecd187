"""The whole mixed-precision recipe in one call, as Apex's O2 level did."""

import torch

from ..convert import convert
from .master import MasterWeightOptimizer
from .scaler import LossScaler

HALF, FLOAT = torch.float16, torch.float32

# Their statistics and affine parameters stay fp32; they compute in fp32.
NORM_LAYERS = tuple(
    cls for cls in (torch.nn.modules.batchnorm._NormBase, torch.nn.LayerNorm, torch.nn.GroupNorm,
                    getattr(torch.nn, "RMSNorm", None)) if cls is not None
)


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


def _inputs_to(dtype):
    def hook(module, args, kwargs):
        return _cast_floats(args, dtype), _cast_floats(kwargs, dtype)

    return hook


def _outputs_to(dtype):
    def hook(module, args, output):
        return _cast_floats(output, dtype)

    return hook


def _check(model, optimizer):
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"mpgemm.amp.prepare: expected a torch.nn.Module, got {type(model).__name__}")
    if isinstance(optimizer, MasterWeightOptimizer) or getattr(model, "_mpgemm_prepared", False):
        raise RuntimeError("mpgemm.amp.prepare: this model or optimizer was already prepared; call prepare() once")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"mpgemm.amp.prepare: expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
    params = list(model.parameters())
    if not any(p.is_floating_point() for p in params):
        raise ValueError("mpgemm.amp.prepare: the model has no floating-point parameters to train")
    other_dtypes = {p.dtype for p in params if p.is_floating_point() and p.dtype not in (HALF, FLOAT)}
    if other_dtypes:
        raise TypeError(f"mpgemm.amp.prepare: parameters must be torch.float32 or torch.float16, "
                        f"found {sorted(map(str, other_dtypes))}")
    in_model = {id(p) for p in params}
    foreign = sum(id(p) not in in_model for group in optimizer.param_groups for p in group["params"])
    if foreign:
        raise ValueError(f"mpgemm.amp.prepare: the optimizer holds {foreign} parameter(s) that are not in the model")


def prepare(model, optimizer, **scaler_options):
    """Sets up mixed-precision training: returns (model, optimizer, scaler).

    - converts ``nn.Linear`` and ``nn.Conv2d`` layers to mpgemm layers
      (:func:`mpgemm.convert`);
    - casts the model to fp16, keeping normalization layers (BatchNorm,
      LayerNorm, GroupNorm, InstanceNorm, RMSNorm) and their statistics in
      fp32: they take fp16 input, compute in fp32 and return fp16;
    - lets the model take fp32 or fp16 input and makes its output fp32;
    - wraps the optimizer with fp32 master weights, initialised from the fp32
      weights before the cast (:class:`MasterWeightOptimizer`);
    - returns a :class:`LossScaler` built with ``scaler_options``.

    The training loop is then torch.amp's, without autocast::

        loss = loss_fn(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    """
    _check(model, optimizer)
    convert(model)
    fp32_values = {}
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, NORM_LAYERS):
                module.register_forward_pre_hook(_inputs_to(FLOAT), with_kwargs=True)
                module.register_forward_hook(_outputs_to(HALF))
                continue
            for p in module.parameters(recurse=False):
                if p.is_floating_point() and p.dtype != HALF:
                    fp32_values[id(p)] = p.detach().clone()
                    p.data = p.data.to(HALF)
            for name, buffer in module.named_buffers(recurse=False):
                if buffer.is_floating_point():
                    setattr(module, name, buffer.to(HALF))
    model.register_forward_pre_hook(_inputs_to(HALF), with_kwargs=True)
    model.register_forward_hook(_outputs_to(FLOAT))
    model._mpgemm_prepared = True

    optimizer = MasterWeightOptimizer(optimizer)
    with torch.no_grad():
        for model_param, master in zip(optimizer.model_params(), optimizer.master_params()):
            if master is not model_param and id(model_param) in fp32_values:
                master.copy_(fp32_values[id(model_param)])
    return model, optimizer, LossScaler(**scaler_options)
