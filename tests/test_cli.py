"""`python -m mpgemm verify`: its table, and a non-zero exit on any failure."""

import subprocess
import sys

import pytest
import torch

import mpgemm
from mpgemm import cli, verify


def test_verify_passes_and_prints_a_table(capsys):
    assert cli.main(["verify", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "max abs err" in out and "rel err" in out
    assert out.count("PASS") == len(verify.CASES)
    assert f"{len(verify.CASES)} passed, 0 failed" in out


def test_verify_fails_on_a_wrong_result(monkeypatch, capsys):
    def off_by_a_little(a, b, **kwargs):
        out = mpgemm.gemm(a, b, **kwargs)
        return out + 1e-3 * out.abs().max()

    monkeypatch.setattr(verify.ops, "gemm", off_by_a_little)
    assert cli.main(["verify", "--device", "cpu"]) == 1
    assert "FAIL" in capsys.readouterr().out


def test_verify_fails_on_a_wrong_shape():
    results = verify.run(cases=verify.CASES[:2], device="cpu", gemm=lambda a, b, **kw: mpgemm.gemm(a, b, **kw).t())
    assert not results[1].passed


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_verify_refuses_cuda_without_a_gpu(capsys):
    assert cli.main(["verify", "--device", "cuda"]) == 2
    assert "needs a CUDA build" in capsys.readouterr().out


def test_module_entry_point():
    proc = subprocess.run([sys.executable, "-m", "mpgemm", "verify", "--device", "cpu"], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stderr
    assert "passed, 0 failed" in proc.stdout


def test_demo_quick_matches_fp32_accuracy(capsys, tmp_path):
    from mpgemm import demo

    device, results = demo.run(demo.QUICK, "cpu", show_progress=False)
    accuracy = {r.way: r.accuracy for r in results}
    assert set(accuracy) == set(demo.WAYS)
    assert accuracy["fp32"] > 80, "the demo task must be learnable"
    assert abs(accuracy["mpgemm"] - accuracy["fp32"]) <= 2.0
    table = demo.format_table(device, results)
    assert "mpgemm acc%" in table and "torch.amp speedup" in table
    assert "not GPU measurements" in demo.describe_device(device)
    assert {r.way: r.skipped_steps for r in results}["fp32"] == 0
    plot = tmp_path / "demo.png"
    demo.plot(results, plot)
    assert plot.stat().st_size > 1000


def test_demo_dataset_is_deterministic():
    from mpgemm import demo

    x1, y1 = demo.make_dataset(64, 16, seed=3, noise=0.4)
    x2, y2 = demo.make_dataset(64, 16, seed=3, noise=0.4)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert set(y1.tolist()) <= set(range(10)) and x1.shape == (64, 3, 16, 16)


@pytest.mark.parametrize("argv", [["demo", "--steps", "0"], ["bench", "--reps", "0"], ["demo", "--batch-sizes", "-4"]])
def test_cli_refuses_non_positive_counts(argv, capsys):
    with pytest.raises(SystemExit):
        cli.main(argv)
    assert "expected a positive integer" in capsys.readouterr().err


def test_bench_refuses_shapes_for_conv(capsys):
    assert cli.main(["bench", "conv", "--shapes", "8x8x8"]) == 2
    assert "--shapes applies to the gemm and linear suites" in capsys.readouterr().out
