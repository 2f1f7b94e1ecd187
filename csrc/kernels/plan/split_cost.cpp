// The split cost model of plan/split_cost.h.
#include "plan/split_cost.h"

#include <algorithm>

#include "common/math.h"

namespace mpgemm::kernels {
namespace {

// One K slice of one tile on one block, in ns, where the multiprocessor runs
// tile.min_blocks_per_sm blocks at once (the Hopper tiles: one).
double slice_ns(const TileConfigInfo& tile) {
  const double flops = 2.0 * tile.block_m * tile.block_n * tile.block_k, blocks = tile.min_blocks_per_sm;
  if (!tile.wgmma) return flops / kWmmaFlopsPerNs * blocks;
  const double fed_bytes = 2.0 * (tile.block_m + tile.block_n) * tile.block_k;
  return std::max(flops / kWgmmaFlopsPerNs, fed_bytes / kWgmmaFeedBytesPerNs) * blocks;
}

}  // namespace

double split_cost_ns(const SplitProblem& p, int64_t splits) {
  const int64_t at_once = std::max<int64_t>(1, int64_t(p.multiprocessors) * std::max(p.tile.min_blocks_per_sm, 1));
  const double mainloop =
      double(ceil_div(p.tiles * splits, at_once)) * double(ceil_div(p.slices, splits)) * slice_ns(p.tile);
  if (splits == 1) return mainloop;
  const double partial_bytes = double(splits) * double(p.output_elements) * sizeof(float);
  return mainloop + 2.0 * partial_bytes / kPartialBytesPerNs + kReductionNs;
}

int cheapest_split(const SplitProblem& p) {
  const int64_t most = std::min({p.slices / kMinSlicesPerSplit, std::min(p.max_splits, kMaxSplits),
                                 ceil_div(kMaxSplitBlocksPerSM * p.multiprocessors, std::max<int64_t>(p.tiles, 1))});
  int64_t best = 1;
  double best_ns = split_cost_ns(p, 1);
  for (int64_t wanted = 2; wanted <= most; ++wanted) {
    const int64_t splits = ceil_div(p.slices, ceil_div(p.slices, wanted));
    const double ns = split_cost_ns(p, splits);
    if (ns < best_ns) best = splits, best_ns = ns;
  }
  return int(best);
}

}  // namespace mpgemm::kernels
