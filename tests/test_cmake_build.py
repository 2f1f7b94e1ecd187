"""The standalone CMake build (torch-free kernel library plus the cuBLAS
cross-check program) configures, compiles and links without a GPU.

It uses the CUDA toolkit of the CUDA build check's Python (MPGEMM_CUDA_PYTHON):
the nvidia wheels carry nvcc and the cuBLAS headers this machine's toolkit lacks."""

import glob
import os
import shutil
import subprocess

from conftest import skip_or_fail
from test_cuda_build import ROOT, python_paths


def find_library(lib_dir, name):
    found = sorted(glob.glob(os.path.join(lib_dir, f"lib{name}.so*")))
    return found[0] if found else None


def test_cmake_builds_kernels_and_cublas_check(tmp_path):
    python = os.environ.get("MPGEMM_CUDA_PYTHON")
    if not python:
        skip_or_fail("MPGEMM_CUDA_PYTHON is not set to a Python with a CUDA build of torch")
    if shutil.which("cmake") is None:
        skip_or_fail("cmake not found")
    purelib, torch_cuda = python_paths(python)
    toolkit = os.path.join(purelib, "nvidia", "cu" + torch_cuda.split(".")[0])
    cudart, cublas = find_library(os.path.join(toolkit, "lib"), "cudart"), find_library(
        os.path.join(toolkit, "lib"), "cublas")
    if not (os.path.exists(os.path.join(toolkit, "include", "cublas_v2.h")) and cudart and cublas):
        skip_or_fail(f"no CUDA toolkit with cuBLAS under {toolkit}")

    build = tmp_path / "build"
    # CMake looks for unversioned library names; the wheels ship only versioned ones.
    configure = [
        "cmake", "-S", ROOT, "-B", str(build), "-DCMAKE_CUDA_ARCHITECTURES=80",
        f"-DCMAKE_CUDA_COMPILER={os.path.join(toolkit, 'bin', 'nvcc')}",
        f"-DCUDA_CUDART={cudart}", f"-DCUDA_cudart_LIBRARY={cudart}", f"-DCUDA_cublas_LIBRARY={cublas}",
    ]
    for cmd in (configure, ["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2)]):
        proc = subprocess.run(cmd, capture_output=True, text=True)
        assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    assert os.access(build / "gemm_cublas_check", os.X_OK)
    assert (build / "libmpgemm_kernels.a").exists()
