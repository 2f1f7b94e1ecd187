#!/usr/bin/env python3
"""The GPU check of mpgemm, in four parts that each fit one call of a lent GPU.

  bench/gpu_check.sh --part 1 OUTDIR    measure: build, GEMM/ceiling/MLP against
                                         cuBLAS, the convolutions pass by pass
                                         against cuDNN
  bench/gpu_check.sh --part 2 OUTDIR    prove: build, GPU tests, verify sweep,
                                         the Hopper convolution's tiles,
                                         compute-sanitizer (memcheck, racecheck,
                                         synccheck)
  bench/gpu_check.sh --part 3 OUTDIR    the Hopper schedules' speed, one ncu
                                         profile, the C++ cuBLAS check
  bench/gpu_check.sh --part 4 OUTDIR    training: ResNet-50 and the GPT-2 block,
                                         timed and profiled step by step
  bench/gpu_check.sh --only tests,gemm OUTDIR      just those steps, in that order
  bench/gpu_check.sh --dry-run [--part N]           the plan, on any machine

Every step runs under `timeout` with its own limit; a failed or timed-out step
does not stop the rest. OUTDIR ends with three files: summary.md (read it
first), summary.json, and gpu_check.tar.gz (every log and raw JSON). The
summary is rewritten after every step, so a run cut short still says what it
did. The commit comes from the COMMIT file that `make gpu-bundle` writes
before the tree is copied to the GPU machine (no .git travels there).
The steps' limits per part stay under 8 minutes together
(tests/tools/test_gpu_check.py checks it); bench/README.md has the procedure.
"""

import argparse
import dataclasses
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import gpu_check_summary  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PART_BUDGET_S = 8 * 60
KILL_AFTER_S = 10  # SIGKILL this long after timeout's SIGTERM
ARCHIVE = "gpu_check.tar.gz"
OUTPUT_FILES = ("summary.md", "summary.json", ARCHIVE)
PY = os.environ.get("PYTHON", "python3")  # the python with torch (and, after the build step, mpgemm)

# Extra ncu metrics beside the sections: the tensor pipe, shared-memory bank
# conflicts and L2 throughput, named where the sections might not print them.
NCU_SECTIONS = ("SpeedOfLight", "ComputeWorkloadAnalysis", "MemoryWorkloadAnalysis_Tables", "WarpStateStats",
                "Occupancy", "LaunchStats")
NCU_METRICS = ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
               "sm__inst_executed_pipe_tensor_op_hmma.sum",
               "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
               "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
               "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
               "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
               "lts__t_bytes.sum.per_second", "lts__throughput.avg.pct_of_peak_sustained_elapsed",
               "gpu__time_duration.sum", "sm__cycles_elapsed.avg.per_second")
GEMM_SHAPES = "1024x1024x1024,4096x4096x4096,8192x8192x8192,4095x4097x4093"
MLP_SHAPES = ("16384x16384x4096,16384x4096x16384,16384x2304x768,mlp-block:16384x768x3072,mlp-dgrad:16384x768x3072,"
              "gated-mlp:8192x4096x11008")


@dataclasses.dataclass(frozen=True)
class Step:
    name: str
    part: int
    limit_s: int  # the hard limit `timeout` enforces
    estimate_s: int  # what the step took on an H100 on 2026-11-27, else an H200 on 2026-11-26 (summary.md compares)
    command: str  # bash; {raw} is the folder archived at the end, {arch} the GPU's compute capability
    what: str


PROFILE_SIZE, PROFILE_WARMUP = 4096, 2


def _ncu_command():
    sections = " ".join(f"--section {s}" for s in NCU_SECTIONS)
    ncu = (f"ncu --clock-control none --target-processes all --kernel-name regex:gemm_kernel "
           f"--launch-skip {PROFILE_WARMUP} --launch-count 1 {sections} --csv --page raw")
    target = f"{PY} bench/gpu_targets.py profile --size {PROFILE_SIZE} --warmup {PROFILE_WARMUP}"
    has_row = "grep -q '^\"[0-9]' {raw}/profile_ncu.csv"  # a kernel's row, not only ncu's messages
    # Each fallback only where the one before left no kernel's metrics: a
    # metric this ncu does not know, then no usable ncu at all.
    return (f"({ncu} --metrics {','.join(NCU_METRICS)} {target} > {{raw}}/profile_ncu.csv && {has_row}) || "
            f"({ncu} {target} > {{raw}}/profile_ncu.csv && {has_row}) || "
            f"{target} --without-ncu --json {{raw}}/profile.json")


BUILD = ("TORCH_CUDA_ARCH_LIST={arch} MAX_JOBS=$(nproc) " + PY + " setup.py build_ext --inplace && "
         + PY + " -c 'import json, mpgemm; print(json.dumps(mpgemm.build_info()))' | tee {raw}/build_info.json")
HOPPER = ('if [ "{arch}" = "9.0" ]; then nvcc -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -I csrc/kernels '
          '-I tests/kernels bench/hopper_probes.cu -o build/hopper_probes && '
          'build/hopper_probes | tee {raw}/probes.txt && '
          'PYTHONPATH=. ' + PY + ' bench/wgmma_check.py --skip-speed --json {raw}/wgmma.json; '
          'else echo "not an sm_90 GPU: no Hopper path here"; fi')
WGMMA_SPEED = ('if [ "{arch}" = "9.0" ]; then PYTHONPATH=. ' + PY + ' bench/wgmma_check.py --skip-correctness '
               '--json {raw}/wgmma_speed.json; else echo "not an sm_90 GPU: no Hopper path here"; fi')
# The Hopper convolution (MPGEMM_CONV_PATH=wgmma forces it): one tile of each
# pass against float64, a failure naming its pass. Its GPU tests are among
# the tests step's (test_conv_cuda.py runs every case on each path), its
# speed in the conv step's (--conv-paths).
CONV_TILES = ('if [ "{arch}" = "9.0" ]; then ' + PY + ' bench/gpu_targets.py conv-tiles; '
              'else echo "not an sm_90 GPU: no Hopper path here"; fi')
# The conv suite pass by pass (fprop, dgrad, wgrad and fwd+bwd against
# cuDNN's own) on ResNet-50's layers at batch 256, the depthwise and the
# grouped layers, on the default path and, on sm_90, each path forced (the
# default there mixes them pass by pass), the Hopper convolution on its
# narrow tiles and with its opt-in kernels (wgmma_opt_in: a strided dgrad's
# phases in one launch, whose launch-a-phase twin is the default's column,
# rows staged on the narrow tiles; x folded in 16-byte chunks, whose twin a
# thread per element is wgmma_narrow's first layer; the WMMA kernels' 128 x
# 16 tile, on the grouped layers and the first layer's dgrad; the depthwise
# layers' wgrad, fprop and dgrad on the sliding windows); everywhere
# 1x1 convolutions as GEMMs (gemm) and the WMMA kernels with their 128 x 16
# tile (wmma_n16), beside them without it (elsewhere the default, on sm_90
# the wmma column).
CONV = (f'paths="--conv-paths wmma_n16,gemm"; [ "{{arch}}" = "9.0" ] && '
        f'paths="--conv-paths wgmma,wgmma_narrow,wgmma_opt_in,wmma,wmma_n16,gemm"; '
        f'{PY} -m mpgemm bench conv --dtypes fp16 --batch-sizes 256 $paths --json {{raw}}/conv.json')
# Training: ResNet-50 at batch 256 and the GPT-2 block at batch 64, every
# way, at least 20 timed steps each after the scaler's first skips, with a
# profile of torch.amp's and mpgemm's steps; ResNet-50 fused (mpgemm.fuse)
# beside torch.amp and mpgemm, its step profiled too (its chains' outputs
# recomputed in backward, the default since 9eef563: the profile's backward
# act kernels and the peak memory show what that costs and saves), and once
# more, profiled, with batch norm's sums and input gradient loading rows
# ahead (MPGEMM_BATCH_NORM_LOADS_AHEAD=1) and its finish reading whole
# sectors (MPGEMM_BATCH_NORM_FINISH_BY_LINES=1; one run for both, its
# profile telling their kernels apart), and once more, profiled, with
# the statistics from the convolution's epilogue (MPGEMM_EPILOGUE_STATS=1:
# 0.93x at fe39419, its strips' moments since summed without waiting on
# each load; bench/NOTES.md), and once more, profiled, with the stem's max
# pool in its chain's pass
# (MPGEMM_FUSED_MAX_POOL=1: torch's pool kernels gone from the profile) and
# each block input's two gradients summed by its first convolution's dgrad
# (MPGEMM_DGRAD_ADDEND=1: the 16 elementwise adds, 1.95 ms a step at
# fe39419, gone from it; one run for both, the step's limit being spent,
# its profile telling their kernels apart);
# the GPT-2 block fused (its MLP as one mpgemm.mlp) among its ways, and once
# more with its MLP's GELU in epilogues both ways: the tanh form and its
# input stored by the first product's (MPGEMM_EPILOGUE_PRE_ACTIVATION=1: the
# 0.23 ms gelu pass of fe39419's step gone) and the derivative in the
# dgrad's (MPGEMM_EPILOGUE_ACTIVATION_GRAD=1); and once more, profiled, with
# its layer norms on mpgemm.layer_norm (MPGEMM_LAYER_NORM_KERNEL=1: torch's
# fp32 layer norm, its weights' backward kernel and the casts around them,
# 1.4-1.7 ms of fe39419's step, against its own passes); a Llama block at
# batch 32, its gated MLP fused as one mpgemm.gated_mlp (the gating's own
# passes, the default), and fused once more with torch's gating
# (MPGEMM_GATED_KERNEL=0); on sm_90
# ResNet-50 once more with the Hopper convolution beside torch.amp.
TRAIN = (f"rc=0; {PY} -m mpgemm bench train --models resnet50 --batch-sizes 256 --profile --no-search "
         "--time-limit 95 --json {raw}/train_resnet50.json || rc=1; "
         f"{PY} -m mpgemm bench train --models resnet50 --batch-sizes 256 --ways 'torch.amp,mpgemm,mpgemm fused' "
         "--profile --no-search --time-limit 30 --json {raw}/train_resnet50_fused.json || rc=1; "
         f"MPGEMM_BATCH_NORM_LOADS_AHEAD=1 MPGEMM_BATCH_NORM_FINISH_BY_LINES=1 {PY} -m mpgemm bench train "
         "--models resnet50 --batch-sizes 256 --ways 'torch.amp,mpgemm fused' --profile --no-search "
         "--time-limit 20 --json {raw}/train_resnet50_fused_loads_ahead_line_finish.json || rc=1; "
         f"MPGEMM_EPILOGUE_STATS=1 {PY} -m mpgemm bench train --models resnet50 --batch-sizes 256 "
         "--ways 'torch.amp,mpgemm fused' --profile --no-search --time-limit 20 "
         "--json {raw}/train_resnet50_fused_epilogue_stats.json || rc=1; "
         f"MPGEMM_FUSED_MAX_POOL=1 MPGEMM_DGRAD_ADDEND=1 {PY} -m mpgemm bench train --models resnet50 "
         "--batch-sizes 256 "
         "--ways 'torch.amp,mpgemm fused' --profile --no-search --time-limit 20 "
         "--json {raw}/train_resnet50_fused_max_pool_dgrad_addend.json || rc=1; "
         f"{PY} -m mpgemm bench train --models gpt2-block --batch-sizes 64 "
         "--ways 'fp32,torch.amp,mpgemm,torch.amp bf16,mpgemm bf16,mpgemm fused' --profile --no-search "
         "--time-limit 40 --json {raw}/train_gpt2-block.json || rc=1; "
         f"MPGEMM_EPILOGUE_PRE_ACTIVATION=1 MPGEMM_EPILOGUE_ACTIVATION_GRAD=1 {PY} -m mpgemm bench train "
         "--models gpt2-block --batch-sizes 64 --ways 'torch.amp,mpgemm fused' --no-search --time-limit 15 "
         "--json {raw}/train_gpt2-block_fused_epilogues.json || rc=1; "
         f"MPGEMM_LAYER_NORM_KERNEL=1 {PY} -m mpgemm bench train --models gpt2-block --batch-sizes 64 "
         "--ways 'torch.amp,mpgemm fused' --profile --no-search --time-limit 15 "
         "--json {raw}/train_gpt2-block_layer_norm.json || rc=1; "
         f"{PY} -m mpgemm bench train --models llama-block --batch-sizes 32 "
         "--ways 'torch.amp,mpgemm,mpgemm fused' --no-search --time-limit 15 "
         "--json {raw}/train_llama-block.json || rc=1; "
         f"MPGEMM_GATED_KERNEL=0 {PY} -m mpgemm bench train --models llama-block --batch-sizes 32 "
         "--ways 'torch.amp,mpgemm fused' --no-search --time-limit 10 "
         "--json {raw}/train_llama-block_torch_gating.json || rc=1; "
         f'if [ "{{arch}}" = "9.0" ]; then MPGEMM_CONV_PATH=wgmma {PY} -m mpgemm bench train --models resnet50 '
         "--batch-sizes 256 --ways torch.amp,mpgemm --no-search --time-limit 20 "
         "--json {raw}/train_resnet50_wgmma.json || rc=1; fi; exit $rc")
# The host side: each op's time per call on tiny tensors and a small MLP's
# training step beside torch's, then the GPT-2 block at batch 8, where the
# host's time per step decides the speed (fused too: its MLP one op of
# three; and both steps captured in a CUDA graph, where the host's time per
# op is gone), once more with its layer norms on mpgemm.layer_norm (C++
# autograd, no Python Function), and the Llama block likewise (its gated MLP
# one op of five). The last two runs have 7 s each, so that the step (38 s
# at fe39419) stays within its limit with the layer norm's run.
HOST = (f"rc=0; {PY} -m mpgemm bench host --json {{raw}}/host.json || rc=1; "
        f"{PY} -m mpgemm bench train --models gpt2-block --batch-sizes 8 "
        "--ways 'torch.amp,mpgemm,mpgemm fused,torch.amp captured,mpgemm captured' "
        "--no-search --time-limit 25 --json {raw}/train_gpt2-block_batch8.json || rc=1; "
        f"MPGEMM_LAYER_NORM_KERNEL=1 {PY} -m mpgemm bench train --models gpt2-block --batch-sizes 8 "
        "--ways 'torch.amp,mpgemm fused' --no-search --time-limit 7 "
        "--json {raw}/train_gpt2-block_batch8_layer_norm.json || rc=1; "
        f"{PY} -m mpgemm bench train --models llama-block --batch-sizes 8 --ways 'torch.amp,mpgemm,mpgemm fused' "
        "--no-search --time-limit 7 --json {raw}/train_llama-block_batch8.json || rc=1; exit $rc")
CMAKE = ("cmake -S . -B build/cmake -G Ninja -DCMAKE_CUDA_ARCHITECTURES={arch_digits} "
         "-DCMAKE_CUDA_COMPILER=$(command -v nvcc) {cublas_args} && "
         "cmake --build build/cmake && build/cmake/gemm_cublas_check")
# No caching allocator: from its 2 MB blocks an access past a small tensor
# lands in live memory, where memcheck cannot see it. API errors that torch
# itself provokes and handles are not the kernels' to answer for.
SANITIZER = ("PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool {tool} --error-exitcode 1 "
             "--report-api-errors no " + PY + " bench/gpu_targets.py sanitize")
# pytest-xdist where installed: 8 processes, each with a share of the cores.
XDIST = f"$({PY} -c 'import xdist' 2>/dev/null && printf -- '-n 8')"


STEPS = (
    Step("build", 1, 180, 110, BUILD, "build the extension for this GPU only (in place, ninja, all cores)"),
    Step("hopper", 1, 45, 15, HOPPER, "the Hopper path (sm_90 only): probes of the TMA box and wgmma layouts, "
         "then its GEMM on every operand layout, type and edge against float64"),
    Step("inspect", 1, 45, 30, f"{PY} -m mpgemm inspect",
         "HMMA in every kernel's machine code, and the kernels each op ran (torch.profiler)"),
    Step("gemm", 1, 30, 10, f"{PY} -m mpgemm bench gemm --shapes {GEMM_SHAPES} --json {{raw}}/gemm.json",
         "GEMM vs cuBLAS, fp16 and bf16 in, fp32 and 16-bit out; events cross-checked with the profiler at "
         "1024^3"),
    Step("ceiling", 1, 20, 10, f"{PY} -m mpgemm bench ceiling --json {{raw}}/ceiling.json",
         "the mma.sync ceiling, 1 and 2 blocks per SM"),
    Step("mlp", 1, 30, 10, f"{PY} -m mpgemm bench linear --shapes {MLP_SHAPES} --json {{raw}}/mlp.json",
         "fused linear+GELU (GPT-2 small's qkv width among them, whose wgrad runs ping-pong), GPT-2 small's MLP "
         "block (mpgemm.mlp; its two epilogue switches each alone and together) at 16384 tokens and its dgrad "
         "with GELU's derivative (a pass, the epilogue on blocks alone and on ping-pong pairs), and Llama-7B's "
         "gated MLP (mpgemm.gated_mlp) at 8192, vs torch, fwd and fwd+bwd, fp16 and bf16"),
    # fp16 only: the bf16 cases take as long again, outside the measure part.
    Step("conv", 1, 120, 50, CONV,
         "conv2d vs cuDNN pass by pass (fprop, dgrad, wgrad, fwd+bwd) on the 23 distinct ResNet-50 convolutions "
         "at batch 256, 5 depthwise and 3 grouped layers, fp16; on sm_90 each path forced beside the default"),
    Step("build", 2, 180, 110, BUILD, "the same build (as long on a machine left warm: each call brings the tree anew)"),
    Step("tests", 2, 120, 65, f"OMP_NUM_THREADS=2 {PY} -m pytest -m gpu -q -rs tests --junitxml {{raw}}/tests.xml "
         f"{XDIST}", "the GPU tests only (pytest -m gpu; on sm_90 each GEMM schedule and the Hopper convolution "
         "forced too), in 8 processes where pytest-xdist is installed"),
    Step("verify", 2, 20, 7, f"{PY} -m mpgemm verify --sweep 200", "float64 and cuBLAS on 214 shapes, fp16 and bf16"),
    Step("conv-tiles", 2, 30, 10, CONV_TILES,
         "the Hopper convolution (sm_90 only): one tile of each pass and one dgrad tile per phase at stride 2 "
         "against float64"),
    Step("memcheck", 2, 40, 15, SANITIZER.replace("{tool}", "memcheck"),
         "compute-sanitizer memcheck: one call of each GEMM and conv kernel family (bench/gpu_targets.py)"),
    Step("racecheck", 2, 40, 20, SANITIZER.replace("{tool}", "racecheck"),
         "compute-sanitizer racecheck (shared memory): the same calls"),
    Step("synccheck", 2, 40, 15, SANITIZER.replace("{tool}", "synccheck"),
         "compute-sanitizer synccheck (barriers): the same calls"),
    Step("build", 3, 180, 110, BUILD, "the same build (as long on a machine left warm: each call brings the tree anew)"),
    Step("wgmma-speed", 3, 85, 15, WGMMA_SPEED,
         "the Hopper schedules (blocks alone, both epilogues; pairs; ping-pong; the narrow tiles; split-K) beside "
         "WMMA and cuBLAS, then the default on training's GEMMs (96: four transformers' linears, three passes "
         "each) beside cuBLAS (sm_90 only)"),
    Step("profile", 3, 30, 10, _ncu_command(),
         "ncu on the 4096^3 GEMM: tensor pipe, stalls, bank conflicts, L2 (profiler time x clock without ncu)"),
    Step("cublas-check", 3, 120, 70, CMAKE, "the standalone kernels against cublasGemmEx (CMake, C++)"),
    Step("host", 3, 60, 40, HOST,
         "the host's time per call of the ops and of a small training step beside torch's; the GPT-2 and Llama "
         "blocks at batch 8, where the host's time decides (the GPT-2 block with mpgemm.layer_norm too)"),
    Step("build", 4, 180, 110, BUILD, "the same build (as long on a machine left warm: each call brings the tree anew)"),
    Step("train", 4, 295, 100, TRAIN,
         "ResNet-50 at batch 256 and a GPT-2 block at batch 64: every way, at least 20 timed steps, torch.profiler "
         "tables of torch.amp's and mpgemm's steps; both fused (mpgemm.fuse), with batch norm's loads ahead "
         "and with the epilogue's statistics (profiled) and the MLP's GELU in epilogues both ways too, and the "
         "GPT-2 block's layer norms on mpgemm.layer_norm (profiled); a Llama "
         "block at batch 32, fused, with its gating's passes and torch's; on sm_90 ResNet-50 with the Hopper "
         "convolution"),
)
PARTS = (1, 2, 3, 4)


def steps_of(part=None, only=None):
    chosen = [s for s in STEPS if part is None or s.part == part]
    if only:
        known = {s.name for s in STEPS}
        unknown = [name for name in only if name not in known]
        if unknown:
            raise SystemExit(f"gpu_check: unknown step {', '.join(unknown)}; steps: {', '.join(sorted(known))}")
        # In the order named, so that a short lease runs what matters first;
        # a step of several parts (the build) runs once.
        first = {}
        for s in chosen:
            first.setdefault(s.name, s)
        chosen = [first[name] for name in dict.fromkeys(only) if name in first]
    return chosen


def dry_run(parts):
    for part in parts:
        steps = steps_of(part)
        print(f"part {part}: {sum(s.limit_s for s in steps)} s of limits (budget {PART_BUDGET_S} s), "
              f"estimate {sum(s.estimate_s for s in steps)} s; returns {', '.join(OUTPUT_FILES)}")
        for s in steps:
            print(f"  {s.name:13} limit {s.limit_s:4d} s  estimate {s.estimate_s:4d} s  {s.what}")


def _capture(command, timeout=60):
    try:
        done = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
                              env=step_environment())
        return done.stdout.strip() if done.returncode == 0 else None
    except subprocess.TimeoutExpired:
        return None


def _load_provenance():
    """mpgemm/tools/provenance.py on its own: the package cannot be imported
    before the build step has built its extension."""
    spec = importlib.util.spec_from_file_location("mpgemm_provenance", os.path.join(ROOT, "mpgemm/tools/provenance.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def provenance():
    smi = _capture("nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader")
    versions = _capture(f"{PY} -c 'import torch, json; print(json.dumps([torch.__version__, torch.version.cuda, "
                        "\"%d.%d\" % torch.cuda.get_device_capability() if torch.cuda.is_available() else None]))'")
    torch_version, cuda, arch = json.loads(versions) if versions else (None, None, None)
    name, driver, memory, max_clock = ([f.strip() for f in smi.splitlines()[0].split(",")] if smi else [None] * 4)
    provenance = _load_provenance()
    return {"date": provenance.utc_now(), "device": name,
            "driver_version": driver, "memory": memory, "max_sm_clock": max_clock, "compute_capability": arch,
            "torch_version": torch_version, "cuda_version": cuda, "nvcc": _capture("nvcc --version | tail -n 1"),
            "git_commit": provenance.git_commit(ROOT)}


def cublas_cmake_args():
    """Where the toolkit has no cuBLAS headers, point CMake at the nvidia
    wheels torch came with (site-packages/nvidia/cu13)."""
    if cuda_home() and os.path.exists(os.path.join(cuda_home(), "include", "cublas_v2.h")):
        return ""
    found = _capture(f"{PY} -c 'import glob, site; print(sorted(glob.glob(site.getsitepackages()[0] + "
                     "\"/nvidia/*/include/cublas_v2.h\"))[0])'")
    if not found:
        return ""
    wheel = os.path.dirname(os.path.dirname(found))
    libs = sorted(f for f in os.listdir(os.path.join(wheel, "lib")) if f.startswith("libcublas.so"))
    if not libs:
        return ""
    # -idirafter: the toolkit's own CUDA runtime headers must win over the wheel's.
    return (f"-DCUDA_cublas_LIBRARY={shlex.quote(os.path.join(wheel, 'lib', libs[0]))} "
            f"-DCMAKE_CXX_FLAGS={shlex.quote('-idirafter ' + os.path.join(wheel, 'include'))}")


def cuda_home():
    """The CUDA toolkit's folder: $CUDA_HOME, else /usr/local/cuda where it exists."""
    home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    return home if os.path.isdir(home) else None


def step_environment():
    """The tree on the import path, and the CUDA toolkit's tools (nvcc, ncu,
    compute-sanitizer) on PATH after whatever PATH already has."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])),
               PYTHONUNBUFFERED="1")
    if cuda_home():
        env["PATH"] = os.pathsep.join([env.get("PATH", ""), os.path.join(cuda_home(), "bin")])
    return env


def expand(command, context):
    """The command with {raw}, {arch}, ... filled in (str.format would trip
    over the braces of bash and of Python one-liners)."""
    for key, value in context.items():
        command = command.replace("{" + key + "}", value)
    return command


def run_step(step, raw, context):
    command = expand(step.command, dict(context, raw=shlex.quote(raw)))
    log = os.path.join(raw, "logs", f"{step.name}-part{step.part}.log")
    start = time.monotonic()
    with open(log, "w") as f:
        f.write(f"$ {command}\n")
        f.flush()
        # SIGINT first: pytest still writes its report, the benchmarks have
        # saved theirs; SIGKILL KILL_AFTER_S later.
        rc = subprocess.run(["timeout", "-s", "INT", "-k", str(KILL_AFTER_S), str(step.limit_s), "bash", "-o",
                             "pipefail", "-c", command], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                            env=step_environment()).returncode
    status = "pass" if rc == 0 else "timeout" if rc in (124, 137) else "fail"
    return {"name": step.name, "part": step.part, "status": status, "exit_code": rc,
            "seconds": round(time.monotonic() - start, 1), "limit_s": step.limit_s, "estimate_s": step.estimate_s,
            "what": step.what, "log": os.path.relpath(log, raw)}


def run(steps, outdir, label):
    os.makedirs(outdir, exist_ok=True)
    leftovers = [f for f in os.listdir(outdir) if f not in OUTPUT_FILES]
    if leftovers:
        raise SystemExit(f"gpu_check: {outdir} holds other files ({', '.join(leftovers[:5])}); give an empty folder")
    raw = os.path.join(outdir, "raw")
    os.makedirs(os.path.join(raw, "logs"), exist_ok=True)
    info = provenance()
    arch = info["compute_capability"] or ""
    # Hopper is built as sm_90a, as setup.py does, so that the Hopper path is in.
    digits = arch.replace(".", "")
    context = {"arch": arch, "arch_digits": digits + "a" if digits == "90" else digits,
               "cublas_args": cublas_cmake_args()}
    results = []
    for step in steps:
        print(f"== {step.name} (part {step.part}, limit {step.limit_s} s)", flush=True)
        results.append(run_step(step, raw, context))
        print(f"   {results[-1]['status']} in {results[-1]['seconds']} s", flush=True)
        gpu_check_summary.write(outdir, raw, label, info, results)
    with tarfile.open(os.path.join(outdir, ARCHIVE), "w:gz") as tar:
        tar.add(raw, arcname="gpu_check")
    shutil.rmtree(raw)
    with open(os.path.join(outdir, "summary.md")) as f:
        print(f.read())
    return 0 if all(r["status"] == "pass" for r in results) else 1


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", type=int, choices=PARTS)
    parser.add_argument("--only", type=lambda s: [n.strip() for n in s.split(",") if n.strip()], metavar="STEP[,STEP]")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and exit (no GPU needed)")
    parser.add_argument("outdir", nargs="?")
    args = parser.parse_args(argv)
    if args.dry_run:
        dry_run([args.part] if args.part else PARTS)
        return 0
    if args.outdir is None or (args.part is None and not args.only):
        parser.error("give --part 1, 2, 3 or 4 (or --only STEP[,STEP]) and OUTDIR")
    steps = steps_of(args.part, args.only)
    if not steps:
        parser.error(f"no step of part {args.part} is named in --only")
    label = f"part {args.part}" if args.part else "steps " + ",".join(s.name for s in steps)
    return run(steps, os.path.abspath(args.outdir), label)


if __name__ == "__main__":
    sys.exit(main())
