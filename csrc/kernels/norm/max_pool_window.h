// A max pool over a chain's ReLU'd output (a ResNet's stem), fused into
// batch norm's forward (norm/batch_norm.h): torch's MaxPool2d window over
// batch x height x width pixels of channels-innermost rows; the output size
// (from ceil_mode) is the caller's. Plain C++: the ops' checks read it on
// every backend.
#pragma once

#include <climits>
#include <cstdint>

namespace mpgemm::kernels {

struct MaxPoolWindow {
  int batch = 0, height = 0, width = 0, out_height = 0, out_width = 0;
  int kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dilation_h = 1, dilation_w = 1;
};

// A window byte holds its tap's number in 7 bits.
constexpr int kMaxPoolTaps = 128;

// A window's stride, padding and dilation are at most this (their products
// with a tap's or a pooled row's index then stay within an int).
constexpr int kMaxPoolStep = 65535;

// Whether the fused pool takes this window over these channels: a
// non-empty input and output whose windows start inside the padded input;
// at most kMaxPoolTaps taps; stride, padding and dilation at most kMaxPoolStep; an
// image of the input and of the output at most INT_MAX elements, and every
// row or column a window reaches, padding and stride included, within an
// int (the kernels index an image's elements and coordinates in 32 bits).
inline bool max_pool_window_fits(MaxPoolWindow pool, int64_t channels) {
  const auto step = [](int v, int least) { return v >= least && v <= kMaxPoolStep; };
  const auto reach = [](int64_t size, int kernel, int stride, int pad, int dilation) {
    return size + 2 * int64_t(pad) + stride + int64_t(kernel - 1) * dilation <= INT_MAX;
  };
  // Each pooled row's window starts inside the padded input (torch's output size keeps it so).
  const auto starts_inside = [](int64_t outputs, int64_t size, int stride, int pad) {
    return outputs >= 1 && size >= 1 && (outputs - 1) * stride <= size + 2 * int64_t(pad);
  };
  return pool.batch >= 0 && starts_inside(pool.out_height, pool.height, pool.stride_h, pool.pad_h) &&
         starts_inside(pool.out_width, pool.width, pool.stride_w, pool.pad_w) && pool.kernel_h > 0 &&
         pool.kernel_w > 0 && int64_t(pool.kernel_h) * pool.kernel_w <= kMaxPoolTaps &&
         step(pool.stride_h, 1) && step(pool.stride_w, 1) && step(pool.dilation_h, 1) && step(pool.dilation_w, 1) &&
         step(pool.pad_h, 0) && step(pool.pad_w, 0) &&
         reach(pool.height, pool.kernel_h, pool.stride_h, pool.pad_h, pool.dilation_h) &&
         reach(pool.width, pool.kernel_w, pool.stride_w, pool.pad_w, pool.dilation_w) &&
         int64_t(pool.height) * pool.width * channels <= INT_MAX &&
         int64_t(pool.out_height) * pool.out_width * channels <= INT_MAX;
}

}  // namespace mpgemm::kernels
