// Totals per-block column moments (norm/column_moments.h) in two launches
// of one combining step, each warp loading whole lines: its lanes are 32
// adjacent columns.
//
// combine              - a block's 8 warps take groups (each a count, and
//                        a mean and M2 per column) in turn (warp w: w,
//                        w + 8, ...), each lane one column, in fp64. The
//                        warps' totals meet in shared memory and warp 0
//                        adds them in warp order, twice: the groups' mean
//                        first, then their M2 about it (each group's M2
//                        plus its count times its mean's squared distance).
//                        The second read finds the groups' moments in L1.
// moments_split_kernel - a block per 32 columns and split of the row
//                        blocks: combines the split's blocks (fp32), and
//                        writes the split's mean and M2 (fp64) to the
//                        workspace.
// moments_total_kernel - a block per 32 columns: combines the splits, and
//                        writes each column's mean and biased variance.
// A split takes about the square root of the blocks, so that both
// launches' loops are about as long (the shape's alone). Every sum is in a
// fixed order, so every run gives the same bits.
//
// Why not a block per column: the moments lie [2][blocks][channels], so a
// column's values are a row of moments apart. Read a column per block,
// each 4-byte value takes a 32-byte sector from L2, and the moments of a
// ResNet-50 step (1/16 of its batch norms' inputs, 356 MB at batch 256 on
// the Hopper tiles' 64-row blocks) cost 8 times their bytes, the means
// twice (bench/NOTES.md, "The epilogue statistics' totals read by whole
// lines").
#include <cmath>
#include <cstdint>

#include "arch/smem.cuh"
#include "norm/column_moments.h"

namespace mpgemm::kernels {
namespace {

constexpr int kLanes = 32;  // columns a block takes
constexpr int kWarps = 8;
constexpr int kThreads = kLanes * kWarps;

struct TotalArgs {
  int64_t rows, channels, block_rows, blocks, splits, blocks_per_split;
  const float* moments;
  double* split_moments;  // [splits][2][channels]: each split's mean, then its M2
  float* mean_var;
};

// The rows of row blocks [first, end).
__device__ __forceinline__ double rows_of(const TotalArgs& a, int64_t first, int64_t end) {
  const int64_t last_row = end * a.block_rows < a.rows ? end * a.block_rows : a.rows;
  return double(last_row - first * a.block_rows);
}

__device__ __forceinline__ int64_t split_end(const TotalArgs& a, int64_t split) {
  const int64_t end = (split + 1) * a.blocks_per_split;
  return end < a.blocks ? end : a.blocks;
}

// The groups moments_split_kernel combines: row blocks, the epilogue's fp32
// moments.
struct RowBlocks {
  static __device__ double count(const TotalArgs& a, int64_t b) { return rows_of(a, b, b + 1); }
  static __device__ double mean(const TotalArgs& a, int64_t b, int64_t c) { return a.moments[b * a.channels + c]; }
  static __device__ double m2(const TotalArgs& a, int64_t b, int64_t c) {
    return a.moments[(a.blocks + b) * a.channels + c];
  }
};

// The groups moments_total_kernel combines: splits, the split kernel's fp64
// moments.
struct Splits {
  static __device__ double count(const TotalArgs& a, int64_t s) {
    return rows_of(a, s * a.blocks_per_split, split_end(a, s));
  }
  static __device__ double mean(const TotalArgs& a, int64_t s, int64_t c) {
    return a.split_moments[2 * s * a.channels + c];
  }
  static __device__ double m2(const TotalArgs& a, int64_t s, int64_t c) {
    return a.split_moments[(2 * s + 1) * a.channels + c];
  }
};

// The warps' values of each lane's column, added in warp order by warp 0
// (the others get 0).
__device__ double total_over_warps(double value, double* sums, int warp, int lane) {
  sums[warp * kLanes + lane] = value;
  __syncthreads();
  double total = 0.0;
  if (warp == 0)
    for (int w = 0; w < kWarps; ++w) total += sums[w * kLanes + lane];
  __syncthreads();
  return total;
}

struct Moments {
  double mean, m2;  // m2 in warp 0 only (the other warps hold 0)
};

// The mean and M2 of column c over groups [first, end), which hold `rows`
// rows.
template <class Groups>
__device__ __forceinline__ Moments combine(const TotalArgs& a, int64_t first, int64_t end, double rows, int64_t c) {
  const int warp = threadIdx.x / kLanes, lane = threadIdx.x % kLanes;
  const bool column = c < a.channels;
  double* sums = reinterpret_cast<double*>(smem);  // [kWarps][kLanes], then the groups' means
  double weighted = 0.0;
  if (column)
#pragma unroll 4
    for (int64_t g = first + warp; g < end; g += kWarps) weighted += Groups::count(a, g) * Groups::mean(a, g, c);
  const double total = total_over_warps(weighted, sums, warp, lane);
  double* means = sums + kWarps * kLanes;
  if (warp == 0) means[lane] = total / rows;
  __syncthreads();
  const double mean = means[lane];
  double m2 = 0.0;
  if (column)
#pragma unroll 4
    for (int64_t g = first + warp; g < end; g += kWarps) {
      const double delta = Groups::mean(a, g, c) - mean;
      m2 += Groups::m2(a, g, c) + Groups::count(a, g) * delta * delta;
    }
  return {mean, total_over_warps(m2, sums, warp, lane)};
}

constexpr size_t kSharedBytes = size_t(kWarps + 1) * kLanes * sizeof(double);

__global__ void __launch_bounds__(kThreads) moments_split_kernel(TotalArgs a) {
  const int64_t c = int64_t(blockIdx.x) * kLanes + threadIdx.x % kLanes;
  const int64_t first = int64_t(blockIdx.y) * a.blocks_per_split, end = split_end(a, blockIdx.y);
  const Moments split = combine<RowBlocks>(a, first, end, rows_of(a, first, end), c);
  if (threadIdx.x < kLanes && c < a.channels) {
    a.split_moments[2 * int64_t(blockIdx.y) * a.channels + c] = split.mean;
    a.split_moments[(2 * int64_t(blockIdx.y) + 1) * a.channels + c] = split.m2;
  }
}

__global__ void __launch_bounds__(kThreads) moments_total_kernel(TotalArgs a) {
  const int64_t c = int64_t(blockIdx.x) * kLanes + threadIdx.x % kLanes;
  const Moments total = combine<Splits>(a, 0, a.splits, double(a.rows), c);
  if (threadIdx.x < kLanes && c < a.channels) {
    a.mean_var[c] = float(total.mean);
    a.mean_var[a.channels + c] = float(total.m2 / double(a.rows));
  }
}

// Row blocks a split takes: the square root of the blocks, rounded up (at
// batch 256, the stem's 50,176 blocks in 224 splits: 28 groups a warp in
// each launch).
int64_t blocks_per_split(int64_t blocks) {
  auto per_split = int64_t(std::sqrt(double(blocks)));
  while (per_split * per_split < blocks) ++per_split;
  return per_split;
}

}  // namespace

int64_t column_moments_total_workspace_bytes(int64_t rows, int64_t channels, int64_t block_rows) {
  if (rows <= 0 || channels <= 0 || block_rows <= 0) return 0;
  const int64_t blocks = column_moment_blocks(rows, block_rows), per_split = blocks_per_split(blocks);
  return 2 * ((blocks + per_split - 1) / per_split) * channels * int64_t(sizeof(double));
}

cudaError_t launch_column_moments_total(int64_t rows, int64_t channels, int64_t block_rows, const float* moments,
                                        void* workspace, float* mean_var, cudaStream_t stream) {
  if (rows <= 0 || channels <= 0) return cudaSuccess;
  if (block_rows <= 0 || moments == nullptr || workspace == nullptr || mean_var == nullptr ||
      channels > 0x7fffffff)
    return cudaErrorInvalidValue;
  const int64_t blocks = column_moment_blocks(rows, block_rows), per_split = blocks_per_split(blocks);
  const int64_t splits = (blocks + per_split - 1) / per_split;  // none empty
  TotalArgs args{rows,   channels, block_rows, blocks, splits, per_split, moments, static_cast<double*>(workspace),
                 mean_var};
  void* params[] = {&args};
  const auto column_groups = unsigned((channels + kLanes - 1) / kLanes);
  if (const cudaError_t err = cudaLaunchKernel(&moments_split_kernel, dim3(column_groups, unsigned(splits)),
                                               dim3(kThreads), params, kSharedBytes, stream);
      err != cudaSuccess)
    return err;
  return cudaLaunchKernel(&moments_total_kernel, dim3(column_groups), dim3(kThreads), params, kSharedBytes, stream);
}

}  // namespace mpgemm::kernels
