// Training batch norm's passes (norm/batch_norm.h): the row partition of the
// per-channel sums, the vector width of the elementwise passes, and the
// launches of norm/batch_norm_kernels.cuh for the element type: forward is
// sums, finish, elementwise (sums skipped with running statistics); apply is
// the forward's elementwise pass alone; backward sums, finish, elementwise,
// each skipped where nothing needs it. The kernel choice (batch_norm.h)
// takes the sums and backward's elementwise pass from
// norm/batch_norm_ahead_kernels.cuh (the same results, bit for bit), the
// finish from norm/batch_norm_line_finish.cuh.
#include <algorithm>
#include <cstdint>
#include <initializer_list>

#include "common/element_traits.cuh"
#include "norm/batch_norm.h"
#include "norm/batch_norm_ahead_kernels.cuh"
#include "norm/batch_norm_kernels.cuh"
#include "norm/batch_norm_line_finish.cuh"
#include "norm/max_pool_kernels.cuh"

namespace mpgemm::kernels {
namespace {

using batch_norm::kGroupsPerBlock;
using batch_norm::kThreads;

constexpr int64_t kMaxRowBlocks = 1024;
static_assert(kMaxRowBlocks <= batch_norm::kLineLanes * batch_norm::kLineBlocksPerLane,
              "the line finish's lanes hold every row block");
constexpr int64_t kMinRowsPerBlock = 128;
// About this many blocks of the sums in all: several waves on any GPU.
constexpr int64_t kSumsBlocks = 2048;
constexpr int64_t kMaxBlocks = 65535;

// Channels in a 16-byte run of the element type.
int64_t widest_run(BatchNormShape shape) { return shape.type == ElementType::kFloat32 ? 4 : 8; }

// Blocks across the channels at the widest runs: the row partition reads
// this, so that it depends on the shape alone (not on the pointers'
// alignment, which picks the runs' width).
int64_t channel_tiles(BatchNormShape shape) {
  const int64_t per_block = kGroupsPerBlock * widest_run(shape);
  return (shape.channels + per_block - 1) / per_block;
}

// Blocks across the channels at runs of `width` channels (the sums' grid's x).
int64_t channel_blocks(BatchNormShape shape, int64_t width) {
  const int64_t groups = shape.channels / width;
  return (groups + kGroupsPerBlock - 1) / kGroupsPerBlock;
}

template <class F>
cudaError_t visit_type(ElementType type, F&& f) {
  switch (type) {
    case ElementType::kFloat16: return f(ElementTag<__half>{});
    case ElementType::kBFloat16: return f(ElementTag<__nv_bfloat16>{});
    default: return f(ElementTag<float>{});
  }
}

template <class Kernel, class Args>
cudaError_t launch(Kernel* kernel, dim3 grid, int smem_bytes, Args args, cudaStream_t stream,
                   int threads = kThreads) {
  void* params[] = {&args};
  return cudaLaunchKernel(kernel, grid, dim3(threads), params, size_t(smem_bytes), stream);
}

// 16-byte runs where every run stays in one row and every pointer (the
// per-channel vectors' too) is aligned to them.
template <class T>
bool vectorized(BatchNormShape shape, std::initializer_list<const void*> pointers) {
  constexpr int64_t kWidth = 16 / sizeof(T);
  if (shape.channels % kWidth != 0) return false;
  for (const void* p : pointers)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
}

// A sum pass over the row blocks, when `finish` has partials to total, then
// the finish (a block per channel, or per 8 on the line finish).
cudaError_t launch_sums_and_finish(BatchNormShape shape, batch_norm::SumsArgs sums, batch_norm::FinishArgs finish,
                                   BatchNormKernelChoice choice, cudaStream_t stream) {
  const int64_t blocks = batch_norm_row_blocks(shape);
  sums.block_rows = (shape.rows + blocks - 1) / blocks;
  finish.blocks = blocks;
  return visit_type(shape.type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (finish.partial != nullptr) {
      constexpr int kWide = 16 / sizeof(T);
      const bool wide = vectorized<T>(shape, {sums.y, sums.grad_out, sums.out, sums.mean, sums.invstd});
      const dim3 grid(unsigned(channel_blocks(shape, wide ? kWide : 1)), unsigned(blocks));
      const auto kernel = choice.loads_ahead
                              ? (wide ? &batch_norm::sums_ahead_kernel<T, kWide> : &batch_norm::sums_ahead_kernel<T, 1>)
                              : (wide ? &batch_norm::sums_kernel<T, kWide> : &batch_norm::sums_kernel<T, 1>);
      if (const cudaError_t err = launch(kernel, grid, batch_norm::kSumsSmemBytes, sums, stream); err != cudaSuccess)
        return err;
    }
    if (choice.finish_by_lines) {
      // With nothing to sum (given or running statistics) only the first lane's 8 threads work: one warp.
      constexpr int64_t kPerBlock = batch_norm::kLineChannels;
      const bool summing = finish.partial != nullptr;
      return launch(&batch_norm::line_finish_kernel<T>, dim3(unsigned((shape.channels + kPerBlock - 1) / kPerBlock)),
                    summing ? batch_norm::kLineSmemBytes : 0, finish, stream, summing ? batch_norm::kLineThreads : 32);
    }
    return launch(&batch_norm::finish_kernel<T>, dim3(unsigned(shape.channels)), batch_norm::kFinishSmemBytes,
                  finish, stream);
  });
}

template <template <class, int> class Kernel, class Args>
cudaError_t launch_elementwise(BatchNormShape shape, Args args, std::initializer_list<const void*> pointers,
                               cudaStream_t stream) {
  const int64_t chunk_rows = shape.channels >= batch_norm::kChunkElements
                                 ? 1
                                 : batch_norm::kChunkElements / shape.channels;
  const int64_t chunks = (shape.rows + chunk_rows - 1) / chunk_rows;
  const dim3 grid(unsigned(chunks < kMaxBlocks ? chunks : kMaxBlocks));
  return visit_type(shape.type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (vectorized<T>(shape, pointers)) return launch(Kernel<T, 16 / sizeof(T)>::run, grid, 0, args, stream);
    return launch(Kernel<T, 1>::run, grid, 0, args, stream);
  });
}

// The elementwise kernels as class templates, for launch_elementwise.
template <class T, int kWidth>
struct Act {
  static constexpr auto run = &batch_norm::act_kernel<T, kWidth>;
};
template <class T, int kWidth>
struct GradInput {
  static constexpr auto run = &batch_norm::grad_input_kernel<T, kWidth>;
};
template <class T, int kWidth>
struct ActMaxPool {
  static constexpr auto run = &batch_norm::act_max_pool_kernel<T, kWidth>;
};
template <class T, int kWidth>
struct MaxPoolGrad {
  static constexpr auto run = &batch_norm::max_pool_grad_kernel<T, kWidth>;
};

bool empty(BatchNormShape shape) { return shape.rows <= 0 || shape.channels <= 0; }

// The forward's statistics into `channels`: the sums of y and their finish,
// or the finish alone from given or running statistics.
cudaError_t launch_statistics(BatchNormShape shape, const void* y, bool batch_stats, const float* batch_mean_var,
                              const BatchNormChannels& channels, float* workspace, BatchNormKernelChoice choice,
                              cudaStream_t stream) {
  if (batch_mean_var != nullptr && !batch_stats) return cudaErrorInvalidValue;
  if (channels.mean == nullptr || channels.invstd == nullptr || channels.scale == nullptr || channels.shift == nullptr)
    return cudaErrorInvalidValue;
  float* partial = workspace;
  const batch_norm::SumsArgs sums{shape, y, nullptr, nullptr, nullptr, nullptr, nullptr, 0, partial};
  const bool sums_of_y = batch_stats && batch_mean_var == nullptr;
  const batch_norm::FinishArgs finish{shape, y, sums_of_y ? partial : nullptr, batch_mean_var, 0, nullptr, nullptr,
                                      channels};
  return launch_sums_and_finish(shape, sums, finish, choice, stream);
}

// kernel(args) over the pool's images (the grid's y) and each image's runs
// of channels (its x), 16-byte runs where the tensors and the window's
// bytes, 4 or 8 a run, are aligned to them.
template <template <class, int> class Kernel, class Args>
cudaError_t launch_pool_kernel(BatchNormShape shape, int64_t image_pixels, int batch, const uint8_t* window,
                               std::initializer_list<const void*> pointers, Args args, cudaStream_t stream) {
  return visit_type(shape.type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kWide = 16 / sizeof(T);
    const bool wide = vectorized<T>(shape, pointers) && reinterpret_cast<uintptr_t>(window) % 8 == 0;
    const int64_t runs = image_pixels * (wide ? shape.channels / kWide : shape.channels);
    if (runs == 0) return cudaSuccess;
    const dim3 grid(unsigned(std::min<int64_t>((runs + kThreads - 1) / kThreads, kMaxBlocks)),
                    unsigned(std::min<int64_t>(batch, kMaxBlocks)));
    return wide ? launch(Kernel<T, kWide>::run, grid, 0, args, stream)
                : launch(Kernel<T, 1>::run, grid, 0, args, stream);
  });
}

}  // namespace

int batch_norm_row_blocks(BatchNormShape shape) {
  // About kSumsBlocks blocks of channels x rows in all, each summing at
  // least kMinRowsPerBlock rows.
  const int64_t by_rows = (shape.rows + kMinRowsPerBlock - 1) / kMinRowsPerBlock;
  const int64_t tiles = channel_tiles(shape) > 0 ? channel_tiles(shape) : 1;
  int64_t blocks = by_rows < kSumsBlocks / tiles ? by_rows : kSumsBlocks / tiles;
  blocks = blocks < kMaxRowBlocks ? blocks : kMaxRowBlocks;
  return int(blocks > 1 ? blocks : 1);
}

int64_t batch_norm_workspace_floats(BatchNormShape shape) {
  // Two sums per channel per row block, and two per-channel vectors
  // (backward's sums where the caller takes none).
  return (2 * int64_t(batch_norm_row_blocks(shape)) + 2) * shape.channels;
}

bool batch_norm_relu_mask_fits(BatchNormShape shape, std::initializer_list<const void*> tensors) {
  return shape.type != ElementType::kFloat32 && vectorized<__half>(shape, tensors);
}

cudaError_t launch_batch_norm_forward(BatchNormShape shape, const void* y, const void* residual, bool relu,
                                      bool batch_stats, const float* batch_mean_var,
                                      const BatchNormChannels& channels, float* workspace, void* out,
                                      uint8_t* relu_mask, BatchNormKernelChoice choice, cudaStream_t stream) {
  if (empty(shape)) return cudaSuccess;
  if (relu_mask != nullptr && !(relu && batch_norm_relu_mask_fits(shape, {y, out, residual == nullptr ? y : residual})))
    return cudaErrorInvalidValue;
  if (const cudaError_t err =
          launch_statistics(shape, y, batch_stats, batch_mean_var, channels, workspace, choice, stream);
      err != cudaSuccess)
    return err;
  const batch_norm::ActArgs args{shape, y, channels.scale, channels.shift, residual, relu, out, relu_mask};
  return launch_elementwise<Act>(shape, args,
                                 {y, out, residual == nullptr ? y : residual, channels.scale, channels.shift}, stream);
}

cudaError_t launch_batch_norm_relu_max_pool(BatchNormShape shape, const void* y, bool batch_stats,
                                            const float* batch_mean_var, const BatchNormChannels& channels,
                                            float* workspace, MaxPoolWindow pool, void* out, uint8_t* window,
                                            BatchNormKernelChoice choice, cudaStream_t stream) {
  if (empty(shape)) return cudaSuccess;
  if (!max_pool_window_fits(pool, shape.channels) || int64_t(pool.batch) * pool.height * pool.width != shape.rows)
    return cudaErrorInvalidValue;
  if (const cudaError_t err =
          launch_statistics(shape, y, batch_stats, batch_mean_var, channels, workspace, choice, stream);
      err != cudaSuccess)
    return err;
  const batch_norm::ActMaxPoolArgs args{shape, pool, y, channels.scale, channels.shift, out, window};
  return launch_pool_kernel<ActMaxPool>(shape, int64_t(pool.out_height) * pool.out_width, pool.batch, window,
                                        {y, out, channels.scale, channels.shift}, args, stream);
}

cudaError_t launch_max_pool_grad(BatchNormShape shape, MaxPoolWindow pool, const void* grad_out,
                                 const uint8_t* window, void* grad_input, cudaStream_t stream) {
  if (empty(shape)) return cudaSuccess;
  if (!max_pool_window_fits(pool, shape.channels) || int64_t(pool.batch) * pool.height * pool.width != shape.rows)
    return cudaErrorInvalidValue;
  const batch_norm::MaxPoolGradArgs args{shape, pool, grad_out, window, grad_input};
  return launch_pool_kernel<MaxPoolGrad>(shape, int64_t(pool.height) * pool.width, pool.batch, window,
                                         {grad_out, grad_input}, args, stream);
}

cudaError_t launch_batch_norm_apply(BatchNormShape shape, const void* y, const float* scale, const float* shift,
                                    bool relu, void* out, cudaStream_t stream) {
  if (empty(shape)) return cudaSuccess;
  const batch_norm::ActArgs args{shape, y, scale, shift, nullptr, relu, out, nullptr};
  return launch_elementwise<Act>(shape, args, {y, out, scale, shift}, stream);
}

cudaError_t launch_batch_norm_backward(BatchNormShape shape, const BatchNormGrad& g, bool batch_stats,
                                       float* workspace, float* sum_dz, float* sum_dz_xhat, void* grad_y,
                                       void* grad_z, BatchNormKernelChoice choice, cudaStream_t stream) {
  if (empty(shape)) return cudaSuccess;
  // The input gradient with batch statistics needs the sums; write them to
  // the workspace where the caller did not ask for them.
  const bool sums_needed = sum_dz != nullptr || (grad_y != nullptr && batch_stats);
  if (sums_needed) {
    float* partial = workspace + 2 * shape.channels;
    if (sum_dz == nullptr) sum_dz = workspace, sum_dz_xhat = workspace + shape.channels;
    const batch_norm::SumsArgs sums{shape, g.y, g.grad_out, g.out, g.relu_mask, g.mean, g.invstd, 0, partial};
    const batch_norm::FinishArgs finish{shape, nullptr, partial, nullptr, 0, sum_dz, sum_dz_xhat, {}};
    if (const cudaError_t err = launch_sums_and_finish(shape, sums, finish, choice, stream); err != cudaSuccess)
      return err;
  }
  if (grad_y == nullptr && grad_z == nullptr) return cudaSuccess;
  const bool with_sums = batch_stats && grad_y != nullptr;
  const batch_norm::GradInputArgs args{shape, g.grad_out, g.out, g.relu_mask, g.y, g.mean, g.invstd, g.scale,
                                       with_sums ? sum_dz : nullptr, with_sums ? sum_dz_xhat : nullptr,
                                       1.0f / float(shape.rows), grad_y, grad_z};
  const void* out = g.out == nullptr ? g.y : g.out;
  const void* written = grad_y != nullptr ? grad_y : grad_z;
  const std::initializer_list<const void*> pointers{
      g.grad_out, out, g.y, written, grad_z ? grad_z : written, g.mean, g.invstd, g.scale,
      args.sum_dz ? args.sum_dz : g.scale, args.sum_dz_xhat ? args.sum_dz_xhat : g.scale};
  if (!choice.loads_ahead) return launch_elementwise<GradInput>(shape, args, pointers, stream);
  // The rows' input gradient, on the sums' partition.
  const int64_t blocks = batch_norm_row_blocks(shape);
  const batch_norm::GradInputAheadArgs ahead{args, (shape.rows + blocks - 1) / blocks};
  return visit_type(shape.type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr int kWide = 16 / sizeof(T);
    const bool wide = vectorized<T>(shape, pointers);
    const dim3 grid(unsigned(channel_blocks(shape, wide ? kWide : 1)), unsigned(blocks));
    return launch(wide ? &batch_norm::grad_input_ahead_kernel<T, kWide> : &batch_norm::grad_input_ahead_kernel<T, 1>,
                  grid, 0, ahead, stream);
  });
}

}  // namespace mpgemm::kernels
