// Host side of the Hopper GEMM: one tensor map per operand and one for D
// (sm90/tensor_maps.h), which tell the copy engine the matrix's sizes,
// strides and box (sm90/layout.h's SwizzledOperandTile and OutputStrip), and
// the kernel arguments; the kernels themselves are launched from sm90/gemm_kernels_*.cu.
#include <climits>

#include <cuda.h>

#include "common/element_traits.cuh"
#include "common/launch_utils.h"
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

template <class Element, class Tile, bool AKMajor, bool BKMajor>
cudaError_t launch(const GemmParams& p, int raster_group, cudaStream_t stream) {
  using ATile = sm90::SwizzledOperandTile<Tile::kBlockM, AKMajor>;
  using BTile = sm90::SwizzledOperandTile<Tile::kBlockN, BKMajor>;
  CUtensorMap a_map, b_map, d_map{};
  if (const cudaError_t err = operand_map<ATile>(&a_map, p.ab_type, p.a, p.m, p.k,
                                                 AKMajor ? p.a_row_stride : p.a_col_stride, p.a_batch_stride, p.batch);
      err != cudaSuccess)
    return err;
  if (const cudaError_t err = operand_map<BTile>(&b_map, p.ab_type, p.b, p.n, p.k,
                                                 BKMajor ? p.b_col_stride : p.b_row_stride, p.b_batch_stride, p.batch);
      err != cudaSuccess)
    return err;
  sm90::WgmmaSchedule schedule = sm90::output_schedule(p, &d_map);
  schedule.raster_group = raster_group;
  schedule.a_broadcast = p.a_batch_stride == 0;
  schedule.b_broadcast = p.b_batch_stride == 0;
  return sm90::launch_wgmma_kernel<Element, Tile, AKMajor, BKMajor>(a_map, b_map, d_map, p, schedule, stream);
}

}  // namespace

bool wgmma_available() { return device_limits().arch == 90 && sm90::wgmma_compiled(); }

template <class Tile>
cudaError_t launch_wgmma_gemm(const GemmParams& p, int raster_group, bool a_k_major, bool b_k_major,
                              cudaStream_t stream) {
  if (p.k < 1 || p.m > INT_MAX || p.n > INT_MAX || p.k > INT_MAX || p.batch > INT_MAX || raster_group < 1)
    return cudaErrorInvalidValue;
  if (const cudaError_t err = sm90::bind_primary_context(); err != cudaSuccess) return err;
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
template cudaError_t launch_wgmma_gemm<WgmmaN128Tile>(const GemmParams&, int, bool, bool, cudaStream_t);
template cudaError_t launch_wgmma_gemm<WgmmaN64Tile>(const GemmParams&, int, bool, bool, cudaStream_t);

}  // namespace mpgemm::kernels
