// Which tile configuration, split of K and tile order a GEMM runs with: the
// table of configurations (derived from common/tile_configs.h), the problem's
// shape as the choice sees it, the heuristic that picks a plan per shape and
// device, and the per-process table of tuned choices that overrides it. Host
// code only, free of torch and CUDA, so that the CPU build (mpgemm.gemm_plan)
// and the launcher share one answer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/device_limits.h"
#include "common/gemm_params.h"
#include "common/tile_configs.h"

namespace mpgemm::kernels {

// One row of the table: a tile type's facts (common/tile_configs.h) as
// values, for the heuristic, the tuner and mpgemm.tile_configs().
struct TileConfigInfo {
  TileConfigId id;
  const char* name;
  const char* type;  // the tile's C++ type, as the kernels' names spell it
  int block_m, block_n, block_k, warp_m, warp_n, stages, threads, min_blocks_per_sm;
  int smem_bytes;      // dynamic shared memory of one block, whatever the operand layouts
  int min_arch;        // oldest compute capability (10 * major + minor) it is meant for
  int load_width;      // elements per global load it takes at the widest: 8 (16 bytes) or 1
  int narrowest_load;  // and at the narrowest: 8, 2 or 1
  int cluster_m;       // blocks per cluster, along M, that share B's copies (Hopper path)
  bool wgmma;          // a Hopper kernel's tile
  const char* schedule;  // a Hopper block's consumers: "cooperative" or "pingpong"; "" for WMMA
};

template <class Tile>
constexpr const char* tile_schedule() {
  if constexpr (Tile::kWgmma) return Tile::kSchedule == Consumers::kPingPong ? "pingpong" : "cooperative";
  else return "";
}

template <class Tile>
constexpr TileConfigInfo describe() {
  return {Tile::kId,     Tile::kName,     Tile::kType,           Tile::kBlockM,    Tile::kBlockN,
          Tile::kBlockK, Tile::kWarpM,    Tile::kWarpN,          Tile::kStages,    Tile::kThreads,
          Tile::kMinBlocksPerSM,          Tile::kSmemBytes,      Tile::kMinArch,   Tile::kWidestLoad,
          Tile::kNarrowestLoad,           Tile::kClusterM,       Tile::kWgmma,     tile_schedule<Tile>()};
}

template <class List>
struct TileTable;
template <class... Tiles>
struct TileTable<TileList<Tiles...>> {
  static constexpr TileConfigInfo kRows[] = {describe<Tiles>()...};
};

// Indexed by TileConfigId.
inline constexpr auto& kTileConfigs = TileTable<AllTiles>::kRows;

constexpr const TileConfigInfo& tile_config(TileConfigId id) { return kTileConfigs[int(id)]; }

constexpr bool is_wgmma(TileConfigId id) { return tile_config(id).wgmma; }

// Whether c's kernels run on operands that allow chunks of `vector` elements
// (8, 4, 2 or 1); they then load min(vector, load_width) at a time.
constexpr bool tile_takes_width(const TileConfigInfo& c, int vector) { return vector >= c.narrowest_load; }

// Whether device d runs the WMMA tile c's kernels on chunks of `vector`
// elements: its arch, a block's shared memory, the width.
constexpr bool wmma_tile_runs(const TileConfigInfo& c, const DeviceLimits& d, int vector) {
  return c.smem_bytes <= d.max_smem_per_block && c.min_arch <= d.arch && tile_takes_width(c, vector);
}

// The problem as the choice sees it. `vector`: the widest load, in elements,
// both operands allow (operand_load_width): 8 (16 bytes),
// 4 or 2 on the cp.async pipeline, 1 on the one-element path. `wgmma`: the
// Hopper kernels can take it: the tensor copy engine can describe both
// operands (16-byte aligned bases, row pitches and batch strides; sizes
// within its 32-bit coordinates), and D is fp32 or the inputs' type.
// `a_copies`, `b_copies` (wgmma false): they could take it once that many
// matrices of A (B) were copied to 16-byte aligned pitches, the rest
// allowing it: 0 for an operand read as it lies, 1 for one matrix (or one
// broadcast over the batch), else the batch.
struct GemmShape {
  int64_t batch = 1, m = 0, n = 0, k = 0;
  int vector = 8;
  bool wgmma = true;
  int64_t a_copies = 0, b_copies = 0;
};

// The shape of the problem `params` describes: its sizes, the load width of
// its operands as the launcher reads them, and whether the Hopper kernels
// could take it (the device aside).
GemmShape gemm_shape(const GemmParams& params);

// Which kernels MPGEMM_GEMM_PATH asks for: "auto" (or unset) lets the
// heuristic choose, "wgmma" takes the Hopper path wherever it can run,
// "wgmma_2x1" too on pairs of blocks that share B's copies,
// "wgmma_pingpong" on pairs whose consumers take tiles in turn,
// "wgmma_n128" and "wgmma_n64" on blocks alone over 128 x 128 and 128 x 64
// tiles, "wmma" never does. Throws std::invalid_argument for any other
// value.
enum class GemmPath : int { kAuto = 0, kWgmma, kWgmmaPair, kWgmmaPingPong, kWgmmaN128, kWgmmaN64, kWmma };
GemmPath gemm_path();

// Whether the plans of the Hopper GEMM and convolution may pick the narrow
// tiles (wgmma_n128, wgmma_n64) for outputs of at most 128 columns: yes
// unless MPGEMM_NARROW_TILES is "0" (the default since they passed the GPU
// tests and measured faster on an H100, 2026-11-28; unset, "" or "1": yes;
// throws std::invalid_argument for any other value).
bool narrow_tiles_enabled();

// The narrow Hopper tile for an output `n` columns wide made of `tiles_n128`
// 128 x 128 tiles (times the batch) on `multiprocessors`: wgmma_n64 for n
// of at most 64, or at most 128 where 128-column tiles fill at most half of
// the multiprocessors; wgmma_n128 for the rest up to 128; kCount (none)
// past 128 or where narrow_tiles_enabled() says no.
TileConfigId narrow_wgmma_tile(int64_t n, int64_t tiles_n128, int multiprocessors);

// Whether the plans of the GEMM may take the Hopper path for operands the
// copy engine cannot describe as they lie (odd leading dimensions), by
// first copying them to aligned pitches in the workspace (GemmPlan::padded):
// only where MPGEMM_PADDED_OPERANDS is "1" until that path has passed the
// GPU tests (unset, "" or "0": no; throws std::invalid_argument for any
// other value). The heuristic pads only where the copies pay
// (kPaddedCopyMinFlopsPerByte) or a Hopper kernel is forced.
bool padded_operands_enabled();

// The products a padded copy must buy, per byte it reads and writes: on an
// H100 (2d75062, 2026-11-28) the one-element WMMA path ran 4095x4097x4093
// at 0.56 of cuBLAS and the Hopper kernels near 0.98 on aligned shapes, so
// at cuBLAS's 660 TFLOP/s (1.5 µs a GFLOP) the Hopper path saves about 1.2
// µs a GFLOP, and a copy moves about 2.5 TB/s (0.4 µs a MB): it pays from
// about 345 FLOP a byte.
inline constexpr double kPaddedCopyMinFlopsPerByte = 350.0;

// How the plans of the GEMM split K on the Hopper block
// (wgmma_splitk_gemm_kernel; its kernels passed the GPU tests on an H200 at
// fe39419), by MPGEMM_WGMMA_SPLIT_K: unset or "", kWherePays (the default):
// where MPGEMM_GEMM_PATH leaves the choice to the heuristic and the split
// the cost model (plan/split_cost.h, kHopperGemmRates) gives the 128 x 256
// tile is modelled at least kWgmmaSplitMargin times as fast as the whole-K
// Hopper plan the rules would run; "1", kWhereSplit: wherever that model
// splits, whatever the whole-K plan, also with the wide tile forced (how
// bench/wgmma_check.py times the split beside the default); "0", kNever.
// Throws std::invalid_argument for any other value.
enum class WgmmaSplitK { kNever, kWherePays, kWhereSplit };
WgmmaSplitK wgmma_split_k_mode();

// How much faster than whole K the model must find a split before the
// default takes it: twice its root-mean-square error over the H200's 33
// kernel times (5%). The split's measured gains there were 1.17x to 2.16x
// where the model gave at least 1.2x, and 0.77x to 1.09x where it gave at
// most 1.08x (bench/NOTES.md, "Split-K on the Hopper block by default").
inline constexpr double kWgmmaSplitMargin = 1.1;

// Whether the GEMM has kernels on a tile: those common/tile_configs.h's
// GemmTiles lists (all but the convolutions' own tiles).
template <class... Tiles>
constexpr bool lists_tile(TileList<Tiles...>, TileConfigId id) {
  return ((Tiles::kId == id) || ...);
}
constexpr bool has_gemm_kernels(TileConfigId id) { return lists_tile(GemmTiles{}, id); }

// Whether the Hopper convolution's wgrad of at most 64 filters (and more
// than 128 columns) runs on the 64-row tile (wgmma_m64, consumers taking
// 64 x 256 tiles in turn) instead of a 128-row one that multiplies zeros
// over half its rows: only where MPGEMM_M64_TILE is "1" until its kernels
// have passed the GPU tests (unset, "" or "0": no; throws
// std::invalid_argument for any other value).
bool m64_tile_enabled();

// Whether a tile has split-K kernels: every WMMA tile, and of the Hopper
// tiles the 128 x 256 one on blocks alone (WgmmaTile).
constexpr bool has_split_kernels(TileConfigId id) { return !is_wgmma(id) || id == TileConfigId::kWgmma; }
// The Hopper tiles with stream-K kernels (sm90/stream_k.cuh): blocks alone
// on 128 x 256, 128 x 128 and 128 x 64 tiles.
constexpr bool has_stream_k_kernels(TileConfigId id) {
  return id == TileConfigId::kWgmma || id == TileConfigId::kWgmmaN128 || id == TileConfigId::kWgmmaN64;
}
template <class Tile>
inline constexpr bool kHasSplitKernels = has_split_kernels(Tile::kId);

// Split-K cuts K into at most this many ranges of whole slices, and a split
// gets at least kMinSlicesPerSplit slices, so that its share of the mainloop
// outweighs writing and reading back its fp32 partial tile (convolutions'
// wgrad too).
inline constexpr int kMaxSplitK = 16;
inline constexpr int kMinSlicesPerSplit = 4;
// Whether the plans of the GEMM may run the Hopper stream-K kernels
// (GemmPlan::stream_k_blocks) where stream_k_blocks (below) says they are
// faster: only where MPGEMM_STREAM_K is "1" until its kernels have passed
// the GPU tests (unset, "" or "0": no; throws std::invalid_argument for any
// other value).
bool stream_k_enabled();
// The tile a stream-K plan for `shape` runs on, by D's width: WgmmaTile
// (128 x 256) for more than 128 columns; for narrow outputs WgmmaN128Tile
// for 65 to 128 and WgmmaN64Tile for at most 64 (the narrowest tile that
// holds D's width: each slice then loads A's rows once); TileConfigId::kCount
// for a narrow output where narrow_tiles_enabled() says no.
TileConfigId stream_k_tile(const GemmShape& shape);
// Stream-K's cost model, in slices' time on one multiprocessor (unfitted:
// bench/NOTES.md, "Stream-K on the Hopper block" and "Stream-K on the
// narrow tiles"), on stream_k_tile's tiles: stream-K takes the longest run,
// ceil(tiles x slices / blocks), plus kStreamKFixUpSlices for each slot the
// block that ends a tile may read back (as many as the runs after the first
// that a tile of S slices can span: ceil((S - 1) / the shortest run); each
// a tile of fp32 sums from L2 against a slice's products: 128 KB against
// 4.2 MFLOP on the wide tile, a half or a quarter of both on the narrow
// ones), on min(multiprocessors, tiles x slices / kMinStreamKSlices)
// blocks. Whole K takes ceil(tiles / multiprocessors) waves of a tile's
// slices each, on the tile rule 0 would run: the same, but for 65 to 128
// columns whose 128 x 128 tiles fill at most half the multiprocessors,
// which run on 128 x 64 tiles, each of their slices kN64SliceCost of a 128
// x 128 one's time. It is planned where stream-K's is under kStreamKMaxCost
// of whole K's.
inline constexpr int kMinStreamKSlices = 4;
inline constexpr int kStreamKFixUpSlices = 2;
inline constexpr double kStreamKMaxCost = 0.9;
// A 128 x 64 tile's K slice in 128 x 128 slices' time: 0.56 and 0.83 on the
// two shapes that give it (H200, fe39419, whole K on each tile, its waves
// counted: 16384x128x4096 and 4096x128x4096; bench/NOTES.md, "Stream-K on
// the narrow tiles").
inline constexpr double kN64SliceCost = 0.7;
// The blocks a stream-K plan for `shape` on `device` (a single matrix on
// `tile`'s tiles, one with stream-K kernels) runs on: min(multiprocessors,
// slices / kMinStreamKSlices), 0 where that is under 2.
int stream_k_grid(const GemmShape& shape, const DeviceLimits& device, TileConfigId tile);
// Those blocks on `tile` (stream_k_tile's for `shape`) where the model
// above says stream-K is faster; else 0.
int stream_k_blocks(const GemmShape& shape, const DeviceLimits& device, TileConfigId tile);
// A stream-K plan's workspace of `blocks` slots on `tile`'s kernel: the
// partial sums (a tile of floats a block), then the flags (one per
// consumer of each block, 16-byte rounded).
size_t stream_k_partial_bytes(TileConfigId tile, int blocks);
size_t stream_k_flag_bytes(int blocks);

// Tiles walk in groups of at most this many tile rows (TileScheduler).
inline constexpr int kMaxRasterGroup = 8;

struct GemmPlan {
  TileConfigId config = TileConfigId::kSmall;
  int split_k = 1;       // K ranges summed by the reduction kernel; 1: none
  int raster_group = 1;  // tile rows per group of the tile order
  bool tuned = false;    // taken from the tuned table, not the heuristic
  bool padded = false;   // a Hopper plan on copies of the operands the shape marks (a_copies, b_copies)
  // A stream-K plan's blocks (on stream_k_tile's tile, the plan's config,
  // whole K, sm90/stream_k.cuh: each block an equal run of the tiles' K
  // slices), each a slot of partial sums in the workspace; 0: not stream-K.
  int stream_k_blocks = 0;
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
// The device workspace a plan needs: a padded plan's copies of A and then
// of B (each its shape's copies x its rows and columns rounded up to 8
// elements, 16-bit, rounded up to 256 bytes), then a split-K plan's fp32
// partial sums (split_k x m x n floats) or a stream-K plan's slots and
// flags (stream_k_partial_bytes and stream_k_flag_bytes); 0 for none.
size_t workspace_bytes(const GemmShape& shape, const GemmPlan& plan);
// Of those, the padded copies' (where the partial sums begin).
size_t padded_copy_bytes(const GemmShape& shape, const GemmPlan& plan);

// The tuned table: (batch, m, n, k) -> config, split_k and whether it ran
// stream-K (then on stream_k_grid's blocks of that config, where
// stream_k_enabled()), for this process.
void set_tuned_plan(const GemmShape& shape, TileConfigId config, int split_k, bool stream_k = false);
void clear_tuned_plans();

}  // namespace mpgemm::kernels
