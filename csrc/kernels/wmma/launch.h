// Launch of the WMMA GEMM kernels of one tile (common/tile_configs.h).
#pragma once

#include <cuda_runtime.h>

#include "common/gemm_params.h"
#include "common/tile_configs.h"

namespace mpgemm::kernels {

// Enqueues Tile's kernel for `p` with the operand layouts (K-major: A
// row-major, B column-major) given, at the widest of Tile's load widths that
// `vector` (the elements per load the operands allow) reaches; the plan's
// checks are the caller's (a plan admits Tile only where `vector` is at least
// its narrowest).
template <class Tile>
cudaError_t launch_tile(const GemmParams& p, const GemmGrid& work, int vector, cudaStream_t stream, bool a_k_major,
                        bool b_k_major);

// Instantiated in wmma/gemm_tiles.cu.
#define MPGEMM_WMMA_TILE_LAUNCH(Tile)                                                                        \
  template cudaError_t launch_tile<Tile>(const GemmParams&, const GemmGrid&, int, cudaStream_t, bool, bool)

extern MPGEMM_WMMA_TILE_LAUNCH(WideTile);
extern MPGEMM_WMMA_TILE_LAUNCH(TallTile);
extern MPGEMM_WMMA_TILE_LAUNCH(SquareTile);
extern MPGEMM_WMMA_TILE_LAUNCH(CompactTile);
extern MPGEMM_WMMA_TILE_LAUNCH(SmallTile);
extern MPGEMM_WMMA_TILE_LAUNCH(ScalarTile);

}  // namespace mpgemm::kernels
