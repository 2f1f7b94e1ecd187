// The GEMM kernels of CompactTileConfig (gemm_tile_launch.h says why a unit each).
#include "gemm_tile_launch.cuh"

namespace mpgemm::kernels {
MPGEMM_TILE_LAUNCH(CompactTileConfig);
}  // namespace mpgemm::kernels
