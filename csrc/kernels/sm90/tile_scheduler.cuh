// Which tiles a Hopper block computes: a persistent grid (one block, or one
// cluster of Tile::kClusterM blocks, per multiprocessor that holds one) walks
// the tiles of every matrix of the batch in grouped order (common/
// tile_scheduler.cuh's rasterization: groups of raster_group tile rows, so
// that blocks running together share A's rows and B's columns in L2), each
// cluster taking every gridDim.x / kClusterM-th cluster tile. A cluster tile
// is kClusterM block tiles stacked along M, which read the same columns of B.
#pragma once

#include <cstdint>

#include "common/gemm_params.h"
#include "common/tile_scheduler.cuh"

namespace mpgemm::kernels::sm90 {

// What a cluster of Tile::kClusterM blocks computes: its tiles stacked along M.
template <class Tile>
struct ClusterTile {
  static constexpr int kBlockM = Tile::kBlockM * Tile::kClusterM, kBlockN = Tile::kBlockN;
};

// Tile `t` of the whole batch: its matrix and its origin within it.
struct BatchTile {
  int64_t batch;
  TileOrigin origin;
};

template <class Tile>
struct PersistentTileScheduler {
  using Scheduler = TileScheduler<ClusterTile<Tile>>;

  // Cluster tiles of the whole batch.
  __host__ __device__ static int64_t tiles(const GemmParams& p) { return p.batch * Scheduler::tiles(p.m, p.n); }

  // Cluster tile `t` of the whole batch, the share of the block of rank `rank`.
  __device__ static BatchTile tile(int64_t t, const GemmParams& p, int group, int rank) {
    const int64_t per_matrix = Scheduler::tiles(p.m, p.n);
    const int64_t b = t / per_matrix;
    TileOrigin origin = Scheduler::origin_of(t - b * per_matrix, p.m, p.n, group);
    origin.m0 += rank * Tile::kBlockM;  // past M (an odd count of tile rows): A reads as zeros, nothing is stored
    return {b, origin};
  }

  // This block's cluster's first cluster tile, and the step to its next.
  __device__ static int64_t first() { return blockIdx.x / Tile::kClusterM; }
  __device__ static int64_t step() { return gridDim.x / Tile::kClusterM; }
};

}  // namespace mpgemm::kernels::sm90
