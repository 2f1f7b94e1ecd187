// Stand-in for <cuda.h> in the host-side kernel simulation: the tensor map of
// the tensor copy engine (TMA) and cuTensorMapEncodeTiled, which the Hopper
// GEMM's host code looks up through cudaGetDriverEntryPointByVersion. The
// encoder checks every requirement the driver documents for the arguments
// the GEMM passes (cuda.h, cuTensorMapEncodeTiled) and fails as the driver
// does; the map it writes is what ../hopper_sim.h's copies read.
#pragma once

#include <cstdint>
#include <cstring>

#include <cuda_runtime.h>

using cuuint32_t = uint32_t;
using cuuint64_t = uint64_t;

enum CUresult { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1 };
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

// What the simulated encoder keeps in a CUtensorMap's opaque bytes.
struct TensorMap {
  static constexpr uint64_t kMagic = 0x70a5e11c0ded7a9bull;
  uint64_t magic;
  const unsigned char* base;
  uint32_t rank, element_bytes;
  uint64_t dims[3], strides[3];  // strides in bytes; strides[0] is the element size
  uint32_t box[3];
  CUtensorMapSwizzle swizzle;
};
static_assert(sizeof(TensorMap) <= sizeof(CUtensorMap), "a tensor map holds the simulated one");

inline const TensorMap& tensor_map(const void* map) {
  const auto& t = *static_cast<const TensorMap*>(map);
  SIM_CHECK(t.magic == TensorMap::kMagic, "a tensor map no encoder wrote");
  return t;
}

// cuTensorMapEncodeTiled for what the simulation models: 16-bit and fp32
// elements, rank 1 to 3, no interleave, element strides of 1.
inline CUresult encode_tiled(CUtensorMap* map, CUtensorMapDataType type, cuuint32_t rank, void* base,
                             const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                             const cuuint32_t* element_strides, CUtensorMapInterleave interleave,
                             CUtensorMapSwizzle swizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  SIM_CHECK(type == CU_TENSOR_MAP_DATA_TYPE_FLOAT16 || type == CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 ||
                type == CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
            "type %d", int(type));
  SIM_CHECK(interleave == CU_TENSOR_MAP_INTERLEAVE_NONE && rank >= 1 && rank <= 3, "layout not modelled");
  const uint32_t element_bytes = type == CU_TENSOR_MAP_DATA_TYPE_FLOAT32 ? 4 : 2;
  const uint32_t swizzle_bytes[] = {0, 32, 64, 128};
  bool valid = reinterpret_cast<uintptr_t>(map) % 64 == 0 && reinterpret_cast<uintptr_t>(base) % 16 == 0;
  for (uint32_t i = 0; i < rank; ++i) {
    valid = valid && dims[i] >= 1 && dims[i] <= (uint64_t(1) << 32) && box[i] >= 1 && box[i] <= 256;
    SIM_CHECK(element_strides[i] == 1, "element strides are not modelled");
  }
  valid = valid && box[0] * element_bytes % 16 == 0 &&
          (swizzle == CU_TENSOR_MAP_SWIZZLE_NONE || box[0] * element_bytes <= swizzle_bytes[swizzle]);
  // Strides: multiples of 16 below 2^40, each dimension at least as far
  // apart as the extent of the one inside it (the driver's formula, with
  // non-negative padding).
  uint64_t inner_extent = dims[0] * element_bytes;
  for (uint32_t i = 0; i + 1 < rank; ++i) {
    valid = valid && strides[i] % 16 == 0 && strides[i] < (uint64_t(1) << 40) && strides[i] >= inner_extent;
    inner_extent = strides[i] * dims[i + 1];
  }
  if (!valid) return CUDA_ERROR_INVALID_VALUE;
  TensorMap t{TensorMap::kMagic, static_cast<const unsigned char*>(base), rank, element_bytes, {1, 1, 1}, {}, {1, 1, 1},
              swizzle};
  t.strides[0] = element_bytes;
  for (uint32_t i = 0; i < rank; ++i) {
    t.dims[i] = dims[i];
    t.box[i] = box[i];
    if (i > 0) t.strides[i] = strides[i - 1];
  }
  memset(map, 0, sizeof(*map));
  memcpy(map, &t, sizeof(t));
  return CUDA_SUCCESS;
}

}  // namespace sim

enum cudaDriverEntryPointFlags { cudaEnableDefault = 0 };
enum cudaDriverEntryPointQueryResult { cudaDriverEntryPointSuccess = 0, cudaDriverEntryPointSymbolNotFound = 1 };

inline cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned, unsigned long long,
                                                    cudaDriverEntryPointQueryResult* status) {
  const bool known = strcmp(symbol, "cuTensorMapEncodeTiled") == 0;
  *fn = known ? reinterpret_cast<void*>(&sim::encode_tiled) : nullptr;
  if (status) *status = known ? cudaDriverEntryPointSuccess : cudaDriverEntryPointSymbolNotFound;
  return cudaSuccess;
}
