"""`bench host`: every case times mpgemm's call and torch's, the report and
its JSON carry them, and the command refuses the options of other suites."""

import json

import pytest
import torch

from mpgemm.tools import cli, host_bench


def test_every_case_times_both_sides():
    results = host_bench.run(torch.device("cpu"), calls=3, reps=1, warmup_calls=1, progress=lambda line: None)
    assert [r.name for r in results][-1] == "training step (MLP, fp16)" and len(results) == 12
    assert all(r.mpgemm_us > 0 and r.torch_us > 0 for r in results)
    text = host_bench.report(results, torch.device("cpu"), calls=3, reps=1)
    assert "best of 1 runs of 3 calls" in " ".join(text.split()) and all(r.name in text for r in results)


def test_command_writes_json_and_refuses_other_options(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(host_bench, "CALLS", 2)
    monkeypatch.setattr(host_bench, "REPS", 1)
    monkeypatch.setattr(host_bench, "WARMUP_CALLS", 1)
    path, threads = tmp_path / "host.json", torch.get_num_threads()
    assert cli.main(["bench", "host", "--json", str(path)]) == 0
    saved = json.loads(path.read_text())
    assert saved["suite"] == "host" and len(saved["cases"]) == 12
    assert torch.get_num_threads() == threads  # one thread while it timed, then as it was
    for flag in (["--reps", "3"], ["--quick"], ["--models", "resnet50"]):
        assert cli.main(["bench", "host", *flag]) == 2
    assert "do not apply to host" in capsys.readouterr().out


@pytest.mark.gpu
def test_host_costs_on_a_gpu():
    results = host_bench.run(torch.device("cuda"), calls=20, reps=2, warmup_calls=5, progress=lambda line: None)
    assert all(r.mpgemm_us > 0 and r.torch_us > 0 for r in results)
