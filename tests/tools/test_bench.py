"""`python -m mpgemm bench` and `inspect`: parsing, the report, the result
check that keeps a broken kernel from posting a number, and reading a
compiled object of known contents. (The timing helper: test_timing.py.)"""

import json
import subprocess
import sys

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from support import MpgemmCalls, skip_or_fail
from mpgemm.testing import relative_error
from mpgemm.tools import bench_report, benchmarks, cli, kernel_report, provenance, sass

CPU = torch.device("cpu")


def test_parse_shapes_and_dtypes():
    assert benchmarks.parse_shapes("4096x4096x4096, 7x9x11") == [(4096, 4096, 4096), (7, 9, 11)]
    for bad in ("4096x4096", "0x1x1", "ax1x1", ""):
        with pytest.raises(Exception, match="MxNxK"):
            benchmarks.parse_shapes(bad)
    assert benchmarks.parse_dtypes("bf16, fp16,bf16") == ("bf16", "fp16")
    for bad in ("fp32", "", "fp16,half"):
        with pytest.raises(Exception, match="operand types from fp16, bf16"):
            benchmarks.parse_dtypes(bad)


def test_measurements_name_the_kernel_paths_asked_for(monkeypatch):
    for name in provenance.KERNEL_PATH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert provenance.describe("cpu")["kernel_paths"] == {}
    assert "MPGEMM" not in provenance.headline(provenance.describe("cpu"))
    monkeypatch.setenv("MPGEMM_CONV_PATH", "wgmma")
    info = provenance.describe("cpu")
    assert info["kernel_paths"] == {"MPGEMM_CONV_PATH": "wgmma"}
    assert provenance.headline(info).endswith(", MPGEMM_CONV_PATH=wgmma")
    monkeypatch.setenv("MPGEMM_NARROW_TILES", "1")
    assert provenance.describe("cpu")["kernel_paths"] == {"MPGEMM_CONV_PATH": "wgmma", "MPGEMM_NARROW_TILES": "1"}
    # The epilogues' switches choose kernels too (the GPU check's opt-in training runs).
    monkeypatch.setenv("MPGEMM_EPILOGUE_ACTIVATION_GRAD", "1")
    assert provenance.describe("cpu")["kernel_paths"]["MPGEMM_EPILOGUE_ACTIVATION_GRAD"] == "1"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU report")
def test_bench_cli_on_cpu_writes_json_and_csv(tmp_path, capsys):
    json_path, csv_path = tmp_path / "bench.json", tmp_path / "bench.csv"
    assert cli.main(["bench", "all", "--json", str(json_path), "--csv", str(csv_path)]) == 0
    out = capsys.readouterr().out
    assert "not GPU measurements" in out and "vs base" not in out
    report = json.loads(json_path.read_text())
    for key in ("device", "driver_version", "torch_version", "cuda_version", "build_info", "git_commit", "date",
                "timing", "gpu_state", "results"):
        assert key in report
    assert report["gpu_measurement"] is False and report["complete"] is True
    assert report["timing"]["separated"] is False  # the separator before each call is a GPU's
    assert report["git_commit"] != "unknown"
    assert {(r["suite"], r["dtype"]) for r in report["results"]} == {
        ("gemm", "fp16"), ("gemm", "bf16"), ("linear", "fp16"), ("linear", "bf16"), ("conv", "fp16"),
        ("conv", "bf16"), ("ceiling", "fp16")}
    for r in report["results"]:
        assert len(r["times_ms"]) == report["timing"]["reps"] and r["median_ms"] > 0
        # Every mpgemm result was checked against torch (or, the ceiling, float64) and passed.
        assert r["check_passed"] is (True if r["baseline"] or r["suite"] == "ceiling" else None)
        assert r["check_tolerance"] == benchmarks.BASELINE_TOLERANCE[r["dtype"]]
    # The bf16 impls, each checked against torch on the same bf16 operands.
    bf16 = {r["impl"]: r["baseline"] for r in report["results"] if r["dtype"] == "bf16" and r["baseline"]}
    assert bf16 == {"mpgemm bf16 fp32-out": "torch.mm bf16 fp32-out", "mpgemm bf16-out": "torch.mm bf16-out",
                    "mpgemm fused bf16 fwd": "torch unfused bf16 fwd",
                    "mpgemm fused bf16 fwd+bwd": "torch unfused bf16 fwd+bwd",
                    "mpgemm fused recomputed-z bf16 fwd+bwd": "torch unfused bf16 fwd+bwd",
                    "mpgemm fused saved-z+dbias bf16 fwd+bwd": "torch unfused bf16 fwd+bwd",
                    "mpgemm mlp bf16 fwd": "torch unfused bf16 fwd",
                    "mpgemm mlp bf16 fwd+bwd": "torch unfused bf16 fwd+bwd",
                    "mpgemm mlp saved-z bf16 fwd+bwd": "torch unfused bf16 fwd+bwd",
                    "mpgemm mlp dgelu bf16 fwd+bwd": "torch unfused bf16 fwd+bwd",
                    "mpgemm mlp saved-z+dgelu bf16 fwd+bwd": "torch unfused bf16 fwd+bwd",
                    "mpgemm mlp saved-z+dgelu+dbias bf16 fwd+bwd": "torch unfused bf16 fwd+bwd",
                    "mpgemm mlp tanh bf16 fwd+bwd": "torch unfused tanh bf16 fwd+bwd",
                    "mpgemm mlp tanh saved-z bf16 fwd+bwd": "torch unfused tanh bf16 fwd+bwd",
                    "mpgemm gemm+gelu_backward bf16": "torch mm+gelu_backward bf16",
                    "mpgemm dgelu bf16": "torch mm+gelu_backward bf16",
                    "mpgemm dgelu pingpong bf16": "torch mm+gelu_backward bf16",
                    "mpgemm gated_mlp bf16 fwd": "torch unfused bf16 fwd",
                    "mpgemm gated_mlp bf16 fwd+bwd": "torch unfused bf16 fwd+bwd",
                    "mpgemm gated_mlp torch gating bf16 fwd+bwd": "torch unfused bf16 fwd+bwd",
                    "mpgemm bf16 fwd": "torch bf16 fwd", "mpgemm bf16 fwd+bwd": "torch bf16 fwd+bwd",
                    "mpgemm bf16 dgrad": "torch bf16 dgrad", "mpgemm bf16 wgrad": "torch bf16 wgrad"}
    assert csv_path.read_text().splitlines()[0].startswith("suite,case,shape,impl,dtype")


def test_no_tflops_where_the_cpu_reference_does_not_do_the_work(capsys):
    report = benchmarks.run(["ceiling"], CPU, show_progress=False)
    (row,) = report["results"]
    assert row["flops"] is None and row["tflops"] is None and row["check_passed"] is True
    (line,) = [l for l in bench_report.format_report(report).splitlines() if "mma.sync ceiling" in l]
    assert line.split()[5] == "-"  # suite, shape, impl (2 words), median ms, TFLOP/s


def test_ceiling_flops_count_every_warps_products():
    # The large GEMM tile's warps: 8 of them, each 64x64 accumulators, 16 deep per round.
    assert benchmarks.ceiling_flops(blocks=264, iterations=20000) == 2.0 * 264 * 8 * 64 * 64 * 16 * 20000


# Ops that run products of the forward's size, and how many each runs
# (conv2d_backward: the input's and the weight's gradients; convolution_backward:
# those of the two its output mask asks for).
PRODUCTS = {"mpgemm.linear.default": 1, "mpgemm.gemm.default": 1, "mpgemm._linear_pre_activation.default": 1,
            "mpgemm._gemm_row_sums.default": 1, "mpgemm._gemm_activation_grad.default": 1,
            "aten.addmm.default": 1, "aten.mm.default": 1,
            "mpgemm.conv2d.default": 1, "mpgemm.conv2d_grad_input.default": 1,
            "mpgemm.conv2d_grad_weight.default": 1, "mpgemm.conv2d_backward.default": 2,
            "aten.convolution.default": 1}


class CountProducts(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func) == "aten.convolution_backward.default":
            self.count += sum(args[-1][:2])
        self.count += PRODUCTS.get(str(func), 0)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("suite, shape, product", [
    ("linear", (64, 256, 128), 2.0 * 64 * 256 * 128),
    ("conv", (2, 16, 16, 3, 1, 1, 8), 2.0 * 2 * 16 * 8 * 8 * 16 * 9),
    ("conv", (2, 16, 16, 3, 1, 1, 8, 16), 2.0 * 2 * 16 * 8 * 8 * 1 * 9),  # depthwise
])
def test_flops_count_the_products_each_impl_runs(suite, shape, product, dtype):
    """An impl's FLOPs are the products it runs times the forward's size:
    mpgemm's fused GELU keeps its pre-activation, as torch does, but where
    backward recomputes it (recomputed-z), one product more."""
    make, bytes_per_set, impls = benchmarks.CASE_BUILDERS[suite](shape, CPU, dtype)
    inputs = make()
    # What one call reads and writes: the input, the weight and the output (or its gradient).
    assert bytes_per_set == sum(t.numel() * t.element_size() for t in (inputs[0], inputs[1], inputs[3]))
    assert all(t.dtype == dtype for t in inputs if t is not None)  # a layer without a bias: None
    for name, impl in impls.items():
        with CountProducts() as counter:
            impl.run(*inputs)
        assert counter.count and impl.flops == counter.count * product, name


def test_a_wrong_result_posts_no_number(monkeypatch, capsys):
    real_linear = benchmarks.ops.linear

    def off_by_one_percent_and_more(x, w, b=None, **kwargs):
        return real_linear(x, w, b, **kwargs) * 1.03

    monkeypatch.setattr(benchmarks.ops, "linear", off_by_one_percent_and_more)
    assert cli.main(["bench", "linear"]) == 1
    out = capsys.readouterr().out
    for name in ("mpgemm fused fwd ", "mpgemm fused bf16 fwd "):
        fwd = next(l for l in out.splitlines() if name in l)
        assert fwd.split()[-3:] == ["-", "-", "FAIL"]  # no median, no TFLOP/s
    assert "FAIL: mpgemm fused fwd at 64x256x128 differs from torch unfused fwd" in out
    assert "FAIL: mpgemm fused bf16 fwd at 64x256x128 differs from torch unfused bf16 fwd" in out
    assert "(bound 0.02)" in out and "FAIL: mpgemm fused fwd+bwd" in out and "FAIL: mpgemm fused bf16 fwd+bwd" in out


def test_a_bf16_kernel_that_reads_its_operands_as_fp16_fails_its_check(monkeypatch):
    real_gemm = benchmarks.ops.gemm

    def bits_read_as_fp16(a, b, **kwargs):
        if a.dtype == torch.bfloat16:
            out = real_gemm(a.view(torch.float16), b.view(torch.float16), out_dtype=torch.float32)
            return out.to(kwargs.get("out_dtype", torch.float32))
        return real_gemm(a, b, **kwargs)

    monkeypatch.setattr(benchmarks.ops, "gemm", bits_read_as_fp16)
    report = benchmarks.run(["gemm"], CPU, shapes=[(16, 24, 32)], show_progress=False)
    checked = {r["impl"]: r["check_passed"] for r in report["results"] if r["baseline"]}
    assert checked == {"mpgemm fp32-out": True, "mpgemm fp16-out": True, "mpgemm bf16 fp32-out": False,
                       "mpgemm bf16-out": False}
    assert all(r["tflops"] is None for r in report["results"] if r["check_passed"] is False)
    assert bench_report.failed_checks(report)


def test_a_case_that_raises_is_reported_and_the_others_still_run(monkeypatch, capsys):
    real_gemm = benchmarks.ops.gemm

    def fails_on_odd_shapes(a, b, **kwargs):
        if a.shape[0] % 2:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return real_gemm(a, b, **kwargs)

    monkeypatch.setattr(benchmarks.ops, "gemm", fails_on_odd_shapes)
    assert cli.main(["bench", "gemm", "--shapes", "7x8x9,8x8x8"]) == 1
    out = capsys.readouterr().out
    for dtype in ("fp16", "bf16"):
        assert f"ERROR: gemm {dtype} at 7x8x9: RuntimeError: CUDA error: an illegal memory access" in out
    assert {tuple(line.split()[1:2]) for line in out.splitlines() if line.startswith("gemm ")} == {("8x8x8",)}


def test_a_broken_ceiling_kernel_fails_its_check(monkeypatch):
    _, _, impls = benchmarks._ceiling_case((1, 3), CPU, torch.float16)
    (impl,) = impls.values()
    broken = benchmarks.dataclasses.replace(impl, result=lambda a, b, out: (impl.result(a, b, out)[0] * 0.5,))
    inputs = (torch.randn(64, 16).half(), torch.randn(16, 64).half(), torch.empty(1, 8, 64, 64))
    assert benchmarks.check_results({"ok": impl}, inputs)["ok"] < 1e-6
    assert benchmarks.check_results({"broken": broken}, inputs)["broken"] > 0.4



@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_mlp_block_flops_count_the_products_each_impl_runs(dtype):
    """The MLP block's impls: two products forward, four backward (torch's
    and with GELU's input saved), one more where mpgemm.mlp computes GELU's
    input again; each row with dgelu runs the derivative's product, the
    others not; the tanh form's saved-z row takes GELU and its input from
    the first product's op, the default's from the linear and torch's
    gelu."""
    t, d, f = shape = (64, 32, 128)
    make, bytes_per_set, impls = benchmarks.CASE_BUILDERS_BY_CASE[("linear", "mlp-block")](shape, CPU, dtype)
    inputs = make()
    assert [tuple(x.shape) for x in inputs] == [(t, d), (f, d), (f,), (d, f), (d,), (t, d)]
    assert bytes_per_set == sum(x.numel() * x.element_size() for x in (inputs[0], inputs[1], inputs[3], inputs[5])) \
        + t * f * dtype.itemsize
    for name, impl in impls.items():
        with MpgemmCalls() as calls:
            impl.run(*inputs)
        assert ("_gemm_activation_grad" in calls.ops) == ("dgelu" in name), name
        if "mlp tanh" in name:
            assert ("_linear_pre_activation" in calls.ops) == ("saved-z" in name), name
        with CountProducts() as counter:
            impl.run(*inputs)
        assert counter.count and impl.flops == counter.count * 2.0 * t * d * f, name


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_mlp_dgrad_impls_run_one_product_and_the_derivative_as_named(dtype):
    """The MLP dgrad's impls: one product each; torch's mm and
    gelu_backward, mpgemm.gemm and the same pass, and (the dgelu rows)
    mpgemm's product with the derivative, no pass of torch's."""
    t, d, f = shape = (64, 32, 128)
    make, bytes_per_set, impls = benchmarks.CASE_BUILDERS_BY_CASE[("linear", "mlp-dgrad")](shape, CPU, dtype)
    inputs = make()
    assert [tuple(x.shape) for x in inputs] == [(t, d), (d, f), (t, f)]
    assert bytes_per_set == sum(x.numel() * x.element_size() for x in inputs)
    assert len(impls) == 4
    for name, impl in impls.items():
        with MpgemmCalls() as calls:
            assert impl.run(*inputs).dtype == dtype, name  # dH in the inputs' type, as mpgemm.mlp makes it
        mpgemm_ops = ["_gemm_activation_grad"] if "dgelu" in name else ["gemm"] if name.startswith("mpgemm") else []
        assert calls.ops == mpgemm_ops and ("gelu_backward" in calls.aten) == ("dgelu" not in name), name
        with CountProducts() as counter:
            impl.run(*inputs)
        assert counter.count == 1 and impl.flops == 2.0 * t * d * f, name


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_gated_mlp_flops_count_the_products_each_impl_runs(dtype):
    """The gated MLP's impls: three products forward, six backward, each
    way; the default's row runs the gating's two passes, torch gating's
    torch's SiLU and multiply."""
    t, d, f = shape = (64, 32, 96)
    make, bytes_per_set, impls = benchmarks.CASE_BUILDERS_BY_CASE[("linear", "gated-mlp")](shape, CPU, dtype)
    inputs = make()
    assert [tuple(x.shape) for x in inputs] == [(t, d), (f, d), (f, d), (d, f), (t, d)]
    assert bytes_per_set == sum(x.numel() * x.element_size() for x in inputs)
    with MpgemmCalls() as calls:
        impls[f"mpgemm gated_mlp{benchmarks._tag(dtype)} fwd+bwd"].run(*inputs)
    assert {"_gated_activation", "_gated_activation_backward"} <= set(calls.ops)
    with MpgemmCalls() as calls:
        impls[f"mpgemm gated_mlp torch gating{benchmarks._tag(dtype)} fwd+bwd"].run(*inputs)
    assert not {"_gated_activation", "_gated_activation_backward"} & set(calls.ops)
    for name, impl in impls.items():
        with CountProducts() as counter:
            impl.run(*inputs)
        assert counter.count and impl.flops == counter.count * 2.0 * t * d * f, name


def test_partial_reports_are_saved_after_every_case():
    saved = []
    report = benchmarks.run(["gemm", "ceiling"], CPU, show_progress=False,
                            checkpoint=lambda r: saved.append((len(r["results"]), r["complete"])))
    # Each gemm shape twice, fp16 then bf16; the ceiling in fp16 only.
    assert saved == [(4, False), (8, False), (12, False), (16, False), (17, False)] and report["complete"] is True
    assert [s["when"] for s in report["gpu_state"]] == ["before", "after", "before", "after"]


def test_bench_custom_shapes_dtypes_and_bad_arguments(capsys):
    report = benchmarks.run(["gemm"], CPU, shapes=[(5, 6, 7)], show_progress=False)
    assert {tuple(r["shape"]) for r in report["results"]} == {(5, 6, 7)}
    assert cli.main(["bench", "linear", "--dtypes", "bf16"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("linear ")]
    assert len(rows) == 26 and all(" bf16" in row for row in rows)
    assert any("mpgemm fused recomputed-z bf16 fwd+bwd" in row for row in rows)
    assert any("mpgemm mlp saved-z+dgelu+dbias bf16 fwd+bwd" in row for row in rows)
    assert any("mpgemm fused saved-z+dbias bf16 fwd+bwd" in row for row in rows)
    assert benchmarks.parse_shapes("mlp-block:8x16x32, 4x5x6") == [("mlp-block", (8, 16, 32)), (4, 5, 6)]
    report = benchmarks.run(["linear"], CPU, shapes=[("mlp-block", (8, 16, 32))], dtypes=("fp16",),
                            show_progress=False)
    assert {(r["case"], tuple(r["shape"])) for r in report["results"]} == {("mlp-block", (8, 16, 32))}
    assert all(r["check_passed"] is not False for r in report["results"])
    with pytest.raises(SystemExit):
        cli.main(["bench", "gemm", "--shapes", "5x6"])
    assert "expected MxNxK" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["bench", "linear", "--shapes", "mlp-bloc:5x6x7"])
    assert "or gated-mlp:MxNxK or mlp-block:MxNxK" in capsys.readouterr().err
    assert cli.main(["bench", "gemm", "--shapes", "mlp-block:5x6x7"]) == 2
    assert "mlp-block shapes are the linear suite's, not the gemm suite's" in capsys.readouterr().out
    plan = benchmarks.plan_cases(["gemm", "linear"], CPU, shapes=[("mlp-block", (8, 16, 32)), (4, 5, 6)],
                                 dtypes=("fp16",))
    assert [(suite, case) for suite, case, _, _ in plan] == [("gemm", "custom"), ("linear", "mlp-block"),
                                                            ("linear", "custom")]
    assert cli.main(["bench", "ceiling", "--shapes", "5x6x7"]) == 2
    assert "--shapes applies to the gemm and linear suites, not to ceiling" in capsys.readouterr().out


def test_bf16_is_not_planned_on_a_gpu_without_bf16_tensor_cores(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert benchmarks.runnable_dtypes(("fp16", "bf16"), torch.device("cuda")) == (
        ("fp16",), {"bf16": "bf16 Tensor Cores need sm_80 or newer"})
    assert benchmarks.runnable_dtypes(("fp16", "bf16"), CPU) == (("fp16", "bf16"), {})
    report = benchmarks.run(["ceiling"], CPU, show_progress=False)
    report["dtypes_not_run"] = {"bf16": benchmarks.BF16_NEEDS}
    assert "bf16 not run: bf16 Tensor Cores need sm_80 or newer" in bench_report.format_report(report)


def gpu_row(impl, baseline, median_ms, tflops, passed=None):
    return dict(suite="gemm", case="square", shape=[8, 8, 8], impl=impl, baseline=baseline, median_ms=median_ms,
                tflops=tflops, check_passed=passed, check_error=None if passed is None else 0.0,
                starved_rounds=0, times_ms=[median_ms])


def test_format_report_compares_on_gpu_reports():
    report = {
        "gpu_measurement": True, "device": "Fake GPU", "driver_version": "580.1", "torch_version": "2.11",
        "cuda_version": "13.0", "git_commit": "abc", "date": "2026-11-21", "complete": True,
        "peak_tflops": {"value": 100.0, "source": "datasheet"},
        "timing": {"reps": 20, "baseline_tolerance": 1e-2},
        "gpu_state": [{"suite": "gemm", "when": "before", "reading": {
            "sm_clock_mhz": 1755, "memory_clock_mhz": 2619, "max_sm_clock_mhz": 1980, "power_w": 300.0,
            "power_limit_w": 700.0, "temperature_c": 40, "throttle_reasons": ["software power cap"]}}],
        "results": [gpu_row("cublas fp32-out", "", 2.0, 50.0), gpu_row("mpgemm fp32-out", "cublas fp32-out", 4.0, 25.0,
                                                                       True)],
    }
    text = bench_report.format_report(report)
    assert "Fake GPU, driver 580.1" in text and "0.50x" in text and "25.0" in text and " ok" in text
    assert "GPU during gemm: before SM 1755/1980 MHz, 300 of 700 W, 40 C, slowed by software power cap; after not read" in text


TINY_KERNELS = r"""
#include <mma.h>
using namespace nvcuda;
__global__ void tiny_gemm_kernel(const half* a, const half* b, float* c) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  wmma::fill_fragment(fc, 0.0f);
  wmma::load_matrix_sync(fa, a, 16);
  wmma::load_matrix_sync(fb, b, 16);
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}
// One m16n16k16 product per pass through its loop, which is not unrolled.
__global__ void tiny_looped_gemm_kernel(const half* a, const half* b, float* c, int k) {
  wmma::fragment<wmma::matrix_a, 16, 16, 16, half, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, half, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
  wmma::fill_fragment(fc, 0.0f);
#pragma unroll 1
  for (int i = 0; i < k; i += 16) {
    wmma::load_matrix_sync(fa, a + i, k);
    wmma::load_matrix_sync(fb, b + i, k);
    wmma::mma_sync(fc, fa, fb, fc);
  }
  wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}
__global__ void scale_kernel(float* x, float s) { x[threadIdx.x] *= s; }
"""


@pytest.fixture(scope="module")
def tiny_object(tmp_path_factory):
    nvcc = sass.find_tool("nvcc")
    if nvcc is None or sass.find_tool("cuobjdump") is None:
        skip_or_fail("nvcc or cuobjdump not found")
    folder = tmp_path_factory.mktemp("tiny")
    source, obj = folder / "tiny.cu", folder / "tiny.o"
    source.write_text(TINY_KERNELS)
    subprocess.run([nvcc, "-c", "-arch=sm_80", str(source), "-o", str(obj)], check=True, capture_output=True)
    return obj


def test_inspect_reads_a_known_object(tiny_object):
    kernels = {k.name.split("(")[0]: k for k in kernel_report.inspect_binary(str(tiny_object))}
    assert set(kernels) == {"tiny_gemm_kernel", "tiny_looped_gemm_kernel", "scale_kernel"}
    gemm, looped, scale = kernels["tiny_gemm_kernel"], kernels["tiny_looped_gemm_kernel"], kernels["scale_kernel"]
    assert gemm.arch == "sm_80" and gemm.hmma == 2 and gemm.hgmma == 0  # m16n16k16 = two m16n8k16 HMMAs
    assert scale.hmma == 0 and scale.registers > 0 and scale.stack_bytes == 0
    assert gemm.mix is None and scale.mix is None  # no loop
    assert looped.mix.hmma == 2 and looped.mix.other > 0
    assert looped.mix.other_per_hmma == looped.mix.other / 2


@pytest.mark.parametrize("name, own, tensor_cores", [
    ("_ZN6mpgemm7kernels16wmma_gemm_kernelI13__nv_bfloat16NS0_10ScalarTileELb0ELb0ELi1EEEvNS0_10GemmParamsE",
     "wmma_gemm_kernel", True),
    ("_ZN6mpgemm7kernels4sm9017wgmma_conv_kernelI6__halfEEvN14CUtensorMap_stE", "wgmma_conv_kernel", True),
    ("_Z18mma_ceiling_kernelPv", "mma_ceiling_kernel", True),
    # An anonymous namespace's mangled name holds its unit's file name, here gemm_kernels_*.cu's.
    ("_ZN6mpgemm7kernels4sm9071_GLOBAL__N__454fe17c_32_gemm_kernels_cooperative_fp16_cu_69c91484_2988318"
     "sm90a_probe_kernelEPi", "sm90a_probe_kernel", False),
    ("mpgemm::kernels::wmma_conv2d_kernel<__half>(int)", "mpgemm::kernels::wmma_conv2d_kernel<__half>(int)", True),
    ("_Z16wmma_gemm_kernel10GemmParams", "wmma_gemm_kernel", True),  # one source name, then the parameters
    ("_ZN6mpgemm7kernelsL16wmma_gemm_kernelEv", "wmma_gemm_kernel", True),  # an internal name
])
def test_tensor_core_kernels_are_told_by_their_own_name(name, own, tensor_cores):
    assert kernel_report.function_name(name) == own
    assert kernel_report.is_tensor_core_kernel(name) == tensor_cores


def test_inspect_cli(tiny_object):
    proc = subprocess.run([sys.executable, "-m", "mpgemm", "inspect", "--binary", str(tiny_object)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 of 2 GEMM, convolution and mma.sync ceiling kernels contain Tensor Core instructions" in proc.stdout
    header, _, *rows = proc.stdout.splitlines()[1:6]  # after the binary's line: header, rule, three kernels
    assert header.split() == ["arch", "input", "regs", "shared", "stack", "local", "HMMA", "HGMMA", "loop", "HMMA",
                              "LDSM", "LDG", "BAR", "LDS/STS", "other", "other/HMMA", "kernel"]
    looped = next(row.split() for row in rows if "tiny_looped_gemm_kernel" in row)
    assert looped[8] == "2" and float(looped[14]) > 0  # loop HMMA, other/HMMA
    scale = next(row.split() for row in rows if "scale_kernel" in row)
    assert scale[8:15] == ["-"] * 7
    assert "innermost loop holding HMMA" in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only build")
def test_inspect_without_a_cuda_build_exits_non_zero():
    import mpgemm

    if mpgemm.build_info()["backend"] == "cuda":
        pytest.skip("a CUDA build")
    proc = subprocess.run([sys.executable, "-m", "mpgemm", "inspect"], capture_output=True, text=True)
    assert proc.returncode == 1 and "CPU-only build" in proc.stdout


@pytest.mark.gpu
def test_a_gpu_run_checks_every_result_and_reads_the_gpu():
    report = benchmarks.run(["gemm", "ceiling"], torch.device("cuda"), shapes=[(512, 384, 256)], reps=3,
                            show_progress=False)
    assert report["gpu_measurement"] and report["complete"] and not report["errors"]
    for r in report["results"]:
        assert r["check_passed"] in (True, None) and r["tflops"] > 0 and r["starved_rounds"] == 0, r["impl"]
    # The first GEMM case (fp16) is also timed by the profiler, a bf16 one not.
    gemm = [r for r in report["results"] if r["suite"] == "gemm"]
    assert gemm[0]["dtype"] == "fp16"
    assert all(("profiler_kernel_ms" in r) == (r["dtype"] == "fp16") for r in gemm)
    assert [s["when"] for s in report["gpu_state"]] == ["before", "after"] * 2


def test_conv_cases_time_each_pass_and_each_path_asked_for(monkeypatch):
    """dgrad and wgrad alone against torch's own passes, and each forced
    path's impls run with MPGEMM_CONV_PATH and the switches set during their
    calls only."""
    switches = ("MPGEMM_CONV_PATH", "MPGEMM_NARROW_TILES", "MPGEMM_STAGED_ROW_STORES", "MPGEMM_DGRAD_ONE_LAUNCH",
                "MPGEMM_CHUNKED_FOLD", "MPGEMM_M64_TILE", "MPGEMM_GATHERED_FOLD", "MPGEMM_DEPTHWISE_SLIDING_WGRAD",
                "MPGEMM_DEPTHWISE_SLIDING_GATHER", "MPGEMM_CONV_N16_TILE")
    for name in switches:
        monkeypatch.delenv(name, raising=False)
    seen = []
    real = benchmarks.ops.conv2d

    def recording(*args, **kwargs):
        seen.append(tuple(benchmarks.os.environ.get(name) for name in switches))
        return real(*args, **kwargs)

    monkeypatch.setattr(benchmarks.ops, "conv2d", recording)
    paths = ("wgmma", "wgmma_narrow", "wgmma_staged", "wgmma_opt_in", "wmma", "wmma_n16")
    make, _, impls = benchmarks.CASE_BUILDERS["conv"]((2, 16, 16, 3, 1, 1, 8), CPU, torch.float16, paths=paths)
    assert {name: impl.baseline for name, impl in impls.items() if impl.baseline} == {
        "mpgemm fwd": "torch fwd", "mpgemm fwd+bwd": "torch fwd+bwd", "mpgemm dgrad": "torch dgrad",
        "mpgemm wgrad": "torch wgrad",
        **{f"mpgemm {path} {p}": f"torch {p}" for path in paths for p in ("fwd", "fwd+bwd", "dgrad", "wgrad")}}
    inputs = make()
    # The switches' values a forced path's calls see, in the order of `switches`.
    hopper = ("wgmma",) + ("0",) * (len(switches) - 1)
    expected = {"mpgemm fwd": (None,) * len(switches), "mpgemm wgmma fwd": hopper, "mpgemm wgmma fwd+bwd": hopper,
                "mpgemm wgmma_narrow fwd": ("wgmma", "1") + hopper[2:],
                "mpgemm wgmma_staged fwd": ("wgmma", "0", "1") + hopper[3:],
                "mpgemm wgmma_opt_in fwd": ("wgmma",) + ("1",) * (len(switches) - 1),
                "mpgemm wmma fwd": ("wmma",) + (None,) * (len(switches) - 2) + ("0",),
                "mpgemm wmma_n16 fwd": ("wmma",) + (None,) * (len(switches) - 2) + ("1",)}
    for name, values in expected.items():
        impls[name].run(*inputs)
        assert seen[-1] == values, name
        assert not any(switch in benchmarks.os.environ for switch in switches), name
    errors = benchmarks.check_results(impls, inputs)
    assert all(e is None or e < 1e-2 for e in errors.values()), errors
    # The passes alone are the passes: dgrad is x's gradient, wgrad the filters'.
    x, w, b, grad = inputs
    assert impls["mpgemm dgrad"].run(*inputs).shape == x.shape
    assert impls["mpgemm wgrad"].run(*inputs).shape == w.shape
    with pytest.raises(Exception, match="convolution paths from wgmma, wgmma_narrow, wgmma_staged, "
                                        "wgmma_opt_in, wmma, wmma_n16, gemm"):
        benchmarks.parse_conv_paths("hopper")


def test_conv_times_a_1x1_dgrad_with_the_residuals_gradient(monkeypatch):
    """A 1x1 at stride 1 (a ResNet block's first) also times its dgrad plus
    a tensor of x's shape: the baseline's dgrad and add, mpgemm's dgrad and
    add, and mpgemm's with the addend in the epilogue (MPGEMM_DGRAD_ADDEND=1
    around its call alone), each the input gradient plus x; a 3x3 does not."""
    switch = []
    real = torch.ops.mpgemm._conv2d_grad_input_add

    def recording(*args):
        switch.append(benchmarks.os.environ.get("MPGEMM_DGRAD_ADDEND"))
        return real(*args)

    monkeypatch.setattr(torch.ops.mpgemm, "_conv2d_grad_input_add", recording)
    make, _, impls = benchmarks.CASE_BUILDERS["conv"]((2, 16, 24, 1, 1, 0, 6), CPU, torch.float16)
    rows = {name: impl.baseline for name, impl in impls.items() if "residual" in name}
    assert rows == {"torch dgrad+residual": "", "mpgemm dgrad+residual": "torch dgrad+residual",
                    "mpgemm addend dgrad+residual": "torch dgrad+residual"}
    inputs = make()
    x, w, _, grad = inputs
    expected = torch.nn.grad.conv2d_input(x.shape, w.detach().double(), grad.double()) + x.detach().double()
    for name in rows:
        assert relative_error(impls[name].run(*inputs), expected) < 2e-3, name
    assert switch == ["1"] and "MPGEMM_DGRAD_ADDEND" not in benchmarks.os.environ
    _, _, impls = benchmarks.CASE_BUILDERS["conv"]((2, 16, 24, 3, 1, 1, 6), CPU, torch.float16)
    assert not [name for name in impls if "residual" in name]


@pytest.mark.parametrize("case, shape, bias", [("resnet50", (2, 16, 16, 1, 1, 0, 8), False),
                                               ("mobilenet_v2", (2, 16, 16, 3, 1, 1, 8, 16), False),
                                               ("convnext_t", (2, 16, 16, 7, 1, 3, 8, 16), True)])
def test_conv_forward_adds_a_bias_only_where_the_model_has_one(monkeypatch, case, shape, bias):
    """A layer is timed as its model runs it: cuDNN adds a bias in a pass of
    its own, so a bias that ResNet-50's layers lack would time that pass on
    one side only. Both sides get the same bias or none, in every impl that
    runs a forward, and every row says which."""
    biases = []

    def recording(real):
        def run(x, w, b=None, *args, **kwargs):
            biases.append(b)
            return real(x, w, b, *args, **kwargs)
        return run

    monkeypatch.setattr(benchmarks.ops, "conv2d", recording(benchmarks.ops.conv2d))
    monkeypatch.setattr(benchmarks.F, "conv2d", recording(benchmarks.F.conv2d))
    rows = benchmarks.measure_case("conv", case, shape, "fp16", CPU, benchmarks.WallClock(), 0.0, 1)
    assert biases and all((b is not None) == bias for b in biases)
    assert all(r["bias"] is bias for r in rows) and all(r["check_passed"] is not False for r in rows)
    make, _, impls = benchmarks.CASE_BUILDERS["conv"](shape, CPU, torch.float16, bias=bias)
    # fwd+bwd gives the gradients of what the layer has: x, w and a bias where it has one.
    assert len(impls["mpgemm fwd+bwd"].result(*make())) == 3 + bias


def test_conv_bias_note_says_which_forwards_add_one():
    rows = [dict(suite="conv", case=c, bias=b) for c, b in (("resnet50", False), ("convnext_t", True))]
    assert bench_report.conv_bias_note({"results": rows}) == \
        "fprop as each model runs it: with a bias on convnext_t's layers only"
    assert bench_report.conv_bias_note({"results": rows[:1]}) == "fprop as each model runs it: no layer with a bias"
    old = [{k: v for k, v in r.items() if k != "bias"} for r in rows]
    assert bench_report.conv_bias_note({"results": old}).startswith("fprop with a bias on every layer")


def _conv_row(shape, impl, baseline, median_ms, dtype="fp16"):
    return dict(suite="conv", case="resnet50", shape=list(shape), impl=impl, baseline=baseline, dtype=dtype,
                median_ms=median_ms, check_passed=None if not baseline else True)


def test_conv_pass_table_groups_layers_by_class_and_path():
    one, three = (256, 64, 64, 1, 1, 0, 56), (256, 256, 256, 3, 2, 1, 28)
    rows = []
    for shape, scale in ((one, 1.0), (three, 2.0)):
        for p in ("fwd", "dgrad", "wgrad", "fwd+bwd"):
            rows.append(_conv_row(shape, f"cudnn {p}", "", scale))
            rows.append(_conv_row(shape, f"mpgemm {p}", f"cudnn {p}", 2 * scale))
            rows.append(_conv_row(shape, f"mpgemm wgmma {p}", f"cudnn {p}", scale / 2))
    report = {"results": rows}
    by = {(r["path"], r["layer_class"], r["conv_pass"]): r for r in bench_report.conv_pass_rows(report)}
    assert by[("default", "1x1, <=128 filters", "dgrad")]["ratio"] == pytest.approx(0.5)
    assert by[("wgmma", "3x3 strided, >=256 filters", "wgrad")]["ratio"] == pytest.approx(2.0)
    assert by[("wgmma", "all", "fprop")]["layers"] == 2
    assert by[("default", "3x3 strided, >=256 filters", "fwd+bwd")]["share"] == pytest.approx(2 / 3)
    assert bench_report.conv_layer_class((64, 3, 64, 7, 2, 3, 224)) == "first layer"
    assert bench_report.conv_layer_class((64, 144, 144, 3, 1, 1, 56, 144)) == "depthwise"
    assert bench_report.conv_layer_class((64, 128, 128, 3, 1, 1, 56, 32)) == "grouped"
    (table,) = bench_report.conv_pass_table(report)
    assert "fprop vs cuDNN" in table and "0.50x" in table and "2.00x" in table


@pytest.mark.parametrize("layouts", ["rr", "rc", "cr", "cc"])
def test_gemm_cases_take_the_operand_layouts_they_name(layouts):
    """A GEMM case's shape may name its layouts (the training GEMMs'): its
    operands are then row- or column-major as named, and every impl's
    result matches the baseline's."""
    make, _, impls = benchmarks.CASE_BUILDERS["gemm"]((40, 24, 16, layouts), CPU, torch.float16)
    a, b = make()
    assert (a.shape, b.shape) == ((40, 16), (16, 24))
    assert [t.stride(0) == 1 for t in (a, b)] == [c == "c" for c in layouts]
    errors = benchmarks.check_results(impls, (a, b))
    assert all(error is None or error < 1e-2 for error in errors.values()), errors
