// The definition of launch_tile (gemm_tile_launch.h), included only by the
// gemm_tile_<name>.cu units that instantiate it.
#pragma once

#include <algorithm>
#include <climits>
#include <type_traits>

#include "gemm_tile_launch.h"
#include "launch_utils.h"
#include "wmma_gemm.cuh"

namespace mpgemm::kernels {
namespace tile_launch {

constexpr int64_t kMaxGridY = 65535;

// The table's shared-memory figure (gemm_plan.h) against the kernels' own.
template <class Config>
constexpr int wmma_smem_bytes() {
  using E = __half;
  return std::max({WmmaSmem<E, Config, true, true>::kBytes, WmmaSmem<E, Config, true, false>::kBytes,
                   WmmaSmem<E, Config, false, true>::kBytes, WmmaSmem<E, Config, false, false>::kBytes});
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

}  // namespace tile_launch

template <class Config>
cudaError_t launch_tile(const GemmParams& p, const GemmGrid& work, int vector, cudaStream_t stream,
                        bool a_row_major, bool b_row_major) {
  using namespace tile_launch;

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

}  // namespace mpgemm::kernels
