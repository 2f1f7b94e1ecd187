"""Independent float64 references and error measures, shared by the tests and
`python -m mpgemm verify`."""

import torch
import torch.nn.functional as F

# Relative-error bounds ||out - ref|| / ||ref|| per output dtype. fp32 output
# leaves only fp32 summation error; fp16 output adds one rounding (2**-11),
# bf16 output one of 2**-9.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 8e-3}
# Tensor Core fp32 accumulation rounds differently from sequential fp32 adds.
CUDA_FP32_TOLERANCE = 1e-4


def tolerance(out_dtype, device):
    if out_dtype == torch.float32 and torch.device(device).type == "cuda":
        return CUDA_FP32_TOLERANCE
    return TOLERANCE[out_dtype]


def reference_gemm(a, b, bias=None, activation=None):
    """activation(a @ b + bias) in float64 on the same 16-bit values, on the CPU."""
    out = torch.matmul(a.double().cpu(), b.double().cpu())
    if bias is not None:
        out = out + bias.double().cpu()
    if activation is not None and activation not in TORCH_ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r}")
    return out if activation is None else TORCH_ACTIVATIONS[activation](out)


# The activations whose derivative mpgemm.mlp and _gemm_activation_grad
# take, as torch computes them.
TORCH_ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}


def activation_grad_reference(a, b, z, activation):
    """(a @ b) * activation'(z) in float64 on the CPU, the slope from
    autograd through torch's own activation (ReLU's 0 at 0, as torch's)."""
    z64 = z.double().cpu()
    slope = torch.func.grad(lambda t: TORCH_ACTIVATIONS[activation](t).sum())(z64)
    return torch.matmul(a.double().cpu(), b.double().cpu()) * slope


def torch_activation_backward(grad, z, activation):
    """torch's own backward of `activation` at its input z: gelu_backward
    (either form), threshold_backward or silu_backward."""
    if activation == "relu":
        return torch.ops.aten.threshold_backward(grad, z, 0)
    if activation == "silu":
        return torch.ops.aten.silu_backward(grad, z)
    return torch.ops.aten.gelu_backward(grad, z, approximate="tanh" if activation == "gelu_tanh" else "none")


# The gate activations of mpgemm.gated_mlp, as torch computes them.
GATE_ACTIVATIONS = {"silu": F.silu, "gelu": TORCH_ACTIVATIONS["gelu"], "gelu_tanh": TORCH_ACTIVATIONS["gelu_tanh"]}


def gated_reference(grad, gate, up, activation):
    """The gating's passes in float64 on the CPU from the 16-bit tensors as
    given: {"p": act(g) * u, "grad_gate": dp * u * act'(g) (act' by
    autograd through torch's own activation), "grad_up": dp * act(g)}."""
    dp, g, u = (t.double().cpu() for t in (grad, gate, up))
    slope = torch.func.grad(lambda t: GATE_ACTIVATIONS[activation](t).sum())(g)
    a = GATE_ACTIVATIONS[activation](g)
    return {"p": a * u, "grad_gate": dp * u * slope, "grad_up": dp * a}


def cublas_reference(a, b, bias=None, activation=None):
    """activation(a @ b + bias) with cuBLAS doing the product (fp16 in, fp32
    accumulate and out), batch by batch; bias and activation in fp32."""
    batch = max([t.shape[0] for t in (a, b) if t.dim() == 3], default=None)
    if batch is None:
        out = torch.ops.mpgemm._cublas_gemm(a, b, out_dtype=torch.float32)
    else:
        a3, b3 = (t.expand(batch, *t.shape[-2:]) for t in (a, b))
        out = torch.stack([torch.ops.mpgemm._cublas_gemm(x, y, out_dtype=torch.float32) for x, y in zip(a3, b3)])
    if bias is not None:
        out = out + bias.float()
    return {None: out, "relu": torch.relu(out), "gelu": F.gelu(out)}[activation].double().cpu()


def relative_error(out, ref):
    """||out - ref|| / ||ref|| in float64 on ref's device (0 when both are
    empty or zero)."""
    diff = torch.linalg.vector_norm(out.to(ref.device, torch.float64) - ref)
    norm = torch.linalg.vector_norm(ref)
    return (diff / norm).item() if norm > 0 else diff.item()


def max_abs_error(out, ref):
    return (out.double().cpu() - ref).abs().max().item() if ref.numel() else 0.0


def random_operand(shape, *, layout="row", device="cpu", generator=None, dtype=torch.float16):
    """A random tensor of `dtype` (fp16 by default) and logical `shape` stored
    as `layout`: "row" (contiguous), "col" (a transposed view of the last two
    dimensions), or "strided" (a view whose last dimension is not contiguous
    either)."""
    shape = tuple(shape)
    if layout == "row":
        return torch.randn(shape, generator=generator).to(device, dtype)
    if layout == "col":
        t = torch.randn(shape[:-2] + (shape[-1], shape[-2]), generator=generator).to(device, dtype)
        return t.transpose(-1, -2)
    if layout == "strided":
        t = torch.randn(shape[:-1] + (2 * shape[-1],), generator=generator).to(device, dtype)
        return t[..., ::2]
    raise ValueError(f"unknown layout {layout!r}")
