// The definition of sm90::launch_wgmma_kernel (gemm_wgmma.h), included only
// by the gemm_wgmma_<a><b>.cu units that instantiate it.
#pragma once

#include "gemm_wgmma.h"
#include "launch_utils.h"
#include "tile_scheduler.cuh"
#include "wgmma_gemm.cuh"

namespace mpgemm::kernels::sm90 {

template <class Element, bool AKMajor, bool BKMajor>
cudaError_t launch_wgmma_kernel(const CUtensorMap& a_map, const CUtensorMap& b_map, const GemmParams& p,
                                const WgmmaSchedule& schedule, cudaStream_t stream) {
  using Smem = WgmmaSmem<Element, AKMajor, BKMajor>;
  auto* kernel = &wgmma_gemm_kernel<Element, AKMajor, BKMajor>;
  if (!wgmma_compiled()) return cudaErrorNotSupported;
  if (const cudaError_t err = prepare_launch<Element>(kernel, Smem::kBytes); err != cudaSuccess) return err;
  const int64_t tiles = p.batch * TileScheduler<Config>::tiles(p.m, p.n);
  const int multiprocessors = device_limits().multiprocessors;
  const int64_t blocks = tiles < multiprocessors ? tiles : multiprocessors;
  CUtensorMap a = a_map, b = b_map;
  GemmParams params = p;
  WgmmaSchedule sched = schedule;
  void* args[] = {&a, &b, &params, &sched};
  return cudaLaunchKernel(kernel, dim3(unsigned(blocks)), dim3(Config::kThreads), args, Smem::kBytes, stream);
}

}  // namespace mpgemm::kernels::sm90

// Instantiates the launch of both input types for one pair of layouts.
#define MPGEMM_WGMMA_LAUNCH(A_K_MAJOR, B_K_MAJOR)                                                              \
  template cudaError_t mpgemm::kernels::sm90::launch_wgmma_kernel<__half, A_K_MAJOR, B_K_MAJOR>(               \
      const CUtensorMap&, const CUtensorMap&, const mpgemm::kernels::GemmParams&,                          \
      const mpgemm::kernels::sm90::WgmmaSchedule&, cudaStream_t);          \
  template cudaError_t mpgemm::kernels::sm90::launch_wgmma_kernel<__nv_bfloat16, A_K_MAJOR, B_K_MAJOR>(        \
      const CUtensorMap&, const CUtensorMap&, const mpgemm::kernels::GemmParams&,                          \
      const mpgemm::kernels::sm90::WgmmaSchedule&, cudaStream_t);
