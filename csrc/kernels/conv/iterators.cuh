// The convolution's gathered operands, as loaders of WmmaBlock's protocol
// (wmma/operand_loaders.cuh): the patches of x (fprop's A, wgrad's B) or of dy
// (dgrad's A), and dgrad's filters (its B). fprop's filters and wgrad's dy
// are plain matrices (MatrixLoader).
//
// As in CUTLASS's optimized conv iterators, each thread works out its pixels
// once per block (one division each, in the constructor); every K slice after
// the first then moves them by constants (ConvGemm, conv/geometry.h): a
// pointer offset, two coordinates per row checked against the image in two
// unsigned compares, and no division or modulo in the mainloop.
#pragma once

#include <cstdint>

#include "arch/cp_async.cuh"
#include "conv/geometry.h"
#include "wmma/operand_loaders.cuh"
#include "wmma/smem_tile.cuh"

namespace mpgemm::kernels {

// A coordinate no shift brings back into an image: marks rows outside the
// GEMM, and columns of GEMM-K past the slice's end.
constexpr int kOffImage = -(1 << 29);

MPGEMM_HOST_DEVICE bool inside(int coordinate, int extent) { return unsigned(coordinate) < unsigned(extent); }

// The copies of a gathering loader (Loader: CRTP) whose chunk i lies at
// address(i) and is read if valid(i), zero-filled otherwise.
template <class Loader, class Tile, int kThreads, int Vector>
struct GatheredChunks {
  using Element = typename Tile::Element;
  using Copy = TileCopy<typename Tile::Shape, kThreads, Vector>;
  typename Copy::Chunk regs[Copy::kPerThread];

  __device__ const Loader& loader() const { return static_cast<const Loader&>(*this); }
  __device__ void copy_async(Element* tile) const {
    Element* to = tile + Copy::smem_offset();
#pragma unroll
    for (int i = 0; i < Copy::kPerThread; ++i)
      cp_async<sizeof(typename Copy::Chunk)>(to + i * Copy::kSmemStep, loader().address(i), loader().valid(i));
  }
  __device__ void load() {
#pragma unroll
    for (int i = 0; i < Copy::kPerThread; ++i)
      regs[i] = loader().valid(i) ? *reinterpret_cast<const typename Copy::Chunk*>(loader().address(i))
                                  : typename Copy::Chunk{};
  }
  __device__ void store(Element* tile) const { Copy::store(tile, regs); }
};

// fprop's GEMM-K as one thread walks it: its column of the slice is channel
// c of filter tap (r, s), stepped through (c, s, r) by ConvGemm::k_step. The
// partial slice comes first (KPartition), so only slice 0 checks K's end.
template <int kBlockK>
struct WindowWalk {
  const ConvGemm& g;
  int column;  // this thread's column of a K slice
  int first_extent;
  RadixPoint at;
  int h_shift, w_shift;  // source coordinates of tap (r, s) from tap (0, 0)

  __device__ WindowWalk(const ConvGemm& g, int column, int64_t k)
      : g(g), column(column), first_extent(KPartition<kBlockK>::first_extent(k)), at(g.window.at(column)) {
    update(column < first_extent);
  }
  __device__ void update(bool in_k) {
    h_shift = in_k ? at.hi * g.tap_h : kOffImage;
    w_shift = at.mid * g.tap_w;
  }
  __device__ int offset() const { return at.offset; }
  __device__ void advance_past_first() {
    at = g.window.at(column + first_extent);
    update(true);
  }
  __device__ void advance() {
    g.k_step.apply(at, g.window);
    update(true);
  }
};

// dgrad's GEMM-K, the same for every thread of the block: slice after slice,
// the phase's taps (filter columns innermost), then the next block of
// kBlockK output channels.
template <int kBlockK>
struct PhaseTapWalk {
  const ConvGemm& g;
  int tap_r = 0, tap_s = 0, channel0 = 0;

  __device__ explicit PhaseTapWalk(const ConvGemm& g) : g(g) {}
  __device__ static int slices(const ConvGemm& g) {
    return g.taps_r * g.taps_s * ((g.channels + kBlockK - 1) / kBlockK);
  }
  __device__ void advance() {
    if (++tap_s < g.taps_s) return;
    tap_s = 0;
    if (++tap_r < g.taps_r) return;
    tap_r = 0;
    channel0 += kBlockK;
  }
  // Where the current tap's filters start in a group's (K, R, S, C/groups) filters.
  __device__ int filter_offset() const {
    const int r = g.filter_r0 + tap_r * g.filter_dr, s = g.filter_s0 + tap_s * g.filter_ds;
    return (r * g.filter_s + s) * g.filter_channels;
  }
};

// dgrad's A as PatchLoader walks it: this thread's column of the slice is
// output channel channel0 + column of the tap.
template <int kBlockK>
struct PhaseTapPatchWalk {
  PhaseTapWalk<kBlockK> taps;
  int column;
  int h_shift, w_shift, offset_;

  __device__ PhaseTapPatchWalk(const ConvGemm& g, int column, int64_t) : taps(g), column(column) { update(); }
  __device__ void update() {
    const ConvGemm& g = taps.g;
    const int dh = taps.tap_r * g.tap_h, dw = taps.tap_s * g.tap_w;
    h_shift = taps.channel0 + column < g.channels ? dh : kOffImage;
    w_shift = dw;
    offset_ = (dh * g.src_w + dw) * g.src_channels + taps.channel0 + column;
  }
  __device__ int offset() const { return offset_; }
  __device__ void advance_past_first() { advance(); }
  __device__ void advance() {
    taps.advance();
    update();
  }
};

// The patch operand with K inner (fprop's and dgrad's A): each row is a pixel
// (ConvGemm's grid), each column a (tap, channel) that Walk steps, and whose
// offset into the source it gives (offset()). A chunk is
// Vector channels of one pixel and one tap: read if the tap's source pixel
// lies in the image, else zero (padding, or a tap that skips the pixel).
template <class Tile, int kBlockK, int kThreads, int Vector, class Walk>
struct PatchLoader : GatheredChunks<PatchLoader<Tile, kBlockK, kThreads, Vector, Walk>, Tile, kThreads, Vector> {
  using Element = typename Tile::Element;
  using Copy = TileCopy<typename Tile::Shape, kThreads, Vector>;
  static_assert(Tile::kKMajor, "patch rows are GEMM rows, K their columns");

  const Element* src;  // the source at the group's first channel
  int src_h, src_w;
  int row_offset[Copy::kPerThread];  // of each row's pixel at tap (0, 0)
  int row_h[Copy::kPerThread], row_w[Copy::kPerThread];
  Walk walk;

  // `source` is the group's first channel; GEMM-K runs over [0, k).
  __device__ PatchLoader(const ConvGemm& g, const Element* source, int64_t m0, int64_t k)
      : src(source), src_h(g.src_h), src_w(g.src_w), walk(g, Copy::first().inner, k) {
#pragma unroll
    for (int i = 0; i < Copy::kPerThread; ++i) {
      const int64_t m = m0 + Copy::outer(i);
      if (m < g.m) {
        const int row = int(m), b = row % g.cols, a = row / g.cols % g.rows, image = row / g.cols / g.rows;
        row_h[i] = a * g.stride_h + g.origin_h;
        row_w[i] = b * g.stride_w + g.origin_w;
        // Past the source's ends where every tap misses it: wraps, never read.
        row_offset[i] = int(((int64_t(image) * g.src_h + row_h[i]) * g.src_w + row_w[i]) * g.src_channels);
      } else {
        row_h[i] = kOffImage, row_w[i] = 0, row_offset[i] = 0;
      }
    }
  }

  __device__ bool valid(int i) const {
    return inside(row_h[i] + walk.h_shift, src_h) && inside(row_w[i] + walk.w_shift, src_w);
  }
  __device__ const Element* address(int i) const { return src + wrap_add(row_offset[i], walk.offset()); }

  __device__ void advance_past_first() { walk.advance_past_first(); }
  __device__ void advance() { walk.advance(); }
};

// dgrad's B: row kk of a slice is output channel channel0 + kk of the current
// tap, column c an input channel: w[k, r, s, c], filters R*S*C/groups apart.
template <class Tile, int kBlockK, int kThreads, int Vector>
struct PhaseFilterLoader {
  using Element = typename Tile::Element;
  using Copy = TileCopy<typename Tile::Shape, kThreads, Vector>;
  static_assert(!Tile::kKMajor, "filter rows are GEMM-K");

  const Element* ptr;  // this thread's chunk 0 at offset 0
  int filter_stride;
  bool column_in;
  // A's walk (PatchLoader's, which the mainloops advance first): one set of
  // counters for both operands.
  const PhaseTapWalk<kBlockK>& taps;
  int valid, offset;  // chunks i < valid are read, `offset` past ptr
  typename Copy::Chunk regs[Copy::kPerThread];

  // `filters`: the group's first filter; columns past `cols_left` read zeros.
  __device__ PhaseFilterLoader(const PhaseTapWalk<kBlockK>& taps, const Element* filters, int64_t n0,
                               int cols_left)
      : ptr(filters + int64_t(Copy::first().outer) * taps.g.filter_stride + n0 + Copy::first().inner),
        filter_stride(taps.g.filter_stride),
        column_in(Copy::first().inner < cols_left),
        taps(taps) {
    update();
  }

  __device__ void update() {
    const int left = taps.g.channels - taps.channel0 - Copy::first().outer;
    const int rows = left <= 0 ? 0 : (left + Copy::kOuterStep - 1) / Copy::kOuterStep;
    valid = !column_in ? 0 : rows < Copy::kPerThread ? rows : Copy::kPerThread;
    offset = taps.filter_offset() + taps.channel0 * filter_stride;
  }
  __device__ void copy_async(Element* tile) const {
    Element* to = tile + Copy::smem_offset();
    const Element* from = ptr + offset;
#pragma unroll
    for (int i = 0; i < Copy::kPerThread; ++i, from += Copy::kOuterStep * filter_stride)
      cp_async<sizeof(typename Copy::Chunk)>(to + i * Copy::kSmemStep, from, i < valid);
  }
  __device__ void load() {
    const Element* from = ptr + offset;
#pragma unroll
    for (int i = 0; i < Copy::kPerThread; ++i, from += Copy::kOuterStep * filter_stride)
      regs[i] = i < valid ? *reinterpret_cast<const typename Copy::Chunk*>(from) : typename Copy::Chunk{};
  }
  __device__ void store(Element* tile) const { Copy::store(tile, regs); }
  __device__ void advance_past_first() { update(); }
  __device__ void advance() { update(); }
};

// wgrad's B, x's patches with K outer: row j of the GEMM is output pixel
// (image, p, q), column (r, s, c) of the filter window. A thread keeps one
// column, so its tap is fixed; each of its rows holds its pixel's source
// pixel at that tap (SourcePixel), which every K slice moves by
// ConvGemm::pixel_step: the bounds checks are two compares, the address one
// offset from x. GEMM-K runs over [begin, begin + extent), the partial slice
// first (KPartition): only slice 0 checks K's end.
template <class Tile, int kBlockK, int kThreads, int Vector>
struct PixelRowLoader : GatheredChunks<PixelRowLoader<Tile, kBlockK, kThreads, Vector>, Tile, kThreads, Vector> {
  using Element = typename Tile::Element;
  using Copy = TileCopy<typename Tile::Shape, kThreads, Vector>;
  static_assert(!Tile::kKMajor, "pixel rows are GEMM-K");

  const ConvGemm& g;
  const Element* x;
  int column_h, column_w;  // source pixel of output pixel (0, 0) at this column's tap
  int column_offset;       // and its offset in x, at the column's channel; column_h is kOffImage past N
  int h_end, w_end;        // where a row's h (w) carries: its p (q) has reached P (Q)
  int first_row;           // this thread's chunk 0's row of the current slice, in GEMM-K
  int first_extent;
  SourcePixel pixel[Copy::kPerThread];

  // The group's first channel is x's `channel0`; columns past `cols_left` read zeros.
  __device__ PixelRowLoader(const ConvGemm& g, const Element* x, int channel0, int64_t n0, int cols_left,
                            int64_t begin, int64_t extent)
      : g(g), x(x), first_row(int(begin) + Copy::first().outer),
        first_extent(KPartition<kBlockK>::first_extent(extent)) {
    const int column = int(n0) + Copy::first().inner;
    const RadixPoint tap = g.window.at(column < g.n ? column : 0);
    column_h = tap.hi * g.tap_h + g.origin_h;
    column_w = tap.mid * g.tap_w + g.origin_w;
    // One offset from x itself: a pointer to the group would cost a 64-bit add per chunk.
    column_offset = (column_h * g.src_w + column_w) * g.src_channels + channel0 + tap.lo;
    if (Copy::first().inner >= cols_left) column_h = kOffImage;
    h_end = column_h + g.pixel_step.h_wrap;
    w_end = column_w + g.pixel_step.w_wrap;
    start(begin + first_extent);
  }
  // Rows from scratch: at first_row, valid up to `end`.
  __device__ void start(int64_t end) {
#pragma unroll
    for (int i = 0; i < Copy::kPerThread; ++i) {
      const int row = first_row + i * Copy::kOuterStep;
      const RadixPoint at = g.pixels.at(row);
      pixel[i] = {row < end ? at.mid * g.stride_h + column_h : kOffImage, at.lo * g.stride_w + column_w,
                  wrap_add(at.offset, column_offset)};
    }
  }

  __device__ bool valid(int i) const { return inside(pixel[i].h, g.src_h) && inside(pixel[i].w, g.src_w); }
  __device__ const Element* address(int i) const { return x + pixel[i].offset; }

  __device__ void advance_past_first() {
    first_row += first_extent;
    start(INT64_MAX);  // every later slice is whole
  }
  __device__ void advance() {
#pragma unroll
    for (int i = 0; i < Copy::kPerThread; ++i) g.pixel_step.apply(pixel[i], h_end, w_end);
  }
};

}  // namespace mpgemm::kernels
