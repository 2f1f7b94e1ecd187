// Layer norm's arithmetic over rows of `cols` values (mpgemm.layer_norm: the
// last dimensions of a 16-bit x, fp32 weights), in fp32, shared by the CUDA
// kernels (norm/layer_norm.cu), the CPU backend (csrc/layer_norm.cpp) and the
// simulation's references, so that all three give the same bits:
//     mean = sum(x) / cols,  rstd = 1 / sqrt(sum((x - mean)^2) / cols + eps)
//     y = (x - mean) * rstd * w + b
//     g = dy * w,  dx = (g - (mean(g) + xhat * mean(g * xhat))) * rstd
//     dw = sum over rows of dy * xhat,  db = sum over rows of dy
// Every sum runs in one fixed order, a function of the shape and of the row
// tensors' alignment alone (layer_norm_width): a row's
// over the 32 lanes of a warp (lane l takes the runs of `width` elements l,
// l + 32, ... in turn, then a butterfly over the lanes), a column's over
// slabs of rows (each slab's rows by 8 warps in turn, then the warps', then
// the slabs' in order). Each step rounds once: products and sums written as
// one fmaf or one operation (__fmul_rn on the device, where nvcc would
// otherwise contract a product into the next subtraction; the host builds
// contract nothing: setup.py compiles them with -ffp-contract=off).
#pragma once

#include <cmath>
#include <cstdint>
#include <initializer_list>

#include "common/host_device.h"
#include "common/math.h"

namespace mpgemm::kernels {

constexpr int kLayerNormLanes = 32;  // a row's sums: one warp
constexpr int kLayerNormWarps = 8;   // rows a block takes; warps of a slab

// Rows of one slab of the weights' column sums: at least 256, and at most 64
// slabs, a multiple of the warps.
MPGEMM_HOST_DEVICE int64_t layer_norm_slab_rows(int64_t rows) {
  const int64_t wanted = ceil_div(rows, 64);
  return round_up(wanted > 256 ? wanted : 256, kLayerNormWarps);
}

MPGEMM_HOST_DEVICE int64_t layer_norm_slabs(int64_t rows) { return ceil_div(rows, layer_norm_slab_rows(rows)); }

// fp32 floats of workspace the weights' sums take: two per column per slab.
inline int64_t layer_norm_workspace_floats(int64_t rows, int64_t cols) { return 2 * layer_norm_slabs(rows) * cols; }

// How many elements a lane takes at a time: 8 (16 bytes) where cols is a
// multiple of 8 and the base of every row tensor a pass reads or writes is
// 16-byte aligned, else 1. The CPU backend asks it of its own tensors, so
// that both sum in one order.
inline int layer_norm_width(int64_t cols, std::initializer_list<const void*> row_tensors) {
  if (cols % 8 != 0) return 1;
  for (const void* p : row_tensors)
    if (p != nullptr && !aligned16(p)) return 1;
  return 8;
}

// The product a*b rounded once, never fused into what follows.
MPGEMM_HOST_DEVICE float product_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

MPGEMM_HOST_DEVICE float layer_norm_rstd(float sum_of_squares, int64_t cols, float eps) {
  return 1.0f / sqrtf(sum_of_squares / float(cols) + eps);
}

MPGEMM_HOST_DEVICE float normalized(float x, float mean, float rstd) { return (x - mean) * rstd; }

// y from x; w and b are 1 and 0 where the layer has none.
MPGEMM_HOST_DEVICE float layer_norm_output(float x, float mean, float rstd, float w, float b) {
  return fmaf(normalized(x, mean, rstd), w, b);
}

// dx from g = product_rn(dy, w), xhat and the row's means of g and g * xhat.
MPGEMM_HOST_DEVICE float layer_norm_grad_input(float g, float xhat, float mean_g, float mean_g_xhat, float rstd) {
  return (g - fmaf(xhat, mean_g_xhat, mean_g)) * rstd;
}

// ---- References of the fixed orders, for host code ----------------------

// The sum of term(i) over i < cols in a row's order; term(i, acc) folds
// element i into a lane's running sum acc.
template <class Fold>
float row_sum(int64_t cols, int width, const Fold& fold) {
  float lane[kLayerNormLanes] = {};
  for (int64_t run = 0; run * width < cols; ++run)
    for (int e = 0; e < width; ++e) {
      float& acc = lane[run % kLayerNormLanes];
      acc = fold(run * width + e, acc);
    }
  for (int bit = kLayerNormLanes / 2; bit >= 1; bit /= 2) {
    float next[kLayerNormLanes];
    for (int l = 0; l < kLayerNormLanes; ++l) next[l] = lane[l] + lane[l ^ bit];
    for (int l = 0; l < kLayerNormLanes; ++l) lane[l] = next[l];
  }
  return lane[0];
}

struct LayerNormRowStats {
  float mean, rstd;
};

// A row's statistics from its widened values x[0, cols).
inline LayerNormRowStats layer_norm_row_stats(const float* x, int64_t cols, int width, float eps) {
  const float mean = row_sum(cols, width, [&](int64_t i, float acc) { return acc + x[i]; }) / float(cols);
  const float squares = row_sum(cols, width, [&](int64_t i, float acc) {
    const float d = x[i] - mean;
    return fmaf(d, d, acc);
  });
  return {mean, layer_norm_rstd(squares, cols, eps)};
}

// A row's dx[0, cols) from its widened x and dy; w null where the layer has none.
inline void layer_norm_row_grad(const float* x, const float* dy, const float* w, LayerNormRowStats s, int64_t cols,
                                int width, float* dx) {
  const auto g = [&](int64_t i) { return w ? product_rn(dy[i], w[i]) : dy[i]; };
  const float mean_g = row_sum(cols, width, [&](int64_t i, float acc) { return acc + g(i); }) / float(cols);
  const float mean_g_xhat = row_sum(cols, width, [&](int64_t i, float acc) {
                              return fmaf(g(i), normalized(x[i], s.mean, s.rstd), acc);
                            }) / float(cols);
  for (int64_t i = 0; i < cols; ++i)
    dx[i] = layer_norm_grad_input(g(i), normalized(x[i], s.mean, s.rstd), mean_g, mean_g_xhat, s.rstd);
}

// Column c's sums of dy * xhat and dy over `rows` rows in their fixed order;
// x(r) and dy(r) give row r's widened values of the column.
template <class X, class Dy>
void layer_norm_column_sums(int64_t rows, const X& x, const Dy& dy, const float* mean, const float* rstd,
                            float& sum_dy_xhat, float& sum_dy) {
  const int64_t slab_rows = layer_norm_slab_rows(rows);
  sum_dy_xhat = 0.0f, sum_dy = 0.0f;
  for (int64_t begin = 0; begin < rows; begin += slab_rows) {
    const int64_t end = begin + slab_rows < rows ? begin + slab_rows : rows;
    float slab_w = 0.0f, slab_b = 0.0f;
    for (int warp = 0; warp < kLayerNormWarps; ++warp) {
      float acc_w = 0.0f, acc_b = 0.0f;
      for (int64_t r = begin + warp; r < end; r += kLayerNormWarps) {
        acc_w = fmaf(dy(r), normalized(x(r), mean[r], rstd[r]), acc_w);
        acc_b = acc_b + dy(r);
      }
      slab_w = slab_w + acc_w, slab_b = slab_b + acc_b;
    }
    sum_dy_xhat = sum_dy_xhat + slab_w, sum_dy = sum_dy + slab_b;
  }
}

}  // namespace mpgemm::kernels
