// A max pool fused into the elementwise pass of a chain's batch norm and
// ReLU (a ResNet's stem: conv -> batch norm -> ReLU -> max pool), over
// channels-innermost activations, every tensor of one element type T, the
// per-channel vectors fp32. The launches are in norm/batch_norm.cu: the
// grid's y walks the images, its x an image's pixels and runs of channels,
// so that an image's indices stay 32-bit whatever the batch.
//
// act_max_pool_kernel - a thread per pooled pixel and kWidth channels (16
//                 bytes where the channel count and pointers allow; a
//                 warp's threads take one pixel's consecutive channels, so
//                 its loads are whole lines): each in-bounds tap of the
//                 window, row by row, is normalized, ReLU'd and rounded to T
//                 as act_kernel does, and the first maximum (the last NaN)
//                 is kept, as torch's max pool keeps it. It writes the pooled
//                 output and, per pooled element, one byte: the tap's number
//                 in the window (row * kernel_w + column), with the top bit
//                 set where the maximum is above zero (the ReLU passed).
//                 Neither the chain's output nor its ReLU mask is written:
//                 the pool's input exists only in registers. y's elements
//                 are read by up to (kernel / stride)^2 windows, all but the
//                 first time from L1 or L2 (consecutive pooled pixels share
//                 input rows).
// max_pool_grad_kernel - the pool's and ReLU's backward as a gather, a
//                 thread per input pixel and kWidth channels: the gradients
//                 of the windows whose byte names this pixel, with the ReLU
//                 passed, summed in fp32 in torch's order (windows by row,
//                 then column) and rounded once, so the result is the bits
//                 torch's max pool backward and then the ReLU's give. No
//                 atomics: each input element is written by one thread.
#pragma once

#include <cstdint>
#include <type_traits>

#include <cuda_runtime.h>

#include "common/element_traits.cuh"
#include "common/vector_access.cuh"
#include "norm/batch_norm.h"
#include "norm/batch_norm_kernels.cuh"

namespace mpgemm::kernels::batch_norm {

constexpr unsigned kReluPassedBit = 0x80;  // of a window byte; the rest is the tap

struct ActMaxPoolArgs {
  BatchNormShape shape;  // y's rows (N * H * W) and channels
  MaxPoolWindow pool;
  const void* y;
  const float* scale;
  const float* shift;
  void* out;         // N * out_height * out_width rows
  uint8_t* window;   // a byte per element of out
};

struct MaxPoolGradArgs {
  BatchNormShape shape;  // the input gradient's rows (N * H * W) and channels
  MaxPoolWindow pool;
  const void* grad_out;  // the pooled output's gradient
  const uint8_t* window;
  void* grad_input;
};

// A run's kWidth window bytes as one 8-byte (or 4-byte) word, where kWidth
// is 8 (or 4): one access (the caller keeps it aligned).
template <int kWidth>
union WindowRun {
  std::conditional_t<kWidth == 8, uint2, uint32_t> word;
  uint8_t b[kWidth];
};

template <int kWidth>
__device__ __forceinline__ void store_window(uint8_t* window, int64_t i, const uint8_t (&bytes)[kWidth]) {
  if constexpr (kWidth == 8 || kWidth == 4) {
    WindowRun<kWidth> run;
#pragma unroll
    for (int e = 0; e < kWidth; ++e) run.b[e] = bytes[e];
    *reinterpret_cast<decltype(run.word)*>(window + i) = run.word;
  } else {
#pragma unroll
    for (int e = 0; e < kWidth; ++e) window[i + e] = bytes[e];
  }
}

template <int kWidth>
__device__ __forceinline__ void load_window(const uint8_t* window, int64_t i, uint8_t (&bytes)[kWidth]) {
  if constexpr (kWidth == 8 || kWidth == 4) {
    WindowRun<kWidth> run;
    run.word = *reinterpret_cast<const decltype(run.word)*>(window + i);
#pragma unroll
    for (int e = 0; e < kWidth; ++e) bytes[e] = run.b[e];
  } else {
#pragma unroll
    for (int e = 0; e < kWidth; ++e) bytes[e] = window[i + e];
  }
}

// Calls f(pixel, n, row, column, c) for each pixel of batch x rows x
// columns (pixel: its index in the batch) and each run of kWidth of its
// channels (c the first), a thread a run: the grid's y takes images, its x
// an image's runs, a warp's threads a pixel's consecutive runs. An image's
// elements fit an int (max_pool_window_fits) and the grid's strides are
// under 2^24, so the counters are unsigned 32-bit and never wrap (64-bit
// ones would make the compiler divide in 64 bits for the trip count).
template <int kWidth, class F>
__device__ __forceinline__ void for_each_pixel_run(int batch, int rows, int columns, int channels, F&& f) {
  const int groups = channels / kWidth;
  const unsigned items = unsigned(rows * columns * groups);
  for (unsigned n = blockIdx.y; n < unsigned(batch); n += gridDim.y) {
    for (unsigned item = blockIdx.x * kThreads + threadIdx.x; item < items; item += gridDim.x * kThreads) {
      const int pixel = int(item) / groups;
      f(int64_t(n) * rows * columns + pixel, int64_t(n), pixel / columns, pixel % columns,
        int(item) % groups * kWidth);
    }
  }
}

template <class T, int kWidth>
__global__ void __launch_bounds__(kThreads) act_max_pool_kernel(ActMaxPoolArgs a) {
  const MaxPoolWindow& p = a.pool;
  const int channels = int(a.shape.channels);
  const auto pool_pixel = [&](int64_t pixel, int64_t n, int oh, int ow, int c) {
    float scale[kWidth], shift[kWidth], best[kWidth];
    uint8_t tap[kWidth] = {};
    load_channels<kWidth>(a.scale, c, scale);
    load_channels<kWidth>(a.shift, c, shift);
#pragma unroll
    for (int e = 0; e < kWidth; ++e) best[e] = -INFINITY;
    for (int i = 0; i < p.kernel_h; ++i) {
      const int h = oh * p.stride_h - p.pad_h + i * p.dilation_h;
      if (h < 0 || h >= p.height) continue;
      for (int j = 0; j < p.kernel_w; ++j) {
        const int w = ow * p.stride_w - p.pad_w + j * p.dilation_w;
        if (w < 0 || w >= p.width) continue;
        float v[kWidth];
        load<T, kWidth>(a.y, ((n * p.height + h) * p.width + w) * channels + c, v);
#pragma unroll
        for (int e = 0; e < kWidth; ++e) {
          // The chain's output as act_kernel rounds and stores it, then torch's comparison.
          float z = __fadd_rn(__fmul_rn(v[e], scale[e]), shift[e]);
          if (z < 0.0f) z = 0.0f;  // NaN stays NaN
          z = ElementTraits<T>::to_float(ElementTraits<T>::from_float(z));
          if (z > best[e] || isnan(z)) best[e] = z, tap[e] = uint8_t(i * p.kernel_w + j);
        }
      }
    }
#pragma unroll
    for (int e = 0; e < kWidth; ++e) tap[e] |= best[e] > 0.0f ? kReluPassedBit : 0u;
    store<T, kWidth>(a.out, pixel * channels + c, best);
    store_window<kWidth>(a.window, pixel * channels + c, tap);
  };
  for_each_pixel_run<kWidth>(p.batch, p.out_height, p.out_width, channels, pool_pixel);
}

// The pooled rows (or columns) whose windows reach input row x: o with
// o * stride - pad + k * dilation = x for a tap k in [0, kernel), as [first, last].
__device__ __forceinline__ void covering(int x, int kernel, int stride, int pad, int dilation, int outputs, int& first,
                                         int& last) {
  const int low = x + pad - (kernel - 1) * dilation;
  first = low <= 0 ? 0 : (low + stride - 1) / stride;
  last = (x + pad) / stride;
  last = last < outputs - 1 ? last : outputs - 1;
}

template <class T, int kWidth>
__global__ void __launch_bounds__(kThreads) max_pool_grad_kernel(MaxPoolGradArgs a) {
  const MaxPoolWindow& p = a.pool;
  const int channels = int(a.shape.channels);
  const auto gather_pixel = [&](int64_t pixel, int64_t n, int h, int w, int c) {
    int oh_first, oh_last, ow_first, ow_last;
    covering(h, p.kernel_h, p.stride_h, p.pad_h, p.dilation_h, p.out_height, oh_first, oh_last);
    covering(w, p.kernel_w, p.stride_w, p.pad_w, p.dilation_w, p.out_width, ow_first, ow_last);
    float sum[kWidth] = {};
    for (int oh = oh_first; oh <= oh_last; ++oh) {
      const int row_offset = h + p.pad_h - oh * p.stride_h;
      if (row_offset % p.dilation_h != 0) continue;
      const int row_tap = row_offset / p.dilation_h * p.kernel_w;
      for (int ow = ow_first; ow <= ow_last; ++ow) {
        const int column_offset = w + p.pad_w - ow * p.stride_w;
        if (column_offset % p.dilation_w != 0) continue;
        const unsigned mine = kReluPassedBit | unsigned(row_tap + column_offset / p.dilation_w);
        const int64_t at = ((n * p.out_height + oh) * p.out_width + ow) * channels + c;
        uint8_t bytes[kWidth];
        load_window<kWidth>(a.window, at, bytes);
        float g[kWidth];
        load<T, kWidth>(a.grad_out, at, g);
#pragma unroll
        for (int e = 0; e < kWidth; ++e)
          if (bytes[e] == mine) sum[e] = __fadd_rn(sum[e], g[e]);
      }
    }
    store<T, kWidth>(a.grad_input, pixel * channels + c, sum);
  };
  for_each_pixel_run<kWidth>(p.batch, p.height, p.width, channels, gather_pixel);
}

}  // namespace mpgemm::kernels::batch_norm
