// Block-tiled WMMA GEMM: D = activation(A @ B + bias), fp16 or bf16 in
// (Element, both operands), fp32 accumulate, D in fp32, fp16 or bf16.
//
// grid   - one block per Config::kBlockM x kBlockN tile of D (a flat index,
//          so no grid dimension limits M or N); grid.y strides over the batch.
// block  - WmmaBlock (wmma_block.cuh) with strided-matrix operand loaders.
#pragma once

#include <cstdint>

#include "element_traits.cuh"
#include "gemm_params.h"
#include "operand_loaders.cuh"
#include "tile_scheduler.cuh"
#include "wmma_block.cuh"

namespace mpgemm::kernels {

template <class Element, class Config, bool ARowMajor, bool BRowMajor, int Vector>
__global__ void __launch_bounds__(Config::kThreads, Config::kMinBlocksPerSM) wmma_gemm_kernel(GemmParams p) {
  if constexpr (kWmmaCompiled<Element>) {
    using Block = WmmaBlock<Element, Config, ARowMajor, BRowMajor>;
    using LoaderA = MatrixLoader<typename Block::TileA, Config::kBlockK, Config::kThreads, Vector>;
    using LoaderB = MatrixLoader<typename Block::TileB, Config::kBlockK, Config::kThreads, Vector>;
    extern __shared__ __align__(128) unsigned char smem[];

    const TileOrigin tile = TileScheduler<Config>::origin(p.m, p.n);
    const Block block(tile.m0, tile.n0);
    const int rows_left = p.m - block.m0 < Config::kBlockM ? int(p.m - block.m0) : Config::kBlockM;
    const int cols_left = p.n - block.n0 < Config::kBlockN ? int(p.n - block.n0) : Config::kBlockN;
    for (int64_t batch = blockIdx.y; batch < p.batch; batch += gridDim.y) {
      LoaderA a(static_cast<const Element*>(p.a) + batch * p.a_batch_stride + block.m0 * p.a_row_stride,
                ARowMajor ? p.a_row_stride : p.a_col_stride, p.a_col_stride, rows_left, p.k);
      LoaderB b(static_cast<const Element*>(p.b) + batch * p.b_batch_stride + block.n0 * p.b_col_stride,
                BRowMajor ? p.b_row_stride : p.b_col_stride, p.b_row_stride, cols_left, p.k);
      typename Block::Accumulators acc;
      Block::clear(acc);
      block.template mainloop<Vector>(acc, a, b, Block::slices(p.k), reinterpret_cast<Element*>(smem));
      block.epilogue(p, acc, smem, batch);
    }
  }
}

}  // namespace mpgemm::kernels
