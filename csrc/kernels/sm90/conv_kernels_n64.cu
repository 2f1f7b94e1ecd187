// The Hopper convolution kernels of WgmmaN64Tile, on 128 x 64 tiles, for passes whose N is at most 64: fprop, dgrad and
// wgrad for fp16 and bf16 inputs (sm90/launch.h).
#include "sm90/conv_launch_kernel.cuh"

MPGEMM_WGMMA_CONV_LAUNCH(WgmmaN64Tile)
