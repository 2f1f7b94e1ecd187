// Training batch norm's kernels over a channels-innermost activation seen as
// a rows x channels matrix (rows = N * H * W), every tensor of one element
// type T (fp32, fp16 or bf16), per-channel vectors in fp32. The launches and
// the row partition are in norm/batch_norm.cu.
//
// sums_kernel   - per-channel sums over a fixed block of rows: a block takes
//                 up to 32 groups of channels, 16 bytes a group where the
//                 channel count allows (8 channels of 16 bits, 4 of fp32),
//                 one lane a group, and as many rows at once as its 256
//                 threads hold (a row of 64 fp16 channels is 8 lanes, so 32
//                 rows at once, each a whole 128-byte line); each thread's
//                 sums meet in shared memory and are totalled in row order,
//                 one partial per channel and sum a block. Statistics sum y - y[0, c] and its square
//                 (the shift keeps E[y^2] - E[y]^2 from cancelling where a
//                 channel's mean is large against its spread); backward sums
//                 dz and dz * xhat, dz being grad_out masked by out > 0 where
//                 the chain ends in a ReLU (its output, or the forward's bits
//                 of it: out > 0).
// finish_kernel - a block per channel sums the row blocks' partials in fp64:
//                 thread t takes blocks t, t + 256, ..., then thread 0 the
//                 threads' sums in order (a few hundred adds, once per
//                 channel: cheaper than a tree's barriers); in the forward
//                 it then turns the statistics (or, without batch ones, the
//                 running ones) into invstd, scale and shift and updates the
//                 running statistics. The partition depends on the shape alone and
//                 nothing is atomic, so every run sums in the same order and
//                 gives the same bits (training that resumes from a
//                 checkpoint depends on it). norm/batch_norm_line_finish.cuh
//                 has the same finish reading whole sectors (opt-in).
// act_kernel, grad_input_kernel - elementwise: a block walks chunks of whole
//                 rows, so a thread's channel is its offset in the chunk
//                 modulo the channel count (32-bit arithmetic); kWidth
//                 elements a thread per step, 16-byte loads and stores (and
//                 of the per-channel vectors) where the channel count and the
//                 pointers allow. Each step is
//                 rounded in fp32 as written (__fmul_rn and friends: never
//                 contracted into an FMA), so the CPU backend
//                 (csrc/batch_norm_cpu.cpp) gives the same bits. With a ReLU,
//                 the forward of 16-bit runs also writes out > 0 as bits, a
//                 byte a thread: backward reads 1/16 of the bytes it would
//                 read of out.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "arch/smem.cuh"
#include "common/element_traits.cuh"
#include "common/vector_access.cuh"
#include "norm/batch_norm.h"

namespace mpgemm::kernels::batch_norm {

constexpr int kThreads = 256;
constexpr int kGroupsPerBlock = 32;             // channel groups (of kWidth channels) a block of the sums takes
constexpr int kChunkElements = 4096;            // elementwise: whole rows of about this many elements a block step
constexpr int kSumsSmemBytes = 2 * 8 * kThreads * int(sizeof(float));  // two sums of up to 8 channels a thread
constexpr int kFinishSmemBytes = 2 * kThreads * int(sizeof(double));

struct SumsArgs {
  BatchNormShape shape;
  const void* y;
  const void* grad_out;  // null: y's statistics
  const void* out;       // the ReLU's output, or null
  const uint8_t* relu_mask;  // or its bits, or null
  const float* mean;
  const float* invstd;
  int64_t block_rows;
  float* partial;  // [2][row blocks][channels]
};

struct FinishArgs {
  BatchNormShape shape;
  const void* y;          // the statistics' shifts, row 0 of y (forward with batch statistics)
  const float* partial;   // the row blocks' sums, or null (forward without batch statistics or with mean_var)
  const float* mean_var;  // forward: the batch's mean and biased variance ([2][channels]) where given, or null
  int64_t blocks;
  float* sum_first;       // backward: sum_dz, or null in the forward
  float* sum_second;      // backward: sum_dz_xhat
  BatchNormChannels channels;  // forward
};

struct ActArgs {
  BatchNormShape shape;
  const void* y;
  const float* scale;
  const float* shift;
  const void* residual;  // or null
  bool relu;
  void* out;
  uint8_t* relu_mask;  // out > 0 as bits, written where non-null (16-byte runs of 16-bit elements only)
};

struct GradInputArgs {
  BatchNormShape shape;
  const void* grad_out;
  const void* out;  // the ReLU's output, or null
  const uint8_t* relu_mask;  // or its bits, or null
  const void* y;
  const float* mean;
  const float* invstd;
  const float* scale;
  const float* sum_dz;  // null: running statistics
  const float* sum_dz_xhat;
  float inv_rows;
  void* grad_y;  // or null
  void* grad_z;  // or null
};

// kWidth per-channel values from p[c]: 16-byte loads where kWidth is a
// multiple of 4 (c, a multiple of kWidth, keeps them aligned).
template <int kWidth>
__device__ __forceinline__ void load_channels(const float* p, int c, float (&v)[kWidth]) {
  if constexpr (kWidth % 4 == 0) {
#pragma unroll
    for (int e = 0; e < kWidth; e += 4) {
      const float4 q = *reinterpret_cast<const float4*>(p + c + e);
      v[e] = q.x, v[e + 1] = q.y, v[e + 2] = q.z, v[e + 3] = q.w;
    }
  } else {
#pragma unroll
    for (int e = 0; e < kWidth; ++e) v[e] = p[c + e];
  }
}

// Whether the chain's ReLU passed each of the kWidth elements from i (out >
// 0), from its bits (bit e of byte j: element 8j + e, in memory order) or
// from out itself; all of them without a ReLU.
template <class T, int kWidth>
__device__ __forceinline__ void relu_passed(const void* out, const uint8_t* bits, int64_t i, bool (&passed)[kWidth]) {
  if (bits != nullptr) {
    if constexpr (kWidth == 8) {
      const unsigned byte = bits[i / 8];
#pragma unroll
      for (int e = 0; e < kWidth; ++e) passed[e] = (byte >> e) & 1u;
    } else {
#pragma unroll
      for (int e = 0; e < kWidth; ++e) passed[e] = (bits[(i + e) / 8] >> ((i + e) % 8)) & 1u;
    }
  } else if (out != nullptr) {
    float o[kWidth];
    load<T, kWidth>(out, i, o);
#pragma unroll
    for (int e = 0; e < kWidth; ++e) passed[e] = o[e] > 0.0f;
  } else {
#pragma unroll
    for (int e = 0; e < kWidth; ++e) passed[e] = true;
  }
}

// The sums of a block of rows over kWidth-channel groups (16 bytes where the
// channel count and pointers allow, one channel otherwise).
template <class T, int kWidth>
__global__ void __launch_bounds__(kThreads) sums_kernel(SumsArgs a) {
  const int64_t channels = a.shape.channels;
  const int groups = int(channels / kWidth), lanes = groups < kGroupsPerBlock ? groups : kGroupsPerBlock;
  const int rows_in_flight = kThreads / lanes;  // rows the block reads at once, lanes groups of each
  const int lane = threadIdx.x % lanes, row_lane = threadIdx.x / lanes;
  const int group = blockIdx.x * kGroupsPerBlock + lane;
  const int c = group * kWidth;
  const int64_t begin = blockIdx.y * a.block_rows;
  const int64_t end = begin + a.block_rows < a.shape.rows ? begin + a.block_rows : a.shape.rows;
  float first[kWidth] = {}, second[kWidth] = {};
  if (row_lane < rows_in_flight && group < groups) {
    if (a.grad_out == nullptr) {
      float shift[kWidth];
      load<T, kWidth>(a.y, c, shift);
      for (int64_t r = begin + row_lane; r < end; r += rows_in_flight) {
        float v[kWidth];
        load<T, kWidth>(a.y, r * channels + c, v);
#pragma unroll
        for (int e = 0; e < kWidth; ++e) {
          const float d = __fsub_rn(v[e], shift[e]);
          first[e] = __fadd_rn(first[e], d);
          second[e] = __fadd_rn(second[e], __fmul_rn(d, d));
        }
      }
    } else {
      float mean[kWidth], invstd[kWidth];
      load_channels<kWidth>(a.mean, c, mean);
      load_channels<kWidth>(a.invstd, c, invstd);
      for (int64_t r = begin + row_lane; r < end; r += rows_in_flight) {
        const int64_t i = r * channels + c;
        float dz[kWidth], y[kWidth];
        bool passed[kWidth];
        load<T, kWidth>(a.grad_out, i, dz);
        load<T, kWidth>(a.y, i, y);
        relu_passed<T, kWidth>(a.out, a.relu_mask, i, passed);
#pragma unroll
        for (int e = 0; e < kWidth; ++e) dz[e] = passed[e] ? dz[e] : 0.0f;
#pragma unroll
        for (int e = 0; e < kWidth; ++e) {
          const float xhat = __fmul_rn(__fsub_rn(y[e], mean[e]), invstd[e]);
          first[e] = __fadd_rn(first[e], dz[e]);
          second[e] = __fadd_rn(second[e], __fmul_rn(dz[e], xhat));
        }
      }
    }
  }
  float* sums = reinterpret_cast<float*>(smem);  // [2][kWidth][kThreads]
#pragma unroll
  for (int e = 0; e < kWidth; ++e) {
    sums[e * kThreads + threadIdx.x] = first[e];
    sums[(kWidth + e) * kThreads + threadIdx.x] = second[e];
  }
  __syncthreads();
  // Each of the block's 2 x lanes x kWidth totals summed over its rows in flight, in order.
  const int totals = 2 * lanes * kWidth;
  for (int t = threadIdx.x; t < totals; t += kThreads) {
    const int sum = t / (lanes * kWidth), within = t % (lanes * kWidth), g = within / kWidth, e = within % kWidth;
    if (blockIdx.x * kGroupsPerBlock + g >= groups) continue;
    const float* column = sums + (sum * kWidth + e) * kThreads + g;
    float total = 0.0f;
    for (int r = 0; r < rows_in_flight; ++r) total = __fadd_rn(total, column[r * lanes]);
    const int64_t channel = int64_t(blockIdx.x * kGroupsPerBlock + g) * kWidth + e;
    a.partial[(sum * int64_t(gridDim.y) + blockIdx.y) * channels + channel] = total;
  }
}

// One channel's statistics, turned into what the elementwise pass and
// backward take; the running statistics updated in fp32, as torch does.
__device__ __forceinline__ void finish_forward(const FinishArgs& a, int64_t c, float mean, double var) {
  const BatchNormChannels& ch = a.channels;
  if ((a.partial != nullptr || a.mean_var != nullptr) && ch.running_mean != nullptr) {
    const double rows = double(a.shape.rows);
    const float unbiased = float(var * rows / (rows - 1.0));
    ch.running_mean[c] = __fadd_rn(__fmul_rn(ch.momentum, mean), __fmul_rn(1.0f - ch.momentum, ch.running_mean[c]));
    ch.running_var[c] = __fadd_rn(__fmul_rn(ch.momentum, unbiased), __fmul_rn(1.0f - ch.momentum, ch.running_var[c]));
  }
  const float invstd = float(1.0 / sqrt(var + ch.eps));
  const float scale = ch.weight == nullptr ? invstd : __fmul_rn(ch.weight[c], invstd);
  ch.mean[c] = mean;
  ch.invstd[c] = invstd;
  ch.scale[c] = scale;
  ch.shift[c] = __fsub_rn(ch.bias == nullptr ? 0.0f : ch.bias[c], __fmul_rn(mean, scale));
}

// A forward's channel without batch sums: from the given statistics, or the running ones.
__device__ __forceinline__ void finish_unsummed(const FinishArgs& a, int64_t c) {
  if (a.mean_var != nullptr) finish_forward(a, c, a.mean_var[c], double(a.mean_var[a.shape.channels + c]));
  else finish_forward(a, c, a.channels.running_mean[c], double(a.channels.running_var[c]));
}

// A channel's totals over the row blocks: backward's sums, or the
// forward's statistics (sums of y - y[0, c] and of its square).
template <class T>
__device__ __forceinline__ void finish_summed(const FinishArgs& a, int64_t c, double first, double second) {
  if (a.sum_first != nullptr) {
    a.sum_first[c] = float(first);
    a.sum_second[c] = float(second);
    return;
  }
  const double rows = double(a.shape.rows), offset = first / rows;
  const double variance = second / rows - offset * offset;
  finish_forward(a, c, float(double(element_at<T>(a.y, c)) + offset), variance > 0.0 ? variance : 0.0);
}

template <class T>
__global__ void __launch_bounds__(kThreads) finish_kernel(FinishArgs a) {
  const int64_t c = blockIdx.x, channels = a.shape.channels;
  if (a.partial == nullptr) {  // given or running statistics: nothing to sum
    if (threadIdx.x == 0) finish_unsummed(a, c);
    return;
  }
  double first = 0.0, second = 0.0;
  for (int64_t b = threadIdx.x; b < a.blocks; b += kThreads) {
    first += a.partial[b * channels + c];
    second += a.partial[(a.blocks + b) * channels + c];
  }
  double* sums = reinterpret_cast<double*>(smem);  // [2][kThreads]
  sums[threadIdx.x] = first;
  sums[kThreads + threadIdx.x] = second;
  __syncthreads();
  if (threadIdx.x != 0) return;
  first = second = 0.0;
  for (int t = 0; t < kThreads; ++t) {
    first += sums[t];
    second += sums[kThreads + t];
  }
  finish_summed<T>(a, c, first, second);
}

// Calls f(i, c) for each run of kWidth elements (i the first's index, c its
// channel), block by block over chunks of whole rows.
template <int kWidth, class F>
__device__ __forceinline__ void for_each_run(BatchNormShape shape, F&& f) {
  const int channels = int(shape.channels);
  const int chunk_rows = channels >= kChunkElements ? 1 : kChunkElements / channels;
  for (int64_t row = blockIdx.x * int64_t(chunk_rows); row < shape.rows; row += gridDim.x * int64_t(chunk_rows)) {
    const int64_t rows_left = shape.rows - row;
    const int extent = int(rows_left < chunk_rows ? rows_left : chunk_rows) * channels;
    for (int e = threadIdx.x * kWidth; e < extent; e += kThreads * kWidth) f(row * channels + e, e % channels);
  }
}

template <class T, int kWidth>
__global__ void __launch_bounds__(kThreads) act_kernel(ActArgs a) {
  for_each_run<kWidth>(a.shape, [&](int64_t i, int c) {
    float y[kWidth], r[kWidth], scale[kWidth], shift[kWidth];
    load<T, kWidth>(a.y, i, y);
    if (a.residual != nullptr) load<T, kWidth>(a.residual, i, r);
    load_channels<kWidth>(a.scale, c, scale);
    load_channels<kWidth>(a.shift, c, shift);
#pragma unroll
    for (int e = 0; e < kWidth; ++e) {
      float z = __fadd_rn(__fmul_rn(y[e], scale[e]), shift[e]);
      if (a.residual != nullptr) z = __fadd_rn(z, r[e]);
      if (a.relu && z < 0.0f) z = 0.0f;  // NaN stays NaN, as torch's relu keeps it
      y[e] = z;
    }
    store<T, kWidth>(a.out, i, y);
    if constexpr (kWidth == 8 && sizeof(T) == 2) {
      if (a.relu_mask != nullptr) {  // out > 0 as stored: a value that rounds to zero did not pass
        unsigned bits = 0;
#pragma unroll
        for (int e = 0; e < kWidth; ++e)
          bits |= unsigned(ElementTraits<T>::to_float(ElementTraits<T>::from_float(y[e])) > 0.0f) << e;
        a.relu_mask[i / 8] = uint8_t(bits);
      }
    }
  });
}

template <class T, int kWidth>
__global__ void __launch_bounds__(kThreads) grad_input_kernel(GradInputArgs a) {
  for_each_run<kWidth>(a.shape, [&](int64_t i, int c) {
    float dz[kWidth], dy[kWidth], scale[kWidth];
    bool passed[kWidth];
    load<T, kWidth>(a.grad_out, i, dz);
    relu_passed<T, kWidth>(a.out, a.relu_mask, i, passed);
#pragma unroll
    for (int e = 0; e < kWidth; ++e) dz[e] = passed[e] ? dz[e] : 0.0f;
    load_channels<kWidth>(a.scale, c, scale);
    if (a.sum_dz != nullptr) {
      float y[kWidth], mean[kWidth], invstd[kWidth], sum_dz[kWidth], sum_dz_xhat[kWidth];
      load<T, kWidth>(a.y, i, y);
      load_channels<kWidth>(a.mean, c, mean);
      load_channels<kWidth>(a.invstd, c, invstd);
      load_channels<kWidth>(a.sum_dz, c, sum_dz);
      load_channels<kWidth>(a.sum_dz_xhat, c, sum_dz_xhat);
#pragma unroll
      for (int e = 0; e < kWidth; ++e) {
        const float xhat = __fmul_rn(__fsub_rn(y[e], mean[e]), invstd[e]);
        const float mean_dz = __fmul_rn(sum_dz[e], a.inv_rows), mean_dz_xhat = __fmul_rn(sum_dz_xhat[e], a.inv_rows);
        dy[e] = __fmul_rn(scale[e], __fsub_rn(__fsub_rn(dz[e], mean_dz), __fmul_rn(xhat, mean_dz_xhat)));
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
