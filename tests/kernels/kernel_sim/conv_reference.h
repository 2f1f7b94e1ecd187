// The convolution reference the simulation's drivers share (conv_cases.cpp,
// hopper_conv_cases.cpp): it scatters every product of the convolution into
// the pass's output, so it shares no indexing with the kernels' gathers.
#pragma once

#include <cstdint>
#include <vector>

#include "conv/params.h"

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

}  // namespace sim
