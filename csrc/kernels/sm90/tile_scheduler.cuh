// Which tiles a Hopper block computes: a persistent grid (one block, or one
// cluster of Tile::kClusterM blocks, per multiprocessor that holds one) walks
// the tiles of every matrix of the batch in grouped order (common/
// tile_scheduler.cuh's rasterization: groups of raster_group tile rows, so
// that blocks running together share A's rows and B's columns in L2), each
// cluster taking every gridDim.x / kClusterM-th cluster tile. A cluster tile
// is kClusterM block tiles stacked along M, which read the same columns of B.
// What a block's tiles are (sm90/block.cuh's `Work`): UniformTiles, those of
// one GEMM (or a batch of them) over the same K slices each; DgradPhaseTiles,
// those of a strided dgrad's phases one after the other, each phase a GEMM of
// its own with its own K; sm90/stream_k.cuh's StreamKTiles, equal runs of
// one GEMM's K slices.
#pragma once

#include <cstdint>

#include "common/gemm_params.h"
#include "common/tile_scheduler.cuh"
#include "sm90/params.h"

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

// Every tile of p's batch, each over k_slices K slices, D as p and
// `schedule` describe it (every GEMM kernel, and each launch of a
// convolution's pass).
template <class Tile>
struct UniformTiles {
  static constexpr bool kSlicesVary = false, kStreamK = false;
  const GemmParams& p;
  const WgmmaSchedule& schedule;
  int k_slices;

  __device__ int64_t count() const { return PersistentTileScheduler<Tile>::tiles(p); }
  __device__ BatchTile tile(int64_t t, int rank) const {
    return PersistentTileScheduler<Tile>::tile(t, p, schedule.raster_group, rank);
  }
  __device__ int slices(const BatchTile&) const { return k_slices; }
  __device__ const GemmParams& gemm(const BatchTile&) const { return p; }
  __device__ const WgmmaSchedule& output(const BatchTile&) const { return schedule; }
  // The matrix of D the tile's rows lie in.
  __device__ int64_t d_batch(const BatchTile& tile) const { return tile.batch; }
};

// A strided dgrad's phases, one after the other (DgradPhases): tile t of the
// launch is tile t - first_tile[i] of phase i's GEMM, in that GEMM's grouped
// order; BatchTile::batch names the phase. A phase's K slices are its taps'
// (0 where no tap reaches it: its tiles are zeros), and its D starts at its
// first pixel of dx, a single matrix.
template <class Tile>
struct DgradPhaseTiles {
  static constexpr bool kSlicesVary = true, kStreamK = false;
  static_assert(Tile::kClusterM == 1, "blocks alone");
  const DgradPhases& phases;

  __device__ int64_t count() const { return phases.first_tile[phases.count]; }
  __device__ BatchTile tile(int64_t t, int) const {
    int phase = 0;
#pragma unroll
    for (int i = 1; i < kMaxDgradPhases; ++i) phase += i < phases.count && t >= phases.first_tile[i];
    BatchTile tile = PersistentTileScheduler<Tile>::tile(t - phases.first_tile[phase], phases.gemm[phase],
                                                         phases.schedule[phase].raster_group, 0);
    tile.batch = phase;
    return tile;
  }
  __device__ int slices(const BatchTile& tile) const { return phases.walk[tile.batch].k_slices; }
  __device__ const GemmParams& gemm(const BatchTile& tile) const { return phases.gemm[tile.batch]; }
  __device__ const WgmmaSchedule& output(const BatchTile& tile) const { return phases.schedule[tile.batch]; }
  __device__ int64_t d_batch(const BatchTile&) const { return 0; }
};

}  // namespace mpgemm::kernels::sm90
