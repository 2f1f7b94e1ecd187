// The depthwise gather (fprop; dgrad at column stride 1) on a sliding
// window (conv/depthwise.cu plans and launches it;
// MPGEMM_DEPTHWISE_SLIDING_GATHER=1, opt-in until it passes the GPU tests):
// out[image, a, b, k] = bias[k] + the sum over taps (i, j) of src[image,
// a * stride_h + origin_h + i * tap_h, b * kStrideW + origin_w + j * kTapW,
// k] * filter[k, tap (i, j)], fp32 accumulate, 8 channels a thread (16-byte
// loads), one filter a channel, for rows of kTaps taps (3, 5 or 7): fprop
// over x at a column stride of 1 or 2 (kTapW = 1: no column dilation), and
// dgrad's phases over dy at column stride 1 (kTapW = -1: the filter row
// read backwards).
//
// Why: the gather kernel (depthwise_kernels.cuh) loads the kRun source
// pixels of a run once per tap, kTaps x kRun loads a filter row, and loads
// set its speed (ConvNeXt-T's 7x7s forward at 0.63-0.78 of cuDNN on an H200
// at fe39419, 2026-11-29). The pixels a run's taps read in one source row
// are the kWindow = (kRun - 1) x kStrideW + kTaps columns under it: here
// each is loaded once a filter row (10 loads for 28 at 7 taps and stride
// 1), held in registers, and the unrolled taps read it by constant index.
//
// Tiling and order: the gather kernel's block (gather_runs: a channel
// tile's filters staged in shared memory, runs of kRun output pixels of a
// row taken in turn), and the same products in the same order (filter
// rows, then taps, a product skipped where its source pixel lies outside),
// so the result is that kernel's, bit for bit.
#pragma once

#include <type_traits>

#include "conv/depthwise_kernels.cuh"

namespace mpgemm::kernels::depthwise {

constexpr int kSlidingGatherVector = 8;  // channels a thread: 16-byte loads of 16-bit elements

// Blocks a multiprocessor each kernel is built for: the gather kernel's 2
// (at most 128 registers a thread) where its window fits them, else 1. On
// sm_90a nvcc 13.0 holds a bf16 window's columns as fp32 (a conversion is a
// shift, done once a column), so past 6 columns (3 taps at stride 1) it
// spilled at 128 registers; fp16 windows spilled past 12 columns (7 taps
// at stride 2). test_cuda_build.py checks that none spills.
template <class Element, int kWindow>
constexpr int sliding_gather_min_blocks() {
  return kWindow <= (std::is_same_v<Element, __nv_bfloat16> ? 6 : 12) ? kMinBlocksPerSM : 1;
}

template <int kTaps, int kStrideW>
constexpr int kSlidingWindow = (kRun - 1) * kStrideW + kTaps;  // columns under a run's taps in one row

template <class Element, int kTaps, int kStrideW, int kTapW>
__global__ void __launch_bounds__(kThreads, (sliding_gather_min_blocks<Element, kSlidingWindow<kTaps, kStrideW>>()))
    depthwise_sliding_gather_kernel(DepthwiseArgs args) {
  static_assert(kTapW == 1 || kTapW == -1, "taps of adjacent columns");
  constexpr int kVector = kSlidingGatherVector, kWindow = kSlidingWindow<kTaps, kStrideW>;
  const ConvGemm& g = args.g;
  const Element* src = static_cast<const Element*>(args.src);
  gather_runs<Element, kVector>(args, [&](const GatherRun& run, float (&acc)[kRun][kVector]) {
    // The window's first column: tap 0's of pixel 0, or (reading the row backwards) tap kTaps - 1's.
    const int first_col = run.b0 * kStrideW + g.origin_w - (kTapW == 1 ? 0 : kTaps - 1);
#pragma unroll 1  // a filter row's body is its window's loads, then its products
    for (int i = 0; i < g.taps_r; ++i) {
      const int src_row = run.a * g.stride_h + g.origin_h + i * g.tap_h;
      if (unsigned(src_row) >= unsigned(g.src_h)) continue;
      const Element* src_row_pixels =
          src + (int64_t(run.image) * g.src_h + src_row) * g.src_w * g.src_channels + run.src_channel;
      Channels<Element, kVector> window[kWindow];
      bool inside[kWindow];
#pragma unroll
      for (int c = 0; c < kWindow; ++c) {
        const int col = first_col + c;
        inside[c] = unsigned(col) < unsigned(g.src_w);
        if (inside[c]) window[c] = Channels<Element, kVector>::load(src_row_pixels + int64_t(col) * g.src_channels);
      }
      const float* tap_filters =
          run.lane_filters + ((g.filter_r0 + i * g.filter_dr) * g.filter_s + g.filter_s0) * run.filters_per_tile;
#pragma unroll
      for (int j = 0; j < kTaps; ++j, tap_filters += g.filter_ds * run.filters_per_tile) {
        float w[kVector];
        tap_weights<kVector>(tap_filters, 0, w);
#pragma unroll
        for (int e = 0; e < kRun; ++e) {
          // Pixel e's source column at tap j, as an index into the window.
          const int c = e * kStrideW + (kTapW == 1 ? j : kTaps - 1 - j);
          if (run.b0 + e < g.cols && inside[c])
#pragma unroll
            for (int v = 0; v < kVector; ++v) acc[e][v] = fmaf(window[c][v], w[v], acc[e][v]);
        }
      }
    }
  });
}

}  // namespace mpgemm::kernels::depthwise
