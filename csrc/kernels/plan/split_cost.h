// How many ways a convolution's wgrad splits its sum over the output pixels,
// and a GEMM's over K on the Hopper block: the count a cost model of the
// device says is fastest, for the WMMA implicit GEMM, the Hopper convolution
// and the Hopper GEMM alike. Host code, free of CUDA.
//
// Splitting K gives idle multiprocessors work (wgrad's output, the filters,
// is a few tiles; its K, every output pixel, is long), but every split
// writes an fp32 copy of the output that the reduction reads back. The
// model weighs the two: each wave of blocks runs its tiles' K slices (the
// last split's ceil(slices / splits)) at the tile's rate, plus, where there
// is a split, the partials' bytes written and read and the reduction's
// launch and tail. The rates are measured ones, each set on the kernels it
// was fitted to (SplitRates). The sum's order is the split order whatever
// the count, so the result is bitwise the same on every run.
#pragma once

#include <cstdint>

#include "plan/gemm_plan.h"

namespace mpgemm::kernels {

// A device's rates as the model sees them, per multiprocessor where not
// said otherwise, and the fixed cost of a split's reduction.
struct SplitRates {
  double wgmma_flops_per_ns;         // the Hopper block's products
  double wgmma_feed_bytes_per_ns;    // what L2 feeds one multiprocessor's copies (0: no such bound)
  double l2_feed_bytes_per_ns;       // what L2 feeds every busy multiprocessor together (0: no such bound)
  double wmma_flops_per_ns;          // the WMMA tiles', shared by the blocks a multiprocessor holds
  double partial_bytes_per_ns;       // partial sums written, then read by the reduction (the device's)
  double reduction_ns;               // the reduction's launch and tail
  double kernel_ns;                  // a kernel's own launch, prologue and tail, split or not
};

// Fitted to the convolutions' wgrad layers on an H100 SXM (d816ee9,
// 2026-11-27; bench/NOTES.md, "wgrad's split from a cost model"): the
// Hopper block's rate (700 TFLOP/s over 132) and what L2 feeds it (0.0117
// bytes a FLOP at that rate), which bounds the narrow tiles; partial sums at
// 2.5 TB/s; the reduction's launch and tail 5 us, about a launch (the fit
// could not tell 5 from 30 us: the same splits on every layer).
inline constexpr SplitRates kWgradRates{5300.0, 62.0, 0.0, 2800.0, 2500.0, 5000.0, 0.0};

// Fitted to the Hopper GEMM on an H200 (fe39419, 2026-11-29; bench/NOTES.md,
// "Split-K on the Hopper block by default"): 33 kernel times of
// bench/wgmma_check.py (whole K on the 64 x 256 ping-pong tiles and the 128 x
// 256 tile, and split K on the latter, 512 to 4800 rows, K of 512 to 16384),
// within 11% each, 5% root mean square. A kernel costs 7.4 us of its own,
// split or not; a multiprocessor's products run at 6.0 TFLOP/s; L2 feeds all
// busy ones 11 TB/s together (so only 64-row tiles on more than about 95
// multiprocessors wait on it); partial sums move at 2.6 TB/s, and the
// reduction's launch costs nothing the fit can see beyond its bytes. The
// WMMA rate is kWgradRates' (no WMMA time in the fit).
inline constexpr SplitRates kHopperGemmRates{5977.0, 0.0, 11039.0, 2800.0, 2597.0, 0.0, 7400.0};

// Split counts run from 1 to at most kMaxSplits (the problem's max_splits:
// the GEMM's, kMaxSplitK), each split at least
// kMinSlicesPerSplit K slices (plan/gemm_plan.h), all splits' tiles together
// at most kMaxSplitBlocksPerSM a multiprocessor (plus one split's): what
// bounds the partial sums' memory (mpgemm/memory.py).
inline constexpr int64_t kMaxSplits = 256, kMaxSplitBlocksPerSM = 4;

struct SplitProblem {
  TileConfigInfo tile;          // its slices are tile.block_k deep
  int64_t tiles = 1;            // output tiles of one split (all of dw, every group)
  int64_t slices = 1;           // K slices of the whole sum
  int multiprocessors = 1;
  int64_t output_elements = 0;  // of one split's partial sums (fp32)
  int64_t max_splits = kMaxSplits;
  SplitRates rates = kWgradRates;
};

// The modelled time, in ns, of the sum cut into `splits` runs of
// ceil(slices / splits) slices (kernel_ns included).
double split_cost_ns(const SplitProblem& problem, int64_t splits);

// The cheapest split count; each split non-empty (as many splits as whole
// runs of ceil(slices / splits) slices take), 1 where the slices are too few
// to split. Ties go to fewer splits.
int cheapest_split(const SplitProblem& problem);

}  // namespace mpgemm::kernels
