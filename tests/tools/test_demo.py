"""`python -m mpgemm demo`: it learns, it trains through the shared training
step, and its report fits 100 columns and says what skipped steps mean."""

import argparse
import dataclasses
import re

import torch

from mpgemm.tools import demo, training

WIDTH = 100


def test_demo_quick_matches_fp32_accuracy(tmp_path):
    device, results = demo.run(demo.QUICK, "cpu", show_progress=False)
    accuracy = {r.way: r.accuracy for r in results}
    assert set(accuracy) == set(demo.WAYS)
    assert accuracy["fp32"] > 80, "the demo task must be learnable"
    assert abs(accuracy["mpgemm"] - accuracy["fp32"]) <= 2.0
    # bf16 keeps 8 significant bits to fp16's 11: within 3 points of fp32, far above chance (10%).
    for way in ("torch.amp bf16", "mpgemm bf16"):
        assert abs(accuracy[way] - accuracy["fp32"]) <= 3.0, way
    bf16 = [r for r in results if r.way.endswith("bf16")]
    assert bf16 and all((r.skipped_steps, r.first_scale, r.last_scale) == (0, 1.0, 1.0) for r in bf16)
    table = demo.format_table(device, results)
    assert "test acc%" in table and "speedup" not in table, "CPU times get no speedup"
    assert max(map(len, table.splitlines())) <= WIDTH
    assert "not GPU measurements" in demo.describe_device(device)
    for r in results:
        # Over fewer steps than the scalers' growth interval the scale only ever halves, once per skip.
        assert r.last_scale == r.first_scale * 0.5 ** r.skipped_steps
    assert {r.way: r.skipped_steps for r in results}["fp32"] == 0
    plot = tmp_path / "demo.png"
    demo.plot(results, plot)
    assert plot.stat().st_size > 1000


def test_demo_dataset_is_deterministic():
    x1, y1 = demo.make_dataset(64, 16, seed=3, noise=0.4)
    x2, y2 = demo.make_dataset(64, 16, seed=3, noise=0.4)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert set(y1.tolist()) <= set(range(10)) and x1.shape == (64, 3, 16, 16)


def test_demo_trains_through_the_shared_step(monkeypatch):
    calls = []
    shared_step = training.Trainer.step

    def counted(trainer, *args):
        calls.append(trainer.way)
        return shared_step(trainer, *args)

    monkeypatch.setattr(training.Trainer, "step", counted)
    config = dataclasses.replace(demo.QUICK, batch_sizes=(8,), steps=3, train_size=64, test_size=32)
    _, results = demo.run(config, "cpu", show_progress=False)
    assert calls == [way for way in demo.WAYS for _ in range(3)]
    assert [r.steps for r in results] == [3] * len(demo.WAYS)


def _result(way, ms, batch=64, skipped_at=(), first_scale=65536.0):
    return demo.RunResult(way, batch, ms, 10.0, 97.0, 150, list(skipped_at), first_scale,
                          first_scale * 0.5 ** len(skipped_at))


def test_gpu_table_has_speedups_against_fp32_of_the_same_batch():
    results = [_result("fp32", 10.0), _result("torch.amp", 4.0), _result("mpgemm", 5.0),
               _result("fp32", 30.0, batch=128), _result("mpgemm", 12.0, batch=128)]
    table = demo.format_table(torch.device("cuda"), results)
    rows = {tuple(line.split()[:2]): line.split() for line in table.splitlines()[2:]}
    assert rows[("64", "torch.amp")][3] == "2.50x" and rows[("64", "mpgemm")][3] == "2.00x"
    assert rows[("128", "mpgemm")][3] == "2.50x" and rows[("128", "fp32")][3] == "1.00x"
    assert "peak MB" in table and max(map(len, table.splitlines())) <= WIDTH


def test_skipped_steps_are_said_in_words():
    at_start = demo.describe_skips(_result("torch.amp", 4.0, skipped_at=[1, 2]))
    assert at_start.startswith("torch.amp, batch 64: skipped 2 of 150 steps (steps 1, 2)")
    assert "initial loss scale, 65536, was too high" in at_start and "ended at 16384" in at_start
    later = demo.describe_skips(_result("mpgemm", 4.0, skipped_at=[17]))
    assert "(step 17)" in later and "initial" not in later and "not applied" in later
    assert "no step skipped" in demo.describe_skips(_result("mpgemm", 4.0))
    for way in ("torch.amp bf16", "mpgemm bf16"):
        bf16 = demo.describe_skips(_result(way, 4.0, first_scale=1.0))
        assert bf16 == f"{way}, batch 64: no step skipped, as the bf16 ways use no loss scaling (bf16 has fp32's " \
                       "exponent range)."


def test_main_prints_within_100_columns_and_no_dicts(monkeypatch, capsys):
    results = [_result("fp32", 10.0), _result("torch.amp", 4.0, skipped_at=[1]), _result("mpgemm", 5.0),
               _result("torch.amp bf16", 4.0, first_scale=1.0), _result("mpgemm bf16", 5.0, first_scale=1.0)]
    monkeypatch.setattr(demo, "run", lambda config, device: (torch.device("cpu"), results))
    args = argparse.Namespace(quick=True, batch_sizes=None, steps=None, device="cpu", plot=None)
    assert demo.main(args) == 0
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= WIDTH
    assert "{" not in out
    assert not re.search(r"\d\.\d\dx", out), "no speedup for CPU times"
    assert "TF32 off" in out
    assert out.count("use no loss scaling") == 2 and "mpgemm bf16, batch 64: no step skipped" in out
