// The tensor copy engine (csrc/kernels/arch/copy_engine.cuh) for the
// host-side kernel simulation, found ahead of it on the include path:
// ../hopper_sim.h's models of box loads (tiled and im2col) and stores, bulk async-groups and
// the async-proxy fence.
#pragma once

#include <cstdint>

#include "kernel_sim/hopper_sim.h"

namespace mpgemm::kernels {

inline void tma_load_3d(void* dst, const void* map, uint64_t* bar, int c0, int c1, int c2) {
  sim::hopper::tma_load(dst, map, bar, c0, c1, c2);
}
inline void tma_load_3d_multicast(void* dst, const void* map, uint64_t* bar, int c0, int c1, int c2,
                                  uint16_t ranks) {
  sim::hopper::tma_load(dst, map, bar, c0, c1, c2, ranks);
}
inline void tma_load_im2col_4d(void* dst, const void* map, uint64_t* bar, int c, int w, int h, int n,
                               uint16_t w_offset, uint16_t h_offset) {
  sim::hopper::tma_load(dst, map, bar, c, w, h, 0, n, {w_offset, h_offset}, true);
}
inline void tma_store_3d(const void* map, const void* src, int c0, int c1, int c2) {
  sim::hopper::tma_store(map, src, c0, c1, c2);
}
inline void bulk_commit_group() { sim::hopper::bulk_commit_group(); }
template <int N>
void bulk_wait_group_read() {
  sim::hopper::bulk_wait_group(N);
}
template <int N>
void bulk_wait_group() {
  sim::hopper::bulk_wait_group(N);
}
inline void fence_proxy_async_shared() { sim::hopper::fence_proxy_async_shared(); }

}  // namespace mpgemm::kernels
