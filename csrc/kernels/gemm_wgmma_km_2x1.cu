// The Hopper GEMM kernels for A row-major, B row-major, on pairs of blocks.
#include "gemm_wgmma_launch.cuh"

MPGEMM_WGMMA_LAUNCH(true, false, 2, kCooperative)
