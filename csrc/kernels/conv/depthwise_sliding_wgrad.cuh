// The depthwise wgrad on a sliding window (conv/depthwise.cu plans and
// launches it; MPGEMM_DEPTHWISE_SLIDING_WGRAD=1, opt-in until it passes the
// GPU tests): dw[k, r, s] = the sum over output pixels (image, a, b) of
// dy[image, a, b, k] * x[image, a * stride_h - pad_top + r * dilation_h,
// b * kStrideW - pad_left + s, k], fp32 accumulate, for filter rows of kS
// taps (3, 5 or 7) at a column stride of 1 or 2 and no column dilation.
//
// Why: the tap-per-block kernel (depthwise_kernels.cuh) loads dy and x once
// per tap, 2 x R x S loads per output pixel for R x S x 8 products, and
// loads set its speed (7x7 windows ran at 0.27-0.38 of cuDNN on an H200 at
// fe39419, 2026-11-29).
// Here a thread holds a whole filter row: kS taps of 4 channels (kS x 4
// fp32 sums). It walks its output rows left to right; the kS columns of x
// under the filter row stay in registers (converted to fp32 once), and each
// step to the next output pixel loads one dy and kStrideW new columns of x:
// 1 + kStrideW 8-byte loads per kS x 4 products.
//
// Tiling: a block takes a tile of up to min(32, 256 / R) lanes of 4
// channels, times R filter rows (a thread each), times pixel lanes (the
// block rounded up to whole warps) that take the split's
// output rows in turn; adjacent threads are adjacent channels of one pixel,
// so a warp's loads coalesce and the filter rows' threads of one pixel load
// the same dy. The window is a ring of kS columns: with the column loop
// unrolled kS times, tap s of step u reads slot (u * kStrideW + s) % kS, a
// constant, so no column ever moves between registers. Each thread sums its
// rows in order; the pixel lanes are summed through shared memory in lane
// order, the splits by gemm/splitk_reduce.cu in split order: the result is
// bitwise the same on every run.
#pragma once

#include <cstdint>

#include "arch/smem.cuh"
#include "common/element_traits.cuh"
#include "conv/depthwise_kernels.cuh"

namespace mpgemm::kernels::depthwise {

constexpr int kSlidingVector = 4;  // channels a thread: 8-byte loads of 16-bit elements

struct SlidingWgradArgs {
  const void* x;   // (images, h, w, channels)
  const void* dy;  // (images, p, q, channels)
  void* out;       // dw: (channels, r, s), rounded once to out_type where splits == 1
  ElementType out_type;
  float* partials;  // splits > 1: (splits, channels, r * s)
  int images, h, w, p, q, channels, r;
  int stride_h, pad_top, dilation_h, pad_left;
  int lanes, pixel_lanes, channel_tiles;
  int splits, rows_per_split;  // output rows (image, a) of a split
};

// Four channels of x at column `col` of the row at `row_pixels` as fp32, zeros outside x.
template <class Element>
__device__ __forceinline__ void load_column(const Element* row_pixels, int col, int w, int channels,
                                            float (&v)[kSlidingVector]) {
  if (unsigned(col) < unsigned(w)) {
    const auto c = Channels<Element, kSlidingVector>::load(row_pixels + int64_t(col) * channels);
#pragma unroll
    for (int e = 0; e < kSlidingVector; ++e) v[e] = c[e];
  } else {
#pragma unroll
    for (int e = 0; e < kSlidingVector; ++e) v[e] = 0.0f;
  }
}

template <class Element, int kS, int kStrideW>
__global__ void __launch_bounds__(kThreads, kS == 7 ? 1 : kMinBlocksPerSM) depthwise_sliding_wgrad_kernel(SlidingWgradArgs a) {
  static_assert(kStrideW >= 1 && kStrideW <= kS, "each step reads kStrideW new columns of a kS-column window");
  float* lane_sums = reinterpret_cast<float*>(smem);  // [pixel lane][filter row][lane][tap][channel]
  const Element* x = static_cast<const Element*>(a.x);
  const Element* dy = static_cast<const Element*>(a.dy);
  const int lane = threadIdx.x % a.lanes, filter_row = threadIdx.x / a.lanes % a.r;
  const int pixel_lane = threadIdx.x / (a.lanes * a.r);
  const int tile_channels = a.lanes * kSlidingVector, row_threads = a.lanes * a.r;
  const int tile_sums = row_threads * kS * kSlidingVector;  // a pixel lane's sums
  const int rows = a.images * a.p;
  for (int tile = blockIdx.y; tile < a.channel_tiles; tile += gridDim.y) {
    const int channel = tile * tile_channels + lane * kSlidingVector;
    const bool working = pixel_lane < a.pixel_lanes && channel < a.channels;
    for (int split = blockIdx.x; split < a.splits; split += gridDim.x) {
      float acc[kS][kSlidingVector] = {};
      const int split_end = (split + 1) * a.rows_per_split < rows ? (split + 1) * a.rows_per_split : rows;
      for (int row = split * a.rows_per_split + pixel_lane; working && row < split_end; row += a.pixel_lanes) {
        const int image = row / a.p, out_row = row % a.p;
        const int src_row = out_row * a.stride_h - a.pad_top + filter_row * a.dilation_h;
        if (unsigned(src_row) >= unsigned(a.h)) continue;
        const Element* x_row = x + (int64_t(image) * a.h + src_row) * a.w * a.channels + channel;
        const Element* dy_row = dy + int64_t(row) * a.q * a.channels + channel;
        // The window under output pixel 0: columns -pad_left + s in slot s.
        float window[kS][kSlidingVector];
#pragma unroll
        for (int s = 0; s < kS; ++s) load_column(x_row, s - a.pad_left, a.w, a.channels, window[s]);
        float dy_now[kSlidingVector];
        {
          const auto c = Channels<Element, kSlidingVector>::load(dy_row);
#pragma unroll
          for (int e = 0; e < kSlidingVector; ++e) dy_now[e] = c[e];
        }
        for (int b0 = 0; b0 < a.q; b0 += kS) {
#pragma unroll
          for (int u = 0; u < kS; ++u) {
            const int b = b0 + u;
            if (b >= a.q) break;
            // The next pixel's dy and new columns, loaded before this pixel's products.
            float dy_next[kSlidingVector], columns[kStrideW][kSlidingVector];
            const bool more = b + 1 < a.q;
            if (more) {
              const auto c = Channels<Element, kSlidingVector>::load(dy_row + int64_t(b + 1) * a.channels);
#pragma unroll
              for (int e = 0; e < kSlidingVector; ++e) dy_next[e] = c[e];
#pragma unroll
              for (int t = 0; t < kStrideW; ++t)
                load_column(x_row, (b + 1) * kStrideW - a.pad_left + kS - kStrideW + t, a.w, a.channels, columns[t]);
            }
#pragma unroll
            for (int s = 0; s < kS; ++s)
#pragma unroll
              for (int e = 0; e < kSlidingVector; ++e)
                acc[s][e] = fmaf(dy_now[e], window[(u * kStrideW + s) % kS][e], acc[s][e]);
            if (more) {
              // The columns of taps 0 .. kStrideW - 1 of this pixel are no later pixel's.
#pragma unroll
              for (int t = 0; t < kStrideW; ++t)
#pragma unroll
                for (int e = 0; e < kSlidingVector; ++e) window[(u * kStrideW + t) % kS][e] = columns[t][e];
#pragma unroll
              for (int e = 0; e < kSlidingVector; ++e) dy_now[e] = dy_next[e];
            }
          }
        }
      }
      if (pixel_lane < a.pixel_lanes)
#pragma unroll
        for (int s = 0; s < kS; ++s)
#pragma unroll
          for (int e = 0; e < kSlidingVector; ++e)
            lane_sums[pixel_lane * tile_sums + ((filter_row * a.lanes + lane) * kS + s) * kSlidingVector + e] =
                acc[s][e];
      __syncthreads();
      // Each of the tile's sums over the pixel lanes in order, to dw[k, r, s] or the split's partials.
      for (int i = threadIdx.x; i < tile_sums; i += blockDim.x) {
        const int e = i % kSlidingVector, s = i / kSlidingVector % kS, l = i / (kSlidingVector * kS) % a.lanes;
        const int r = i / (kSlidingVector * kS * a.lanes);
        const int k = tile * tile_channels + l * kSlidingVector + e;
        if (k >= a.channels) continue;
        float sum = 0.0f;
        for (int pl = 0; pl < a.pixel_lanes; ++pl) sum += lane_sums[pl * tile_sums + i];
        const int64_t at = (int64_t(k) * a.r + r) * kS + s;
        if (a.splits == 1)
          store_from_float(a.out, a.out_type, at, sum);
        else
          a.partials[int64_t(split) * a.channels * a.r * kS + at] = sum;
      }
      __syncthreads();  // lane_sums is the next split's
    }
  }
}

}  // namespace mpgemm::kernels::depthwise
