"""fp32 gradients for 16-bit parameters with fp32 masters.

A 16-bit (fp16 or bf16) parameter's gradient is summed in fp32, so that the
micro-batches of gradient accumulation add in fp32 where scaled fp16 sums
would overflow, and no 16-bit gradient outlives the backward that made it.
The link that does so is chosen when the optimizer is built
(:func:`link_gradient`):

- :class:`SharedGradient`, on one process: the parameter's ``grad_dtype``
  is fp32, so torch's autograd engine casts each incoming 16-bit gradient to
  fp32 and its AccumulateGrad sums it into ``param.grad``, in C++, with no
  hook per parameter. ``param.grad`` is then the fp32 gradient, and the
  master's ``.grad`` is the same tensor, tied at each flush (the optimizer's
  unscale, clip, step and ``master_params()``): the torch.amp recipe
  ``clip_grad_norm_(model.parameters(), ...)``, ``p.grad *= c``,
  ``print(p.grad)`` and ``model.zero_grad()`` act on what the optimizer
  steps with.
- :class:`HookedGradient`, where torch.distributed has a process group:
  DistributedDataParallel reduces ``p.grad`` in the parameter's dtype (its
  buckets refuse an fp32 gradient on a 16-bit parameter), so the 16-bit
  gradients stay on the parameters until the optimizer flushes them (at
  unscale) into the master's fp32 gradient, and hooks on each parameter keep
  ``param.grad`` standing for the master's (:class:`MasterGrad`).

So initialize torch.distributed before ``prepare()``.
"""

import sys
import weakref

import torch
import torch.distributed as dist

FLOAT = torch.float32


def is_dtensor(tensor):
    """Whether `tensor` is a DTensor (FSDP2's sharded parameters and
    gradients). A DTensor exists only once torch.distributed.tensor is
    imported, so the check imports nothing: importing it here would add
    about 4 s to every `import mpgemm` (sympy, through torch's symbolic
    shapes), nearly doubling it."""
    # (getattr: the module may be in sys.modules while another thread is still importing it.)
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    return dtensor is not None and isinstance(tensor, dtensor)


def distributed():
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def process_group_up():
    """Whether torch.distributed has a process group, of any size (DDP wraps
    a model under one process too)."""
    return dist.is_available() and dist.is_initialized()


def unscale_target(param):
    """The tensor to unscale in place for param.grad: itself, this rank's
    shard of a sharded gradient (FSDP2's), or a sparse gradient's values
    (fp16 ones coalesced first, so that the inf check sees the sums, as
    GradScaler does)."""
    if is_dtensor(param.grad):
        with torch.no_grad():
            return param.grad.to_local()
    if not param.grad.is_sparse:
        return param.grad
    if param.grad.dtype == torch.float16:
        param.grad = param.grad.coalesce()
    return param.grad._values()


def _resolve(obj):
    """obj with every MasterGrad in it (through lists, tuples and dicts)
    replaced by the master's gradient."""
    if isinstance(obj, MasterGrad):
        grad = obj._master.grad
        if grad is None:
            raise RuntimeError("mpgemm.amp: this parameter's master gradient has been cleared")
        return grad
    if isinstance(obj, (list, tuple)):
        return type(obj)(_resolve(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _resolve(v) for k, v in obj.items()}
    return obj


class MasterGrad(torch.Tensor):
    """The ``.grad`` of a 16-bit parameter whose gradient lives on its fp32
    master (a :class:`HookedGradient`'s): every torch function and tensor
    method applied to it acts on ``master.grad`` (norms, in-place scaling,
    printing), so what Python code reads and clips is what the optimizer
    steps with."""

    @staticmethod
    def __new__(cls, param, master):
        # One element broadcast to the parameter's shape: autograd accepts it
        # as the parameter's gradient, and it costs no memory.
        stub = torch.zeros((), dtype=param.dtype, device=param.device).expand(param.shape)
        proxy = torch.Tensor._make_subclass(cls, stub)
        proxy._master = master
        return proxy

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        with torch._C.DisableTorchFunctionSubclass():
            result = func(*_resolve(args), **_resolve(kwargs or {}))
        # An in-place method returns the master's gradient; `p.grad *= c`
        # then assigns the result to p.grad, which must stay the stand-in.
        if args and isinstance(args[0], MasterGrad) and result is args[0]._master.grad:
            return args[0]
        return result


def link_gradient(param, master):
    """The link that sums param's gradients into master's fp32 gradient, as
    the process runs now (the module's docstring)."""
    return HookedGradient(param, master) if process_group_up() else SharedGradient(param, master)


# id(16-bit parameter) -> (its grad_dtype before any link, the weak references
# of the SharedGradients that hold it): the last of them to go hands the
# parameter back. (Each link's finalizer keeps its parameter, so no id is
# reused while its entry lives.)
_SHARED_BY = {}


class SharedGradient:
    """One 16-bit parameter's fp32 gradient, shared with its master.

    ``param.grad`` is the truth: a flush ties ``master.grad`` to it (the same
    tensor, or None), except where the master's was set since the last tie
    while the parameter's was not (code that clears the gradients through
    the optimizer's param groups), which the parameter then takes. After a
    step the master lets go of it (:meth:`untie`), so that ``model.zero_grad()``
    frees it before the next backward, as torch.amp's frees its own.
    """

    def __init__(self, param, master):
        self.param, self.master = param, master
        self._tied = None  # a weak reference to the tensor last tied, or None
        ref = weakref.ref(self)
        _SHARED_BY.setdefault(id(param), (param.grad_dtype, set()))[1].add(ref)
        if param.grad_dtype != FLOAT:
            grad = param.grad
            if grad is not None and grad.dtype != FLOAT:
                param.grad = None  # torch changes grad_dtype only where no gradient of another dtype is kept
            param.grad_dtype = FLOAT
            if grad is not None and grad.dtype != FLOAT:
                param.grad = grad.to(FLOAT)
        weakref.finalize(self, _hand_back, param, ref).atexit = False

    def flush(self):
        """Ties the master's gradient to the parameter's."""
        grad, master_grad = self.param.grad, self.master.grad
        if grad is master_grad:
            pass
        elif self._tied is not None and self._tied() is grad:
            self.param.grad = grad = master_grad  # the master's was set since the tie
        else:
            self.master.grad = grad
        self._tied = None if grad is None else weakref.ref(grad)

    def untie(self):
        """The master lets go of the gradient; the parameter keeps it."""
        self.master.grad, self._tied = None, None

    def zero_grad(self, set_to_none):
        if set_to_none:
            self.param.grad = None
            self.untie()
            return
        self.flush()
        if self.param.grad is not None:
            self.param.grad.zero_()


def _hand_back(param, ref):
    """The parameter of the last of its links to go gets back the grad_dtype
    it had, and its gradient in that dtype."""
    grad_dtype, links = _SHARED_BY[id(param)]
    links.discard(ref)
    if links:
        return
    del _SHARED_BY[id(param)]
    grad = param.grad
    param.grad = None
    param.grad_dtype = grad_dtype
    if grad is not None:
        param.grad = grad if grad_dtype is None else grad.to(grad_dtype)


class HookedGradient:
    """Moves the gradient of one 16-bit parameter into its fp32 master, where
    torch.distributed has a process group.

    Invariant: the master's gradient is current while ``param.grad`` is the
    link's MasterGrad; a real tensor in ``param.grad`` (kept for DDP, or set by
    the user) still has to be added to it (:meth:`flush`); ``None`` means no
    gradient.
    """

    def __init__(self, param, master):
        self.param, self.master = param, master
        self.proxy = MasterGrad(param, master)
        self._continues = False  # the pre-hook took the proxy off: a real grad adds to the master's
        self._hooked = False
        self._install_hooks()

    def _install_hooks(self):
        if not self.param.requires_grad or self._hooked:
            return
        # Both hooks live on the tensor, not on its AccumulateGrad node: a node
        # held here would keep the stream it was made on, and every backward
        # would accumulate there (the default stream, which a CUDA graph's
        # capture refuses), where torch makes a fresh node on the forward's
        # stream. A leaf's tensor hooks also run when torch.autograd.grad asks
        # for its gradient, which accumulates nothing: a callback at the end of
        # that backward puts the stand-in back. The hooks hold the link weakly
        # and go with it, so a discarded optimizer leaves nothing running.
        link = weakref.ref(self)
        handles = [
            self.param.register_hook(lambda grad: _call(link, "_before_accumulate", grad)),
            self.param.register_post_accumulate_grad_hook(lambda param: _call(link, "_after_accumulate", param)),
        ]
        for handle in handles:
            weakref.finalize(self, handle.remove)
        self._hooked = True

    def _before_accumulate(self, grad):
        if grad is None:
            return  # AccumulateGrad adds nothing and calls no post-accumulate hook
        current = self.param.grad
        if current is self.proxy:
            self.param.grad = None  # AccumulateGrad cannot add into the stand-in
            self._continues = True
            link = weakref.ref(self)
            torch.autograd.Variable._execution_engine.queue_callback(lambda: _call(link, "_after_backward", None))
        elif current is None:
            self.master.grad = None
            self._continues = False

    def _after_backward(self, _):
        """The end of a backward that took the stand-in off: where nothing
        was accumulated (torch.autograd.grad), the master's gradient is still
        current, and the stand-in goes back."""
        if self.param.grad is None and self._continues:
            self.param.grad = self.proxy
            self._continues = False

    def _after_accumulate(self, param):
        if not process_group_up():  # torch.distributed ended since: no DDP reduces the gradient
            self.flush()

    def _absorb(self, grad):
        master_grad = self.master.grad
        if master_grad is None or not self._continues:
            self.master.grad = grad.to(FLOAT)
        elif master_grad.is_sparse and not grad.is_sparse:
            self.master.grad = grad.to(FLOAT).add_(master_grad)
        else:
            master_grad.add_(grad)

    def flush(self):
        """Brings the master's gradient up to date with ``param.grad``."""
        self._install_hooks()  # a parameter unfrozen since
        grad = self.param.grad
        if grad is self.proxy:
            return
        if grad is None:
            self.master.grad = None
        else:
            self._absorb(grad)
            if self._hooked:  # without hooks, AccumulateGrad would add into the stand-in
                self.param.grad = self.proxy
        self._continues = False

    def untie(self):
        pass  # the master's gradient is the only one: the parameter's is a stand-in

    def zero_grad(self, set_to_none):
        self.flush()
        if set_to_none or self.master.grad is None:
            self.param.grad = self.master.grad = None
        else:
            self.master.grad.zero_()


def _call(link_ref, method, arg):
    link = link_ref()
    if link is not None:
        getattr(link, method)(arg)
