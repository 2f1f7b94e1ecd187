// Stand-in for <cuda_bf16.h> in the host-side kernel simulation: bfloat16 is
// the upper half of an IEEE binary32, and float -> bf16 rounds to nearest even
// (NaN stays NaN), as the __float2bfloat16_rn family does.
#pragma once

#include <cstdint>
#include <cstring>

#include "cuda_runtime.h"

struct alignas(2) __nv_bfloat16 {
  unsigned short x;

  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : x(round(f)) {}
  operator float() const {
    const uint32_t bits = uint32_t(x) << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
  }

 private:
  static unsigned short round(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<unsigned short>((bits >> 16) | 0x40);  // quiet NaN
    bits += 0x7fffu + ((bits >> 16) & 1);
    return static_cast<unsigned short>(bits >> 16);
  }
};
struct alignas(4) __nv_bfloat162 { __nv_bfloat16 x, y; };

inline float __bfloat162float(__nv_bfloat16 h) { return h; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)}; }
