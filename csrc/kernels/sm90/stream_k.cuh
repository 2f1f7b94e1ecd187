// Stream-K on the Hopper block (sm90/block.cuh's `Work`): the tiles' K
// slices laid end to end in tile order, each block of the persistent grid
// takes an equal run of them, so that every multiprocessor does the same
// work whatever the count of tiles. A GEMM of 18 tiles on 132
// multiprocessors runs whole K on 18 of them and leaves 114 idle; 144 tiles
// take two waves, the second 12 tiles long. Split-K (the batch of the tile
// order) evens that out only where the splits times the tiles come near a
// multiple of the multiprocessors, and pays a reduction kernel over every
// split's partial tile.
//
// Work: block b's run is slices [begin(b), begin(b + 1)) of the tiles' T * S
// (S slices a tile), split as evenly as whole slices allow. A run covers
// the end of one tile, whole tiles, and the start of another: its units,
// each a tile's slices within the run. The block takes them last tile
// first: the start of the tile its run ends in, which continues into later
// blocks' runs, comes first; its sums go to the block's slot of the
// workspace (StreamKWorkspace), and the block raises its flag. Each other
// unit ends its tile, and its block stores it: first it adds, in order from
// the nearest, the slots of the earlier blocks whose runs hold the tile's
// earlier slices, each once its flag is up. So a block waits only on
// blocks of lower index, each of which wrote its slot first thing. The
// GPU dispatches a grid's blocks in index order (what CUTLASS's stream-K
// also relies on; the programming model does not promise it), so those
// are running or done, and wait on nothing later.
// Why this order: the result is the same sum in the same order on every run
// of the same problem on the same device (the runs depend on the grid, the
// device's multiprocessors), with no atomics on the data; and each slot is
// written and read once, mostly from L2 (a tile of fp32 a block: 128 KB on
// the 128 x 256 tile, 64 and 32 KB on the narrow ones).
#pragma once

#include <cstdint>

#include "arch/barrier.cuh"
#include "arch/grid_flags.cuh"
#include "common/gemm_params.h"
#include "sm90/epilogue.cuh"
#include "sm90/params.h"
#include "sm90/tile_scheduler.cuh"

namespace mpgemm::kernels::sm90 {

// Consumer c's warpgroup meets at kFixUpBarrier + c around its slot's
// flags: after ping-pong's turn barriers (sm90/block.cuh), which stream-K's
// cooperative consumers do not use.
constexpr int kFixUpBarrier = kStripBarriersEnd + Config::kConsumers;

// A unit of a block's run: slices [first_slice, first_slice + k_slices) of
// tile `origin`. `stores`: the tile's last slice is in this block's run, so
// it stores the tile, after adding the slots of blocks [first_peer, this
// block) (none where first_peer is this block: the tile begins in its run);
// else it leaves its sums in its slot.
struct StreamKUnit : BatchTile {
  int first_slice, k_slices;
  int first_peer;
  bool stores;
};

template <class Tile>
struct StreamKTiles {
  // Units differ in their slices, but every one has some, so the
  // accumulators need no zeroing; ping-pong, which assumes every tile's
  // slices the same, is ruled out below.
  static constexpr bool kSlicesVary = false;
  static constexpr bool kStreamK = true;
  static_assert(!Tile::kPingPong && Tile::kClusterM == 1, "cooperative consumers on blocks alone");
  const GemmParams& p;
  const WgmmaSchedule& schedule;
  int tile_slices;  // S: every tile's K slices
  StreamKWorkspace workspace;

  __device__ int64_t slices_total() const { return PersistentTileScheduler<Tile>::tiles(p) * tile_slices; }
  // The first slice of block b's run (b = gridDim.x: the end of the last).
  __device__ int64_t run_begin(int64_t b) const {
    const int64_t total = slices_total(), base = total / gridDim.x, extra = total % gridDim.x;
    return b * base + (b < extra ? b : extra);
  }
  // The block whose run holds slice i (the launcher keeps the grid within the slices: base >= 1).
  __device__ int block_of(int64_t i) const {
    const int64_t total = slices_total(), base = total / gridDim.x, extra = total % gridDim.x;
    const int64_t longer = extra * (base + 1);  // the slices of the first `extra` runs, one longer each
    return int(i < longer ? i / (base + 1) : extra + (i - longer) / base);
  }

  // This block's units: the tiles its run touches.
  __device__ int64_t count() const {
    const int64_t begin = run_begin(blockIdx.x), end = run_begin(blockIdx.x + 1);
    return begin < end ? (end - 1) / tile_slices - begin / tile_slices + 1 : 0;
  }
  // Unit u of this block's run, from its last tile back.
  __device__ StreamKUnit tile(int64_t u, int rank) const {
    const int64_t begin = run_begin(blockIdx.x), end = run_begin(blockIdx.x + 1);
    const int64_t t = (end - 1) / tile_slices - u, tile_begin = t * tile_slices, tile_end = tile_begin + tile_slices;
    const int64_t first = begin > tile_begin ? begin : tile_begin, last = end < tile_end ? end : tile_end;
    StreamKUnit unit;
    static_cast<BatchTile&>(unit) = PersistentTileScheduler<Tile>::tile(t, p, schedule.raster_group, rank);
    unit.first_slice = int(first - tile_begin);
    unit.k_slices = int(last - first);
    unit.first_peer = block_of(tile_begin);
    unit.stores = tile_end <= end;
    return unit;
  }
  __device__ int slices(const StreamKUnit& unit) const { return unit.k_slices; }
  __device__ const GemmParams& gemm(const StreamKUnit&) const { return p; }
  __device__ const WgmmaSchedule& output(const StreamKUnit&) const { return schedule; }
  __device__ int64_t d_batch(const StreamKUnit&) const { return 0; }

  // Consumer c's part of block b's slot, as float4s.
  __device__ float4* slot(int block, int consumer) const {
    constexpr int kVectors = Tile::kAccumulators / 4;
    return reinterpret_cast<float4*>(workspace.partials) +
           (int64_t(block) * Config::kConsumers + consumer) * kVectors * Config::kWarpgroupThreads;
  }

  // After a unit's mainloop, with its sums in `acc` (the consumer's rows):
  // a unit that does not store leaves them in this block's slot, raises its
  // flag and returns false; one that stores adds the earlier blocks' slots,
  // the nearest first, each once its flag is up, and returns true.
  __device__ bool fix_up(float (&acc)[Tile::kAccumulators], const StreamKUnit& unit, int consumer,
                         int thread) const {
    constexpr int kVectors = Tile::kAccumulators / 4, kThreads = Config::kWarpgroupThreads;
    const int barrier = kFixUpBarrier + consumer;
    if (!unit.stores) {
      float4* mine = slot(blockIdx.x, consumer) + thread;
#pragma unroll
      for (int i = 0; i < kVectors; ++i)
        store_l2(mine + i * kThreads, make_float4(acc[4 * i], acc[4 * i + 1], acc[4 * i + 2], acc[4 * i + 3]));
      // Every thread's stores before the flag (the release is cumulative over what the barrier ordered).
      named_barrier_sync(barrier, kThreads);
      if (thread == 0) grid_flag_add_release(&workspace.flags[blockIdx.x * Config::kConsumers + consumer], 1);
      return false;
    }
    for (int peer = int(blockIdx.x) - 1; peer >= unit.first_peer; --peer) {
      if (thread == 0) grid_flag_wait(&workspace.flags[peer * Config::kConsumers + consumer], 1);
      named_barrier_sync(barrier, kThreads);
      const float4* theirs = slot(peer, consumer) + thread;
#pragma unroll
      for (int i = 0; i < kVectors; ++i) {
        const float4 v = load_l2(theirs + i * kThreads);
        acc[4 * i] += v.x, acc[4 * i + 1] += v.y, acc[4 * i + 2] += v.z, acc[4 * i + 3] += v.w;
      }
    }
    return true;
  }
};

}  // namespace mpgemm::kernels::sm90
