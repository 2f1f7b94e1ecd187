// The driver's tensor-map encoders and D's tensor map (sm90/tensor_maps.h).
#include <cstdint>

#include <cuda_runtime.h>

#include "common/element_traits.cuh"
#include "plan/operand_layout.h"
#include "sm90/layout.h"
#include "sm90/tensor_maps.h"

namespace mpgemm::kernels::sm90 {
namespace {

// A driver entry point of CUDA 12.0's ABI, null where the driver lacks it.
void* driver_entry_point(const char* name) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess)
    return nullptr;
  return fn;
}

// D as the copy engine stores it: dimensions (N, M, batch), boxes of one
// output strip (sm90/layout.h's OutputStrip: 128 bytes of columns by 64
// rows) with 128-byte swizzle. Whether D could be described.
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
  const cuuint32_t box[3] = {cuuint32_t(kSwizzleBytes / bytes), cuuint32_t(WgmmaBlockConfig::kInstrM), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  return encode(map, map_type(p.d_type), 3, p.d, dims, strides, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace

EncodeTiled encode_tiled() {
  static const auto encode = reinterpret_cast<EncodeTiled>(driver_entry_point("cuTensorMapEncodeTiled"));
  return encode;
}

EncodeIm2col encode_im2col() {
  static const auto encode = reinterpret_cast<EncodeIm2col>(driver_entry_point("cuTensorMapEncodeIm2col"));
  return encode;
}

cudaError_t bind_primary_context() {
  // cudaSetDevice makes the device's primary context current (CUDA 12 on);
  // a thread keeps it until something else is made current there.
  thread_local int bound_device = -1;
  int device = 0;
  if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
  if (device == bound_device) return cudaSuccess;
  if (const cudaError_t err = cudaSetDevice(device); err != cudaSuccess) return err;
  bound_device = device;
  return cudaSuccess;
}

CUtensorMapDataType map_type(ElementType type) {
  switch (type) {
    case ElementType::kFloat32: return CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
    case ElementType::kBFloat16: return CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    default: return CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  }
}

WgmmaSchedule output_schedule(const GemmParams& p, CUtensorMap* d_map, const PixelRows& pixels) {
  WgmmaSchedule schedule;
  schedule.d_pixels = pixels;
  const bool strided = pixels.cols != 0;
  const bool even_pitches = !strided || (pixels.image_pitch % 2 == 0 && pixels.row_pitch % 2 == 0 &&
                                         pixels.col_pitch % 2 == 0);
  schedule.d_pairs = p.d_row_stride % 2 == 0 && p.d_batch_stride % 2 == 0 && even_pitches &&
                     reinterpret_cast<uintptr_t>(p.d) % (2 * element_bytes(p.d_type)) == 0;
  schedule.d_copy = !strided && output_map(d_map, p);
  return schedule;
}

}  // namespace mpgemm::kernels::sm90
