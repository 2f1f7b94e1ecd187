"""Dynamic loss scaling with the API of torch.amp.GradScaler."""

from collections import abc

import torch
import torch.distributed as dist

from .master import MasterWeightOptimizer
from .master_grads import distributed, unscale_target

_READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"
# The counters' places in the scaler's int64 tensor (csrc/kernels/amp/loss_scale.h's LossScaleCounter).
_GROWTH_TRACKER, _OVERFLOWS_IN_A_ROW, _SKIPPED_STEPS, _LAST_STEP_SKIPPED, _COUNTERS = range(5)


class LossScaler:
    """Scales the loss so that small fp16 gradients do not flush to zero, and
    skips the optimizer steps whose gradients overflowed.

    Has the API of ``torch.amp.GradScaler`` (``scale``, ``unscale_``,
    ``step``, ``update``, ``get_scale``, ``is_enabled``, ``state_dict``,
    ``load_state_dict``, and the getters and setters of ``growth_factor``,
    ``backoff_factor`` and ``growth_interval``) and also takes fp16 gradients:
    with a :class:`MasterWeightOptimizer`, unscaling acts on the fp32 master
    gradients; with any other optimizer, gradients (dense or sparse) are
    unscaled in place. All of an optimizer's gradients must be on one device.

    The scale and its counters live on the device of the first loss it
    scales, and one device op updates them (``mpgemm.update_loss_scale_``),
    so a step waits on the device only to decide whether to skip: with an
    optimizer that skips on the device itself (torch's fused Adam, AdamW and
    SGD, ``fused=True``; wrapped or not in a :class:`MasterWeightOptimizer`)
    it passes the overflow flag as ``found_inf``, as GradScaler does, and
    once the optimizer holds its state (from its first step on) the step
    never waits; before that, and with any other optimizer, ``step`` reads
    the flag, one host synchronization. Reading the scale or the counters
    (``get_scale``, ``state_dict``, ``skipped_steps``) waits for the device,
    as GradScaler's ``get_scale`` does.

    Beyond GradScaler:
      min_scale: floor of the scale (default 1.0).
      hysteresis: the number of overflowing steps in a row that makes the
        scale back off (default 1: every overflow backs off). Every
        overflowing step is skipped.
      dynamic: False keeps the scale fixed at init_scale (overflowing steps are
        still skipped).
      skipped_steps, last_step_skipped: for LR schedulers and logs.

    Under torch.distributed the overflow flag is reduced across ranks, so
    every rank takes the same skip decision and keeps the same scale.
    """

    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                 enabled=True, *, min_scale=1.0, hysteresis=1, dynamic=True):
        for name, value in (("init_scale", init_scale), ("growth_factor", growth_factor),
                            ("backoff_factor", backoff_factor), ("growth_interval", growth_interval),
                            ("hysteresis", hysteresis), ("min_scale", min_scale)):
            _check_option(name, value)
        if dynamic and init_scale < min_scale:
            raise ValueError(f"mpgemm.amp.LossScaler: init_scale ({init_scale}) must be at least min_scale "
                             f"({min_scale})")
        self._enabled = enabled
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = growth_interval
        self._min_scale = float(min_scale)
        self._hysteresis = hysteresis
        self._dynamic = dynamic
        # On the CPU until the first scale() moves them to the loss's device;
        # updated in place from then on, so that a captured CUDA graph reads
        # and writes the same memory at every replay.
        self._scale = torch.full((), float(init_scale), dtype=torch.float32)
        self._counters = torch.zeros(_COUNTERS, dtype=torch.int64)
        self._placed = False
        self._optimizer_states = {}  # id(optimizer) -> {"stage", "found_inf"}
        # None before the first scale(); then whether scale() ran since the last
        # update(). Without one, unscale_/step would act on gradients a step
        # already used: GradScaler refuses them before the first scale() too.
        self._scaled_since_update = None

    def is_enabled(self):
        return self._enabled

    def get_scale(self):
        return float(self._scale) if self._enabled else 1.0

    @property
    def skipped_steps(self):
        """Steps skipped since the scaler began (reading it waits for the device)."""
        return int(self._counters[_SKIPPED_STEPS])

    @property
    def last_step_skipped(self):
        """Whether the last step overflowed and was skipped (reading it waits for the device)."""
        return bool(self._counters[_LAST_STEP_SKIPPED])

    def get_growth_factor(self):
        return self._growth_factor

    def set_growth_factor(self, new_factor):
        _check_option("growth_factor", new_factor)
        self._growth_factor = float(new_factor)

    def get_backoff_factor(self):
        return self._backoff_factor

    def set_backoff_factor(self, new_factor):
        _check_option("backoff_factor", new_factor)
        self._backoff_factor = float(new_factor)

    def get_growth_interval(self):
        return self._growth_interval

    def set_growth_interval(self, new_interval):
        _check_option("growth_interval", new_interval)
        self._growth_interval = new_interval

    def _scale_on(self, device):
        """The scale on `device`: the state moves there at the first call, a
        copy for any other device afterwards."""
        if not self._placed:
            self._scale, self._counters, self._placed = self._scale.to(device), self._counters.to(device), True
        return self._scale if self._scale.device == device else _copy_to(self._scale, device)

    def scale(self, outputs):
        """outputs * scale, for a tensor or an iterable of tensors (nested):
        lists and tuples come back as their type, other iterables as an
        iterator, as with GradScaler."""
        if not self._enabled:
            return outputs
        self._scaled_since_update = True
        if isinstance(outputs, torch.Tensor):
            # An fp32 scale promotes a 0-dim fp16 loss to fp32, as GradScaler's does.
            return outputs * self._scale_on(outputs.device)
        if isinstance(outputs, abc.Iterable) and not isinstance(outputs, (str, bytes)):
            scaled = map(self.scale, outputs)
            return type(outputs)(scaled) if isinstance(outputs, (list, tuple)) else scaled
        raise TypeError(f"mpgemm.amp.LossScaler.scale: expected a tensor or an iterable of tensors, "
                        f"got {type(outputs).__name__}")

    def _check_scaled(self, method):
        if self._scaled_since_update is None:
            raise RuntimeError(f"mpgemm.amp.LossScaler: {method}() was called before any scale(); call "
                               f"scaler.scale(loss).backward() first")
        if not self._scaled_since_update:
            raise RuntimeError(f"mpgemm.amp.LossScaler: {method}() was called after update() with no scale() "
                               f"since; it would step the gradients the last step used again. Each iteration is "
                               f"scaler.scale(loss).backward(), scaler.step(optimizer), scaler.update()")

    def _state(self, optimizer):
        return self._optimizer_states.setdefault(id(optimizer), {"stage": _READY, "found_inf": None})

    def unscale_(self, optimizer):
        """Divides the optimizer's gradients by the scale and records inf/NaN.

        With a :class:`MasterWeightOptimizer` the unscaled gradients are the
        masters', which the 16-bit model's ``.grad`` are (or stand for), so
        clipping ``model.parameters()`` or ``optimizer.master_params()`` clips
        the same.
        """
        if not self._enabled:
            return
        self._check_scaled("unscale_")
        state = self._state(optimizer)
        if state["stage"] == _UNSCALED:
            raise RuntimeError("mpgemm.amp.LossScaler: unscale_() has already been called on this optimizer "
                               "since the last update()")
        if state["stage"] == _STEPPED:
            raise RuntimeError("mpgemm.amp.LossScaler: unscale_() is being called after step()")
        params = [p for group in optimizer.param_groups for p in group["params"]]
        device = params[0].device if params else torch.device("cpu")
        found_inf = torch.zeros((), dtype=torch.float32, device=device)  # 0-dim, as fused optimizers take it
        inv_scale = self._scale_on(device).double().reciprocal().float()
        if isinstance(optimizer, MasterWeightOptimizer):
            optimizer.unscale_grads_(inv_scale, found_inf)
        else:
            grads = [unscale_target(p) for p in params if p.grad is not None]
            torch.ops.mpgemm.unscale_grads_(grads, grads, found_inf, inv_scale)
        if distributed():
            dist.all_reduce(found_inf, op=dist.ReduceOp.MAX)
        state["found_inf"] = found_inf
        state["stage"] = _UNSCALED

    def step(self, optimizer, *args, **kwargs):
        """Unscales if needed, then steps unless the gradients overflowed.
        Returns the optimizer's return value, or None for a step skipped on
        the host; an optimizer that skips on the device (fused) returns its
        own value either way."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("mpgemm.amp.LossScaler: closures are not supported with step()")
        self._check_scaled("step")
        state = self._state(optimizer)
        if state["stage"] == _STEPPED:
            raise RuntimeError("mpgemm.amp.LossScaler: step() has already been called since the last update()")
        if state["stage"] == _READY:
            self.unscale_(optimizer)
        state["stage"] = _STEPPED
        inner = optimizer.optimizer if isinstance(optimizer, MasterWeightOptimizer) else optimizer
        if getattr(inner, "_step_supports_amp_scaling", False) and _has_state(inner):
            # It skips an overflowing step on the device, as under GradScaler;
            # its gradients are unscaled already.
            inner.grad_scale, inner.found_inf = None, state["found_inf"]
            try:
                return optimizer.step(*args, **kwargs)
            finally:
                del inner.grad_scale, inner.found_inf
        # The one host synchronization of a step on any other optimizer.
        if state["found_inf"].item() != 0.0:
            if isinstance(optimizer, MasterWeightOptimizer):
                optimizer.untie_grads()  # as its step would have
            return None
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale=None):
        """Adjusts the scale after the steps of one iteration, on the device."""
        if not self._enabled:
            return
        if new_scale is None and not self._optimizer_states:
            raise RuntimeError("mpgemm.amp.LossScaler: update() found no step or unscale_ since the last update(); "
                               "call scaler.step(optimizer) first")
        flags = [_copy_to(s["found_inf"], self._scale.device)
                 for s in self._optimizer_states.values() if s["found_inf"] is not None]
        if flags:
            found_inf = flags[0] if len(flags) == 1 else torch.stack(flags).amax(0)
            torch.ops.mpgemm.update_loss_scale_(self._scale, self._counters, found_inf, self._growth_factor,
                                                self._backoff_factor, self._growth_interval, self._min_scale,
                                                self._hysteresis, self._dynamic and new_scale is None)
        else:
            self._counters[_LAST_STEP_SKIPPED] = 0
        if isinstance(new_scale, torch.Tensor):
            with torch.no_grad():  # the scale never joins a graph
                self._scale.copy_(new_scale.detach().reshape(()))
        elif new_scale is not None:
            self._scale.fill_(float(new_scale))
        self._optimizer_states = {}
        self._scaled_since_update = False

    def state_dict(self):
        if not self._enabled:
            return {}
        growth_tracker, overflows_in_a_row, skipped_steps, last_step_skipped = self._counters.tolist()
        return {
            "scale": self.get_scale(),
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": growth_tracker,
            "min_scale": self._min_scale,
            "hysteresis": self._hysteresis,
            "dynamic": self._dynamic,
            "_overflows_in_a_row": overflows_in_a_row,
            "skipped_steps": skipped_steps,
            "last_step_skipped": bool(last_step_skipped),
        }

    def load_state_dict(self, state_dict):
        if not self._enabled:
            return
        if not state_dict:
            raise RuntimeError("mpgemm.amp.LossScaler: the state_dict is empty; it was saved from a disabled scaler")
        if self._dynamic and float(state_dict["scale"]) < self._min_scale and "min_scale" not in state_dict:
            raise ValueError(f"mpgemm.amp.LossScaler: the saved scale {state_dict['scale']} is below min_scale "
                             f"({self._min_scale})")
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        # Keys beyond GradScaler's, so a GradScaler state_dict loads too.
        self._min_scale = float(state_dict.get("min_scale", self._min_scale))
        self._hysteresis = int(state_dict.get("hysteresis", self._hysteresis))
        self._dynamic = bool(state_dict.get("dynamic", self._dynamic))
        # In place, where the state lives: a captured graph keeps its addresses.
        self._scale.fill_(float(state_dict["scale"]))
        counters = [0] * _COUNTERS
        counters[_GROWTH_TRACKER] = int(state_dict["_growth_tracker"])
        counters[_OVERFLOWS_IN_A_ROW] = int(state_dict.get("_overflows_in_a_row", 0))
        counters[_SKIPPED_STEPS] = int(state_dict.get("skipped_steps", 0))
        counters[_LAST_STEP_SKIPPED] = int(bool(state_dict.get("last_step_skipped", False)))
        self._counters.copy_(torch.tensor(counters, dtype=torch.int64))


def _copy_to(tensor, device):
    """tensor on device: non-blocking only onto a GPU (a non-blocking copy
    to the CPU may be read before it lands)."""
    return tensor.to(device, non_blocking=device.type != "cpu")


def _has_state(optimizer):
    """Whether every parameter with a gradient already has the optimizer's
    state. Until then a skipped step is decided on the host: a fused
    optimizer skipping on the device still creates the state it lacks, and
    fused SGD creates its momentum buffers uninitialized (torch.empty_like).
    SGD without momentum keeps no state at all."""
    if isinstance(optimizer, torch.optim.SGD) and all(group["momentum"] == 0 for group in optimizer.param_groups):
        return True
    return all(p in optimizer.state for group in optimizer.param_groups for p in group["params"]
               if p.grad is not None)


def _check_option(name, value):
    """One validation for the options of __init__ and the setters."""
    if name in ("growth_interval", "hysteresis"):
        ok, expected = isinstance(value, int) and not isinstance(value, bool) and value > 0, "a positive int"
    elif name == "growth_factor":
        ok, expected = value > 1.0, "> 1"
    elif name == "backoff_factor":
        ok, expected = 0.0 < value < 1.0, "in (0, 1)"
    else:
        ok, expected = value > 0, "positive"
    if not ok:
        raise ValueError(f"mpgemm.amp.LossScaler: {name} must be {expected}, got {value}")

