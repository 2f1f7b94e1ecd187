"""`bench train` and the training step it shares with the demo: the five
ways, the time limit and how it is shared, out-of-memory handling, the
largest-batch search, the report and the command line."""

import contextlib
import json
import time

import pytest
import torch
import torch.nn.functional as F

import mpgemm
from mpgemm.tools import cli, train_bench, train_report, training

WIDTH = 100


class Tiny(torch.nn.Module):
    """A classifier of 16 features whose forward can take a set time per
    sample and fail like a GPU out of memory (or otherwise) above a batch."""

    def __init__(self, seconds_per_sample=0.0, oom_above=None, fail_at=None):
        super().__init__()
        self.fc = torch.nn.Linear(16, 4)
        self.seconds_per_sample, self.oom_above, self.fail_at = seconds_per_sample, oom_above, fail_at

    def forward(self, x):
        if self.oom_above is not None and x.shape[0] > self.oom_above:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        if x.shape[0] == self.fail_at:
            raise ValueError("a bug at this batch")
        time.sleep(self.seconds_per_sample * x.shape[0])
        return self.fc(x)


@pytest.fixture
def tiny(monkeypatch):
    """Registers a "tiny" workload built by Tiny(**options); returns the options to fill."""
    options = {}

    def batch(size, config, device, generator):
        return torch.randn(size, 16, generator=generator), torch.randint(0, 4, (size,), generator=generator)

    workload = train_bench.Workload("tiny", "images", "images", (4, 8), lambda config: Tiny(**options), batch,
                                    F.cross_entropy, lambda config: 1)
    monkeypatch.setitem(train_bench.WORKLOADS, "tiny", workload)
    return options


def tiny_config(**changes):
    base = train_bench.BenchConfig(models=("tiny",), batch_sizes=(4, 8), max_warmup_steps=2, max_skip_warmup_steps=0,
                                   max_timed_steps=3, time_limit_s=60.0, search=False, fp32_every_batch=True)
    return train_bench.dataclasses.replace(base, **changes)


def test_budget_gives_each_task_the_time_left_over_the_tasks_left():
    now = [100.0]
    budget = train_bench.Budget(50.0, clock=lambda: now[0])
    assert budget.share(budget.start + 35.0, 7) == 5.0
    now[0] += 20.0  # the first tasks took 20 s instead of 15: the 3 left share the 15 s left
    assert budget.share(budget.start + 35.0, 3) == 5.0
    assert budget.left() == 30.0 and budget.left(until=budget.end + 10) == 30.0
    now[0] += 40.0
    assert budget.share(budget.start + 35.0, 2) == 0.0 and budget.left() < 0


def test_runs_take_their_step_counts_when_time_allows(tiny):
    saved = []
    report = train_bench.run(tiny_config(fp32_every_batch=False), "cpu", show_progress=False,
                             checkpoint=lambda r: saved.append(json.loads(json.dumps(r))))
    # Saved after each run, so that a run killed from outside leaves what it measured.
    runs = 2 * len(training.WAYS) - 1
    assert [(len(r["runs"]), r["complete"]) for r in saved[:runs]] == [(n, False) for n in range(1, runs + 1)]
    assert report["complete"] and saved[-1]["largest_batch"] == report["largest_batch"]
    # fp32, the slowest way by far, at the smallest batch only.
    assert [(r["way"], r["batch_size"]) for r in report["runs"]] == [
        (way, batch) for batch in (4, 8) for way in training.WAYS if way != "fp32" or batch == 4]
    for r in report["runs"]:
        assert r["status"] == "ok" and len(r["warmup_step_times_s"]) == 2 and len(r["step_times_s"]) == 3
        assert r["items_per_s"] == pytest.approx(r["batch_size"] / sorted(r["step_times_s"])[1])
        assert r["speedup_vs_fp32"] is None and r["peak_memory_mb"] is None, "no GPU figures from a CPU run"
        assert r["vs_torch_amp"] is None and r["spread"] >= 0
        assert r["saved_memory_mb"] > 0
        assert r["workspace_largest_mb"] == r["workspace_mb_per_step"] == 0  # the CPU backend takes none
    assert report["gpu_state"] == {"before": None, "after": None}
    assert {s["status"] for s in report["largest_batch"]} == {"skipped"}


def test_time_limit_stops_the_run_and_reports_the_runs_it_did_not_reach(tiny):
    tiny["seconds_per_sample"] = 0.025  # 0.1 s a step at batch 4, 0.2 s at batch 8
    config = tiny_config(max_warmup_steps=5, max_timed_steps=30, time_limit_s=1.2)
    start = time.perf_counter()
    report = train_bench.run(config, "cpu", show_progress=False)
    elapsed = time.perf_counter() - start
    # One 0.2 s step past the limit, plus the host's own time on a loaded CI
    # machine; without the limit the runs would take well over 10 s.
    assert elapsed < config.time_limit_s + 1.0, "at most about one step past the limit"
    runs = report["runs"]
    assert len(runs) == 2 * len(training.WAYS), "no run is dropped from the report"
    assert runs[0]["status"] == "ok"
    not_run = [r for r in runs if r["status"] == "not run"]
    assert not_run and all(r["reason"] for r in not_run)
    assert all(r["status"] in ("ok", "not run") for r in runs)
    assert sum(map(len, (r["step_times_s"] for r in runs))) < 30, "steps are sized from their time"
    text = train_report.format_report(report)
    assert "not run:" in text and f"of {len(runs)} runs measured" in text


def test_out_of_memory_is_reported_and_the_search_finds_the_largest_batch(tiny):
    tiny["oom_above"] = 10
    # Two ways: every way's search runs the same code, each try a model's setup.
    config = tiny_config(batch_sizes=(2, 16), search=True, ways=("fp32", "mpgemm"))
    report = train_bench.run(config, "cpu", show_progress=False)
    ways = len(config.ways)
    assert [r["status"] for r in report["runs"]] == ["ok"] * ways + ["out of memory"] * ways
    assert all("OutOfMemoryError" in r["reason"] for r in report["runs"][ways:])
    for search in report["largest_batch"]:
        assert (search["status"], search["largest_fitting"], search["smallest_oom"]) == ("found", 10, 11)
        # From the timed runs: 2 fits, 16 does not; then bisection.
        assert [(t["batch_size"], t["fits"]) for t in search["tries"]] == [(9, True), (12, False), (10, True),
                                                                          (11, False)]


def test_search_doubles_then_stops_at_its_time_share(tiny):
    tiny["seconds_per_sample"] = 0.02
    done = train_bench.Run("tiny", 4, "fp32", 4, status="ok", step_times_s=[0.08])
    search = train_bench.Search("tiny", "fp32")
    budget = train_bench.Budget(60.0)
    train_bench.search_largest_batch(search, train_bench.WORKLOADS["tiny"], [done], tiny_config(), torch.device("cpu"),
                                     budget, budget.clock() + 0.45)
    assert [t["batch_size"] for t in search.tries] == [8]  # 16 would take 0.32 s of the ~0.25 s left
    assert (search.status, search.largest_fitting) == ("at least", 8)
    assert "batch 16" in search.reason and "predicted" in search.reason


def test_a_failing_run_is_reported_and_the_others_still_run(tiny):
    tiny["fail_at"] = 8
    config = tiny_config(ways=("fp32", "mpgemm"))
    report = train_bench.run(config, "cpu", show_progress=False)
    ways = len(config.ways)
    assert [r["status"] for r in report["runs"]] == ["ok"] * ways + ["error"] * ways
    assert report["runs"][ways]["reason"] == "ValueError: a bug at this batch"


def test_gpu_report_has_throughput_speedup_and_largest_batches(tiny):
    report = train_bench.run(tiny_config(batch_sizes=(4,)), "cpu", show_progress=False)
    report["provenance"].update(device="NVIDIA H100 80GB HBM3 (made-up report)", gpu_measurement=True)
    report["device_memory_mb"] = 81559.0
    for r, speedup, workspace in zip(report["runs"], (1.0, 3.25, 2.5, 3.5, 2.75), (0, 0, 12.25, 0, 3.5),
                                     strict=True):
        r.update(speedup_vs_fp32=speedup, peak_memory_mb=1234.0, workspace_largest_mb=workspace)
    report["largest_batch"][0].update(status="found", largest_fitting=640, smallest_oom=672,
                                      tries=[{"batch_size": 512, "fits": True, "error": None}])
    report["largest_batch"][1].update(status="at least", largest_fitting=1024, reason="the next try, batch 2048, "
                                      "would pass the time share (9.1 s predicted)")
    report["largest_batch"][2].update(status="at least", largest_fitting=512, smallest_oom=1024,
                                      reason="the next try, batch 768, would pass the time share")
    text = train_report.format_report(report)
    assert max(map(len, text.splitlines())) <= WIDTH
    assert "at least 512 images, fewer than 1024; stopped: the next try, batch 768" in text
    assert "img/s" in text and "3.25x" in text and "NOT GPU" not in text
    assert "work MB" in text and " 12.2 " in text
    assert "tiny fp32: 640 images (672 ran out of memory). Tries: 512 fits." in text
    assert "at least 1024" in text


def test_ieee_fp32_turns_tf32_off_and_restores_it():
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = True, True
    try:
        with pytest.raises(KeyError), training.ieee_fp32():
            assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == (False, False)
            raise KeyError("the block failed")
        assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == (True, True)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_setup_refuses_an_unknown_way():
    model = torch.nn.Linear(4, 4)
    with pytest.raises(ValueError, match="way must be one of fp32, torch.amp, mpgemm, torch.amp bf16, mpgemm bf16, "
                                         "mpgemm fused, torch.amp captured, mpgemm captured, got 'bf16'"):
        with training.setup("bf16", model, torch.optim.SGD(model.parameters(), lr=0.1), "cpu"):
            pass


@pytest.mark.parametrize("way", ["torch.amp captured", "mpgemm captured"])
def test_captured_ways_need_a_cuda_device(way):
    model = torch.nn.Linear(4, 4)
    with pytest.raises(ValueError, match=f"way '{way}' captures its step in a CUDA graph: it needs a CUDA device, "
                                         "got cpu"):
        with training.setup(way, model, torch.optim.SGD(model.parameters(), lr=0.1), "cpu"):
            pass
    assert way not in training.WAYS and way in training.ALL_WAYS  # opt-in


def test_fp32_step_is_one_sgd_step_in_ieee_fp32():
    model = torch.nn.Linear(8, 3)
    weight = model.weight.detach().clone()
    x, y = torch.randn(5, 8), torch.randint(0, 3, (5,))
    expected_grad = torch.func.grad(lambda w: F.cross_entropy(x @ w.t() + model.bias.detach(), y))(weight)
    flags = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    with training.setup("fp32", model, torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9), "cpu") as trainer:
        assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == (False, False)
        result = trainer.step(x, y, F.cross_entropy)
    assert (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32) == flags
    torch.testing.assert_close(model.weight.detach(), weight - 0.5 * expected_grad)
    assert (result.skipped, result.scale) == (False, 1.0) and result.seconds > 0


@pytest.mark.parametrize("way", ["torch.amp", "mpgemm"])
def test_an_overflowing_step_is_skipped_and_the_scale_halved(way):
    model = torch.nn.Linear(8, 3)
    x, y = torch.randn(5, 8), torch.randint(0, 3, (5,))
    with training.setup(way, model, torch.optim.SGD(model.parameters(), lr=0.5), "cpu") as trainer:
        before = [p.detach().clone() for p in trainer.model.parameters()]
        # 1e36 times the initial scale 2**16 is past fp32's range: the gradients are inf.
        overflow = trainer.step(x, y, lambda out, target: 1e36 * F.cross_entropy(out, target))
        assert overflow.skipped and overflow.scale == 2.0**16 and trainer.scaler.get_scale() == 2.0**15
        assert all(torch.equal(b, p) for b, p in zip(before, trainer.model.parameters()))
        normal = trainer.step(x, y, F.cross_entropy)
        assert not normal.skipped and not torch.equal(before[0], trainer.model.weight)


@pytest.mark.parametrize("way", ["torch.amp bf16", "mpgemm bf16"])
def test_bf16_ways_learn_without_loss_scaling(way):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    x = torch.randn(64, 16)
    y = (x[:, :4] * 2).argmax(1)  # four classes a linear map separates
    with training.setup(way, model, torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9), "cpu") as trainer:
        with trainer.autocast():
            first = trainer.model(x)
        steps = [trainer.step(x, y, F.cross_entropy) for _ in range(40)]
        with trainer.autocast():
            accuracy = (trainer.model(x).argmax(1) == y).float().mean().item()
    # bf16 products: torch.amp autocasts the layers, mpgemm's model holds bf16 weights over fp32 masters.
    if way == "torch.amp bf16":
        assert first.dtype == torch.bfloat16 and trainer.scaler is None
    else:
        assert trainer.model[0].weight.dtype == torch.bfloat16 and not trainer.scaler.is_enabled()
    assert [(s.skipped, s.scale) for s in steps] == [(False, 1.0)] * 40
    assert steps[-1].loss < 0.5 * steps[0].loss and accuracy > 0.8  # chance: 0.25


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_full_benchmark_needs_a_gpu(capsys):
    assert cli.main(["bench", "train"]) == 2
    assert "needs a GPU" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["bench", "train", "--shapes", "8x8x8"], "--shapes applies to the kernel suites, not to train"),
    (["bench", "train", "--reps", "3"], "--reps applies to the kernel suites, not to train"),
    (["bench", "train", "--csv", "out.csv"], "--csv applies to the kernel suites, not to train"),
    (["bench", "train", "--dtypes", "bf16"], "--dtypes applies to the kernel suites, not to train"),
    (["bench", "gemm", "--time-limit", "5"], "--time-limit applies to bench train only, not to gemm"),
    (["bench", "--models", "resnet50"], "--models applies to bench train only, not to all"),
    (["bench", "gemm", "--batch-sizes", "8"], "--batch-sizes applies to the conv suite and bench train, not to gemm"),
    (["bench", "linear", "--conv-paths", "wgmma"], "--conv-paths applies to the conv suite and bench train, not to "
                                                  "linear"),
    (["bench", "train", "--conv-paths", "wgmma"], "--conv-paths applies to the kernel suites, not to train"),
    (["bench", "conv", "--ways", "mpgemm"], "--ways applies to bench train only, not to conv"),
    (["bench", "conv", "--profile"], "--profile applies to bench train only, not to conv"),
    (["bench", "gemm", "--no-search"], "--no-search applies to bench train only, not to gemm"),
])
def test_bench_refuses_the_other_kinds_options(argv, message, capsys):
    assert cli.main(argv) == 2
    assert message in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["bench", "train", "--models", "resnet50,vgg"], "argument --models: unknown model vgg; choose from"),
    (["bench", "train", "--time-limit", "0"], "argument --time-limit: expected a positive number of seconds"),
    (["bench", "train", "--time-limit", "soon"], "argument --time-limit: expected a positive number of seconds"),
])
def test_bench_train_refuses_bad_values(argv, message, capsys):
    with pytest.raises(SystemExit):
        cli.main(argv)
    assert message in capsys.readouterr().err


def test_quick_cli_run_on_the_cpu(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("with a GPU, --quick is a GPU run")
    path = tmp_path / "train.json"
    assert cli.main(["bench", "train", "--quick", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= WIDTH
    assert "NOT GPU MEASUREMENTS" in out and "Largest-batch search skipped" in out
    header = next(line for line in out.splitlines() if line.startswith("model "))
    assert header.split() == ["model", "batch", "way", "CPU", "ms/step", "saved", "MB", "skipped"]
    assert "img/s" not in out and "tok/s" not in out
    report = json.loads(path.read_text())
    assert set(report) >= {"provenance", "config", "settings", "gpu_state", "runs", "largest_batch", "elapsed_s"}
    assert report["provenance"]["gpu_measurement"] is False
    assert [(r["model"], r["way"]) for r in report["runs"]] == [
        (model, way) for model in ("resnet50", "gpt2-block") for way in training.WAYS]
    # A busy machine may reach the time limit first: what ran is reported, the rest marked not run.
    assert report["runs"][0]["status"] == "ok"
    for r in report["runs"]:
        assert r["status"] == "not run" or (r["status"] == "ok" and 1 <= len(r["step_times_s"]) <= 2)


def test_the_llama_block_trains_fused_with_its_mlp_one_gated_op(monkeypatch):
    """`--models llama-block` (opt-in): a quick CPU run of torch.amp, mpgemm
    and the fused way, whose model runs its MLP as one mpgemm.gated_mlp."""
    fused = []
    monkeypatch.setattr(training, "fuse", lambda model, x: fused.append(mpgemm.fuse(model, x)))
    config = train_bench.dataclasses.replace(train_bench.CPU_QUICK, models=("llama-block",),
                                             ways=("torch.amp", "mpgemm", "mpgemm fused"))
    report = train_bench.run(config, "cpu", show_progress=False)
    assert [(r["way"], r["status"]) for r in report["runs"]] == [
        ("torch.amp", "ok"), ("mpgemm", "ok"), ("mpgemm fused", "ok")]
    (model,) = fused
    assert [(e["kind"], e["fused"]) for e in mpgemm.fusion_report(model)] == [("gated_mlp", True)]


@pytest.mark.gpu
def test_a_small_gpu_run_measures_every_way():
    config = train_bench.BenchConfig(models=("gpt2-block",), batch_sizes=(2,), seq_len=64, max_warmup_steps=2,
                                     max_timed_steps=3, time_limit_s=60.0, search=False)
    report = train_bench.run(config, "cuda", show_progress=False)
    assert [r["way"] for r in report["runs"]] == list(training.WAYS)
    for r in report["runs"]:
        assert r["status"] == "ok" and r["peak_memory_mb"] > 0 and r["items_per_s"] > 0, r
        assert r["speedup_vs_fp32"] == pytest.approx(r["items_per_s"] / report["runs"][0]["items_per_s"])


@pytest.mark.gpu
@pytest.mark.parametrize("eager, captured", [("torch.amp", "torch.amp captured"), ("mpgemm", "mpgemm captured")])
def test_a_captured_way_trains_as_its_eager_way(eager, captured):
    """The same steps on the same batches: overflows at the start (the
    initial scale, 2**16, times a loss of about 2,000), which the captured
    way takes eagerly, then its capture after three updating steps, then
    replays, one of them skipped (an inf planted in batch 16). Its losses,
    skips, scales and final weights are the eager way's."""
    data = torch.Generator().manual_seed(1)
    batches = [(torch.randn(32, 64, generator=data), torch.randint(0, 8, (32,), generator=data)) for _ in range(24)]
    batches[16][0][0, 0] = float("inf")
    results, weights = {}, {}
    for way in (eager, captured):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 8)).cuda()
        # No momentum: torch's fused SGD makes its buffers uninitialized in a first step it skips.
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-5, fused=True)
        with training.setup(way, model, optimizer, "cuda") as trainer:
            def stepped():  # mpgemm's fp32 masters, torch.amp's fp32 model
                params = (trainer.optimizer.master_params() if way.startswith("mpgemm")
                          else trainer.model.parameters())
                return [p.detach().clone() for p in params]

            initial = stepped()
            steps = [trainer.step(x.cuda(), y.cuda(), lambda out, t: 1e3 * F.cross_entropy(out, t))
                     for x, y in batches]
            if way == captured:
                assert trainer.graph is not None and trainer.eager_steps == training.CAPTURE_AFTER_STEPS
            weights[way] = stepped()
        assert not any(torch.equal(w, start) for w, start in zip(weights[way], initial))  # the steps moved them
        results[way] = [(s.loss, s.skipped, s.scale) for s in steps]
    skipped = [i for i, (_, s, _) in enumerate(results[eager]) if s]
    assert skipped[0] == 0 and 16 in skipped and len(skipped) < 12, skipped  # one skip among the replays
    losses = {way: [loss for loss, _, _ in steps] for way, steps in results.items()}
    torch.testing.assert_close(losses[captured], losses[eager], rtol=1e-5, atol=1e-6, equal_nan=True)
    assert [r[1:] for r in results[captured]] == [r[1:] for r in results[eager]]
    for w, e in zip(weights[captured], weights[eager]):
        torch.testing.assert_close(w, e, rtol=1e-5, atol=1e-7)


@pytest.mark.gpu
def test_a_profiled_gpu_step_places_its_kernels():
    """mpgemm's step runs mpgemm's kernels and torch.amp's none; both run
    cuBLAS or cuDNN somewhere (the attention's products, at least) and an
    optimizer; the kinds and the idle time add up to the step."""
    config = train_bench.BenchConfig(models=("gpt2-block",), batch_sizes=(2,), seq_len=64, max_warmup_steps=2,
                                     min_timed_steps=2, max_timed_steps=2, time_limit_s=60.0, search=False,
                                     profile=True, ways=("torch.amp", "mpgemm"))
    report = train_bench.run(config, "cuda", show_progress=False)
    summaries = {p["way"]: p["summary"] for p in report["profiles"]}
    assert set(summaries) == {"torch.amp", "mpgemm"}
    for way, summary in summaries.items():
        kinds = summary["categories_ms"]
        assert summary["steps"] == train_bench.PROFILED_STEPS and kinds["optimizer"] > 0, way
        assert (kinds["mpgemm"] > 0) == (way == "mpgemm"), way
        assert sum(kinds.values()) == pytest.approx(summary["step_ms"], rel=0.05), way
        assert summary["top_kernels"] and summary["top_kernels"][0]["ms_per_step"] > 0
    assert "mpgemm" in {k["category"] for k in summaries["mpgemm"]["top_kernels"]}


class SkippingTrainer:
    """A trainer whose first `skips` steps are skipped by its scaler, and
    that warms up (a captured way before its capture) for its first
    `warm_up_steps`."""

    def __init__(self, skips, warm_up_steps=0):
        self.skips, self.warm_up_steps, self.steps = skips, warm_up_steps, 0
        self.eager_steps = 0  # of a captured way: its warm-up steps that updated the model

    @property
    def warming_up(self):
        return self.steps < self.warm_up_steps

    def step(self, x, target, loss_fn):
        self.steps += 1
        return training.StepResult(0.001, 1.0, self.steps <= self.skips, 1.0)


@pytest.mark.parametrize("skips, capture_at, warmup_steps",
                         [(0, 0, 3), (2, 0, 3), (6, 0, 7), (100, 0, 3 + 30), (0, 5, 5), (2, 9, 9), (0, 100, 3 + 30)])
def test_warm_up_goes_on_while_the_scaler_skips_or_a_captured_way_has_not_captured(skips, capture_at, warmup_steps):
    config = tiny_config(max_warmup_steps=3, max_skip_warmup_steps=30)
    trainer = SkippingTrainer(skips, capture_at)
    first = trainer.step(None, None, None)
    times = [first.seconds]
    train_bench._warm_up(trainer, None, None, train_bench.WORKLOADS["resnet50"], config, train_bench.Budget(60.0),
                         float("inf"), times, first.skipped)
    assert len(times) == warmup_steps


def test_a_captured_way_that_never_captures_is_an_error_and_not_timed(tiny, monkeypatch):
    trainer = SkippingTrainer(skips=100, warm_up_steps=10**6)
    monkeypatch.setattr(train_bench, "_trainer", lambda *args: contextlib.nullcontext(trainer))
    config = tiny_config(max_warmup_steps=2, max_skip_warmup_steps=3)
    run = train_bench.Run("tiny", 4, "mpgemm captured", 4)
    budget = train_bench.Budget(60.0)
    train_bench._train(run, train_bench.WORKLOADS["tiny"], config, torch.device("cpu"), budget, budget.end)
    assert (run.status, run.step_times_s, len(run.warmup_step_times_s)) == ("error", [], 5)
    assert run.reason == "never captured its step: 0 of its 5 warm-up steps updated the model, 3 needed"


def test_searches_skip_the_captured_ways(tiny, monkeypatch):
    searched = []
    monkeypatch.setattr(train_bench, "search_largest_batch", lambda search, *args: searched.append(search.way))
    config = tiny_config(search=True, ways=("torch.amp", "mpgemm captured", "mpgemm"))
    searches = train_bench.run_searches(config, torch.device("cpu"), train_bench.Budget(60.0), [],
                                        lambda *args: None)
    assert searched == ["torch.amp", "mpgemm"]
    assert (searches[1].status, searches[1].reason) == ("skipped", train_bench.CAPTURED_SEARCH_REASON)


def test_a_run_times_its_least_steps_past_its_share(tiny):
    """A run whose share of the time is already spent still times
    min_timed_steps (the time limit alone stops those), then no more."""
    config = tiny_config(max_warmup_steps=1, min_timed_steps=5, max_timed_steps=30)
    run = train_bench.Run("tiny", 4, "torch.amp", 4)
    budget = train_bench.Budget(60.0)
    train_bench._train(run, train_bench.WORKLOADS["tiny"], config, torch.device("cpu"), budget, budget.clock())
    assert run.status == "ok" and len(run.step_times_s) == 5 and run.spread >= 0


def test_vs_torch_amp_and_speedups_against_fp32_at_the_batch_it_ran(tiny):
    def run(batch, way, seconds):
        return train_bench.Run("tiny", batch, way, batch, status="ok", step_times_s=[seconds], peak_memory_mb=1.0)

    runs = [run(4, "fp32", 1.0), run(8, "torch.amp", 0.5), run(8, "mpgemm", 1.0), run(8, "mpgemm bf16", 1.0),
            run(8, "torch.amp captured", 0.4), run(8, "mpgemm captured", 0.25)]
    entries = {e["way"]: e for e in train_bench._run_entries(runs, on_gpu=True)}
    assert entries["torch.amp"]["speedup_vs_fp32"] == 4.0 and entries["torch.amp"]["fp32_batch"] == 4
    assert entries["mpgemm"]["vs_torch_amp"] == 0.5
    assert entries["mpgemm bf16"]["vs_torch_amp"] is None  # no torch.amp bf16 at that batch
    assert entries["torch.amp"]["vs_torch_amp"] is None
    # The captured ways against torch.amp's eager step.
    assert (entries["torch.amp captured"]["vs_torch_amp"], entries["mpgemm captured"]["vs_torch_amp"]) == (1.25, 2.0)
    text = train_report._runs_table(train_bench._run_entries(runs, on_gpu=True), True)
    assert "4.00x*" in text and "0.50x" in text


def test_profile_runs_record_torch_amp_and_mpgemm_at_the_largest_batch(tiny):
    report = train_bench.run(tiny_config(profile=True, ways=("torch.amp", "mpgemm"), max_timed_steps=1), "cpu",
                             show_progress=False)
    assert [(p["way"], p["batch_size"]) for p in report["profiles"]] == [("torch.amp", 8), ("mpgemm", 8)]
    for p in report["profiles"]:
        assert p["summary"]["steps"] == train_bench.PROFILED_STEPS and p["summary"]["step_ms"] > 0
    text = train_report.format_report(report)
    assert "Profiled steps" in text and "no device events recorded" in text
    assert {r["way"] for r in report["runs"]} == {"torch.amp", "mpgemm"}


def test_bench_train_refuses_an_unknown_way(capsys):
    with pytest.raises(SystemExit):
        cli.main(["bench", "train", "--ways", "mpgemm,apex"])
    assert "argument --ways: unknown way 'apex'; choose from" in capsys.readouterr().err
