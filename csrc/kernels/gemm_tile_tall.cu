// The GEMM kernels of TallTileConfig (gemm_tile_launch.h says why a unit each).
#include "gemm_tile_launch.cuh"

namespace mpgemm::kernels {
MPGEMM_TILE_LAUNCH(TallTileConfig);
}  // namespace mpgemm::kernels
