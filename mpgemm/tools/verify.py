"""`python -m mpgemm verify`: checks the active backend against a float64
reference on the same fp16 or bf16 inputs over a set of shapes (and, on a GPU,
against cuBLAS), prints a table, and exits non-zero on any failure."""

import dataclasses
import random

import torch

from .. import ops
from .._build import build_info
from ..plan import gemm_plan, operand_load_width
from . import display
from ..testing import cublas_reference, max_abs_error, random_operand, reference_gemm, relative_error, tolerance


@dataclasses.dataclass(frozen=True)
class Case:
    a_shape: tuple
    b_shape: tuple
    a_layout: str = "row"
    b_layout: str = "row"
    bias_dtype: torch.dtype = None
    activation: str = None
    out_dtype: torch.dtype = torch.float32
    dtype: torch.dtype = torch.float16  # a's and b's

    def describe(self):
        batch = next((s[0] for s in (self.a_shape, self.b_shape) if len(s) == 3), None)
        m, k = self.a_shape[-2:]
        shape = f"{m}x{self.b_shape[-1]}x{k}" + (f" batch {batch}" if batch is not None else "")
        epilogue = []
        if self.bias_dtype is not None:
            epilogue.append("bias " + _name(self.bias_dtype))
        if self.activation:
            epilogue.append(self.activation)
        epilogue.append("-> " + _name(self.out_dtype))
        return shape, _name(self.dtype), f"{self.a_layout}/{self.b_layout}", " ".join(epilogue)


def _name(dtype):
    return str(dtype).removeprefix("torch.")


CASES = [
    Case((1, 1), (1, 1)),
    Case((7, 13), (13, 5)),
    Case((64, 64), (64, 64)),
    Case((127, 255), (255, 129), "col", "row"),
    Case((256, 384), (384, 512), "row", "col", torch.float32, "relu"),
    Case((300, 77), (77, 301), "col", "col", torch.float16, "gelu", torch.float16),
    Case((33, 65), (65, 17), "strided", "row", torch.float32, "gelu"),
    Case((4, 96, 80), (80, 112), "row", "col", torch.float16, "relu"),
    Case((96, 80), (3, 80, 112), "col", "row", None, None, torch.float16),
    Case((5, 1, 40), (5, 40, 24), "row", "row", torch.float32, "gelu"),
    Case((16, 0), (0, 16), "row", "row", torch.float32, "relu"),
    Case((64, 64), (64, 64), dtype=torch.bfloat16),
    Case((127, 255), (255, 129), "col", "strided", torch.bfloat16, "gelu", torch.bfloat16, torch.bfloat16),
    Case((4, 96, 80), (80, 112), "row", "col", torch.float32, "relu", torch.bfloat16, torch.bfloat16),
]


def sweep_cases(count, seed):
    """Random shapes (1 to 300 in each dimension), input types, layouts, batches and epilogues."""
    rng = random.Random(seed)
    layouts = ["row", "col", "strided"]
    cases = []
    for _ in range(count):
        m, n, k = (rng.randint(1, 300) for _ in range(3))
        batch = rng.choice([None, None, 3])
        batched = rng.choice(["a", "b", "both"]) if batch else ""
        dtype = rng.choice([torch.float16, torch.bfloat16])
        cases.append(Case(
            (batch, m, k) if batched in ("a", "both") else (m, k), (batch, k, n) if batched in ("b", "both") else (k, n),
            rng.choice(layouts), rng.choice(layouts), rng.choice([None, dtype, torch.float32]),
            rng.choice([None, "relu", "gelu"]), rng.choice([torch.float32, dtype]), dtype))
    return cases


# The WMMA kernels against cuBLAS: both sum fp32 products, in different orders
# (cuBLAS's fp32 result is rounded to the case's output type first).
CUBLAS_TOLERANCE = 1e-3


@dataclasses.dataclass
class Result:
    case: Case
    backend: str
    max_abs_error: float
    relative_error: float
    tolerance: float
    cublas_relative_error: float = None  # on a GPU only

    @property
    def passed(self):
        ok = self.relative_error < self.tolerance  # False for NaN
        if self.cublas_relative_error is not None:
            ok = ok and self.cublas_relative_error < CUBLAS_TOLERANCE
        return ok


def active_device():
    return "cuda" if build_info()["cuda_available"] else "cpu"


def backend_of(a, b):
    """Which kernels mpgemm.gemm runs for these CUDA operands: "cuda (wgmma)"
    (the Hopper path, its blocks alone or in pairs) or "cuda (WMMA)", by the
    plan of their shape."""
    batch = max(x.shape[0] if x.dim() == 3 else 1 for x in (a, b))
    plan = gemm_plan(a.shape[-2], b.shape[-1], a.shape[-1], batch=batch,
                     load_width=min(operand_load_width(a), operand_load_width(b)))
    return "cuda (wgmma)" if plan.config.startswith("wgmma") else "cuda (WMMA)"


def run(cases=CASES, device=None, gemm=None):
    device = device or active_device()
    gemm = gemm or ops.gemm
    results = []
    for case in cases:
        a = random_operand(case.a_shape, layout=case.a_layout, device=device, dtype=case.dtype)
        b = random_operand(case.b_shape, layout=case.b_layout, device=device, dtype=case.dtype)
        backend = backend_of(a, b) if device == "cuda" else "cpu (reference)"
        n = case.b_shape[-1]
        bias = None if case.bias_dtype is None else torch.randn(n, dtype=case.bias_dtype, device=device)
        out = gemm(a, b, bias=bias, activation=case.activation, out_dtype=case.out_dtype)
        ref = reference_gemm(a, b, bias, case.activation)
        bound = tolerance(case.out_dtype, device)
        if out.shape != ref.shape:
            results.append(Result(case, backend, float("inf"), float("inf"), bound))
            continue
        cublas_err = None
        if device == "cuda":
            cublas = cublas_reference(a, b, bias, case.activation).to(case.out_dtype).double()
            cublas_err = relative_error(out, cublas)
        results.append(Result(case, backend, max_abs_error(out, ref), relative_error(out, ref), bound, cublas_err))
    return results


def format_table(results):
    with_cublas = any(r.cublas_relative_error is not None for r in results)
    header = ("shape MxNxK", "inputs", "layout a/b", "epilogue", "backend", "max abs err", "rel err", "tol")
    header += ("rel err vs cuBLAS", "pass") if with_cublas else ("pass",)
    rows = []
    for r in results:
        row = (*r.case.describe(), r.backend, f"{r.max_abs_error:.3g}", f"{r.relative_error:.3g}", f"{r.tolerance:g}")
        if with_cublas:
            row += (f"{r.cublas_relative_error:.3g}" if r.cublas_relative_error is not None else "-",)
        rows.append(row + ("PASS" if r.passed else "FAIL",))
    return display.format_table(header, rows)


def main(args):
    if args.device == "cuda" and not build_info()["cuda_available"]:
        print("mpgemm verify: --device cuda needs a CUDA build of mpgemm and a visible GPU")
        return 2
    torch.manual_seed(args.seed)
    cases = CASES + sweep_cases(args.sweep, args.seed)
    results = run(cases, device=None if args.device == "auto" else args.device)
    print(format_table(results))
    failed = sum(not r.passed for r in results)
    print(f"\n{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0
