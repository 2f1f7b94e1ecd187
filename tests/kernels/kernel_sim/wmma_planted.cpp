// One WMMA tile's kernels from a copy of the kernels with bugs planted in
// the pipeline and the epilogue's column moments (test_kernel_sim.py's
// WMMA_MUTATIONS, in wmma/block.cuh), dgrad's filter loads (N16_MUTATIONS),
// depthwise wgrad's sliding window (SLIDING_MUTATIONS, below) and the
// depthwise gather's (GATHER_MUTATIONS, below):
// SmallTile's GEMMs, on which the sim arch 800 driver's small problems
// mostly run (its forced plans and split-K cases among them: with the bug
// planted, 15 of 18 forced plans and 5 of 20 random cases failed, seed 1),
// and its fp16 fprop and dgrad at 16-byte chunks, which the driver's third
// load path runs, and the fprop that writes column moments. Linked ahead of the unplanted kernels, its definitions are
// the ones the linker keeps, so that the planted build compiles this one
// tile rather than every WMMA tile and convolution kernel.
#include "conv/depthwise_sliding_gather.cuh"
#include "conv/depthwise_sliding_wgrad.cuh"
#include "conv/implicit_gemm.cuh"
#include "wmma/launch.cuh"

namespace mpgemm::kernels {
MPGEMM_WMMA_TILE_LAUNCH(SmallTile);
template void conv2d_kernel<__half, SmallTile, ConvPass::kFprop, 8>(Conv2dParams, ConvGemm, GemmGrid);
template void conv2d_kernel<__half, SmallTile, ConvPass::kDgrad, 8>(Conv2dParams, ConvGemm, GemmGrid);
template void conv2d_fprop_moments_kernel<__half, SmallTile, 8>(Conv2dParams, ConvGemm, GemmGrid);
// The 128 x 16 tile's fp16 fprop at 16-byte chunks and dgrad at 8-byte ones
// (N16_MUTATIONS, in conv/iterators.cuh; and the pipeline's early read), on
// which its first fprop case and its case 9 run.
template void conv2d_kernel<__half, N16Tile, ConvPass::kFprop, 8>(Conv2dParams, ConvGemm, GemmGrid);
template void conv2d_kernel<__half, N16Tile, ConvPass::kDgrad, 4>(Conv2dParams, ConvGemm, GemmGrid);
}  // namespace mpgemm::kernels

// Depthwise wgrad's sliding-window kernels in fp16 (SLIDING_MUTATIONS), on
// which the driver's first six sliding cases run.
namespace mpgemm::kernels::depthwise {
template void depthwise_sliding_wgrad_kernel<__half, 3, 1>(SlidingWgradArgs);
template void depthwise_sliding_wgrad_kernel<__half, 5, 1>(SlidingWgradArgs);
template void depthwise_sliding_wgrad_kernel<__half, 7, 1>(SlidingWgradArgs);
template void depthwise_sliding_wgrad_kernel<__half, 3, 2>(SlidingWgradArgs);
template void depthwise_sliding_wgrad_kernel<__half, 5, 2>(SlidingWgradArgs);
template void depthwise_sliding_wgrad_kernel<__half, 7, 2>(SlidingWgradArgs);
}  // namespace mpgemm::kernels::depthwise

// The depthwise gather's sliding-window kernels in fp16 (GATHER_MUTATIONS),
// on which the driver's sliding gather cases run (all of them at sim arch 750).
namespace mpgemm::kernels::depthwise {
template void depthwise_sliding_gather_kernel<__half, 3, 1, 1>(DepthwiseArgs);
template void depthwise_sliding_gather_kernel<__half, 5, 1, 1>(DepthwiseArgs);
template void depthwise_sliding_gather_kernel<__half, 7, 1, 1>(DepthwiseArgs);
template void depthwise_sliding_gather_kernel<__half, 3, 2, 1>(DepthwiseArgs);
template void depthwise_sliding_gather_kernel<__half, 5, 2, 1>(DepthwiseArgs);
template void depthwise_sliding_gather_kernel<__half, 7, 2, 1>(DepthwiseArgs);
template void depthwise_sliding_gather_kernel<__half, 3, 1, -1>(DepthwiseArgs);
template void depthwise_sliding_gather_kernel<__half, 5, 1, -1>(DepthwiseArgs);
template void depthwise_sliding_gather_kernel<__half, 7, 1, -1>(DepthwiseArgs);
}  // namespace mpgemm::kernels::depthwise
