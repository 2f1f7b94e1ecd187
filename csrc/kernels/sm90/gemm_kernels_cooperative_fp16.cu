// The Hopper GEMM kernels of WgmmaTile, on blocks alone, for fp16 inputs: one
// per pair of operand layouts (sm90/launch.h).
#include "sm90/launch_kernel.cuh"

MPGEMM_WGMMA_LAUNCH(__half, WgmmaTile)
