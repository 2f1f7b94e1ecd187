// The split cost model of plan/split_cost.h.
#include "plan/split_cost.h"

#include <algorithm>

#include "common/math.h"

namespace mpgemm::kernels {
namespace {

// One K slice of one tile on one block, in ns, where the multiprocessor runs
// tile.min_blocks_per_sm blocks at once (the Hopper tiles: one) and
// `busy_blocks` blocks of the device run together.
double slice_ns(const TileConfigInfo& tile, const SplitRates& rates, int64_t busy_blocks) {
  const double flops = 2.0 * tile.block_m * tile.block_n * tile.block_k, blocks = tile.min_blocks_per_sm;
  if (!tile.wgmma) return flops / rates.wmma_flops_per_ns * blocks;
  const double fed_bytes = 2.0 * (tile.block_m + tile.block_n) * tile.block_k;
  double ns = flops / rates.wgmma_flops_per_ns;
  if (rates.wgmma_feed_bytes_per_ns > 0.0) ns = std::max(ns, fed_bytes / rates.wgmma_feed_bytes_per_ns);
  if (rates.l2_feed_bytes_per_ns > 0.0) ns = std::max(ns, fed_bytes * double(busy_blocks) / rates.l2_feed_bytes_per_ns);
  return ns * blocks;
}

}  // namespace

double split_cost_ns(const SplitProblem& p, int64_t splits) {
  const int64_t at_once = std::max<int64_t>(1, int64_t(p.multiprocessors) * std::max(p.tile.min_blocks_per_sm, 1));
  const int64_t blocks = p.tiles * splits, per_split = ceil_div(p.slices, splits);
  double mainloop;
  if (p.rates.l2_feed_bytes_per_ns > 0.0) {
    // A slice's time depends on how many blocks share L2: the last wave's fewer run faster.
    const int64_t full_waves = blocks / at_once, last_wave = blocks % at_once;
    mainloop = double(full_waves) * double(per_split) * slice_ns(p.tile, p.rates, at_once) +
               (last_wave > 0 ? double(per_split) * slice_ns(p.tile, p.rates, last_wave) : 0.0);
  } else {
    // Every wave at one rate: the arithmetic the wgrad's plans were made with, kept to the bit.
    mainloop = double(ceil_div(blocks, at_once)) * double(per_split) * slice_ns(p.tile, p.rates, at_once);
  }
  const double whole = mainloop + p.rates.kernel_ns;  // + 0.0 for kWgradRates: the same bits
  if (splits == 1) return whole;
  const double partial_bytes = double(splits) * double(p.output_elements) * sizeof(float);
  return whole + 2.0 * partial_bytes / p.rates.partial_bytes_per_ns + p.rates.reduction_ns;
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
