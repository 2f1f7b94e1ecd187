// Host-side dispatch of the GEMM: the problem's shape and plan (plan/), then
// the launch of the plan's tile (the WMMA tiles of wmma/ or the Hopper
// kernels of sm90/) and, for split-K, of the reduction.
#include <climits>

#include "common/launch_utils.h"
#include "common/math.h"
#include "gemm/launch.h"
#include "gemm/splitk_reduce.h"
#include "sm90/launch.h"
#include "wmma/launch.h"

namespace mpgemm::kernels {

GemmLaunch plan_gemm(const GemmParams& p, const GemmPlan& plan) {
  GemmLaunch launch{gemm_shape(p), plan};
  launch.workspace_bytes = workspace_bytes(launch.shape, plan);
  return launch;
}

GemmLaunch plan_gemm(const GemmParams& p) {
  const DeviceLimits device = device_limits();
  GemmShape shape = gemm_shape(p);
  // A Hopper GPU running a build without sm_90a code (an arch list without
  // 9.0) takes the WMMA tiles: the Hopper kernels there are empty.
  if (device.arch == 90 && !wgmma_available()) shape.wgmma = false;
  const GemmPlan plan = plan_gemm(shape, device);
  return {shape, plan, workspace_bytes(shape, plan)};
}

cudaError_t launch_gemm(const GemmParams& p, const GemmLaunch& launch, void* workspace, cudaStream_t stream) {
  if (p.batch <= 0 || p.m <= 0 || p.n <= 0) return cudaSuccess;
  // K-major: A row-major, B column-major (B^T row-major, as nn.Linear's
  // weight). Row-major wins when both strides are 1 (a single row or column).
  const bool a_k_major = p.a_col_stride == 1, b_k_major = p.b_col_stride != 1;
  if ((!a_k_major && p.a_row_stride != 1) || (b_k_major && p.b_row_stride != 1)) return cudaErrorInvalidValue;
  const GemmPlan& plan = launch.plan;
  const GemmShape& shape = launch.shape;
  if (shape.batch != p.batch || shape.m != p.m || shape.n != p.n || shape.k != p.k) return cudaErrorInvalidValue;
  // Whether the device holds the tile is prepare_launch's to say (and whether
  // it runs the Hopper path's sm_90a code, launch_wgmma_gemm's).
  const int any_arch = is_wgmma(plan.config) ? 90 : INT_MAX;
  const DeviceLimits any_device{INT_MAX, INT_MAX, any_arch};
  if (!admissible(shape, any_device, plan.config, plan.split_k) || plan.raster_group < 1 ||
      (plan.split_k > 1 && (workspace == nullptr || !aligned16(workspace))))
    return cudaErrorInvalidValue;
  const GemmGrid work{plan.raster_group, plan.split_k, static_cast<float*>(workspace)};
  const cudaError_t err = with_tile(
      AllTiles{}, plan.config,
      [&](auto tile) {
        using Tile = decltype(tile);
        if constexpr (Tile::kWgmma) return launch_wgmma_gemm<Tile>(p, work.raster_group, a_k_major, b_k_major, stream);
        else return launch_tile<Tile>(p, work, shape.vector, stream, a_k_major, b_k_major);
      },
      cudaErrorInvalidValue);
  if (err != cudaSuccess || plan.split_k == 1) return err;
  return launch_splitk_reduce(p, work.partials, work.split_k, stream);
}

}  // namespace mpgemm::kernels
