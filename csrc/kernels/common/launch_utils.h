// Host-side facts and steps the launchers share.
#pragma once

#include <atomic>
#include <climits>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <utility>

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

// What the runtime says of a kernel on a device, asked once per kernel and
// device and kept for the process's life (the launchers below run the same
// few hundred kernels over and over): the arch of the code the device runs
// for it (cudaFuncAttributes::ptxVersion), and the most dynamic shared
// memory it has been opted into. Asked at every launch, these cost up to
// three function-attribute calls a launch, and a set was reported to make
// the runtime wait for the copies in flight (bench/NOTES.md, "Kernel
// attributes asked once per device"). Keyed by the kernel's address, not its
// type (many kernels share one signature), and by device number: a device
// reset (cudaDeviceReset, which torch never calls) would leave the kept
// opt-ins stale. Errors are returned and not kept. A launch of a kernel
// already asked about takes no lock but the table's shared one and calls
// the runtime not at all; the first asks outside the table's lock, so that
// it holds up no other kernel's launch.
class KernelAttributes {
 public:
  // The arch of the code the current device runs for `kernel`, into *arch.
  template <class Kernel>
  static cudaError_t ptx_version(Kernel* kernel, int* arch) {
    Known* known = nullptr;
    if (const cudaError_t err = find(reinterpret_cast<const void*>(kernel), &known); err != cudaSuccess) return err;
    int version = known->ptx_version.load(std::memory_order_relaxed);
    if (version == 0) {
      cudaFuncAttributes attributes;
      if (const cudaError_t err = cudaFuncGetAttributes(&attributes, kernel); err != cudaSuccess) return err;
      version = attributes.ptxVersion;
      known->ptx_version.store(version, std::memory_order_relaxed);
    }
    *arch = version;
    return cudaSuccess;
  }

  // Opts `kernel` into `bytes` of dynamic shared memory on the current
  // device, unless it already is into as many (the limit is never lowered,
  // so that a launch asking for less still fits).
  template <class Kernel>
  static cudaError_t opt_in_smem(Kernel* kernel, int bytes) {
    Known* known = nullptr;
    if (const cudaError_t err = find(reinterpret_cast<const void*>(kernel), &known); err != cudaSuccess) return err;
    if (known->opted_in_smem.load(std::memory_order_acquire) >= bytes) return cudaSuccess;
    // This kernel's sets on this device one at a time, so that two threads
    // opting it into different sizes leave the larger set and kept.
    const std::lock_guard<std::mutex> lock(known->setting);
    if (known->opted_in_smem.load(std::memory_order_relaxed) >= bytes) return cudaSuccess;
    if (const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
        err != cudaSuccess)
      return err;
    known->opted_in_smem.store(bytes, std::memory_order_release);
    return cudaSuccess;
  }

 private:
  struct Known {
    std::atomic<int> ptx_version{0};    // 0 until asked
    std::atomic<int> opted_in_smem{0};  // bytes; 0 until opted in
    std::mutex setting;
  };

  // The entry of `kernel` on the current device, made on its first use.
  // Entries are never removed, so a pointer to one stays valid.
  static cudaError_t find(const void* kernel, Known** known) {
    int device = 0;
    if (const cudaError_t err = cudaGetDevice(&device); err != cudaSuccess) return err;
    // Never destroyed: a launch from a thread still running at exit finds it whole.
    static KernelAttributes* const table = new KernelAttributes;
    const std::pair<const void*, int> key{kernel, device};
    {
      const std::shared_lock<std::shared_mutex> reading(table->mutex_);
      if (const auto it = table->known_.find(key); it != table->known_.end()) {
        *known = it->second.get();
        return cudaSuccess;
      }
    }
    const std::lock_guard<std::shared_mutex> writing(table->mutex_);
    std::unique_ptr<Known>& entry = table->known_[key];
    if (!entry) entry = std::make_unique<Known>();
    *known = entry.get();
    return cudaSuccess;
  }

  std::shared_mutex mutex_;
  std::map<std::pair<const void*, int>, std::unique_ptr<Known>> known_;  // by (kernel, device)
};

// Whether the code the current device would run for `kernel` was compiled for
// an arch whose Tensor Cores take Element. Below its kMinArch a kernel's body
// is compiled out (kWmmaCompiled), and a device may still pick such code: an
// sm_75 GPU, or a newer one JIT-compiling compute_75 PTX. fp16 runs wherever
// WMMA does, so only newer types ask.
template <class Element, class Kernel>
cudaError_t check_kernel_arch(Kernel* kernel) {
  if constexpr (ElementTraits<Element>::kMinArch > ElementTraits<__half>::kMinArch) {
    int arch = 0;
    if (const cudaError_t err = KernelAttributes::ptx_version(kernel, &arch); err != cudaSuccess) return err;
    if (arch * 10 < ElementTraits<Element>::kMinArch) return cudaErrorNotSupported;
  }
  return cudaSuccess;
}

// Refuses a tile whose kernel is empty in the code the device runs (built for
// an arch below the tile's kMinArch: kTileCompiled), as check_kernel_arch does
// for element types.
template <class Tile, class Kernel>
cudaError_t check_tile_arch(Kernel* kernel) {
  if constexpr (Tile::kMinArch > 75) {
    int arch = 0;
    if (const cudaError_t err = KernelAttributes::ptx_version(kernel, &arch); err != cudaSuccess) return err;
    if (arch < Tile::kMinArch) return cudaErrorNotSupported;
  }
  return cudaSuccess;
}

// Everything a Tensor Core kernel needs before its launch: code that can run
// it, and the dynamic shared memory beyond the default 48 KiB it asks for.
template <class Element, class Kernel>
cudaError_t prepare_launch(Kernel* kernel, int smem_bytes) {
  if (const cudaError_t err = check_kernel_arch<Element>(kernel); err != cudaSuccess) return err;
  if (smem_bytes > 48 * 1024) return KernelAttributes::opt_in_smem(kernel, smem_bytes);
  return cudaSuccess;
}

}  // namespace mpgemm::kernels
