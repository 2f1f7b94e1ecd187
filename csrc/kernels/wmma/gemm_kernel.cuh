// Block-tiled WMMA GEMM: D = activation(A @ B + bias), fp16 or bf16 in
// (Element, both operands), fp32 accumulate, D in fp32, fp16 or bf16.
//
// grid   - one block per Tile::kBlockM x kBlockN tile of D in grouped order
//          (TileScheduler; a flat index, so no grid dimension limits M or N),
//          times split.split_k; grid.y strides over the batch.
// block  - WmmaBlock (wmma/block.cuh) with strided-matrix operand loaders.
// split-K - with split.split_k > 1 (single matrices only) each block sums its
//          split's range of whole K slices and writes the fp32 partial tile,
//          with no bias or activation, to split.partials[split] (m x n, row
//          stride n); gemm/splitk_reduce.cu sums the splits in order and finishes.
#pragma once

#include <cstdint>

#include "arch/smem.cuh"
#include "common/element_traits.cuh"
#include "common/gemm_params.h"
#include "common/tile_scheduler.cuh"
#include "wmma/block.cuh"
#include "wmma/operand_loaders.cuh"

namespace mpgemm::kernels {

// Whether this compilation pass builds Tile's kernels: a tile meant for a
// newer arch (its kMinArch: the 3-stage 64-deep tiles need sm_80's shared
// memory, and on sm_75's register-staged path they would spill) has an empty
// body in older passes, which the launcher refuses to run.
template <class Tile>
inline constexpr bool kTileCompiled =
#if defined(__CUDA_ARCH__)
    __CUDA_ARCH__ >= Tile::kMinArch * 10;
#else
    true;
#endif

// Where split `split` writes its raw sums: its slice of the workspace, fp32,
// with no bias or activation (the reduction applies them once).
__device__ inline GemmParams split_partials(const GemmParams& p, const GemmGrid& grid, int split) {
  GemmParams out;
  out.m = p.m;
  out.n = p.n;
  out.d = grid.partials + split * p.m * p.n;
  out.d_type = ElementType::kFloat32;
  out.d_row_stride = p.n;
  return out;
}

template <class Element, class Tile, bool AKMajor, bool BKMajor, int Vector>
__global__ void __launch_bounds__(Tile::kThreads, Tile::kMinBlocksPerSM)
    wmma_gemm_kernel(GemmParams p, GemmGrid grid) {
  if constexpr (kWmmaCompiled<Element> && kTileCompiled<Tile>) {
    using Block = WmmaBlock<Element, Tile, AKMajor, BKMajor>;
    using LoaderA = MatrixLoader<typename Block::TileA, Tile::kBlockK, Tile::kThreads, Vector>;
    using LoaderB = MatrixLoader<typename Block::TileB, Tile::kBlockK, Tile::kThreads, Vector>;

    const int64_t tiles = TileScheduler<Tile>::tiles(p.m, p.n);
    const int split = int(blockIdx.x / tiles);
    const TileOrigin tile = TileScheduler<Tile>::origin_of(blockIdx.x - split * tiles, p.m, p.n, grid.raster_group);
    const KRange range = split_k_range<Tile::kBlockK>(p.k, split, grid.split_k);
    const Block block(tile.m0, tile.n0);
    const int rows_left = p.m - block.m0 < Tile::kBlockM ? int(p.m - block.m0) : Tile::kBlockM;
    const int cols_left = p.n - block.n0 < Tile::kBlockN ? int(p.n - block.n0) : Tile::kBlockN;
    for (int64_t batch = blockIdx.y; batch < p.batch; batch += gridDim.y) {
      LoaderA a(static_cast<const Element*>(p.a) + batch * p.a_batch_stride + block.m0 * p.a_row_stride +
                    range.begin * p.a_col_stride,
                AKMajor ? p.a_row_stride : p.a_col_stride, p.a_col_stride, rows_left, range.extent);
      LoaderB b(static_cast<const Element*>(p.b) + batch * p.b_batch_stride + block.n0 * p.b_col_stride +
                    range.begin * p.b_row_stride,
                BKMajor ? p.b_col_stride : p.b_row_stride, p.b_row_stride, cols_left, range.extent);
      typename Block::Accumulators acc;
      Block::clear(acc);
      block.template mainloop<Vector>(acc, a, b, Block::slices(range.extent), reinterpret_cast<Element*>(smem));
      // The split is worked out again rather than kept in a register
      // through the mainloop.
      block.epilogue(grid.split_k > 1 ? split_partials(p, grid, int(blockIdx.x / tiles)) : p, acc, smem, batch);
    }
  }
}

}  // namespace mpgemm::kernels
