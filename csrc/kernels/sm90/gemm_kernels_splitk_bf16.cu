// The Hopper GEMM's split-K kernels of WgmmaTile, on blocks alone, for bf16
// inputs: one per pair of operand layouts (sm90/launch.h).
#include "sm90/launch_kernel.cuh"

MPGEMM_WGMMA_SPLITK_LAUNCH(__nv_bfloat16, WgmmaTile)
