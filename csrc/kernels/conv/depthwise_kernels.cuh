// The depthwise convolutions' kernels (conv/depthwise.cu plans and launches
// them): fp16 or bf16 in, fp32 accumulate, the output in fp32, fp16 or bf16,
// on CUDA cores. Each thread holds Vector channels of kRun output pixels of
// one row (a run): 8 channels in 16-byte loads where channels allow, else 1.
// A block is `lanes` threads across channels (NHWC keeps a pixel's channels
// together, so a warp's loads coalesce) by `pixel_lanes` across runs.
//
// gather (fprop; dgrad once per stride phase) - the block stages its
//   channels' filters in shared memory (fp32, tap-major) once per channel
//   tile, then grid-strides over runs: per tap, one filter value against the
//   run's kRun source pixels. dgrad is the same gather over dy, with the
//   phase geometry of the implicit GEMM (conv/geometry.h): within a phase
//   every pixel takes the same taps, so no tap is tested for divisibility.
//   The block is gather_runs, which conv/depthwise_sliding_gather.cuh's
//   kernel shares: it loads the columns under a filter row once instead of
//   once a tap, where its switch is on and its windows fit.
// wgrad - dw[k, r, s] sums dy * x over every output pixel: a block takes one
//   tap of its channels over one range (split) of the runs; its pixel lanes
//   are summed through shared memory in lane order, the splits by
//   gemm/splitk_reduce.cu in split order, so the result is deterministic. A
//   split's taps are adjacent blocks, which read the same dy and x while L2
//   holds them. (conv/depthwise_sliding_wgrad.cuh loads each once a filter
//   row instead, where its switch is on and its windows fit.)
// Runs step through (run of the row, row, image) by a RadixStep: no division per run.
#pragma once

#include <cstdint>

#include "arch/smem.cuh"
#include "common/element_traits.cuh"
#include "conv/geometry.h"

namespace mpgemm::kernels::depthwise {

constexpr int kThreads = 256;
constexpr int kRun = 4;         // output pixels a thread holds at once
// For __launch_bounds__: up to 128 registers a thread, enough to keep a
// run's loads in flight together (16 registers of 8-channel chunks).
constexpr int kMinBlocksPerSM = 2;

struct DepthwiseArgs {
  // The pixels, taps and source (conv/geometry.h): output pixel (image, a,
  // b) lies at (out_h0 + a * out_stride_h, out_w0 + b * out_stride_w) of
  // out_h x out_w; at phase tap (i, j) it reads source pixel (a * stride_h +
  // origin_h + i * tap_h, b * stride_w + origin_w + j * tap_w) of src_h x
  // src_w (src_channels each) with filter tap (filter_r0 + i * filter_dr,
  // filter_s0 + j * filter_ds) of rows filter_s long; taps_r x taps_s taps.
  ConvGemm g;
  Radix runs;     // run index -> (run of the row, row a, image)
  int run_count;  // images * rows * runs per row
  const void* src;      // gathered: x (fprop, wgrad) or dy (dgrad)
  const void* filters;  // fprop, dgrad: (filters, filter_taps)
  const void* dy;       // wgrad: (images, rows, cols, channels)
  const void* bias;     // fprop: (channels,) or null
  ElementType bias_type;
  void* out;
  ElementType out_type;
  float* partials;  // wgrad's split sums: (splits, channels, filter_taps)
  // The output's channels, which the lanes hold; lane channel L sums filters
  // L * fan + f (f < fan), and filter f reads source channel f / src_div.
  int channels, fan, src_div, filter_taps;
  int lanes, pixel_lanes, channel_tiles;
  int splits, runs_per_split;
};

// Vector consecutive channels of one pixel: one load (16 bytes when Vector is 8).
template <class Element, int Vector>
struct alignas(sizeof(Element) * Vector) Channels {
  Element e[Vector];

  __device__ static Channels load(const Element* p) { return *reinterpret_cast<const Channels*>(p); }
  __device__ float operator[](int v) const { return ElementTraits<Element>::to_float(e[v]); }
};

// v, each rounded once, to elements [at, at + Vector) of `out`, of `type`.
template <int Vector>
__device__ __forceinline__ void store_floats(void* out, ElementType type, int64_t at, const float (&v)[Vector]) {
  if constexpr (Vector == 8) {
    visit_element_type(type, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const float lo[4] = {v[0], v[1], v[2], v[3]}, hi[4] = {v[4], v[5], v[6], v[7]};
      store4(static_cast<T*>(out) + at, 4, lo);
      store4(static_cast<T*>(out) + at + 4, 4, hi);
    });
  } else {
    store_from_float(out, type, at, v[0]);
  }
}

// One run of the gather as its block hands it to the products: kRun output
// pixels from column b0 of row `a` of `image`, the lane's filters in shared
// memory (tap-major, filters_per_tile apart) and its source channel.
struct GatherRun {
  int b0, a, image;
  const float* lane_filters;
  int filters_per_tile, src_channel;
};

// The gather's block (fprop; dgrad a phase): per channel tile, its filters
// and bias staged in shared memory, then each of its runs: products(run,
// acc) sums the run's products into acc (zeros), to which the bias is added
// before the one rounding of the store.
template <class Element, int Vector, class Products>
__device__ __forceinline__ void gather_runs(const DepthwiseArgs& args, Products&& products) {
  // [filter tap][filter of the tile], then the tile's bias (zeros if none).
  float* tile_filters = reinterpret_cast<float*>(smem);
  const ConvGemm& g = args.g;
  const Element* filters = static_cast<const Element*>(args.filters);
  const int fan = Vector == 1 ? args.fan : 1;  // the launcher's plan: 8 channels only at one filter each
  const int lane = threadIdx.x % args.lanes, pixel_lane = threadIdx.x / args.lanes;
  const int tile_channels = args.lanes * Vector, filters_per_tile = tile_channels * fan;
  const int run_stride = gridDim.x * args.pixel_lanes;
  const RadixStep next_run = RadixStep::of(args.runs, run_stride);
  for (int tile = blockIdx.y; tile < args.channel_tiles; tile += gridDim.y) {
    __syncthreads();  // every thread is done with the previous tile's filters
    const int first_filter = tile * filters_per_tile, filter_end = args.channels * fan;
    for (int i = threadIdx.x; i < args.filter_taps * filters_per_tile; i += kThreads) {
      const int tap = i / filters_per_tile, filter = first_filter + i % filters_per_tile;
      tile_filters[i] = filter < filter_end
                            ? ElementTraits<Element>::to_float(filters[int64_t(filter) * args.filter_taps + tap])
                            : 0.0f;
    }
    float* tile_bias = tile_filters + args.filter_taps * filters_per_tile;
    for (int i = threadIdx.x; i < tile_channels; i += kThreads) {
      const int channel = tile * tile_channels + i;
      tile_bias[i] = args.bias != nullptr && channel < args.channels ? load_as_float(args.bias, args.bias_type, channel) : 0.0f;
    }
    __syncthreads();
    const int channel = tile * tile_channels + lane * Vector;
    if (pixel_lane >= args.pixel_lanes || channel >= args.channels) continue;
    const float* lane_filters = tile_filters + lane * Vector * fan;
    const int src_channel = channel * fan / args.src_div;
    int run = blockIdx.x * args.pixel_lanes + pixel_lane;
    for (RadixPoint at = args.runs.at(run); run < args.run_count; run += run_stride, next_run.apply(at, args.runs)) {
      const int b0 = at.lo * kRun, a = at.mid, image = at.hi;
      float acc[kRun][Vector] = {};
      products(GatherRun{b0, a, image, lane_filters, filters_per_tile, src_channel}, acc);
      const int64_t out_row = (int64_t(image) * g.out_h + g.out_h0 + a * g.out_stride_h) * g.out_w + g.out_w0;
#pragma unroll
      for (int e = 0; e < kRun; ++e) {
        if (b0 + e >= g.cols) break;
        float y[Vector];
#pragma unroll
        for (int v = 0; v < Vector; ++v) y[v] = acc[e][v] + tile_bias[lane * Vector + v];
        store_floats<Vector>(args.out, args.out_type, (out_row + (b0 + e) * g.out_stride_w) * args.channels + channel, y);
      }
    }
  }
}

// A tap's Vector filters from the lane's staged ones (filter f of the fan).
template <int Vector>
__device__ __forceinline__ void tap_weights(const float* tap_filters, int f, float (&w)[Vector]) {
  if constexpr (Vector == 8) {
    // 32-byte aligned: a tap's row of filters and each lane's share are multiples of 8 floats.
    const float4 lo = reinterpret_cast<const float4*>(tap_filters)[0];
    const float4 hi = reinterpret_cast<const float4*>(tap_filters)[1];
    w[0] = lo.x, w[1] = lo.y, w[2] = lo.z, w[3] = lo.w, w[4] = hi.x, w[5] = hi.y, w[6] = hi.z, w[7] = hi.w;
  } else {
    w[0] = tap_filters[f];
  }
}

template <class Element, int Vector>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSM) depthwise_gather_kernel(DepthwiseArgs args) {
  const ConvGemm& g = args.g;
  const Element* src = static_cast<const Element*>(args.src);
  const int fan = Vector == 1 ? args.fan : 1;
  gather_runs<Element, Vector>(args, [&](const GatherRun& run, float (&acc)[kRun][Vector]) {
    for (int i = 0; i < g.taps_r; ++i) {
      const int src_row = run.a * g.stride_h + g.origin_h + i * g.tap_h;
      if (unsigned(src_row) >= unsigned(g.src_h)) continue;
      const Element* src_row_pixels =
          src + (int64_t(run.image) * g.src_h + src_row) * g.src_w * g.src_channels + run.src_channel;
      const float* tap_filters =
          run.lane_filters + ((g.filter_r0 + i * g.filter_dr) * g.filter_s + g.filter_s0) * run.filters_per_tile;
      for (int j = 0; j < g.taps_s; ++j, tap_filters += g.filter_ds * run.filters_per_tile) {
        const int src_col = run.b0 * g.stride_w + g.origin_w + j * g.tap_w;
        for (int f = 0; f < fan; ++f) {
          float w[Vector];
          tap_weights<Vector>(tap_filters, f, w);
          // The run's pixels inside the source loaded together, then multiplied.
          Channels<Element, Vector> x[kRun];
          bool inside[kRun];
#pragma unroll
          for (int e = 0; e < kRun; ++e) {
            const int src_col_e = src_col + e * g.stride_w;
            inside[e] = run.b0 + e < g.cols && unsigned(src_col_e) < unsigned(g.src_w);
            if (inside[e]) x[e] = Channels<Element, Vector>::load(src_row_pixels + int64_t(src_col_e) * g.src_channels + f);
          }
#pragma unroll
          for (int e = 0; e < kRun; ++e)
            if (inside[e])
#pragma unroll
              for (int v = 0; v < Vector; ++v) acc[e][v] = fmaf(x[e][v], w[v], acc[e][v]);
        }
      }
    }
  });
}

template <class Element, int Vector>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSM) depthwise_wgrad_kernel(DepthwiseArgs args) {
  float* lane_sums = reinterpret_cast<float*>(smem);  // [pixel lane][channel of the tile]
  const ConvGemm& g = args.g;
  const Element* x = static_cast<const Element*>(args.src);
  const Element* dy = static_cast<const Element*>(args.dy);
  const int lane = threadIdx.x % args.lanes, pixel_lane = threadIdx.x / args.lanes;
  const int tile_channels = args.lanes * Vector;
  const RadixStep next_run = RadixStep::of(args.runs, args.pixel_lanes);
  const int items = args.filter_taps * args.splits;
  for (int tile = blockIdx.y; tile < args.channel_tiles; tile += gridDim.y) {
    const int channel = tile * tile_channels + lane * Vector;
    const bool working = pixel_lane < args.pixel_lanes && channel < args.channels;
    const int src_channel = channel / args.src_div;
    for (int item = blockIdx.x; item < items; item += gridDim.x) {
      const int tap = item % args.filter_taps, split = item / args.filter_taps;
      const int r = tap / g.filter_s, s = tap % g.filter_s;
      float acc[Vector] = {};
      if (working) {
        const int split_end = (split + 1) * args.runs_per_split;
        const int end = split_end < args.run_count ? split_end : args.run_count;
        int run = split * args.runs_per_split + pixel_lane;
        for (RadixPoint at = args.runs.at(run); run < end; run += args.pixel_lanes, next_run.apply(at, args.runs)) {
          const int b0 = at.lo * kRun, a = at.mid, image = at.hi;
          const int src_row = a * g.stride_h + g.origin_h + r * g.tap_h;
          if (unsigned(src_row) >= unsigned(g.src_h)) continue;
          const Element* src_row_pixels =
              x + (int64_t(image) * g.src_h + src_row) * g.src_w * g.src_channels + src_channel;
          const Element* dy_run = dy + ((int64_t(image) * g.rows + a) * g.cols + b0) * args.channels + channel;
          const int src_col = b0 * g.stride_w + g.origin_w + s * g.tap_w;
          // The run's pixels loaded together, then multiplied: those whose tap falls inside x.
          Channels<Element, Vector> xs[kRun], dys[kRun];
          bool inside[kRun];
#pragma unroll
          for (int e = 0; e < kRun; ++e) {
            const int src_col_e = src_col + e * g.stride_w;
            inside[e] = b0 + e < g.cols && unsigned(src_col_e) < unsigned(g.src_w);
            if (inside[e]) {
              xs[e] = Channels<Element, Vector>::load(src_row_pixels + int64_t(src_col_e) * g.src_channels);
              dys[e] = Channels<Element, Vector>::load(dy_run + int64_t(e) * args.channels);
            }
          }
#pragma unroll
          for (int e = 0; e < kRun; ++e)
            if (inside[e])
#pragma unroll
              for (int v = 0; v < Vector; ++v) acc[v] = fmaf(dys[e][v], xs[e][v], acc[v]);
        }
      }
      if (pixel_lane < args.pixel_lanes)
#pragma unroll
        for (int v = 0; v < Vector; ++v) lane_sums[pixel_lane * tile_channels + lane * Vector + v] = acc[v];
      __syncthreads();
      const int k = tile * tile_channels + int(threadIdx.x);
      if (int(threadIdx.x) < tile_channels && k < args.channels) {
        float sum = 0.0f;
        for (int l = 0; l < args.pixel_lanes; ++l) sum += lane_sums[l * tile_channels + threadIdx.x];
        const int64_t at = int64_t(k) * args.filter_taps + tap;
        if (args.splits == 1)
          store_from_float(args.out, args.out_type, at, sum);
        else
          args.partials[int64_t(split) * args.channels * args.filter_taps + at] = sum;
      }
      __syncthreads();  // lane_sums is the next item's
    }
  }
}

}  // namespace mpgemm::kernels::depthwise
