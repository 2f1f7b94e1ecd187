"""`python -m mpgemm bench [gemm|linear|conv|ceiling|all]`: mpgemm against cuBLAS and cuDNN.

GEMM: mpgemm.gemm against cuBLAS doing the same computation (fp16 in, fp32
accumulate, fp32 out): cublasGemmEx with CUBLAS_COMPUTE_32F through the
extension, and torch.mm(..., out_dtype=torch.float32) where torch has it;
fp16-out figures against torch's fp16 mm. linear: mpgemm.linear's fused
bias+GELU against torch's F.linear plus gelu, forward and forward+backward.
conv: mpgemm.conv2d against cuDNN (F.conv2d, fp16, channels_last) on
ResNet-50's 23 distinct convolutions and five depthwise layers (MobileNetV2,
ConvNeXt-T), forward (with a bias where the model's layer has one: ConvNeXt-T's),
forward+backward, and backward data and backward filter alone. The
three run again on bf16 operands against the same baselines in bf16; those
impls' names say bf16 ("mpgemm bf16 fp32-out", "mpgemm bf16-out", "mpgemm
fused bf16 fwd"), the fp16 ones keep their names. ceiling:
the rate of WMMA's mma.sync with nothing else in the way (no loads, no
barriers; the large GEMM tile's warps, 1 or 2 blocks per SM), the bound that
GEMM's instruction mix can approach.

Each case times its implementations interleaved in one run (timing.py says
how, and why the numbers are device time alone), and first checks every
implementation's result against its baseline's: a kernel that computes the
wrong thing posts no number. The GPU's clocks, power and temperature are read
before and after each suite. On a machine without a GPU the suites run the CPU
reference on tiny shapes and say plainly that these are not GPU measurements.
"""

import argparse
import contextlib
import dataclasses
import os
import re

import torch
import torch.nn.functional as F

from .. import ops
from .._build import build_info
from ..testing import relative_error
from . import bench_report, display, gpu_state, models, provenance
from .progress import Progress
from .timing import CudaEventClock, WallClock, input_sets_for, profiled_kernel_ms, time_interleaved

# Dense fp16 Tensor Core peaks with fp32 accumulation, from vendor datasheets,
# matched against torch.cuda.get_device_name() in order. The bf16 peaks are the
# same on each of these that has bf16 Tensor Cores (sm_80 and newer).
KNOWN_PEAKS_TFLOPS = [
    (r"H100.*PCIe", 756.0),
    (r"H100 NVL", 835.5),
    (r"H100|H200", 989.4),
    (r"A100", 312.0),
    (r"L40S", 362.0),
    (r"\bL4\b", 121.0),
    (r"RTX 4090", 165.2),
    (r"\bT4\b", 65.0),
    (r"V100", 125.0),
]
L2_BYTES_FALLBACK = 64 * 2**20
# The result check stops a broken kernel from posting a number (its errors are
# of order 1); accuracy itself is what `verify` and the tests measure. The
# bounds, on ||result - baseline|| / ||baseline||, per operand type: fp16's
# leaves room for cuBLAS's and cuDNN's reduced-precision fp16 reductions. A
# bf16 value (8 significant bits) is within 2**-9 relative of the exact one,
# so two correctly rounded results may differ by 2**-8 (0.4%) from their last
# rounding alone; torch's unfused ops round two or three times where mpgemm
# rounds once, and cuBLAS and cuDNN may reduce in bf16. 2e-2 allows about five
# times 2**-8 and still fails a kernel whose errors are a few percent.
BASELINE_TOLERANCE = {"fp16": 1e-2, "bf16": 2e-2}
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}
# The operand types each suite runs; the ceiling times fp16 mma.sync alone.
SUITE_DTYPES = {"gemm": tuple(DTYPES), "linear": tuple(DTYPES), "conv": tuple(DTYPES), "ceiling": ("fp16",)}
BF16_NEEDS = "bf16 Tensor Cores need sm_80 or newer"


def gpu_suites(quick=False):
    """suite -> [(case, shape)] on a GPU: the full suites, or a few
    representative cases each. The full GEMM suite adds GPT-2 small's and
    Llama-7B's training GEMMs at 8192 tokens, each with its operand layouts
    (shape (m, n, k, "rc"): A row-major, B column-major). Conv runs every distinct convolution of
    ResNet-50 at 224x224 (read from `models.resnet50`, the model `bench
    train` trains), shape (batch, in, out, kernel, stride, padding, size),
    and depthwise layers of MobileNetV2 and ConvNeXt-T and ResNeXt-50's
    grouped ones, whose shapes add the groups."""
    resnet50 = models.resnet50_convolutions()
    if quick:
        return {
            "gemm": [("square", (1024, 1024, 1024)), ("square", (4096, 4096, 4096)), ("odd", (4095, 4097, 4093))],
            "linear": [("mlp", (4096, 16384, 4096)), ("mlp-block", (8192, 768, 3072)),
                       ("mlp-dgrad", (8192, 768, 3072)), ("gated-mlp", (8192, 2048, 5632))],
            "conv": [("resnet50", (32,) + layer) for layer in resnet50[1:4]] + DEPTHWISE[:1],
            "ceiling": [("mma.sync", (1, 20000))],
        }
    return {
        "gemm": [("square", (s, s, s)) for s in (512, 1024, 2048, 4096, 8192)]
        + [("odd", (4095, 4097, 4093)), ("odd", (1023, 1025, 1021))]
        + [(label, (m, n, k, "".join(layout[0] for layout in layouts)))
           for label, (m, n, k), layouts in models.training_gemms(TRAINING_SUITE_WIDTHS, (8192,))],
        "linear": [("mlp", (t, o, i)) for t in (2048, 8192, 16384) for (i, o) in ((4096, 16384), (16384, 4096))]
        + [(case, (t, d, f)) for case in ("mlp-block", "mlp-dgrad") for t in (8192, 16384)
           for (d, f) in ((768, 3072), (1024, 4096))]
        + [("gated-mlp", (8192, d, f)) for d, f in ((2048, 5632), (4096, 11008))],
        "conv": [("resnet50", (b,) + layer) for b in (32, 256) for layer in resnet50] + DEPTHWISE + GROUPED,
        "ceiling": [("mma.sync", (blocks_per_sm, 20000)) for blocks_per_sm in (1, 2)],
    }


# The transformers whose training GEMMs (models.training_gemms, at 8192
# tokens) the full GEMM suite runs: each linear's forward, dgrad and wgrad
# with their layouts (the shape's fourth element).
TRAINING_SUITE_WIDTHS = tuple(w for w in models.TRANSFORMER_WIDTHS if w[0] in ("gpt2-small", "llama-7b"))

# The conv cases whose layers add a bias: ConvNeXt-T's depthwise
# convolutions do; ResNet-50's and MobileNetV2's feed a batch norm and have
# none (bias=False, as torchvision builds them). Each case's forward is timed
# as its model runs it: cuDNN's convolution adds a bias in a pass of its own
# (torch's add after the convolution), which mpgemm fuses into its epilogue,
# so a bias that the layer lacks would time that pass on cuDNN's side alone.
# Until 2026-11-30 every forward had one: on ResNet-50's 1x1 layers at batch
# 256 (H200, fe39419) cuDNN's forward with it took 1.4x to 5.0x as long as
# cuDNN's backward-data pass of the same product, which has none.
CONV_CASES_WITH_BIAS = ("convnext_t",)

# (batch, channels, channels, kernel, stride, padding, size, groups = channels).
DEPTHWISE = [("mobilenet_v2", (64, 144, 144, 3, 1, 1, 56, 144)), ("mobilenet_v2", (64, 144, 144, 3, 2, 1, 56, 144)),
             ("mobilenet_v2", (64, 576, 576, 3, 1, 1, 14, 576)), ("convnext_t", (64, 96, 96, 7, 1, 3, 56, 96)),
             ("convnext_t", (64, 384, 384, 7, 1, 3, 14, 384))]

# ResNeXt-50 32x4d's grouped 3x3s of 4, 8 and 16 channels a group (the 8's
# at stride 2, the first of its stage), whose fprop and dgrad GEMMs are at
# most 16 columns wide a group (MPGEMM_CONV_N16_TILE's 128 x 16 tile):
# (batch, channels, channels, kernel, stride, padding, size, groups).
GROUPED = [("resnext50", (64, 128, 128, 3, 1, 1, 56, 32)), ("resnext50", (64, 256, 256, 3, 2, 1, 56, 32)),
           ("resnext50", (64, 512, 512, 3, 1, 1, 14, 32))]

CPU_SUITES = {
    "gemm": [("square", (64, 64, 64)), ("odd", (63, 65, 61))],
    "linear": [("mlp", (64, 256, 128)), ("mlp-block", (64, 32, 128)), ("mlp-dgrad", (64, 32, 128)),
               ("gated-mlp", (64, 32, 96))],
    # A ConvNeXt-T-like depthwise case, so that the CPU run checks a bias too.
    "conv": [("resnet50", (2, 16, 16, 3, 1, 1, 8)), ("convnext_t", (2, 16, 16, 3, 1, 1, 8, 16))],
    "ceiling": [("mma.sync", (1, 10))],
}

SUITES = tuple(CPU_SUITES)
# Suites whose cases --shapes replaces.
SHAPED_SUITES = ("gemm", "linear")


@dataclasses.dataclass
class Impl:
    """One implementation of a case's computation."""

    run: object  # the timed call: run(*input_set)
    result: object  # what the check compares: result(*input_set) -> tuple of tensors
    flops: float  # the work one call does; None where it does not do what is counted
    baseline: str = ""  # the impl whose result this one must match ("" for a baseline)
    expected: object = None  # or a reference: expected(*input_set) -> tuple of float64 CPU tensors


def parse_dtypes(text):
    """"fp16,bf16" -> ("fp16", "bf16")"""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names or any(n not in DTYPES for n in names):
        raise argparse.ArgumentTypeError(f"expected operand types from {', '.join(DTYPES)}, got {text!r}")
    return names


def runnable_dtypes(dtypes, device):
    """(the dtypes this device runs, {dtype: why not} for the others)."""
    if device.type == "cuda" and "bf16" in dtypes and torch.cuda.get_device_capability(device) < (8, 0):
        return tuple(d for d in dtypes if d != "bf16"), {"bf16": BF16_NEEDS}
    return tuple(dtypes), {}


def _tag(dtype):
    """What a bf16 impl's name adds; fp16 impls keep their names of old."""
    return " bf16" if dtype == torch.bfloat16 else ""


def parse_shapes(text):
    """"4096x4096x4096,1024x512x256" -> [(4096, 4096, 4096), (1024, 512, 256)]; an
    item that names a case the suite builds apart, "mlp-block:16384x768x3072"
    (tokens x d_model x d_ff; "mlp-dgrad:" and "gated-mlp:" likewise), ->
    ("mlp-block", (16384, 768, 3072))."""
    labels = {case for _, case in CASE_BUILDERS_BY_CASE}
    shapes = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        label, _, dims = item.lower().rpartition(":")
        parts = dims.split("x")
        if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts) or (label and label not in labels):
            raise argparse.ArgumentTypeError("expected MxNxK with positive integers, or "
                                             f"{' or '.join(f'{label}:MxNxK' for label in sorted(labels))}, "
                                             f"got {item!r}")
        shape = tuple(int(p) for p in parts)
        shapes.append((label, shape) if label else shape)
    if not shapes:
        raise argparse.ArgumentTypeError("expected at least one MxNxK shape")
    return shapes


def device_peak(device):
    """(dense fp16 TFLOP/s, where the number comes from)."""
    name = torch.cuda.get_device_name(device)
    for pattern, peak in KNOWN_PEAKS_TFLOPS:
        if re.search(pattern, name):
            return peak, f"datasheet ({name})"
    a = torch.randn(8192, 8192, device=device).half()
    timing = time_interleaved({"mm": torch.mm}, [(a, a)], clock=CudaEventClock(), reps=10)["mm"]
    return 2 * 8192**3 / (timing.median_ms * 1e-3) / 1e12, "measured: torch.mm fp16 8192^3 (a lower bound)"


def _direct(fn, flops, baseline=""):
    return Impl(fn, lambda *inputs: (fn(*inputs),), flops, baseline)


def gemm_impls(device, flops, dtype=torch.float16):
    """The fp32-out and 16-bit-out comparisons on `dtype` operands
    ("mpgemm fp32-out" and "mpgemm fp16-out" on fp16, "mpgemm bf16 fp32-out"
    and "mpgemm bf16-out" on bf16). On the CPU torch's mm of the same values
    stands in for cuBLAS, for the result check only."""
    wide, narrow = f"{_tag(dtype)} fp32-out", f" {DTYPE_NAMES[dtype]}-out"

    def mpgemm_wide(a, b):
        return ops.gemm(a, b)

    def mpgemm_narrow(a, b):
        return ops.gemm(a, b, out_dtype=dtype)

    if device.type != "cuda":
        return {
            f"torch.mm{wide}": _direct(lambda a, b: torch.mm(a.float(), b.float()), flops),
            f"mpgemm{wide}": _direct(mpgemm_wide, flops, f"torch.mm{wide}"),
            f"torch.mm{narrow}": _direct(torch.mm, flops),
            f"mpgemm{narrow}": _direct(mpgemm_narrow, flops, f"torch.mm{narrow}"),
        }
    impls = {
        f"cublas{wide}": _direct(lambda a, b: torch.ops.mpgemm._cublas_gemm(a, b, out_dtype=torch.float32), flops),
        f"mpgemm{wide}": _direct(mpgemm_wide, flops, f"cublas{wide}"),
        f"torch.mm{narrow}": _direct(torch.mm, flops),
        f"mpgemm{narrow}": _direct(mpgemm_narrow, flops, f"torch.mm{narrow}"),
    }
    if _torch_has_out_dtype(device, dtype):
        impls[f"torch.mm{wide}"] = _direct(lambda a, b: torch.mm(a, b, out_dtype=torch.float32), flops,
                                           f"cublas{wide}")
    return impls


def _torch_has_out_dtype(device, dtype):
    try:
        x = torch.ones(8, 8, device=device, dtype=dtype)
        torch.mm(x, x, out_dtype=torch.float32)
        return True
    except (TypeError, RuntimeError):
        return False


def _fwd_bwd(fn, work, variables=None):
    """The fwd+bwd impl of an op taking tensors (x, w, b; or an MLP's x, w1,
    b1, w2, b2) and, for backward, the output's gradient, last in the input
    set: it returns the gradients instead of accumulating them into .grad,
    so no call pays for an extra add. An input left out (None: a layer
    without a bias) has no gradient. `variables`: the environment both
    passes run in (an opt-in switch)."""
    def run(*inputs):
        *tensors, grad = inputs
        with environment(variables or {}):
            out = fn(*tensors)
            return (out, *torch.autograd.grad(out, [t for t in tensors if t is not None], grad))

    return Impl(run, run, work)


def _forward_and_backward(forward, baseline_forward, flops, backward_flops, mpgemm_name, baseline_name):
    """fwd and fwd+bwd (_fwd_bwd) impls of ops taking tensors and, for
    backward, the output's gradient."""
    def fwd(fn):
        def run(*inputs):
            with torch.no_grad():
                return fn(*inputs[:-1])

        return Impl(run, lambda *inputs: (run(*inputs),), flops)

    impls = {
        f"{baseline_name} fwd": fwd(baseline_forward),
        f"{mpgemm_name} fwd": dataclasses.replace(fwd(forward), baseline=f"{baseline_name} fwd"),
        f"{baseline_name} fwd+bwd": _fwd_bwd(baseline_forward, 3 * flops),
        f"{mpgemm_name} fwd+bwd": dataclasses.replace(_fwd_bwd(forward, backward_flops),
                                                      baseline=f"{baseline_name} fwd+bwd"),
    }
    return impls


def _input_sets(make, bytes_per_set, device):
    cache = L2_BYTES_FALLBACK
    if device.type == "cuda":
        cache = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", cache) or cache
    return [make() for _ in range(input_sets_for(bytes_per_set, cache))]


def _matrix(rows, cols, layout, device, dtype):
    """A fresh random rows x cols matrix, row-major ("r") or column-major ("c")."""
    if layout == "c":
        return torch.randn(cols, rows, device=device).to(dtype).t()
    return torch.randn(rows, cols, device=device).to(dtype)


def _gemm_case(shape, device, dtype):
    """(m, n, k), both operands row-major, or (m, n, k, layouts): "rc" for A
    row-major and B column-major, and so on."""
    m, n, k = shape[:3]
    layouts = shape[3] if len(shape) > 3 else "rr"

    def make():
        return _matrix(m, k, layouts[0], device, dtype), _matrix(k, n, layouts[1], device, dtype)

    return make, dtype.itemsize * (m * k + k * n), gemm_impls(device, 2.0 * m * n * k, dtype)


def _linear_case(shape, device, dtype):
    m, n, k = shape

    def make():
        x = torch.randn(m, k, device=device).to(dtype).requires_grad_()
        w = (torch.randn(n, k, device=device) / k**0.5).to(dtype).requires_grad_()
        b = torch.randn(n, device=device).to(dtype).requires_grad_()
        return x, w, b, torch.randn(m, n, device=device).to(dtype)

    product = 2.0 * m * n * k
    # Backward: dX and dW; the forward keeps GELU's pre-activation, as torch
    # does (the default): three products where the Hopper epilogue stores it
    # beside y (four where the forward runs the product again, which the
    # count leaves out). With MPGEMM_EPILOGUE_PRE_ACTIVATION=0
    # ("recomputed-z") backward recomputes it, one product more; with
    # MPGEMM_EPILOGUE_BIAS_GRAD=1 ("saved-z+dbias") dW's product sums the
    # bias's gradient, where torch sums dz apart.
    baseline = f"torch unfused{_tag(dtype)}"

    def gelu_linear(x, w, b):
        return ops.linear(x, w, b, activation="gelu")

    impls = _forward_and_backward(gelu_linear, lambda x, w, b: F.gelu(F.linear(x, w, b)), product, 3 * product,
                                  f"mpgemm fused{_tag(dtype)}", baseline)
    for name, products, variables in (("recomputed-z", 4, {"MPGEMM_EPILOGUE_PRE_ACTIVATION": "0"}),
                                      ("saved-z+dbias", 3, {"MPGEMM_EPILOGUE_PRE_ACTIVATION": "1",
                                                            "MPGEMM_EPILOGUE_BIAS_GRAD": "1"})):
        impls[f"mpgemm fused {name}{_tag(dtype)} fwd+bwd"] = dataclasses.replace(
            _fwd_bwd(gelu_linear, products * product, variables), baseline=f"{baseline} fwd+bwd")
    return make, dtype.itemsize * (m * k + n * k + m * n), impls


def _mlp_block_case(shape, device, dtype):
    """A transformer's MLP, (tokens, d_model, d_ff): linear, GELU (the erf
    form, mpgemm's), linear, against torch's three ops. mpgemm.mlp as it
    runs by default (torch's products and passes: GELU's input kept from
    the first linear, torch's gelu and gelu_backward), with GELU's input
    from the first product's epilogue (MPGEMM_EPILOGUE_PRE_ACTIVATION=1:
    "saved-z"), with its derivative in the dgrad's epilogue
    (MPGEMM_EPILOGUE_ACTIVATION_GRAD=1: "dgelu"), with both
    ("saved-z+dgelu"), and with the biases' gradients summed by the weights'
    products too ("+dbias"): each switch timed alone and together; and
    GELU's tanh form (GPT-2's) likewise, by default and "saved-z"."""
    t, d, f = shape

    def make():
        x = torch.randn(t, d, device=device).to(dtype).requires_grad_()
        w1 = (torch.randn(f, d, device=device) / d**0.5).to(dtype).requires_grad_()
        w2 = (torch.randn(d, f, device=device) / f**0.5).to(dtype).requires_grad_()
        b1, b2 = (torch.randn(n, device=device).to(dtype).requires_grad_() for n in (f, d))
        return x, w1, b1, w2, b2, torch.randn(t, d, device=device).to(dtype)

    product = 2.0 * t * d * f
    baseline = f"torch unfused{_tag(dtype)}"

    def mlp(x, w1, b1, w2, b2):
        return ops.mlp(x, w1, b1, w2, b2, activation="gelu")

    impls = _forward_and_backward(mlp, lambda x, w1, b1, w2, b2: F.linear(F.gelu(F.linear(x, w1, b1)), w2, b2),
                                  2 * product, 6 * product, f"mpgemm mlp{_tag(dtype)}", baseline)
    saved_z, dgelu = {"MPGEMM_EPILOGUE_PRE_ACTIVATION": "1"}, {"MPGEMM_EPILOGUE_ACTIVATION_GRAD": "1"}
    fused = {**saved_z, **dgelu}
    for name, variables in (("saved-z", saved_z), ("dgelu", dgelu), ("saved-z+dgelu", fused),
                            ("saved-z+dgelu+dbias", {**fused, "MPGEMM_EPILOGUE_BIAS_GRAD": "1"})):
        impls[f"mpgemm mlp {name}{_tag(dtype)} fwd+bwd"] = dataclasses.replace(
            _fwd_bwd(mlp, 6 * product, variables), baseline=f"{baseline} fwd+bwd")
    # GPT-2's form, GELU's tanh, against torch's three ops with it: mpgemm.mlp
    # by default (torch's gelu pass over the first product) and "saved-z",
    # where the tanh form's own kernel (ping-pong pairs) applies it in the
    # first product's epilogue.
    tanh_baseline = f"torch unfused tanh{_tag(dtype)} fwd+bwd"
    impls[tanh_baseline] = _fwd_bwd(
        lambda x, w1, b1, w2, b2: F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2), 6 * product)

    def mlp_tanh(x, w1, b1, w2, b2):
        return ops.mlp(x, w1, b1, w2, b2, activation="gelu_tanh")

    for name, variables in (("", {}), (" saved-z", saved_z)):
        impls[f"mpgemm mlp tanh{name}{_tag(dtype)} fwd+bwd"] = dataclasses.replace(
            _fwd_bwd(mlp_tanh, 6 * product, variables), baseline=tanh_baseline)
    return make, dtype.itemsize * (t * d * 2 + 2 * d * f + t * f), impls


def _mlp_dgrad_case(shape, device, dtype):
    """The product of a transformer MLP's backward that meets GELU's, (tokens,
    d_model, d_ff): the second linear's dgrad, dH = dY @ W2 (W2 row-major,
    d_model x d_ff, as nn.Linear keeps it), then GELU's derivative at its
    input Z, dZ = dH * gelu'(Z); torch's mm and gelu_backward against
    mpgemm.gemm and the same pass (what mpgemm.mlp runs by default),
    mpgemm's product with the derivative in its epilogue on the plan's tile
    ("dgelu": what MPGEMM_EPILOGUE_ACTIVATION_GRAD=1 runs, on blocks alone
    at these sizes), and on ping-pong pairs, whose consumers multiply one
    tile while the other's wgmmas run ("dgelu pingpong":
    MPGEMM_GEMM_PATH=wgmma_pingpong around it alone)."""
    t, d, f = shape

    def make():
        grad_y = torch.randn(t, d, device=device).to(dtype)
        w2 = (torch.randn(d, f, device=device) / f**0.5).to(dtype)
        return grad_y, w2, torch.randn(t, f, device=device).to(dtype)

    product = 2.0 * t * d * f
    baseline = f"torch mm+gelu_backward{_tag(dtype)}"

    def epilogue(variables):
        def run(grad_y, w2, z):
            with environment(variables):
                return torch.ops.mpgemm._gemm_activation_grad(grad_y, w2, z, activation="gelu")

        return _direct(run, product, baseline)

    impls = {baseline: _direct(lambda grad_y, w2, z: torch.ops.aten.gelu_backward(grad_y @ w2, z), product),
             f"mpgemm gemm+gelu_backward{_tag(dtype)}": _direct(
                 lambda grad_y, w2, z: torch.ops.aten.gelu_backward(ops.gemm(grad_y, w2, out_dtype=dtype), z),
                 product, baseline),
             f"mpgemm dgelu{_tag(dtype)}": epilogue({}),
             f"mpgemm dgelu pingpong{_tag(dtype)}": epilogue({"MPGEMM_GEMM_PATH": "wgmma_pingpong"})}
    return make, dtype.itemsize * (t * d + d * f + t * f), impls


def _gated_mlp_case(shape, device, dtype):
    """A gated MLP (Llama's SwiGLU, no biases), (tokens, d_model, d_ff):
    down(silu(gate(x)) * up(x)), against torch's five ops. mpgemm.gated_mlp
    as it runs by default (its products, its gating on one pass each way)
    and with torch's SiLU and multiply and their backward
    (MPGEMM_GATED_KERNEL=0: "torch gating")."""
    t, d, f = shape

    def make():
        x = torch.randn(t, d, device=device).to(dtype).requires_grad_()
        gate, up = ((torch.randn(f, d, device=device) / d**0.5).to(dtype).requires_grad_() for _ in range(2))
        down = (torch.randn(d, f, device=device) / f**0.5).to(dtype).requires_grad_()
        return x, gate, up, down, torch.randn(t, d, device=device).to(dtype)

    product = 2.0 * t * d * f
    baseline = f"torch unfused{_tag(dtype)}"

    def gated_mlp(x, gate, up, down):
        return ops.gated_mlp(x, gate, None, up, None, down, None, activation="silu")

    impls = _forward_and_backward(gated_mlp, lambda x, gate, up, down: F.linear(F.silu(F.linear(x, gate)) *
                                                                                F.linear(x, up), down),
                                  3 * product, 9 * product, f"mpgemm gated_mlp{_tag(dtype)}", baseline)
    impls[f"mpgemm gated_mlp torch gating{_tag(dtype)} fwd+bwd"] = dataclasses.replace(
        _fwd_bwd(gated_mlp, 9 * product, {"MPGEMM_GATED_KERNEL": "0"}), baseline=f"{baseline} fwd+bwd")
    return make, dtype.itemsize * (t * d * 2 + 3 * d * f), impls


# The extra convolution paths `bench conv --conv-paths` times beside the
# default, each by setting MPGEMM_CONV_PATH (and MPGEMM_NARROW_TILES,
# MPGEMM_STAGED_ROW_STORES, MPGEMM_DGRAD_ONE_LAUNCH, MPGEMM_CHUNKED_FOLD,
# MPGEMM_M64_TILE, MPGEMM_GATHERED_FOLD, MPGEMM_DEPTHWISE_SLIDING_WGRAD,
# MPGEMM_DEPTHWISE_SLIDING_GATHER, MPGEMM_CONV_N16_TILE) around its calls (the planner reads them at every call): "wgmma" takes
# each pass the Hopper convolution takes on sm_90 and
# leaves the rest, and every pass elsewhere, to the WMMA kernels;
# "wgmma_narrow" the same, its passes whose N is at most 128 on the narrow
# tiles (MPGEMM_NARROW_TILES=1); "wgmma_staged" the same as "wgmma", its
# strided dgrad storing dx's rows through shared memory
# (MPGEMM_STAGED_ROW_STORES=1); "wgmma_opt_in" the Hopper convolution with
# every switch of the sm_90 default on, and the opt-in ones: narrow tiles, staged rows, a strided
# dgrad's phases in one launch (MPGEMM_DGRAD_ONE_LAUNCH=1), x folded in
# 16-byte chunks (MPGEMM_CHUNKED_FOLD=1), wgrad of at most 64 filters on
# the 64-row tile (MPGEMM_M64_TILE=1, opt-in) and x's fold gathered by the
# producer instead of copied (MPGEMM_GATHERED_FOLD=1, opt-in), and
# depthwise wgrad, fprop and dgrad on the sliding windows
# (MPGEMM_DEPTHWISE_SLIDING_WGRAD=1 and MPGEMM_DEPTHWISE_SLIDING_GATHER=1,
# opt-in) and the WMMA kernels' 128 x 16 tile for what they run of at most
# 16 filters or channels a group (MPGEMM_CONV_N16_TILE=1, opt-in; none is
# a Hopper kernel, but all are timed in this column), where the
# paths above have the last seven off (a phase a launch, x folded a thread
# per element: the twins of the default's; the 128-row tiles and the copied
# fold, as the default's);
# "wmma" forces the WMMA kernels, "wmma_n16" the same with their 128 x 16
# tile (MPGEMM_CONV_N16_TILE=1; "wmma" has it off), so that the two columns
# differ in it alone; "gemm" runs
# 1x1 convolutions at stride 1 without padding as GEMMs, the rest as the
# default does.
CONV_PATHS = ("wgmma", "wgmma_narrow", "wgmma_staged", "wgmma_opt_in", "wmma", "wmma_n16", "gemm")
_HOPPER = {"MPGEMM_CONV_PATH": "wgmma", "MPGEMM_NARROW_TILES": "0", "MPGEMM_STAGED_ROW_STORES": "0",
           "MPGEMM_DGRAD_ONE_LAUNCH": "0", "MPGEMM_CHUNKED_FOLD": "0", "MPGEMM_M64_TILE": "0",
           "MPGEMM_GATHERED_FOLD": "0", "MPGEMM_DEPTHWISE_SLIDING_WGRAD": "0", "MPGEMM_DEPTHWISE_SLIDING_GATHER": "0",
           "MPGEMM_CONV_N16_TILE": "0"}
_CONV_PATH_ENV = {"wgmma": _HOPPER, "wgmma_narrow": {**_HOPPER, "MPGEMM_NARROW_TILES": "1"},
                  "wgmma_staged": {**_HOPPER, "MPGEMM_STAGED_ROW_STORES": "1"},
                  "wgmma_opt_in": {**_HOPPER, "MPGEMM_NARROW_TILES": "1", "MPGEMM_STAGED_ROW_STORES": "1",
                                   "MPGEMM_DGRAD_ONE_LAUNCH": "1", "MPGEMM_CHUNKED_FOLD": "1", "MPGEMM_M64_TILE": "1",
                                   "MPGEMM_GATHERED_FOLD": "1", "MPGEMM_DEPTHWISE_SLIDING_WGRAD": "1",
                                   "MPGEMM_DEPTHWISE_SLIDING_GATHER": "1", "MPGEMM_CONV_N16_TILE": "1"},
                  "wmma": {"MPGEMM_CONV_PATH": "wmma", "MPGEMM_CONV_N16_TILE": "0"},
                  "wmma_n16": {"MPGEMM_CONV_PATH": "wmma", "MPGEMM_CONV_N16_TILE": "1"},
                  "gemm": {"MPGEMM_CONV_PATH": "gemm"}}


def parse_conv_paths(text):
    """"wgmma,wmma" -> ("wgmma", "wmma")"""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names or any(n not in CONV_PATHS for n in names):
        raise argparse.ArgumentTypeError(f"expected convolution paths from {', '.join(CONV_PATHS)}, got {text!r}")
    return names


@contextlib.contextmanager
def environment(variables):
    """`variables` (a dict) set in the environment inside the block, as they were after it."""
    saved = {name: os.environ.get(name) for name in variables}
    os.environ.update(variables)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def conv_path(path):
    """The environment that asks for convolution path `path`, inside the block."""
    return environment(_CONV_PATH_ENV[path])


def _on_path(fn, path):
    """fn, called with MPGEMM_CONV_PATH set to `path`; fn itself for the default path (None)."""
    if path is None:
        return fn

    def run(*args):
        with conv_path(path):
            return fn(*args)

    return run


def _conv_pass_impls(product, geometry, baseline_name, mpgemm_name, paths):
    """dgrad and wgrad alone, each against the baseline's own pass
    (aten.convolution_backward with one output asked for: cuDNN's dgrad or
    wgrad on a GPU), for the default path and each of `paths`."""
    stride, padding, dilation, groups = geometry
    corners = (padding[0], padding[0], padding[1], padding[1])

    def baseline(index):
        mask = [index == 0, index == 1, False]

        def run(x, w, b, grad):
            return torch.ops.aten.convolution_backward(grad, x, w, None, stride, padding, dilation, False, [0, 0],
                                                       groups, mask)[index]

        return run

    mpgemm_ops = {"dgrad": torch.ops.mpgemm.conv2d_grad_input, "wgrad": torch.ops.mpgemm.conv2d_grad_weight}
    impls = {}
    for index, name in enumerate(("dgrad", "wgrad")):
        impls[f"{baseline_name} {name}"] = _direct(baseline(index), product)
        for path in (None, *paths):
            def run(x, w, b, grad, op=mpgemm_ops[name]):
                return op(grad, x, w, stride, corners, dilation, groups)

            impls[_path_name(mpgemm_name, path) + f" {name}"] = _direct(_on_path(run, path), product,
                                                                       f"{baseline_name} {name}")
    return impls


def _residual_dgrad_impls(product, baseline_name, mpgemm_name):
    """A ResNet block's first 1x1 (stride 1, no padding): its dgrad plus the
    residual's gradient of x's shape (x itself stands in for it: the same
    bytes), the input gradient of the block as its backward makes it.
    "dgrad+residual": the baseline's dgrad and torch's add; mpgemm's dgrad
    and torch's add (the default); mpgemm's dgrad adding it in its epilogue
    ("addend", MPGEMM_DGRAD_ADDEND=1, opt-in: the Hopper convolution's, where
    the plan takes it, else the same two passes)."""
    geometry = ([1, 1], [0, 0, 0, 0], [1, 1], 1)

    def baseline(x, w, b, grad):
        return torch.ops.aten.convolution_backward(grad, x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                                                   [True, False, False])[0] + x.detach()

    def two_passes(x, w, b, grad):
        return torch.ops.mpgemm.conv2d_grad_input(grad, x, w, *geometry) + x.detach()

    def addend(x, w, b, grad):
        with environment({"MPGEMM_DGRAD_ADDEND": "1"}):
            return torch.ops.mpgemm._conv2d_grad_input_add(grad, x, w, x.detach(), *geometry)

    name = f"{baseline_name} dgrad+residual"
    return {name: _direct(baseline, product), f"{mpgemm_name} dgrad+residual": _direct(two_passes, product, name),
            f"{mpgemm_name} addend dgrad+residual": _direct(addend, product, name)}


def _path_name(mpgemm_name, path):
    """"mpgemm" for the default path, "mpgemm wgmma" for a forced one."""
    return mpgemm_name if path is None else mpgemm_name.replace("mpgemm", f"mpgemm {path}", 1)


def _conv_case(shape, device, dtype, paths=(), bias=False):
    """fwd (fprop, with a bias where `bias`) and fwd+bwd, then dgrad and
    wgrad alone, mpgemm on its default path and on each of `paths` against
    cuDNN; for a 1x1 at stride 1, dgrad with a residual's gradient added
    (_residual_dgrad_impls)."""
    batch, c, k, kernel, stride, padding, size, *rest = shape
    groups = rest[0] if rest else 1
    out = (size + 2 * padding - kernel) // stride + 1
    channels_last = torch.channels_last

    def make():
        x = torch.randn(batch, c, size, size, device=device).to(dtype).to(memory_format=channels_last)
        w = (torch.randn(k, c // groups, kernel, kernel, device=device) * (c // groups * kernel**2) ** -0.5).to(dtype)
        grad = torch.randn(batch, k, out, out, device=device).to(dtype).to(memory_format=channels_last)
        b = torch.randn(k, device=device).to(dtype).requires_grad_() if bias else None
        return x.requires_grad_(), w.to(memory_format=channels_last).requires_grad_(), b, grad

    product = 2.0 * batch * k * out * out * c // groups * kernel**2
    baseline_name = ("cudnn" if device.type == "cuda" else "torch") + _tag(dtype)
    mpgemm_name = f"mpgemm{_tag(dtype)}"
    impls = {}
    for path in (None, *paths):
        both = _forward_and_backward(lambda x, w, b: ops.conv2d(x, w, b, stride, padding, 1, groups),
                                     lambda x, w, b: F.conv2d(x, w, b, stride, padding, 1, groups), product,
                                     3 * product, _path_name(mpgemm_name, path), baseline_name)
        # A forced path's fwd+bwd runs its backward on that path too.
        impls.update(both if path is None else {
            name: dataclasses.replace(impl, run=_on_path(impl.run, path), result=_on_path(impl.result, path))
            for name, impl in both.items() if impl.baseline})
    impls.update(_conv_pass_impls(product, ((stride, stride), (padding, padding), (1, 1), groups), baseline_name,
                                  mpgemm_name, paths))
    if kernel == 1 and stride == 1 and padding == 0 and groups == 1:
        impls.update(_residual_dgrad_impls(product, baseline_name, mpgemm_name))
    bytes_per_set = dtype.itemsize * (batch * c * size * size + k * c // groups * kernel**2 + batch * k * out * out)
    return make, bytes_per_set, impls


def _ceiling_case(shape, device, dtype):
    blocks_per_sm, iterations = shape
    tile = build_info()["mma_ceiling"]
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
    blocks = blocks_per_sm * sms
    out_shape = torch.Size((blocks, tile["warps"], tile["warp_m"], tile["warp_n"]))

    def make():
        return (torch.randn(tile["warp_m"], tile["k"], device=device).to(dtype),
                torch.randn(tile["k"], tile["warp_n"], device=device).to(dtype),
                torch.empty(out_shape, device=device))

    def ceiling(a, b, out):
        torch.ops.mpgemm._mma_ceiling(a, b, iterations, out=out)

    def result(a, b, out):
        out.fill_(float("nan"))
        ceiling(a, b, out)
        return (out,)

    def expected(a, b, out):
        return ((iterations * (a.double().cpu() @ b.double().cpu())).expand(out_shape),)

    # The CPU reference computes the result in closed form, not by the
    # counted rounds of products: no FLOP count, so no TFLOP/s, there.
    flops = ceiling_flops(blocks, iterations) if device.type == "cuda" else None
    return make, 4 * out_shape.numel(), {"mma.sync ceiling": Impl(ceiling, result, flops, expected=expected)}


def ceiling_flops(blocks, iterations):
    """Every warp's accumulators, each a k-deep dot product per round."""
    tile = build_info()["mma_ceiling"]
    return 2.0 * blocks * tile["warps"] * tile["warp_m"] * tile["warp_n"] * tile["k"] * iterations


CASE_BUILDERS = {"gemm": _gemm_case, "linear": _linear_case, "conv": _conv_case, "ceiling": _ceiling_case}
# Cases that a suite builds apart from its others, by (suite, case).
CASE_BUILDERS_BY_CASE = {("linear", "mlp-block"): _mlp_block_case, ("linear", "mlp-dgrad"): _mlp_dgrad_case,
                         ("linear", "gated-mlp"): _gated_mlp_case}


def check_results(impls, inputs):
    """name -> relative error of its result against its baseline's (or its
    expected) result, the largest over the tensors compared, in float64 on the
    baseline's device; None for a baseline."""
    results = {name: impl.result(*inputs) for name, impl in impls.items()}
    errors = {}
    for name, impl in impls.items():
        if impl.expected is not None:
            reference = impl.expected(*inputs)
        elif impl.baseline:
            reference = [r.double() for r in results[impl.baseline]]
        else:
            errors[name] = None
            continue
        got = results[name]
        if len(got) != len(reference) or any(g.shape != r.shape for g, r in zip(got, reference)):
            errors[name] = float("inf")
        else:
            errors[name] = max(relative_error(g, r) for g, r in zip(got, reference))
    return errors


def measure_case(suite, case, shape, dtype, device, clock, warmup_ms, reps, cross_check=False, conv_paths=()):
    """One row per impl: the result check, then the interleaved timings."""
    options = {"paths": conv_paths, "bias": case in CONV_CASES_WITH_BIAS} if suite == "conv" else {}
    builder = CASE_BUILDERS_BY_CASE.get((suite, case), CASE_BUILDERS[suite])
    make, bytes_per_set, impls = builder(shape, device, DTYPES[dtype], **options)
    sets = _input_sets(make, bytes_per_set, device)
    errors = check_results(impls, sets[0])
    timings = time_interleaved({name: impl.run for name, impl in impls.items()}, sets, clock=clock,
                               warmup_ms=warmup_ms, reps=reps)
    rows = []
    for name, impl in impls.items():
        timing, error = timings[name], errors[name]
        passed = None if error is None else error < BASELINE_TOLERANCE[dtype]  # NaN fails
        row = dict(suite=suite, case=case, shape=list(shape), dtype=dtype, impl=name, baseline=impl.baseline,
                   flops=impl.flops, times_ms=timing.times_ms, median_ms=timing.median_ms,
                   starved_rounds=timing.starved_rounds, check_error=error, check_passed=passed,
                   check_tolerance=BASELINE_TOLERANCE[dtype],
                   tflops=impl.flops / (timing.median_ms * 1e-3) / 1e12 if impl.flops and passed is not False
                   else None)
        if suite == "conv":
            row["bias"] = options["bias"]  # from 2026-11-30 on; every earlier fwd had one
        if cross_check:
            row["profiler_kernel_ms"] = profiled_kernel_ms(impl.run, sets)
        rows.append(row)
    return rows


def _shape_applies(shape, suite):
    """Whether a --shapes item is one of `suite`'s cases: a plain shape is
    any shaped suite's; a labelled one only its suite's."""
    return not isinstance(shape[0], str) or (suite, shape[0]) in CASE_BUILDERS_BY_CASE


def plan_cases(suites, device, quick=False, shapes=None, dtypes=tuple(DTYPES), conv_batches=None):
    """[(suite, case, shape, dtype)]: each case once per operand type its suite runs;
    conv_batches: ResNet-50's convolutions at these batch sizes only."""
    table = gpu_suites(quick) if device.type == "cuda" else CPU_SUITES
    if conv_batches:
        table = dict(table, conv=[(case, shape) for case, shape in table["conv"]
                                  if case != "resnet50" or shape[0] in conv_batches])
    return [(suite, case, shape, dtype) for suite in suites for case, shape in
            ([s if isinstance(s[0], str) else ("custom", s) for s in shapes if _shape_applies(s, suite)]
             if shapes and suite in SHAPED_SUITES else table[suite])
            for dtype in SUITE_DTYPES[suite] if dtype in dtypes]


def run(suites, device, *, quick=False, shapes=None, dtypes=tuple(DTYPES), reps=20, warmup_ms=100.0,
        show_progress=True, checkpoint=None, conv_paths=(), conv_batches=None):
    """Measures the suites' cases; returns the report. checkpoint(report) is
    called after every case, so a run stopped by a time limit leaves what it
    measured. conv_paths: convolution paths timed beside the default
    (CONV_PATHS); conv_batches: the batch sizes of ResNet-50's convolutions."""
    on_gpu = device.type == "cuda"
    if not on_gpu:
        reps, warmup_ms = min(reps, 3), 0.0
    dtypes, not_run = runnable_dtypes(dtypes, device)
    plan = plan_cases(suites, device, quick, shapes, dtypes, conv_batches)
    clock = CudaEventClock() if on_gpu else WallClock()
    report = dict(provenance.describe(device), build_info=build_info(), complete=False,
                  timing={"clock": type(clock).__name__, "warmup_ms": warmup_ms, "reps": reps,
                          "statistic": "median", "interleaved": True,
                          # On a GPU each call after an untimed read of twice L2 (timing.py), from
                          # 2026-11-30 on; the CPU's calls run back to back.
                          "separated": on_gpu,
                          "baseline_tolerance": BASELINE_TOLERANCE},
                  conv_paths=list(conv_paths), dtypes_not_run=not_run, gpu_state=[], results=[], errors=[])
    if on_gpu:
        peak, source = device_peak(device)
        report["peak_tflops"] = {"value": peak, "source": source}
    progress = Progress(len(plan), "bench") if show_progress and plan else None
    cross_checked = False
    for i, (suite, case, shape, dtype) in enumerate(plan):
        if i == 0 or plan[i - 1][0] != suite:
            report["gpu_state"].append(dict(suite=suite, when="before", reading=gpu_state.read(device)))
        torch.manual_seed(i)
        # One case per run, the smallest GEMM first planned, is also timed by
        # the profiler: a reading independent of the events.
        cross_check = on_gpu and suite == "gemm" and not cross_checked
        cross_checked |= cross_check
        try:
            report["results"] += measure_case(suite, case, shape, dtype, device, clock, warmup_ms, reps,
                                              cross_check, conv_paths)
        except Exception as e:  # one case that cannot run must not lose the others' numbers
            report["errors"].append(dict(suite=suite, case=case, shape=list(shape), dtype=dtype,
                                         error=f"{type(e).__name__}: {e}"))
        if i + 1 == len(plan) or plan[i + 1][0] != suite:
            report["gpu_state"].append(dict(suite=suite, when="after", reading=gpu_state.read(device)))
        if progress:
            progress.advance(note=f"{suite} {'x'.join(map(str, shape))} {dtype}")
        if checkpoint:
            checkpoint(report)
    report["complete"] = True
    return report


def main(args):
    device = torch.device("cuda" if build_info()["cuda_available"] else "cpu")
    if args.shapes and args.suite not in SHAPED_SUITES + ("all",):
        print(f"mpgemm bench: --shapes applies to the gemm and linear suites, not to {args.suite}")
        return 2
    misplaced = [s[0] for s in args.shapes or () if args.suite != "all" and not _shape_applies(s, args.suite)]
    if misplaced:
        print(f"mpgemm bench: {misplaced[0]} shapes are the linear suite's, not the {args.suite} suite's")
        return 2
    for value, flag in ((args.conv_paths, "--conv-paths"), (args.batch_sizes, "--batch-sizes")):
        if value and args.suite not in ("conv", "all"):
            print(f"mpgemm bench: {flag} applies to the conv suite and bench train, not to {args.suite}")
            return 2
    suites = list(SUITES) if args.suite == "all" else [args.suite]

    save = display.json_saver(args.json)
    report = run(suites, device, quick=args.quick, shapes=args.shapes, dtypes=args.dtypes or tuple(DTYPES),
                 reps=args.reps, checkpoint=save, conv_paths=args.conv_paths or (), conv_batches=args.batch_sizes)
    save(report)
    print(bench_report.format_report(report))
    if args.csv:
        bench_report.write_csv(report, args.csv)
    if args.plot:
        bench_report.plot_report(report, args.plot)
    return 1 if bench_report.failed_checks(report) or report["errors"] else 0
