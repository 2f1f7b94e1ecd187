// Stand-in for <cuda_fp16.h> in the host-side kernel simulation: g++'s
// _Float16 is IEEE binary16 and float -> _Float16 rounds to nearest even, as
// the __float2half_rn family does.
#pragma once

#include "cuda_runtime.h"

using __half = _Float16;
struct alignas(4) __half2 { __half x, y; };

inline float __half2float(__half h) { return h; }
inline __half __float2half_rn(float f) { return static_cast<__half>(f); }
inline __half2 __floats2half2_rn(float a, float b) { return {__float2half_rn(a), __float2half_rn(b)}; }
