// Host side of the Hopper GEMM: one tensor map per operand and one for D
// (sm90/tensor_maps.h), which tell the copy engine the matrix's sizes,
// strides and box (sm90/layout.h's SwizzledOperandTile and OutputStrip), and
// the kernel arguments; the kernels themselves are launched from sm90/gemm_kernels_*.cu.
#include <climits>
#include <type_traits>

#include <cuda.h>

#include "common/element_traits.cuh"
#include "common/launch_utils.h"
#include "common/math.h"
#include "plan/gemm_plan.h"
#include "plan/operand_layout.h"
#include "sm90/block.cuh"
#include "sm90/launch.h"
#include "sm90/layout.h"
#include "sm90/tensor_maps.h"

namespace mpgemm::kernels {
namespace {

using Config = WgmmaBlockConfig;

// One operand as the copy engine sees it: `mn` rows of M (or N) by `k`, its
// leading dimension `ld` and batch stride in elements, read in boxes of
// OperandTile's shape. A K-major operand's dimensions run (K, M/N, batch), an
// MN-major one's (M/N, K, batch); a broadcast operand has a batch extent of 1.
template <class OperandTile>
cudaError_t operand_map(CUtensorMap* map, ElementType type, const void* base, int64_t mn, int64_t k, int64_t ld,
                        int64_t batch_stride, int64_t batch) {
  const sm90::EncodeTiled encode = sm90::encode_tiled();
  if (encode == nullptr) return cudaErrorNotSupported;
  constexpr bool kKMajor = OperandTile::kKMajor;
  const int64_t inner = kKMajor ? k : mn, outer = kKMajor ? mn : k;
  const bool broadcast = batch_stride == 0 || batch == 1;
  const cuuint64_t dims[3] = {cuuint64_t(inner), cuuint64_t(outer), cuuint64_t(broadcast ? 1 : batch)};
  const cuuint64_t strides[2] = {cuuint64_t(ld) * 2, cuuint64_t(broadcast ? ld * outer : batch_stride) * 2};
  // 64 elements (128 bytes) along the inner dimension, kBoxRows along the outer one when K-major, 64 K when not.
  const cuuint32_t box[3] = {cuuint32_t(sm90::kSwizzleElements),
                             cuuint32_t(kKMajor ? OperandTile::kBoxRows : sm90::kSwizzleElements), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUresult err =
      encode(map, sm90::map_type(type), 3, const_cast<void*>(base), dims, strides, box, element_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return err == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// A's and B's tensor maps as Tile's kernels on these layouts read them.
template <class Tile, bool AKMajor, bool BKMajor>
cudaError_t operand_maps(CUtensorMap* a_map, CUtensorMap* b_map, const GemmParams& p) {
  using ATile = sm90::SwizzledOperandTile<Tile::kBlockM, AKMajor>;
  using BTile = sm90::SwizzledOperandTile<Tile::kBlockN, BKMajor>;
  if (const cudaError_t err = operand_map<ATile>(a_map, p.ab_type, p.a, p.m, p.k,
                                                 AKMajor ? p.a_row_stride : p.a_col_stride, p.a_batch_stride, p.batch);
      err != cudaSuccess)
    return err;
  return operand_map<BTile>(b_map, p.ab_type, p.b, p.n, p.k, BKMajor ? p.b_col_stride : p.b_row_stride,
                            p.b_batch_stride, p.batch);
}

template <class Element, class Tile, bool AKMajor, bool BKMajor,
          sm90::GemmKernel Kind = sm90::GemmKernel::kWholeK>
cudaError_t launch(const GemmParams& p, int raster_group, cudaStream_t stream) {
  CUtensorMap a_map, b_map, d_map{};
  if (const cudaError_t err = operand_maps<Tile, AKMajor, BKMajor>(&a_map, &b_map, p); err != cudaSuccess) return err;
  sm90::WgmmaSchedule schedule = sm90::output_schedule(p, &d_map);
  // The activation derivative's kernel reads Z where it stores D (Z shares
  // D's strides): in pairs only where Z's base allows them too.
  if constexpr (Kind == sm90::GemmKernel::kActivationGrad)
    schedule.d_pairs =
        schedule.d_pairs && reinterpret_cast<uintptr_t>(p.activation_input) % (2 * sizeof(Element)) == 0;
  schedule.raster_group = raster_group;
  schedule.a_broadcast = p.a_batch_stride == 0;
  schedule.b_broadcast = p.b_batch_stride == 0;
  return sm90::launch_wgmma_kernel<Element, Tile, AKMajor, BKMajor, Kind>(a_map, b_map, d_map, d_map, p, schedule,
                                                                          stream);
}

// The pre-activation kernel's launch: D's and the pre-activation's tensor
// maps; each is stored as both allow (through the copy engine, in pairs),
// since one schedule describes both. Kind: kPreActivation (WgmmaTile), or
// kPreActivationGeluTanh (WgmmaPingPongTile) for GELU's tanh form.
template <class Element, class Tile, sm90::GemmKernel Kind>
cudaError_t launch_pre_activation(const GemmParams& p, int raster_group, cudaStream_t stream) {
  CUtensorMap a_map, b_map, d_map{}, z_map{};
  if (const cudaError_t err = operand_maps<Tile, true, true>(&a_map, &b_map, p); err != cudaSuccess) return err;
  sm90::WgmmaSchedule schedule = sm90::output_schedule(p, &d_map);
  GemmParams z = p;
  z.d = p.pre_activation;
  const sm90::WgmmaSchedule z_schedule = sm90::output_schedule(z, &z_map);
  schedule.d_copy = schedule.d_copy && z_schedule.d_copy;
  schedule.d_pairs = schedule.d_pairs && z_schedule.d_pairs;
  schedule.raster_group = raster_group;
  schedule.a_broadcast = p.a_batch_stride == 0;
  schedule.b_broadcast = p.b_batch_stride == 0;
  return sm90::launch_wgmma_kernel<Element, Tile, true, true, Kind>(a_map, b_map, d_map, z_map, p, schedule, stream);
}

// The split-K kernel's launch: D is the splits' partial sums, split_k
// matrices of m x n fp32, the batch of its tile order; the row sums' kernel
// (Kind kSplitKRowSums) writes the splits' partial row sums, split_k of m,
// to row_sum_partials.
template <class Element, class Tile, bool AKMajor, bool BKMajor,
          sm90::GemmKernel Kind = sm90::GemmKernel::kSplitK>
cudaError_t launch_splitk(const GemmParams& p, int raster_group, int split_k, float* partials, cudaStream_t stream,
                          float* row_sum_partials = nullptr) {
  CUtensorMap a_map, b_map, d_map{};
  if (const cudaError_t err = operand_maps<Tile, AKMajor, BKMajor>(&a_map, &b_map, p); err != cudaSuccess) return err;
  GemmParams splits = p;
  splits.batch = split_k;
  splits.bias = nullptr;
  splits.activation = Activation::kNone;
  splits.d = partials;
  splits.d_type = ElementType::kFloat32;
  splits.d_row_stride = p.n;
  splits.d_batch_stride = p.m * p.n;
  splits.column_moments = nullptr;
  splits.pre_activation = nullptr;
  splits.a_row_sums = row_sum_partials;
  sm90::WgmmaSchedule schedule = sm90::output_schedule(splits, &d_map);
  schedule.raster_group = raster_group;
  schedule.split_slices = int(ceil_div(ceil_div(p.k, int64_t(Config::kBlockK)), int64_t(split_k)));
  return sm90::launch_wgmma_kernel<Element, Tile, AKMajor, BKMajor, Kind>(a_map, b_map, d_map, d_map, splits,
                                                                          schedule, stream);
}

// The stream-K kernel's launch: the slots' flags zeroed on the stream, then
// the kernel on the slots before them (plan/gemm_plan.h's
// stream_k_partial_bytes, then stream_k_flag_bytes).
template <class Element, class Tile, bool AKMajor, bool BKMajor>
cudaError_t launch_stream_k(const GemmParams& p, int raster_group, int blocks, void* workspace,
                            cudaStream_t stream) {
  CUtensorMap a_map, b_map, d_map{};
  if (const cudaError_t err = operand_maps<Tile, AKMajor, BKMajor>(&a_map, &b_map, p); err != cudaSuccess) return err;
  sm90::WgmmaSchedule schedule = sm90::output_schedule(p, &d_map);
  schedule.raster_group = raster_group;
  sm90::StreamKWorkspace slots;
  slots.partials = static_cast<float*>(workspace);
  slots.flags =
      reinterpret_cast<int*>(static_cast<unsigned char*>(workspace) + stream_k_partial_bytes(Tile::kId, blocks));
  slots.blocks = blocks;
  if (const cudaError_t err = cudaMemsetAsync(slots.flags, 0, stream_k_flag_bytes(blocks), stream);
      err != cudaSuccess)
    return err;
  return sm90::launch_wgmma_stream_k_kernel<Element, Tile, AKMajor, BKMajor>(a_map, b_map, d_map, p, schedule, slots,
                                                                             stream);
}

// Runs launch_layouts<E, AKMajor, BKMajor>() for the input type and layouts given.
template <class Launch>
cudaError_t on_layouts(ElementType ab_type, bool a_k_major, bool b_k_major, const Launch& launch_layouts) {
  return with_input_element(ab_type, [&](auto element) {
    if (a_k_major && b_k_major) return launch_layouts(element, std::true_type{}, std::true_type{});
    if (a_k_major) return launch_layouts(element, std::true_type{}, std::false_type{});
    if (b_k_major) return launch_layouts(element, std::false_type{}, std::true_type{});
    return launch_layouts(element, std::false_type{}, std::false_type{});
  });
}

}  // namespace

bool wgmma_available() { return device_limits().arch == 90 && sm90::wgmma_compiled(); }

template <class Tile>
cudaError_t launch_wgmma_gemm(const GemmParams& p, int raster_group, bool a_k_major, bool b_k_major,
                              cudaStream_t stream) {
  if (p.k < 1 || p.m > INT_MAX || p.n > INT_MAX || p.k > INT_MAX || p.batch > INT_MAX || raster_group < 1)
    return cudaErrorInvalidValue;
  if (const cudaError_t err = sm90::bind_primary_context(); err != cudaSuccess) return err;
  return on_layouts(p.ab_type, a_k_major, b_k_major, [&](auto element, auto a_k, auto b_k) {
    using E = typename decltype(element)::type;
    return launch<E, Tile, decltype(a_k)::value, decltype(b_k)::value>(p, raster_group, stream);
  });
}

cudaError_t launch_wgmma_pre_activation_gemm(const GemmParams& p, int raster_group, cudaStream_t stream) {
  if (p.pre_activation == nullptr || p.k < 1 || p.m > INT_MAX || p.n > INT_MAX || p.k > INT_MAX ||
      p.batch > INT_MAX || raster_group < 1)
    return cudaErrorInvalidValue;
  if (const cudaError_t err = sm90::bind_primary_context(); err != cudaSuccess) return err;
  return with_input_element(p.ab_type, [&](auto element) {
    using E = typename decltype(element)::type;
    return p.activation == Activation::kGeluTanh
               ? launch_pre_activation<E, WgmmaPingPongTile, sm90::GemmKernel::kPreActivationGeluTanh>(
                     p, raster_group, stream)
               : launch_pre_activation<E, WgmmaTile, sm90::GemmKernel::kPreActivation>(p, raster_group, stream);
  });
}

template <class Tile>
cudaError_t launch_wgmma_activation_grad_gemm(const GemmParams& p, int raster_group, cudaStream_t stream) {
  static_assert(std::is_same_v<Tile, WgmmaTile> || std::is_same_v<Tile, WgmmaPingPongTile>,
                "the activation derivative's kernels: blocks alone, and pairs with ping-pong consumers");
  if (p.activation_input == nullptr || p.bias != nullptr || p.d_type != p.ab_type || p.k < 1 || p.m > INT_MAX ||
      p.n > INT_MAX || p.k > INT_MAX || p.batch > INT_MAX || raster_group < 1)
    return cudaErrorInvalidValue;
  if (const cudaError_t err = sm90::bind_primary_context(); err != cudaSuccess) return err;
  return with_input_element(p.ab_type, [&](auto element) {
    using E = typename decltype(element)::type;
    return launch<E, Tile, true, false, sm90::GemmKernel::kActivationGrad>(p, raster_group, stream);
  });
}

template <class Tile>
cudaError_t launch_wgmma_row_sums_gemm(const GemmParams& p, int raster_group, int split_k, float* partials,
                                       float* row_sum_partials, cudaStream_t stream) {
  if (p.a_row_sums == nullptr || p.batch != 1 || split_k < 1 || p.k < 1 || p.m > INT_MAX || p.n > INT_MAX ||
      p.k > INT_MAX || raster_group < 1)
    return cudaErrorInvalidValue;
  if (split_k > 1 && (!kHasSplitKernels<Tile> || partials == nullptr || !aligned16(partials) ||
                      row_sum_partials == nullptr))
    return cudaErrorInvalidValue;
  if (const cudaError_t err = sm90::bind_primary_context(); err != cudaSuccess) return err;
  return with_input_element(p.ab_type, [&](auto element) {
    using E = typename decltype(element)::type;
    if constexpr (kHasSplitKernels<Tile>) {
      if (split_k > 1)
        return launch_splitk<E, Tile, false, false, sm90::GemmKernel::kSplitKRowSums>(p, raster_group, split_k,
                                                                                      partials, stream,
                                                                                      row_sum_partials);
    }
    return launch<E, Tile, false, false, sm90::GemmKernel::kRowSums>(p, raster_group, stream);
  });
}

template <class Tile>
cudaError_t launch_wgmma_splitk_gemm(const GemmParams& p, int raster_group, int split_k, float* partials,
                                     bool a_k_major, bool b_k_major, cudaStream_t stream) {
  if (p.batch != 1 || split_k < 2 || partials == nullptr || !aligned16(partials)) return cudaErrorInvalidValue;
  if (p.k < 1 || p.m > INT_MAX || p.n > INT_MAX || p.k > INT_MAX || raster_group < 1) return cudaErrorInvalidValue;
  if (const cudaError_t err = sm90::bind_primary_context(); err != cudaSuccess) return err;
  return on_layouts(p.ab_type, a_k_major, b_k_major, [&](auto element, auto a_k, auto b_k) {
    using E = typename decltype(element)::type;
    return launch_splitk<E, Tile, decltype(a_k)::value, decltype(b_k)::value>(p, raster_group, split_k, partials,
                                                                               stream);
  });
}

template <class Tile>
cudaError_t launch_wgmma_stream_k_gemm(const GemmParams& p, int raster_group, int blocks, void* workspace,
                                       bool a_k_major, bool b_k_major, cudaStream_t stream) {
  static_assert(std::is_same_v<Tile, WgmmaTile> || std::is_same_v<Tile, WgmmaN128Tile> ||
                    std::is_same_v<Tile, WgmmaN64Tile>,
                "stream-K kernels on the tiles of blocks alone: 128 x 256, 128 x 128 and 128 x 64");
  if (p.batch != 1 || blocks < 1 || workspace == nullptr || !aligned16(workspace)) return cudaErrorInvalidValue;
  if (p.k < 1 || p.m > INT_MAX || p.n > INT_MAX || p.k > INT_MAX || raster_group < 1) return cudaErrorInvalidValue;
  if (const cudaError_t err = sm90::bind_primary_context(); err != cudaSuccess) return err;
  return on_layouts(p.ab_type, a_k_major, b_k_major, [&](auto element, auto a_k, auto b_k) {
    using E = typename decltype(element)::type;
    return launch_stream_k<E, Tile, decltype(a_k)::value, decltype(b_k)::value>(p, raster_group, blocks, workspace,
                                                                                 stream);
  });
}

template cudaError_t launch_wgmma_gemm<WgmmaTile>(const GemmParams&, int, bool, bool, cudaStream_t);
template cudaError_t launch_wgmma_gemm<WgmmaPairTile>(const GemmParams&, int, bool, bool, cudaStream_t);
template cudaError_t launch_wgmma_gemm<WgmmaPingPongTile>(const GemmParams&, int, bool, bool, cudaStream_t);
template cudaError_t launch_wgmma_gemm<WgmmaN128Tile>(const GemmParams&, int, bool, bool, cudaStream_t);
template cudaError_t launch_wgmma_gemm<WgmmaN64Tile>(const GemmParams&, int, bool, bool, cudaStream_t);
template cudaError_t launch_wgmma_activation_grad_gemm<WgmmaTile>(const GemmParams&, int, cudaStream_t);
template cudaError_t launch_wgmma_activation_grad_gemm<WgmmaPingPongTile>(const GemmParams&, int, cudaStream_t);
template cudaError_t launch_wgmma_row_sums_gemm<WgmmaTile>(const GemmParams&, int, int, float*, float*,
                                                           cudaStream_t);
template cudaError_t launch_wgmma_row_sums_gemm<WgmmaPairTile>(const GemmParams&, int, int, float*, float*,
                                                               cudaStream_t);
template cudaError_t launch_wgmma_row_sums_gemm<WgmmaPingPongTile>(const GemmParams&, int, int, float*, float*,
                                                                   cudaStream_t);
template cudaError_t launch_wgmma_row_sums_gemm<WgmmaN128Tile>(const GemmParams&, int, int, float*, float*,
                                                               cudaStream_t);
template cudaError_t launch_wgmma_row_sums_gemm<WgmmaN64Tile>(const GemmParams&, int, int, float*, float*,
                                                              cudaStream_t);
template cudaError_t launch_wgmma_splitk_gemm<WgmmaTile>(const GemmParams&, int, int, float*, bool, bool,
                                                         cudaStream_t);

template cudaError_t launch_wgmma_stream_k_gemm<WgmmaTile>(const GemmParams&, int, int, void*, bool, bool,
                                                           cudaStream_t);
template cudaError_t launch_wgmma_stream_k_gemm<WgmmaN128Tile>(const GemmParams&, int, int, void*, bool, bool,
                                                               cudaStream_t);
template cudaError_t launch_wgmma_stream_k_gemm<WgmmaN64Tile>(const GemmParams&, int, int, void*, bool, bool,
                                                              cudaStream_t);

}  // namespace mpgemm::kernels
