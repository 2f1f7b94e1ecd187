// The Hopper GEMM kernels for A column-major, B column-major, on blocks alone.
#include "gemm_wgmma_launch.cuh"

MPGEMM_WGMMA_LAUNCH(false, true, 1, kCooperative)
