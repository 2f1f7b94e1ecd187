// The implicit GEMMs of a convolution as the kernels walk them, worked out on
// the host once per launch (conv/launch.cu), so that the kernels' mainloops
// step by constants and never divide:
//   - which pixel each GEMM row of the patch operand is, and where it reads;
//   - how GEMM-K steps: fprop through (r, s, c) with c innermost, dgrad one
//     filter tap and a block of output channels per K slice, wgrad through
//     output pixels (q, p, n);
//   - dgrad with stride: one GEMM per phase (pixel row mod stride_h, column
//     mod stride_w), which runs only the taps that reach the phase's pixels.
// Element offsets are 32-bit: the launcher refuses larger tensors.
#pragma once

#include <cstdint>

#include "common/epilogue_math.h"
#include "common/math.h"
#include "conv/params.h"

namespace mpgemm::kernels {

// Offsets of chunks that are never read (zero-filled) may leave int's range:
// they wrap instead of overflowing.
MPGEMM_HOST_DEVICE int wrap_add(int a, int b) { return int(unsigned(a) + unsigned(b)); }

// A position in a mixed-radix count (lo < lo_radix, mid < mid_radix, hi
// unbounded) with the element offset that moves along with it.
struct RadixPoint {
  int lo, mid, hi, offset;
};

struct Radix {
  int lo_radix = 1, mid_radix = 1;
  int lo_weight = 0, mid_weight = 0, hi_weight = 0;  // elements per unit of each digit

  // By division: for constructors and the first step, not for mainloops.
  MPGEMM_HOST_DEVICE RadixPoint at(int value) const {
    const int lo = value % lo_radix, rest = value / lo_radix;
    const int mid = rest % mid_radix, hi = rest / mid_radix;
    return {lo, mid, hi, wrap_add(wrap_add(lo * lo_weight, mid * mid_weight), hi * hi_weight)};
  }
};

// A constant step written in the radix: lo < lo_radix and mid < mid_radix, so
// adding it carries out of each digit at most once.
struct RadixStep {
  int lo = 0, mid = 0, hi = 0, offset = 0;
  int lo_carry = 0, mid_carry = 0;  // what a carry out of lo (mid) adds to the offset

  MPGEMM_HOST_DEVICE static RadixStep of(const Radix& radix, int step) {
    const RadixPoint d = radix.at(step);
    return {d.lo, d.mid, d.hi, d.offset, radix.mid_weight - radix.lo_radix * radix.lo_weight,
            radix.hi_weight - radix.mid_radix * radix.mid_weight};
  }

  MPGEMM_HOST_DEVICE void apply(RadixPoint& at, const Radix& radix) const {
    at.lo += lo, at.mid += mid, at.hi += hi, at.offset = wrap_add(at.offset, offset);
    if (at.lo >= radix.lo_radix) at.lo -= radix.lo_radix, ++at.mid, at.offset = wrap_add(at.offset, lo_carry);
    if (at.mid >= radix.mid_radix) at.mid -= radix.mid_radix, ++at.hi, at.offset = wrap_add(at.offset, mid_carry);
  }
};

// wgrad's gather at one filter tap: an output pixel's source pixel (h, w) in
// x and its element offset. h = p * stride_h + (the tap's row), and so for w,
// so the bounds checks read h and w as they are.
struct SourcePixel {
  int h, w, offset;
};

// A constant step of output pixels (q innermost, then p, then the image) as
// it moves a SourcePixel. The pixel's p reaches P where its h reaches h_end,
// P * stride_h past the tap's row (for q and w alike), so carries compare h
// and w with the thread's own ends; the step is under one row of pixels
// (image), so each carries at most once.
struct SourceStep {
  int h = 0, w = 0, offset = 0;  // the step's (p, q) in source rows and columns, and its offset
  int h_wrap = 0, w_wrap = 0;    // P * stride_h and Q * stride_w: what a carry takes back
  int w_carry_h = 0;             // what a carry out of q adds to h: stride_h
  int w_carry_offset = 0, h_carry_offset = 0;

  MPGEMM_HOST_DEVICE void apply(SourcePixel& at, int h_end, int w_end) const {
    at.h += h, at.w += w, at.offset = wrap_add(at.offset, offset);
    if (at.w >= w_end) at.w -= w_wrap, at.h += w_carry_h, at.offset = wrap_add(at.offset, w_carry_offset);
    if (at.h >= h_end) at.h -= h_wrap, at.offset = wrap_add(at.offset, h_carry_offset);
  }
};

// One implicit GEMM of a convolution, per group: fprop, wgrad, or one phase of
// dgrad (M, N and K: the builders below).
struct ConvGemm {
  int64_t m = 0, n = 0, k = 0;

  // The pixel grid of the patch rows: image x rows x cols. Pixel (image, a, b)
  // reads the source image at (a * stride_h + origin_h, b * stride_w +
  // origin_w) at its first tap, and each later filter row (column) of taps
  // moves that by tap_h (tap_w). The source is src_h x src_w pixels of
  // src_channels channels: x for fprop and wgrad, dy for dgrad.
  int rows = 0, cols = 0;
  int stride_h = 1, stride_w = 1, origin_h = 0, origin_w = 0, tap_h = 0, tap_w = 0;
  int src_h = 0, src_w = 0, src_channels = 0;

  // fprop's GEMM-K and wgrad's GEMM-N: (c, s, r) of the filter window,
  // offsets into the source; k_step is fprop's K slice in that radix.
  Radix window;
  RadixStep k_step;

  // dgrad: K slice i is tap (i / taps_s % taps_r, i % taps_s) of the phase and
  // output channels [kBlockK * (i / taps), + kBlockK) of the group's
  // `channels`. Phase tap (i, j) is filter tap (filter_r0 + i * filter_dr,
  // filter_s0 + j * filter_ds) of the R x S window; GEMM row (image, a, b)
  // is dx's pixel (image, out_h0 + a * out_stride_h, out_w0 + b * out_stride_w).
  int taps_r = 0, taps_s = 0, channels = 0;
  int filter_r0 = 0, filter_s0 = 0, filter_dr = 0, filter_ds = 0;
  int filter_s = 0, filter_channels = 0, filter_stride = 0;  // S, C/groups, and R*S*C/groups between filters
  int out_h0 = 0, out_w0 = 0, out_stride_h = 1, out_stride_w = 1, out_h = 0, out_w = 0;

  // wgrad's GEMM-K: output pixels (q, p, image) with offsets into x, and the
  // K slice as it moves their source pixels.
  Radix pixels;
  SourceStep pixel_step;
};

namespace conv_geometry {

inline int floor_mod(int a, int b) { return (a % b + b) % b; }
inline int gcd(int a, int b) { return b == 0 ? a : gcd(b, a % b); }

// The patch rows of fprop and wgrad: output pixels reading x.
inline ConvGemm output_pixels_over_x(const Conv2dParams& p) {
  ConvGemm g;
  g.rows = int(p.p), g.cols = int(p.q);
  g.stride_h = p.stride_h, g.stride_w = p.stride_w, g.origin_h = -p.pad_top, g.origin_w = -p.pad_left;
  g.tap_h = p.dilation_h, g.tap_w = p.dilation_w;
  g.src_h = int(p.h), g.src_w = int(p.w), g.src_channels = int(p.c);
  g.window = {int(p.c / p.groups), int(p.s), 1, p.dilation_w * int(p.c), p.dilation_h * int(p.w * p.c)};
  return g;
}

// Taps r in [0, taps) whose offset (at - r * dilation) is a multiple of
// stride: the first, the step between them, how many, and (at - first *
// dilation) / stride.
struct PhaseTaps {
  int first = 0, step = 1, count = 0, origin = 0;
};
inline PhaseTaps phase_taps(int at, int taps, int stride, int dilation) {
  PhaseTaps t;
  t.step = stride / gcd(stride, dilation);
  while (t.first < t.step && floor_mod(at - t.first * dilation, stride) != 0) ++t.first;
  if (t.first >= t.step || t.first >= taps) return {};
  t.count = (taps - 1 - t.first) / t.step + 1;
  t.origin = (at - t.first * dilation) / stride;  // exact
  return t;
}

}  // namespace conv_geometry

// fprop: M = N*P*Q output pixels, N = K/groups filters, K = R*S*C/groups.
inline ConvGemm fprop_gemm(const Conv2dParams& p, int block_k) {
  ConvGemm g = conv_geometry::output_pixels_over_x(p);
  g.m = p.n * p.p * p.q, g.n = p.k / p.groups, g.k = p.r * p.s * (p.c / p.groups);
  g.k_step = RadixStep::of(g.window, block_k);
  return g;
}

// wgrad: M = K/groups filters, N = R*S*C/groups, K = N*P*Q output pixels.
inline ConvGemm wgrad_gemm(const Conv2dParams& p, int block_k) {
  ConvGemm g = conv_geometry::output_pixels_over_x(p);
  g.m = p.k / p.groups, g.n = p.r * p.s * (p.c / p.groups), g.k = p.n * p.p * p.q;
  g.pixels = {int(p.q), int(p.p), p.stride_w * int(p.c), p.stride_h * int(p.w * p.c), int(p.h * p.w * p.c)};
  const RadixStep step = RadixStep::of(g.pixels, block_k);
  g.pixel_step = {step.mid * p.stride_h, step.lo * p.stride_w, step.offset, int(p.p) * p.stride_h,
                  int(p.q) * p.stride_w, p.stride_h, step.lo_carry, step.mid_carry};
  return g;
}

// dgrad's phases: dx pixels (h, w) with h % stride_h == phase_h and w %
// stride_w == phase_w, 0 <= phase_h < min(stride_h, H) (and so for w).
// Pixel h takes dy row p = (h + pad_top - r * dilation_h) / stride_h from
// filter row r when that divides; within a phase that is the same set of r
// for every pixel, and p = a + (phase_h + pad_top - r * dilation_h) /
// stride_h for h = phase_h + a * stride_h: a stride-1 gather over those taps.
// A phase no tap reaches is a GEMM with K = 0, whose output is zeros.
inline ConvGemm dgrad_phase_gemm(const Conv2dParams& p, int phase_h, int phase_w) {
  using namespace conv_geometry;
  const PhaseTaps r = phase_taps(phase_h + p.pad_top, int(p.r), p.stride_h, p.dilation_h);
  const PhaseTaps s = phase_taps(phase_w + p.pad_left, int(p.s), p.stride_w, p.dilation_w);
  ConvGemm g;
  g.rows = int(ceil_div(p.h - phase_h, p.stride_h)), g.cols = int(ceil_div(p.w - phase_w, p.stride_w));
  g.origin_h = r.origin, g.origin_w = s.origin;
  g.tap_h = -(r.step * p.dilation_h / p.stride_h), g.tap_w = -(s.step * p.dilation_w / p.stride_w);
  g.src_h = int(p.p), g.src_w = int(p.q), g.src_channels = int(p.k);
  g.taps_r = r.count, g.taps_s = s.count, g.channels = int(p.k / p.groups);
  g.filter_r0 = r.first, g.filter_s0 = s.first, g.filter_dr = r.step, g.filter_ds = s.step;
  g.filter_s = int(p.s), g.filter_channels = int(p.c / p.groups), g.filter_stride = int(p.r * p.s * (p.c / p.groups));
  g.out_h0 = phase_h, g.out_w0 = phase_w, g.out_stride_h = p.stride_h, g.out_stride_w = p.stride_w;
  g.out_h = int(p.h), g.out_w = int(p.w);
  g.m = p.n * g.rows * g.cols, g.n = p.c / p.groups, g.k = int64_t(g.taps_r) * g.taps_s * g.channels;
  return g;
}

inline int dgrad_phases_h(const Conv2dParams& p) { return int(p.stride_h < p.h ? p.stride_h : p.h); }
inline int dgrad_phases_w(const Conv2dParams& p) { return int(p.stride_w < p.w ? p.stride_w : p.w); }

}  // namespace mpgemm::kernels
