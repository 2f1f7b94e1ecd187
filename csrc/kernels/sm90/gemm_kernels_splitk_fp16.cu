// The Hopper GEMM's split-K kernels of WgmmaTile, on blocks alone, for fp16
// inputs: one per pair of operand layouts (sm90/launch.h).
#include "sm90/launch_kernel.cuh"

MPGEMM_WGMMA_SPLITK_LAUNCH(__half, WgmmaTile)
