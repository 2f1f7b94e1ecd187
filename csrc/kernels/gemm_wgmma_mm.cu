// The Hopper GEMM kernels for A column-major, B row-major, on blocks alone.
#include "gemm_wgmma_launch.cuh"

MPGEMM_WGMMA_LAUNCH(false, false, 1, kCooperative)
