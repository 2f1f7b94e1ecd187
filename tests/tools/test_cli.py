"""`python -m mpgemm verify`: its table, and a non-zero exit on any failure."""

import subprocess
import sys

import pytest
import torch

import mpgemm
from mpgemm.tools import cli, verify


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


def test_verify_checks_bf16_inputs_to_bf16_precision(monkeypatch):
    bf16 = [case for case in verify.CASES if case.dtype == torch.bfloat16]
    assert {case.out_dtype for case in bf16} == {torch.float32, torch.bfloat16}
    assert all(r.passed for r in verify.run(cases=bf16, device="cpu"))

    def bf16_off_by_two_percent(a, b, **kwargs):
        out = mpgemm.gemm(a, b, **kwargs)
        return out * 1.02 if a.dtype == torch.bfloat16 else out

    results = verify.run(cases=verify.CASES, device="cpu", gemm=bf16_off_by_two_percent)
    assert [r.case for r in results if not r.passed] == bf16


def test_verify_fails_on_a_wrong_shape():
    results = verify.run(cases=verify.CASES[:2], device="cpu", gemm=lambda a, b, **kw: mpgemm.gemm(a, b, **kw).t())
    assert not results[1].passed


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_verify_refuses_cuda_without_a_gpu(capsys):
    assert cli.main(["verify", "--device", "cuda"]) == 2
    assert "needs a CUDA build" in capsys.readouterr().out


def test_module_entry_point():
    # -X importtime prints a line per module the run imports (parent packages included), on stderr.
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "mpgemm", "verify", "--device", "cpu"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "passed, 0 failed" in proc.stdout
    # torch.distributed.tensor, and sympy through it, nearly doubled the time of
    # `import mpgemm`: mpgemm asks for DTensor only once something else has
    # imported it (mpgemm.amp.master_grads.is_dtensor). Any module of the
    # package counts, under its old name too, as does sympy by any path.
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "mpgemm" in imported
    assert not [name for name in imported if name == "sympy" or name.startswith(
        ("torch.distributed.tensor", "torch.distributed._tensor"))]


@pytest.mark.parametrize("argv", [["demo", "--steps", "0"], ["bench", "--reps", "0"], ["demo", "--batch-sizes", "-4"]])
def test_cli_refuses_non_positive_counts(argv, capsys):
    with pytest.raises(SystemExit):
        cli.main(argv)
    assert "expected a positive integer" in capsys.readouterr().err


def test_bench_refuses_shapes_for_conv(capsys):
    assert cli.main(["bench", "conv", "--shapes", "8x8x8"]) == 2
    assert "--shapes applies to the gemm and linear suites" in capsys.readouterr().out
