// Hopper GEMM (sm_90a): D[b] = activation(A[b] @ B[b] + bias), 16-bit inputs,
// fp32 accumulation, D in fp32 or the inputs' type, with wgmma and the tensor
// copy engine (TMA), on the block of sm90/block.cuh whose producer copies
// 64-deep K slices of A's rows and B's columns (sm90/producer.cuh); the
// same block splitting K, where the output's tiles are too few to fill the
// device, or giving each block an equal run of every tile's K slices
// (stream-K); the same block storing the activation's input beside D, for a
// backward that needs it; multiplying the sums by an activation's derivative
// (an MLP's dgrad: GELU's backward in its epilogue); and, whole or split,
// summing A's rows too (a wgrad whose A is dZ^T: the bias's gradient from the
// GEMM that reads dZ).
#pragma once

#include <cuda.h>

#include "common/gemm_params.h"
#include "sm90/block.cuh"
#include "sm90/params.h"
#include "sm90/producer.cuh"
#include "sm90/stream_k.cuh"

namespace mpgemm::kernels::sm90 {

// The layouts after Tile: the kernel's mangled name must not end as a WMMA
// kernel's does, with its chunk width (which the SASS checks read there).
template <class Element, class Tile, bool AKMajor, bool BKMajor, unsigned kExtras>
__device__ __forceinline__ void whole_k_gemm(const CUtensorMap& a_map, const CUtensorMap& b_map,
                                             const CUtensorMap& d_map, const GemmParams& p,
                                             const WgmmaSchedule& schedule, const CUtensorMap* z_map) {
  const int k_slices = static_cast<int>((p.k + Config::kBlockK - 1) / Config::kBlockK);
  const auto load = [&](auto& shared, const BatchTile& tile, int slices, int rank, TilePipeline<Tile>& pipe) {
    load_tile<Tile>(shared, &a_map, &b_map, tile.origin, schedule.a_broadcast ? 0 : int(tile.batch),
                    schedule.b_broadcast ? 0 : int(tile.batch), 0, slices, rank, pipe);
  };
  wgmma_block<Element, Tile, AKMajor, BKMajor, kExtras>(d_map, p, schedule, k_slices, load, z_map);
}

template <class Element, class Tile, bool AKMajor, bool BKMajor>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    wgmma_gemm_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                      const __grid_constant__ CUtensorMap d_map, const GemmParams p, const WgmmaSchedule schedule) {
  whole_k_gemm<Element, Tile, AKMajor, BKMajor, kBlockPlain>(a_map, b_map, d_map, p, schedule, nullptr);
}

// The whole-K kernel that also stores A @ B + bias, before the activation,
// to p.pre_activation (laid out as D; through z_map where schedule.d_copy):
// GELU's input, which its backward reads instead of running the product
// again.
template <class Element, class Tile, bool AKMajor, bool BKMajor>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    wgmma_pre_activation_gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                                     const __grid_constant__ CUtensorMap b_map,
                                     const __grid_constant__ CUtensorMap d_map,
                                     const __grid_constant__ CUtensorMap z_map, const GemmParams p,
                                     const WgmmaSchedule schedule) {
  whole_k_gemm<Element, Tile, AKMajor, BKMajor, kBlockPreActivation>(a_map, b_map, d_map, p,
                                                                                     schedule, &z_map);
}

// The pre-activation kernel whose activation is GELU's tanh form (GPT-2's
// MLP: h = gelu_tanh(z) and z stored from one product), built apart so that
// the pre-activation kernel above keeps its code, and on ping-pong pairs
// alone (gemm/launch.cu's gelu_tanh_plan), whose consumers take turns: one
// computes its tanh and stores while the other's wgmmas run.
template <class Element, class Tile, bool AKMajor, bool BKMajor>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    wgmma_pre_activation_gelu_tanh_gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                                               const __grid_constant__ CUtensorMap b_map,
                                               const __grid_constant__ CUtensorMap d_map,
                                               const __grid_constant__ CUtensorMap z_map, const GemmParams p,
                                               const WgmmaSchedule schedule) {
  whole_k_gemm<Element, Tile, AKMajor, BKMajor, kBlockPreActivation | kBlockGeluTanh>(a_map, b_map, d_map, p,
                                                                                      schedule, &z_map);
}

// The whole-K kernel that also writes A's row sums over K to p.a_row_sums
// (the first column of tiles sums them, sm90/mainloop.cuh's RowSums):
// linear's wgrad, dW = dZ^T @ X, with its bias's gradient.
template <class Element, class Tile, bool AKMajor, bool BKMajor>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    wgmma_row_sums_gemm_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                               const __grid_constant__ CUtensorMap d_map, const GemmParams p,
                               const WgmmaSchedule schedule) {
  whole_k_gemm<Element, Tile, AKMajor, BKMajor, kBlockARowSums>(a_map, b_map, d_map, p, schedule,
                                                                                 nullptr);
}

// The whole-K kernel whose epilogue multiplies the sums by the activation's
// derivative at p.activation_input (laid out as D) instead of adding a bias
// and applying the activation: an MLP's dgrad, dZ = (dY @ W2) * gelu'(Z),
// so that GELU's backward is no pass of its own.
template <class Element, class Tile, bool AKMajor, bool BKMajor>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    wgmma_activation_grad_gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                                      const __grid_constant__ CUtensorMap b_map,
                                      const __grid_constant__ CUtensorMap d_map, const GemmParams p,
                                      const WgmmaSchedule schedule) {
  whole_k_gemm<Element, Tile, AKMajor, BKMajor, kBlockActivationGrad>(a_map, b_map, d_map, p, schedule, nullptr);
}

// Stream-K on the same block (sm90/stream_k.cuh), for outputs whose tiles
// fill the device's multiprocessors poorly: each block an equal run of the
// tiles' K slices, a tile split between runs summed from `workspace` by the
// block that ends it, then stored as the whole-K kernel stores it (bias and
// activation included), a single matrix.
template <class Element, class Tile, bool AKMajor, bool BKMajor>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    wgmma_stream_k_gemm_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                               const __grid_constant__ CUtensorMap d_map, const GemmParams p,
                               const WgmmaSchedule schedule, const StreamKWorkspace workspace) {
  const int k_slices = static_cast<int>((p.k + Config::kBlockK - 1) / Config::kBlockK);
  const auto load = [&](auto& shared, const StreamKUnit& unit, int slices, int rank, TilePipeline<Tile>& pipe) {
    load_tile<Tile>(shared, &a_map, &b_map, unit.origin, 0, 0, unit.first_slice, slices, rank, pipe);
  };
  wgmma_block_over<Element, Tile, AKMajor, BKMajor>(StreamKTiles<Tile>{p, schedule, k_slices, workspace}, &d_map,
                                                    load);
}

// Split-K on the same block, for outputs of too few tiles to fill the
// device: p.batch is the number of splits, and the tile order's batch
// coordinate the split, which sums K slices [split, split + 1) *
// schedule.split_slices of the one matrix of A and B (slices past K arrive
// as zeros) and stores its fp32 partial tile, with no bias or activation, to
// matrix `split` of D (the workspace, as p describes it). The launcher's
// reduction (gemm/splitk_reduce.cu) sums the splits in split order, so the
// result is bitwise the same on every run.
template <class Element, class Tile, bool AKMajor, bool BKMajor, unsigned kExtras>
__device__ __forceinline__ void splitk_gemm(const CUtensorMap& a_map, const CUtensorMap& b_map,
                                            const CUtensorMap& d_map, const GemmParams& p,
                                            const WgmmaSchedule& schedule) {
  const auto load = [&](auto& shared, const BatchTile& tile, int slices, int rank, TilePipeline<Tile>& pipe) {
    load_tile<Tile>(shared, &a_map, &b_map, tile.origin, 0, 0, int(tile.batch) * slices, slices, rank, pipe);
  };
  wgmma_block<Element, Tile, AKMajor, BKMajor, kExtras>(d_map, p, schedule, schedule.split_slices, load);
}

template <class Element, class Tile, bool AKMajor, bool BKMajor>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    wgmma_splitk_gemm_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                             const __grid_constant__ CUtensorMap d_map, const GemmParams p,
                             const WgmmaSchedule schedule) {
  splitk_gemm<Element, Tile, AKMajor, BKMajor, kBlockPlain>(a_map, b_map, d_map, p, schedule);
}

// Split-K summing A's rows too: each split's partial row sums to matrix
// `split` of p.a_row_sums (split * m), which the launcher's reduction sums
// in split order as it does D's.
template <class Element, class Tile, bool AKMajor, bool BKMajor>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    wgmma_splitk_row_sums_gemm_kernel(const __grid_constant__ CUtensorMap a_map,
                                      const __grid_constant__ CUtensorMap b_map,
                                      const __grid_constant__ CUtensorMap d_map, const GemmParams p,
                                      const WgmmaSchedule schedule) {
  splitk_gemm<Element, Tile, AKMajor, BKMajor, kBlockARowSums>(a_map, b_map, d_map, p, schedule);
}

}  // namespace mpgemm::kernels::sm90
