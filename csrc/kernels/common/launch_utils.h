// Host-side facts and steps the launchers share.
#pragma once

#include <atomic>
#include <climits>
#include <cstdint>

#include <cuda_runtime.h>

#include "common/device_limits.h"
#include "common/element_traits.cuh"

namespace mpgemm::kernels {

// The most blocks a grid's y dimension takes: launches over a longer batch
// (or more groups) stride over it.
inline constexpr int64_t kMaxGridY = 65535;

// The current device's limits; zeros if it cannot be asked.
inline DeviceLimits device_limits() {
  DeviceLimits limits;
  int device = 0, major = 0, minor = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&limits.multiprocessors, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&limits.max_smem_per_block, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) !=
          cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
    return {};
  limits.arch = 10 * major + minor;
  return limits;
}

// A fact about a kernel on a device that holds for the life of the process
// (whether the code the device loaded has a body, how many clusters of a
// kernel fit at once), asked of the runtime once per device and kept: asking
// costs a driver query. Facts are counts and flags, never negative. An error
// is returned and not kept; devices from kMaxDevices on are asked every time.
class PerDeviceFact {
 public:
  // The fact for the current device into *value: ask(value), a cudaError_t,
  // the first time.
  template <class Ask>
  cudaError_t get(int* value, Ask&& ask) {
    int device = 0;
    if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
    if (device < 0 || device >= kMaxDevices) return ask(value);
    if (const int known = known_[device].load(std::memory_order_relaxed); known > 0) {
      *value = known - 1;
      return cudaSuccess;
    }
    if (const cudaError_t err = ask(value); err != cudaSuccess) return err;
    if (*value >= 0 && *value < INT_MAX) known_[device].store(*value + 1, std::memory_order_relaxed);
    return cudaSuccess;
  }

 private:
  static constexpr int kMaxDevices = 64;
  std::atomic<int> known_[kMaxDevices] = {};  // per device: the fact + 1, or 0 before it is asked
};

// Calls f(ElementTag<T>{}) for the 16-bit type of a product's inputs;
// cudaErrorInvalidValue for any other type.
template <class F>
cudaError_t with_input_element(ElementType type, F&& f) {
  switch (type) {
    case ElementType::kFloat16: return f(ElementTag<__half>{});
    case ElementType::kBFloat16: return f(ElementTag<__nv_bfloat16>{});
    default: return cudaErrorInvalidValue;
  }
}

// Whether the code the current device would run for `kernel` was compiled for
// an arch whose Tensor Cores take Element. Below its kMinArch a kernel's body
// is compiled out (kWmmaCompiled), and a device may still pick such code: an
// sm_75 GPU, or a newer one JIT-compiling compute_75 PTX. fp16 runs wherever
// WMMA does, so only newer types pay for the query.
template <class Element, class Kernel>
cudaError_t check_kernel_arch(Kernel* kernel) {
  if constexpr (ElementTraits<Element>::kMinArch > ElementTraits<__half>::kMinArch) {
    cudaFuncAttributes attributes;
    const cudaError_t err = cudaFuncGetAttributes(&attributes, kernel);
    if (err != cudaSuccess) return err;
    if (attributes.ptxVersion * 10 < ElementTraits<Element>::kMinArch) return cudaErrorNotSupported;
  }
  return cudaSuccess;
}

// Refuses a tile whose kernel is empty in the code the device runs (built for
// an arch below the tile's kMinArch: kTileCompiled), as check_kernel_arch does
// for element types.
template <class Tile, class Kernel>
cudaError_t check_tile_arch(Kernel* kernel) {
  if constexpr (Tile::kMinArch > 75) {
    cudaFuncAttributes attributes;
    if (const cudaError_t err = cudaFuncGetAttributes(&attributes, kernel); err != cudaSuccess) return err;
    if (attributes.ptxVersion < Tile::kMinArch) return cudaErrorNotSupported;
  }
  return cudaSuccess;
}

// Everything a Tensor Core kernel needs before its launch: code that can run
// it, and the dynamic shared memory beyond the default 48 KiB it asks for.
template <class Element, class Kernel>
cudaError_t prepare_launch(Kernel* kernel, int smem_bytes) {
  if (const cudaError_t err = check_kernel_arch<Element>(kernel); err != cudaSuccess) return err;
  if (smem_bytes > 48 * 1024)
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  return cudaSuccess;
}

}  // namespace mpgemm::kernels
