// The Hopper GEMM's stream-K kernels (sm90/stream_k.cuh) of the narrow
// tiles, WgmmaN128Tile and WgmmaN64Tile, on blocks alone, for bf16 inputs:
// one per tile and pair of operand layouts (sm90/launch.h). A unit apart
// from the wide tile's, so that the build compiles the two side by side.
#include "sm90/launch_kernel.cuh"

MPGEMM_WGMMA_STREAM_K_LAUNCH(__nv_bfloat16, WgmmaN128Tile)
MPGEMM_WGMMA_STREAM_K_LAUNCH(__nv_bfloat16, WgmmaN64Tile)
