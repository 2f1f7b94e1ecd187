// Launch of one tile configuration's GEMM kernels. Each configuration's
// kernels are instantiated in a translation unit of their own
// (gemm_tile_<name>.cu) so that a build compiles them in parallel: in one
// unit, the GEMM's compile alone took most of the extension's build time.
#pragma once

#include <cuda_runtime.h>

#include "gemm_config.h"
#include "gemm_params.h"

namespace mpgemm::kernels {

// Enqueues Config's kernel for `p` with the operand layouts and load width
// (`vector` elements) given; the plan's checks are the caller's.
template <class Config>
cudaError_t launch_tile(const GemmParams& p, const GemmGrid& work, int vector, cudaStream_t stream,
                        bool a_row_major, bool b_row_major);

#define MPGEMM_TILE_LAUNCH(Config)                                                                           \
  template cudaError_t launch_tile<Config>(const GemmParams&, const GemmGrid&, int, cudaStream_t, bool, bool)

extern MPGEMM_TILE_LAUNCH(WideTileConfig);
extern MPGEMM_TILE_LAUNCH(TallTileConfig);
extern MPGEMM_TILE_LAUNCH(SquareTileConfig);
extern MPGEMM_TILE_LAUNCH(CompactTileConfig);
extern MPGEMM_TILE_LAUNCH(SmallTileConfig);
extern MPGEMM_TILE_LAUNCH(ScalarTileConfig);

}  // namespace mpgemm::kernels
