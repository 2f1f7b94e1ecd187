// The Hopper GEMM kernels for A column-major, B column-major, on pairs of blocks.
#include "gemm_wgmma_launch.cuh"

MPGEMM_WGMMA_LAUNCH(false, true, 2, kCooperative)
