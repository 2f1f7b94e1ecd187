"""FP32 master weights for an optimizer over an fp16 model."""

import collections

import torch

HALF, FLOAT = torch.float16, torch.float32


class MasterWeightOptimizer(torch.optim.Optimizer):
    """Wraps any ``torch.optim`` optimizer built over a model with fp16 parameters.

    Each fp16 parameter in the optimizer's param groups is replaced by an fp32
    master copy, so the inner optimizer, its state and any LR scheduler act on
    the masters. fp32 parameters (normalization layers, say) are stepped as
    they are. After each step the masters are written back into the fp16
    model.

    The gradient path is :meth:`unscale_grads_`: one pass over all parameters
    (one kernel launch on GPU) that converts each gradient to fp32, multiplies
    it by 1/scale and flags inf/NaN. ``mpgemm.amp.LossScaler`` calls it; without
    a scaler, :meth:`step` calls it with a scale of 1.

    Clip gradients on :meth:`master_params` after ``scaler.unscale_(optimizer)``.
    """

    def __init__(self, optimizer):
        if isinstance(optimizer, MasterWeightOptimizer):
            raise TypeError("mpgemm.amp.MasterWeightOptimizer: the optimizer already has master weights")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"mpgemm.amp.MasterWeightOptimizer: expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if optimizer.state:
            raise ValueError("mpgemm.amp.MasterWeightOptimizer: wrap the optimizer before its first step "
                             "(it already holds state for the fp16 parameters)")
        self.optimizer = optimizer
        # (model parameter, the tensor the optimizer steps): a new fp32 master
        # for an fp16 parameter, the parameter itself for an fp32 one.
        self._pairs = []
        for group in optimizer.param_groups:
            masters = []
            for p in group["params"]:
                if p.dtype not in (HALF, FLOAT):
                    raise TypeError(f"mpgemm.amp.MasterWeightOptimizer: parameters must be torch.float16 or "
                                    f"torch.float32, got {p.dtype}")
                master = p if p.dtype == FLOAT else torch.nn.Parameter(p.detach().to(FLOAT))
                self._pairs.append((p, master))
                masters.append(master)
            group["params"] = masters
        self._grads_unscaled = False
        # torch.optim.Optimizer's hook registries, so its register_* methods work.
        self._optimizer_step_pre_hooks = collections.OrderedDict()
        self._optimizer_step_post_hooks = collections.OrderedDict()
        self._optimizer_state_dict_pre_hooks = collections.OrderedDict()
        self._optimizer_state_dict_post_hooks = collections.OrderedDict()
        self._optimizer_load_state_dict_pre_hooks = collections.OrderedDict()
        self._optimizer_load_state_dict_post_hooks = collections.OrderedDict()

    # Optimizer's own pickling expects the attributes its __init__ sets.
    def __getstate__(self):
        return self.__dict__.copy()

    def __setstate__(self, state):
        self.__dict__.update(state)

    # The Optimizer interface, forwarded to the inner optimizer.
    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    @property
    def defaults(self):
        return self.optimizer.defaults

    def __repr__(self):
        return f"MasterWeightOptimizer({self.optimizer!r})"

    def model_params(self):
        return [model for model, _ in self._pairs]

    def master_params(self):
        return [master for _, master in self._pairs]

    def zero_grad(self, set_to_none=True):
        for model, master in self._pairs:
            for p in (model, master):
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()
        self._grads_unscaled = False

    def unscale_grads_(self, inv_scale, found_inf):
        """master.grad = fp32(model.grad) * inv_scale for every parameter with a
        gradient, in one pass; found_inf (fp32, one element) is set to 1 on any
        inf/NaN. No host synchronization."""
        grads, outs = [], []
        for model, master in self._pairs:
            if model.grad is None:
                # No gradient this step: nor may the master keep an old one.
                if master is not model:
                    master.grad = None
                continue
            if master is not model and master.grad is None:
                master.grad = torch.empty_like(master)
            grads.append(model.grad)
            outs.append(master.grad)
        torch.ops.mpgemm.unscale_grads_(grads, outs, found_inf, inv_scale)
        self._grads_unscaled = True

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("mpgemm.amp.MasterWeightOptimizer: closures are not supported")
        if not self._grads_unscaled:
            device = self._pairs[0][1].device if self._pairs else "cpu"
            self.unscale_grads_(torch.ones(1, device=device), torch.zeros(1, device=device))
        for hook in list(self._optimizer_step_pre_hooks.values()):
            hook(self, (), {})
        result = self.optimizer.step()
        self.copy_masters_to_model()
        self._grads_unscaled = False
        for hook in list(self._optimizer_step_post_hooks.values()):
            hook(self, (), {})
        return result

    @torch.no_grad()
    def copy_masters_to_model(self):
        pairs = [(model, master) for model, master in self._pairs if model is not master]
        if pairs:
            torch._foreach_copy_([m for m, _ in pairs], [s for _, s in pairs])

    def state_dict(self):
        return {"optimizer": self.optimizer.state_dict(), "masters": [m.detach().clone() for m in self.master_params()]}

    @torch.no_grad()
    def load_state_dict(self, state_dict):
        masters = state_dict["masters"]
        if len(masters) != len(self._pairs):
            raise ValueError(f"mpgemm.amp.MasterWeightOptimizer: the state holds {len(masters)} master weights, "
                             f"this optimizer has {len(self._pairs)}")
        for master, saved in zip(self.master_params(), masters):
            if master.shape != saved.shape:
                raise ValueError(f"mpgemm.amp.MasterWeightOptimizer: a saved master weight has shape "
                                 f"{tuple(saved.shape)}, this optimizer's has {tuple(master.shape)}")
        self.optimizer.load_state_dict(state_dict["optimizer"])
        for master, saved in zip(self.master_params(), masters):
            master.copy_(saved)
        self.copy_masters_to_model()

    def add_param_group(self, param_group):
        raise NotImplementedError("mpgemm.amp.MasterWeightOptimizer: add parameter groups before wrapping")
