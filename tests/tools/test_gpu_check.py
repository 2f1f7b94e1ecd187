"""bench/gpu_check.py without a GPU: the plan fits the GPU lease (per-step
limits, under 8 minutes a part, at most 3 files back), steps run under their
own time limits and a failing one does not stop the rest, and the summary
reads what the steps leave behind."""

import importlib.util
import json
import os
import subprocess
import sys
import tarfile
import textwrap
import time

import pytest
import torch

from support import ROOT

sys.path.insert(0, os.path.join(ROOT, "bench"))

import gpu_check  # noqa: E402
import gpu_check_summary  # noqa: E402


@pytest.mark.parametrize("part", gpu_check.PARTS)
def test_each_part_fits_the_lease(part):
    steps = gpu_check.steps_of(part)
    assert steps and sum(s.limit_s for s in steps) < 8 * 60
    for s in steps:
        assert 0 < s.estimate_s <= s.limit_s, s.name
    assert len(gpu_check.OUTPUT_FILES) <= 3


def test_the_parts_measure_prove_time_the_hopper_schedules_and_train():
    assert [s.name for s in gpu_check.steps_of(1)] == ["build", "hopper", "inspect", "gemm", "ceiling", "mlp", "conv"]
    assert [s.name for s in gpu_check.steps_of(2)] == ["build", "tests", "verify", "conv-tiles", "memcheck",
                                                       "racecheck", "synccheck"]
    assert [s.name for s in gpu_check.steps_of(3)] == ["build", "wgmma-speed", "profile", "cublas-check", "host"]
    assert [s.name for s in gpu_check.steps_of(4)] == ["build", "train"]
    gemm = next(s for s in gpu_check.STEPS if s.name == "gemm")
    for shape in ("1024x1024x1024", "4096x4096x4096", "8192x8192x8192", "4095x4097x4093"):
        assert shape in gemm.command
    # The convolutions pass by pass at ResNet-50's batch 256, the Hopper path beside the default on sm_90.
    conv = next(s for s in gpu_check.STEPS if s.name == "conv")
    assert "--batch-sizes 256" in conv.command
    assert "--conv-paths wgmma,wgmma_narrow,wgmma_opt_in,wmma,wmma_n16,gemm" in conv.command
    assert 'paths="--conv-paths wmma_n16,gemm"' in conv.command  # elsewhere the default is the WMMA kernels
    train = next(s for s in gpu_check.STEPS if s.name == "train")
    for needed in ("--models resnet50 --batch-sizes 256 --profile", "--models gpt2-block --batch-sizes 64",
                   "mpgemm bf16,mpgemm fused' --profile", "MPGEMM_CONV_PATH=wgmma",
                   "--ways 'torch.amp,mpgemm,mpgemm fused' --profile", "MPGEMM_EPILOGUE_ACTIVATION_GRAD=1"):
        assert needed in train.command


def test_dry_run_prints_each_step_with_its_limit_and_the_files_returned():
    out = subprocess.run([os.path.join(ROOT, "bench", "gpu_check.sh"), "--dry-run"], capture_output=True, text=True,
                         check=True).stdout
    for part in gpu_check.PARTS:
        limits = sum(s.limit_s for s in gpu_check.steps_of(part))
        assert f"part {part}: {limits} s of limits (budget 480 s)" in out
    assert out.count("returns summary.md, summary.json, gpu_check.tar.gz") == len(gpu_check.PARTS)
    assert "  profile       limit   30 s" in out


def test_every_step_command_is_valid_bash():
    context = {"raw": "/tmp/raw", "arch": "9.0", "arch_digits": "90", "cublas_args": ""}
    for step in gpu_check.STEPS:
        command = gpu_check.expand(step.command, context)
        assert "{" + "raw}" not in command and "{arch" not in command, step.name
        check = subprocess.run(["bash", "-n", "-c", command], capture_output=True, text=True)
        assert check.returncode == 0, f"{step.name}: {check.stderr}"


def test_tests_run_in_eight_processes_only_where_xdist_is_installed(tmp_path):
    (tmp_path / "xdist").mkdir()
    (tmp_path / "xdist" / "__init__.py").write_text("")

    def expanded(pythonpath):
        env = dict(os.environ, PYTHONPATH=pythonpath)
        return subprocess.run(["bash", "-c", f"printf '%s ' {gpu_check.XDIST}"], capture_output=True, text=True,
                              env=env).stdout.strip()

    assert expanded(str(tmp_path)) == "-n 8"
    assert expanded(str(tmp_path / "nowhere")) == ""


def test_only_picks_named_steps_once_in_the_order_named():
    assert [(s.name, s.part) for s in gpu_check.steps_of(None, ["build", "gemm"])] == [("build", 1), ("gemm", 1)]
    # Proof first where the lease is short: the order named, not the parts'.
    assert [s.name for s in gpu_check.steps_of(None, ["build", "tests", "conv", "train", "tests"])] == [
        "build", "tests", "conv", "train"]
    assert [s.name for s in gpu_check.steps_of(2, ["tests"])] == ["tests"]
    with pytest.raises(SystemExit, match="unknown step nope"):
        gpu_check.steps_of(None, ["nope"])


def test_usage_errors(capsys):
    with pytest.raises(SystemExit):
        gpu_check.main(["somewhere"])
    assert "give --part 1, 2, 3 or 4" in capsys.readouterr().err


def fake_steps(raw_report):
    return (
        gpu_check.Step("gemm", 1, 20, 1, f"echo '{raw_report}' > {{raw}}/gemm.json", "writes a report"),
        gpu_check.Step("verify", 1, 20, 1, "echo '3 passed, 1 failed'; exit 1", "fails"),
        gpu_check.Step("memcheck", 1, 1, 1, "sleep 30", "hangs"),
        gpu_check.Step("tests", 1, 20, 1, "echo after the hang", "still runs"),
    )


def gemm_report():
    def row(impl, baseline, ms, tflops, passed):
        dtype = "bf16" if "bf16" in impl else "fp16"
        return dict(suite="gemm", case="square", shape=[4096, 4096, 4096], dtype=dtype, impl=impl, baseline=baseline,
                    median_ms=ms, tflops=tflops, check_passed=passed, check_error=None if passed is None else 0.5,
                    check_tolerance={"fp16": 1e-2, "bf16": 2e-2}[dtype], starved_rounds=0, times_ms=[ms])

    return {"complete": True, "gpu_measurement": True, "gpu_state": [], "errors": [], "results": [
        row("cublas fp32-out", "", 0.19, 723.0, None), row("mpgemm fp32-out", "cublas fp32-out", 0.38, 361.5, True),
        row("torch.mm fp16-out", "", 0.18, 760.0, None), row("mpgemm fp16-out", "torch.mm fp16-out", 0.72, 190, False),
        row("cublas bf16 fp32-out", "", 0.2, 690.0, None),
        row("mpgemm bf16 fp32-out", "cublas bf16 fp32-out", 0.25, 550.0, True),
        row("torch.mm bf16-out", "", 0.2, 690.0, None), row("mpgemm bf16-out", "torch.mm bf16-out", 0.4, 345.0, True)]}


def test_a_run_keeps_going_past_failures_and_timeouts_and_leaves_three_files(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "STEPS", fake_steps(json.dumps(gemm_report())))
    monkeypatch.setattr(gpu_check, "KILL_AFTER_S", 1)
    start = time.monotonic()
    assert gpu_check.main(["--part", "1", str(tmp_path)]) == 1
    assert time.monotonic() - start < 20  # the hanging step was stopped at its limit
    assert sorted(os.listdir(tmp_path)) == sorted(gpu_check.OUTPUT_FILES)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [(s["name"], s["status"]) for s in summary["steps"]] == [
        ("gemm", "pass"), ("verify", "fail"), ("memcheck", "timeout"), ("tests", "pass")]
    assert summary["provenance"]["git_commit"] != "unknown"
    md = (tmp_path / "summary.md").read_text()
    assert "| gemm | PASS |" in md and "mpgemm/cuBLAS 4096^3 0.50x; bf16 4096^3 0.80x" in md
    assert "| 4096x4096x4096 | 723.0 | 361.5 | 0.50x | - | 0.80x | 0.50x |" in md
    assert "1 results FAILED their check" in md and "- FAIL: mpgemm fp16-out at 4096x4096x4096 differs" in md
    assert "| verify | FAIL |" in md and "3 passed, 1 failed" in md and "| memcheck | TIMEOUT |" in md
    with tarfile.open(tmp_path / "gpu_check.tar.gz") as tar:
        names = tar.getnames()
    assert "gpu_check/gemm.json" in names and "gpu_check/logs/tests-part1.log" in names


def test_outdir_must_not_hold_other_files(tmp_path):
    (tmp_path / "old.log").write_text("x")
    with pytest.raises(SystemExit, match="holds other files"):
        gpu_check.run([], str(tmp_path), "part 1")


def test_gpu_marker_selects_cuda_parametrized_and_marked_tests(tmp_path):
    for name in ("conftest.py", "support.py"):
        (tmp_path / name).write_text(open(os.path.join(ROOT, "tests", name)).read())
    (tmp_path / "test_sample.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.parametrize("device", ["cpu", "cuda"])
        def test_both(device):
            pass

        @pytest.mark.gpu
        def test_marked():
            pass

        def test_cpu_only():
            pass
    """))
    out = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "--collect-only", "-q", "-p",
                          "no:cacheprovider", str(tmp_path)], capture_output=True, text=True, cwd=tmp_path).stdout
    selected = sorted(line.split("::", 1)[1] for line in out.splitlines() if "::" in line)
    assert selected == ["test_both[cuda]", "test_marked"]


NCU_CSV = textwrap.dedent('''\
    ==PROF== Connected to process 123 (/usr/bin/python3.12)
    "ID","Kernel Name","gpu__time_duration.sum","sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active","l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum","smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio","smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio"
    "","","usecond","%","","ratio","ratio"
    "0","wmma_gemm_kernel","412.35","51.2","1,048,576","0.81","1.92"
    ==PROF== Disconnected from process 123
''')


def test_profile_summary_reads_ncu_csv(tmp_path):
    (tmp_path / "profile_ncu.csv").write_text(NCU_CSV)
    headline, lines, data = gpu_check_summary.profile_step(str(tmp_path), {})
    assert headline == "tensor pipe active 51.2%; top stall: long_scoreboard"
    assert "| shared st bank conflicts | 1,048,576  |" in lines and "| kernel time | 412.35 usecond |" in lines
    assert data["stalls"] == [("long_scoreboard", 1.92), ("barrier", 0.81)]


def test_tests_summary_reads_junit_xml(tmp_path):
    (tmp_path / "tests.xml").write_text(
        '<testsuites><testsuite tests="5" failures="1" errors="0" skipped="1">'
        '<testcase classname="tests.test_gemm_cuda" name="test_a"><failure/></testcase>'
        '<testcase classname="tests.test_gemm_cuda" name="test_b"/></testsuite></testsuites>')
    headline, lines, _ = gpu_check_summary.tests_step(str(tmp_path), {"log": "none.log"})
    assert headline == "3 passed, 1 failed, 1 skipped" and lines == ["- FAILED tests.test_gemm_cuda::test_a"]


def _wgmma_row(m, **ratios):
    row = {"m": m, "n": m, "k": m, "dtype": "float16", "layouts": "rc"}
    row.update({f"{name}_vs_cublas": value for name, value in ratios.items()})
    return row


def test_wgmma_speed_summary_reads_the_rows_of_a_run_cut_short(tmp_path):
    """Each schedule's geomean against cuBLAS, from the JSON or, where the
    step was stopped before writing it, from the rows its log printed."""
    ratios = dict(wgmma=1.0, wgmma_direct=0.9, wgmma_2x1=1.0, wgmma_pingpong=0.5, wmma=0.5)
    rows = [_wgmma_row(1024, **dict(ratios, wgmma=0.5, wgmma_pingpong=1.0)), _wgmma_row(8192, **dict(ratios, wgmma=2.0))]
    # The narrow tiles, timed on one shape only: averaged over it, "-" where not timed.
    rows[0].update(wgmma_n128_vs_cublas=0.8, wgmma_n64_vs_cublas=0.4, wgmma_streamk_vs_cublas=0.9)
    (tmp_path / "logs").mkdir()
    # The predecessors' line (wgmma_check.predecessors) comes first and is not a row.
    after = "a small Hopper GEMM (50176 x 1024 x 256) after itself: 50.1 us, a spin: 55.0 us"
    (tmp_path / "logs" / "speed.log").write_text(f"$ wgmma_check\n{after}\n" +
                                                  "".join(json.dumps(r) + "\n" for r in rows))
    headline, lines, data = gpu_check_summary.wgmma_speed_step(str(tmp_path), {"log": "logs/speed.log"})
    assert headline.startswith("geomean vs cuBLAS over 2 shapes: wgmma 1.00x, wgmma_direct 0.90x")
    assert "wgmma_pingpong 0.71x" in headline and "wgmma_n128 0.80x (over 1)" in headline
    assert "wgmma_streamk 0.90x (over 1)" in headline and "wgmma_splitk" not in headline
    assert lines[2] == "| 1024x1024x1024 | float16 | rc | 0.50 | 0.90 | 1.00 | 1.00 | 0.80 | 0.40 | 0.50 | - | 0.90 | - |"
    assert lines[3] == "| 8192x8192x8192 | float16 | rc | 2.00 | 0.90 | 1.00 | 0.50 | - | - | 0.50 | - | - | - |"
    assert lines[4:] == ["", after]
    (tmp_path / "wgmma_speed.json").write_text(json.dumps({"speed": rows[:1]}))
    headline, _, data = gpu_check_summary.wgmma_speed_step(str(tmp_path), {"log": "logs/speed.log"})
    assert "over 1 shapes" in headline and data["geomean_vs_cublas"]["wgmma_pingpong"] == 1.0


def test_wgmma_speed_summary_sets_stream_k_beside_the_default_on_the_training_sweep(tmp_path):
    """The training sweep's line: the default's geomean over every GEMM,
    where the default split K the default's and whole K's, and where
    stream-K was timed the default's, split-K's and stream-K's."""
    rows = [{"gemm": "a", "default_vs_cublas": 0.5, "wgmma_splitk_vs_cublas": 0.8, "wgmma_streamk_vs_cublas": 0.9},
            {"gemm": "b", "default_vs_cublas": 0.8, "wgmma_streamk_vs_cublas": 1.0},
            {"gemm": "c", "default_vs_cublas": 1.0, "whole_k_vs_cublas": 0.64}]
    (tmp_path / "wgmma_speed.json").write_text(json.dumps({"speed": [_wgmma_row(1024, wgmma=1.0)], "training": rows}))
    _, lines, _ = gpu_check_summary.wgmma_speed_step(str(tmp_path), {"log": "logs/speed.log"})
    assert lines[-1] == ("training sweep: default 0.74x over 3 GEMMs; where the default splits K (1): default 1.00x, "
                         "whole K 0.64x; where stream-K is planned (2): default 0.63x, split-K 0.80x (over 1), "
                         "stream-K 0.95x")
    assert gpu_check_summary.training_sweep_line([]) == ""


def test_make_gpu_bundle_records_the_commit(tmp_path):
    repo = tmp_path / "repo"
    for path in ("Makefile", ".gitignore", "mpgemm/tools/provenance.py"):
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(open(os.path.join(ROOT, path)).read())
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-q", "-m", "c"]):
        subprocess.run(git + args, cwd=repo, check=True)
    subprocess.run(["make", "-s", "gpu-bundle"], cwd=repo, check=True, capture_output=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
    assert (repo / "COMMIT").read_text().strip() == head
    assert subprocess.run(["git", "status", "--porcelain"], cwd=repo, capture_output=True,
                          text=True).stdout == ""  # COMMIT is ignored: it never gets committed
    spec = importlib.util.spec_from_file_location("provenance", repo / "mpgemm" / "tools" / "provenance.py")
    provenance = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(provenance)
    assert provenance.git_commit(str(repo)) == head
    # A tree copied over a checkout of an older commit (seen on a GPU
    # machine): git calls it dirty, and the bundled commit names it.
    older = head
    (repo / "Makefile").write_text((repo / "Makefile").read_text() + "\n# newer\n")
    subprocess.run(git + ["commit", "-qam", "newer"], cwd=repo, check=True)
    subprocess.run(["make", "-s", "gpu-bundle"], cwd=repo, check=True, capture_output=True)
    head = (repo / "COMMIT").read_text().strip()
    assert head != older
    subprocess.run(["git", "checkout", "-q", older, "--", "."], cwd=repo, check=True)
    subprocess.run(["git", "reset", "-q", "--soft", older], cwd=repo, check=True)
    (repo / "Makefile").write_text((repo / "Makefile").read_text() + "\n# newer\n")
    assert provenance.git_commit(str(repo)) == head
    # Without .git (as on the GPU machine) the commit comes from the file.
    subprocess.run(["rm", "-rf", str(repo / ".git")], check=True)
    assert provenance.git_commit(str(repo)) == head
    (repo / "COMMIT").unlink()
    assert provenance.git_commit(str(repo)) == "unknown"


def test_train_summary_gives_speedups_of_every_way_at_the_largest_batch_all_ran(tmp_path):
    def run(batch, way, speedup, status="ok"):
        return dict(model="gpt2-block", batch_size=batch, way=way, status=status, speedup_vs_fp32=speedup)

    ways = ("fp32", "torch.amp", "mpgemm", "torch.amp bf16", "mpgemm bf16")
    report = {"complete": True, "config": {"models": ["gpt2-block"]}, "largest_batch": [], "runs": [
        *(run(8, way, speedup) for way, speedup in zip(ways, (1.0, 2.1, 1.5, 2.2, 1.6))),
        *(run(16, way, 1.0) for way in ways[:4]), run(16, "mpgemm bf16", None, "out of memory")]}
    (tmp_path / "train.json").write_text(json.dumps(report))
    headline, _, _ = gpu_check_summary.train_step(str(tmp_path), {"log": "train.log"})
    assert headline == "gpt2-block batch 8: torch.amp 2.10x, mpgemm 1.50x, torch.amp bf16 2.20x, mpgemm bf16 1.60x"


def test_train_summary_gives_speedups_at_the_largest_complete_batch(tmp_path):
    def run(batch, way, speedup, status="ok"):
        return dict(model="resnet50", batch_size=batch, way=way, status=status, speedup_vs_fp32=speedup)

    report = {"complete": True, "config": {"models": ["resnet50"]}, "runs": [
        run(128, "fp32", 1.0), run(128, "torch.amp", 3.1), run(128, "mpgemm", 1.4),
        run(256, "fp32", 1.0), run(256, "torch.amp", 3.3), run(256, "mpgemm", None, "not run")],
        "largest_batch": [dict(model="resnet50", way="fp32", status="found", largest_fitting=600),
                          dict(model="resnet50", way="mpgemm", status="at least", largest_fitting=1024)]}
    (tmp_path / "train.json").write_text(json.dumps(report))
    (tmp_path / "train.log").write_text("model batch way\nresnet50 128 fp32\n")
    headline, lines, _ = gpu_check_summary.train_step(str(tmp_path), {"log": "train.log"})
    assert headline == ("resnet50 batch 128: torch.amp 3.10x, mpgemm 1.40x; "
                        "resnet50 largest batch: fp32 600, mpgemm >=1024")
    assert lines == ["```", "model batch way", "resnet50 128 fp32", "```"]


@pytest.mark.gpu
def test_the_sanitizer_and_profiler_targets_run(tmp_path):
    target = os.path.join(ROOT, "bench", "gpu_targets.py")
    sanitize = subprocess.run([sys.executable, target, "sanitize"], capture_output=True, text=True)
    assert sanitize.returncode == 0, sanitize.stdout + sanitize.stderr
    # 2 WMMA GEMMs, 3 passes of 11 convolutions (the large tile, stride 2, depthwise, two depthwise with wgrad on
    # the sliding window, two with fprop (and one dgrad) on the sliding gather, two on the 128 x 16 tile, 3
    # channels, a 1x1 as GEMMs), 4 checks of 7 fused batch norms (forward, dgrad, the
    # residual's gradient, the output recomputed without the residual; 2 on the default kernels, 3 with
    # MPGEMM_BATCH_NORM_LOADS_AHEAD=1, 2 with MPGEMM_BATCH_NORM_FINISH_BY_LINES=1), 2 of 2 stems' fused max pools
    # (forward, dgrad), 4 of the gated MLP's passes twice (the product, the gate's and the up projection's gradients, the product again), 2 of the
    # WMMA fprop's epilogue statistics (y and the statistics), loss scaling's 2 (the unscale pass, the
    # scale's update); on sm_90 2 of the Hopper fprop's epilogue statistics, 9 Hopper GEMMs (blocks alone, pairs, ping-pong,
    # both narrow tiles, split-K, stream-K on the wide tile and on 128 x 64, padded operands), 2 checks of each of
    # the 2 that store their pre-activation too (y and the pre-activation: GELU's erf form on blocks alone, its
    # tanh form on ping-pong pairs), 2 checks of each of the 6 that sum A's rows too (D and the row sums: whole K on each
    # of the 5 tiles, split-K on the wide one), 4 of the ones
    # that multiply by an activation's derivative (GELU's, its tanh form's and ReLU's on blocks alone, the tanh
    # form's on ping-pong pairs) and 3 passes
    # of 15 Hopper convolutions
    # (5 on the wide tile, a first layer's folded taps twice among them, x folded a thread per element and in
    # 16-byte chunks; 3 on the narrow tiles; 4 with staged rows, 2 of them on narrow tiles; 2 with a strided
    # dgrad's phases in one launch, one on a narrow tile; 1 whose wgrad runs on the 64-row tile), and 2 dgrads
    # adding an addend in their epilogue (the wide tile and 128 x 64).
    hopper = 2 + 9 + 2 * 2 + 2 * 6 + 4 + 3 * 15 + 2 if torch.cuda.get_device_capability() == (9, 0) else 0
    assert sanitize.stdout.count("relative error") == 2 + 3 * 11 + 4 * 7 + 2 * 2 + 4 * 2 + 2 + 2 + hopper
    if hopper:
        tiles = subprocess.run([sys.executable, target, "conv-tiles"], capture_output=True, text=True)
        assert tiles.returncode == 0 and "Hopper convolution kernels that ran: 3" in tiles.stdout, tiles.stdout
    path = tmp_path / "profile.json"
    profile = subprocess.run([sys.executable, target, "profile", "--size", "1024", "--without-ncu", "--json",
                              str(path)], capture_output=True, text=True)
    assert profile.returncode == 0, profile.stderr
    assert json.loads(path.read_text())["kernel_ms"] > 0


def test_train_summary_reads_every_report_and_names_the_kernel_path(tmp_path):
    def run(way, speedup, vs_amp=None, model="resnet50"):
        return dict(model=model, batch_size=256, way=way, status="ok", speedup_vs_fp32=speedup, vs_torch_amp=vs_amp)

    default = {"complete": True, "config": {"models": ["resnet50"]}, "largest_batch": [], "provenance": {},
               "runs": [run("fp32", 1.0), run("torch.amp", 5.2), run("mpgemm", 3.4, 0.65)]}
    forced = {"complete": True, "config": {"models": ["resnet50"]}, "largest_batch": [],
              "provenance": {"kernel_paths": {"MPGEMM_CONV_PATH": "wgmma"}},
              "runs": [run("torch.amp", None), run("mpgemm", None, 0.88)]}
    (tmp_path / "train_resnet50.json").write_text(json.dumps(default))
    (tmp_path / "train_resnet50_wgmma.json").write_text(json.dumps(forced))
    headline, _, data = gpu_check_summary.train_step(str(tmp_path), {"log": "train.log"})
    assert headline == ("resnet50 batch 256: torch.amp 5.20x, mpgemm 3.40x (0.65 of torch.amp); "
                        "resnet50 (MPGEMM_CONV_PATH=wgmma) batch 256: torch.amp -, mpgemm - (0.88 of torch.amp)")
    assert len(data["elapsed_s"]) == 2


def test_conv_summary_gives_each_pass_on_each_path(tmp_path):
    rows = []
    for p, ratio in (("fwd", 0.5), ("dgrad", 0.25), ("wgrad", 0.5), ("fwd+bwd", 0.4)):
        rows.append(dict(suite="conv", case="resnet50", shape=[256, 64, 64, 1, 1, 0, 56], impl=f"cudnn {p}",
                         baseline="", dtype="fp16", median_ms=1.0, check_passed=None, starved_rounds=0, times_ms=[1.0]))
        for path, r in (("", ratio), (" wgmma", 2 * ratio)):
            rows.append(dict(suite="conv", case="resnet50", shape=[256, 64, 64, 1, 1, 0, 56], impl=f"mpgemm{path} {p}",
                             baseline=f"cudnn {p}", dtype="fp16", median_ms=1.0 / r, check_passed=True,
                             starved_rounds=0, times_ms=[1.0 / r]))
    report = {"results": rows, "conv_paths": ["wgmma"], "gpu_measurement": True, "complete": True}
    (tmp_path / "conv.json").write_text(json.dumps(report))
    headline, lines, _ = gpu_check_summary.SUMMARIZERS["conv"](str(tmp_path), {"log": "conv.log", "name": "conv"})
    assert "mpgemm dgrad 0.25x of cudnn dgrad" in headline and "mpgemm wgmma dgrad 0.50x of cudnn dgrad" in headline
    assert lines[0] == "```" and any("1x1, <=128 filters" in line for line in lines)
    # A report from before the rows said whether fprop had a bias: every one had.
    assert headline.startswith("fprop with a bias on every layer")
    for row in rows:
        row["bias"] = False
    (tmp_path / "conv.json").write_text(json.dumps(report))
    headline, _, _ = gpu_check_summary.SUMMARIZERS["conv"](str(tmp_path), {"log": "conv.log", "name": "conv"})
    assert headline.startswith("fprop as each model runs it: no layer with a bias; mpgemm fwd 0.50x")


def test_host_summary_gives_each_ratio_and_the_blocks_at_batch_8(tmp_path):
    """The host step's own reports only: a train report of another step in
    the same folder stays out."""
    cases = [{"name": "linear forward", "mpgemm_us": 24.0, "torch_us": 18.0, "ratio": 24 / 18},
             {"name": "conv2d 3x3 forward", "mpgemm_us": 30.0, "torch_us": 16.0, "ratio": 30 / 16}]
    (tmp_path / "host.json").write_text(json.dumps({"suite": "host", "device": "cuda", "cases": cases}))
    run = dict(model="gpt2-block", batch_size=8, status="ok")
    block = {"complete": True, "config": {"models": ["gpt2-block"]}, "largest_batch": [], "runs": [
        dict(run, way="torch.amp", speedup_vs_fp32=None),
        dict(run, way="mpgemm", speedup_vs_fp32=None, vs_torch_amp=0.75)]}
    (tmp_path / "train_gpt2-block_batch8.json").write_text(json.dumps(block))
    (tmp_path / "train_resnet50.json").write_text(json.dumps(dict(block, config={"models": ["resnet50"]})))
    headline, _, data = gpu_check_summary.SUMMARIZERS["host"](str(tmp_path), {"log": "host.log", "name": "host"})
    assert headline.startswith("host time per call against torch's: linear forward 1.33x, conv2d 3x3 forward 1.88x; "
                               "gpt2-block batch 8: torch.amp -, mpgemm - (0.75 of torch.amp)")
    assert "resnet50" not in headline and data["host"]["cases"] == cases
    (tmp_path / "host.json").unlink()
    assert gpu_check_summary.host_step(str(tmp_path), {"log": "host.log"})[0].startswith(
        "host time per call against torch's: no host.json; gpt2-block")
    # A way that ran at no batch is named with its reason; the others keep their figures.
    block["runs"] += [dict(run, way="mpgemm captured", status="error", reason="never captured its step"),
                      dict(run, batch_size=16, way="mpgemm captured", status="error", reason="another")]
    (tmp_path / "train_gpt2-block_batch8.json").write_text(json.dumps(block))
    assert gpu_check_summary.host_step(str(tmp_path), {"log": "host.log"})[0].endswith(
        "gpt2-block mpgemm captured: error (never captured its step); "
        "gpt2-block batch 8: torch.amp -, mpgemm - (0.75 of torch.amp)")
