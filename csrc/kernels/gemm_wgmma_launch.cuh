// The definition of sm90::launch_wgmma_kernel (gemm_wgmma.h), included only
// by the gemm_wgmma_<a><b>.cu units that instantiate it.
#pragma once

#include "gemm_wgmma.h"
#include "launch_utils.h"
#include "tile_scheduler.cuh"
#include "wgmma_gemm.cuh"

namespace mpgemm::kernels::sm90 {

template <class Element, bool AKMajor, bool BKMajor, int kCluster, Consumers kSplit>
cudaError_t launch_wgmma_kernel(const CUtensorMap& a_map, const CUtensorMap& b_map, const CUtensorMap& d_map,
                                const GemmParams& p, const WgmmaSchedule& schedule, cudaStream_t stream) {
  using TileConfig = WgmmaTileConfig<kSplit>;
  using Smem = WgmmaSmem<TileConfig, AKMajor, BKMajor>;
  auto* kernel = &wgmma_gemm_kernel<Element, kCluster, kSplit, AKMajor, BKMajor>;
  if (!wgmma_compiled()) return cudaErrorNotSupported;
  if (const cudaError_t err = prepare_launch<Element>(kernel, Smem::kBytes); err != cudaSuccess) return err;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = kCluster;
  cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(kCluster);
  config.blockDim = dim3(Config::kThreads);
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
  const int64_t tiles = p.batch * TileScheduler<ClusterTile<TileConfig, kCluster>>::tiles(p.m, p.n);
  config.gridDim = dim3(unsigned((tiles < resident ? tiles : resident) * kCluster));
  return cudaLaunchKernelEx(&config, kernel, a_map, b_map, d_map, p, schedule);
}

}  // namespace mpgemm::kernels::sm90

// Instantiates the launch of both input types for one pair of layouts, one
// cluster size and one consumer schedule (cooperative or ping-pong): one
// translation unit's kernels (gemm_wgmma.h).
#define MPGEMM_WGMMA_LAUNCH_ONE(ELEMENT, A_K_MAJOR, B_K_MAJOR, CLUSTER, SPLIT)                                   \
  template cudaError_t                                                                                          \
  mpgemm::kernels::sm90::launch_wgmma_kernel<ELEMENT, A_K_MAJOR, B_K_MAJOR, CLUSTER,                           \
                                             mpgemm::kernels::sm90::Consumers::SPLIT>(                          \
      const CUtensorMap&, const CUtensorMap&, const CUtensorMap&, const mpgemm::kernels::GemmParams&,           \
      const mpgemm::kernels::sm90::WgmmaSchedule&, cudaStream_t);
#define MPGEMM_WGMMA_LAUNCH(A_K_MAJOR, B_K_MAJOR, CLUSTER, SPLIT)       \
  MPGEMM_WGMMA_LAUNCH_ONE(__half, A_K_MAJOR, B_K_MAJOR, CLUSTER, SPLIT) \
  MPGEMM_WGMMA_LAUNCH_ONE(__nv_bfloat16, A_K_MAJOR, B_K_MAJOR, CLUSTER, SPLIT)
