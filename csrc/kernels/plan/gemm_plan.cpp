// The tile choice of the GEMM (plan/gemm_plan.h): the problem's shape,
// heuristic, admissibility and the tuned table.
#include "plan/gemm_plan.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <map>
#include <optional>
#include <mutex>
#include <tuple>

#include "common/math.h"
#include "plan/operand_layout.h"
#include "plan/split_cost.h"
#include "plan/switches.h"

namespace mpgemm::kernels {
namespace {

int64_t tiles(const TileConfigInfo& c, const GemmShape& s) {
  return ceil_div(s.m, c.block_m) * ceil_div(s.n, c.block_n);
}

int64_t slices(const TileConfigInfo& c, int64_t k) { return ceil_div(k, c.block_k); }

bool fits_device(const TileConfigInfo& c, const GemmShape& s, const DeviceLimits& d) {
  // sm_90a code runs on compute capability 9.0 alone; the kernels need
  // operands the copy engine can describe (as they lie, or where
  // padded_operands_enabled once copied: GemmShape::wgmma, a_copies,
  // b_copies) and D of the ops' own types, and at least one K slice.
  if (is_wgmma(c.id))
    return gemm_path() != GemmPath::kWmma && d.arch == 90 && c.smem_bytes <= d.max_smem_per_block &&
           (s.wgmma || ((s.a_copies || s.b_copies) && padded_operands_enabled())) && s.k > 0 &&
           d.multiprocessors >= c.cluster_m;
  return wmma_tile_runs(c, d, s.vector);
}

// Groups of up to kMaxRasterGroup tile rows (of cluster tiles on the paired
// Hopper path): blocks running together then share A's rows and B's columns
// in L2 (TileScheduler).
int raster_group(const TileConfigInfo& c, const GemmShape& s) {
  return int(std::clamp<int64_t>(ceil_div(s.m, int64_t(c.block_m) * c.cluster_m), 1, kMaxRasterGroup));
}

GemmPlan make_plan(TileConfigId id, const GemmShape& s, int split_k, bool tuned) {
  return {id, split_k, raster_group(tile_config(id), s), tuned, is_wgmma(id) && !s.wgmma};
}

// Whether copying the operands the shape marks to aligned pitches costs
// less than the Hopper path saves (kPaddedCopyMinFlopsPerByte).
bool padded_copies_pay(const GemmShape& s) {
  const double copied =
      double(s.a_copies) * double(s.m) * double(s.k) + double(s.b_copies) * double(s.k) * double(s.n);
  const double bytes = 2.0 * 2.0 * copied;  // read and written, 2 bytes each
  return 2.0 * double(s.batch) * double(s.m) * double(s.n) * double(s.k) >= kPaddedCopyMinFlopsPerByte * bytes;
}

struct TunedKey {
  int64_t batch, m, n, k;
  bool operator<(const TunedKey& o) const { return std::tie(batch, m, n, k) < std::tie(o.batch, o.m, o.n, o.k); }
};
struct TunedValue {
  TileConfigId config;
  int split_k;
  bool stream_k;
};

std::mutex tuned_mutex;
std::map<TunedKey, TunedValue> tuned_plans;
std::atomic<bool> any_tuned{false};  // spares launches the lock while the table is empty

}  // namespace

GemmShape gemm_shape(const GemmParams& p) {
  const MatrixRuns a = matrix_runs(p.m, p.k, {p.a_batch_stride, p.a_row_stride, p.a_col_stride, false});
  const MatrixRuns b = matrix_runs(p.k, p.n, {p.b_batch_stride, p.b_row_stride, p.b_col_stride, false});
  // One width for both operands: the narrower one's.
  const int vector =
      std::min(operand_load_width(p.a, p.a_batch_stride, a), operand_load_width(p.b, p.b_batch_stride, b));
  // The Hopper kernels store D in fp32 or the inputs' type only (sm90/epilogue.cuh's store_accumulators).
  const bool rest = (p.d_type == ElementType::kFloat32 || p.d_type == p.ab_type) &&
                    std::max({p.batch, p.m, p.n, p.k}) <= INT_MAX;
  const bool a_described = tma_describable(p.a, 2, p.batch, p.a_batch_stride, a.ld, a.inner, a.outer);
  const bool b_described = tma_describable(p.b, 2, p.batch, p.b_batch_stride, b.ld, b.inner, b.outer);
  // A copy row by row needs rows that do not overlap.
  const bool paddable = rest && (a_described || a.ld >= a.inner) && (b_described || b.ld >= b.inner);
  const bool wgmma = rest && a_described && b_described;
  const auto copies = [&](bool described, int64_t batch_stride) -> int64_t {
    return wgmma || !paddable || described ? 0 : batch_stride == 0 ? 1 : p.batch;
  };
  return {p.batch, p.m, p.n, p.k, vector, wgmma, copies(a_described, p.a_batch_stride),
          copies(b_described, p.b_batch_stride)};
}

bool padded_operands_enabled() { return switch_on("MPGEMM_PADDED_OPERANDS", false); }

GemmPath gemm_path() {
  const char* path = std::getenv("MPGEMM_GEMM_PATH");
  if (path == nullptr || *path == '\0' || std::strcmp(path, "auto") == 0) return GemmPath::kAuto;
  if (std::strcmp(path, "wgmma") == 0) return GemmPath::kWgmma;
  if (std::strcmp(path, "wgmma_2x1") == 0) return GemmPath::kWgmmaPair;
  if (std::strcmp(path, "wgmma_pingpong") == 0) return GemmPath::kWgmmaPingPong;
  if (std::strcmp(path, "wgmma_n128") == 0) return GemmPath::kWgmmaN128;
  if (std::strcmp(path, "wgmma_n64") == 0) return GemmPath::kWgmmaN64;
  if (std::strcmp(path, "wmma") == 0) return GemmPath::kWmma;
  throw std::invalid_argument(
      std::string("MPGEMM_GEMM_PATH must be 'auto', 'wgmma', 'wgmma_2x1', 'wgmma_pingpong', 'wgmma_n128', "
                  "'wgmma_n64' or 'wmma', got '") +
      path + "'");
}

bool narrow_tiles_enabled() { return switch_on("MPGEMM_NARROW_TILES", true); }

TileConfigId narrow_wgmma_tile(int64_t n, int64_t tiles_n128, int multiprocessors) {
  if (!narrow_tiles_enabled() || n > tile_config(TileConfigId::kWgmmaN128).block_n) return TileConfigId::kCount;
  if (n <= tile_config(TileConfigId::kWgmmaN64).block_n || tiles_n128 * 2 <= multiprocessors)
    return TileConfigId::kWgmmaN64;
  return TileConfigId::kWgmmaN128;
}

WgmmaSplitK wgmma_split_k_mode() {
  const std::optional<bool> setting = switch_setting("MPGEMM_WGMMA_SPLIT_K");
  if (!setting) return WgmmaSplitK::kWherePays;
  return *setting ? WgmmaSplitK::kWhereSplit : WgmmaSplitK::kNever;
}

bool m64_tile_enabled() { return switch_on("MPGEMM_M64_TILE", false); }

bool stream_k_enabled() { return switch_on("MPGEMM_STREAM_K", false); }

TileConfigId stream_k_tile(const GemmShape& s) {
  const TileConfigInfo& n128 = tile_config(TileConfigId::kWgmmaN128);
  if (s.n > n128.block_n) return TileConfigId::kWgmma;
  if (!narrow_tiles_enabled()) return TileConfigId::kCount;
  return s.n <= tile_config(TileConfigId::kWgmmaN64).block_n ? TileConfigId::kWgmmaN64 : TileConfigId::kWgmmaN128;
}

int stream_k_grid(const GemmShape& s, const DeviceLimits& d, TileConfigId tile) {
  const TileConfigInfo& c = tile_config(tile);
  const int64_t blocks = std::min<int64_t>(d.multiprocessors, tiles(c, s) * slices(c, s.k) / kMinStreamKSlices);
  return s.batch == 1 && blocks > 1 ? int(blocks) : 0;
}

namespace {

// Whole K's time in `tile`'s slices on one multiprocessor: its waves on
// the tile rule 0 runs (plan/gemm_plan.h's cost model).
double whole_k_slices(const GemmShape& s, const DeviceLimits& d, TileConfigId tile) {
  const TileConfigId whole =
      tile == TileConfigId::kWgmmaN128
          ? narrow_wgmma_tile(s.n, tiles(tile_config(TileConfigId::kWgmmaN128), s), d.multiprocessors)
          : tile;
  const TileConfigInfo& c = tile_config(whole);
  const double waves = double(ceil_div(tiles(c, s), int64_t(d.multiprocessors)) * slices(c, s.k));
  return whole == tile ? waves : waves * kN64SliceCost;
}

}  // namespace

int stream_k_blocks(const GemmShape& s, const DeviceLimits& d, TileConfigId tile) {
  const int64_t blocks = stream_k_grid(s, d, tile);
  if (blocks == 0) return 0;
  const TileConfigInfo& c = tile_config(tile);
  const int64_t total = tiles(c, s) * slices(c, s.k), tile_slices = slices(c, s.k);
  const int64_t run = ceil_div(total, blocks), shortest_run = total / blocks;
  // The most slots a block that ends a tile reads back: the runs before its own that a tile can span.
  const int64_t slots_read = std::min<int64_t>(ceil_div(tile_slices - 1, shortest_run), blocks - 1);
  const double stream_k = double(run + kStreamKFixUpSlices * slots_read);
  return stream_k < kStreamKMaxCost * whole_k_slices(s, d, tile) ? int(blocks) : 0;
}

size_t stream_k_partial_bytes(TileConfigId tile, int blocks) {
  const TileConfigInfo& c = tile_config(tile);
  return size_t(blocks) * size_t(c.block_m) * size_t(c.block_n) * sizeof(float);
}

size_t stream_k_flag_bytes(int blocks) {
  return size_t(round_up(int64_t(blocks) * WgmmaBlockConfig::kConsumers * int64_t(sizeof(int)), 16));
}

bool admissible(const GemmShape& s, const DeviceLimits& d, TileConfigId id, int split_k) {
  if (int(id) < 0 || id >= TileConfigId::kCount || !has_gemm_kernels(id) || split_k < 1 || split_k > kMaxSplitK)
    return false;
  const TileConfigInfo& c = tile_config(id);
  // Split-K runs single matrices only, on the tiles that have its kernels
  // (on the Hopper path unless wgmma_split_k_mode is kNever). A split with no K
  // slice (more splits than slices, or on the Hopper kernel's ceil(slices /
  // split_k) a split, none left for the last) is correct, only wasteful:
  // candidate_plans leaves it out.
  return fits_device(c, s, d) &&
         (split_k == 1 || (s.batch == 1 && has_split_kernels(id) &&
                           (!is_wgmma(id) || wgmma_split_k_mode() != WgmmaSplitK::kNever)));
}

namespace {

// Rules 1 to 3: the WMMA tiles.
GemmPlan wmma_heuristic_plan(const GemmShape& s, const DeviceLimits& d) {
  TileConfigId id = TileConfigId::kScalar;
  if (s.vector > 1) {
    id = TileConfigId::kSmall;
    const TileConfigId large = s.m > s.n ? TileConfigId::kTall : TileConfigId::kWide;
    for (TileConfigId candidate : {large, TileConfigId::kSquare, TileConfigId::kCompact}) {
      const TileConfigInfo& c = tile_config(candidate);
      if (fits_device(c, s, d) && tiles(c, s) * s.batch >= d.multiprocessors) {
        id = candidate;
        break;
      }
    }
  }
  const TileConfigInfo& c = tile_config(id);
  int split_k = 1;
  const int64_t n_tiles = tiles(c, s);
  if (s.batch == 1 && n_tiles > 0 && n_tiles * 2 <= d.multiprocessors &&
      slices(c, s.k) >= 2 * kMinSlicesPerSplit) {
    split_k = int(std::min<int64_t>({ceil_div(d.multiprocessors, n_tiles), slices(c, s.k) / kMinSlicesPerSplit,
                                     kMaxSplitK}));
  }
  return make_plan(id, s, split_k, false);
}

// A single matrix's K on one of the Hopper GEMM's tiles, as the split cost
// model sees it with the rates fitted to that GEMM (kHopperGemmRates).
SplitProblem hopper_split_problem(const GemmShape& s, const DeviceLimits& d, TileConfigId id) {
  SplitProblem split;
  split.tile = tile_config(id);
  split.tiles = tiles(split.tile, s);
  split.slices = slices(split.tile, s.k);
  split.multiprocessors = d.multiprocessors;
  split.output_elements = s.m * s.n;
  split.max_splits = kMaxSplitK;
  split.rates = kHopperGemmRates;
  return split;
}

// Whether `splits` ways of `split`, K on the 128 x 256 tile, beat `whole`,
// a whole-K plan of the rules, by kWgmmaSplitMargin in the model: only a
// Hopper plan of whole K on that tile or on ping-pong's, the tiles the
// model was fitted to (WMMA's plan is kept).
bool wgmma_split_pays(const GemmShape& s, const DeviceLimits& d, const GemmPlan& whole, const SplitProblem& split,
                      int splits) {
  if (whole.split_k != 1 || (whole.config != TileConfigId::kWgmma && whole.config != TileConfigId::kWgmmaPingPong))
    return false;
  const double whole_ns = split_cost_ns(hopper_split_problem(s, d, whole.config), 1);
  return whole_ns >= kWgmmaSplitMargin * split_cost_ns(split, splits);
}

// The Hopper tile `path` runs: the one it forces, the wide one for kAuto
// and kWgmma (and for kWmma, which runs none).
TileConfigId hopper_tile_of(GemmPath path) {
  switch (path) {
    case GemmPath::kWgmmaPair: return TileConfigId::kWgmmaPair;
    case GemmPath::kWgmmaPingPong: return TileConfigId::kWgmmaPingPong;
    case GemmPath::kWgmmaN128: return TileConfigId::kWgmmaN128;
    case GemmPath::kWgmmaN64: return TileConfigId::kWgmmaN64;
    default: return TileConfigId::kWgmma;
  }
}

// Rules 0 to 3 of heuristic_plan (below).
GemmPlan unsplit_hopper_or_wmma_plan(const GemmShape& s, const DeviceLimits& d) {
  const GemmPlan wmma = wmma_heuristic_plan(s, d);
  const GemmPath path = gemm_path();
  // Asked on every plan, so that a bad MPGEMM_NARROW_TILES is refused whatever the shape.
  const TileConfigId narrow =
      narrow_wgmma_tile(s.n, tiles(tile_config(TileConfigId::kWgmmaN128), s) * s.batch, d.multiprocessors);
  const TileConfigId hopper = hopper_tile_of(path);
  const bool forced = path != GemmPath::kAuto && path != GemmPath::kWmma;  // one of the Hopper kernels
  if ((wmma.split_k == 1 || forced) && fits_device(tile_config(hopper), s, d)) {
    if (path == GemmPath::kAuto && narrow != TileConfigId::kCount && fits_device(tile_config(narrow), s, d))
      return make_plan(narrow, s, 1, false);
    const TileConfigInfo& ping_pong = tile_config(TileConfigId::kWgmmaPingPong);
    const bool few_tiles = tiles(tile_config(TileConfigId::kWgmma), s) * s.batch * 2 <= d.multiprocessors;
    if (path == GemmPath::kAuto && few_tiles && fits_device(ping_pong, s, d))
      return make_plan(TileConfigId::kWgmmaPingPong, s, 1, false);
    return make_plan(hopper, s, 1, false);
  }
  return wmma;
}

}  // namespace

// The rule:
//  0. The Hopper path wherever it can run the problem (sm_90, describable
//     operands, or with MPGEMM_PADDED_OPERANDS=1 operands copied to
//     describable pitches where the copies pay, not switched off by
//     gemm_path), unless rule 3 below splits K
//     and gemm_path is kAuto: its 128 x 256 tiles leave most multiprocessors
//     idle on small outputs with long K, where split-K of smaller WMMA tiles
//     ran up to 9x faster on an H100. Where N is at most 128 (and
//     MPGEMM_NARROW_TILES is not "0"), the narrow tile narrow_wgmma_tile
//     names in place of the wide one: 1.2x to 2x faster on the four such
//     shapes timed on an H100 (bench/NOTES.md, 2026-11-28); it leaves rule
//     3's split. Otherwise ping-pong consumers on pairs
//     ("wgmma_pingpong") where blocks alone's 128 x 256 tiles (times the
//     batch) fill at most half of the multiprocessors: their 64 x 256 tiles
//     give more blocks work, 1.3x to 1.7x faster on three of the four such
//     shapes timed on an H200 and a tie on the fourth (bench/NOTES.md,
//     2026-11-26); elsewhere blocks alone ("wgmma"), which
//     were 2% to 5% faster than ping-pong from 128 tiles on, and equal to
//     pairs ("wgmma_2x1") within 2%. gemm_path forces any of the Hopper
//     kernels.
//     After all that, where stream_k_enabled (MPGEMM_STREAM_K=1), and
//     gemm_path is kAuto or names stream_k_tile's tile: a single matrix of
//     at least 128 rows on that tile (the wide one, or for at most 128
//     columns a narrow one) where stream_k_blocks says stream-K is faster
//     runs stream-K, in place of whatever rules 0 to 3 chose (WMMA's split
//     too) (bench/NOTES.md, "Stream-K on the Hopper block" and "Stream-K
//     on the narrow tiles": their predictions wait for a GPU run).
//     Failing that, by default where gemm_path is kAuto, and with
//     MPGEMM_WGMMA_SPLIT_K=1 where it is kAuto or kWgmma (never with "0"): a
//     single matrix of at least 128 rows and more than 128 columns (so
//     that the 128 x 256 tile's wgmmas are mostly of D; narrower outputs
//     keep the narrow tiles and WMMA's split) whose K the split cost model
//     (plan/split_cost.h, kHopperGemmRates: fitted to this GEMM's kernel
//     times on an H200) splits on that tile runs split-K on the Hopper
//     block, in place of the whole-K Hopper plan of rules 0 to 3 where the
//     model finds the split at least kWgmmaSplitMargin times as fast (on
//     that H200, 1.17x to 2.16x faster on the five shapes it took, such as
//     a GPT-2 wgrad of 768 x 768 over 16384 tokens), or with
//     MPGEMM_WGMMA_SPLIT_K=1 in place of whatever rules 0 to 3 chose
//     (bench/NOTES.md, "Split-K on the Hopper block by default").
//  1. Operands that do not allow 16-byte loads take the one-element tile.
//  2. Otherwise the first of Tall (m > n) or Wide (m <= n), Square, Compact
//     whose shared memory and arch the device has and whose grid (tiles x
//     batch) gives every multiprocessor a block; failing all, Small.
//  3. Split-K when a single matrix's tiles fill at most half of the
//     multiprocessors and K holds at least 2 x kMinSlicesPerSplit slices:
//     min(ceil(multiprocessors / tiles), slices / kMinSlicesPerSplit,
//     kMaxSplitK) splits (so at least 2).
GemmPlan heuristic_plan(const GemmShape& shape, const DeviceLimits& d) {
  const GemmPath path = gemm_path();
  // Asked on every plan, so that a bad MPGEMM_PADDED_OPERANDS is refused whatever the shape. Copies to
  // aligned pitches only where they pay, or where a Hopper kernel is forced.
  const bool pad = padded_operands_enabled() && (padded_copies_pay(shape) || (path != GemmPath::kAuto &&
                                                                              path != GemmPath::kWmma));
  GemmShape s = shape;
  if (!pad) s.a_copies = s.b_copies = 0;
  const GemmPlan plan = unsplit_hopper_or_wmma_plan(s, d);
  // Asked on every plan, so that a bad MPGEMM_WGMMA_SPLIT_K or MPGEMM_STREAM_K is refused whatever the shape.
  const WgmmaSplitK split_mode = wgmma_split_k_mode();
  const bool stream_k = stream_k_enabled();
  if (stream_k && s.batch == 1) {
    const TileConfigId tile = stream_k_tile(s);
    const bool path_takes = path == GemmPath::kAuto || (path != GemmPath::kWmma && hopper_tile_of(path) == tile);
    // At least a whole tile's rows, so that each wgmma is mostly of D.
    if (tile != TileConfigId::kCount && path_takes && s.m >= tile_config(tile).block_m &&
        fits_device(tile_config(tile), s, d))
      if (const int blocks = stream_k_blocks(s, d, tile); blocks > 0) {
        GemmPlan streamed = make_plan(tile, s, 1, false);
        streamed.stream_k_blocks = blocks;
        return streamed;
      }
  }
  const TileConfigInfo& wide = tile_config(TileConfigId::kWgmma);
  const bool wide_rows_filled = s.m >= wide.block_m && s.n > tile_config(TileConfigId::kWgmmaN128).block_n;
  // The default splits the heuristic's plans; a Hopper kernel forced by MPGEMM_GEMM_PATH runs whole K unless "1".
  const bool split_asked =
      split_mode == WgmmaSplitK::kWhereSplit && (path == GemmPath::kAuto || path == GemmPath::kWgmma);
  const bool split_by_default = split_mode == WgmmaSplitK::kWherePays && path == GemmPath::kAuto;
  if (!(split_asked || split_by_default) || s.batch != 1 || !wide_rows_filled || !fits_device(wide, s, d)) return plan;
  const SplitProblem split = hopper_split_problem(s, d, TileConfigId::kWgmma);
  const int splits = cheapest_split(split);
  if (splits > 1 && (split_asked || wgmma_split_pays(s, d, plan, split, splits)))
    return make_plan(TileConfigId::kWgmma, s, splits, false);
  return plan;
}

GemmPlan plan_gemm(const GemmShape& s, const DeviceLimits& d) {
  if (any_tuned.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(tuned_mutex);
    const auto it = tuned_plans.find({s.batch, s.m, s.n, s.k});
    // A Hopper entry, timed on operands read as they lie, does not hold
    // where they would be copied first: the heuristic weighs the copies.
    // A stream-K entry holds where stream-K may run: on this device's blocks.
    const int stream_k = it != tuned_plans.end() && it->second.stream_k && stream_k_enabled() &&
                                 has_stream_k_kernels(it->second.config) && it->second.split_k == 1
                             ? stream_k_grid(s, d, it->second.config)
                             : 0;
    if (it != tuned_plans.end() && admissible(s, d, it->second.config, it->second.split_k) &&
        (s.wgmma || !is_wgmma(it->second.config)) && (!it->second.stream_k || stream_k > 0)) {
      GemmPlan tuned = make_plan(it->second.config, s, it->second.split_k, true);
      tuned.stream_k_blocks = stream_k;
      return tuned;
    }
  }
  return heuristic_plan(s, d);
}

std::vector<GemmPlan> candidate_plans(const GemmShape& s, const DeviceLimits& d) {
  std::vector<GemmPlan> plans;
  for (const TileConfigInfo& c : kTileConfigs)
    for (int split_k = 1; split_k <= kMaxSplitK; split_k *= 2) {
      // The Hopper split-K kernel gives each split ceil(slices / split_k) slices, so the last may have none.
      const int64_t per_split = ceil_div(slices(c, s.k), split_k);
      const bool none_empty =
          split_k <= slices(c, s.k) && (!c.wgmma || ceil_div(slices(c, s.k), per_split) == split_k);
      if (admissible(s, d, c.id, split_k) && (split_k == 1 || none_empty))
        plans.push_back(make_plan(c.id, s, split_k, false));
    }
  // The heuristic's split count need not be a power of two.
  const GemmPlan heuristic = heuristic_plan(s, d);
  const bool listed = std::any_of(plans.begin(), plans.end(), [&](const GemmPlan& p) {
    return p.config == heuristic.config && p.split_k == heuristic.split_k &&
           p.stream_k_blocks == heuristic.stream_k_blocks;
  });
  if (!listed) plans.push_back(heuristic);
  return plans;
}

size_t padded_copy_bytes(const GemmShape& s, const GemmPlan& plan) {
  if (!plan.padded) return 0;
  const auto copy = [&](int64_t copies, int64_t rows, int64_t cols) {
    return size_t(round_up(copies * round_up(rows, 8) * round_up(cols, 8) * 2, 256));
  };
  return copy(s.a_copies, s.m, s.k) + copy(s.b_copies, s.k, s.n);
}

size_t workspace_bytes(const GemmShape& s, const GemmPlan& plan) {
  const size_t stream_k = plan.stream_k_blocks > 0
                              ? stream_k_partial_bytes(plan.config, plan.stream_k_blocks) +
                                    stream_k_flag_bytes(plan.stream_k_blocks)
                              : 0;
  return padded_copy_bytes(s, plan) + stream_k +
         (plan.split_k > 1 ? size_t(plan.split_k) * size_t(s.m) * size_t(s.n) * sizeof(float) : 0);
}

void set_tuned_plan(const GemmShape& s, TileConfigId config, int split_k, bool stream_k) {
  std::lock_guard<std::mutex> lock(tuned_mutex);
  tuned_plans[{s.batch, s.m, s.n, s.k}] = {config, split_k, stream_k};
  any_tuned.store(true, std::memory_order_release);
}

void clear_tuned_plans() {
  std::lock_guard<std::mutex> lock(tuned_mutex);
  tuned_plans.clear();
  any_tuned.store(false, std::memory_order_release);
}

}  // namespace mpgemm::kernels
