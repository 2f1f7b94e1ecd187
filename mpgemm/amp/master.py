"""FP32 master weights for an optimizer over a 16-bit (fp16 or bf16) model."""

import collections
import functools
import weakref

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from .master_grads import link_gradient, unscale_target

FLOAT = torch.float32
LOW_PRECISION = (torch.float16, torch.bfloat16)

# The 16-bit parameters of prepared models, for as long as they live (their
# optimizer may be dropped first): prepare() registers those it casts, a
# MasterWeightOptimizer those it holds masters for. Only a master optimizer
# may step them: another optimizer would round every update to 16 bits and
# leave the masters behind (or give a parameter none at all). Also each
# master optimizer's inner optimizer, which only the master optimizer steps.
_SIXTEEN_BIT_PARAMS = weakref.WeakValueDictionary()  # id -> parameter (tensors do not hash by value)
_OUTER_OF_INNER = weakref.WeakKeyDictionary()  # inner optimizer -> weakref to its MasterWeightOptimizer
_CHECKED = weakref.WeakKeyDictionary()  # optimizer -> (registrations, its parameter count) when last found clean
_registrations = 0
_step_hook = None


def register_16_bit_params(params):
    """Marks params as a prepared model's 16-bit parameters (above)."""
    global _registrations, _step_hook
    if _step_hook is None:
        _step_hook = register_optimizer_step_pre_hook(_refuse_steps_that_bypass_masters)
    _SIXTEEN_BIT_PARAMS.update((id(p), p) for p in params)
    _registrations += 1


def _refuse_steps_that_bypass_masters(optimizer, args, kwargs):
    """Global optimizer pre-step hook (torch.optim): the check above. An
    optimizer found clean is looked at again only when its parameter count
    or the registrations change, so a step pays a few dictionary lookups."""
    outer = _OUTER_OF_INNER.get(optimizer)
    if outer is not None:
        outer = outer()
        if outer is not None and not outer._stepping:
            raise RuntimeError(
                f"mpgemm.amp: this {type(optimizer).__name__} steps the fp32 masters of a MasterWeightOptimizer "
                f"directly, so the 16-bit model would not follow; step the optimizer that prepare() returned")
        return
    if not _SIXTEEN_BIT_PARAMS:
        return
    key = (_registrations, sum(len(group["params"]) for group in optimizer.param_groups))
    if _CHECKED.get(optimizer) == key:
        return
    held = sum(_SIXTEEN_BIT_PARAMS.get(id(p)) is p for group in optimizer.param_groups for p in group["params"])
    if held:
        raise RuntimeError(
            f"mpgemm.amp: this {type(optimizer).__name__} steps {held} 16-bit parameter(s) of a model that "
            f"mpgemm.amp.prepare() made 16-bit; its updates would be rounded to 16 bits, without fp32 masters. "
            f"Build one optimizer over every parameter to train (param groups for different settings) before "
            f"prepare(), pass it in, and step the optimizer prepare() returns. An optimizer that keeps an inner "
            f"optimizer of its own over the parameters (ZeroRedundancyOptimizer) cannot hold the masters")
    _CHECKED[optimizer] = key


def _track(optimizer, pairs):
    _OUTER_OF_INNER[optimizer.optimizer] = weakref.ref(optimizer)
    register_16_bit_params(model for model, master in pairs if model is not master)


class MasterWeightOptimizer(torch.optim.Optimizer):
    """Wraps any ``torch.optim`` optimizer built over a model with 16-bit
    (fp16 or bf16) parameters.

    Each 16-bit parameter in the optimizer's param groups is replaced by an
    fp32 master copy, so the inner optimizer, its state and any LR scheduler
    act on the masters. fp32 parameters (normalization layers, say) are stepped
    as they are. After each step the masters are rounded back into the 16-bit
    model.

    Gradients: each 16-bit parameter's gradient is summed in fp32 as backward
    produces it (:mod:`mpgemm.amp.master_grads`), so accumulation over
    micro-batches sums in fp32; the 16-bit parameter's ``.grad`` is (or, under
    torch.distributed, stands for) its master's, and
    ``torch.nn.utils.clip_grad_norm_(model.parameters(), ...)`` clips what this
    optimizer steps with, as does :meth:`clip_grad_norm_`. Read the masters'
    gradients through :meth:`master_params`, which brings them up to date.
    :meth:`unscale_grads_` multiplies them by 1/scale and flags inf/NaN in one
    pass; ``mpgemm.amp.LossScaler`` calls it, and without a scaler :meth:`step`
    calls it with a scale of 1.

    Weights: changes made to the 16-bit model between steps (``nn.init``,
    in-place copies, DistributedDataParallel's initial broadcast) are taken
    into the masters at the next step, wherever a model value differs from its
    master's 16-bit rounding. Writes through ``.data`` bypass the version
    counter that tells of a change and are not seen: write under
    ``torch.no_grad()`` instead.

    Checkpoints: with ``model`` given, ``model.state_dict()`` holds the fp32
    masters and ``model.load_state_dict()`` loads them, so model, optimizer
    and scaler resume exactly in any load order. Only the optimizer prepare()
    returned (or this wrapper) may step the model's 16-bit parameters: another
    optimizer stepping them, or the inner optimizer stepped on its own, is
    refused at its first step.
    """

    def __init__(self, optimizer, model=None):
        if isinstance(optimizer, MasterWeightOptimizer):
            raise TypeError("mpgemm.amp.MasterWeightOptimizer: the optimizer already has master weights")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(
                f"mpgemm.amp.MasterWeightOptimizer: expected a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError(f"mpgemm.amp.MasterWeightOptimizer: expected model to be a torch.nn.Module, "
                            f"got {type(model).__name__}")
        if optimizer.state:
            raise ValueError("mpgemm.amp.MasterWeightOptimizer: wrap the optimizer before its first step "
                             "(it already holds state for the 16-bit parameters)")
        self.optimizer = optimizer
        # (model parameter, the tensor the optimizer steps): a new fp32 master
        # for a 16-bit parameter, the parameter itself for an fp32 one.
        self._pairs = []
        for group in optimizer.param_groups:
            masters = []
            for p in group["params"]:
                if p.dtype not in (*LOW_PRECISION, FLOAT):
                    raise TypeError(f"mpgemm.amp.MasterWeightOptimizer: parameters must be torch.float16, "
                                    f"torch.bfloat16 or torch.float32, got {p.dtype}")
                master = p if p.dtype == FLOAT else torch.nn.Parameter(p.detach().to(FLOAT))
                self._pairs.append((p, master))
                masters.append(master)
            group["params"] = masters
        self._link_gradients()
        self._grads_unscaled = False
        self._stepping = False
        self._masters_loaded = False  # by load_state_dict, since the last step
        self._first_step = True
        _track(self, self._pairs)
        # torch.optim.Optimizer's hook registries, so its register_* methods work.
        self._optimizer_step_pre_hooks = collections.OrderedDict()
        self._optimizer_step_post_hooks = collections.OrderedDict()
        self._optimizer_state_dict_pre_hooks = collections.OrderedDict()
        self._optimizer_state_dict_post_hooks = collections.OrderedDict()
        self._optimizer_load_state_dict_pre_hooks = collections.OrderedDict()
        self._optimizer_load_state_dict_post_hooks = collections.OrderedDict()
        self._model = None if model is None else weakref.ref(model)
        if model is not None:
            _ModelStateHooks.attach(model, self)

    def _link_gradients(self):
        self._links = [link_gradient(model, master) for model, master in self._pairs if model is not master]
        self._link_of = {id(link.param): link for link in self._links}
        self._record_versions()

    def _record_versions(self):
        self._versions = {id(link.param): link.param._version for link in self._links}

    # Optimizer's own pickling expects the attributes its __init__ sets. The
    # gradient links hold hooks on the parameters: a copy makes its own.
    def __getstate__(self):
        state = self.__dict__.copy()
        del state["_links"], state["_link_of"], state["_versions"], state["_model"]
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._model = None  # a copy's parameters are not the model's
        self._link_gradients()
        _track(self, self._pairs)

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
        """The tensors the inner optimizer steps, their gradients up to date:
        tied to the model's until the next step (or skipped step) lets go of
        them, or the optimizer's ``zero_grad``."""
        self._flush_grads()
        return self._masters()

    def _masters(self):
        return [master for _, master in self._pairs]

    def zero_grad(self, set_to_none=True):
        for link in self._links:
            link.zero_grad(set_to_none)
        for model, master in self._pairs:
            if model is master and model.grad is not None:
                if set_to_none:
                    model.grad = None
                else:
                    model.grad.zero_()
        self._grads_unscaled = False

    def _flush_grads(self):
        for link in self._links:
            link.flush()

    def untie_grads(self):
        """The masters let go of the model's gradients after a step or a
        skipped one, so that ``model.zero_grad()`` frees them before the next
        backward (mpgemm.amp.master_grads)."""
        for link in self._links:
            link.untie()

    def unscale_grads_(self, inv_scale, found_inf):
        """Multiplies every master gradient by inv_scale in place, in one pass,
        and sets found_inf (fp32, one element) to 1 on any inf/NaN. No host
        synchronization."""
        self._flush_grads()
        grads = [unscale_target(master) for master in self._masters() if master.grad is not None]
        torch.ops.mpgemm.unscale_grads_(grads, grads, found_inf, inv_scale)
        self._grads_unscaled = True

    def clip_grad_norm_(self, max_norm, norm_type=2.0):
        """Clips the gradients this optimizer steps with to a total norm of at
        most max_norm, as ``torch.nn.utils.clip_grad_norm_`` does, and returns
        their total norm. Call it after ``scaler.unscale_(optimizer)``."""
        self._flush_grads()
        return torch.nn.utils.clip_grad_norm_(self._masters(), max_norm, norm_type)

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("mpgemm.amp.MasterWeightOptimizer: closures are not supported")
        if not self._grads_unscaled:
            device = self._pairs[0][1].device if self._pairs else "cpu"
            self.unscale_grads_(torch.ones(1, device=device), torch.zeros(1, device=device))
        else:
            self._flush_grads()  # a gradient replaced since the unscale
        for hook in list(self._optimizer_step_pre_hooks.values()):
            hook(self, (), {})
        if self._first_step or (self._links and all(link.master.grad is None for link in self._links)):
            self._check_parameters_still_in_model()
            self._first_step = False
        self._adopt_model_changes()
        self._stepping = True
        try:
            result = self.optimizer.step()
        finally:
            self._stepping = False
        self.copy_masters_to_model()
        self.untie_grads()
        self._grads_unscaled = False
        self._masters_loaded = False
        for hook in list(self._optimizer_step_post_hooks.values()):
            hook(self, (), {})
        return result

    def _check_parameters_still_in_model(self):
        """At the first step, and wherever no master has a gradient: refuses
        where the model's 16-bit parameters were replaced since prepare()
        (fully_shard turns them into sharded ones), which would leave them
        untrained."""
        model = self._model() if self._model is not None else None
        if model is None:
            return
        in_model = {id(p) for p in model.parameters()}
        replaced = sum(id(link.param) not in in_model for link in self._links)
        if replaced:
            raise RuntimeError(
                f"mpgemm.amp.MasterWeightOptimizer: {replaced} of the model's 16-bit parameters with masters are no "
                f"longer in the model (replaced after prepare(): by fully_shard? FSDP2 keeps fp32 parameters itself: "
                f"convert() the model, shard it with a MixedPrecisionPolicy and leave prepare() out)")

    @torch.no_grad()
    def _adopt_model_changes(self):
        """Masters take the values of 16-bit weights changed since the last step,
        wherever the model no longer holds the master's rounding."""
        for link in self._links:
            if link.param._version != self._versions[id(link.param)]:
                _master_takes_changes(link)

    @torch.no_grad()
    def copy_masters_to_model(self):
        if self._links:
            torch._foreach_copy_([link.param for link in self._links], [link.master for link in self._links])
        self._record_versions()

    def state_dict(self):
        return {"optimizer": self.optimizer.state_dict(), "masters": [m.detach().clone() for m in self._masters()]}

    @torch.no_grad()
    def load_state_dict(self, state_dict):
        masters = state_dict["masters"]
        if len(masters) != len(self._pairs):
            raise ValueError(f"mpgemm.amp.MasterWeightOptimizer: the state holds {len(masters)} master weights, "
                             f"this optimizer has {len(self._pairs)}")
        for master, saved in zip(self._masters(), masters):
            if master.shape != saved.shape:
                raise ValueError(f"mpgemm.amp.MasterWeightOptimizer: a saved master weight has shape "
                                 f"{tuple(saved.shape)}, this optimizer's has {tuple(master.shape)}")
        self.optimizer.load_state_dict(state_dict["optimizer"])
        for master, saved in zip(self._masters(), masters):
            master.copy_(saved)
        self.copy_masters_to_model()
        self._masters_loaded = True

    def add_param_group(self, param_group):
        raise NotImplementedError("mpgemm.amp.MasterWeightOptimizer: add parameter groups before wrapping")


def _master_takes_changes(link):
    """The master takes its 16-bit parameter's values wherever the parameter
    no longer holds the master's rounding, and keeps its own elsewhere."""
    changed = link.master.to(link.param.dtype) != link.param
    link.master.copy_(torch.where(changed, link.param.to(FLOAT), link.master))


class _ModelStateHooks:
    """state_dict and load_state_dict hooks on each module that owns 16-bit
    parameters with masters, so that a checkpoint resumes exactly whichever
    of model and optimizer loads first:

    - ``model.state_dict()`` holds the fp32 masters in place of those 16-bit
      parameters, as a torch.amp model's would (it loads into the fp32 model);
    - ``model.load_state_dict()`` gives the masters its entries' values (an
      fp32 entry's exactly), except that after the optimizer loaded its
      masters (and before the next step) a 16-bit entry moves only the
      masters whose 16-bit rounding it changes, so it does not undo them.

    Holds the optimizer weakly. A pickled or deep-copied model gets inert
    hooks, as its parameters are no longer the optimizer's."""

    def __init__(self, optimizer):
        self._optimizer = weakref.ref(optimizer)
        self._pending = {}  # id(module) -> [(name, parameter, value)] between its pre- and post-hook

    @classmethod
    def attach(cls, model, optimizer):
        hooks = cls(optimizer)
        for module in model.modules():
            if any(p is not None and id(p) in optimizer._link_of for p in module._parameters.values()):
                # A partial, as torch marks the hook with an attribute, which a bound method cannot take.
                module.register_state_dict_post_hook(functools.partial(hooks.after_state_dict))
                module.register_load_state_dict_pre_hook(hooks.before_load)
                module.register_load_state_dict_post_hook(hooks.after_load)

    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self._optimizer, self._pending = (lambda: None), {}

    def _linked(self, module):
        """(name, parameter, its gradient link) for module's parameters with masters."""
        optimizer = self._optimizer()
        if optimizer is None:
            return []
        return [(name, param, optimizer._link_of[id(param)]) for name, param in module._parameters.items()
                if param is not None and id(param) in optimizer._link_of]

    def after_state_dict(self, module, state_dict, prefix, local_metadata):
        for name, param, link in self._linked(module):
            entry = state_dict.get(prefix + name)
            # keep_vars=True keeps the parameter; a module's own format of an entry is left alone.
            if isinstance(entry, torch.Tensor) and entry is not param and entry.shape == link.master.shape:
                state_dict[prefix + name] = link.master.detach()

    def before_load(self, module, state_dict, prefix, *args):
        entries = ((name, param, link, state_dict.get(prefix + name)) for name, param, link in self._linked(module))
        self._pending[id(module)] = [(name, param, link, value) for name, param, link, value in entries
                                     if isinstance(value, torch.Tensor) and value.shape == param.shape]

    @torch.no_grad()
    def after_load(self, module, incompatible_keys):
        optimizer = self._optimizer()
        for name, param, link, value in self._pending.pop(id(module), []):
            if module._parameters[name] is not param:
                raise RuntimeError(
                    f"mpgemm.amp: load_state_dict(assign=True) replaced the parameter {name!r} that the optimizer "
                    f"holds; after prepare(), load with assign=False")
            if value.dtype in LOW_PRECISION and optimizer is not None and optimizer._masters_loaded:
                # The optimizer loaded its masters first: keep those the entry is the rounding of.
                _master_takes_changes(link)
            else:
                link.master.copy_(value)
            if optimizer is not None:
                optimizer._versions[id(param)] = param._version
