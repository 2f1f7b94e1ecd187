"""Dynamic loss scaling with the API of torch.amp.GradScaler."""

from collections import abc

import torch
import torch.distributed as dist

from .master import MasterWeightOptimizer
from .master_grads import distributed, unscale_target

_READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"


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
        self._scale = float(init_scale)
        self._growth_factor = float(growth_factor)
        self._backoff_factor = float(backoff_factor)
        self._growth_interval = growth_interval
        self._min_scale = float(min_scale)
        self._hysteresis = hysteresis
        self._dynamic = dynamic
        self._growth_tracker = 0
        self._overflows_in_a_row = 0
        self.skipped_steps = 0
        self.last_step_skipped = False
        self._optimizer_states = {}  # id(optimizer) -> {"stage", "found_inf"}
        self._scale_tensor = None
        # None before the first scale(); then whether scale() ran since the last
        # update(). Without one, unscale_/step would act on gradients a step
        # already used: GradScaler refuses them before the first scale() too.
        self._scaled_since_update = None

    def is_enabled(self):
        return self._enabled

    def get_scale(self):
        return self._scale if self._enabled else 1.0

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
        if self._scale_tensor is None or self._scale_tensor.device != device:
            self._scale_tensor = torch.full((), self._scale, dtype=torch.float32, device=device)
        return self._scale_tensor

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
        return self._optimizer_states.setdefault(id(optimizer), {"stage": _READY, "found_inf": None, "overflow": None})

    def unscale_(self, optimizer):
        """Divides the optimizer's gradients by the scale and records inf/NaN.

        With a :class:`MasterWeightOptimizer` the unscaled gradients are the
        masters' (the fp16 model's stay scaled): clip
        ``optimizer.master_params()``, not ``model.parameters()``.
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
        found_inf = torch.zeros(1, dtype=torch.float32, device=device)
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
        Returns the optimizer's return value, or None for a skipped step."""
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
        # The one host synchronization of a training step.
        state["overflow"] = state["found_inf"].item() != 0.0
        if state["overflow"]:
            return None
        return optimizer.step(*args, **kwargs)

    def update(self, new_scale=None):
        """Adjusts the scale after the steps of one iteration."""
        if not self._enabled:
            return
        if new_scale is None and not self._optimizer_states:
            raise RuntimeError("mpgemm.amp.LossScaler: update() found no step or unscale_ since the last update(); "
                               "call scaler.step(optimizer) first")
        overflow = any(
            s["overflow"] if s["overflow"] is not None else s["found_inf"].item() != 0.0
            for s in self._optimizer_states.values()
            if s["found_inf"] is not None
        )
        self.last_step_skipped = overflow
        self.skipped_steps += int(overflow)
        if new_scale is not None:
            self._scale = float(new_scale.item() if isinstance(new_scale, torch.Tensor) else new_scale)
        elif self._dynamic:
            self._update_scale(overflow)
        self._scale_tensor = None
        self._optimizer_states = {}
        self._scaled_since_update = False

    def _update_scale(self, overflow):
        if overflow:
            self._growth_tracker = 0
            self._overflows_in_a_row += 1
            if self._overflows_in_a_row >= self._hysteresis:
                self._scale = max(self._scale * self._backoff_factor, self._min_scale)
                self._overflows_in_a_row = 0
        else:
            self._overflows_in_a_row = 0
            self._growth_tracker += 1
            if self._growth_tracker == self._growth_interval:
                self._scale *= self._growth_factor
                self._growth_tracker = 0

    def state_dict(self):
        if not self._enabled:
            return {}
        return {
            "scale": self._scale,
            "growth_factor": self._growth_factor,
            "backoff_factor": self._backoff_factor,
            "growth_interval": self._growth_interval,
            "_growth_tracker": self._growth_tracker,
            "min_scale": self._min_scale,
            "hysteresis": self._hysteresis,
            "dynamic": self._dynamic,
            "_overflows_in_a_row": self._overflows_in_a_row,
            "skipped_steps": self.skipped_steps,
            "last_step_skipped": self.last_step_skipped,
        }

    def load_state_dict(self, state_dict):
        if not self._enabled:
            return
        if not state_dict:
            raise RuntimeError("mpgemm.amp.LossScaler: the state_dict is empty; it was saved from a disabled scaler")
        if self._dynamic and float(state_dict["scale"]) < self._min_scale and "min_scale" not in state_dict:
            raise ValueError(f"mpgemm.amp.LossScaler: the saved scale {state_dict['scale']} is below min_scale "
                             f"({self._min_scale})")
        self._scale = float(state_dict["scale"])
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._growth_tracker = int(state_dict["_growth_tracker"])
        # Keys beyond GradScaler's, so a GradScaler state_dict loads too.
        self._min_scale = float(state_dict.get("min_scale", self._min_scale))
        self._hysteresis = int(state_dict.get("hysteresis", self._hysteresis))
        self._dynamic = bool(state_dict.get("dynamic", self._dynamic))
        self._overflows_in_a_row = int(state_dict.get("_overflows_in_a_row", 0))
        self.skipped_steps = int(state_dict.get("skipped_steps", 0))
        self.last_step_skipped = bool(state_dict.get("last_step_skipped", False))
        self._scale_tensor = None


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

