"""`python -m mpgemm bench` and `inspect`: parsing, report schema, the timing
helper on a fake clock, and reading a compiled object of known contents."""

import json
import subprocess
import sys

import pytest
import torch

from conftest import skip_or_fail
from mpgemm import benchmarks, cli, kernel_report, sass, timing


class FakeClock:
    """Each measurement "takes" the next of the given times, and records which
    inputs the timed call got."""

    def __init__(self, times):
        self.times = list(times)
        self.calls = 0

    def measure(self, fn):
        fn()
        self.calls += 1
        return self.times.pop(0)


def test_time_op_warms_up_rotates_inputs_and_takes_the_median():
    seen = []
    clock = FakeClock([5.0, 1.0, 3.0, 9.0, 2.0])
    result = timing.time_op(lambda x: seen.append(x), [(0,), (1,), (2,)], clock=clock, warmup=2, reps=5)
    assert seen == [0, 1, 2, 0, 1, 2, 0]  # 2 warm-up calls, then 5 timed ones continuing the rotation
    assert clock.calls == 5
    assert result.times_ms == [5.0, 1.0, 3.0, 9.0, 2.0] and result.median_ms == 3.0
    with pytest.raises(ValueError, match="reps must be at least 1"):
        timing.time_op(lambda: None, [()], clock=clock, reps=0)


def test_input_sets_exceed_the_cache():
    assert timing.input_sets_for(10 * 2**20, 50 * 2**20) == 10
    assert timing.input_sets_for(200 * 2**20, 50 * 2**20) == 1
    assert timing.input_sets_for(1, 50 * 2**20) == 16


def test_parse_shapes():
    assert benchmarks.parse_shapes("4096x4096x4096, 7x9x11") == [(4096, 4096, 4096), (7, 9, 11)]
    for bad in ("4096x4096", "0x1x1", "ax1x1", ""):
        with pytest.raises(Exception, match="MxNxK"):
            benchmarks.parse_shapes(bad)


def test_bench_cli_on_cpu_writes_json_and_csv(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("checks the CPU report")
    json_path, csv_path = tmp_path / "bench.json", tmp_path / "bench.csv"
    assert cli.main(["bench", "all", "--json", str(json_path), "--csv", str(csv_path)]) == 0
    out = capsys.readouterr().out
    assert "not GPU measurements" in out and "vs baseline" not in out
    report = json.loads(json_path.read_text())
    for key in ("device", "torch_version", "cuda_version", "build_info", "git_commit", "date", "timing", "results"):
        assert key in report
    assert report["gpu_measurement"] is False
    assert {r["suite"] for r in report["results"]} == {"gemm", "linear", "conv", "ceiling"}
    for r in report["results"]:
        assert len(r["times_ms"]) == report["timing"]["reps"] and r["median_ms"] > 0 and r["tflops"] > 0
    assert csv_path.read_text().splitlines()[0].startswith("suite,case,shape,impl")


def test_ceiling_counts_every_warps_products():
    report = benchmarks.run(["ceiling"], torch.device("cpu"), show_progress=False)
    (result,) = report["results"]
    blocks_per_sm, iterations = result["shape"]
    # On the CPU one "SM": 8 warps, each 64x32 accumulators x 16 deep per round.
    assert result["flops"] == 2.0 * blocks_per_sm * 8 * 64 * 32 * 16 * iterations


def test_bench_custom_shapes_and_bad_arguments(capsys):
    report = benchmarks.run(["gemm"], torch.device("cpu"), shapes=[(5, 6, 7)], show_progress=False)
    assert [tuple(r["shape"]) for r in report["results"]] == [(5, 6, 7)]
    with pytest.raises(SystemExit):
        cli.main(["bench", "gemm", "--shapes", "5x6"])
    assert "expected MxNxK" in capsys.readouterr().err
    assert cli.main(["bench", "ceiling", "--shapes", "5x6x7"]) == 2
    assert "--shapes applies to the gemm and linear suites, not to ceiling" in capsys.readouterr().out


def test_format_report_compares_on_gpu_reports():
    report = {
        "gpu_measurement": True, "device": "Fake GPU", "git_commit": "abc", "date": "2026-11-21",
        "peak_tflops": {"value": 100.0, "source": "datasheet"},
        "results": [
            dict(suite="gemm", case="square", shape=[8, 8, 8], impl="cublas fp32-out", baseline="", median_ms=2.0,
                 tflops=50.0),
            dict(suite="gemm", case="square", shape=[8, 8, 8], impl="mpgemm fp32-out", baseline="cublas fp32-out",
                 median_ms=4.0, tflops=25.0),
        ],
    }
    text = benchmarks.format_report(report)
    assert "Fake GPU" in text and "0.50x" in text and "25.0" in text


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
    assert set(kernels) == {"tiny_gemm_kernel", "scale_kernel"}
    gemm, scale = kernels["tiny_gemm_kernel"], kernels["scale_kernel"]
    assert gemm.arch == "sm_80" and gemm.hmma == 2 and gemm.hgmma == 0  # m16n16k16 = two m16n8k16 HMMAs
    assert scale.hmma == 0 and scale.registers > 0 and scale.stack_bytes == 0


def test_inspect_cli(tiny_object):
    proc = subprocess.run([sys.executable, "-m", "mpgemm", "inspect", "--binary", str(tiny_object)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 of 1 GEMM, convolution and mma.sync ceiling kernels contain Tensor Core instructions" in proc.stdout
    assert "HMMA" in proc.stdout and "tiny_gemm_kernel" in proc.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only build")
def test_inspect_without_a_cuda_build_exits_non_zero():
    import mpgemm

    if mpgemm.build_info()["backend"] == "cuda":
        pytest.skip("a CUDA build")
    proc = subprocess.run([sys.executable, "-m", "mpgemm", "inspect"], capture_output=True, text=True)
    assert proc.returncode == 1 and "CPU-only build" in proc.stdout
