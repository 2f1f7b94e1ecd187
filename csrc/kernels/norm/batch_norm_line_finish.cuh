// The finish of batch norm's sums with its partials read by whole sectors
// (opt-in: MPGEMM_BATCH_NORM_FINISH_BY_LINES=1, norm/batch_norm.h's
// BatchNormKernelChoice). It computes what finish_kernel
// (norm/batch_norm_kernels.cuh) does, summing in another fixed order.
//
// line_finish_kernel - a block of 1024 threads takes 8 adjacent channels
//                      (the 32 bytes of a row block's partials that one
//                      sector holds) and 128 lanes of row blocks: thread t
//                      sums channel t % 8 over row blocks t / 8, t / 8 +
//                      128, ... (at most kLineBlocksPerLane), every load of
//                      both sums issued before the first add. A warp's 4
//                      lanes of a channel meet by two xor shuffles (each
//                      lane ends with the same bits), then 16 threads add
//                      the 32 warps' totals in warp order, and 8 finish
//                      their channels as finish_kernel does. All in fp64,
//                      nothing atomic: the order depends on the shape
//                      alone, so every run gives the same bits. With
//                      nothing to sum (given or running statistics) it is
//                      launched as one warp a block, whose first lane's 8
//                      threads finish their channels.
//
// Why: finish_kernel takes a block per channel. Its threads read the
// partials a row of channels apart (a 32-byte sector for each 4-byte value),
// each waits on its first loads before issuing its last, and thread 0 adds
// the 256 threads' sums one after another. In the fused ResNet-50 step at batch 256 its 106
// launches took 0.73 ms, about 7 us each (H200, fe39419; bench/NOTES.md,
// "Batch norm's finish read by whole sectors").
#pragma once

#include "norm/batch_norm_kernels.cuh"

namespace mpgemm::kernels::batch_norm {

constexpr int kLineChannels = 8;  // fp32 partials in a 32-byte sector
constexpr int kLineLanes = 128;   // lanes of row blocks a block takes
constexpr int kLineThreads = kLineChannels * kLineLanes;
constexpr int kLineWarps = kLineThreads / 32;
constexpr int kLineBlocksPerLane = 8;  // row blocks a lane sums: kLineLanes of them cover 1024
// The warps' totals ([2][kLineWarps][kLineChannels]), then the block's ([2][kLineChannels]).
constexpr int kLineSmemBytes = (2 * kLineWarps + 2) * kLineChannels * int(sizeof(double));
static_assert(32 % kLineChannels == 0, "a warp holds whole lanes of the block's channels");

template <class T>
__global__ void __launch_bounds__(kLineThreads, 1) line_finish_kernel(FinishArgs a) {
  const int e = threadIdx.x % kLineChannels, lane = threadIdx.x / kLineChannels, warp = threadIdx.x / 32;
  const int64_t channels = a.shape.channels, c = int64_t(blockIdx.x) * kLineChannels + e;
  const bool in_channels = c < channels;
  if (a.partial == nullptr) {  // given or running statistics: nothing to sum
    if (lane == 0 && in_channels) finish_unsummed(a, c);
    return;
  }
  // Channel c's partials of the lane's row blocks. Every thread loads all kLineBlocksPerLane of both sums,
  // a block past the last (or a channel past the last) read at the last and added as 0: loads under no
  // predicate, which the compiler issues before the first conversion (predicated ones, it converted a
  // pair and waited on it before issuing the last pair).
  const int64_t last_block = a.blocks - 1;
  const float* first_sums = a.partial + (in_channels ? c : channels - 1);
  const float* second_sums = first_sums + a.blocks * channels;
  float first[kLineBlocksPerLane], second[kLineBlocksPerLane];
#pragma unroll
  for (int i = 0; i < kLineBlocksPerLane; ++i) {
    const int64_t b = lane + i * kLineLanes, offset = (b < last_block ? b : last_block) * channels;
    first[i] = first_sums[offset];
    second[i] = second_sums[offset];
  }
  double sums[2] = {0.0, 0.0};
#pragma unroll
  for (int i = 0; i < kLineBlocksPerLane; ++i) {
    const bool held = in_channels && lane + i * kLineLanes < a.blocks;
    sums[0] += held ? first[i] : 0.0f;
    sums[1] += held ? second[i] : 0.0f;
  }
  // The warp's lanes of channel e are its threads e, e + 8, e + 16, e + 24.
#pragma unroll
  for (int bit = kLineChannels; bit < 32; bit *= 2) {
    sums[0] += __shfl_xor_sync(0xffffffffu, sums[0], bit);
    sums[1] += __shfl_xor_sync(0xffffffffu, sums[1], bit);
  }
  double* warp_totals = reinterpret_cast<double*>(smem);
  double* totals = warp_totals + 2 * kLineWarps * kLineChannels;
  if (threadIdx.x % 32 < kLineChannels) {
    warp_totals[warp * kLineChannels + e] = sums[0];
    warp_totals[(kLineWarps + warp) * kLineChannels + e] = sums[1];
  }
  __syncthreads();
  if (threadIdx.x < 2 * kLineChannels) {  // thread s * 8 + e: sum s of channel e
    double total = 0.0;
#pragma unroll
    for (int w = 0; w < kLineWarps; ++w) total += warp_totals[(threadIdx.x / kLineChannels * kLineWarps + w) *
                                                               kLineChannels + e];
    totals[threadIdx.x] = total;
  }
  __syncthreads();
  if (threadIdx.x < kLineChannels && in_channels) finish_summed<T>(a, c, totals[e], totals[kLineChannels + e]);
}

}  // namespace mpgemm::kernels::batch_norm
