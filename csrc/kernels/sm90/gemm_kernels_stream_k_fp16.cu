// The Hopper GEMM's stream-K kernels (sm90/stream_k.cuh) of WgmmaTile, on
// blocks alone, for fp16 inputs: one per pair of operand layouts
// (sm90/launch.h). A unit of their own, so that the build compiles them
// beside the others.
#include "sm90/launch_kernel.cuh"

MPGEMM_WGMMA_STREAM_K_LAUNCH(__half, WgmmaTile)
