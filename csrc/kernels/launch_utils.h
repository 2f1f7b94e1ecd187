// Host-side facts the launchers decide with.
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace mpgemm::kernels {

// Multiprocessors of the current device (0 if it cannot be asked): tile
// configurations are chosen so that a problem fills them.
inline int multiprocessor_count() {
  int device = 0, count = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    return 0;
  return count;
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace mpgemm::kernels
