"""The standalone CMake build (torch-free kernel library plus the cuBLAS
cross-check program, conftest.py's cmake_build, whose sm_80 code the SASS
checks read) configures, compiles and links without a GPU."""

import os


def test_cmake_builds_kernels_and_cublas_check(cmake_build):
    assert os.access(os.path.join(cmake_build, "gemm_cublas_check"), os.X_OK)
    assert os.path.exists(os.path.join(cmake_build, "libmpgemm_kernels.a"))
