// Tile configurations of the WMMA GEMM: the one place where tile sizes live.
#pragma once

namespace mpgemm::kernels {

// A block computes a kBlockM x kBlockN tile of D, stepping through K in slices
// of kBlockK that are staged through kStages shared-memory buffers. Its warps
// form a kWarpsM x kWarpsN grid; each owns a kWarpM x kWarpN tile held as
// 16x16 fp32 WMMA accumulator fragments.
template <int BlockM, int BlockN, int BlockK, int WarpM, int WarpN, int Stages, int MinBlocksPerSM = 1>
struct GemmTileConfig {
  static constexpr int kBlockM = BlockM;
  static constexpr int kBlockN = BlockN;
  static constexpr int kBlockK = BlockK;
  static constexpr int kWarpM = WarpM;
  static constexpr int kWarpN = WarpN;
  static constexpr int kStages = Stages;
  // For __launch_bounds__: blocks that must fit on one multiprocessor at once,
  // which caps the registers per thread.
  static constexpr int kMinBlocksPerSM = MinBlocksPerSM;

  static constexpr int kFragment = 16;  // WMMA m16n16k16
  static constexpr int kWarpsM = BlockM / WarpM;
  static constexpr int kWarpsN = BlockN / WarpN;
  static constexpr int kThreads = kWarpsM * kWarpsN * 32;
  static constexpr int kFragmentsM = WarpM / kFragment;
  static constexpr int kFragmentsN = WarpN / kFragment;

  static_assert(BlockM % WarpM == 0 && BlockN % WarpN == 0, "warps must tile the block");
  static_assert(WarpM % kFragment == 0 && WarpN % kFragment == 0, "fragments must tile the warp");
  static_assert(BlockK % kFragment == 0, "the K slice must be whole fragments");
  static_assert(Stages >= 2, "the pipeline needs at least two stages");
};

// Large problems on sm_80 and newer: 8 warps of 64x64 (so each fragment loaded
// from shared memory feeds four mma_sync), K slices of 64 (whose 144-byte
// shared rows keep both the cp.async stores and the ldmatrix loads free of
// bank conflicts), 3 stages: 162 to 166 KB of shared memory, one block per SM.
using WideTileConfig = GemmTileConfig<128, 256, 64, 64, 64, 3>;
using TallTileConfig = GemmTileConfig<256, 128, 64, 64, 64, 3>;
// 4 warps of 64x64 over 128x128, 111 KB: two blocks per SM where shared
// memory holds them (sm_90), for problems with too few tiles for the above.
using SquareTileConfig = GemmTileConfig<128, 128, 64, 64, 64, 3, 2>;
// 4 warps of 32x32 over a 64x64 tile: more blocks for problems too small to
// fill the GPU with larger tiles.
using SmallTileConfig = GemmTileConfig<64, 64, 64, 32, 32, 3>;
// Devices with 64 to 100 KB of shared memory per block (sm_75, sm_86, sm_89):
// 8 warps of 64x32 over 128x128, K slices of 32, 60 KB in 3 stages.
using CompactTileConfig = GemmTileConfig<128, 128, 32, 64, 32, 3>;
// One-element loads (unaligned or gathered operands) take 16-deep slices: half
// the chunks per thread keeps their addresses in registers. Only the
// register-staged double buffer runs here, so two stages.
using ScalarTileConfig = GemmTileConfig<64, 64, 16, 32, 32, 2>;
// The mma.sync ceiling (mma_ceiling.cu) runs the warps of the tile that large
// GEMMs run, so it bounds what that tile's instruction mix can reach.
using MmaCeilingConfig = WideTileConfig;

}  // namespace mpgemm::kernels
