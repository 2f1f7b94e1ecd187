// Block-tiled WMMA GEMM: D = activation(A @ B + bias), fp16 or bf16 in
// (Element, both operands), fp32 accumulate, D in fp32, fp16 or bf16.
//
// grid   - one block per Config::kBlockM x kBlockN tile of D in grouped order
//          (TileScheduler; a flat index, so no grid dimension limits M or N),
//          times split.split_k; grid.y strides over the batch.
// block  - WmmaBlock (wmma_block.cuh) with strided-matrix operand loaders.
// split-K - with split.split_k > 1 (single matrices only) each block sums its
//          split's range of whole K slices and writes the fp32 partial tile,
//          with no bias or activation, to split.partials[split] (m x n, row
//          stride n); splitk_reduce.cu sums the splits in order and finishes.
#pragma once

#include <cstdint>

#include "element_traits.cuh"
#include "gemm_params.h"
#include "gemm_plan.h"
#include "operand_loaders.cuh"
#include "tile_scheduler.cuh"
#include "wmma_block.cuh"

namespace mpgemm::kernels {

// Whether this compilation pass builds Config's kernels: a tile meant for a
// newer arch (gemm_plan.h's min_arch: the 3-stage 64-deep tiles need sm_80's
// shared memory, and on sm_75's register-staged path they would spill) has an
// empty body in older passes, which the launcher refuses to run.
template <class Config>
inline constexpr bool kTileCompiled =
#if defined(__CUDA_ARCH__)
    __CUDA_ARCH__ >= tile_min_arch<Config>() * 10;
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

template <class Element, class Config, bool ARowMajor, bool BRowMajor, int Vector>
__global__ void __launch_bounds__(Config::kThreads, Config::kMinBlocksPerSM)
    wmma_gemm_kernel(GemmParams p, GemmGrid grid) {
  if constexpr (kWmmaCompiled<Element> && kTileCompiled<Config>) {
    using Block = WmmaBlock<Element, Config, ARowMajor, BRowMajor>;
    using LoaderA = MatrixLoader<typename Block::TileA, Config::kBlockK, Config::kThreads, Vector>;
    using LoaderB = MatrixLoader<typename Block::TileB, Config::kBlockK, Config::kThreads, Vector>;
    extern __shared__ __align__(128) unsigned char smem[];

    const int64_t tiles = TileScheduler<Config>::tiles(p.m, p.n);
    const int split = int(blockIdx.x / tiles);
    const TileOrigin tile = TileScheduler<Config>::origin_of(blockIdx.x - split * tiles, p.m, p.n, grid.raster_group);
    const KRange range = split_k_range<Config::kBlockK>(p.k, split, grid.split_k);
    const Block block(tile.m0, tile.n0);
    const int rows_left = p.m - block.m0 < Config::kBlockM ? int(p.m - block.m0) : Config::kBlockM;
    const int cols_left = p.n - block.n0 < Config::kBlockN ? int(p.n - block.n0) : Config::kBlockN;
    for (int64_t batch = blockIdx.y; batch < p.batch; batch += gridDim.y) {
      LoaderA a(static_cast<const Element*>(p.a) + batch * p.a_batch_stride + block.m0 * p.a_row_stride +
                    range.begin * p.a_col_stride,
                ARowMajor ? p.a_row_stride : p.a_col_stride, p.a_col_stride, rows_left, range.extent);
      LoaderB b(static_cast<const Element*>(p.b) + batch * p.b_batch_stride + block.n0 * p.b_col_stride +
                    range.begin * p.b_row_stride,
                BRowMajor ? p.b_row_stride : p.b_col_stride, p.b_row_stride, cols_left, range.extent);
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
