// The Hopper convolution's wgrad kernels of WgmmaM64Tile, whose consumers take 64 x 256 tiles in turn, for wgrad of
// at most 64 filters: fp16 and bf16 inputs (sm90/launch.h). fprop and dgrad, whose M is the output's pixels, never
// run on it.
#include "sm90/conv_launch_kernel.cuh"

MPGEMM_WGMMA_CONV_LAUNCH_VARIANT(__half, WgmmaM64Tile, kWgrad, kPlain)
MPGEMM_WGMMA_CONV_LAUNCH_VARIANT(__nv_bfloat16, WgmmaM64Tile, kWgrad, kPlain)
