// Host-side dispatch of the WMMA GEMM: the operand layouts and load width,
// the plan (gemm_plan.h: tile configuration, split-K, tile order), then the
// launch of the GEMM and, for split-K, of the reduction.
#include <algorithm>
#include <climits>

#include "gemm_launch.h"
#include "gemm_tile_launch.h"
#include "gemm_wgmma.h"
#include "launch_utils.h"
#include "splitk_reduce.h"

namespace mpgemm::kernels {
namespace {

cudaError_t launch_config(TileConfigId id, const GemmParams& p, const GemmGrid& work, int vector,
                          cudaStream_t stream, bool a_row_major, bool b_row_major) {
  switch (id) {
    case TileConfigId::kWide: return launch_tile<WideTileConfig>(p, work, vector, stream, a_row_major, b_row_major);
    case TileConfigId::kTall: return launch_tile<TallTileConfig>(p, work, vector, stream, a_row_major, b_row_major);
    case TileConfigId::kSquare:
      return launch_tile<SquareTileConfig>(p, work, vector, stream, a_row_major, b_row_major);
    case TileConfigId::kCompact:
      return launch_tile<CompactTileConfig>(p, work, vector, stream, a_row_major, b_row_major);
    case TileConfigId::kSmall: return launch_tile<SmallTileConfig>(p, work, vector, stream, a_row_major, b_row_major);
    case TileConfigId::kScalar:
      return launch_tile<ScalarTileConfig>(p, work, vector, stream, a_row_major, b_row_major);
    case TileConfigId::kWgmma:
    case TileConfigId::kWgmmaPair:
    case TileConfigId::kWgmmaPingPong: return launch_wgmma_gemm(p, id, work.raster_group, stream);
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
    if (aligned_to(data, 2 * vector) && batch_stride % vector == 0 && ld % vector == 0 &&
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
  // The Hopper kernels store D in fp32 or the inputs' type only (wgmma_gemm.cuh's store_accumulators).
  const bool wgmma =
      (p.d_type == ElementType::kFloat32 || p.d_type == p.ab_type) &&
      tma_describable(p.a, 2, p.batch, p.a_batch_stride, a_row_major ? p.a_row_stride : p.a_col_stride,
                      a_row_major ? p.k : p.m, a_row_major ? p.m : p.k) &&
      tma_describable(p.b, 2, p.batch, p.b_batch_stride, b_row_major ? p.b_row_stride : p.b_col_stride,
                      b_row_major ? p.n : p.k, b_row_major ? p.k : p.n) &&
      std::max({p.batch, p.m, p.n, p.k}) <= INT_MAX;
  return {p.batch, p.m, p.n, p.k, vector, wgmma};
}

GemmPlan plan_gemm(const GemmParams& p) {
  const DeviceLimits device = device_limits();
  GemmShape shape = gemm_shape(p);
  // A Hopper GPU running a build without sm_90a code (an arch list without
  // 9.0) takes the WMMA tiles: the Hopper kernels there are empty.
  if (device.arch == 90 && !wgmma_available()) shape.wgmma = false;
  return plan_gemm(shape, device);
}

size_t gemm_workspace_bytes(const GemmParams& p, const GemmPlan& plan) {
  return workspace_bytes(gemm_shape(p), plan);
}

cudaError_t launch_gemm(const GemmParams& p, const GemmPlan& plan, void* workspace, cudaStream_t stream) {
  if (p.batch <= 0 || p.m <= 0 || p.n <= 0) return cudaSuccess;
  const bool a_row_major = p.a_col_stride == 1;
  const bool b_row_major = p.b_col_stride == 1;
  if ((!a_row_major && p.a_row_stride != 1) || (!b_row_major && p.b_row_stride != 1))
    return cudaErrorInvalidValue;
  // Whether the device holds the tile is prepare_launch's to say (and whether
  // it runs the Hopper path's sm_90a code, launch_wgmma_gemm's).
  const int any_arch = is_wgmma(plan.config) ? 90 : INT_MAX;
  const DeviceLimits any_device{INT_MAX, INT_MAX, any_arch};
  if (!admissible(gemm_shape(p), any_device, plan.config, plan.split_k) || plan.raster_group < 1 ||
      (plan.split_k > 1 && (workspace == nullptr || !aligned16(workspace))))
    return cudaErrorInvalidValue;
  const GemmGrid work{plan.raster_group, plan.split_k, static_cast<float*>(workspace)};
  const int vector = gemm_shape(p).vector;
  if (const cudaError_t err = launch_config(plan.config, p, work, vector, stream, a_row_major, b_row_major);
      err != cudaSuccess || plan.split_k == 1)
    return err;
  return launch_splitk_reduce(p, work.partials, work.split_k, stream);
}

}  // namespace mpgemm::kernels
