// The Hopper GEMM kernels for A row-major, B row-major.
#include "gemm_wgmma_launch.cuh"

MPGEMM_WGMMA_LAUNCH(true, false)
