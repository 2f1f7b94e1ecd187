// The definition of launch_tile (wmma/launch.h), included only by the units
// that instantiate it.
#pragma once

#include <algorithm>
#include <climits>
#include <type_traits>

#include "common/launch_utils.h"
#include "common/tile_scheduler.cuh"
#include "wmma/gemm_kernel.cuh"
#include "wmma/launch.h"

namespace mpgemm::kernels {
namespace wmma_launch {

// The tile's shared-memory figure (common/tile_configs.h) against the kernels' own.
template <class Tile>
constexpr int wmma_smem_bytes() {
  using E = __half;
  return std::max({WmmaSmem<E, Tile, true, true>::kBytes, WmmaSmem<E, Tile, true, false>::kBytes,
                   WmmaSmem<E, Tile, false, true>::kBytes, WmmaSmem<E, Tile, false, false>::kBytes});
}

template <class Element, class Tile, bool AKMajor, bool BKMajor, int Vector>
cudaError_t launch(const GemmParams& p, const GemmGrid& work, cudaStream_t stream) {
  static_assert(wmma_smem_bytes<Tile>() == Tile::kSmemBytes, "the tile's shared memory is its kernels' largest");
  constexpr int kSmemBytes = WmmaSmem<Element, Tile, AKMajor, BKMajor>::kBytes;
  auto* kernel = &wmma_gemm_kernel<Element, Tile, AKMajor, BKMajor, Vector>;
  if (const cudaError_t err = check_tile_arch<Tile>(kernel); err != cudaSuccess) return err;
  if (const cudaError_t err = prepare_launch<Element>(kernel, kSmemBytes); err != cudaSuccess) return err;
  const int64_t blocks = TileScheduler<Tile>::tiles(p.m, p.n) * work.split_k;
  if (blocks > INT_MAX) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(p.batch < kMaxGridY ? p.batch : kMaxGridY));
  GemmParams params = p;
  GemmGrid grid_args = work;
  void* args[] = {&params, &grid_args};
  return cudaLaunchKernel(kernel, grid, dim3(Tile::kThreads), args, kSmemBytes, stream);
}

// Calls f(std::integral_constant<bool, value>) so a runtime flag picks a template.
template <class F>
cudaError_t with_flag(bool value, F&& f) {
  return value ? f(std::true_type{}) : f(std::false_type{});
}

// Calls f(std::integral_constant<int, width>) for the widest of Tile's load
// widths, from Width down, that `vector` reaches; its narrowest otherwise
// (which the plan admits only where `vector` reaches it too).
template <class Tile, int Width = Tile::kWidestLoad, class F>
cudaError_t with_load_width(int vector, F&& f) {
  if constexpr (Width == Tile::kNarrowestLoad) {
    return f(std::integral_constant<int, Width>{});
  } else {
    if (vector >= Width) return f(std::integral_constant<int, Width>{});
    return with_load_width<Tile, Width / 2>(vector, f);
  }
}

}  // namespace wmma_launch

template <class Tile>
cudaError_t launch_tile(const GemmParams& p, const GemmGrid& work, int vector, cudaStream_t stream, bool a_k_major,
                        bool b_k_major) {
  using namespace wmma_launch;

  return with_input_element(p.ab_type, [&](auto element) {
    return with_flag(a_k_major, [&](auto a_k) {
      return with_flag(b_k_major, [&](auto b_k) {
        return with_load_width<Tile>(vector, [&](auto width) {
          return launch<typename decltype(element)::type, Tile, decltype(a_k)::value, decltype(b_k)::value,
                        decltype(width)::value>(p, work, stream);
        });
      });
    });
  });
}

}  // namespace mpgemm::kernels
