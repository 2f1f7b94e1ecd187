// Host-side dispatch of the WMMA GEMM: picks the element type, the tile
// configuration, the operand layouts and the load width, then launches.
#include <algorithm>
#include <climits>
#include <type_traits>

#include "gemm_config.h"
#include "gemm_launch.h"
#include "launch_utils.h"
#include "wmma_gemm.cuh"

namespace mpgemm::kernels {
namespace {

constexpr int64_t kMaxGridY = 65535;

template <class Element, class Config, bool ARowMajor, bool BRowMajor, int Vector>
cudaError_t launch(const GemmParams& p, cudaStream_t stream) {
  constexpr int kSmemBytes = WmmaSmem<Element, Config, ARowMajor, BRowMajor>::kBytes;
  auto* kernel = &wmma_gemm_kernel<Element, Config, ARowMajor, BRowMajor, Vector>;
  if (const cudaError_t err = prepare_launch<Element>(kernel, kSmemBytes); err != cudaSuccess) return err;
  const int64_t tiles = TileScheduler<Config>::tiles(p.m, p.n);
  if (tiles > INT_MAX) return cudaErrorInvalidConfiguration;
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(p.batch < kMaxGridY ? p.batch : kMaxGridY));
  GemmParams params = p;
  void* args[] = {&params};
  return cudaLaunchKernel(kernel, grid, dim3(Config::kThreads), args, kSmemBytes, stream);
}

// Calls f(std::integral_constant<bool, value>) so a runtime flag picks a template.
template <class F>
cudaError_t with_flag(bool value, F&& f) {
  return value ? f(std::true_type{}) : f(std::false_type{});
}

template <class Config, bool Vectorized>
cudaError_t launch_layout(const GemmParams& p, cudaStream_t stream, bool a_row_major, bool b_row_major) {
  return with_input_element(p.ab_type, [&](auto element) {
    return with_flag(a_row_major, [&](auto a_row) {
      return with_flag(b_row_major, [&](auto b_row) {
        return launch<typename decltype(element)::type, Config, decltype(a_row)::value, decltype(b_row)::value,
                      Vectorized ? 8 : 1>(p, stream);
      });
    });
  });
}

// 16-byte chunks need a 16-byte aligned base, rows and batches a multiple of 8
// elements apart, and a contiguous extent that splits into whole chunks.
bool operand_vectorizable(const void* data, int64_t batch_stride, int64_t ld, int64_t inner_extent) {
  return aligned16(data) && batch_stride % 8 == 0 && ld % 8 == 0 && inner_extent % 8 == 0;
}

// Shared memory one block of a configuration asks for, whatever the layouts.
template <class Config>
constexpr int smem_bytes() {
  using Element = __half;
  constexpr int a = WmmaSmem<Element, Config, true, true>::kBytes, b = WmmaSmem<Element, Config, true, false>::kBytes,
                c = WmmaSmem<Element, Config, false, true>::kBytes, d = WmmaSmem<Element, Config, false, false>::kBytes;
  return std::max({a, b, c, d});
}

template <class Config>
bool fits(const GemmParams& p, const DeviceLimits& device, int min_waves = 1) {
  return smem_bytes<Config>() <= device.max_smem_per_block &&
         TileScheduler<Config>::tiles(p.m, p.n) * p.batch >= int64_t(min_waves) * device.multiprocessors;
}

}  // namespace

cudaError_t launch_gemm(const GemmParams& p, cudaStream_t stream) {
  if (p.batch <= 0 || p.m <= 0 || p.n <= 0) return cudaSuccess;
  // Row-major wins when both strides are 1 (a single row or column).
  const bool a_row_major = p.a_col_stride == 1;
  const bool b_row_major = p.b_col_stride == 1;
  if ((!a_row_major && p.a_row_stride != 1) || (!b_row_major && p.b_row_stride != 1))
    return cudaErrorInvalidValue;

  const bool vectorized =
      operand_vectorizable(p.a, p.a_batch_stride, a_row_major ? p.a_row_stride : p.a_col_stride,
                           a_row_major ? p.k : p.m) &&
      operand_vectorizable(p.b, p.b_batch_stride, b_row_major ? p.b_row_stride : p.b_col_stride,
                           b_row_major ? p.n : p.k);
  if (!vectorized) return launch_layout<ScalarTileConfig, false>(p, stream, a_row_major, b_row_major);

  // The largest tiles that still give every multiprocessor a block.
  const DeviceLimits device = device_limits();
  if (p.m > p.n ? fits<TallTileConfig>(p, device) : fits<WideTileConfig>(p, device))
    return p.m > p.n ? launch_layout<TallTileConfig, true>(p, stream, a_row_major, b_row_major)
                     : launch_layout<WideTileConfig, true>(p, stream, a_row_major, b_row_major);
  if (fits<SquareTileConfig>(p, device)) return launch_layout<SquareTileConfig, true>(p, stream, a_row_major, b_row_major);
  if (fits<CompactTileConfig>(p, device))
    return launch_layout<CompactTileConfig, true>(p, stream, a_row_major, b_row_major);
  return launch_layout<SmallTileConfig, true>(p, stream, a_row_major, b_row_major);
}

}  // namespace mpgemm::kernels
