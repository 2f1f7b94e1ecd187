// The Hopper GEMM kernels for A column-major, B row-major.
#include "gemm_wgmma_launch.cuh"

MPGEMM_WGMMA_LAUNCH(false, false)
