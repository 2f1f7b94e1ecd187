// The definition of sm90::launch_wgmma_kernel (sm90/launch.h), included only
// by the sm90/gemm_kernels_*.cu units that instantiate it.
#pragma once

#include "common/launch_utils.h"
#include "sm90/gemm_kernel.cuh"
#include "sm90/launch.h"
#include "sm90/tile_scheduler.cuh"

namespace mpgemm::kernels::sm90 {

template <class Element, class Tile, bool AKMajor, bool BKMajor>
cudaError_t launch_wgmma_kernel(const CUtensorMap& a_map, const CUtensorMap& b_map, const CUtensorMap& d_map,
                                const GemmParams& p, const WgmmaSchedule& schedule, cudaStream_t stream) {
  using Smem = WgmmaSmem<Tile, AKMajor, BKMajor>;
  constexpr int kCluster = Tile::kClusterM;
  auto* kernel = &wgmma_gemm_kernel<Element, Tile, AKMajor, BKMajor>;
  if (!wgmma_compiled()) return cudaErrorNotSupported;
  if (const cudaError_t err = prepare_launch<Element>(kernel, Smem::kBytes); err != cudaSuccess) return err;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = kCluster;
  cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(kCluster);
  config.blockDim = dim3(Tile::kThreads);
  config.dynamicSmemBytes = Smem::kBytes;
  config.stream = stream;
  config.attrs = &cluster;
  config.numAttrs = kCluster > 1 ? 1 : 0;
  // As many clusters as run at once: pairs need two free multiprocessors of
  // one GPC, which the driver knows and the multiprocessor count does not.
  int resident = device_limits().multiprocessors;
  if constexpr (kCluster > 1) {
    static PerDeviceFact resident_clusters;  // of this kernel, whose launch shape never changes
    const cudaError_t err = resident_clusters.get(
        &resident, [&](int* clusters) { return cudaOccupancyMaxActiveClusters(clusters, kernel, &config); });
    if (err != cudaSuccess) return err;
  }
  if (resident < 1) return cudaErrorInvalidConfiguration;
  const int64_t tiles = PersistentTileScheduler<Tile>::tiles(p);
  config.gridDim = dim3(unsigned((tiles < resident ? tiles : resident) * kCluster));
  return cudaLaunchKernelEx(&config, kernel, a_map, b_map, d_map, p, schedule);
}

}  // namespace mpgemm::kernels::sm90

// Instantiates the launch of one input type and Hopper tile on one pair of
// layouts, and on all four: a unit's kernels (sm90/launch.h).
#define MPGEMM_WGMMA_LAUNCH_ONE(ELEMENT, TILE, A_K_MAJOR, B_K_MAJOR)                                            \
  template cudaError_t mpgemm::kernels::sm90::launch_wgmma_kernel<ELEMENT, mpgemm::kernels::TILE, A_K_MAJOR,    \
                                                                  B_K_MAJOR>(                                   \
      const CUtensorMap&, const CUtensorMap&, const CUtensorMap&, const mpgemm::kernels::GemmParams&,           \
      const mpgemm::kernels::sm90::WgmmaSchedule&, cudaStream_t);
#define MPGEMM_WGMMA_LAUNCH(ELEMENT, TILE)               \
  MPGEMM_WGMMA_LAUNCH_ONE(ELEMENT, TILE, true, true)   \
  MPGEMM_WGMMA_LAUNCH_ONE(ELEMENT, TILE, true, false)  \
  MPGEMM_WGMMA_LAUNCH_ONE(ELEMENT, TILE, false, true)  \
  MPGEMM_WGMMA_LAUNCH_ONE(ELEMENT, TILE, false, false)
