"""`bench host`: the host's time per call of mpgemm's ops beside torch's
equivalents in the same process, on tensors so small that the arithmetic is
negligible, so that what is timed is what the host does per call: Python,
the dispatcher, autograd, checks, the plan and the launch.

Each case is timed as many calls in a row, best of several repetitions (the
device synchronized around each, so that a GPU's queue never fills): on a
GPU the kernels of a call run while the host issues the next, and the time
per call is the host's wherever it exceeds the device's few microseconds.
Where there is no GPU, torch's side runs in fp32, whose CPU path is the one
its fp16 path takes on a GPU (its CPU fp16 convolution computes slowly, which
would time arithmetic, not the host), and mpgemm's in fp16. The last case is
a whole training step of a small MLP: mpgemm.amp.prepare with its
LossScaler against torch.autocast with GradScaler, fused AdamW in both.
"""

import dataclasses
import time

import torch
import torch.nn.functional as F

import mpgemm

from .display import format_table, json_saver, wrap

CALLS, REPS, WARMUP_CALLS = 200, 5, 50


@dataclasses.dataclass
class HostCase:
    name: str
    mpgemm_us: float
    torch_us: float

    @property
    def ratio(self):
        return self.mpgemm_us / self.torch_us


def time_per_call_us(fn, device, calls=CALLS, reps=REPS, warmup_calls=WARMUP_CALLS):
    """Best of `reps` runs of `calls` calls, in microseconds per call."""
    for _ in range(warmup_calls):
        fn()
    best = float("inf")
    for _ in range(reps):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def _leaf(*shape, device, dtype, channels_last=False):
    t = torch.randn(*shape, device=device, dtype=dtype)
    return (t.to(memory_format=torch.channels_last) if channels_last else t).requires_grad_()


def _op_cases(device, ours_dtype, theirs_dtype):
    """(name, mpgemm's call, torch's call) for each op case."""
    def operands(dtype):
        x, w, b = (_leaf(*s, device=device, dtype=dtype) for s in ((4, 16), (8, 16), (8,)))
        image = _leaf(1, 8, 6, 6, device=device, dtype=dtype, channels_last=True)
        filters = _leaf(8, 8, 3, 3, device=device, dtype=dtype, channels_last=True)
        return x, w, b, image, filters, torch.ones(4, 8, device=device, dtype=dtype), torch.ones_like(image)

    ours, theirs = operands(ours_dtype), operands(theirs_dtype)

    def linear(mm, op):
        x, w, b = mm[:3]
        return lambda: op(x, w, b)

    def linear_no_grad(mm, op):
        x, w = mm[0].detach(), mm[1].detach()

        def run():
            with torch.no_grad():
                return op(x, w)
        return run

    def linear_backward(mm, op):
        x, w, b, _, _, grad, _ = mm
        return lambda: op(x, w, b).backward(grad)

    def gemm(mm, op):
        x, w = mm[0], mm[1]
        return lambda: op(x, w.t())

    def conv(mm, op):
        image, filters = mm[3], mm[4]
        return lambda: op(image, filters, padding=1)

    def conv_no_grad(mm, op):
        image, filters = mm[3].detach(), mm[4].detach()

        def run():
            with torch.no_grad():
                return op(image, filters, padding=1)
        return run

    def conv_backward(mm, op):
        image, filters, grad = mm[3], mm[4], mm[6]
        return lambda: op(image, filters, padding=1).backward(grad)

    # Layer norm over x's 16 columns: mpgemm's with fp32 weights (a prepared model's), torch's with x's type.
    norm_weights = {dtype: (_leaf(16, device=device, dtype=dtype), _leaf(16, device=device, dtype=dtype))
                    for dtype in (torch.float32, theirs_dtype)}

    def layer_norm(mm, op, weights_dtype):
        x, (w, b) = mm[0], norm_weights[weights_dtype]
        return lambda: op(x, (16,), w, b)

    def layer_norm_backward(mm, op, weights_dtype):
        x, (w, b) = mm[0], norm_weights[weights_dtype]
        grad = torch.ones_like(x)
        return lambda: op(x, (16,), w, b).backward(grad)

    # mpgemm's ops as torch.ops calls them (their torch.compile graph's
    # call, and the eager one before mpgemm._C's entries): beside the rows
    # above, what the entries save in the same run.
    def linear_torch_ops(x, w, b):
        return torch.ops.mpgemm.linear.default(x, w, b)

    def conv_torch_ops(x, w, padding):
        return torch.ops.mpgemm.conv2d.default(x, w, None, (1, 1), (padding,) * 4, (1, 1), 1)

    return [
        ("linear forward", linear(ours, mpgemm.linear), linear(theirs, F.linear)),
        ("linear forward, through torch.ops", linear(ours, linear_torch_ops), linear(theirs, F.linear)),
        ("linear forward, no_grad", linear_no_grad(ours, mpgemm.linear), linear_no_grad(theirs, F.linear)),
        ("linear forward + backward", linear_backward(ours, mpgemm.linear), linear_backward(theirs, F.linear)),
        ("gemm forward", gemm(ours, mpgemm.gemm), gemm(theirs, torch.matmul)),
        ("conv2d 3x3 forward", conv(ours, mpgemm.conv2d), conv(theirs, F.conv2d)),
        ("conv2d 3x3 forward, through torch.ops", conv(ours, conv_torch_ops), conv(theirs, F.conv2d)),
        ("conv2d 3x3 forward, no_grad", conv_no_grad(ours, mpgemm.conv2d), conv_no_grad(theirs, F.conv2d)),
        ("conv2d 3x3 forward + backward", conv_backward(ours, mpgemm.conv2d), conv_backward(theirs, F.conv2d)),
        ("layer_norm forward", layer_norm(ours, mpgemm.layer_norm, torch.float32),
         layer_norm(theirs, F.layer_norm, theirs_dtype)),
        ("layer_norm forward + backward", layer_norm_backward(ours, mpgemm.layer_norm, torch.float32),
         layer_norm_backward(theirs, F.layer_norm, theirs_dtype)),
    ]


def _mlp(device):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16),
                               torch.nn.ReLU(), torch.nn.Linear(16, 4)).to(device)


def _training_steps(device):
    """mpgemm's prepared step and torch.amp's on the same small MLP: forward,
    backward, the scaler's step and update, zero_grad."""
    x, target = torch.randn(8, 16, device=device), torch.randn(8, 4, device=device)
    net = _mlp(device)
    model, optimizer, scaler = mpgemm.amp.prepare(net, torch.optim.AdamW(net.parameters(), fused=True))
    peer = _mlp(device)
    peer_optimizer = torch.optim.AdamW(peer.parameters(), fused=True)
    peer_scaler = torch.amp.GradScaler(device.type)

    def ours():
        scaler.scale(F.mse_loss(model(x), target)).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)

    def theirs():
        with torch.autocast(device.type, dtype=torch.float16):
            loss = F.mse_loss(peer(x).float(), target)
        peer_scaler.scale(loss).backward()
        peer_scaler.step(peer_optimizer)
        peer_scaler.update()
        peer_optimizer.zero_grad(set_to_none=True)

    return ours, theirs


def run(device, calls=CALLS, reps=REPS, warmup_calls=WARMUP_CALLS, progress=print):
    """Every case on `device`: a list of HostCase."""
    theirs_dtype = torch.float16 if device.type == "cuda" else torch.float32
    cases = _op_cases(device, torch.float16, theirs_dtype) + [("training step (MLP, fp16)", *_training_steps(device))]
    results = []
    for name, ours, theirs in cases:
        timed = [time_per_call_us(fn, device, calls, reps, warmup_calls) for fn in (ours, theirs)]
        results.append(HostCase(name, *timed))
        progress(f"  {name}: {timed[0]:.1f} us against {timed[1]:.1f} us")
    return results


def report(results, device, calls=CALLS, reps=REPS):
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU, one thread"
    rows = [[r.name, f"{r.mpgemm_us:.1f}", f"{r.torch_us:.1f}", f"{r.ratio:.2f}x"] for r in results]
    return "\n".join([
        wrap(f"Host time per call ({where}; tiny tensors, so the host's work is what is timed; best of "
             f"{reps} runs of {calls} calls):"),
        format_table(["case", "mpgemm us", "torch us", "mpgemm / torch"], rows),
    ])


def main(args):
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)  # the host's own cost, not a thread pool's start-up
    try:
        results = run(device, CALLS, REPS, WARMUP_CALLS)
    finally:
        torch.set_num_threads(threads)
    print(report(results, device, CALLS, REPS))
    json_saver(args.json)({"suite": "host", "device": device.type,
                           "cases": [dataclasses.asdict(r) | {"ratio": r.ratio} for r in results]})
    return 0
