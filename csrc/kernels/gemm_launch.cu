// Host-side dispatch of the WMMA GEMM: the operand layouts and load width,
// the plan (gemm_plan.h: tile configuration, split-K, tile order), then the
// launch of the GEMM and, for split-K, of the reduction.
#include <algorithm>
#include <climits>
#include <type_traits>

#include "gemm_config.h"
#include "gemm_launch.h"
#include "launch_utils.h"
#include "splitk_reduce.cuh"
#include "wmma_gemm.cuh"

namespace mpgemm::kernels {
namespace {

constexpr int64_t kMaxGridY = 65535;
// Blocks of the split-K reduction; a grid-stride loop covers the rest.
constexpr int64_t kMaxReduceBlocks = 4096;

// The table's shared-memory figures (gemm_plan.h) against the kernels' own.
template <class Config>
constexpr int wmma_smem_bytes() {
  using E = __half;
  return std::max({WmmaSmem<E, Config, true, true>::kBytes, WmmaSmem<E, Config, true, false>::kBytes,
                   WmmaSmem<E, Config, false, true>::kBytes, WmmaSmem<E, Config, false, false>::kBytes});
}
static_assert(tile_config(TileConfigId::kWide).smem_bytes == wmma_smem_bytes<WideTileConfig>());
static_assert(tile_config(TileConfigId::kTall).smem_bytes == wmma_smem_bytes<TallTileConfig>());
static_assert(tile_config(TileConfigId::kSquare).smem_bytes == wmma_smem_bytes<SquareTileConfig>());
static_assert(tile_config(TileConfigId::kCompact).smem_bytes == wmma_smem_bytes<CompactTileConfig>());
static_assert(tile_config(TileConfigId::kSmall).smem_bytes == wmma_smem_bytes<SmallTileConfig>());
static_assert(tile_config(TileConfigId::kScalar).smem_bytes == wmma_smem_bytes<ScalarTileConfig>());

// Refuses a tile whose kernel is empty in the code the device runs (built for
// an arch below the tile's min_arch: kTileCompiled), as check_kernel_arch does
// for element types.
template <class Config, class Kernel>
cudaError_t check_tile_arch(Kernel* kernel) {
  if constexpr (tile_min_arch<Config>() > 75) {
    cudaFuncAttributes attributes;
    if (const cudaError_t err = cudaFuncGetAttributes(&attributes, kernel); err != cudaSuccess) return err;
    if (attributes.ptxVersion < tile_min_arch<Config>()) return cudaErrorNotSupported;
  }
  return cudaSuccess;
}

template <class Element, class Config, bool ARowMajor, bool BRowMajor, int Vector>
cudaError_t launch(const GemmParams& p, const GemmGrid& work, cudaStream_t stream) {
  constexpr int kSmemBytes = WmmaSmem<Element, Config, ARowMajor, BRowMajor>::kBytes;
  auto* kernel = &wmma_gemm_kernel<Element, Config, ARowMajor, BRowMajor, Vector>;
  if (const cudaError_t err = check_tile_arch<Config>(kernel); err != cudaSuccess) return err;
  if (const cudaError_t err = prepare_launch<Element>(kernel, kSmemBytes); err != cudaSuccess) return err;
  const int64_t blocks = TileScheduler<Config>::tiles(p.m, p.n) * work.split_k;
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(p.batch < kMaxGridY ? p.batch : kMaxGridY));
  GemmParams params = p;
  GemmGrid grid_args = work;
  void* args[] = {&params, &grid_args};
  return cudaLaunchKernel(kernel, grid, dim3(Config::kThreads), args, kSmemBytes, stream);
}

cudaError_t launch_reduce(const GemmParams& p, const GemmGrid& work, cudaStream_t stream) {
  const int64_t blocks = std::min((p.m * p.n + kSplitKReduceThreads - 1) / kSplitKReduceThreads, kMaxReduceBlocks);
  GemmParams params = p;
  const float* partials = work.partials;
  int split_k = work.split_k;
  void* args[] = {&params, &partials, &split_k};
  return cudaLaunchKernel(&splitk_reduce_kernel, dim3(unsigned(blocks)), dim3(kSplitKReduceThreads), args, 0, stream);
}

// Calls f(std::integral_constant<bool, value>) so a runtime flag picks a template.
template <class F>
cudaError_t with_flag(bool value, F&& f) {
  return value ? f(std::true_type{}) : f(std::false_type{});
}

// Calls f(std::integral_constant<int, vector>) for the load widths Config
// runs at: one element for ScalarTileConfig; 8 only for SquareTileConfig,
// whose sm_75 build (register-staged, 4 warps of 64x64) already takes 255
// registers and spills with the 4x more load addresses of narrower chunks;
// 8, 4 or 2 for the others.
template <class Config, class F>
cudaError_t with_vector(int vector, F&& f) {
  if constexpr (std::is_same_v<Config, ScalarTileConfig>) return f(std::integral_constant<int, 1>{});
  else if constexpr (std::is_same_v<Config, SquareTileConfig>) return f(std::integral_constant<int, 8>{});
  else if (vector == 8) return f(std::integral_constant<int, 8>{});
  else if (vector == 4) return f(std::integral_constant<int, 4>{});
  else return f(std::integral_constant<int, 2>{});
}

template <class Config>
cudaError_t launch_layout(const GemmParams& p, const GemmGrid& work, int vector, cudaStream_t stream,
                          bool a_row_major, bool b_row_major) {
  return with_input_element(p.ab_type, [&](auto element) {
    return with_flag(a_row_major, [&](auto a_row) {
      return with_flag(b_row_major, [&](auto b_row) {
        return with_vector<Config>(vector, [&](auto width) {
          return launch<typename decltype(element)::type, Config, decltype(a_row)::value, decltype(b_row)::value,
                        decltype(width)::value>(p, work, stream);
        });
      });
    });
  });
}

cudaError_t launch_config(TileConfigId id, const GemmParams& p, const GemmGrid& work, int vector,
                          cudaStream_t stream, bool a_row_major, bool b_row_major) {
  switch (id) {
    case TileConfigId::kWide: return launch_layout<WideTileConfig>(p, work, vector, stream, a_row_major, b_row_major);
    case TileConfigId::kTall: return launch_layout<TallTileConfig>(p, work, vector, stream, a_row_major, b_row_major);
    case TileConfigId::kSquare:
      return launch_layout<SquareTileConfig>(p, work, vector, stream, a_row_major, b_row_major);
    case TileConfigId::kCompact:
      return launch_layout<CompactTileConfig>(p, work, vector, stream, a_row_major, b_row_major);
    case TileConfigId::kSmall: return launch_layout<SmallTileConfig>(p, work, vector, stream, a_row_major, b_row_major);
    case TileConfigId::kScalar:
      return launch_layout<ScalarTileConfig>(p, work, vector, stream, a_row_major, b_row_major);
    default: return cudaErrorInvalidValue;
  }
}

// The widest chunk, in elements (8, 4, 2 or 1: 16, 8, 4 or 2 bytes), that an
// operand's loads may take: the base aligned to the chunk, rows and batches a
// whole number of chunks apart, and a contiguous extent that splits into whole
// chunks (a partial chunk at the K edge would move every later K slice off
// alignment, see KPartition).
int operand_vector_width(const void* data, int64_t batch_stride, int64_t ld, int64_t inner_extent) {
  for (int vector : {8, 4, 2})
    if (reinterpret_cast<uintptr_t>(data) % (vector * 2) == 0 && batch_stride % vector == 0 && ld % vector == 0 &&
        inner_extent % vector == 0)
      return vector;
  return 1;
}

}  // namespace

GemmShape gemm_shape(const GemmParams& p) {
  // Row-major wins when both strides are 1 (a single row or column).
  const bool a_row_major = p.a_col_stride == 1, b_row_major = p.b_col_stride == 1;
  // One width for both operands: the narrower one's.
  const int vector = std::min(
      operand_vector_width(p.a, p.a_batch_stride, a_row_major ? p.a_row_stride : p.a_col_stride,
                           a_row_major ? p.k : p.m),
      operand_vector_width(p.b, p.b_batch_stride, b_row_major ? p.b_row_stride : p.b_col_stride,
                           b_row_major ? p.n : p.k));
  return {p.batch, p.m, p.n, p.k, vector};
}

GemmPlan plan_gemm(const GemmParams& p) { return plan_gemm(gemm_shape(p), device_limits()); }

size_t gemm_workspace_bytes(const GemmParams& p, const GemmPlan& plan) {
  return workspace_bytes(gemm_shape(p), plan);
}

cudaError_t launch_gemm(const GemmParams& p, const GemmPlan& plan, void* workspace, cudaStream_t stream) {
  if (p.batch <= 0 || p.m <= 0 || p.n <= 0) return cudaSuccess;
  const bool a_row_major = p.a_col_stride == 1;
  const bool b_row_major = p.b_col_stride == 1;
  if ((!a_row_major && p.a_row_stride != 1) || (!b_row_major && p.b_row_stride != 1))
    return cudaErrorInvalidValue;
  // Whether the device holds the tile is prepare_launch's to say.
  constexpr DeviceLimits kAnyDevice{INT_MAX, INT_MAX, INT_MAX};
  if (!admissible(gemm_shape(p), kAnyDevice, plan.config, plan.split_k) || plan.raster_group < 1 ||
      (plan.split_k > 1 && (workspace == nullptr || !aligned16(workspace))))
    return cudaErrorInvalidValue;
  const GemmGrid work{plan.raster_group, plan.split_k, static_cast<float*>(workspace)};
  const int vector = gemm_shape(p).vector;
  if (const cudaError_t err = launch_config(plan.config, p, work, vector, stream, a_row_major, b_row_major);
      err != cudaSuccess || plan.split_k == 1)
    return err;
  return launch_reduce(p, work, stream);
}

}  // namespace mpgemm::kernels
