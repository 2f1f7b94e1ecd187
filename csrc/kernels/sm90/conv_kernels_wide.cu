// The Hopper convolution kernels of WgmmaTile, on 128 x 256 tiles: fprop, dgrad and
// wgrad for fp16 and bf16 inputs (sm90/launch.h).
#include "sm90/conv_launch_kernel.cuh"

MPGEMM_WGMMA_CONV_LAUNCH(WgmmaTile)
