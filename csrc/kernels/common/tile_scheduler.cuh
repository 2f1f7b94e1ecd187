// What each block computes: which kBlockM x kBlockN tile of D, and for
// split-K which range of K.
//
// Tile order: blockIdx.x numbers the tiles in groups of `group` tile rows
// (CUTLASS's threadblock swizzle, Triton's grouped order). Within a group the
// blocks walk down a column of tiles, then to the next column, so blocks that
// run at the same time read the same few tile rows of A and tile columns of B
// and find them in L2. The last group may hold fewer rows; group 1 is plain
// row-by-row order.
//
// Split-K: blockIdx.x = split * tiles + tile; split s sums a range of whole K
// slices (KPartition: the partial slice stays first, in split 0's range).
#pragma once

#include <cstdint>

namespace mpgemm::kernels {

struct TileOrigin {
  int64_t m0, n0;
};

// [begin, begin + extent) of GEMM-K.
struct KRange {
  int64_t begin, extent;
};

template <class Config>
struct TileScheduler {
  __host__ __device__ static int64_t tiles_m(int64_t m) { return (m + Config::kBlockM - 1) / Config::kBlockM; }
  __host__ __device__ static int64_t tiles_n(int64_t n) { return (n + Config::kBlockN - 1) / Config::kBlockN; }
  __host__ __device__ static int64_t tiles(int64_t m, int64_t n) { return tiles_m(m) * tiles_n(n); }

  // The origin of tile `index` in grouped order; every index in [0, tiles)
  // maps to a distinct tile.
  __host__ __device__ static TileOrigin origin_of(int64_t index, int64_t m, int64_t n, int group) {
    const int64_t rows = tiles_m(m), columns = tiles_n(n);
    const int64_t per_group = int64_t(group) * columns;
    const int64_t first_row = index / per_group * group;
    const int64_t rows_here = rows - first_row < group ? rows - first_row : group;
    const int64_t within = index - first_row * columns;
    return {(first_row + within % rows_here) * Config::kBlockM, within / rows_here * Config::kBlockN};
  }

  // This block's tile, when the grid holds one block per tile.
  __device__ static TileOrigin origin(int64_t m, int64_t n, int group = 1) { return origin_of(blockIdx.x, m, n, group); }
};

// Split `split` of `splits` of a K that KPartition<kBlockK> cuts into slices:
// the slices are dealt out in order, the first (slices % splits) splits
// taking one more. A split with no slice gets an empty range.
template <int kBlockK>
__host__ __device__ KRange split_k_range(int64_t k, int split, int splits) {
  const int64_t slices = (k + kBlockK - 1) / kBlockK;
  const int64_t first_extent = k - (slices > 0 ? slices - 1 : 0) * kBlockK;  // slice 0 holds [0, first_extent)
  const int64_t base = slices / splits, extra = slices % splits;
  const int64_t begin_slice = split * base + (split < extra ? split : extra);
  const int64_t end_slice = begin_slice + base + (split < extra ? 1 : 0);
  auto start = [&](int64_t slice) { return slice == 0 ? 0 : first_extent + (slice - 1) * kBlockK; };
  return {start(begin_slice), start(end_slice) - start(begin_slice)};
}

}  // namespace mpgemm::kernels
