// Hopper convolution (sm_90a): one pass of a 2-D convolution as an implicit
// GEMM, x, dy NHWC and w KRSC, 16-bit, fp32 accumulation:
//   fprop  y  = x * w (+ bias)   M = N*P*Q pixels  N = K filters   K = R*S*C
//   dgrad  dx = dy * w^T         M = N*H*W pixels  N = C channels  K = R*S*K (per phase of a stride)
//   wgrad  dw = dy^T * x         M = K filters     N = R*S*C       K = N*P*Q, split
// The block is the GEMM's (sm90/block.cuh: the same ring, consumers, epilogue
// and persistent tile order over 128 x 256 tiles, or 128 x 128 and 128 x 64
// for passes whose N is narrow, and for wgrad of at most 64 filters where
// asked 64 x 256 tiles that the consumers take in turn; wgrad's splits are
// its batch; a strided
// dgrad's phases, where asked, the tiles of one launch, sm90/tile_scheduler.cuh's
// DgradPhaseTiles); only what the producer copies differs (sm90/conv_producer.cuh):
// the copy engine's im2col mode gathers the activations (x, or dy for
// dgrad) for one filter tap per box, with padding, stride and dilation in
// the tensor map, so that no thread computes an activation's address, and
// the gathered box lands in the swizzled layout wgmma reads, as a GEMM's
// operand tile does. (A few-channel layer's folded taps, where asked, are
// gathered by the producer's threads instead: sm90/conv_gather_producer.cuh.)
#pragma once

#include <cuda.h>

#include "common/gemm_params.h"
#include "conv/params.h"
#include "sm90/block.cuh"
#include "sm90/conv_gather_producer.cuh"
#include "sm90/conv_producer.cuh"
#include "sm90/params.h"

namespace mpgemm::kernels::sm90 {

// The operands' layouts per pass: fprop and dgrad read pixels K-major (the
// im2col boxes' rows); dgrad's filters are N-major, wgrad's dy M-major and
// its im2col boxes N-major.
template <ConvPass Pass>
inline constexpr bool kConvAKMajor = Pass != ConvPass::kWgrad;
template <ConvPass Pass>
inline constexpr bool kConvBKMajor = Pass == ConvPass::kFprop;
template <class Tile, ConvPass Pass>
using ConvSmem = WgmmaSmem<Tile, kConvAKMajor<Pass>, kConvBKMajor<Pass>>;

// The block of a convolution kernel: p describes the output as the GEMM's D
// (and fprop's bias): y, dx, or wgrad's fp32 partial sums (one matrix per
// split) or dw itself; kExtras (sm90/block.cuh's BlockExtras) what its
// epilogue does besides: kBlockStagedRows (dgrad only), a phase of a strided
// dgrad whose rows of dx are stored through shared memory, whole 16-byte
// chunks (sm90/epilogue.cuh); kBlockColumnMoments (fprop only), each 64-row
// block's per-channel moments of y to p.column_moments, for training batch
// norm; kBlockAddend (dgrad only), p.addend added to dx.
template <class Element, class Tile, ConvPass Pass, unsigned kExtras>
__device__ __forceinline__ void wgmma_conv_block(const CUtensorMap& a_map, const CUtensorMap& b_map,
                                                 const CUtensorMap& d_map, const GemmParams& p,
                                                 const WgmmaSchedule& schedule, const ConvWalk& walk) {
  static_assert((kExtras & ~(kBlockStagedRows | kBlockColumnMoments | kBlockAddend)) == 0, "a convolution's extras");
  static_assert((kExtras & (kBlockStagedRows | kBlockAddend)) == 0 || Pass == ConvPass::kDgrad,
                "only dgrad's phases store strided rows or add an addend");
  static_assert((kExtras & kBlockColumnMoments) == 0 || Pass == ConvPass::kFprop, "moments are of fprop's output");
  const auto load = [&](auto& shared, const BatchTile& tile, int, int, TilePipeline<Tile>& pipe) {
    load_conv_tile<Pass, Tile>(shared, &a_map, &b_map, tile, walk, pipe);
  };
  wgmma_block<Element, Tile, kConvAKMajor<Pass>, kConvBKMajor<Pass>, kExtras>(d_map, p, schedule, walk.k_slices,
                                                                              load);
}

template <class Element, class Tile, ConvPass Pass>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    wgmma_conv_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                      const __grid_constant__ CUtensorMap d_map, const GemmParams p, const WgmmaSchedule schedule,
                      const ConvWalk walk) {
  wgmma_conv_block<Element, Tile, Pass, kBlockPlain>(a_map, b_map, d_map, p, schedule, walk);
}

// dgrad's phases whose strided rows the epilogue stages (a kernel apart, so
// that the other passes' kernels keep their code).
template <class Element, class Tile>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    wgmma_dgrad_staged_rows_kernel(const __grid_constant__ CUtensorMap a_map,
                                   const __grid_constant__ CUtensorMap b_map,
                                   const __grid_constant__ CUtensorMap d_map, const GemmParams p,
                                   const WgmmaSchedule schedule, const ConvWalk walk) {
  wgmma_conv_block<Element, Tile, ConvPass::kDgrad, kBlockStagedRows>(a_map, b_map, d_map, p, schedule, walk);
}

// A strided dgrad's phases in one launch (DgradPhases; sm90/tile_scheduler.cuh's
// DgradPhaseTiles), their rows staged: each tile walks its phase's taps in
// its phase's im2col map of dy, and a phase no tap reaches stores zeros.
// Why: launched a phase at a time, each launch ramps up and drains on its
// own (four launches for a 3x3 at stride 2, of 1 to 4 taps a tile), and a
// 1x1 at stride 2 zeroes all of dx first, a quarter of it only to be
// written again; here every pixel of dx is written once, and the phases'
// tiles share one persistent grid.
template <class Element, class Tile>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    wgmma_dgrad_phases_kernel(const __grid_constant__ CUtensorMap w_map, const __grid_constant__ DgradPhases phases) {
  const auto load = [&](auto& shared, const BatchTile& tile, int, int, TilePipeline<Tile>& pipe) {
    load_conv_tile<ConvPass::kDgrad, Tile>(shared, &phases.dy_maps[tile.batch], &w_map, tile,
                                           phases.walk[tile.batch], pipe);
  };
  wgmma_block_over<Element, Tile, kConvAKMajor<ConvPass::kDgrad>, kConvBKMajor<ConvPass::kDgrad>, kBlockStagedRows>(
      DgradPhaseTiles<Tile>{phases}, nullptr, load);
}

// fprop that also writes its column moments (a kernel apart, so that the
// other passes' kernels keep their code).
template <class Element, class Tile>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    wgmma_fprop_moments_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                               const __grid_constant__ CUtensorMap d_map, const GemmParams p,
                               const WgmmaSchedule schedule, const ConvWalk walk) {
  wgmma_conv_block<Element, Tile, ConvPass::kFprop, kBlockColumnMoments>(a_map, b_map, d_map, p, schedule, walk);
}

// dgrad at stride 1 whose dx has a second term, p.addend (dx's type and
// layout), added to the sums before their one rounding: a ResNet block's
// input gradient, its first convolution's dgrad plus its residual's, with no
// pass of its own over dx (a kernel apart, so that the other passes' kernels
// keep their code).
template <class Element, class Tile>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    wgmma_dgrad_addend_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                              const __grid_constant__ CUtensorMap d_map, const GemmParams p,
                              const WgmmaSchedule schedule, const ConvWalk walk) {
  wgmma_conv_block<Element, Tile, ConvPass::kDgrad, kBlockAddend>(a_map, b_map, d_map, p, schedule, walk);
}

// fprop or wgrad of a few-channel convolution on its folded taps
// (conv/folded_taps.h), x's fold gathered by the producer's warpgroup into
// each stage (sm90/conv_gather_producer.cuh) instead of copied beforehand: p, walk
// and schedule those of the folded problem; `copied` its other operand's map
// (fprop: the folded filters; wgrad: dy); x read through `folded`, its
// output pixels `pixels` (N x P x Q).
template <class Element, class Tile, ConvPass Pass>
__global__ void __launch_bounds__(Tile::kThreads, 1)
    wgmma_gathered_fold_kernel(const __grid_constant__ CUtensorMap copied, const __grid_constant__ CUtensorMap d_map,
                               const GemmParams p, const WgmmaSchedule schedule, const ConvWalk walk,
                               const FoldedX folded, const int pixels) {
  static_assert(Pass != ConvPass::kDgrad, "dgrad does not fold");
  const auto load = [&](auto& shared, const BatchTile& tile, int, int, TilePipeline<Tile>& pipe) {
    const int thread = int(threadIdx.x);  // of the producer's warpgroup, the block's first
    if constexpr (Pass == ConvPass::kFprop)
      load_gathered_fprop_tile<Tile>(shared, &copied, tile, walk, folded, pixels, thread, pipe);
    else
      load_gathered_wgrad_tile<Tile>(shared, &copied, tile, walk, folded, pixels, thread, pipe);
  };
  wgmma_block<Element, Tile, kConvAKMajor<Pass>, kConvBKMajor<Pass>, kBlockGatheringProducer>(d_map, p, schedule,
                                                                                              walk.k_slices, load);
}

}  // namespace mpgemm::kernels::sm90
