// Elementwise kernels' access to tensors of one element type T (fp32, fp16
// or bf16) in fp32: kWidth elements at a time, one 16-byte load or store
// where kWidth fills it (the caller keeps the address aligned), one element
// at a time otherwise. Shared by batch norm's passes (norm/) and the gated
// MLP's (gated/).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

#include "common/element_traits.cuh"

namespace mpgemm::kernels {

template <class T>
__device__ __forceinline__ float element_at(const void* p, int64_t i) {
  return ElementTraits<T>::to_float(static_cast<const T*>(p)[i]);
}

// kWidth elements of T as they lie in memory: one 16-byte word where kWidth
// fills it. fetch() issues the loads and widen() reads them, so that a pass
// can issue several rows' loads before it uses the first.
template <class T, int kWidth, bool kWord = kWidth * sizeof(T) == 16>
struct Raw {
  T e[kWidth];
};
template <class T, int kWidth>
struct Raw<T, kWidth, true> {
  uint4 word;
};

template <class T, int kWidth>
__device__ __forceinline__ Raw<T, kWidth> fetch(const void* p, int64_t i) {
  Raw<T, kWidth> r;
  if constexpr (kWidth * sizeof(T) == 16) {
    r.word = *reinterpret_cast<const uint4*>(static_cast<const T*>(p) + i);
  } else {
#pragma unroll
    for (int e = 0; e < kWidth; ++e) r.e[e] = static_cast<const T*>(p)[i + e];
  }
  return r;
}

template <class T, int kWidth>
__device__ __forceinline__ void widen(const Raw<T, kWidth>& r, float (&v)[kWidth]) {
  if constexpr (kWidth * sizeof(T) == 16) {
    union {
      uint4 raw;
      T e[kWidth];
    } u;
    u.raw = r.word;
#pragma unroll
    for (int e = 0; e < kWidth; ++e) v[e] = ElementTraits<T>::to_float(u.e[e]);
  } else {
#pragma unroll
    for (int e = 0; e < kWidth; ++e) v[e] = ElementTraits<T>::to_float(r.e[e]);
  }
}

// kWidth elements of T from p[i], in fp32: one 16-byte load where kWidth fills it.
template <class T, int kWidth>
__device__ __forceinline__ void load(const void* p, int64_t i, float (&v)[kWidth]) {
  widen(fetch<T, kWidth>(p, i), v);
}

// kWidth values rounded to T into p[i]: one 16-byte store where kWidth fills
// it. (__stwb, a plain write-back store: a uint4 assigned through a pointer
// here compiles to four 4-byte stores.)
template <class T, int kWidth>
__device__ __forceinline__ void store(void* p, int64_t i, const float (&v)[kWidth]) {
  T* dst = static_cast<T*>(p) + i;
  if constexpr (kWidth * sizeof(T) == 16 && sizeof(T) == 4) {
    __stwb(reinterpret_cast<float4*>(dst), make_float4(v[0], v[1], v[2], v[3]));
  } else if constexpr (kWidth * sizeof(T) == 16) {  // 16-bit: rounded in pairs
    uint32_t words[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const auto pair = ElementTraits<T>::round_pair(v[2 * e], v[2 * e + 1]);
      words[e] = *reinterpret_cast<const uint32_t*>(&pair);
    }
    __stwb(reinterpret_cast<uint4*>(dst), uint4{words[0], words[1], words[2], words[3]});
  } else {
#pragma unroll
    for (int e = 0; e < kWidth; ++e) dst[e] = ElementTraits<T>::from_float(v[e]);
  }
}

}  // namespace mpgemm::kernels
