// The Hopper GEMM kernels for A row-major, B column-major (both K-major), on blocks alone.
#include "gemm_wgmma_launch.cuh"

MPGEMM_WGMMA_LAUNCH(true, true, 1, kCooperative)
