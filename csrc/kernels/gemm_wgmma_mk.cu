// The Hopper GEMM kernels for A column-major, B column-major.
#include "gemm_wgmma_launch.cuh"

MPGEMM_WGMMA_LAUNCH(false, true)
