// Which tile configuration, split of K and tile order a GEMM runs with: the
// one table of configurations (built from gemm_config.h), the heuristic that
// picks one per shape and device, and the per-process table of tuned choices
// that overrides it. Host code only, free of torch and CUDA, so the CPU build,
// the launcher and the host simulation all share one answer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gemm_config.h"
#include "wgmma_layout.h"

namespace mpgemm::kernels {

// What the choice needs to know of a device: how many multiprocessors a
// problem should fill, the most shared memory one block may opt into, and its
// compute capability (10 * major + minor). Zeros if the device cannot be asked.
struct DeviceLimits {
  int multiprocessors = 0;
  int max_smem_per_block = 0;
  int arch = 0;
};

// An H100 SXM: the profile used where no GPU can be asked.
inline constexpr DeviceLimits kH100Limits{132, 227 * 1024, 90};

enum class TileConfigId : int {
  kWide = 0, kTall, kSquare, kCompact, kSmall, kScalar, kWgmma, kWgmmaPair, kWgmmaPingPong, kCount
};

// One row of the table: a GemmTileConfig's numbers plus what the launcher and
// the heuristic need around them.
struct TileConfigInfo {
  TileConfigId id;
  const char* name;
  int block_m, block_n, block_k, warp_m, warp_n, stages, threads, min_blocks_per_sm;
  int smem_bytes;  // dynamic shared memory of one block, whatever the operand layouts
  int min_arch;    // oldest compute capability (10 * major + minor) it is meant for
  int load_width;  // elements per global load: 8 (16 bytes, aligned operands) or 1
  int cluster_m = 1;  // blocks per cluster, along M, that share B's copies (Hopper path)
};

// Shared memory of one block of Config, the largest over the operand layouts:
// kStages slices of A's and B's tiles, each shared row padded by 8 elements
// (tile_io.cuh's SmemTileShape), or the epilogue's fp32 strips if larger
// (WmmaSmem). gemm_tile_launch.cuh checks these figures against WmmaSmem itself.
template <class Config>
constexpr int tile_smem_bytes() {
  auto tile = [](int mn, int k, bool k_inner) { return k_inner ? mn * (k + 8) : k * (mn + 8); };
  int mainloop = 0;
  for (int a_k_inner = 0; a_k_inner < 2; ++a_k_inner)
    for (int b_k_inner = 0; b_k_inner < 2; ++b_k_inner) {
      const int stage = tile(Config::kBlockM, Config::kBlockK, a_k_inner) + tile(Config::kBlockN, Config::kBlockK, b_k_inner);
      mainloop = mainloop > stage ? mainloop : stage;
    }
  mainloop *= Config::kStages * 2;
  const int epilogue = Config::kWarpsM * Config::kWarpsN * Config::kFragment * (Config::kWarpN + 4) * 4;
  return mainloop > epilogue ? mainloop : epilogue;
}

template <class Config>
constexpr TileConfigInfo describe(TileConfigId id, const char* name, int min_arch, int load_width) {
  return {id,
          name,
          Config::kBlockM,
          Config::kBlockN,
          Config::kBlockK,
          Config::kWarpM,
          Config::kWarpN,
          Config::kStages,
          Config::kThreads,
          Config::kMinBlocksPerSM,
          tile_smem_bytes<Config>(),
          min_arch,
          load_width,
          1};
}

// The Hopper path's tiles (wgmma_gemm.cuh), on blocks alone or on pairs of
// blocks that share B's copies, under one consumer schedule: warp_m x warp_n
// is what one consumer's wgmmas cover, and threads count the producer
// warpgroup too.
template <sm90::Consumers kSplit>
constexpr TileConfigInfo describe_wgmma(TileConfigId id, const char* name, int cluster_m) {
  using C = sm90::WgmmaTileConfig<kSplit>;
  return {id, name, C::kBlockM, C::kBlockN, C::kBlockK, C::kInstrM, C::kInstrN, C::kStages, C::kThreads, 1,
          C::kSmemBytes, 90, 8, cluster_m};
}

// Indexed by TileConfigId. The 3-stage 64-deep tiles are for the cp.async
// pipeline of sm_80+ (and need more shared memory than sm_75 has); the
// Hopper tiles run on sm_90 alone (their code is sm_90a's): "wgmma" on
// blocks alone, "wgmma_2x1" on pairs, "wgmma_pingpong" on pairs whose
// consumers take 64-row tiles in turn.
inline constexpr TileConfigInfo kTileConfigs[] = {
    describe<WideTileConfig>(TileConfigId::kWide, "wide", 80, 8),
    describe<TallTileConfig>(TileConfigId::kTall, "tall", 80, 8),
    describe<SquareTileConfig>(TileConfigId::kSquare, "square", 80, 8),
    describe<CompactTileConfig>(TileConfigId::kCompact, "compact", 75, 8),
    describe<SmallTileConfig>(TileConfigId::kSmall, "small", 75, 8),
    describe<ScalarTileConfig>(TileConfigId::kScalar, "scalar", 75, 1),
    describe_wgmma<sm90::Consumers::kCooperative>(TileConfigId::kWgmma, "wgmma", 1),
    describe_wgmma<sm90::Consumers::kCooperative>(TileConfigId::kWgmmaPair, "wgmma_2x1", 2),
    describe_wgmma<sm90::Consumers::kPingPong>(TileConfigId::kWgmmaPingPong, "wgmma_pingpong", 2),
};
static_assert(sizeof(kTileConfigs) / sizeof(kTileConfigs[0]) == int(TileConfigId::kCount), "one row per id");

constexpr const TileConfigInfo& tile_config(TileConfigId id) { return kTileConfigs[int(id)]; }

constexpr bool is_wgmma(TileConfigId id) {
  return id == TileConfigId::kWgmma || id == TileConfigId::kWgmmaPair || id == TileConfigId::kWgmmaPingPong;
}

// Whether c's kernels run on operands that allow chunks of `vector` elements
// (8, 4, 2 or 1): the one-element tile on any; Square on 16-byte chunks
// alone (gemm_tile_launch.cuh's with_vector says why); the others on 8, 4 or 2.
constexpr bool tile_takes_width(const TileConfigInfo& c, int vector) {
  return c.load_width == 1 || (c.id == TileConfigId::kSquare ? vector == 8 : vector > 1);
}

// The table's min_arch for the configuration Config (0 if it is not listed).
template <class Config>
constexpr int tile_min_arch() {
  for (const TileConfigInfo& c : kTileConfigs)
    if (c.block_m == Config::kBlockM && c.block_n == Config::kBlockN && c.block_k == Config::kBlockK &&
        c.warp_m == Config::kWarpM && c.warp_n == Config::kWarpN && c.stages == Config::kStages)
      return c.min_arch;
  return 0;
}

// The problem as the choice sees it. `vector`: the widest load, in elements,
// both operands allow (gemm_launch.cu's operand_vector_width): 8 (16 bytes),
// 4 or 2 on the cp.async pipeline, 1 on the one-element path. `wgmma`: the
// Hopper kernels can take it: the tensor copy engine can describe both
// operands (16-byte aligned bases, row pitches and batch strides; sizes
// within its 32-bit coordinates), and D is fp32 or the inputs' type.
struct GemmShape {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  int vector = 8;
  bool wgmma = true;
};

// Which kernels MPGEMM_GEMM_PATH asks for: "auto" (or unset) lets the
// heuristic choose, "wgmma" takes the Hopper path wherever it can run,
// "wgmma_2x1" too on pairs of blocks that share B's copies,
// "wgmma_pingpong" on pairs whose consumers take tiles in turn, "wmma"
// never does. Throws std::invalid_argument for any other value.
enum class GemmPath : int { kAuto = 0, kWgmma, kWgmmaPair, kWgmmaPingPong, kWmma };
GemmPath gemm_path();

// Split-K cuts K into at most this many ranges of whole slices.
inline constexpr int kMaxSplitK = 16;
// Tiles walk in groups of at most this many tile rows (TileScheduler).
inline constexpr int kMaxRasterGroup = 8;

struct GemmPlan {
  TileConfigId config = TileConfigId::kSmall;
  int split_k = 1;       // K ranges summed by the reduction kernel; 1: none
  int raster_group = 1;  // tile rows per group of the tile order
  bool tuned = false;    // taken from the tuned table, not the heuristic
};

// The heuristic (see gemm_plan.cpp), overridden by a tuned entry for this
// exact shape where one is installed and admissible on `device`.
GemmPlan plan_gemm(const GemmShape& shape, const DeviceLimits& device);
// The heuristic alone.
GemmPlan heuristic_plan(const GemmShape& shape, const DeviceLimits& device);
// Whether `config` with `split_k` can run `shape` on `device`.
bool admissible(const GemmShape& shape, const DeviceLimits& device, TileConfigId config, int split_k);
// Every admissible (config, split_k) the tuner should time for `shape`.
std::vector<GemmPlan> candidate_plans(const GemmShape& shape, const DeviceLimits& device);
// fp32 partial sums of a split-K plan: split_k x m x n floats; 0 without split.
size_t workspace_bytes(const GemmShape& shape, const GemmPlan& plan);

// The tuned table: (batch, m, n, k) -> config and split_k, for this process.
void set_tuned_plan(const GemmShape& shape, TileConfigId config, int split_k);
void clear_tuned_plans();

}  // namespace mpgemm::kernels
