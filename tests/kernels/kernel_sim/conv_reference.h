// The convolution references the simulation's drivers share (conv_cases.cpp,
// hopper_conv_cases.cpp): the output, scattering every product of the
// convolution into the pass's output, so that it shares no indexing with
// the kernels' gathers; and fprop's batch statistics, from the output as
// stored.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "conv/params.h"
#include "kernel_sim/sim_common.h"
#include "norm/column_moments.h"

namespace sim {

// Every product x[n, ih, iw, g * C/groups + c] * wt[k, r, s, c] * dy[n, p, q,
// k] of the convolution `a`, the pass's output operand left out, summed in
// double into the pass's output of `count` elements (y, dx or dw, dense).
// x, wt and dy: the inputs' elements by index, as doubles.
template <class X, class W, class Dy>
std::vector<double> conv_reference(mpgemm::kernels::ConvPass pass, const mpgemm::kernels::Conv2dParams& a, X x,
                                   W wt, Dy dy, int64_t count) {
  using mpgemm::kernels::ConvPass;
  const int64_t cg = a.c / a.groups, kg = a.k / a.groups;
  std::vector<double> want(count, 0.0);
  for (int64_t n = 0; n < a.n; ++n)
    for (int64_t p = 0; p < a.p; ++p)
      for (int64_t q = 0; q < a.q; ++q)
        for (int64_t r = 0; r < a.r; ++r)
          for (int64_t s = 0; s < a.s; ++s) {
            const int64_t ih = p * a.stride_h - a.pad_top + r * a.dilation_h;
            const int64_t iw = q * a.stride_w - a.pad_left + s * a.dilation_w;
            if (ih < 0 || ih >= a.h || iw < 0 || iw >= a.w) continue;
            for (int64_t k = 0; k < a.k; ++k)
              for (int64_t c = 0; c < cg; ++c) {
                const int64_t xi = ((n * a.h + ih) * a.w + iw) * a.c + k / kg * cg + c;
                const int64_t wi = ((k * a.r + r) * a.s + s) * cg + c, yi = ((n * a.p + p) * a.q + q) * a.k + k;
                if (pass == ConvPass::kFprop) want[yi] += x(xi) * wt(wi);
                if (pass == ConvPass::kDgrad) want[xi] += dy(yi) * wt(wi);
                if (pass == ConvPass::kWgrad) want[wi] += dy(yi) * x(xi);
              }
          }
  return want;
}

// The channels whose batch statistics, totalled from `moments` (blocks of
// block_rows rows, norm/column_moments.h), are off from those of `out`
// (rows x channels of `type`, as stored), the first three printed; all of
// them if the total's launch fails.
inline int64_t statistics_off(const unsigned char* out, mpgemm::kernels::ElementType type, int64_t rows,
                              int64_t channels, const std::vector<float>& moments, int64_t block_rows) {
  std::vector<float> mean_var(2 * channels, NAN);
  std::vector<double> totals(
      mpgemm::kernels::column_moments_total_workspace_bytes(rows, channels, block_rows) / sizeof(double), NAN);
  if (mpgemm::kernels::launch_column_moments_total(rows, channels, block_rows, moments.data(), totals.data(),
                                                   mean_var.data(), nullptr) != cudaSuccess)
    return channels;
  int64_t off = 0;
  for (int64_t c = 0; c < channels; ++c) {
    double sum = 0, squares = 0;
    for (int64_t r = 0; r < rows; ++r) sum += get(out, type, r * channels + c);
    const double mean = sum / double(rows);
    for (int64_t r = 0; r < rows; ++r) {
      const double d = get(out, type, r * channels + c) - mean;
      squares += d * d;
    }
    const double var = squares / double(rows), tolerance = 1e-5 * (std::fabs(mean) + std::sqrt(var) + 1.0);
    const bool mean_off = !(std::fabs(mean_var[c] - mean) <= tolerance);
    const bool var_off = !(std::fabs(mean_var[channels + c] - var) <= tolerance * (std::sqrt(var) + 1.0));
    if ((mean_off || var_off) && off++ < 3)
      printf("  batch mean[%ld] = %g, want %g; batch variance = %g, want %g\n", long(c), mean_var[c], mean,
             mean_var[channels + c], var);
  }
  return off;
}

}  // namespace sim
