// How many ways a convolution's wgrad splits its sum over the output pixels,
// and a GEMM's over K on the Hopper block: the count a cost model of the
// device says is fastest, for the WMMA implicit GEMM, the Hopper convolution
// and the Hopper GEMM alike. Host code, free of CUDA.
//
// Splitting K gives idle multiprocessors work (wgrad's output, the filters,
// is a few tiles; its K, every output pixel, is long), but every split
// writes an fp32 copy of the output that the reduction reads back. The
// model weighs the two: the busiest block's K slices, ceil(tiles x splits /
// blocks that run at once) x ceil(slices / splits) slices at the tile's
// rate, plus, where there is a split, the partials' bytes written and read
// and the reduction's launch and tail. Its constants were fitted to an
// H100's wgrad layers (bench/NOTES.md, "wgrad's split from a cost model").
// The sum's order is the split order whatever the count, so the result is
// bitwise the same on every run.
#pragma once

#include <cstdint>

#include "plan/gemm_plan.h"

namespace mpgemm::kernels {

// Measured on an H100 SXM (d816ee9, 2026-11-27), per multiprocessor: the
// Hopper block's rate (700 TFLOP/s over 132) and what L2 feeds it (0.0117
// bytes a FLOP at that rate), which bounds the narrow tiles; the WMMA tiles'
// rate, shared by the blocks a multiprocessor holds. Partial sums move at
// 2.5 TB/s. The reduction's launch and tail: 5 us, about a launch (the fit
// could not tell 5 from 30 us: the same splits on every layer).
inline constexpr double kWgmmaFlopsPerNs = 5300.0, kWgmmaFeedBytesPerNs = 62.0, kWmmaFlopsPerNs = 2800.0;
inline constexpr double kPartialBytesPerNs = 2500.0, kReductionNs = 5000.0;

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
};

// The modelled time, in ns, of the sum cut into `splits` runs of
// ceil(slices / splits) slices.
double split_cost_ns(const SplitProblem& problem, int64_t splits);

// The cheapest split count; each split non-empty (as many splits as whole
// runs of ceil(slices / splits) slices take), 1 where the slices are too few
// to split. Ties go to fewer splits.
int cheapest_split(const SplitProblem& problem);

}  // namespace mpgemm::kernels
