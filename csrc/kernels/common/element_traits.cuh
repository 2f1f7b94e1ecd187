// The element types the kernels read and write, and the little that differs
// between them. The Tensor Core kernels are templates over the 16-bit type of
// their products' inputs, fp16 (__half) or bf16 (__nv_bfloat16); everything
// else about them is shared. Outputs, biases and the unscale pass's tensors
// are fp32, fp16 or bf16, chosen at run time by an ElementType argument.
#pragma once

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common/epilogue_math.h"
#include "common/gemm_params.h"

namespace mpgemm::kernels {

template <class T>
struct ElementTraits;

template <>
struct ElementTraits<float> {
  using Packed4 = float4;  // four values in one 16-byte store
  __device__ static float to_float(float x) { return x; }
  __device__ static float from_float(float x) { return x; }
  __device__ static Packed4 pack4(const float (&v)[4]) { return make_float4(v[0], v[1], v[2], v[3]); }
};

// The 16-bit types store four values as one 8-byte word, rounded in pairs.
template <class Traits>
struct Packed16 {
  using Packed4 = uint2;
  __device__ static Packed4 pack4(const float (&v)[4]) {
    const auto lo = Traits::round_pair(v[0], v[1]), hi = Traits::round_pair(v[2], v[3]);
    return {*reinterpret_cast<const unsigned*>(&lo), *reinterpret_cast<const unsigned*>(&hi)};
  }
};

template <>
struct ElementTraits<__half> : Packed16<ElementTraits<__half>> {
  // The oldest arch whose WMMA takes this type (m16n16k16, fp32 accumulate).
  static constexpr int kMinArch = 700;
  __device__ static float to_float(__half x) { return __half2float(x); }
  __device__ static __half from_float(float x) { return __float2half_rn(x); }
  __device__ static __half2 round_pair(float lo, float hi) { return __floats2half2_rn(lo, hi); }
};

template <>
struct ElementTraits<__nv_bfloat16> : Packed16<ElementTraits<__nv_bfloat16>> {
  static constexpr int kMinArch = 800;
  __device__ static float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ static __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
  __device__ static __nv_bfloat162 round_pair(float lo, float hi) { return __floats2bfloat162_rn(lo, hi); }
};

// Whether this compilation pass builds Element's Tensor Core code. Device
// passes for an arch older than its kMinArch have no WMMA fragments of it:
// there the kernels compile to an empty body, which launchers refuse to run
// (check_kernel_arch in common/launch_utils.h). The host pass runs no device code.
#if defined(__CUDA_ARCH__)
template <class Element>
inline constexpr bool kWmmaCompiled = __CUDA_ARCH__ >= ElementTraits<Element>::kMinArch;
#else
template <class Element>
inline constexpr bool kWmmaCompiled = true;
#endif

template <class T>
struct ElementTag {
  using type = T;
};

// Calls f(ElementTag<T>{}) for the type that `type` names; fp32 for anything
// that is neither 16-bit type.
template <class F>
__device__ __forceinline__ auto visit_element_type(ElementType type, F&& f) {
  switch (type) {
    case ElementType::kFloat16: return f(ElementTag<__half>{});
    case ElementType::kBFloat16: return f(ElementTag<__nv_bfloat16>{});
    default: return f(ElementTag<float>{});
  }
}

MPGEMM_HOST_DEVICE int element_bytes(ElementType type) { return type == ElementType::kFloat32 ? 4 : 2; }

// Element i of an array of `type`, in fp32.
__device__ __forceinline__ float load_as_float(const void* p, ElementType type, int64_t i) {
  return visit_element_type(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    return ElementTraits<T>::to_float(static_cast<const T*>(p)[i]);
  });
}

// Rounds v once, to nearest even, into element i of an array of `type`.
__device__ __forceinline__ void store_from_float(void* p, ElementType type, int64_t i, float v) {
  visit_element_type(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    static_cast<T*>(p)[i] = ElementTraits<T>::from_float(v);
  });
}

// Writes the first `valid` (at most 4) of v to out[0..valid), each rounded
// once: one store when all 4 are valid and out is aligned to them.
template <class T>
__device__ __forceinline__ void store4(T* out, int valid, const float (&v)[4]) {
  using Packed4 = typename ElementTraits<T>::Packed4;
  if (valid == 4 && reinterpret_cast<uintptr_t>(out) % sizeof(Packed4) == 0) {
    *reinterpret_cast<Packed4*>(out) = ElementTraits<T>::pack4(v);
  } else {
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if (e < valid) out[e] = ElementTraits<T>::from_float(v[e]);
  }
}

}  // namespace mpgemm::kernels
