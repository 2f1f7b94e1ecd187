// Which tile of D each block computes: the block index blockIdx.x numbers the
// kBlockM x kBlockN tiles of an m x n output row by row.
#pragma once

#include <cstdint>

namespace mpgemm::kernels {

struct TileOrigin {
  int64_t m0, n0;
};

template <class Config>
struct TileScheduler {
  __host__ __device__ static int64_t tiles_m(int64_t m) { return (m + Config::kBlockM - 1) / Config::kBlockM; }
  __host__ __device__ static int64_t tiles_n(int64_t n) { return (n + Config::kBlockN - 1) / Config::kBlockN; }
  __host__ __device__ static int64_t tiles(int64_t m, int64_t n) { return tiles_m(m) * tiles_n(n); }

  __device__ static TileOrigin origin(int64_t /*m*/, int64_t n) {
    const int64_t columns = tiles_n(n);
    return {(blockIdx.x / columns) * Config::kBlockM, (blockIdx.x % columns) * Config::kBlockN};
  }
};

}  // namespace mpgemm::kernels
