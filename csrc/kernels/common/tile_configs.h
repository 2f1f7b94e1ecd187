// Every tile configuration of the GEMM and convolution kernels, one type each,
// and the one place where a tile's facts live: its sizes, stages and warps,
// the oldest arch it is built for, the loads it takes, its shared memory, and
// on Hopper its cluster and consumer schedule. The kernels are templates over
// these types; the plan's runtime table (plan/gemm_plan.h), the launchers'
// dispatch (with_tile) and mpgemm.tile_configs() are derived from them.
#pragma once

namespace mpgemm::kernels {

enum class TileConfigId : int {
  kWide = 0, kTall, kSquare, kCompact, kSmall, kScalar, kWgmma, kWgmmaPair, kWgmmaPingPong, kWgmmaN128, kWgmmaN64,
  kWgmmaM64, kN16, kCount
};

// A tile of the WMMA kernels (wmma/): a block computes a kBlockM x kBlockN
// tile of D, stepping through K in slices of kBlockK that are staged through
// kStages shared-memory buffers. Its warps form a kWarpsM x kWarpsN grid; each
// owns a kWarpM x kWarpN tile held as 16x16 fp32 WMMA accumulator fragments.
// Below kMinArch its kernels are built empty (the launcher refuses them);
// they load chunks of kWidestLoad down to kNarrowestLoad elements, whichever
// the operands allow.
template <int BlockM, int BlockN, int BlockK, int WarpM, int WarpN, int Stages, int MinBlocksPerSM, int MinArch,
          int WidestLoad, int NarrowestLoad>
struct WmmaTileConfig {
  static constexpr int kBlockM = BlockM;
  static constexpr int kBlockN = BlockN;
  static constexpr int kBlockK = BlockK;
  static constexpr int kWarpM = WarpM;
  static constexpr int kWarpN = WarpN;
  static constexpr int kStages = Stages;
  // For __launch_bounds__: blocks that must fit on one multiprocessor at once,
  // which caps the registers per thread.
  static constexpr int kMinBlocksPerSM = MinBlocksPerSM;
  static constexpr int kMinArch = MinArch;  // 10 * major + minor
  static constexpr int kWidestLoad = WidestLoad, kNarrowestLoad = NarrowestLoad;
  static constexpr int kClusterM = 1;
  static constexpr bool kWgmma = false;

  static constexpr int kFragment = 16;  // WMMA m16n16k16
  static constexpr int kWarpsM = BlockM / WarpM;
  static constexpr int kWarpsN = BlockN / WarpN;
  static constexpr int kThreads = kWarpsM * kWarpsN * 32;
  static constexpr int kFragmentsM = WarpM / kFragment;
  static constexpr int kFragmentsN = WarpN / kFragment;

  // Shared memory of one block, the largest over the operand layouts: kStages
  // slices of A's and B's 16-bit tiles, each shared row padded by 8 elements
  // (wmma/smem_tile.cuh), or the epilogue's fp32 strips if larger
  // (wmma/block.cuh's WmmaSmem, which its launcher checks against this).
  static constexpr int padded_tile(int mn, int k, bool k_major) { return k_major ? mn * (k + 8) : k * (mn + 8); }
  static constexpr int stage_elements(bool a_k_major, bool b_k_major) {
    return padded_tile(BlockM, BlockK, a_k_major) + padded_tile(BlockN, BlockK, b_k_major);
  }
  static constexpr int max2(int a, int b) { return a > b ? a : b; }
  static constexpr int kSmemBytes =
      max2(Stages * 2 * max2(max2(stage_elements(true, true), stage_elements(true, false)),
                             max2(stage_elements(false, true), stage_elements(false, false))),
           kWarpsM * kWarpsN * kFragment * (WarpN + 4) * 4);

  static_assert(BlockM % WarpM == 0 && BlockN % WarpN == 0, "warps must tile the block");
  static_assert(WarpM % kFragment == 0 && WarpN % kFragment == 0, "fragments must tile the warp");
  static_assert(BlockK % kFragment == 0, "the K slice must be whole fragments");
  static_assert(Stages >= 2, "the pipeline needs at least two stages");
  static_assert(NarrowestLoad <= WidestLoad, "loads from the widest down to the narrowest");
};

// How a Hopper block's consumers share its work, as CUTLASS's two sm90
// schedules do. Cooperative: a 128 x 256 tile, each consumer taking 64 of its
// rows, so both read every stage and both store at once while no wgmma runs.
// Ping-pong: 64 x 256 tiles, each consumer taking every other tile of the
// block whole, so that one consumer's epilogue runs while the other's wgmmas
// keep the Tensor Cores busy; the ring holds the tiles' slices in order, so
// the two mainloops must take turns (sm90/mainloop.cuh).
enum class Consumers : int { kCooperative = 0, kPingPong = 1 };

// What every Hopper block holds (sm90/), whatever its tile: kConsumers
// warpgroups that each issue 64 x N x 16 wgmmas (one instruction spans the
// tile's width, N = the tile's kBlockN) into 64 x N fp32 accumulators, one
// more warpgroup that issues the copies, and a ring of stages of
// kBlockK-deep K slices.
struct WgmmaBlockConfig {
  static constexpr int kConsumers = 2;
  static constexpr int kWarpgroupThreads = 128;
  static constexpr int kThreads = kWarpgroupThreads * (kConsumers + 1);
  static constexpr int kInstrM = 64, kInstrK = 16;
  static constexpr int kBlockK = 64;
  // Registers per thread after setmaxnreg: the producer gives up what the
  // consumers' accumulators (up to 128: 64 x 256 fp32 over 128 threads) need.
  // setmaxnreg moves registers within the block's own allocation, what the
  // launch gave each of its threads (kLaunchRegisters, 64K shared by the
  // block's 384 threads in multiples of 8): a consumer asking for more than
  // the others gave back would wait for them forever.
  static constexpr int kLaunchRegisters = 65536 / kThreads / 8 * 8;
  static constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;
  // Where the producer's threads gather an operand themselves
  // (sm90/conv_gather_producer.cuh), each holds two groups of rows'
  // loads in flight: more for the producer, what is left for the consumers.
  static constexpr int kGatherProducerRegisters = 88, kGatherConsumerRegisters = 208;
  // Each consumer stages its output in kOutputBuffers strips of 64 rows by
  // 128 bytes (sm90/layout.h's OutputStrip), so that it writes one while the
  // copy engine stores the other.
  static constexpr int kOutputBuffers = 2, kOutputStripBytes = kInstrM * 128;
  // The shared memory a block may have (227 KB on sm_90), and the ring's
  // deepest: more stages than this hide no more of the copies' latency.
  static constexpr int kMaxSmemBytes = 227 * 1024, kMaxStages = 8;
  static_assert(kProducerRegisters + kConsumerRegisters * kConsumers <= kLaunchRegisters * (kConsumers + 1),
                "the block's allocation holds every warpgroup's");
  static_assert(kGatherProducerRegisters + kGatherConsumerRegisters * kConsumers <=
                    kLaunchRegisters * (kConsumers + 1),
                "the block's allocation holds every warpgroup's");
};

// A Hopper tile: a block's tile and shared memory under one consumer
// schedule, on blocks alone (ClusterM = 1) or on clusters of ClusterM blocks
// stacked along M that multicast B's copies into each other, BlockN columns
// wide: 256, or 128 and 64 for narrow outputs (GEMMs and convolutions
// whose N is at most 128, where a 256-column wgmma would multiply zeros
// over half or three quarters of its columns).
template <Consumers Schedule, int ClusterM, int BlockN = 256>
struct WgmmaTileConfig : WgmmaBlockConfig {
  static constexpr Consumers kSchedule = Schedule;
  static constexpr bool kPingPong = Schedule == Consumers::kPingPong;
  static constexpr int kClusterM = ClusterM;
  static constexpr int kBlockM = kPingPong ? kInstrM : kConsumers * kInstrM;
  static constexpr int kBlockN = BlockN, kInstrN = BlockN;
  // What one consumer's wgmmas cover, and its fp32 accumulators per thread.
  static constexpr int kWarpM = kInstrM, kWarpN = kInstrN;
  static constexpr int kAccumulators = kInstrM * kInstrN / kWarpgroupThreads;
  // The copy engine loads boxes of any extent from 16-byte aligned bases and
  // pitches (GemmShape::wgmma says which operands): the operands' own chunk
  // width, from 8 elements down to 1 (an odd K), does not matter to it.
  static constexpr int kMinBlocksPerSM = 1, kMinArch = 90, kWidestLoad = 8, kNarrowestLoad = 1;
  static constexpr bool kWgmma = true;
  // Consumers of a block that read each stage: the arrivals its `empty` barrier takes from each block.
  static constexpr int kStageReaders = kPingPong ? 1 : kConsumers;
  // As many stages of A's and B's tiles as the block's shared memory holds
  // beside the output strips, the stages' mbarriers (two each) and an atom
  // of slack to align the dynamic shared memory (only 16-byte aligned) to
  // 1024, up to kMaxStages: 4 of 48 KB for 128 x 256 tiles (225 of the 227
  // KB), 4 of 40 for ping-pong's 64 x 256 (193: a 5th would need 233), 6 of
  // 32 for 128 x 128, 8 of 24 for 128 x 64.
  static constexpr int kStageBytes = (kBlockM + kBlockN) * kBlockK * 2;
  static constexpr int kFixedBytes = kConsumers * kOutputBuffers * kOutputStripBytes + 1024;
  static constexpr int kFitStages = (kMaxSmemBytes - kFixedBytes - 2 * kMaxStages * 8) / kStageBytes;
  static constexpr int kStages = kFitStages < kMaxStages ? kFitStages : kMaxStages;
  static constexpr int kSmemBytes = kStages * kStageBytes + kFixedBytes + 2 * kStages * 8;
  static_assert(kSmemBytes <= kMaxSmemBytes, "a block's shared memory holds the ring and the output strips");
  static_assert(kStages >= 2, "the ring needs at least two stages");
  static_assert(BlockN == 256 || BlockN == 128 || BlockN == 64, "wgmma widths the kernels issue");
  static_assert(ClusterM == 1 || ClusterM == 2, "blocks alone or in pairs");
};

// Names a tile configuration: its id, the name plans, tuning caches and
// mpgemm.tile_configs() use, and the type (which kernel names spell).
#define MPGEMM_TILE_CONFIG(Type, Id, Name, ...)                   \
  struct Type : __VA_ARGS__ {                                     \
    static constexpr TileConfigId kId = TileConfigId::Id;         \
    static constexpr const char* kName = Name;                    \
    static constexpr const char* kType = #Type;                   \
  }

// Large problems on sm_80 and newer: 8 warps of 64x64 (so each fragment loaded
// from shared memory feeds four mma_sync), K slices of 64 (whose 144-byte
// shared rows keep both the cp.async stores and the ldmatrix loads free of
// bank conflicts), 3 stages: 162 to 166 KB of shared memory, one block per SM.
// On sm_75's register-staged path they would spill, and its shared memory
// holds none of them.
MPGEMM_TILE_CONFIG(WideTile, kWide, "wide", WmmaTileConfig<128, 256, 64, 64, 64, 3, 1, 80, 8, 2>);
MPGEMM_TILE_CONFIG(TallTile, kTall, "tall", WmmaTileConfig<256, 128, 64, 64, 64, 3, 1, 80, 8, 2>);
// 4 warps of 64x64 over 128x128, 111 KB: two blocks per SM where shared
// memory holds them (sm_90), for problems with too few tiles for the above.
// 16-byte chunks alone: its sm_75 build (register-staged) already takes 255
// registers and would spill with the 4x more load addresses of narrower ones.
MPGEMM_TILE_CONFIG(SquareTile, kSquare, "square", WmmaTileConfig<128, 128, 64, 64, 64, 3, 2, 80, 8, 8>);
// Devices with 64 to 100 KB of shared memory per block (sm_75, sm_86, sm_89):
// 8 warps of 64x32 over 128x128, K slices of 32, 60 KB in 3 stages.
MPGEMM_TILE_CONFIG(CompactTile, kCompact, "compact", WmmaTileConfig<128, 128, 32, 64, 32, 3, 1, 75, 8, 2>);
// 4 warps of 32x32 over a 64x64 tile: more blocks for problems too small to
// fill the GPU with larger tiles.
MPGEMM_TILE_CONFIG(SmallTile, kSmall, "small", WmmaTileConfig<64, 64, 64, 32, 32, 3, 1, 75, 8, 2>);
// One-element loads (unaligned or gathered operands) take 16-deep slices: half
// the chunks per thread keeps their addresses in registers. Only the
// register-staged double buffer runs here, so two stages.
MPGEMM_TILE_CONFIG(ScalarTile, kScalar, "scalar", WmmaTileConfig<64, 64, 16, 32, 32, 2, 1, 75, 1, 1>);
// Hopper (sm_90a code, sm_90 devices): blocks alone, pairs of blocks that
// share B's copies, and pairs whose consumers take 64-row tiles in turn.
MPGEMM_TILE_CONFIG(WgmmaTile, kWgmma, "wgmma", WgmmaTileConfig<Consumers::kCooperative, 1>);
MPGEMM_TILE_CONFIG(WgmmaPairTile, kWgmmaPair, "wgmma_2x1", WgmmaTileConfig<Consumers::kCooperative, 2>);
MPGEMM_TILE_CONFIG(WgmmaPingPongTile, kWgmmaPingPong, "wgmma_pingpong", WgmmaTileConfig<Consumers::kPingPong, 2>);
// Narrow outputs (N of at most 128 or 64): blocks alone on 128 x 128 and
// 128 x 64 tiles, their rings deeper (6 and 8 stages) since each slice's
// wgmmas are shorter.
MPGEMM_TILE_CONFIG(WgmmaN128Tile, kWgmmaN128, "wgmma_n128", WgmmaTileConfig<Consumers::kCooperative, 1, 128>);
MPGEMM_TILE_CONFIG(WgmmaN64Tile, kWgmmaN64, "wgmma_n64", WgmmaTileConfig<Consumers::kCooperative, 1, 64>);
// Outputs of at most 64 rows and more than 128 columns (the Hopper
// convolution's wgrad of at most 64 filters, whose 128-row tiles multiply
// zeros over half their rows): blocks alone, whose consumers take 64 x 256
// tiles in turn (ping-pong), 4 stages of 40 KB. The convolution's wgrad
// alone has its kernels (sm90/conv_kernels_m64.cu).
MPGEMM_TILE_CONFIG(WgmmaM64Tile, kWgmmaM64, "wgmma_m64", WgmmaTileConfig<Consumers::kPingPong, 1>);
// Convolutions whose GEMM is at most 16 columns wide (fprop of at most 16
// filters per group, dgrad of at most 16 channels per group: grouped
// layers such as ResNeXt's, a few-channel first layer's dgrad, a last
// layer's 1 to 16 outputs), where every WMMA tile above, 64 or 128 columns
// wide, multiplies zeros over three quarters or more of its columns: 4
// warps of 32 x 16 over 128 x 16, K slices of 64 (the narrowest a
// 16-column B tile divides among 128 threads in 16-byte chunks), 3 stages
// of 21 KB (three blocks a multiprocessor on sm_90, two on sm_80, one on
// sm_86 and sm_89), 8- and 4-element chunks, registers for three blocks
// (its gathers' addresses take 134 to 166 a thread on sm_90a). Each A
// fragment feeds one product, so these kernels are bound by the gathers of
// A, not the Tensor Cores (bench/NOTES.md). From sm_80 on: sm_75's
// register-staged pipeline would spill at that bound. The convolution's
// fprop and dgrad alone have its kernels (conv/launch.cu), which run where
// MPGEMM_CONV_N16_TILE asks (conv/launch.h's n16_tile).
MPGEMM_TILE_CONFIG(N16Tile, kN16, "n16", WmmaTileConfig<128, 16, 64, 32, 16, 3, 3, 80, 8, 4>);

#undef MPGEMM_TILE_CONFIG

// The mma.sync ceiling (wmma/mma_ceiling.cu) runs the warps of the tile that
// large GEMMs run, so it bounds what that tile's instruction mix can reach.
using MmaCeilingTile = WideTile;

// A list of tile types, and dispatch over one.
template <class... Tiles>
struct TileList {
  static constexpr int kSize = sizeof...(Tiles);
};

// Every tile, in the order of TileConfigId.
using AllTiles = TileList<WideTile, TallTile, SquareTile, CompactTile, SmallTile, ScalarTile, WgmmaTile,
                          WgmmaPairTile, WgmmaPingPongTile, WgmmaN128Tile, WgmmaN64Tile, WgmmaM64Tile, N16Tile>;
// The tiles the GEMM has kernels of: all but the convolution's own (wgrad's
// 64-row Hopper tile, fprop's and dgrad's 16-column WMMA tile).
using GemmTiles = TileList<WideTile, TallTile, SquareTile, CompactTile, SmallTile, ScalarTile, WgmmaTile,
                           WgmmaPairTile, WgmmaPingPongTile, WgmmaN128Tile, WgmmaN64Tile>;

template <class... Tiles>
constexpr bool listed_in_id_order(TileList<Tiles...>) {
  int index = 0;
  return ((int(Tiles::kId) == index++) && ...);
}
static_assert(AllTiles::kSize == int(TileConfigId::kCount) && listed_in_id_order(AllTiles{}),
              "AllTiles lists every tile once, in the order of TileConfigId");

// f(Tile{}) for the tile of `id` among List's; `otherwise` where List has none.
template <class... Tiles, class F, class R>
R with_tile(TileList<Tiles...>, TileConfigId id, F&& f, R otherwise) {
  R result = otherwise;
  (void)((id == Tiles::kId ? (result = f(Tiles{}), true) : false) || ...);
  return result;
}

}  // namespace mpgemm::kernels
