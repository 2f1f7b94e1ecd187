// The mma.sync ceiling: how fast WMMA's mma.sync runs on this GPU's Tensor
// Cores when nothing else is in the way, the bound the GEMM's instruction mix
// can approach (on Hopper mma.sync cannot reach the wgmma peak).
//
// block - MmaCeilingTile's warps (the large GEMM tile's); at 96 registers two
//         blocks fit on an SM, so the benchmark times 1 and 2 per SM. a and b
//         are staged once through shared memory.
// warp  - loads its kFragmentsM A and kFragmentsN B fragments once, then issues
//         `iterations` rounds of kFragmentsM x kFragmentsN mma_sync from
//         registers: no memory traffic and no barrier in the loop, and each
//         accumulator is its own dependency chain, so the Tensor Cores never
//         wait on anything but themselves.
// Every warp writes its accumulators, iterations * (a @ b), so the work cannot
// be optimized away and its result can be checked.
#include <mma.h>

#include "arch/smem.cuh"
#include "wmma/mma_ceiling.h"

namespace mpgemm::kernels {
namespace {

using Tile = MmaCeilingTile;
constexpr int kFragment = Tile::kFragment;
constexpr int kAElements = Tile::kWarpM * kFragment;
constexpr int kBElements = kFragment * Tile::kWarpN;
constexpr int kWarps = Tile::kWarpsM * Tile::kWarpsN;
// a and b, then one 16x16 fp32 staging tile per warp for the output.
constexpr int kSmemBytes = (kAElements + kBElements) * int(sizeof(__half)) +
                           kWarps * kFragment * kFragment * int(sizeof(float));
constexpr int kChunks = (kAElements + kBElements) / 8;
static_assert(kChunks <= Tile::kThreads, "a and b must load in one 16-byte chunk per thread");
static_assert(kAElements % 8 == 0 && kChunks * 16 % 32 == 0, "tiles must stay 32-byte aligned");

}  // namespace

__global__ void __launch_bounds__(Tile::kThreads, 1)
    mma_ceiling_kernel(const __half* a, const __half* b, float* out, int iterations) {
  using namespace nvcuda;
  __half* tile_a = reinterpret_cast<__half*>(smem);
  __half* tile_b = tile_a + kAElements;
  // a and b lie back to back in shared memory: one 16-byte chunk per thread.
  if (const int c = threadIdx.x; c < kChunks) {
    const __half* src = c < kAElements / 8 ? a + 8 * c : b + 8 * c - kAElements;
    reinterpret_cast<uint4*>(tile_a)[c] = *reinterpret_cast<const uint4*>(src);
  }
  __syncthreads();

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> frag_a[Tile::kFragmentsM];
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> frag_b[Tile::kFragmentsN];
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[Tile::kFragmentsM][Tile::kFragmentsN];
#pragma unroll
  for (int i = 0; i < Tile::kFragmentsM; ++i)
    wmma::load_matrix_sync(frag_a[i], tile_a + i * kFragment * kFragment, kFragment);
#pragma unroll
  for (int j = 0; j < Tile::kFragmentsN; ++j)
    wmma::load_matrix_sync(frag_b[j], tile_b + j * kFragment, Tile::kWarpN);
#pragma unroll
  for (int i = 0; i < Tile::kFragmentsM; ++i)
#pragma unroll
    for (int j = 0; j < Tile::kFragmentsN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);

  for (int it = 0; it < iterations; ++it) {
#pragma unroll
    for (int i = 0; i < Tile::kFragmentsM; ++i)
#pragma unroll
      for (int j = 0; j < Tile::kFragmentsN; ++j) wmma::mma_sync(acc[i][j], frag_a[i], frag_b[j], acc[i][j]);
  }

  // Out through shared memory: store_matrix_sync's layout is only defined there
  // and in global memory, and staging keeps the global writes coalesced.
  float* staging = reinterpret_cast<float*>(tile_b + kBElements) + warp * kFragment * kFragment;
  float* warp_out = out + (int64_t(blockIdx.x) * kWarps + warp) * Tile::kWarpM * Tile::kWarpN;
#pragma unroll
  for (int i = 0; i < Tile::kFragmentsM; ++i)
#pragma unroll
    for (int j = 0; j < Tile::kFragmentsN; ++j) {
      wmma::store_matrix_sync(staging, acc[i][j], kFragment, wmma::mem_row_major);
      __syncwarp();
#pragma unroll 1
      for (int e = lane; e < kFragment * kFragment; e += 32)
        warp_out[(i * kFragment + e / kFragment) * Tile::kWarpN + j * kFragment + e % kFragment] = staging[e];
      __syncwarp();
    }
}

cudaError_t launch_mma_ceiling(const __half* a, const __half* b, float* out, int iterations, int blocks,
                               cudaStream_t stream) {
  if (blocks < 1 || iterations < 0) return cudaErrorInvalidValue;
  void* args[] = {&a, &b, &out, &iterations};
  return cudaLaunchKernel(&mma_ceiling_kernel, dim3(blocks), dim3(Tile::kThreads), args, kSmemBytes, stream);
}

}  // namespace mpgemm::kernels
