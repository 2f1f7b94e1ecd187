"""The ways of training that the demo and `bench train` compare, and the one
training step they share.

  fp32            IEEE fp32: TF32 is switched off for cuDNN convolutions and
                  cuBLAS matmuls while the way runs (torch's default lets cuDNN
                  use it), and restored afterwards;
  torch.amp       torch.autocast to fp16 with torch.amp.GradScaler, the peer;
  mpgemm          mpgemm.amp.prepare(): fp16 model with fp32 master weights,
                  dynamic loss scaling, Conv2d and Linear layers on mpgemm;
  torch.amp bf16  torch.autocast to bf16, without a GradScaler: bf16 has fp32's
                  exponent range, so gradients need no loss scaling (torch's
                  advice for bf16);
  mpgemm bf16     mpgemm.amp.prepare(dtype=torch.bfloat16): bf16 model with
                  fp32 master weights; its LossScaler is disabled, for the same
                  reason, and the same step runs through it;
  mpgemm fused    mpgemm's way with mpgemm.fuse(): the conv -> batch norm
                  (-> residual add) (-> ReLU) chains on mpgemm's fused passes,
                  a transformer's linear -> GELU -> linear as one
                  mpgemm.mlp, a gated MLP (Llama's) as one
                  mpgemm.gated_mlp, fused on the first step's batch. Opt-in (not
                  among the default WAYS): ALL_WAYS lists it.
  torch.amp captured, mpgemm captured
                  torch.amp's and mpgemm's fp16 steps captured once into a CUDA
                  graph (torch.cuda.graph) and replayed: CAPTURE_AFTER_STEPS
                  eager steps on a side stream first, as torch asks, then the
                  capture, then each step copies its batch into the graph's
                  inputs and replays it. torch.amp's autocast runs without its
                  cast cache there, as torch's graph recipe asks. A GPU's
                  ways, opt-in like the fused one.

The loss is computed in fp32 from the model's output, the same way for all
of them. A step is timed between two GPU synchronizations, so its time is the
work it queued, not the time to queue it.
"""

import collections
import contextlib
import dataclasses
import time

import torch
from torch.profiler import record_function
from torch.utils._python_dispatch import TorchDispatchMode

from .. import amp
from ..fusion import fuse
from . import step_profile


@dataclasses.dataclass(frozen=True)
class Way:
    """How one of the WAYS trains: its recipe, and the type its products take."""

    name: str
    recipe: str  # "fp32", "torch.amp" or "mpgemm"
    dtype: torch.dtype  # the type its products take
    fused: bool = False  # mpgemm.fuse() on the prepared model
    captured: bool = False  # the step captured into a CUDA graph and replayed

    @property
    def loss_scaled(self):
        """fp16's narrow exponent range needs loss scaling; bf16's and fp32's do not."""
        return self.dtype == torch.float16


WAYS_BY_NAME = {way.name: way for way in (
    Way("fp32", "fp32", torch.float32),
    Way("torch.amp", "torch.amp", torch.float16),
    Way("mpgemm", "mpgemm", torch.float16),
    Way("torch.amp bf16", "torch.amp", torch.bfloat16),
    Way("mpgemm bf16", "mpgemm", torch.bfloat16),
    Way("mpgemm fused", "mpgemm", torch.float16, fused=True),
    Way("torch.amp captured", "torch.amp", torch.float16, captured=True),
    Way("mpgemm captured", "mpgemm", torch.float16, captured=True),
)}
ALL_WAYS = tuple(WAYS_BY_NAME)
WAYS = tuple(name for name, way in WAYS_BY_NAME.items() if not (way.fused or way.captured))  # the default ones
CAPTURE_AFTER_STEPS = 3  # a captured way's eager warm-up steps that update the model, before its capture
FP32_NOTE = "fp32 is IEEE fp32: TF32 off for cuDNN convolutions and cuBLAS matmuls during its runs"
BF16_NOTE = "the bf16 ways use no loss scaling (bf16 has fp32's exponent range)"


@contextlib.contextmanager
def ieee_fp32():
    """TF32 off for cuDNN convolutions and cuBLAS matmuls, restored on exit."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@dataclasses.dataclass
class StepResult:
    seconds: float
    loss: float
    skipped: bool  # the scaler found inf/NaN gradients and did not apply the update
    scale: float  # the loss scale the step used (1 where there is none)


@dataclasses.dataclass
class Trainer:
    """A model and its optimizer set up to train one of the WAYS."""

    way: str
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scaler: object  # None, torch.amp.GradScaler or mpgemm.amp.LossScaler (disabled for bf16)
    device: torch.device
    fuse_on_first_step: bool = False  # the fused way fuses on its first batch
    # A captured way's graph once captured, its inputs and loss, and its
    # eager steps that updated the model before the capture.
    graph: object = None
    graph_tensors: tuple = ()
    eager_steps: int = 0

    @property
    def warming_up(self):
        """Whether a captured way has yet to capture its step (its first
        steps run eagerly, the one after them captures, then replays)."""
        return WAYS_BY_NAME[self.way].captured and self.graph is None

    def autocast(self):
        """torch.autocast to the way's 16-bit type for torch.amp's ways
        (without its cast cache where the step is captured, as torch's graph
        recipe asks); nothing for the others."""
        way = WAYS_BY_NAME[self.way]
        if way.recipe != "torch.amp":
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=way.dtype, cache_enabled=not way.captured)

    def step(self, x, target, loss_fn):
        """One timed forward, backward and optimizer step on (x, target). Its
        phases are marked as profiler ranges (step_profile.py reads them)."""
        if self.fuse_on_first_step:
            fuse(self.model, x)
            self.fuse_on_first_step = False
        # Read before the clock starts: reading a scale waits for the device.
        scale = 1.0 if self.scaler is None else self.scaler.get_scale()
        synchronize(self.device)
        start = time.perf_counter()
        with record_function(step_profile.STEP):
            if WAYS_BY_NAME[self.way].captured:
                loss = self._captured_step(x, target, loss_fn)
            else:
                loss = self._eager_step(x, target, loss_fn)
            synchronize(self.device)
        seconds = time.perf_counter() - start
        skipped = self._skipped(scale)
        if self.warming_up and not skipped:
            # Only a step that updated counts: until one has, an optimizer may
            # still create its state, which mpgemm's fused SGD decides on the host.
            self.eager_steps += 1
        return StepResult(seconds, loss.item(), skipped, scale)

    def _eager_step(self, x, target, loss_fn, zero_grad=True):
        with record_function(step_profile.phase_name("forward")):
            with self.autocast():
                output = self.model(x)
            loss = loss_fn(output.float(), target)
        with record_function(step_profile.phase_name("backward")):
            (loss if self.scaler is None else self.scaler.scale(loss)).backward()
        with record_function(step_profile.phase_name("optimizer")):
            if self.scaler is None:
                self.optimizer.step()
            else:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            if zero_grad:
                self.optimizer.zero_grad(set_to_none=True)
        return loss

    def _captured_step(self, x, target, loss_fn):
        """torch's recipe for a whole step in a CUDA graph: eager steps on a
        side stream, then a capture of the step with the gradients unset (the
        backward allocates them in the graph's pool, and each replay
        overwrites them), then the batch copied into the graph's inputs and a
        replay a step."""
        if self.graph is not None:
            static_x, static_target, loss = self.graph_tensors
            static_x.copy_(x)
            static_target.copy_(target)
            self.graph.replay()
            return loss
        if self.eager_steps < CAPTURE_AFTER_STEPS:
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                loss = self._eager_step(x, target, loss_fn)
            torch.cuda.current_stream(self.device).wait_stream(side)
            return loss
        static_x, static_target = x.clone(), target.clone()
        self.optimizer.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            loss = self._eager_step(static_x, static_target, loss_fn, zero_grad=False)
        self.graph, self.graph_tensors = graph, (static_x, static_target, loss)
        graph.replay()
        return loss

    def _skipped(self, scale_before):
        if self.scaler is None:
            return False
        if isinstance(self.scaler, amp.LossScaler):
            return self.scaler.last_step_skipped
        # GradScaler lowers its scale after an overflow, and only then.
        return self.scaler.get_scale() < scale_before


@contextlib.contextmanager
def setup(way, model, optimizer, device):
    """A Trainer for `way` over an fp32 model and its optimizer, which
    mpgemm's ways replace by prepared ones. The fp32 way runs in IEEE fp32
    inside the block."""
    if way not in ALL_WAYS:
        raise ValueError(f"way must be one of {', '.join(ALL_WAYS)}, got {way!r}")
    chosen, device = WAYS_BY_NAME[way], torch.device(device)
    if chosen.captured and device.type != "cuda":
        raise ValueError(f"way {way!r} captures its step in a CUDA graph: it needs a CUDA device, got {device}")
    with ieee_fp32() if chosen.recipe == "fp32" else contextlib.nullcontext():
        scaler = None
        if chosen.recipe == "torch.amp" and chosen.loss_scaled:
            scaler = torch.amp.GradScaler(device.type)
        elif chosen.recipe == "mpgemm":
            model, optimizer, scaler = amp.prepare(model, optimizer, dtype=chosen.dtype)
        yield Trainer(way, model, optimizer, scaler, device, fuse_on_first_step=chosen.fused)


class SavedBytes:
    """Bytes of the storage autograd keeps for backward inside the block
    (activations, and the parameters kept with them), each storage once (a
    tensor two ops save, or views of one): memory that a CPU run can
    measure."""

    def __init__(self):
        self.total = 0

    def __enter__(self):
        seen = set()

        def pack(t):
            if t.layout != torch.strided:  # no storage of its own: its elements
                self.total += t.numel() * t.element_size()
                return t
            storage = t.untyped_storage()
            key = (storage.device, storage.data_ptr())
            if key not in seen:
                seen.add(key)
                self.total += storage.nbytes()
            return t

        self._hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)


class DispatchedOps(TorchDispatchMode):
    """The aten (and mpgemm) ops dispatched inside the block, by name, below
    autograd: each op a step's forward, backward and optimizer run, and the
    casts (``_to_copy``) among them."""

    def __init__(self):
        super().__init__()
        self.count = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self):
        return sum(self.count.values())

    @property
    def casts(self):
        return self.count["_to_copy"]


@dataclasses.dataclass
class StepCost:
    """What one training step costs beyond its kernels' speed, as a CPU run
    can measure it: bytes autograd saved for backward, ops dispatched, casts."""

    saved_bytes: int
    ops: int
    casts: int


def measure_step_cost(trainer, x, target, loss_fn):
    """The cost of a steady-state step of `trainer` on (x, target): one step
    first, so that lazily made state (momentum buffers, the scaler's) is not
    counted, then the measured one."""
    trainer.step(x, target, loss_fn)
    saved, ops = SavedBytes(), DispatchedOps()
    with saved, ops:
        trainer.step(x, target, loss_fn)
    return StepCost(saved.total, ops.total, ops.casts)
