#!/usr/bin/env bash
# Every GPU-side check of mpgemm in one command, for a machine that has a GPU,
# PyTorch, nvcc, pytest and numpy but no network:
#
#   bench/gpu_check.sh RESULTS_DIR
#
# Builds the extension for the visible GPU only, times the GEMM against cuBLAS
# at the sizes of the speed work (bench/NOTES.md) and the mma.sync ceiling
# first, so that those numbers exist even if a later step runs out of time;
# then runs the tests, the CMake build with the cuBLAS cross-check,
# `python3 -m mpgemm verify` (with a sweep of random shapes against cuBLAS),
# `inspect`, `bench --quick` and the training demo. Each step logs to
# RESULTS_DIR and its wall time goes into summary.txt; a failed step does not
# stop the later ones, so one run gives every log. Exits non-zero if any step
# failed.

# No `set -e`: a failing step is recorded and the run goes on.
set -uo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 RESULTS_DIR" >&2
  exit 2
fi
mkdir -p "$1" || exit 2
RESULTS=$(cd "$1" && pwd)
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2

CUDA_DIR=${CUDA_HOME:-/usr/local/cuda}
export CUDA_HOME=$CUDA_DIR
export PATH="$CUDA_DIR/bin:$PATH"

STEP_NAMES=()
STEP_STATUS=()
STEP_LOGS=()

# run_step NAME LOG COMMAND...: runs COMMAND with its output in RESULTS/LOG.
run_step() {
  local name=$1 log=$2 status start=$SECONDS
  shift 2
  echo "== $name -> $RESULTS/$log"
  if "$@" >"$RESULTS/$log" 2>&1; then status=PASS; else status=FAIL; fi
  echo "   $status ($((SECONDS - start)) s)"
  STEP_NAMES+=("$name")
  STEP_STATUS+=("$status $((SECONDS - start))s")
  STEP_LOGS+=("$log")
}

# The visible GPU's compute capability, "9.0" style; empty without a GPU.
GPU_ARCH=$(python3 -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())' 2>/dev/null || true)

write_summary() {
  local dirty=""
  # Untracked files are left out: RESULTS_DIR itself may sit in the tree.
  [[ -n $(git status --porcelain --untracked-files=no 2>/dev/null) ]] && dirty=" (working tree has uncommitted changes)"
  {
    echo "date (UTC): $(date -u '+%Y-%m-%d %H:%M:%S')"
    echo "device: $( (nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) 2>&1 | head -n 1)"
    echo "compute capability: ${GPU_ARCH:-unknown}"
    echo "commit: $(git rev-parse HEAD 2>&1)$dirty"
    echo "nvcc: $(nvcc --version 2>&1 | tail -n 1)"
    echo "torch: $(python3 -c 'import torch; print(torch.__version__, "CUDA", torch.version.cuda)' 2>&1 | tail -n 1)"
  } >"$RESULTS/summary.txt"
  cat "$RESULTS/summary.txt"
}

build_extension() {
  [[ -n $GPU_ARCH ]] || { echo "no GPU visible to torch"; return 1; }
  echo "TORCH_CUDA_ARCH_LIST=$GPU_ARCH"
  TORCH_CUDA_ARCH_LIST=$GPU_ARCH python3 -m pip install -v --no-index --no-build-isolation --no-deps -e .
}

# Where /usr/local/cuda has no cuBLAS, the headers and library come from the
# nvidia wheels torch was installed with (site-packages/nvidia/cu13 or similar).
cublas_wheel_dir() {
  python3 - <<'EOF'
import glob, os, site
dirs = site.getsitepackages() + [site.getusersitepackages()]
for d in dirs:
    for header in sorted(glob.glob(os.path.join(d, "nvidia", "*", "include", "cublas_v2.h"))):
        print(os.path.dirname(os.path.dirname(header)))
        raise SystemExit(0)
raise SystemExit("cublas_v2.h not found in the CUDA toolkit nor in site-packages/nvidia")
EOF
}

cmake_build() {
  [[ -n $GPU_ARCH ]] || { echo "no GPU visible to torch"; return 1; }
  local args=(-S . -B build/cmake "-DCMAKE_CUDA_ARCHITECTURES=${GPU_ARCH/./}" "-DCMAKE_CUDA_COMPILER=$CUDA_DIR/bin/nvcc")
  if [[ ! -e $CUDA_DIR/include/cublas_v2.h ]]; then
    local wheel lib
    wheel=$(cublas_wheel_dir) || return 1
    lib=$(find "$wheel/lib" -maxdepth 1 -name 'libcublas.so*' | sort | head -n 1)
    [[ -n $lib ]] || { echo "no libcublas.so* in $wheel/lib"; return 1; }
    # -idirafter: the toolkit's own CUDA runtime headers must win over the wheel's.
    args+=("-DCUDA_cublas_LIBRARY=$lib" "-DCMAKE_CXX_FLAGS=-idirafter $wheel/include")
  fi
  rm -rf build/cmake
  echo "cmake ${args[*]}"
  cmake "${args[@]}" && cmake --build build/cmake -j "$(nproc)"
}

write_summary
run_step "build extension" build.log build_extension
run_step "build info" build_info.log python3 -c 'import mpgemm; print(mpgemm.build_info())'
run_step "bench speed" bench_speed.log python3 -m mpgemm bench gemm --json "$RESULTS/bench_speed.json" \
  --shapes 1024x1024x1024,4096x4096x4096,8192x8192x8192,4095x4097x4093
run_step "bench ceiling" bench_ceiling.log python3 -m mpgemm bench ceiling --json "$RESULTS/bench_ceiling.json"
run_step "bench mlp" bench_mlp.log python3 -m mpgemm bench linear --json "$RESULTS/bench_mlp.json" \
  --shapes 16384x16384x4096,16384x4096x16384
run_step "pytest" pytest.log python3 -m pytest tests -q -rs
run_step "cmake build" cmake_build.log cmake_build
run_step "cublas check" cublas_check.log build/cmake/gemm_cublas_check
run_step "verify" verify.log python3 -m mpgemm verify --sweep 200
run_step "inspect" inspect.log python3 -m mpgemm inspect
run_step "bench --quick" bench_quick.log python3 -m mpgemm bench all --quick --json "$RESULTS/bench_quick.json"
run_step "demo" demo.log python3 -m mpgemm demo --plot "$RESULTS/demo.png"

failed=0
{
  echo
  printf '%-16s %-12s %s\n' step status log
  for i in "${!STEP_NAMES[@]}"; do
    printf '%-16s %-12s %s\n' "${STEP_NAMES[$i]}" "${STEP_STATUS[$i]}" "$RESULTS/${STEP_LOGS[$i]}"
  done
} | tee -a "$RESULTS/summary.txt"
for status in "${STEP_STATUS[@]}"; do
  [[ $status == PASS* ]] || failed=1
done
exit "$failed"
