// The ring of shared-memory stages that a Hopper block's producer fills and
// its consumers read (sm90/producer.cuh, sm90/mainloop.cuh): the block's
// shared storage, and a position in the ring.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/tile_configs.h"
#include "sm90/layout.h"

namespace mpgemm::kernels::sm90 {

using Config = WgmmaBlockConfig;

// A block's shared memory: Tile::kStages stages of A's and B's tiles, each
// with a `full` mbarrier (the copy engine has written it) and an `empty` one
// (every consumer that reads it is done), and each consumer's output strips.
template <class Tile, bool AKMajor, bool BKMajor>
struct WgmmaSmem {
  using ATile = SwizzledOperandTile<Tile::kBlockM, AKMajor>;
  using BTile = SwizzledOperandTile<Tile::kBlockN, BKMajor>;
  static constexpr int kStages = Tile::kStages;
  alignas(kSwizzleAtomBytes) uint8_t a[kStages][ATile::kBytes];
  alignas(kSwizzleAtomBytes) uint8_t b[kStages][BTile::kBytes];
  alignas(kSwizzleAtomBytes) uint8_t out[Config::kConsumers][Config::kOutputBuffers][Config::kOutputStripBytes];
  uint64_t full[kStages];
  uint64_t empty[kStages];
  static constexpr int kBytes = Tile::kSmemBytes;
};

// The kernel rounds the dynamic shared memory's start (16-byte aligned) up to
// a swizzle pattern: the launch's bytes hold the ring from any such start.
template <class Smem>
constexpr bool kFitsFromAnyStart =
    offsetof(Smem, empty) + sizeof(Smem::empty) + (kSwizzleAtomBytes - 16) <= size_t(Smem::kBytes);

// The tile of ones that the kernels summing A's rows multiply them by
// (sm90/mainloop.cuh's RowSums): 8 K-major rows, one swizzle atom, past the
// rest of Smem; and the launch's shared memory with it, which must hold both
// from any 16-byte start.
using OnesTile = SwizzledOperandTile<8, true>;
template <class Smem>
constexpr uint32_t kOnesOffset = (sizeof(Smem) + kSwizzleAtomBytes - 1) / kSwizzleAtomBytes * kSwizzleAtomBytes;
template <class Smem>
constexpr int kSmemBytesWithOnes = int(kOnesOffset<Smem>) + OnesTile::kBytes + (kSwizzleAtomBytes - 16);

// A stage's `full` barrier counts one arrival, the producer thread's that
// announces the copies' bytes; where the producer's warpgroup gathers part
// of the stage itself (sm90/conv_gather_producer.cuh), that and one
// more from each of its threads once its stores are fenced.
constexpr int kGatheredStageArrivals = 1 + Config::kWarpgroupThreads;

// The position in a ring of Stages stages: stage index and the parity of
// the round through it.
template <int Stages>
struct PipelineState {
  static constexpr int kStages = Stages;
  int stage = 0;
  uint32_t phase = 0;
  __device__ void advance() {
    if (++stage == Stages) {
      stage = 0;
      phase ^= 1;
    }
  }
  // Past `slices` more slices at once (a ping-pong consumer skipping the other's tile).
  __device__ void advance(int slices) {
    const int to = stage + slices;
    stage = to % Stages;
    phase ^= uint32_t(to / Stages) & 1;
  }
};

// The ring of Tile's blocks.
template <class Tile>
using TilePipeline = PipelineState<Tile::kStages>;

}  // namespace mpgemm::kernels::sm90
