// The Hopper GEMM kernels for A column-major, B column-major, on pairs of blocks whose consumers take tiles in turn (ping-pong).
#include "gemm_wgmma_launch.cuh"

MPGEMM_WGMMA_LAUNCH(false, true, 2, kPingPong)
