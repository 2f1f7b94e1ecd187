// Host side of the Hopper GEMM: one tensor map per operand and one for D,
// which tell the copy engine the matrix's sizes, strides and box
// (sm90/layout.h's SwizzledOperandTile and OutputStrip), and the kernel
// arguments; the kernels themselves are launched from sm90/gemm_kernels_*.cu.
#include <climits>

#include <cuda.h>

#include "common/element_traits.cuh"
#include "common/launch_utils.h"
#include "plan/operand_layout.h"
#include "sm90/gemm_kernel.cuh"
#include "sm90/launch.h"
#include "sm90/layout.h"

namespace mpgemm::kernels {
namespace {

using Config = WgmmaBlockConfig;

// cuTensorMapEncodeTiled, looked up in the driver at run time, so that the
// extension does not link libcuda.
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

EncodeTiled encode_tiled() {
  static const EncodeTiled encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      return EncodeTiled{nullptr};
    return reinterpret_cast<EncodeTiled>(fn);
  }();
  return encode;
}

// One operand as the copy engine sees it: `mn` rows of M (or N) by `k`, its
// leading dimension `ld` and batch stride in elements, read in boxes of
// OperandTile's shape. A K-major operand's dimensions run (K, M/N, batch), an
// MN-major one's (M/N, K, batch); a broadcast operand has a batch extent of 1.
template <class OperandTile>
cudaError_t operand_map(CUtensorMap* map, ElementType type, const void* base, int64_t mn, int64_t k, int64_t ld,
                        int64_t batch_stride, int64_t batch) {
  const EncodeTiled encode = encode_tiled();
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
      encode(map, type == ElementType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
             3, const_cast<void*>(base), dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
             CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return err == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// D as the copy engine stores it: dimensions (N, M, batch), boxes of one
// output strip (sm90/layout.h's OutputStrip: 128 bytes of columns by 64
// rows) with 128-byte swizzle. Whether D could be described; the epilogue
// stores from registers where not.
bool output_map(CUtensorMap* map, const GemmParams& p) {
  const EncodeTiled encode = encode_tiled();
  const int64_t bytes = element_bytes(p.d_type);
  const bool one_matrix = p.batch == 1;
  if (encode == nullptr || (!one_matrix && p.d_batch_stride == 0) ||
      !tma_describable(p.d, bytes, p.batch, p.d_batch_stride, p.d_row_stride, p.n, p.m))
    return false;
  const cuuint64_t dims[3] = {cuuint64_t(p.n), cuuint64_t(p.m), cuuint64_t(p.batch)};
  const cuuint64_t strides[2] = {cuuint64_t(p.d_row_stride * bytes),
                                 cuuint64_t((one_matrix ? p.d_row_stride * p.m : p.d_batch_stride) * bytes)};
  const cuuint32_t box[3] = {cuuint32_t(sm90::kSwizzleBytes / bytes), cuuint32_t(Config::kInstrM), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const CUtensorMapDataType type = p.d_type == ElementType::kFloat32    ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
                                   : p.d_type == ElementType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                        : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return encode(map, type, 3, p.d, dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

template <class Element, class Tile, bool AKMajor, bool BKMajor>
cudaError_t launch(const GemmParams& p, int raster_group, cudaStream_t stream) {
  using ATile = sm90::SwizzledOperandTile<Tile::kBlockM, AKMajor>;
  using BTile = sm90::SwizzledOperandTile<Config::kBlockN, BKMajor>;
  CUtensorMap a_map, b_map, d_map{};
  if (const cudaError_t err = operand_map<ATile>(&a_map, p.ab_type, p.a, p.m, p.k,
                                                 AKMajor ? p.a_row_stride : p.a_col_stride, p.a_batch_stride, p.batch);
      err != cudaSuccess)
    return err;
  if (const cudaError_t err = operand_map<BTile>(&b_map, p.ab_type, p.b, p.n, p.k,
                                                 BKMajor ? p.b_col_stride : p.b_row_stride, p.b_batch_stride, p.batch);
      err != cudaSuccess)
    return err;
  sm90::WgmmaSchedule schedule;
  schedule.raster_group = raster_group;
  schedule.a_broadcast = p.a_batch_stride == 0;
  schedule.b_broadcast = p.b_batch_stride == 0;
  schedule.d_pairs = p.d_row_stride % 2 == 0 && p.d_batch_stride % 2 == 0 &&
                     reinterpret_cast<uintptr_t>(p.d) % (2 * element_bytes(p.d_type)) == 0;
  schedule.d_copy = output_map(&d_map, p);
  return sm90::launch_wgmma_kernel<Element, Tile, AKMajor, BKMajor>(a_map, b_map, d_map, p, schedule, stream);
}

}  // namespace

bool wgmma_available() { return device_limits().arch == 90 && sm90::wgmma_compiled(); }

template <class Tile>
cudaError_t launch_wgmma_gemm(const GemmParams& p, int raster_group, bool a_k_major, bool b_k_major,
                              cudaStream_t stream) {
  if (p.k < 1 || p.m > INT_MAX || p.n > INT_MAX || p.k > INT_MAX || p.batch > INT_MAX || raster_group < 1)
    return cudaErrorInvalidValue;
  return with_input_element(p.ab_type, [&](auto element) {
    using E = typename decltype(element)::type;
    if (a_k_major && b_k_major) return launch<E, Tile, true, true>(p, raster_group, stream);
    if (a_k_major) return launch<E, Tile, true, false>(p, raster_group, stream);
    if (b_k_major) return launch<E, Tile, false, true>(p, raster_group, stream);
    return launch<E, Tile, false, false>(p, raster_group, stream);
  });
}

template cudaError_t launch_wgmma_gemm<WgmmaTile>(const GemmParams&, int, bool, bool, cudaStream_t);
template cudaError_t launch_wgmma_gemm<WgmmaPairTile>(const GemmParams&, int, bool, bool, cudaStream_t);
template cudaError_t launch_wgmma_gemm<WgmmaPingPongTile>(const GemmParams&, int, bool, bool, cudaStream_t);

}  // namespace mpgemm::kernels
