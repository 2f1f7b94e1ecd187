// The WMMA GEMM kernels of every WMMA tile (wmma/launch.h): each tile's for
// both input types, the four operand layouts and the load widths it takes.
#include "wmma/launch.cuh"

namespace mpgemm::kernels {
MPGEMM_WMMA_TILE_LAUNCH(WideTile);
MPGEMM_WMMA_TILE_LAUNCH(TallTile);
MPGEMM_WMMA_TILE_LAUNCH(SquareTile);
MPGEMM_WMMA_TILE_LAUNCH(CompactTile);
MPGEMM_WMMA_TILE_LAUNCH(SmallTile);
MPGEMM_WMMA_TILE_LAUNCH(ScalarTile);
}  // namespace mpgemm::kernels
