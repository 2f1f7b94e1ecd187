// The producer of a Hopper block: one thread of warpgroup 0 issues the copy
// engine's box copies of each 64-deep K slice of A's rows and B's columns
// into the ring (sm90/pipeline.cuh), each into a stage its readers have
// handed back, the bytes completing on the stage's `full` mbarrier. In a
// cluster each block copies its own A and its share of the B they have in
// common, multicast into every block of the cluster: each block's copies per
// slice fall by a third (128-row tiles) or two fifths (64-row tiles), which
// is what L2 must deliver.
#pragma once

#include <cuda.h>

#include "arch/copy_engine.cuh"
#include "arch/mbarrier.cuh"
#include "sm90/params.h"
#include "sm90/pipeline.cuh"
#include "sm90/tile_scheduler.cuh"

namespace mpgemm::kernels::sm90 {

// Copies boxes [first, first + count) of a tile of `Rows` rows (M or N, from
// mn0) by kBlockK (from k0) of the operand behind `map` into `dst`, and with
// Multicast into the same place in every block of the cluster.
template <class OperandTile, int Multicast>
__device__ __forceinline__ void load_boxes(uint8_t* dst, const void* map, uint64_t* full, int mn0, int k0, int batch,
                                           int first, int count) {
#pragma unroll
  for (int box = first; box < first + count; ++box) {
    const int mn = mn0 + box * OperandTile::kBoxRows;
    const int c0 = OperandTile::kKMajor ? k0 : mn, c1 = OperandTile::kKMajor ? mn : k0;
    if constexpr (Multicast == 1) tma_load_3d(dst + box * OperandTile::kBoxBytes, map, full, c0, c1, batch);
    else tma_load_3d_multicast(dst + box * OperandTile::kBoxBytes, map, full, c0, c1, batch, (1u << Multicast) - 1);
  }
}

// Copies the k_slices K slices of the tile at `origin` (this block's share
// of a cluster tile), from slice first_slice of K on, of matrices a_batch of
// A and b_batch of B, into the ring from `pipe` on, leaving `pipe` past them.
// Slices past K arrive as zeros.
template <class Tile, class Smem>
__device__ __forceinline__ void load_tile(Smem& shared, const CUtensorMap* a_map, const CUtensorMap* b_map,
                                          const TileOrigin& origin, int a_batch, int b_batch, int first_slice,
                                          int k_slices, int rank, TilePipeline<Tile>& pipe) {
  using ATile = typename Smem::ATile;
  using BTile = typename Smem::BTile;
  static_assert(BTile::kBoxes % Tile::kClusterM == 0, "the blocks of a cluster copy B in whole boxes");
  constexpr int kBBoxes = BTile::kBoxes / Tile::kClusterM;  // of B's boxes, those this block copies
  for (int slice = 0; slice < k_slices; ++slice, pipe.advance()) {
    mbarrier_wait(&shared.empty[pipe.stage], pipe.phase ^ 1);
    mbarrier_arrive_expect_tx(&shared.full[pipe.stage], ATile::kBytes + BTile::kBytes);
    const int k0 = (first_slice + slice) * Config::kBlockK;
    load_boxes<ATile, 1>(shared.a[pipe.stage], a_map, &shared.full[pipe.stage], int(origin.m0), k0, a_batch, 0,
                         ATile::kBoxes);
    load_boxes<BTile, Tile::kClusterM>(shared.b[pipe.stage], b_map, &shared.full[pipe.stage], int(origin.n0), k0,
                                       b_batch, rank * kBBoxes, kBBoxes);
  }
}

// After the block's last copies: in a cluster the other blocks' consumers
// arrive on this block's `empty` barriers, so wait for each stage's last
// hand-back, that none comes after this block exits.
template <class Tile, class Smem>
__device__ __forceinline__ void wait_for_hand_backs(Smem& shared, TilePipeline<Tile>& pipe) {
  if constexpr (Tile::kClusterM > 1) {
    for (int s = 0; s < Tile::kStages; ++s, pipe.advance())
      mbarrier_wait(&shared.empty[pipe.stage], pipe.phase ^ 1);
  }
}

}  // namespace mpgemm::kernels::sm90
