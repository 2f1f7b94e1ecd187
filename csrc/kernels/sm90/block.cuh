// The body every Hopper kernel's block runs, GEMM and convolution alike:
// warp-specialized, persistent, on the collective pieces of sm90/.
//
// Work: a persistent grid walks the tiles of every matrix of the batch in
// grouped order (sm90/tile_scheduler.cuh), or a strided dgrad's phases one
// after another, each its own GEMM with its own K, or (stream-K,
// sm90/stream_k.cuh) equal runs of all the tiles' K slices, a tile split
// between runs summed by the block that ends it. With Tile::kClusterM = 2
// blocks run in pairs, a pair taking two tiles stacked along M that read the
// same columns of B.
// Block: three warpgroups with split roles (warp specialization). Warpgroup 0
// produces: one of its threads issues the copies of each 64-deep K slice
// into a ring of Tile::kStages shared-memory stages (sm90/pipeline.cuh), each
// guarded by two mbarriers: `full` completes when the copy engine has
// written the stage's bytes (its B half from the other block of a pair too),
// `empty` when every consumer that reads the stage's copies has finished
// reading it (in a pair, the other block's as well: its copies land in both
// blocks). What the copies are is the kernel's: a GEMM's tiles of A and B
// (sm90/producer.cuh), a convolution's im2col boxes of activations and tiles
// of filters (sm90/conv_producer.cuh). Warpgroups 1 and 2 consume
// (sm90/mainloop.cuh) on one of two schedules (Tile::kSchedule): cooperative,
// 128 x N tiles whose 64-row halves the two consumers take, or ping-pong,
// 64 x N tiles that the consumers take in turn, one storing a tile while
// the other's wgmmas run; N is the tile's width, 256, or 128 and 64 for
// narrow outputs, the ring deeper where its stages are smaller. Each then
// stores its accumulators (sm90/epilogue.cuh).
// Why: mma.sync reaches about two thirds of Hopper's Tensor Core rate and
// wgmma all of it; the copy engine computes every address and bound itself
// (elements past the tensor arrive as zeros), so the consumers do no address
// arithmetic at all; setmaxnreg moves the producer's unneeded registers to
// the consumers.
#pragma once

#include <cstdint>

#include <cuda.h>

#include "arch/barrier.cuh"
#include "arch/copy_engine.cuh"
#include "arch/mbarrier.cuh"
#include "arch/sm90a.h"
#include "arch/smem.cuh"
#include "arch/wgmma.cuh"
#include "common/element_traits.cuh"
#include "common/gemm_params.h"
#include "common/launch_utils.h"
#include "sm90/epilogue.cuh"
#include "sm90/mainloop.cuh"
#include "sm90/params.h"
#include "sm90/pipeline.cuh"
#include "sm90/producer.cuh"
#include "sm90/stream_k.cuh"
#include "sm90/tile_scheduler.cuh"

namespace mpgemm::kernels::sm90 {

namespace {
// A kernel never launched, whose sm_90a code alone declares
// kSm90aProbeSharedBytes of static shared memory: the launcher tells which
// code the device loaded for this translation unit from the probe's
// attributes, since a kernel's binary version (90) does not tell sm_90a code
// from plain sm_90's.
__global__ void sm90a_probe_kernel(int* out) {
#if MPGEMM_SM90A
  constexpr int kWords = kSm90aProbeSharedBytes / sizeof(int);
  __shared__ int marker[kWords];
  marker[threadIdx.x % kWords] = threadIdx.x;
  __syncthreads();
  *out = marker[(threadIdx.x + 1) % kWords];
#endif
}

// Whether the code the current device runs for this translation unit has the
// Hopper kernels, asked once per device. cudaFuncGetAttributes is a driver
// query, with no copy and no synchronization, so a unit's first call may come
// inside a CUDA graph capture.
bool wgmma_compiled() {
  static PerDeviceFact compiled;
  int yes = 0;
  const cudaError_t err = compiled.get(&yes, [](int* answer) {
    cudaFuncAttributes attributes;
    const cudaError_t err = cudaFuncGetAttributes(&attributes, sm90a_probe_kernel);
    if (err == cudaSuccess) {
      // At least the marker's bytes: sm_90a's object file counts the 1 KiB
      // that the arch reserves below a block's static shared memory too.
      *answer = attributes.sharedSizeBytes >= kSm90aProbeSharedBytes;
      return cudaSuccess;
    }
    (void)cudaGetLastError();  // so that no later launch's check reports it
    *answer = 0;
    // No code the device can load is a lasting no; any other error is not kept.
    return err == cudaErrorNoKernelImageForDevice || err == cudaErrorInvalidDeviceFunction ? cudaSuccess : err;
  });
  return err == cudaSuccess && yes == 1;
}
}  // namespace

// In ping-pong, consumer c waits at named barrier kTurnBarrier + c for its
// turn to run a mainloop (after the epilogue's barriers).
constexpr int kTurnBarrier = kStripBarriersEnd;

// What a Hopper block does besides storing D = activation(the tiles'
// products + bias), flags combined with |, each set in kernels of its own
// so that the others keep their code: kBlockStagedRows, D's rows strided
// pixels stored through shared memory; kBlockColumnMoments, each 64-row
// block's column moments of D written too; kBlockPreActivation, the sums
// before the activation stored to p.pre_activation as well (through z_map
// where D goes through the copy engine) (sm90/epilogue.cuh);
// kBlockARowSums, A's row sums over K to p.a_row_sums (matrix `batch` of the
// tile order at batch * m), from the mainloop (sm90/mainloop.cuh's RowSums);
// kBlockActivationGrad, D the sums times the activation's derivative at
// p.activation_input, in place of bias and activation (sm90/epilogue.cuh);
// kBlockAddend, D the sums plus p.addend (sm90/epilogue.cuh's add_addend);
// kBlockGeluTanh (with kBlockPreActivation), GELU's tanh form as the
// activation (sm90/epilogue.cuh's activate_gelu_tanh);
// kBlockGatheringProducer, every thread of the producer's warpgroup runs
// `load`, which gathers part of each stage itself
// (sm90/conv_gather_producer.cuh: its `full` barriers then count
// kGatheredStageArrivals, and the producer keeps more registers).
// Flags, not a struct, as a template argument: the kernels build as C++17.
enum BlockExtras : unsigned {
  kBlockPlain = 0,
  kBlockStagedRows = 1u << 0,
  kBlockColumnMoments = 1u << 1,
  kBlockPreActivation = 1u << 2,
  kBlockARowSums = 1u << 3,
  kBlockActivationGrad = 1u << 4,
  kBlockGatheringProducer = 1u << 5,
  kBlockAddend = 1u << 6,
  kBlockGeluTanh = 1u << 7,
};

// Fills the tile of ones that the a_row_sums kernels multiply A's rows by,
// at shared address `ones`, a thread a 4-byte word, and makes the writes
// visible to the wgmmas that read them (the async proxy) before the block's
// first barrier.
template <class Element>
__device__ __forceinline__ void fill_ones(uint32_t ones) {
  constexpr int kWords = OnesTile::kBytes / 4;
  static_assert(kWords <= Config::kThreads, "a thread a word");
  if (threadIdx.x >= kWords) return;
  const auto pair = ElementTraits<Element>::round_pair(1.0f, 1.0f);
  st_shared(ones + 4 * threadIdx.x, *reinterpret_cast<const uint32_t*>(&pair));
  fence_proxy_async_shared();
}

// One block of a Hopper kernel: D = activation(the tiles' products + bias) over
// the tiles `work` names (sm90/tile_scheduler.cuh: UniformTiles, or a strided
// dgrad's DgradPhaseTiles; sm90/stream_k.cuh's StreamKTiles, whose units are
// runs of a tile's K slices, fixed up before they are stored), each tile's K slices' copies issued by
// load(shared, tile, k_slices, rank, pipe) into the ring from pipe on
// (leaving pipe past them), its D stored as work.gemm(tile) and
// work.output(tile) describe it (through d_map where that says so), and what
// kExtras asks besides. A tile of no K slices (a phase no tap reaches) is
// stored as zeros.
template <class Element, class Tile, bool AKMajor, bool BKMajor, unsigned kExtras = kBlockPlain, class Work,
          class LoadTile>
__device__ __forceinline__ void wgmma_block_over(const Work& work, const CUtensorMap* d_map, const LoadTile& load,
                                                 const CUtensorMap* z_map = nullptr) {
#if MPGEMM_SM90A
  using Smem = WgmmaSmem<Tile, AKMajor, BKMajor>;
  static_assert(kFitsFromAnyStart<Smem>, "the launch's shared memory must hold the ring from any 16-byte start");
  static_assert(!Work::kSlicesVary || (!Tile::kPingPong && kExtras == kBlockStagedRows),
                "tiles of different K on cooperative consumers, storing strided rows only");
  static_assert(!Work::kStreamK || (!Tile::kPingPong && kExtras == kBlockPlain),
                "stream-K on cooperative consumers, storing D alone");
  constexpr bool kGathers = (kExtras & kBlockGatheringProducer) != 0;
  static_assert(!kGathers || (kExtras == kBlockGatheringProducer && Tile::kClusterM == 1),
                "a gathering producer on blocks alone, storing D alone");
  // Swizzled tiles start at 1024-byte boundaries; dynamic shared memory is only 16-byte aligned.
  const uintptr_t start = reinterpret_cast<uintptr_t>(block_shared_memory());
  Smem& shared = *reinterpret_cast<Smem*>((start + kSwizzleAtomBytes - 1) & ~uintptr_t(kSwizzleAtomBytes - 1));

  const int warpgroup = threadIdx.x / Config::kWarpgroupThreads;
  const int thread = threadIdx.x % Config::kWarpgroupThreads;
  const int rank = Tile::kClusterM == 1 ? 0 : int(cluster_rank());
  [[maybe_unused]] RowSums row_sums;
  if constexpr ((kExtras & kBlockARowSums) != 0) {
    const uint32_t ones = smem_address(&shared) + kOnesOffset<Smem>;
    fill_ones<Element>(ones);
    row_sums.ones = OnesTile::descriptor(ones, 0);
  }
  if (threadIdx.x == 0) {
    for (int s = 0; s < Tile::kStages; ++s) {
      mbarrier_init(&shared.full[s], kGathers ? kGatheredStageArrivals : 1);
      mbarrier_init(&shared.empty[s], Tile::kStageReaders * Tile::kClusterM);
    }
    fence_barrier_init();
  }
  // The other block's copies and arrivals may reach this one's barriers only once they exist.
  if constexpr (Tile::kClusterM == 1) __syncthreads();
  else cluster_sync();

  // A stream-K block walks the units of its own run (count() of them) in
  // order; a block of the others, every step()-th of the grid's tiles.
  using Scheduler = PersistentTileScheduler<Tile>;
  const int64_t tiles = work.count();
  const int64_t first_tile = Work::kStreamK ? 0 : Scheduler::first();
  const int64_t tile_step = Work::kStreamK ? 1 : Scheduler::step();
  TilePipeline<Tile> pipe;

  if (warpgroup == 0) {
    setmaxnreg_dec<kGathers ? Config::kGatherProducerRegisters : Config::kProducerRegisters>();
    if (!kGathers && thread != 0) return;
    for (int64_t t = first_tile; t < tiles; t += tile_step) {
      const auto tile = work.tile(t, rank);
      load(shared, tile, work.slices(tile), rank, pipe);
    }
    wait_for_hand_backs<Tile>(shared, pipe);
    return;
  }

  setmaxnreg_inc<kGathers ? Config::kGatherConsumerRegisters : Config::kConsumerRegisters>();
  const int consumer = warpgroup - 1;
  // Cooperative: every tile of the block, this consumer's 64 rows of it.
  // Ping-pong: every other tile whole, from the block's tile `consumer` on;
  // the ring holds the tiles' slices in the block's order, so this consumer
  // starts `consumer` tiles' slices in and skips the other's after each of
  // its own (every tile's K slices the same: UniformTiles). The mainloops
  // take turns: a tile's begins once the block's
  // tile before it has waited on its last slice, so that no consumer waits
  // on a stage two rounds ahead of the last wait on it, which the barrier's
  // parity could not tell from one round behind. Each turn is handed on only
  // where a next tile exists, so that no arrival outlives the block.
  const int64_t consumer_first = first_tile + (Tile::kPingPong ? consumer * tile_step : 0);
  const int64_t consumer_step = Tile::kPingPong ? Config::kConsumers * tile_step : tile_step;
  const int row_block = Tile::kPingPong ? 0 : consumer;  // of the A tile, in 64-row instruction blocks
  static_assert(!Tile::kPingPong || Config::kConsumers == 2, "ping-pong hands each turn to the other consumer");
  constexpr int kTurnThreads = Config::kConsumers * Config::kWarpgroupThreads;
  const int next_consumer = (consumer + 1) % Config::kConsumers;
  if constexpr (Tile::kPingPong) pipe.advance(consumer * work.k_slices);
  float acc[Tile::kAccumulators];
  OutputStaging staging{shared.out[consumer]};
  for (int64_t t = consumer_first; t < tiles; t += consumer_step) {
    const auto tile = work.tile(t, rank);
    const int k_slices = work.slices(tile);
    if constexpr (Tile::kPingPong)
      if (t != first_tile) named_barrier_sync(kTurnBarrier + consumer, kTurnThreads);
    // The first column of tiles sums A's rows.
    const bool sums_rows = (kExtras & kBlockARowSums) != 0 && tile.origin.n0 == 0;
    // Where a tile may have no K slices, the sums start from zeros (the
    // first wgmma of a tile that has some ignores them), which also leaves
    // the accumulators dead between tiles.
    if constexpr (Work::kSlicesVary)
#pragma unroll
      for (int i = 0; i < Tile::kAccumulators; ++i) acc[i] = 0.0f;
    if (!Work::kSlicesVary || k_slices > 0) {
      const TilePipeline<Tile> reading = [&] {
        if constexpr ((kExtras & kBlockARowSums) != 0)
          if (sums_rows)
            return mma_tile<Element, Tile, true>(acc, shared, pipe, k_slices, row_block, thread, &row_sums);
        return mma_tile<Element, Tile>(acc, shared, pipe, k_slices, row_block, thread);
      }();
      if constexpr (Tile::kPingPong)
        if (t + tile_step < tiles) named_barrier_arrive(kTurnBarrier + next_consumer, kTurnThreads);
      finish_tile<Tile>(shared, reading, thread);
    }
    // Stream-K: a tile another block ends goes to this block's slot, not to D.
    if constexpr (Work::kStreamK)
      if (!work.fix_up(acc, tile, consumer, thread)) continue;
    if constexpr (Tile::kPingPong) pipe.advance(k_slices);
    const GemmParams& p = work.gemm(tile);
    const int64_t row0 = tile.origin.m0 + row_block * Config::kInstrM;
    if (sums_rows) store_row_sums(row_sums.acc, p, tile.batch, row0, thread);
    store_accumulators<Element, Tile, (kExtras & kBlockStagedRows) != 0, (kExtras & kBlockColumnMoments) != 0,
                       (kExtras & kBlockPreActivation) != 0, (kExtras & kBlockActivationGrad) != 0,
                       (kExtras & kBlockAddend) != 0, (kExtras & kBlockGeluTanh) != 0>(
        acc, p, work.output(tile), d_map, staging, work.d_batch(tile), row0, tile.origin.n0, thread, consumer, z_map);
  }
  // The shared memory the last stores read goes with the block.
  if (thread == 0) bulk_wait_group<0>();
#endif
}

// One block of a Hopper kernel over every tile of p's batch (UniformTiles),
// each of k_slices K slices, D as p and `schedule` describe it.
template <class Element, class Tile, bool AKMajor, bool BKMajor, unsigned kExtras = kBlockPlain, class LoadTile>
__device__ __forceinline__ void wgmma_block(const CUtensorMap& d_map, const GemmParams& p,
                                            const WgmmaSchedule& schedule, int k_slices, const LoadTile& load,
                                            const CUtensorMap* z_map = nullptr) {
  wgmma_block_over<Element, Tile, AKMajor, BKMajor, kExtras>(UniformTiles<Tile>{p, schedule, k_slices}, &d_map, load,
                                                             z_map);
}

}  // namespace mpgemm::kernels::sm90
