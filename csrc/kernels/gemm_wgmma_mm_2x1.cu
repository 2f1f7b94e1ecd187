// The Hopper GEMM kernels for A column-major, B row-major, on pairs of blocks.
#include "gemm_wgmma_launch.cuh"

MPGEMM_WGMMA_LAUNCH(false, false, 2, kCooperative)
