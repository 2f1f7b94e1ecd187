// Layer norm's passes over a 16-bit x of `rows` x `cols` with fp32 weights
// (norm/layer_norm_math.h has the arithmetic): the forward's y, mean and
// rstd; backward's dx; the weights' gradients as column sums.
//
// Why: a prepared transformer's activations are 16-bit and its norms'
// weights fp32. torch's layer norm takes one type for both, so the layer
// computed in fp32 on a widened copy (torch.amp's autocast does the same):
// forward 2 + 4 + 4 + 4 + 2 = 16 bytes an element over three passes,
// backward about 38 over five (widen dy and x, torch's fp32 backward, its
// weights' kernel, narrow dx). These read the 16-bit tensors as they are:
// forward 4 bytes an element, backward 10 (dx's pass 6, the weights' 4).
//
// Tiling: a warp takes a row (8 rows a block of 256 threads); each lane
// takes runs of 8 elements (one 16-byte load) where layer_norm_width allows,
// else of one, 32 runs apart, and reads the row again for each of its two
// or three steps (L1 or L2 holds it: 1.5 KiB at 768 columns). The weights'
// sums: a block takes 32 columns of a slab of rows, a lane a column, the 8
// warps its rows in turn (4 rows' loads issued before the first is used),
// then the warps' sums in order into the workspace; a last pass adds the
// slabs in order. No atomics anywhere.
#include <cstdint>
#include <type_traits>

#include "arch/smem.cuh"
#include "common/element_traits.cuh"
#include "common/math.h"
#include "common/vector_access.cuh"
#include "norm/layer_norm.h"

namespace mpgemm::kernels {
namespace {

constexpr int kThreads = kLayerNormLanes * kLayerNormWarps;
constexpr int kRowsAhead = 4;  // the weights' sums: rows whose loads a lane issues together
constexpr int64_t kMaxBlocks = (int64_t(1) << 31) - 1;  // gridDim.x's limit
// The weights' sums: each warp's two partial sums of its 32 columns, in shared memory.
constexpr size_t kPartialBytes = 2 * kLayerNormWarps * kLayerNormLanes * sizeof(float);

// The lanes' sum, in layer_norm_math.h's row_sum order.
__device__ __forceinline__ float lanes_sum(float v) {
#pragma unroll
  for (int bit = kLayerNormLanes / 2; bit >= 1; bit /= 2) v += __shfl_xor_sync(0xffffffffu, v, bit);
  return v;
}

__device__ __forceinline__ float weight_at(const float* w, int64_t i, float none) { return w ? w[i] : none; }

template <class T, int kWidth>
__global__ void __launch_bounds__(kThreads) layer_norm_forward_kernel(LayerNormTensors t) {
  const int lane = threadIdx.x % kLayerNormLanes, warp = threadIdx.x / kLayerNormLanes;
  const int64_t row = int64_t(blockIdx.x) * kLayerNormWarps + warp;
  if (row >= t.rows) return;  // the whole warp: no lane is left in a shuffle
  const int64_t base = row * t.cols, step = int64_t(kLayerNormLanes) * kWidth;
  float sum = 0.0f;
  for (int64_t i = int64_t(lane) * kWidth; i < t.cols; i += step) {
    float x[kWidth];
    load<T, kWidth>(t.x, base + i, x);
#pragma unroll
    for (int e = 0; e < kWidth; ++e) sum = sum + x[e];
  }
  const float mean = lanes_sum(sum) / float(t.cols);
  float squares = 0.0f;
  for (int64_t i = int64_t(lane) * kWidth; i < t.cols; i += step) {
    float x[kWidth];
    load<T, kWidth>(t.x, base + i, x);
#pragma unroll
    for (int e = 0; e < kWidth; ++e) {
      const float d = x[e] - mean;
      squares = fmaf(d, d, squares);
    }
  }
  const float rstd = layer_norm_rstd(lanes_sum(squares), t.cols, t.eps);
  for (int64_t i = int64_t(lane) * kWidth; i < t.cols; i += step) {
    float x[kWidth], y[kWidth];
    load<T, kWidth>(t.x, base + i, x);
#pragma unroll
    for (int e = 0; e < kWidth; ++e)
      y[e] = layer_norm_output(x[e], mean, rstd, weight_at(t.weight, i + e, 1.0f), weight_at(t.bias, i + e, 0.0f));
    store<T, kWidth>(t.y, base + i, y);
  }
  if (lane == 0) t.mean[row] = mean, t.rstd[row] = rstd;
}

template <class T, int kWidth>
__global__ void __launch_bounds__(kThreads) layer_norm_grad_input_kernel(LayerNormTensors t) {
  const int lane = threadIdx.x % kLayerNormLanes, warp = threadIdx.x / kLayerNormLanes;
  const int64_t row = int64_t(blockIdx.x) * kLayerNormWarps + warp;
  if (row >= t.rows) return;
  const int64_t base = row * t.cols, step = int64_t(kLayerNormLanes) * kWidth;
  const float mean = t.mean[row], rstd = t.rstd[row];
  float sum_g = 0.0f, sum_g_xhat = 0.0f;
  for (int64_t i = int64_t(lane) * kWidth; i < t.cols; i += step) {
    float x[kWidth], dy[kWidth];
    load<T, kWidth>(t.x, base + i, x);
    load<T, kWidth>(t.grad, base + i, dy);
#pragma unroll
    for (int e = 0; e < kWidth; ++e) {
      const float g = t.weight ? product_rn(dy[e], t.weight[i + e]) : dy[e];
      sum_g = sum_g + g;
      sum_g_xhat = fmaf(g, normalized(x[e], mean, rstd), sum_g_xhat);
    }
  }
  const float mean_g = lanes_sum(sum_g) / float(t.cols), mean_g_xhat = lanes_sum(sum_g_xhat) / float(t.cols);
  for (int64_t i = int64_t(lane) * kWidth; i < t.cols; i += step) {
    float x[kWidth], dy[kWidth], dx[kWidth];
    load<T, kWidth>(t.x, base + i, x);
    load<T, kWidth>(t.grad, base + i, dy);
#pragma unroll
    for (int e = 0; e < kWidth; ++e) {
      const float g = t.weight ? product_rn(dy[e], t.weight[i + e]) : dy[e];
      dx[e] = layer_norm_grad_input(g, normalized(x[e], mean, rstd), mean_g, mean_g_xhat, rstd);
    }
    store<T, kWidth>(t.grad_x, base + i, dx);
  }
}

// Block (column tile blockIdx.x, slab blockIdx.y): the slab's sums of dy *
// xhat and dy for 32 columns, into workspace [2][slabs][cols].
template <class T>
__global__ void __launch_bounds__(kThreads) layer_norm_weight_sums_kernel(LayerNormTensors t, int64_t slab_rows) {
  auto* partial = reinterpret_cast<float(*)[kLayerNormWarps][kLayerNormLanes]>(smem);  // [2][warps][lanes]
  const int lane = threadIdx.x % kLayerNormLanes, warp = threadIdx.x / kLayerNormLanes;
  const int64_t col = int64_t(blockIdx.x) * kLayerNormLanes + lane;
  const int64_t begin = int64_t(blockIdx.y) * slab_rows;
  const int64_t end = begin + slab_rows < t.rows ? begin + slab_rows : t.rows;
  float acc_w = 0.0f, acc_b = 0.0f;
  if (col < t.cols) {
    const int64_t step = kLayerNormWarps;
    for (int64_t r = begin + warp; r < end; r += kRowsAhead * step) {
      float x[kRowsAhead] = {}, dy[kRowsAhead] = {}, mean[kRowsAhead] = {}, rstd[kRowsAhead] = {};
#pragma unroll
      for (int j = 0; j < kRowsAhead; ++j) {
        const int64_t rj = r + j * step;
        if (rj < end) {
          x[j] = element_at<T>(t.x, rj * t.cols + col), dy[j] = element_at<T>(t.grad, rj * t.cols + col);
          mean[j] = t.mean[rj], rstd[j] = t.rstd[rj];
        }
      }
#pragma unroll
      for (int j = 0; j < kRowsAhead; ++j) {
        if (r + j * step < end) {
          acc_w = fmaf(dy[j], normalized(x[j], mean[j], rstd[j]), acc_w);
          acc_b = acc_b + dy[j];
        }
      }
    }
  }
  partial[0][warp][lane] = acc_w, partial[1][warp][lane] = acc_b;
  __syncthreads();
  if (warp != 0 || col >= t.cols) return;
  float slab_w = 0.0f, slab_b = 0.0f;
#pragma unroll
  for (int w = 0; w < kLayerNormWarps; ++w)
    slab_w = slab_w + partial[0][w][lane], slab_b = slab_b + partial[1][w][lane];
  t.workspace[int64_t(blockIdx.y) * t.cols + col] = slab_w;
  t.workspace[(int64_t(gridDim.y) + blockIdx.y) * t.cols + col] = slab_b;
}

// Thread per column: the slabs' sums in order.
__global__ void __launch_bounds__(kThreads) layer_norm_weight_total_kernel(LayerNormTensors t, int64_t slabs) {
  const int64_t col = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (col >= t.cols) return;
  float total_w = 0.0f, total_b = 0.0f;
  for (int64_t s = 0; s < slabs; ++s)
    total_w = total_w + t.workspace[s * t.cols + col], total_b = total_b + t.workspace[(slabs + s) * t.cols + col];
  t.grad_weight[col] = total_w, t.grad_bias[col] = total_b;
}

bool valid(const LayerNormTensors& t) {
  return t.rows >= 0 && t.cols > 0 && (t.type == ElementType::kFloat16 || t.type == ElementType::kBFloat16);
}

// Runs launch(ElementTag<T>, width) for t's element type and width.
template <class Launch>
cudaError_t with_type_and_width(const LayerNormTensors& t, int width, const Launch& launch) {
  const auto with_type = [&](auto tag) {
    return width == 8 ? launch(tag, std::integral_constant<int, 8>{}) : launch(tag, std::integral_constant<int, 1>{});
  };
  return t.type == ElementType::kFloat16 ? with_type(ElementTag<__half>{}) : with_type(ElementTag<__nv_bfloat16>{});
}

// A row kernel over t's rows, 8 rows a block.
cudaError_t launch_rows(void (*kernel)(LayerNormTensors), const LayerNormTensors& t, cudaStream_t stream) {
  const int64_t blocks = ceil_div(t.rows, kLayerNormWarps);
  if (blocks > kMaxBlocks) return cudaErrorInvalidConfiguration;
  LayerNormTensors params = t;
  void* args[] = {&params};
  return cudaLaunchKernel(kernel, dim3(unsigned(blocks)), dim3(kThreads), args, 0, stream);
}

}  // namespace

cudaError_t launch_layer_norm_forward(const LayerNormTensors& t, cudaStream_t stream) {
  if (!valid(t)) return cudaErrorInvalidValue;
  if (t.rows == 0) return cudaSuccess;  // (torch's allocator gives empty tensors no address)
  if (!t.x || !t.y || !t.mean || !t.rstd) return cudaErrorInvalidValue;
  return with_type_and_width(t, layer_norm_width(t.cols, {t.x, t.y}), [&](auto tag, auto width) {
    return launch_rows(&layer_norm_forward_kernel<typename decltype(tag)::type, decltype(width)::value>, t, stream);
  });
}

cudaError_t launch_layer_norm_backward(const LayerNormTensors& t, cudaStream_t stream) {
  const bool weights = t.grad_weight || t.grad_bias;
  if (!valid(t)) return cudaErrorInvalidValue;
  // Without rows only the weights' gradients, zeros, are written.
  if (t.rows > 0 && (!t.x || !t.grad || !t.mean || !t.rstd)) return cudaErrorInvalidValue;
  if (weights && !(t.grad_weight && t.grad_bias && (t.workspace || t.rows == 0))) return cudaErrorInvalidValue;
  if (t.grad_x && t.rows > 0) {
    const cudaError_t error =
        with_type_and_width(t, layer_norm_width(t.cols, {t.x, t.grad, t.grad_x}), [&](auto tag, auto width) {
          return launch_rows(&layer_norm_grad_input_kernel<typename decltype(tag)::type, decltype(width)::value>, t,
                             stream);
        });
    if (error != cudaSuccess) return error;
  }
  if (!weights) return cudaSuccess;
  LayerNormTensors params = t;
  int64_t slab_rows = layer_norm_slab_rows(t.rows), slabs = layer_norm_slabs(t.rows);
  if (slabs > 0) {
    const int64_t column_tiles = ceil_div(t.cols, kLayerNormLanes);
    if (column_tiles > kMaxBlocks || slabs > 65535) return cudaErrorInvalidConfiguration;
    void* args[] = {&params, &slab_rows};
    const dim3 grid = dim3(unsigned(column_tiles), unsigned(slabs));
    const cudaError_t error = t.type == ElementType::kFloat16
                                  ? cudaLaunchKernel(&layer_norm_weight_sums_kernel<__half>, grid, dim3(kThreads),
                                                     args, kPartialBytes, stream)
                                  : cudaLaunchKernel(&layer_norm_weight_sums_kernel<__nv_bfloat16>, grid,
                                                     dim3(kThreads), args, kPartialBytes, stream);
    if (error != cudaSuccess) return error;
  }
  const int64_t blocks = ceil_div(t.cols, kThreads);
  if (blocks > kMaxBlocks) return cudaErrorInvalidConfiguration;
  void* args[] = {&params, &slabs};
  return cudaLaunchKernel(&layer_norm_weight_total_kernel, dim3(unsigned(blocks)), dim3(kThreads), args, 0, stream);
}

}  // namespace mpgemm::kernels
