// Convolution on Tensor Cores as implicit GEMMs (fprop, dgrad, wgrad), fp16
// or bf16 in (Element: x, the filters and dy alike), fp32 accumulate, the
// output in fp32, fp16 or bf16.
//
// Each pass is a GEMM whose operands are the convolution's tensors read in
// place: the patches of x (or of dy) are gathered chunk by chunk while the
// block's tiles are staged into shared memory, so no im2col buffer exists in
// global memory. Channels are innermost (NHWC, KRSC), so a chunk of 8
// consecutive GEMM-K (or N) indices is 8 consecutive channels of one pixel and
// one tap: a 16-byte load when channels per group are a multiple of 8, one
// element at a time otherwise (C = 3 first layers, depthwise).
//
// grid   - one block per kBlockM x kBlockN tile of the pass's GEMM, times
//          work.split_k; grid.y strides over the groups, each an independent
//          GEMM.
// block  - WmmaBlock (wmma_block.cuh) with the gathers below as loaders.
// split-K - wgrad only, whose GEMM-K (every output pixel) dwarfs its M x N
//          (the filters): each split sums a range of whole K slices and
//          writes its fp32 partial tile to work.partials[split] (K x R*S*C/g,
//          groups stacked as in dw); splitk_reduce.cu sums them in order.
#pragma once

#include <cstdint>

#include "conv_params.h"
#include "element_traits.cuh"
#include "operand_loaders.cuh"
#include "tile_scheduler.cuh"
#include "wmma_block.cuh"

namespace mpgemm::kernels {

// 32-bit geometry of one group of a convolution: index arithmetic in the
// gathers stays 32-bit (the launcher refuses larger problems).
struct ConvGeometry {
  int n, h, w, c, k, r, s, p, q, cg, kg;
  int stride_h, stride_w, pad_top, pad_left, dilation_h, dilation_w;

  __host__ __device__ explicit ConvGeometry(const Conv2dParams& a)
      : n(int(a.n)), h(int(a.h)), w(int(a.w)), c(int(a.c)), k(int(a.k)), r(int(a.r)), s(int(a.s)), p(int(a.p)),
        q(int(a.q)), cg(int(a.c / a.groups)), kg(int(a.k / a.groups)), stride_h(a.stride_h), stride_w(a.stride_w),
        pad_top(a.pad_top), pad_left(a.pad_left), dilation_h(a.dilation_h), dilation_w(a.dilation_w) {}
};

// The input patches: row (n, p, q) of the output by column (r, s, c) of the
// filter window is x at (n, p*stride - pad + r*dilation, ..., c), zero in the
// padding. fprop's A, and wgrad's B (rows are then GEMM-K).
template <class Element>
struct InputPatches {
  ConvGeometry g;
  const Element* x;  // at this group's first channel

  __device__ const Element* address(int64_t pixel, int64_t tap) const {
    if (pixel >= int64_t(g.n) * g.p * g.q || tap >= int64_t(g.r) * g.s * g.cg) return nullptr;
    const int m = int(pixel), t = int(tap);
    const int q = m % g.q, p = (m / g.q) % g.p, n = m / (g.q * g.p);
    const int c = t % g.cg, s = (t / g.cg) % g.s, r = t / (g.cg * g.s);
    const int ih = p * g.stride_h - g.pad_top + r * g.dilation_h;
    const int iw = q * g.stride_w - g.pad_left + s * g.dilation_w;
    if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) return nullptr;
    return x + ((int64_t(n) * g.h + ih) * g.w + iw) * g.c + c;
  }
};

// dgrad A: row m = (n, h, w) of dx, column kk = (r, s, k): the dy element that
// tap (r, s) of filter k carried from input pixel (h, w), if any.
template <class Element>
struct DgradPatches {
  ConvGeometry g;
  const Element* dy;  // at this group's first output channel

  __device__ const Element* address(int64_t m, int64_t kk) const {
    if (m >= int64_t(g.n) * g.h * g.w || kk >= int64_t(g.r) * g.s * g.kg) return nullptr;
    const int mi = int(m), ki = int(kk);
    const int iw = mi % g.w, ih = (mi / g.w) % g.h, n = mi / (g.w * g.h);
    const int k = ki % g.kg, s = (ki / g.kg) % g.s, r = ki / (g.kg * g.s);
    const int ph = ih + g.pad_top - r * g.dilation_h, pw = iw + g.pad_left - s * g.dilation_w;
    if (ph < 0 || pw < 0 || ph % g.stride_h || pw % g.stride_w) return nullptr;
    const int p = ph / g.stride_h, q = pw / g.stride_w;
    if (p >= g.p || q >= g.q) return nullptr;
    return dy + ((int64_t(n) * g.p + p) * g.q + q) * g.k + k;
  }
};

// dgrad B: row kk = (r, s, k), column c: w[k, r, s, c] of this group.
template <class Element>
struct DgradFilters {
  ConvGeometry g;
  const Element* w;  // at this group's first filter

  __device__ const Element* address(int64_t kk, int64_t c) const {
    if (kk >= int64_t(g.r) * g.s * g.kg || c >= g.cg) return nullptr;
    const int ki = int(kk);
    const int k = ki % g.kg, s = (ki / g.kg) % g.s, r = ki / (g.kg * g.s);
    return w + ((int64_t(k) * g.r + r) * g.s + s) * g.cg + c;
  }
};

// The shape of each pass's GEMM and how its operands are stored.
template <ConvPass Pass>
struct ConvPassTraits;

template <>
struct ConvPassTraits<ConvPass::kFprop> {
  static constexpr bool kARowMajor = true, kBRowMajor = false;  // B[kk, k] = w[k, kk]: filters, K inner
  MPGEMM_HOST_DEVICE static int64_t m(const Conv2dParams& a) { return a.n * a.p * a.q; }
  MPGEMM_HOST_DEVICE static int64_t n(const Conv2dParams& a) { return a.k / a.groups; }
  MPGEMM_HOST_DEVICE static int64_t k(const Conv2dParams& a) { return a.r * a.s * (a.c / a.groups); }
};

template <>
struct ConvPassTraits<ConvPass::kDgrad> {
  static constexpr bool kARowMajor = true, kBRowMajor = true;
  MPGEMM_HOST_DEVICE static int64_t m(const Conv2dParams& a) { return a.n * a.h * a.w; }
  MPGEMM_HOST_DEVICE static int64_t n(const Conv2dParams& a) { return a.c / a.groups; }
  MPGEMM_HOST_DEVICE static int64_t k(const Conv2dParams& a) { return a.r * a.s * (a.k / a.groups); }
};

template <>
struct ConvPassTraits<ConvPass::kWgrad> {
  static constexpr bool kARowMajor = false, kBRowMajor = true;  // A[k, kk] = dy[kk, k]: dy transposed
  MPGEMM_HOST_DEVICE static int64_t m(const Conv2dParams& a) { return a.k / a.groups; }
  MPGEMM_HOST_DEVICE static int64_t n(const Conv2dParams& a) { return a.r * a.s * (a.c / a.groups); }
  MPGEMM_HOST_DEVICE static int64_t k(const Conv2dParams& a) { return a.n * a.p * a.q; }
};

template <class Element, class Config, ConvPass Pass, int Vector>
__global__ void __launch_bounds__(Config::kThreads, Config::kMinBlocksPerSM)
    conv2d_kernel(Conv2dParams a, GemmGrid work) {
  if constexpr (kWmmaCompiled<Element>) {
    using Traits = ConvPassTraits<Pass>;
    using Block = WmmaBlock<Element, Config, Traits::kARowMajor, Traits::kBRowMajor>;
    using TileA = typename Block::TileA;
    using TileB = typename Block::TileB;
    extern __shared__ __align__(128) unsigned char smem[];

    const ConvGeometry g(a);
    // The output side of this pass's GEMM, for the epilogue.
    GemmParams out;
    out.m = Traits::m(a);
    out.n = Traits::n(a);
    out.k = Traits::k(a);
    out.d_type = a.out_type;
    out.bias_type = a.bias_type;
    out.d_row_stride = Pass == ConvPass::kFprop ? a.k : Pass == ConvPass::kDgrad ? a.c : out.n;

    const int64_t tiles = TileScheduler<Config>::tiles(out.m, out.n);
    const int split = int(blockIdx.x / tiles);
    const TileOrigin tile = TileScheduler<Config>::origin_of(blockIdx.x - split * tiles, out.m, out.n, 1);
    const KRange range = split_k_range<Config::kBlockK>(out.k, split, work.split_k);
    const Block block(tile.m0, tile.n0);
    for (int64_t group = blockIdx.y; group < a.groups; group += gridDim.y) {
      const int64_t ci = group * g.cg, ko = group * g.kg;  // first input / output channel of the group
      const Element* x = static_cast<const Element*>(a.x);
      const Element* wt = static_cast<const Element*>(a.wt);
      const Element* dy = static_cast<const Element*>(a.dy);
      Element* stages = reinterpret_cast<Element*>(smem);
      typename Block::Accumulators acc;
      Block::clear(acc);
      if constexpr (Pass == ConvPass::kFprop) {
        GatherLoader<TileA, Config::kBlockK, Config::kThreads, Vector, InputPatches<Element>> la({g, x + ci},
                                                                                                 block.m0, out.k);
        const int cols_left = out.n - block.n0 < Config::kBlockN ? int(out.n - block.n0) : Config::kBlockN;
        MatrixLoader<TileB, Config::kBlockK, Config::kThreads, Vector> lb(wt + (ko + block.n0) * out.k, out.k, 1,
                                                                          cols_left, out.k);
        block.template mainloop<Vector>(acc, la, lb, Block::slices(out.k), stages);
      } else if constexpr (Pass == ConvPass::kDgrad) {
        GatherLoader<TileA, Config::kBlockK, Config::kThreads, Vector, DgradPatches<Element>> la({g, dy + ko},
                                                                                                 block.m0, out.k);
        const Element* filters = wt + ko * int64_t(g.r) * g.s * g.cg;
        GatherLoader<TileB, Config::kBlockK, Config::kThreads, Vector, DgradFilters<Element>> lb({g, filters},
                                                                                                 block.n0, out.k);
        block.template mainloop<Vector>(acc, la, lb, Block::slices(out.k), stages);
      } else {
        const int rows_left = out.m - block.m0 < Config::kBlockM ? int(out.m - block.m0) : Config::kBlockM;
        MatrixLoader<TileA, Config::kBlockK, Config::kThreads, Vector> la(dy + ko + block.m0 + range.begin * a.k,
                                                                          a.k, a.k, rows_left, range.extent);
        GatherLoader<TileB, Config::kBlockK, Config::kThreads, Vector, InputPatches<Element>> lb(
            {g, x + ci}, block.n0, range.extent, range.begin);
        block.template mainloop<Vector>(acc, la, lb, Block::slices(range.extent), stages);
      }
      // This group's slice of the output: its columns (fprop, dgrad) or rows (wgrad).
      const int64_t out_offset = Pass == ConvPass::kFprop ? ko : Pass == ConvPass::kDgrad ? ci : ko * out.n;
      if (work.split_k > 1) {
        out.d = work.partials + (split * a.k * out.n + out_offset);
        out.d_type = ElementType::kFloat32;
      } else {
        out.d = static_cast<char*>(a.out) + out_offset * element_bytes(a.out_type);
      }
      out.bias = a.bias == nullptr ? nullptr : static_cast<const char*>(a.bias) + ko * element_bytes(a.bias_type);
      block.epilogue(out, acc, smem, 0);
    }
  }
}

}  // namespace mpgemm::kernels
