// Convolution on Tensor Cores as implicit GEMMs (fprop, dgrad, wgrad), fp16
// or bf16 in (Element: x, the filters and dy alike), fp32 accumulate, the
// output in fp32, fp16 or bf16.
//
// Each pass is a GEMM whose operands are the convolution's tensors read in
// place: the patches of x (or of dy) are gathered chunk by chunk while the
// block's tiles are staged into shared memory, so no im2col buffer exists in
// global memory. Channels are innermost (NHWC, KRSC), so a chunk of Vector
// consecutive GEMM-K (or N) indices is Vector consecutive channels of one
// pixel and one tap: a 16-byte load when channels per group are a multiple of
// 8, an 8-byte one when they are a multiple of 4 (the launcher pads other
// channel counts with zeros to one of these). The gathers
// (conv/iterators.cuh) step through taps and pixels by constants that the
// launcher worked out (ConvGemm), with no division in the mainloop.
//
// grid   - one block per kBlockM x kBlockN tile of the pass's GEMM, times
//          work.split_k; grid.y strides over the groups, each an independent
//          GEMM. dgrad with a stride launches once per phase (conv/geometry.h).
// block  - WmmaBlock (wmma/block.cuh) with the gathers as loaders.
// split-K - wgrad only, whose GEMM-K (every output pixel) dwarfs its M x N
//          (the filters): each split sums a range of whole K slices and
//          writes its fp32 partial tile to work.partials[split] (K x R*S*C/g,
//          groups stacked as in dw); gemm/splitk_reduce.cu sums them in order.
// moments - fprop built WithMoments (for a training batch norm after it):
//          the epilogue also writes each tile's per-channel moments of y as
//          stored to a.moments (common/column_moments.cuh), so that batch
//          norm's statistics need no pass over y.
#pragma once

#include <cstdint>

#include "arch/smem.cuh"
#include "common/element_traits.cuh"
#include "common/tile_scheduler.cuh"
#include "conv/geometry.h"
#include "conv/iterators.cuh"
#include "conv/params.h"
#include "wmma/block.cuh"
#include "wmma/gemm_kernel.cuh"
#include "wmma/operand_loaders.cuh"

namespace mpgemm::kernels {

// How each pass's GEMM operands are stored (M, N and K: conv/geometry.h).
template <ConvPass Pass>
struct ConvPassTraits;

template <>
struct ConvPassTraits<ConvPass::kFprop> {
  static constexpr bool kAKMajor = true, kBKMajor = true;  // B[kk, k] = w[k, kk]: filters, K inner
};

template <>
struct ConvPassTraits<ConvPass::kDgrad> {
  static constexpr bool kAKMajor = true, kBKMajor = false;
};

template <>
struct ConvPassTraits<ConvPass::kWgrad> {
  static constexpr bool kAKMajor = false, kBKMajor = false;  // A[k, kk] = dy[kk, k]: dy transposed
};

// dgrad's output row (image, a, b) of a phase is dx's pixel (image, out_h0 +
// a * out_stride_h, out_w0 + b * out_stride_w).
struct PhaseRows {
  const ConvGemm& g;
  __device__ int64_t operator()(int64_t row) const {
    const int64_t b = row % g.cols, a = row / g.cols % g.rows, image = row / g.cols / g.rows;
    return (image * g.out_h + g.out_h0 + a * g.out_stride_h) * g.out_w + g.out_w0 + b * g.out_stride_w;
  }
};

// The body of both kernels below: one block's tiles of every group of the pass.
template <class Element, class Tile, ConvPass Pass, int Vector, bool WithMoments>
__device__ __forceinline__ void conv2d_block(const Conv2dParams& a, const ConvGemm& g, const GemmGrid& work) {
  static_assert(!WithMoments || Pass == ConvPass::kFprop, "moments are of fprop's output");
  if constexpr (kWmmaCompiled<Element> && kTileCompiled<Tile>) {
    using Block = WmmaBlock<Element, Tile, ConvPassTraits<Pass>::kAKMajor, ConvPassTraits<Pass>::kBKMajor>;
    using TileA = typename Block::TileA;
    using TileB = typename Block::TileB;
    constexpr int kBlockK = Tile::kBlockK, kThreads = Tile::kThreads;

    // The output side of this pass's GEMM, for the epilogue.
    GemmParams out;
    out.m = g.m;
    out.n = g.n;
    out.k = g.k;
    out.d_type = a.out_type;
    out.bias_type = a.bias_type;
    out.d_row_stride = Pass == ConvPass::kFprop ? a.k : Pass == ConvPass::kDgrad ? a.c : out.n;

    const int64_t tiles = TileScheduler<Tile>::tiles(out.m, out.n);
    const int split = int(blockIdx.x / tiles);
    const TileOrigin tile = TileScheduler<Tile>::origin_of(blockIdx.x - split * tiles, out.m, out.n, 1);
    const KRange range = split_k_range<kBlockK>(out.k, split, work.split_k);
    const Block block(tile.m0, tile.n0);
    const int rows_left = out.m - block.m0 < Tile::kBlockM ? int(out.m - block.m0) : Tile::kBlockM;
    const int cols_left = out.n - block.n0 < Tile::kBlockN ? int(out.n - block.n0) : Tile::kBlockN;
    const int64_t cg = a.c / a.groups, kg = a.k / a.groups;
    for (int64_t group = blockIdx.y; group < a.groups; group += gridDim.y) {
      const int64_t ci = group * cg, ko = group * kg;  // first input / output channel of the group
      const Element* x = static_cast<const Element*>(a.x);
      const Element* wt = static_cast<const Element*>(a.wt) + ko * a.r * a.s * cg;  // the group's filters
      const Element* dy = static_cast<const Element*>(a.dy);
      Element* stages = reinterpret_cast<Element*>(smem);
      typename Block::Accumulators acc;
      Block::clear(acc);
      if constexpr (Pass == ConvPass::kFprop) {
        PatchLoader<TileA, kBlockK, kThreads, Vector, WindowWalk<kBlockK>> la(g, x + ci, block.m0, out.k);
        MatrixLoader<TileB, kBlockK, kThreads, Vector> lb(wt + block.n0 * out.k, out.k, 1, cols_left, out.k);
        block.template mainloop<Vector>(acc, la, lb, Block::slices(out.k), stages);
      } else if constexpr (Pass == ConvPass::kDgrad) {
        PatchLoader<TileA, kBlockK, kThreads, Vector, PhaseTapPatchWalk<kBlockK>> la(g, dy + ko, block.m0, out.k);
        PhaseFilterLoader<TileB, kBlockK, kThreads, Vector> lb(la.walk.taps, wt, block.n0, cols_left);
        block.template mainloop<Vector>(acc, la, lb, PhaseTapWalk<kBlockK>::slices(g), stages);
      } else {
        MatrixLoader<TileA, kBlockK, kThreads, Vector> la(dy + ko + block.m0 + range.begin * a.k, a.k, a.k,
                                                          rows_left, range.extent);
        PixelRowLoader<TileB, kBlockK, kThreads, Vector> lb(g, x, int(ci), block.n0, cols_left, range.begin,
                                                            range.extent);
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
      if constexpr (Pass == ConvPass::kDgrad) {
        block.epilogue(out, acc, smem, 0, PhaseRows{g});
      } else if constexpr (WithMoments) {
        out.column_moments = a.moments + ko;
        block.template epilogue<true>(out, acc, smem, 0);
      } else {
        block.epilogue(out, acc, smem, 0);
      }
    }
  }
}

template <class Element, class Tile, ConvPass Pass, int Vector>
__global__ void __launch_bounds__(Tile::kThreads, Tile::kMinBlocksPerSM)
    conv2d_kernel(Conv2dParams a, const __grid_constant__ ConvGemm g, GemmGrid work) {
  conv2d_block<Element, Tile, Pass, Vector, false>(a, g, work);
}

// fprop that also writes its column moments (a kernel apart, so that the
// other kernels keep their code).
template <class Element, class Tile, int Vector>
__global__ void __launch_bounds__(Tile::kThreads, Tile::kMinBlocksPerSM)
    conv2d_fprop_moments_kernel(Conv2dParams a, const __grid_constant__ ConvGemm g, GemmGrid work) {
  conv2d_block<Element, Tile, ConvPass::kFprop, Vector, true>(a, g, work);
}

}  // namespace mpgemm::kernels
