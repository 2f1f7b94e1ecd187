// One WMMA tile's GEMM kernels from a copy of the kernels with a bug planted
// in the pipeline (test_kernel_sim.py's MUTATION, in wmma/block.cuh):
// SmallTile's, on which the sim arch 800 driver's small problems mostly run
// (its forced plans and split-K cases among them: with the bug planted, 15
// of 18 forced plans and 5 of 20 random cases failed, seed 1). Linked ahead
// of the unplanted kernels, its definitions are the ones the linker keeps,
// so that the planted build compiles this one tile rather than every WMMA
// tile.
#include "wmma/launch.cuh"

namespace mpgemm::kernels {
MPGEMM_WMMA_TILE_LAUNCH(SmallTile);
}  // namespace mpgemm::kernels
