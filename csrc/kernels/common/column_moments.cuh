// Per-column moments of blocks of an output's rows (count, mean and M2, the
// sum of squared deviations from the mean), which an epilogue gathers from
// the values it stores so that training batch norm needs no pass over its
// input for the statistics (norm/column_moments.h totals them).
// Why moments and not sums of y and y^2: a channel whose mean is large
// against its spread would lose its variance to cancellation in
// E[y^2] - E[y]^2; each thread sums deviations from its own first value
// instead, and moments combine without that loss (Chan et al.'s pairwise
// update). Every combination here is in a fixed order, so the results are
// the same bits on every run.
#pragma once

#include <cstdint>

namespace mpgemm::kernels {

struct ColumnMoments {
  float count = 0.0f, mean = 0.0f, m2 = 0.0f;
};

// a's rows, then b's: count, mean and M2 of both.
__device__ __forceinline__ ColumnMoments combine_moments(const ColumnMoments& a, const ColumnMoments& b) {
  if (b.count == 0.0f) return a;
  if (a.count == 0.0f) return b;
  const float count = a.count + b.count, part = b.count / count, delta = b.mean - a.mean;
  return {count, a.mean + delta * part, a.m2 + b.m2 + delta * delta * a.count * part};
}

// One thread's values of a column, summed as deviations from the first.
struct ShiftedSums {
  float shift = 0.0f, sum = 0.0f, squares = 0.0f, count = 0.0f;

  __device__ __forceinline__ void add(float v) {
    if (count == 0.0f) shift = v;
    const float d = v - shift;
    sum += d;
    squares += d * d;
    count += 1.0f;
  }

  __device__ __forceinline__ ColumnMoments moments() const {
    if (count == 0.0f) return {};
    const float m2 = squares - sum * (sum / count);
    return {count, shift + sum / count, m2 > 0.0f ? m2 : 0.0f};
  }
};

// The moments of the lanes whose bits under `mask` differ (lane ^ m for the
// m in mask, powers of two), combined in lane order: every such lane ends
// with the same result. kSameCounts: every such lane holds as many values
// (the caller knows), so the count is not exchanged, and where it is a
// constant, the combinations' divisions by it fold to constants.
template <unsigned kMask, bool kSameCounts = false>
__device__ __forceinline__ ColumnMoments combine_across_lanes(ColumnMoments m, int lane) {
#pragma unroll
  for (unsigned bit = 1; bit < 32; bit *= 2) {
    if ((kMask & bit) == 0) continue;
    const float count = kSameCounts ? m.count : __shfl_xor_sync(0xffffffffu, m.count, bit);
    const ColumnMoments other{count, __shfl_xor_sync(0xffffffffu, m.mean, bit),
                              __shfl_xor_sync(0xffffffffu, m.m2, bit)};
    m = (unsigned(lane) & bit) ? combine_moments(other, m) : combine_moments(m, other);
  }
  return m;
}

// Where block `block` of rows writes column `col`'s moments: mean in the
// first half of `moments` ([2][blocks][pitch]), M2 in the second.
__device__ __forceinline__ void store_moments(float* moments, int64_t blocks, int64_t pitch, int64_t block,
                                              int64_t col, const ColumnMoments& m) {
  moments[block * pitch + col] = m.mean;
  moments[(blocks + block) * pitch + col] = m.m2;
}

}  // namespace mpgemm::kernels
