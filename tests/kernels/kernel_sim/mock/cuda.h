// Stand-in for <cuda.h> in the host-side kernel simulation: the tensor map of
// the tensor copy engine (TMA), cuTensorMapEncodeTiled and
// cuTensorMapEncodeIm2col, which the Hopper kernels' host code looks up
// through cudaGetDriverEntryPointByVersion. The encoders check every
// requirement the driver documents for the arguments the kernels pass
// (cuda.h; the driver API's "Tensor Map Object Management") and fail as the
// driver does; the map they write is what ../hopper_sim.h's copies read.
#pragma once

#include <cstdint>
#include <cstring>

#include <cuda_runtime.h>

using cuuint32_t = uint32_t;
using cuuint64_t = uint64_t;

enum CUresult { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_INVALID_CONTEXT = 201 };
enum CUtensorMapDataType {
  CU_TENSOR_MAP_DATA_TYPE_FLOAT16 = 6,
  CU_TENSOR_MAP_DATA_TYPE_FLOAT32 = 7,
  CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9
};
enum CUtensorMapInterleave { CU_TENSOR_MAP_INTERLEAVE_NONE = 0 };
enum CUtensorMapSwizzle {
  CU_TENSOR_MAP_SWIZZLE_NONE = 0,
  CU_TENSOR_MAP_SWIZZLE_32B,
  CU_TENSOR_MAP_SWIZZLE_64B,
  CU_TENSOR_MAP_SWIZZLE_128B
};
enum CUtensorMapL2promotion {
  CU_TENSOR_MAP_L2_PROMOTION_NONE = 0,
  CU_TENSOR_MAP_L2_PROMOTION_L2_64B,
  CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
  CU_TENSOR_MAP_L2_PROMOTION_L2_256B
};
enum CUtensorMapFloatOOBfill { CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0 };

// 128 opaque bytes, 64-byte aligned, as the driver's.
struct CUtensorMap_st {
  alignas(64) cuuint64_t opaque[16];
};
using CUtensorMap = CUtensorMap_st;

namespace sim {

// What the simulated encoders keep in a CUtensorMap's opaque bytes. An
// im2col map's box is (channels per pixel, pixels per column, 1), and it
// keeps its bounding box's corners (W, H) and traversal strides.
struct TensorMap {
  static constexpr uint64_t kMagic = 0x70a5e11c0ded7a9bull;
  uint64_t magic;
  const unsigned char* base;
  uint32_t rank, element_bytes;
  uint64_t dims[4], strides[4];  // strides in bytes; strides[0] is the element size
  uint32_t box[3];
  CUtensorMapSwizzle swizzle;
  bool im2col;
  int16_t lower[2], upper[2];  // within [-128, 127]
  uint8_t traversal[4];        // within [1, 8]
};
static_assert(sizeof(TensorMap) <= sizeof(CUtensorMap), "a tensor map holds the simulated one");

inline const TensorMap& tensor_map(const void* map) {
  const auto& t = *static_cast<const TensorMap*>(map);
  SIM_CHECK(t.magic == TensorMap::kMagic, "a tensor map no encoder wrote");
  return t;
}

// What both encoders require of the tensor: 16-bit or fp32 elements, rank
// 1 to 4, no interleave, a 64-byte aligned map, a 16-byte aligned base, each
// dimension in [1, 2^32], strides multiples of 16 below 2^40, each dimension
// at least as far apart as the extent of the one inside it (the driver's
// formula, with non-negative padding), and a swizzled box's inner extent
// within the swizzle span. Fills `t` but for the box and its mode.
inline bool tensor_valid(TensorMap& t, CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* base,
                         const cuuint64_t* dims, const cuuint64_t* strides, uint32_t inner_box,
                         CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle) {
  SIM_CHECK(type == CU_TENSOR_MAP_DATA_TYPE_FLOAT16 || type == CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 ||
                type == CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
            "type %d", int(type));
  SIM_CHECK(interleave == CU_TENSOR_MAP_INTERLEAVE_NONE && rank >= 1 && rank <= 4, "layout not modelled");
  const uint32_t element_bytes = type == CU_TENSOR_MAP_DATA_TYPE_FLOAT32 ? 4 : 2;
  const uint32_t swizzle_bytes[] = {0, 32, 64, 128};
  bool valid = reinterpret_cast<uintptr_t>(map) % 64 == 0 && reinterpret_cast<uintptr_t>(base) % 16 == 0;
  for (uint32_t i = 0; i < rank; ++i) valid = valid && dims[i] >= 1 && dims[i] <= (uint64_t(1) << 32);
  valid = valid && inner_box * element_bytes % 16 == 0 &&
          (swizzle == CU_TENSOR_MAP_SWIZZLE_NONE || inner_box * element_bytes <= swizzle_bytes[swizzle]);
  uint64_t inner_extent = dims[0] * element_bytes;
  for (uint32_t i = 0; i + 1 < rank; ++i) {
    valid = valid && strides[i] % 16 == 0 && strides[i] < (uint64_t(1) << 40) && strides[i] >= inner_extent;
    inner_extent = strides[i] * dims[i + 1];
  }
  t = TensorMap{TensorMap::kMagic, static_cast<const unsigned char*>(base), rank, element_bytes, {1, 1, 1, 1}, {},
                {1, 1, 1}, swizzle, false, {}, {}, {1, 1, 1, 1}};
  t.strides[0] = element_bytes;
  for (uint32_t i = 0; i < rank; ++i) {
    t.dims[i] = dims[i];
    if (i > 0) t.strides[i] = strides[i - 1];
  }
  return valid;
}

inline void write_map(CUtensorMap* map, const TensorMap& t) {
  memset(map, 0, sizeof(*map));
  memcpy(map, &t, sizeof(t));
}

// cuTensorMapEncodeTiled for what the simulation models: rank 1 to 3,
// element strides of 1, boxes of 1 to 256 per dimension.
inline CUresult encode_tiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* base,
                             const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                             const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                             CUtensorMapSwizzle swizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  if (!context_current) return CUDA_ERROR_INVALID_CONTEXT;
  SIM_CHECK(rank <= 3, "a tiled map of rank %u is not modelled", rank);
  TensorMap t;
  bool valid = tensor_valid(t, map, type, rank, base, dims, strides, box[0], interleave, swizzle);
  for (uint32_t i = 0; i < rank; ++i) {
    valid = valid && box[i] >= 1 && box[i] <= 256;
    SIM_CHECK(element_strides[i] == 1, "element strides are not modelled");
    t.box[i] = box[i];
  }
  if (!valid) return CUDA_ERROR_INVALID_VALUE;
  write_map(map, t);
  return CUDA_SUCCESS;
}

// cuTensorMapEncodeIm2col for a 4-D (NHWC) tensor: corners in [-128, 127]
// (the driver's range for rank 4), channels per pixel in [1, 256], pixels
// per column in [1, 1024], traversal strides in [1, 8], the channel and
// image dimensions' own 1.
inline CUresult encode_im2col(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* base,
                              const cuuint64_t* dims, const cuuint64_t* strides, const int* lower, const int* upper,
                              cuuint32_t channels_per_pixel, cuuint32_t pixels_per_column,
                              const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                              CUtensorMapSwizzle swizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  if (!context_current) return CUDA_ERROR_INVALID_CONTEXT;
  SIM_CHECK(rank == 4, "an im2col map of rank %u is not modelled", rank);
  SIM_CHECK(element_strides[0] == 1 && element_strides[3] == 1, "element strides of C and N are not modelled");
  TensorMap t;
  bool valid = tensor_valid(t, map, type, rank, base, dims, strides, channels_per_pixel, interleave, swizzle);
  valid = valid && channels_per_pixel >= 1 && channels_per_pixel <= 256 && pixels_per_column >= 1 &&
          pixels_per_column <= 1024;
  for (int i = 0; i < 2; ++i) {
    valid = valid && lower[i] >= -128 && lower[i] <= 127 && upper[i] >= -128 && upper[i] <= 127;
    t.lower[i] = int16_t(lower[i]), t.upper[i] = int16_t(upper[i]);
  }
  for (int i = 0; i < 4; ++i) {
    valid = valid && element_strides[i] >= 1 && element_strides[i] <= 8;
    t.traversal[i] = uint8_t(element_strides[i]);
  }
  if (!valid) return CUDA_ERROR_INVALID_VALUE;
  t.im2col = true;
  t.box[0] = channels_per_pixel, t.box[1] = pixels_per_column, t.box[2] = 1;
  write_map(map, t);
  return CUDA_SUCCESS;
}

}  // namespace sim

enum cudaDriverEntryPointFlags { cudaEnableDefault = 0 };
enum cudaDriverEntryPointQueryResult { cudaDriverEntryPointSuccess = 0, cudaDriverEntryPointSymbolNotFound = 1 };

inline cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned, unsigned long long,
                                                    cudaDriverEntryPointQueryResult* status) {
  const bool tiled = strcmp(symbol, "cuTensorMapEncodeTiled") == 0;
  const bool im2col = strcmp(symbol, "cuTensorMapEncodeIm2col") == 0;
  const bool known = tiled || im2col;
  *fn = tiled ? reinterpret_cast<void*>(&sim::encode_tiled)
              : im2col ? reinterpret_cast<void*>(&sim::encode_im2col) : nullptr;
  if (status) *status = known ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}
