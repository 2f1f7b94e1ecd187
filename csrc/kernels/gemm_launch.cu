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
cudaError_t launch_layout(const GemmParams& p, cudaStream_t stream, bool a_row_major, bool b_row_major, int vector) {
  return with_input_element(p.ab_type, [&](auto element) {
    return with_flag(a_row_major, [&](auto a_row) {
      return with_flag(b_row_major, [&](auto b_row) {
        return with_vector<Config>(vector, [&](auto width) {
          return launch<typename decltype(element)::type, Config, decltype(a_row)::value, decltype(b_row)::value,
                        decltype(width)::value>(p, stream);
        });
      });
    });
  });
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

  // One width for both operands: the narrower one's.
  const int vector = std::min(
      operand_vector_width(p.a, p.a_batch_stride, a_row_major ? p.a_row_stride : p.a_col_stride,
                           a_row_major ? p.k : p.m),
      operand_vector_width(p.b, p.b_batch_stride, b_row_major ? p.b_row_stride : p.b_col_stride,
                           b_row_major ? p.n : p.k));
  if (vector == 1) return launch_layout<ScalarTileConfig>(p, stream, a_row_major, b_row_major, vector);

  // The largest tiles that still give every multiprocessor a block.
  const DeviceLimits device = device_limits();
  if (p.m > p.n ? fits<TallTileConfig>(p, device) : fits<WideTileConfig>(p, device))
    return p.m > p.n ? launch_layout<TallTileConfig>(p, stream, a_row_major, b_row_major, vector)
                     : launch_layout<WideTileConfig>(p, stream, a_row_major, b_row_major, vector);
  if (vector == 8 && fits<SquareTileConfig>(p, device))
    return launch_layout<SquareTileConfig>(p, stream, a_row_major, b_row_major, vector);
  if (fits<CompactTileConfig>(p, device))
    return launch_layout<CompactTileConfig>(p, stream, a_row_major, b_row_major, vector);
  return launch_layout<SmallTileConfig>(p, stream, a_row_major, b_row_major, vector);
}

}  // namespace mpgemm::kernels
