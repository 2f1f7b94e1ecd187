// cp.async (csrc/kernels/arch/cp_async.cuh) for the host-side kernel
// simulation, found ahead of it on the include path. A copy lands either at issue
// or only when a wait_group lets it complete (sim::async_copies_late), so
// reading a stage before waiting for it finds NaN. Valid chunks read global
// memory with memcpy, where AddressSanitizer checks them; invalid ones read
// nothing, as on the GPU. Both addresses must be aligned to the copy's size,
// as the hardware requires.
#pragma once

#include <cuda_runtime.h>

namespace mpgemm::kernels {

template <int Bytes>
void cp_async(void* smem_dst, const void* global_src, bool valid) {
  static_assert(Bytes == 16 || Bytes == 8 || Bytes == 4, "cp.async copies 4, 8 or 16 bytes");
  SIM_CHECK(__CUDA_ARCH__ >= 800, "cp.async needs sm_80");
  auto* dst = static_cast<unsigned char*>(smem_dst);
  SIM_CHECK(dst >= sim::shared_memory && dst + Bytes <= sim::shared_memory + sim::shared_size,
            "destination not shared");
  SIM_CHECK(reinterpret_cast<uintptr_t>(dst) % Bytes == 0 && reinterpret_cast<uintptr_t>(global_src) % Bytes == 0,
            "cp.async addresses must be aligned to the copy's size");
  auto copy = [dst, global_src, valid] {
    if (valid)
      memcpy(dst, global_src, Bytes);
    else
      memset(dst, 0, Bytes);
  };
  if (sim::async_copies_late)
    sim::async_open.push_back(copy);
  else
    copy();
}

inline void cp_async_commit() {
  sim::async_groups.push_back(std::move(sim::async_open));
  sim::async_open.clear();
}

template <int Pending>
void cp_async_wait() {
  while (sim::async_groups.size() > Pending) {
    for (auto& copy : sim::async_groups.front()) copy();
    sim::async_groups.erase(sim::async_groups.begin());
  }
}

}  // namespace mpgemm::kernels
