// The Hopper convolution kernels of WgmmaN128Tile, on 128 x 128 tiles, for passes whose N (filters, or dgrad's channels) is at most 128: fprop, dgrad and
// wgrad for fp16 and bf16 inputs (sm90/launch.h).
#include "sm90/conv_launch_kernel.cuh"

MPGEMM_WGMMA_CONV_LAUNCH(WgmmaN128Tile)
