// Batch norm's sums and input gradient with each thread's loads issued rows
// ahead (MPGEMM_BATCH_NORM_LOADS_AHEAD=1; opt-in until they pass the GPU
// tests, then they replace norm/batch_norm_kernels.cuh's sums_kernel and
// grad_input_kernel). Same partition, same arithmetic, same bits as those:
//
// sums_ahead_kernel      - the sums' partition (a thread keeps one group of
//                          kWidth channels and walks the block's rows
//                          rows_in_flight apart); it issues the 16-byte loads
//                          of its next kRowsAhead rows (dz, y and the ReLU's
//                          byte of bits backward) before it sums the first,
//                          then sums them in row order: the partials are
//                          bitwise sums_kernel's.
// grad_input_ahead_kernel - the input gradient on the same walk: the
//                           thread's channels fixed, so their per-channel
//                           vectors are loaded once (grad_input_kernel loads
//                           five of them again for every run and finds the
//                           channel by a modulo), and kRowsAhead rows' loads
//                           in flight; each element's steps as
//                           grad_input_kernel rounds them.
//
// Why: the default kernels wait on each row's loads before they issue the
// next row's (the sums hold one 16-byte load in flight a thread; the input
// gradient takes three memory latencies a run: dz, then the bits, then y).
// In a ResNet-50 step profiled on an H200 their times against the bytes
// they must move come to 2.4 and 2.9 TB/s, where the elementwise forward,
// its loads together, reaches 3.85 (bench/NOTES.md).
#pragma once

#include <cstdint>

#include "norm/batch_norm_kernels.cuh"

namespace mpgemm::kernels::batch_norm {

constexpr int kRowsAhead = 4;

struct GradInputAheadArgs {
  GradInputArgs grad;
  int64_t block_rows;  // the sums' row partition
};

// A thread's place in the sums' partition: the block takes up to
// kGroupsPerBlock groups of kWidth channels across `lanes` threads and
// rows_in_flight rows at once, over its block of rows.
struct RowWalk {
  int64_t channels;
  int groups, lanes, rows_in_flight;
  int c;               // the thread's first channel
  int64_t first, end;  // the thread's first row; the block's rows end before `end`
  bool active;         // false: a thread past the rows in flight or the channels
};

template <int kWidth>
__device__ __forceinline__ RowWalk row_walk(BatchNormShape shape, int64_t block_rows) {
  RowWalk w;
  w.channels = shape.channels;
  w.groups = int(w.channels / kWidth);
  w.lanes = w.groups < kGroupsPerBlock ? w.groups : kGroupsPerBlock;
  w.rows_in_flight = kThreads / w.lanes;
  const int lane = threadIdx.x % w.lanes, row_lane = threadIdx.x / w.lanes;
  const int group = blockIdx.x * kGroupsPerBlock + lane;
  w.c = group * kWidth;
  const int64_t begin = blockIdx.y * block_rows;
  w.end = begin + block_rows < shape.rows ? begin + block_rows : shape.rows;
  w.first = begin + row_lane;
  w.active = row_lane < w.rows_in_flight && group < w.groups;
  return w;
}

// use(fetch(i), i) for each of the thread's rows in order (i: the index of
// its run in that row), the fetches of kRowsAhead rows issued before the
// first use.
template <class Fetch, class Use>
__device__ __forceinline__ void walk_rows_ahead(const RowWalk& w, Fetch&& fetch, Use&& use) {
  using Fetched = decltype(fetch(int64_t{}));
  const int64_t step = w.rows_in_flight;
  for (int64_t r = w.first; r < w.end; r += kRowsAhead * step) {
    Fetched f[kRowsAhead];
#pragma unroll
    for (int j = 0; j < kRowsAhead; ++j)
      if (r + j * step < w.end) f[j] = fetch((r + j * step) * w.channels + w.c);
#pragma unroll
    for (int j = 0; j < kRowsAhead; ++j)
      if (r + j * step < w.end) use(f[j], (r + j * step) * w.channels + w.c);
  }
}

// What backward reads of a run, as loaded: dz, y (where asked for), and
// the ReLU's verdicts (the byte of its bits that holds the run's, or its
// output). Nothing here waits on a load: the byte is shifted where it is used.
template <class T, int kWidth>
struct GradRun {
  Raw<T, kWidth> dz, y, out;
  unsigned bits;
};

template <class T, int kWidth>
__device__ __forceinline__ GradRun<T, kWidth> fetch_grad(const void* grad_out, const void* out, const uint8_t* bits,
                                                         const void* y, int64_t i) {
  GradRun<T, kWidth> g{};  // what is not fetched is zero, never read
  g.dz = fetch<T, kWidth>(grad_out, i);
  if (y != nullptr) g.y = fetch<T, kWidth>(y, i);
  if (bits != nullptr) g.bits = bits[i / 8];
  else if (out != nullptr) g.out = fetch<T, kWidth>(out, i);
  return g;
}

// dz of the run at i masked by the ReLU's verdicts (relu_passed's, from the
// fetched run).
template <class T, int kWidth>
__device__ __forceinline__ void masked_dz(const GradRun<T, kWidth>& g, const void* out, const uint8_t* bits,
                                          int64_t i, float (&dz)[kWidth]) {
  widen(g.dz, dz);
  if (bits != nullptr) {
    // The run's kWidth bits lie in its one byte: kWidth divides 8 and i.
    const unsigned run_bits = g.bits >> (i % 8);
#pragma unroll
    for (int e = 0; e < kWidth; ++e) dz[e] = (run_bits >> e) & 1u ? dz[e] : 0.0f;
  } else if (out != nullptr) {
    float o[kWidth];
    widen(g.out, o);
#pragma unroll
    for (int e = 0; e < kWidth; ++e) dz[e] = o[e] > 0.0f ? dz[e] : 0.0f;
  }
}

template <class T, int kWidth>
__global__ void __launch_bounds__(kThreads) sums_ahead_kernel(SumsArgs a) {
  const RowWalk w = row_walk<kWidth>(a.shape, a.block_rows);
  float first[kWidth] = {}, second[kWidth] = {};
  if (w.active) {
    if (a.grad_out == nullptr) {
      float shift[kWidth];
      load<T, kWidth>(a.y, w.c, shift);
      walk_rows_ahead(w, [&](int64_t i) { return fetch<T, kWidth>(a.y, i); },
                      [&](const Raw<T, kWidth>& raw, int64_t) {
                        float v[kWidth];
                        widen(raw, v);
#pragma unroll
                        for (int e = 0; e < kWidth; ++e) {
                          const float d = __fsub_rn(v[e], shift[e]);
                          first[e] = __fadd_rn(first[e], d);
                          second[e] = __fadd_rn(second[e], __fmul_rn(d, d));
                        }
                      });
    } else {
      float mean[kWidth], invstd[kWidth];
      load_channels<kWidth>(a.mean, w.c, mean);
      load_channels<kWidth>(a.invstd, w.c, invstd);
      walk_rows_ahead(w, [&](int64_t i) { return fetch_grad<T, kWidth>(a.grad_out, a.out, a.relu_mask, a.y, i); },
                      [&](const GradRun<T, kWidth>& g, int64_t i) {
                        float dz[kWidth], y[kWidth];
                        masked_dz(g, a.out, a.relu_mask, i, dz);
                        widen(g.y, y);
#pragma unroll
                        for (int e = 0; e < kWidth; ++e) {
                          const float xhat = __fmul_rn(__fsub_rn(y[e], mean[e]), invstd[e]);
                          first[e] = __fadd_rn(first[e], dz[e]);
                          second[e] = __fadd_rn(second[e], __fmul_rn(dz[e], xhat));
                        }
                      });
    }
  }
  // The threads' sums met in shared memory and totalled over the rows in
  // flight in order (sums_kernel's order): a partial per channel and sum.
  float* sums = reinterpret_cast<float*>(smem);  // [2][kWidth][kThreads]
#pragma unroll
  for (int e = 0; e < kWidth; ++e) {
    sums[e * kThreads + threadIdx.x] = first[e];
    sums[(kWidth + e) * kThreads + threadIdx.x] = second[e];
  }
  __syncthreads();
  const int per_sum = w.lanes * kWidth;
  for (int t = threadIdx.x; t < 2 * per_sum; t += kThreads) {
    const int sum = t / per_sum, g = t % per_sum / kWidth, e = t % kWidth;
    if (blockIdx.x * kGroupsPerBlock + g >= w.groups) continue;
    const float* column = sums + (sum * kWidth + e) * kThreads + g;
    float total = 0.0f;
    for (int r = 0; r < w.rows_in_flight; ++r) total = __fadd_rn(total, column[r * w.lanes]);
    const int64_t channel = int64_t(blockIdx.x * kGroupsPerBlock + g) * kWidth + e;
    a.partial[(sum * int64_t(gridDim.y) + blockIdx.y) * w.channels + channel] = total;
  }
}

template <class T, int kWidth>
__global__ void __launch_bounds__(kThreads) grad_input_ahead_kernel(GradInputAheadArgs args) {
  const GradInputArgs& a = args.grad;
  const RowWalk w = row_walk<kWidth>(a.shape, args.block_rows);
  if (!w.active) return;
  const bool with_sums = a.sum_dz != nullptr;
  float scale[kWidth], mean[kWidth], invstd[kWidth], mean_dz[kWidth], mean_dz_xhat[kWidth];
  load_channels<kWidth>(a.scale, w.c, scale);
  if (with_sums) {
    float sum_dz[kWidth], sum_dz_xhat[kWidth];
    load_channels<kWidth>(a.mean, w.c, mean);
    load_channels<kWidth>(a.invstd, w.c, invstd);
    load_channels<kWidth>(a.sum_dz, w.c, sum_dz);
    load_channels<kWidth>(a.sum_dz_xhat, w.c, sum_dz_xhat);
#pragma unroll
    for (int e = 0; e < kWidth; ++e) {
      mean_dz[e] = __fmul_rn(sum_dz[e], a.inv_rows);
      mean_dz_xhat[e] = __fmul_rn(sum_dz_xhat[e], a.inv_rows);
    }
  }
  const void* y = with_sums ? a.y : nullptr;
  walk_rows_ahead(w, [&](int64_t i) { return fetch_grad<T, kWidth>(a.grad_out, a.out, a.relu_mask, y, i); },
                  [&](const GradRun<T, kWidth>& g, int64_t i) {
                    float dz[kWidth], dy[kWidth];
                    masked_dz(g, a.out, a.relu_mask, i, dz);
                    if (with_sums) {
                      float yv[kWidth];
                      widen(g.y, yv);
#pragma unroll
                      for (int e = 0; e < kWidth; ++e) {
                        const float xhat = __fmul_rn(__fsub_rn(yv[e], mean[e]), invstd[e]);
                        dy[e] = __fmul_rn(scale[e],
                                          __fsub_rn(__fsub_rn(dz[e], mean_dz[e]), __fmul_rn(xhat, mean_dz_xhat[e])));
                      }
                    } else {
#pragma unroll
                      for (int e = 0; e < kWidth; ++e) dy[e] = __fmul_rn(scale[e], dz[e]);
                    }
                    if (a.grad_y != nullptr) store<T, kWidth>(a.grad_y, i, dy);
                    if (a.grad_z != nullptr) store<T, kWidth>(a.grad_z, i, dz);
                  });
}

}  // namespace mpgemm::kernels::batch_norm
