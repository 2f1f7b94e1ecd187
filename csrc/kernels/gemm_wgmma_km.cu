// The Hopper GEMM kernels for A row-major, B row-major, on blocks alone.
#include "gemm_wgmma_launch.cuh"

MPGEMM_WGMMA_LAUNCH(true, false, 1, kCooperative)
