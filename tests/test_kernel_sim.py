"""Kernel simulation: g++ compiles the CUDA kernels of csrc/kernels against the
stand-in CUDA headers of tests/kernel_sim and runs random GEMM (every tile
configuration of gemm_plan.h, split-K, grouped tile orders), unscale,
convolution (fprop, dgrad, wgrad) and mma.sync ceiling problems on the host,
with fp16 and bf16 inputs (bf16 from sim arch 800 on; below it launches must be
refused),
every CUDA thread a std::thread, under AddressSanitizer and UBSan, checking
each output against a reference. No GPU and no nvcc needed, so the kernels' indexing, bounds,
zero-fill and synchronization are tested wherever the tests run. See
tests/kernel_sim/driver.cpp and conv_cases.cpp."""

import concurrent.futures
import glob
import os
import re
import shutil
import subprocess

import pytest

from conftest import SEED, skip_or_fail

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIM_DIR = os.path.join(ROOT, "tests", "kernel_sim")
KERNEL_DIR = os.path.join(ROOT, "csrc", "kernels")
# -g1: line tables for the sanitizers' reports, a third faster to build than -g.
CXXFLAGS = ["-std=c++20", "-O1", "-g1", "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-pthread"]
# CI has two cores; the case counts keep the whole module well under 90 s there.
WORKERS = 2
GEMM_CASES = 60
UNSCALE_CASES = 20
# Case i is pass i % 3 on load path i / 3 % 3 in element type i / 9 % 2 (fp16,
# bf16), so every 18 cases run all 18 conv kernels; sm_75 runs the 9 fp16 ones.
CONV_CASES = 72
CONV_KERNELS = {750: 9, 800: 18}
# (arch, cp.async copies land only when waited for). sm_75 has only the
# register-staged mainloop; sm_80 adds the cp.async pipeline, run with copies
# landing at issue and as late as wait_group allows.
RUNS = [(750, False), (800, False), (800, True)]
FIXED_SEEDS = {run: 1 + i for i, run in enumerate(RUNS)}
# A pipeline that waits for one cp.async group too few: must fail.
MUTATION = ("cp_async_wait<kStages - 2>()", "cp_async_wait<kStages - 1>()")
# LeakSanitizer cannot run under ptrace, as in some CI containers; leaks of the
# driver say nothing about the kernels anyway.
SANITIZER_ENV = {"ASAN_OPTIONS": "detect_leaks=0", "UBSAN_OPTIONS": "print_stacktrace=1"}


def compile_object(source, arch, kernel_dir, out):
    cmd = ["g++", *CXXFLAGS, f"-D__CUDA_ARCH__={arch}", "-DMPGEMM_KERNEL_SIM",
           # The stand-ins must shadow the real CUDA headers.
           "-I", os.path.join(SIM_DIR, "mock"), "-I", os.path.join(ROOT, "tests"), "-I", kernel_dir,
           "-x", "c++", "-c", source, "-o", out]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"g++ failed on {source} for arch {arch}:\n{proc.stderr[-8000:]}"
    return out


def link(objects, out):
    proc = subprocess.run(["g++", *CXXFLAGS, *objects, "-o", out], capture_output=True, text=True)
    assert proc.returncode == 0, f"link failed:\n{proc.stderr[-8000:]}"
    return out


def run_driver(binary, gemm_cases, unscale_cases, conv_cases, seed, late):
    args = [binary, str(gemm_cases), str(unscale_cases), str(conv_cases), str(seed), str(int(late))]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **SANITIZER_ENV})
    return proc.returncode, proc.stdout + proc.stderr


def mutated_kernels(dest):
    shutil.copytree(KERNEL_DIR, dest)
    found = False
    for name in os.listdir(dest):
        path = os.path.join(dest, name)
        with open(path) as f:
            text = f.read()
        if MUTATION[0] in text:
            found = True
            with open(path, "w") as f:
                f.write(text.replace(MUTATION[0], MUTATION[1]))
    assert found, f"{MUTATION[0]!r} is gone from csrc/kernels: update MUTATION"
    return dest


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Builds the driver per arch (and one mutant), runs every case set in
    parallel: {(arch, late, seed) or "mutant": (exit code, output)}."""
    if shutil.which("g++") is None:
        skip_or_fail("g++ not found")
    out = tmp_path_factory.mktemp("kernel_sim")
    driver = os.path.join(SIM_DIR, "driver.cpp")
    # The kernel sources last: the mutant swaps in its own copies of them.
    drivers = [driver, os.path.join(SIM_DIR, "conv_cases.cpp")]
    kernels = sorted(os.path.basename(p) for p in glob.glob(os.path.join(KERNEL_DIR, "*.cu"))) + ["gemm_plan.cpp"]
    sources = drivers + [os.path.join(KERNEL_DIR, name) for name in kernels]
    # Only the units with a pipeline get the mutant's copies; the rest are the real ones.
    mutated = [name for name in kernels if name.startswith("gemm_tile_") or name == "conv_launch.cu"]
    mutant_dir = mutated_kernels(str(out / "mutant"))
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        objects = {
            arch: [pool.submit(compile_object, src, arch, KERNEL_DIR, str(out / f"{i}.{arch}.o"))
                   for i, src in enumerate(sources)]
            for arch in sorted({arch for arch, _ in RUNS})
        }
        mutant_objects = [pool.submit(compile_object, os.path.join(mutant_dir, name), 800, mutant_dir,
                                      str(out / f"mutant.{name}.o")) for name in mutated]
        kept = [o for src, o in zip(sources, objects[800]) if os.path.basename(src) not in mutated]
        binaries = {arch: link([o.result() for o in objs], str(out / f"sim_{arch}")) for arch, objs in objects.items()}
        mutant = link([o.result() for o in kept + mutant_objects], str(out / "sim_mutant"))

        jobs = {}
        for arch, late in RUNS:
            for seed in (FIXED_SEEDS[(arch, late)], SEED):
                jobs[(arch, late, seed)] = pool.submit(run_driver, binaries[arch], GEMM_CASES, UNSCALE_CASES,
                                                       CONV_CASES, seed, late)
        jobs["mutant"] = pool.submit(run_driver, mutant, 20, 0, 9, 1, True)
        return {key: job.result() for key, job in jobs.items()}


@pytest.mark.parametrize("arch,late", RUNS, ids=[f"sm{a // 10}-{'late' if l else 'early'}-copies" for a, l in RUNS])
@pytest.mark.parametrize("seeded", ["fixed", "random"])
def test_kernels_match_reference(results, arch, late, seeded):
    seed = FIXED_SEEDS[(arch, late)] if seeded == "fixed" else SEED
    code, output = results[(arch, late, seed)]
    print(f"seed {seed}\n{output}")
    replay = f"replay: {arch=} {late=} seed={seed} (MPGEMM_TEST_SEED={SEED})"
    assert code == 0, f"{replay}\n{output[-12000:]}"
    assert f"gemm: 0/{GEMM_CASES} failed" in output, replay
    assert re.search(r"gemm plans: 0/\d+ failed", output), replay
    assert f"unscale: 0/{UNSCALE_CASES} failed" in output, replay
    assert f"conv: 0/{CONV_CASES} failed" in output, replay
    assert f"conv kernels launched: {CONV_KERNELS[arch]}\n" in output, replay
    assert int(re.search(r"wgrad cases that split K: (\d+)", output).group(1)) > 0, replay
    assert "ceiling: 0/3 failed" in output, replay


def test_simulation_catches_an_early_read_of_a_pipeline_stage(results):
    code, output = results["mutant"]
    assert code != 0 and "gemm: 0/" not in output and "conv: 0/" not in output, output[-4000:]
