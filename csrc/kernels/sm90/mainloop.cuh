// The consumer mainloop of a Hopper block: a consumer warpgroup waits for
// each stage of its tile's K slices to fill, issues the slice's four 64 x N
// x 16 wgmmas (A's 64 rows and B's N columns, the tile's width, read from
// the swizzled tiles through their descriptors) into 64 x N fp32
// accumulators in registers,
// and keeps one slice's wgmmas in flight while it waits for the next: a
// stage goes back to the producers (every block whose copies land in it)
// once the wgmmas after its own have been issued.
#pragma once

#include <cstdint>

#include "arch/mbarrier.cuh"
#include "arch/smem.cuh"
#include "arch/wgmma.cuh"
#include "sm90/pipeline.cuh"

namespace mpgemm::kernels::sm90 {

// Hands `stage` back to every producer whose copies land in it: this block's,
// and in a cluster each block's (its `empty` barrier at the same offset).
template <class Tile, class Smem>
__device__ __forceinline__ void release_stage(Smem& shared, int stage, int thread) {
  if constexpr (Tile::kClusterM == 1) {
    if (thread == 0) mbarrier_arrive(&shared.empty[stage]);
  } else if (thread < Tile::kClusterM) {
    mbarrier_arrive_cluster(&shared.empty[stage], thread);
  }
}

// A's row sums over K beside a tile's product (mma_tile WithRowSums): with
// each k16's wgmma one more, 64 x 8 x 16, of the same 64 rows of A against a
// tile of ones (`ones`, the descriptor of an 8-row K-major tile whose every
// element is 1), so that each of its 8 columns of accumulators holds the
// rows' sums. A sum the Tensor Cores add as they add the product: its
// products are exact (x * 1), it is summed in fp32, and it reads A's tile
// where the product reads it, besides the 1 KB tile of ones. The block runs
// this mainloop on the first column of tiles, so that each row is summed
// once, and the plain one on the others: a wgmma under a branch that ptxas
// cannot prove uniform across the warpgroup makes it serialize every wgmma
// of the kernel (its warning C7520).
struct RowSums {
  float acc[4];
  uint64_t ones;
};

// Issues the wgmmas of k_slices K slices from `pipe` on into `acc` (rows
// [64 * row_block, +64) of the A tile), WithRowSums those of `row_sums` too,
// handing back every stage but the last, whose wgmmas may still be in
// flight: returns its position (for finish_tile), and leaves `pipe` past the
// slices.
template <class Element, class Tile, bool WithRowSums = false, class Smem>
__device__ __forceinline__ TilePipeline<Tile> mma_tile(float (&acc)[Tile::kAccumulators], Smem& shared,
                                                       TilePipeline<Tile>& pipe, int k_slices, int row_block,
                                                       int thread, RowSums* row_sums = nullptr) {
  using ATile = typename Smem::ATile;
  using BTile = typename Smem::BTile;
  TilePipeline<Tile> reading = pipe;  // the stage whose wgmmas may still be in flight
  for (int slice = 0; slice < k_slices; ++slice, pipe.advance()) {
    mbarrier_wait(&shared.full[pipe.stage], pipe.phase);
    const uint32_t a_tile = smem_address(shared.a[pipe.stage]), b_tile = smem_address(shared.b[pipe.stage]);
    wgmma_fence();
#pragma unroll
    for (int k16 = 0; k16 < Config::kBlockK / Config::kInstrK; ++k16) {
      const uint64_t a_rows = ATile::descriptor(a_tile, k16, row_block);
      wgmma_m64nNk16<Tile::kInstrN, Element, ATile::kKMajor ? 0 : 1, BTile::kKMajor ? 0 : 1>(
          acc, a_rows, BTile::descriptor(b_tile, k16), slice > 0 || k16 > 0);
      if constexpr (WithRowSums)
        wgmma_m64nNk16<8, Element, ATile::kKMajor ? 0 : 1, 0>(row_sums->acc, a_rows, row_sums->ones,
                                                               slice > 0 || k16 > 0);
    }
    wgmma_commit();
    // The previous slice's wgmmas are done once at most this one's are
    // pending: hand its stage back to the producer.
    wgmma_wait<1>();
    if (slice > 0) {
      release_stage<Tile>(shared, reading.stage, thread);
      reading.advance();
    }
  }
  return reading;
}

// Waits for the tile's last wgmmas and hands their stage back: the
// accumulators then hold the tile.
template <class Tile, class Smem>
__device__ __forceinline__ void finish_tile(Smem& shared, const TilePipeline<Tile>& reading, int thread) {
  wgmma_wait<0>();
  release_stage<Tile>(shared, reading.stage, thread);
}

}  // namespace mpgemm::kernels::sm90
