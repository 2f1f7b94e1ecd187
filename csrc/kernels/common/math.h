// Integer helpers that host and device code share.
#pragma once

#include <cstdint>

#include "common/host_device.h"

namespace mpgemm::kernels {

MPGEMM_HOST_DEVICE constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

MPGEMM_HOST_DEVICE constexpr int64_t round_up(int64_t value, int64_t multiple) { return ceil_div(value, multiple) * multiple; }

MPGEMM_HOST_DEVICE constexpr int min_int(int a, int b) { return a < b ? a : b; }
MPGEMM_HOST_DEVICE constexpr int max_int(int a, int b) { return a > b ? a : b; }

inline bool aligned_to(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
inline bool aligned16(const void* p) { return aligned_to(p, 16); }

}  // namespace mpgemm::kernels
