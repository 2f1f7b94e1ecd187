// The Hopper convolution's dgrad kernels that store a strided phase's rows
// through shared memory (the default; not with MPGEMM_STAGED_ROW_STORES=0),
// on each tile, for fp16 and bf16 inputs (sm90/launch.h).
#include "sm90/conv_launch_kernel.cuh"

MPGEMM_WGMMA_CONV_LAUNCH_ON_EVERY_TILE(kDgrad, kStagedRows)
