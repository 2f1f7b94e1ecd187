// Convolutions with one input channel per group (depthwise, with or without a
// small channel multiplier), computed directly on CUDA cores. As implicit
// GEMMs, each group would be a GEMM of N = K/groups columns and K = R*S
// (times the channels padded to a whole chunk): a Tensor Core tile would do
// a few of its 64 columns' work, on 4x the products. A direct kernel does
// each product once, reading the tensors in place.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime.h>

#include "conv/params.h"

namespace mpgemm::kernels {

// How the direct kernels run a pass of a problem; `vector` is 0 for the
// problems they leave to the implicit GEMMs: channels per group other than
// 1, filters per group from kDepthwiseMaxFiltersPerGroup + 1 on, a filter
// window too large for a block's shared memory, or tensors past 32-bit
// element indices (which the implicit GEMMs refuse as well).
struct DepthwisePlan {
  int vector = 0;            // channels per thread: 8 (16-byte loads), 4 (the sliding wgrad's 8-byte loads) or 1
  int lanes = 0;             // threads of a block across channels
  int pixel_lanes = 0;       // threads of a block across output pixels (the sliding wgrad: output rows)
  int64_t channel_tiles = 0; // blocks across channels (lanes * vector each)
  int smem_bytes = 0;
  int64_t gather_blocks = 0; // fprop, dgrad: blocks across output pixels at most
  int splits = 1;            // wgrad: output-pixel ranges (the sliding window: output rows) summed apart, then in order
  bool sliding = false;      // wgrad on the sliding window
  bool sliding_gather = false;  // fprop, dgrad: the gather on the sliding window where a launch's window fits
};

// Single-channel groups with more filters than this run as implicit GEMMs:
// a 64-column tile then does at least a quarter of its work, and Tensor
// Cores outrun CUDA-core FMAs by about 15x.
constexpr int64_t kDepthwiseMaxFiltersPerGroup = 15;

// The plan for `pass` of `params` on the current device. wgrad takes the
// sliding window (conv/depthwise_sliding_wgrad.cuh) where `sliding_wgrad`
// (depthwise_sliding_wgrad_enabled(), which plan_conv2d reads with the other
// switches) and depthwise_sliding_wgrad_fits() say so; fprop and dgrad take
// theirs (conv/depthwise_sliding_gather.cuh) where `sliding_gather`
// (depthwise_sliding_gather_enabled()) and depthwise_sliding_gather_fits()
// do.
DepthwisePlan plan_depthwise(ConvPass pass, const Conv2dParams& params, bool sliding_wgrad, bool sliding_gather);

// Whether depthwise wgrad may take the sliding window: only where
// MPGEMM_DEPTHWISE_SLIDING_WGRAD is "1" until it has passed the GPU tests
// (unset, "" or "0": no; throws std::invalid_argument for any other value).
bool depthwise_sliding_wgrad_enabled();

// Whether the sliding window computes wgrad of `params`: one filter a
// channel (no channel multiplier), filter rows of 3, 5 or 7 taps at a column
// stride of 1 or 2 with no column dilation, at most 32 filter rows (a block
// holds at least 8 lanes of channels), channels a multiple of 4 with x and
// dy 8-byte aligned, and at least one output pixel.
bool depthwise_sliding_wgrad_fits(const Conv2dParams& params);

// Whether fprop and dgrad may take the sliding gather: only where
// MPGEMM_DEPTHWISE_SLIDING_GATHER is "1" until it has passed the GPU tests
// (unset, "" or "0": no; throws std::invalid_argument for any other value).
bool depthwise_sliding_gather_enabled();

// Whether the sliding gather runs `pass` (fprop or dgrad) of `params`: one
// filter a channel, 16-byte runs of 8 channels (channels a multiple of 8, the
// gathered tensor 16-byte aligned), filter rows of 3, 5 or 7 taps with no
// column dilation, at a column stride of 1 or 2 (fprop) or 1 (dgrad, whose
// one column phase then takes every tap of a row).
bool depthwise_sliding_gather_fits(ConvPass pass, const Conv2dParams& params);

// Bytes of workspace a plan needs: wgrad's fp32 partial sums when it splits.
size_t depthwise_workspace_bytes(const Conv2dParams& params, const DepthwisePlan& plan);

// Enqueues the pass on `stream` (`plan` from plan_depthwise, with vector > 0;
// `workspace` at least depthwise_workspace_bytes, 16-byte aligned). Returns
// the launch error, cudaErrorInvalidValue for a missing workspace or an
// input_type that is not 16-bit, cudaErrorNotSupported for bf16 where the
// device runs code built below sm_80 (as the Tensor Core kernels).
cudaError_t launch_depthwise(ConvPass pass, const Conv2dParams& params, const DepthwisePlan& plan, void* workspace,
                             cudaStream_t stream);

}  // namespace mpgemm::kernels
