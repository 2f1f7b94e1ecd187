// The Hopper GEMM kernels of WgmmaTile, on blocks alone, for bf16 inputs: one
// per pair of operand layouts (sm90/launch.h).
#include "sm90/launch_kernel.cuh"

MPGEMM_WGMMA_LAUNCH(__nv_bfloat16, WgmmaTile)
