// Hopper GEMM (sm_90a): D[b] = activation(A[b] @ B[b] + bias), 16-bit inputs,
// fp32 accumulation, D in fp32 or the inputs' type, with wgmma and the tensor
// copy engine (TMA).
//
// Work: a persistent grid, one block per multiprocessor, walks the tiles of
// every matrix of the batch in grouped order (TileScheduler), each block
// taking every gridDim.x-th tile.
// Cluster: with kCluster = 2, blocks run in pairs, a pair taking two tiles
// stacked along M that read the same 256 columns of B. Each block copies its
// own A and half of the shared B, multicast into both blocks' shared memory:
// each block's copies per slice fall by a third (128-row tiles) or two
// fifths (64-row tiles), which is what L2 must deliver.
// Block: three warpgroups with split roles (warp specialization). Warpgroup 0
// produces: one of its threads issues the box copies of each 64-deep K slice
// of A's rows and B's 256 columns into a ring of kStages shared-memory
// stages, each guarded by two mbarriers: `full` completes when the copy
// engine has written the stage's bytes (its B half from the other block of
// a pair too), `empty` when every consumer that reads the stage's copies has
// finished reading it (in a pair, the other block's as well: its copies land
// in both blocks). Warpgroups 1 and 2 consume, each running 64 x 256 x 16
// wgmmas into 64 x 256 fp32 accumulators in registers (128 per thread) and
// keeping one slice's wgmmas in flight while it waits for the next, on one of
// two schedules (WgmmaTileConfig): cooperative, 128 x 256 tiles whose 64-row
// halves the two consumers take, or ping-pong, 64 x 256 tiles that the
// consumers take in turn, one storing a tile while the other's wgmmas run.
// Epilogue: bias and activation in registers, then, where D's tensor map
// exists (a 16-byte aligned base and pitches), strips of 64 x 128 bytes
// written to shared memory and stored by the copy engine, two strips in
// flight, so that the consumer goes on to its next tile while the last strips
// drain; otherwise stores from registers.
// Why: mma.sync reaches about two thirds of Hopper's Tensor Core rate and
// wgmma all of it; the copy engine computes every address and bound itself
// (elements past the matrix arrive as zeros), so the consumers do no address
// arithmetic at all; setmaxnreg moves the producer's unneeded registers to
// the consumers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cuda.h>

#include "element_traits.cuh"
#include "gemm_params.h"
#include "gemm_wgmma.h"
#include "hopper_ptx.cuh"
#include "launch_utils.h"
#include "tile_scheduler.cuh"
#include "wgmma_layout.h"

namespace mpgemm::kernels {

// The block's dynamic shared memory, the one array every kernel here names.
extern __shared__ __align__(128) unsigned char smem[];

// This block's dynamic shared memory: `smem`, or in the host simulation,
// where a cluster's blocks run at once, the running block's own.
__device__ __forceinline__ unsigned char* block_shared_memory() {
#if defined(MPGEMM_KERNEL_SIM)
  return sim::shared_memory;
#else
  return smem;
#endif
}

namespace sm90 {

using Config = WgmmaBlockConfig;

namespace {
// 1 in code built for sm_90a, where wgmma_gemm_kernel has its body, 0 in
// code for any other arch: the launcher reads it from the code the device
// loaded, since a kernel's binary version (90) does not tell sm_90a code
// from plain sm_90's.
__device__ int kWgmmaCompiled = MPGEMM_SM90A;

// Whether the code the current device runs for this translation unit has the
// Hopper kernels, asked once per device (the copy synchronizes); a symbol
// that cannot be read counts as no.
bool wgmma_compiled() {
  static PerDeviceFact compiled;
  int yes = 0;
  const cudaError_t err = compiled.get(&yes, [](int* answer) {
    int flag = 0;
    *answer = cudaMemcpyFromSymbol(&flag, kWgmmaCompiled, sizeof(flag)) == cudaSuccess && flag == 1;
    return cudaSuccess;
  });
  return err == cudaSuccess && yes == 1;
}
}  // namespace

template <class TileConfig, bool AKMajor, bool BKMajor>
struct WgmmaSmem {
  using ATile = OperandTile<TileConfig::kBlockM, AKMajor>;
  using BTile = OperandTile<Config::kBlockN, BKMajor>;
  alignas(kSwizzleAtomBytes) uint8_t a[Config::kStages][ATile::kBytes];
  alignas(kSwizzleAtomBytes) uint8_t b[Config::kStages][BTile::kBytes];
  alignas(kSwizzleAtomBytes) uint8_t out[Config::kConsumers][Config::kOutputBuffers][Config::kOutputStripBytes];
  uint64_t full[Config::kStages];
  uint64_t empty[Config::kStages];
  static constexpr int kBytes = TileConfig::kSmemBytes;
};

// The kernel rounds the dynamic shared memory's start (16-byte aligned) up to
// a swizzle pattern: the launch's bytes hold the ring from any such start.
template <class Smem>
constexpr bool kFitsFromAnyStart =
    offsetof(Smem, empty) + sizeof(Smem::empty) + (kSwizzleAtomBytes - 16) <= size_t(Smem::kBytes);

// The ring's position: stage index and the parity of the round through it.
struct PipelineState {
  int stage = 0;
  uint32_t phase = 0;
  __device__ void advance() {
    if (++stage == Config::kStages) {
      stage = 0;
      phase ^= 1;
    }
  }
  // Past `slices` more slices at once (a ping-pong consumer skipping the other's tile).
  __device__ void advance(int slices) {
    const int to = stage + slices;
    stage = to % Config::kStages;
    phase ^= uint32_t(to / Config::kStages) & 1;
  }
};

// Tile `t` of the whole batch: its matrix and its origin within it.
struct BatchTile {
  int64_t batch;
  TileOrigin origin;
};

// What a cluster of kCluster blocks computes: kCluster tiles stacked along M.
template <class TileConfig, int kCluster>
struct ClusterTile {
  static constexpr int kBlockM = TileConfig::kBlockM * kCluster, kBlockN = TileConfig::kBlockN;
};

// Cluster tile `t` of the whole batch, the share of the block of rank `rank`.
template <class TileConfig, int kCluster>
__device__ __forceinline__ BatchTile batch_tile(int64_t t, const GemmParams& p, int group, int rank) {
  using Scheduler = TileScheduler<ClusterTile<TileConfig, kCluster>>;
  const int64_t per_matrix = Scheduler::tiles(p.m, p.n);
  const int64_t b = t / per_matrix;
  TileOrigin origin = Scheduler::origin_of(t - b * per_matrix, p.m, p.n, group);
  origin.m0 += rank * TileConfig::kBlockM;  // past M (an odd count of tile rows): A reads as zeros, nothing is stored
  return {b, origin};
}

// Copies boxes [first, first + count) of a tile of `Rows` rows (M or N, from
// mn0) by kBlockK (from k0) of the operand behind `map` into `dst`, and with
// Multicast into the same place in every block of the cluster.
template <class Tile, int Multicast>
__device__ __forceinline__ void load_boxes(uint8_t* dst, const void* map, uint64_t* full, int mn0, int k0, int batch,
                                           int first, int count) {
#pragma unroll
  for (int box = first; box < first + count; ++box) {
    const int mn = mn0 + box * Tile::kBoxRows;
    const int c0 = Tile::kKMajor ? k0 : mn, c1 = Tile::kKMajor ? mn : k0;
    if constexpr (Multicast == 1) tma_load_3d(dst + box * Tile::kBoxBytes, map, full, c0, c1, batch);
    else tma_load_3d_multicast(dst + box * Tile::kBoxBytes, map, full, c0, c1, batch, (1u << Multicast) - 1);
  }
}

// Rounds and stores the consumer's 64 x 256 accumulators (rows from row0,
// columns from col0 of matrix `batch` of D), after bias and activation.
// Registers r..r+3 (r a multiple of 4) hold columns c and c+1 of two rows 8
// apart, so each bias pair is read once. Threads whose rows and columns all
// lie inside D skip every bound check. Everything that varies per launch
// but not per element (output type, activation) is a template argument: the
// unrolled loop then holds no branch but the bounds, and stays small enough
// for the instruction cache.
template <class Out, Activation kActivation>
__device__ __forceinline__ void store_tile(const float (&acc)[128], const GemmParams& p, const WgmmaSchedule& s,
                                           int64_t batch, int64_t row0, int64_t col0, int thread) {
  Out* d = static_cast<Out*>(p.d) + batch * p.d_batch_stride;
  const int64_t rows[2] = {row0 + accumulator_row(thread, 0), row0 + accumulator_row(thread, 2)};
  // Registers r..r+3 at column `col` (columns only grow with r), each pair
  // stored whole where `pairs`, checked against the edges where `bounded`.
  auto store_columns = [&](int r, int64_t col, bool pairs, bool bounded) {
    const bool both = !bounded || col + 1 < p.n;
    float bias[2] = {0.0f, 0.0f};
    if (p.bias != nullptr) {
      bias[0] = load_as_float(p.bias, p.bias_type, col);
      if (both) bias[1] = load_as_float(p.bias, p.bias_type, col + 1);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (bounded && rows[h] >= p.m) continue;
      const float v0 = apply_activation(kActivation, acc[r + 2 * h] + bias[0]);
      const float v1 = apply_activation(kActivation, acc[r + 2 * h + 1] + bias[1]);
      Out* out = d + rows[h] * p.d_row_stride + col;
      if (both && pairs) {
        if constexpr (std::is_same_v<Out, float>) *reinterpret_cast<float2*>(out) = make_float2(v0, v1);
        else *reinterpret_cast<decltype(ElementTraits<Out>::round_pair(v0, v1))*>(out) = ElementTraits<Out>::round_pair(v0, v1);
      } else {
        out[0] = ElementTraits<Out>::from_float(v0);
        if (both) out[1] = ElementTraits<Out>::from_float(v1);
      }
    }
  };
  if (s.d_pairs && rows[1] < p.m && col0 + Config::kInstrN <= p.n) {  // inside D: no checks
#pragma unroll
    for (int r = 0; r < 128; r += 4) store_columns(r, col0 + accumulator_col(thread, r), true, false);
  } else {
#pragma unroll
    for (int r = 0; r < 128; r += 4) {
      const int64_t col = col0 + accumulator_col(thread, r);
      if (col >= p.n) break;
      store_columns(r, col, s.d_pairs, true);
    }
  }
}

// Named barriers (0 is __syncthreads'): consumer c's warpgroup meets at
// kStripBarrier + c over its output strips, and in ping-pong waits at
// kTurnBarrier + c for its turn to run a mainloop.
constexpr int kStripBarrier = 1, kTurnBarrier = kStripBarrier + Config::kConsumers;

// Where a consumer's output strips stand: the buffers in `staging`, and how
// many strips it has handed to the copy engine (strip i goes through buffer
// i % kOutputBuffers, across tiles as within one).
struct OutputStaging {
  uint8_t (*buffers)[Config::kOutputStripBytes];
  uint32_t strips = 0;
};

// Stores the consumer's 64 x 256 accumulators (rows from row0, columns from
// col0 of matrix `batch` of D) after bias and activation, through its output
// strips and the copy engine, which leaves out what lies past D. Before a
// buffer is written again, the store that last read it must be done reading
// (one issuing thread waits, then the warpgroup meets); the strip's writes
// are fenced for the async proxy and met on before its one store is issued.
template <class Out, Activation kActivation>
__device__ __forceinline__ void copy_out_tile(const float (&acc)[128], const GemmParams& p, const CUtensorMap* d_map,
                                              OutputStaging& staging, int64_t batch, int64_t row0, int64_t col0,
                                              int thread, int consumer) {
  using Strip = OutputStrip<sizeof(Out)>;
  constexpr int kRegisters = Config::kInstrN / 2 / Strip::kStrips;  // a strip's accumulators per thread
  const int barrier = kStripBarrier + consumer, rows[2] = {accumulator_row(thread, 0), accumulator_row(thread, 2)};
#pragma unroll
  for (int strip = 0; strip < Strip::kStrips; ++strip) {
    const int64_t strip_col0 = col0 + strip * Strip::kCols;
    if (strip_col0 >= p.n) break;  // the same for the whole warpgroup: the rest lies past D
    uint8_t* buffer = staging.buffers[staging.strips % Config::kOutputBuffers];
    const uint32_t buffer_address = smem_address(buffer);
    if (thread == 0) bulk_wait_group_read<Config::kOutputBuffers - 1>();
    named_barrier_sync(barrier, Config::kWarpgroupThreads);
#pragma unroll
    for (int r = strip * kRegisters; r < (strip + 1) * kRegisters; r += 4) {
      const int col = accumulator_col(thread, r);
      float bias[2] = {0.0f, 0.0f};
      if (p.bias != nullptr) {
        if (col0 + col < p.n) bias[0] = load_as_float(p.bias, p.bias_type, col0 + col);
        if (col0 + col + 1 < p.n) bias[1] = load_as_float(p.bias, p.bias_type, col0 + col + 1);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float v0 = apply_activation(kActivation, acc[r + 2 * h] + bias[0]);
        const float v1 = apply_activation(kActivation, acc[r + 2 * h + 1] + bias[1]);
        const uint32_t at = buffer_address + Strip::offset(rows[h], col - strip * Strip::kCols);
        if constexpr (std::is_same_v<Out, float>) {
          st_shared(at, make_float2(v0, v1));
        } else {
          const auto pair = ElementTraits<Out>::round_pair(v0, v1);
          st_shared(at, *reinterpret_cast<const uint32_t*>(&pair));
        }
      }
    }
    fence_proxy_async_shared();
    named_barrier_sync(barrier, Config::kWarpgroupThreads);
    if (thread == 0) {
      tma_store_3d(d_map, buffer, int(strip_col0), int(row0), int(batch));
      bulk_commit_group();
    }
    ++staging.strips;
  }
}

// The epilogue for the launch's output type and activation, through the copy
// engine where D has a tensor map. D is fp32 or the inputs' type, as the ops
// make it (gemm_shape admits no other): each output type puts six epilogues
// in every kernel (three activations, two ways to store), and a third type
// nearly doubled the kernels' compile time. A consumer whose rows all lie
// past M (the second block of a pair at the last tile row) stores nothing.
template <class Element>
__device__ __forceinline__ void store_accumulators(const float (&acc)[128], const GemmParams& p,
                                                   const WgmmaSchedule& s, const CUtensorMap* d_map,
                                                   OutputStaging& staging, int64_t batch, int64_t row0, int64_t col0,
                                                   int thread, int consumer) {
  if (row0 >= p.m) return;
  const auto store_as = [&](auto out) {
    using Out = typename decltype(out)::type;
    const auto store = [&](auto activation) {
      constexpr Activation kActivation = decltype(activation)::value;
      if (s.d_copy) copy_out_tile<Out, kActivation>(acc, p, d_map, staging, batch, row0, col0, thread, consumer);
      else store_tile<Out, kActivation>(acc, p, s, batch, row0, col0, thread);
    };
    switch (p.activation) {
      case Activation::kRelu: return store(std::integral_constant<Activation, Activation::kRelu>{});
      case Activation::kGelu: return store(std::integral_constant<Activation, Activation::kGelu>{});
      default: return store(std::integral_constant<Activation, Activation::kNone>{});
    }
  };
  if (p.d_type == ElementType::kFloat32) store_as(ElementTag<float>{});
  else store_as(ElementTag<Element>{});
}

// kCluster and kSplit before the layouts: the kernel's mangled name must not
// end as a WMMA kernel's chunk width does (tests/test_kernel_compile.py reads those).
template <class Element, int kCluster, Consumers kSplit, bool AKMajor, bool BKMajor>
__global__ void __launch_bounds__(Config::kThreads, 1)
    wgmma_gemm_kernel(const __grid_constant__ CUtensorMap a_map, const __grid_constant__ CUtensorMap b_map,
                      const __grid_constant__ CUtensorMap d_map, const GemmParams p, const WgmmaSchedule schedule) {
#if MPGEMM_SM90A
  static_assert(kCluster == 1 || kCluster == 2, "blocks alone or in pairs");
  using TileConfig = WgmmaTileConfig<kSplit>;
  using Smem = WgmmaSmem<TileConfig, AKMajor, BKMajor>;
  static_assert(kFitsFromAnyStart<Smem>, "the launch's shared memory must hold the ring from any 16-byte start");
  using ATile = typename Smem::ATile;
  using BTile = typename Smem::BTile;
  // Swizzled tiles start at 1024-byte boundaries; dynamic shared memory is only 16-byte aligned.
  const uintptr_t start = reinterpret_cast<uintptr_t>(block_shared_memory());
  Smem& shared = *reinterpret_cast<Smem*>((start + kSwizzleAtomBytes - 1) & ~uintptr_t(kSwizzleAtomBytes - 1));
  static_assert(BTile::kBoxes % kCluster == 0, "the blocks of a cluster copy B in whole boxes");

  const int warpgroup = threadIdx.x / Config::kWarpgroupThreads;
  const int thread = threadIdx.x % Config::kWarpgroupThreads;
  const int rank = kCluster == 1 ? 0 : int(cluster_rank());
  if (threadIdx.x == 0) {
    for (int s = 0; s < Config::kStages; ++s) {
      mbarrier_init(&shared.full[s], 1);
      mbarrier_init(&shared.empty[s], TileConfig::kStageReaders * kCluster);
    }
    fence_barrier_init();
  }
  // The other block's copies and arrivals may reach this one's barriers only once they exist.
  if constexpr (kCluster == 1) __syncthreads();
  else cluster_sync();

  const int64_t tiles = p.batch * TileScheduler<ClusterTile<TileConfig, kCluster>>::tiles(p.m, p.n);
  const int64_t first_tile = blockIdx.x / kCluster, tile_step = gridDim.x / kCluster;
  const int k_slices = static_cast<int>((p.k + Config::kBlockK - 1) / Config::kBlockK);
  PipelineState pipe;

  if (warpgroup == 0) {
    setmaxnreg_dec<Config::kProducerRegisters>();
    if (thread != 0) return;
    constexpr int kBBoxes = BTile::kBoxes / kCluster;  // of B's boxes, those this block copies
    for (int64_t t = first_tile; t < tiles; t += tile_step) {
      const BatchTile tile = batch_tile<TileConfig, kCluster>(t, p, schedule.raster_group, rank);
      const int a_batch = schedule.a_broadcast ? 0 : int(tile.batch);
      const int b_batch = schedule.b_broadcast ? 0 : int(tile.batch);
      for (int slice = 0; slice < k_slices; ++slice, pipe.advance()) {
        mbarrier_wait(&shared.empty[pipe.stage], pipe.phase ^ 1);
        mbarrier_arrive_expect_tx(&shared.full[pipe.stage], ATile::kBytes + BTile::kBytes);
        const int k0 = slice * Config::kBlockK;
        load_boxes<ATile, 1>(shared.a[pipe.stage], &a_map, &shared.full[pipe.stage], int(tile.origin.m0), k0,
                             a_batch, 0, ATile::kBoxes);
        load_boxes<BTile, kCluster>(shared.b[pipe.stage], &b_map, &shared.full[pipe.stage], int(tile.origin.n0), k0,
                                    b_batch, rank * kBBoxes, kBBoxes);
      }
    }
    // The other block's consumers arrive on this block's empty barriers: wait
    // for each stage's last hand-back, so that none comes after this block exits.
    if constexpr (kCluster > 1) {
      for (int s = 0; s < Config::kStages; ++s, pipe.advance())
        mbarrier_wait(&shared.empty[pipe.stage], pipe.phase ^ 1);
    }
    return;
  }

  setmaxnreg_inc<Config::kConsumerRegisters>();
  const int consumer = warpgroup - 1;
  // Hands a stage back to every producer whose copies land in it.
  auto release = [&](int stage) {
    if constexpr (kCluster == 1) {
      if (thread == 0) mbarrier_arrive(&shared.empty[stage]);
    } else if (thread < kCluster) {
      mbarrier_arrive_cluster(&shared.empty[stage], thread);
    }
  };
  // Cooperative: every tile of the block, this consumer's 64 rows of it.
  // Ping-pong: every other tile whole, from the block's tile `consumer` on;
  // the ring holds the tiles' slices in the block's order, so this consumer
  // starts `consumer` tiles' slices in and skips the other's after each of
  // its own. The mainloops take turns: a tile's begins once the block's
  // tile before it has waited on its last slice, so that no consumer waits
  // on a stage two rounds ahead of the last wait on it, which the barrier's
  // parity could not tell from one round behind. Each turn is handed on only
  // where a next tile exists, so that no arrival outlives the block.
  const int64_t consumer_first = first_tile + (TileConfig::kPingPong ? consumer * tile_step : 0);
  const int64_t consumer_step = TileConfig::kPingPong ? Config::kConsumers * tile_step : tile_step;
  const int row_block = TileConfig::kPingPong ? 0 : consumer;  // of the A tile, in 64-row instruction blocks
  static_assert(!TileConfig::kPingPong || Config::kConsumers == 2, "ping-pong hands each turn to the other consumer");
  constexpr int kTurnThreads = Config::kConsumers * Config::kWarpgroupThreads;
  const int next_consumer = (consumer + 1) % Config::kConsumers;
  if constexpr (TileConfig::kPingPong) pipe.advance(consumer * k_slices);
  float acc[128];
  OutputStaging staging{shared.out[consumer]};
  for (int64_t t = consumer_first; t < tiles; t += consumer_step) {
    const BatchTile tile = batch_tile<TileConfig, kCluster>(t, p, schedule.raster_group, rank);
    if constexpr (TileConfig::kPingPong)
      if (t != first_tile) named_barrier_sync(kTurnBarrier + consumer, kTurnThreads);
    PipelineState reading = pipe;  // the stage whose wgmmas may still be in flight
    for (int slice = 0; slice < k_slices; ++slice, pipe.advance()) {
      mbarrier_wait(&shared.full[pipe.stage], pipe.phase);
      const uint32_t a_tile = smem_address(shared.a[pipe.stage]), b_tile = smem_address(shared.b[pipe.stage]);
      wgmma_fence();
#pragma unroll
      for (int k16 = 0; k16 < Config::kBlockK / Config::kInstrK; ++k16)
        wgmma_m64n256k16<Element, AKMajor ? 0 : 1, BKMajor ? 0 : 1>(acc, ATile::descriptor(a_tile, k16, row_block),
                                                                  BTile::descriptor(b_tile, k16),
                                                                  slice > 0 || k16 > 0);
      wgmma_commit();
      // The previous slice's wgmmas are done once at most this one's are
      // pending: hand its stage back to the producer.
      wgmma_wait<1>();
      if (slice > 0) {
        release(reading.stage);
        reading.advance();
      }
    }
    if constexpr (TileConfig::kPingPong)
      if (t + tile_step < tiles) named_barrier_arrive(kTurnBarrier + next_consumer, kTurnThreads);
    wgmma_wait<0>();
    release(reading.stage);
    if constexpr (TileConfig::kPingPong) pipe.advance(k_slices);
    const int64_t row0 = tile.origin.m0 + row_block * Config::kInstrM;
    store_accumulators<Element>(acc, p, schedule, &d_map, staging, tile.batch, row0, tile.origin.n0, thread,
                                consumer);
  }
  // The shared memory the last stores read goes with the block.
  if (thread == 0) bulk_wait_group<0>();
#endif
}

}  // namespace sm90
}  // namespace mpgemm::kernels
