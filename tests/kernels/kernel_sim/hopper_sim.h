// The sm_90a instructions of csrc/kernels/arch for the host-side kernel
// simulation (its arch/ wrappers call these): mbarriers, the tensor copy engine's box loads and
// stores, bulk async-groups, named barriers and warpgroup MMA, placing and
// reading shared memory as hopper_models.h (the PTX ISA's text) says, and the
// clusters they run in (mock/cuda_runtime.h runs a cluster's blocks
// together): multicast copies, arrivals on another block's mbarriers,
// barrier.cluster. Two timings widen what a run can catch:
//  - copies_late: a box copy lands only when a thread waits on the mbarrier
//    it completes (otherwise at issue; a multicast copy in each block when
//    that block waits), so reading a stage before its barrier completes finds
//    what was there before; and a box store reads shared memory only when its
//    thread waits for its bulk async-group (otherwise at commit), so a source
//    written again before that wait is stored as rewritten;
//  - wgmma_late: a wgmma reads its operands only when wait_group retires it
//    (otherwise at commit), so a stage handed back before then is
//    overwritten under it.
// Whatever the timing, the contracts are checked as they are used: no copy
// lands on shared memory that a wgmma not yet retired reads; no wgmma is
// issued on shared memory that no copy has written since the block began
// (nor a thread, followed by its fence.proxy.async), that a copy has yet to
// write, or that a thread wrote without that fence since; a warpgroup
// fences before its first wgmma
// after touching the accumulators, and its 128 threads issue the same
// wgmmas; an arrival never finds its phase already complete and waiting on
// transaction bytes; a box store reads no shared memory that a thread wrote
// without fence.proxy.async since; every copy, store and wgmma group is
// waited for before the block exits (a store's by the thread that issued
// it), and no arrival or copy reaches a block of the cluster after it has
// exited; and a thread that waits (on an mbarrier, or for its warpgroup)
// while no thread of the launch can move (mock/fibers.h) aborts the run,
// saying what it waits for.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <set>
#include <tuple>
#include <type_traits>
#include <vector>

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernel_sim/hopper_models.h"

namespace sim::hopper {

namespace model = sim::hopper_model;

inline bool copies_late = false;
inline bool wgmma_late = false;
inline constexpr int kWarpgroupThreads = 128;

struct Barrier {
  int count = 0, pending = 0;  // arrivals the phase needs, and still awaits
  int64_t tx = 0;              // transaction bytes announced and not yet landed
  uint32_t phase = 0;          // parity of the phase in progress
};

// One box copy into one block: its tensor map (copied at issue, as the
// kernel's parameter may not outlive it), the destination block's rank in
// the cluster, destination, box origin (an im2col copy's first pixel) and
// mbarrier (in that block).
struct Copy {
  TensorMap map;
  unsigned rank;
  uint32_t dst;
  int64_t origin[4];
  uint32_t barrier;
  int offsets[2] = {};  // an im2col copy's (W, H)
};

// One wgmma of a warpgroup: what every thread of it must issue alike, and
// each thread's accumulators.
struct Wgmma {
  uint64_t desc_a = 0, desc_b = 0;
  bool a_mn_major = false, b_mn_major = false, bf16 = false;
  int n = 0;
  float* acc[kWarpgroupThreads] = {};
  bool scale_d = false;  // accumulate into D (the same for every thread)
  int issued = 0;  // threads that have issued it
  bool executed = false;
  std::vector<uint32_t> chunks;  // the 16-byte chunks of shared memory it reads
};

// One box store: its tensor map, source in the issuing block's shared memory
// and box origin.
struct Store {
  TensorMap map;
  uint32_t src;
  int64_t origin[3];
};

// A named barrier (bar.sync): the threads it waits for, those arrived, and
// how many times it has opened.
struct NamedBarrier {
  int count = 0, arrived = 0;
  uint64_t generation = 0;
  // The threads' clocks (below) joined over this opening's arrivals, and
  // over the last opening's, which each thread that waited takes on waking.
  std::vector<uint32_t> joined, released;
};

// Who last wrote a 4-byte word of shared memory with an ordinary store
// (st.shared), and who has read it since (ld.shared), each at its own clock.
struct WordAccess {
  int writer = -1;
  uint32_t written_at = 0;
  std::vector<std::pair<int, uint32_t>> readers;
};

// A warpgroup's wgmmas, and where its threads stand in the collective steps
// (commit_group, wait_group) that all 128 must meet in.
struct Warpgroup {
  std::vector<Wgmma> open;                   // issued since the last commit
  std::deque<std::vector<Wgmma>> committed;  // groups not yet retired, oldest first
  int step = 0;                              // the step being met: -1 commit, N >= 0 wait_group N
  int arrived = 0;
  uint64_t generation = 0;  // steps completed
};

// The running cluster's blocks' state needs no lock: the launch's threads
// are fibers of one host thread (mock/fibers.h), each switching only where
// it waits.
inline std::mt19937_64 rng{1};

// The state of one running block of the cluster.
struct Block {
  bool exited = false;  // every thread has left the kernel (while others of the cluster run on)
  int finished = 0;     // its threads that have left the kernel
  std::map<uint32_t, Barrier> barriers;
  std::vector<Copy> in_flight;          // copies not yet landed (copies_late)
  // Per 16-byte chunk of shared memory: wgmmas not yet retired that read it,
  // copies yet to land on it, and copies landed on it (or stores fenced for
  // the async proxy) since the block began.
  std::vector<int> reads, writes, written;
  std::vector<int> unfenced;  // per 16-byte chunk: threads that wrote it and have not fenced since
  Warpgroup warpgroups[1024 / kWarpgroupThreads];
  std::map<int, NamedBarrier> named;
  // Ordinary shared-memory accesses between the block's threads: per thread,
  // a vector clock (entry u: how many of thread u's arrivals at named
  // barriers this thread has met since, its own entry its own arrivals); per
  // 4-byte word, its accesses (ordinary_access).
  std::vector<std::vector<uint32_t>> clocks;
  std::vector<WordAccess> words;
};
inline Block blocks[sim::kMaxCluster];
// The calling thread's block, and block `rank` of its cluster.
inline Block& own() { return blocks[sim::cluster_rank]; }
inline Block& block_of_rank(unsigned rank) {
  SIM_CHECK(rank < sim::cluster_size, "block %u of a cluster of %u", rank, sim::cluster_size);
  SIM_CHECK(!blocks[rank].exited, "block %u of the cluster is reached after it exited", rank);
  return blocks[rank];
}
// The calling CUDA thread's own (swapped by the fibers: mock/fibers.h).
inline int issued_since_commit = 0;
// This thread's box stores: committed bulk async-groups not yet waited for
// (copies_late), oldest first, and the open one.
inline std::deque<std::vector<Store>> store_groups;
inline std::vector<Store> open_stores;
inline std::vector<uint32_t> unfenced_writes;  // chunks this thread wrote since its last fence
inline bool fenced = false;  // since this thread last waited on its wgmmas
inline const bool thread_variables_registered =
    sim::fiber::Locals::add(issued_since_commit) && sim::fiber::Locals::add(store_groups) &&
    sim::fiber::Locals::add(open_stores) && sim::fiber::Locals::add(unfenced_writes) && sim::fiber::Locals::add(fenced);

inline std::vector<int>& chunk_counts(std::vector<int>& counts) {
  if (counts.size() < sim::shared_capacity / 16) counts.assign(sim::shared_capacity / 16, 0);
  return counts;
}


inline Barrier& barrier_at(Block& b, uint32_t address) {
  const auto it = b.barriers.find(address);
  SIM_CHECK(it != b.barriers.end(), "the mbarrier at %u is used before mbarrier.init", address);
  return it->second;
}

// Waits until `done()`, letting the others run meanwhile, aborting with
// `what` if no thread of the launch can move.
template <class Done, class... Args>
void wait_until(Done&& done, const char* what, Args... args) {
  sim::fiber::wait_until(done, [&] {
    fprintf(stderr, "deadlock: thread %u of block %u waits ", threadIdx.x, blockIdx.x);
    fprintf(stderr, what, args...);
    fprintf(stderr, ", and no thread of the launch can move\n");
  });
}

// Transaction counts stay within the mbarrier's range (PTX ISA 9.7.13.15).
inline void check_tx(const Barrier& b, uint32_t address) {
  SIM_CHECK(b.tx > -(1 << 20) && b.tx < (1 << 20), "the mbarrier at %u counts %ld transaction bytes", address,
            long(b.tx));
}

// A phase completes once all its arrivals and transaction bytes are in; the
// next one then expects `count` arrivals again (PTX ISA 9.7.13.15).
inline void complete_if_done(Barrier& b) {
  if (b.pending == 0 && b.tx == 0) {
    b.phase ^= 1;
    b.pending = b.count;
  }
  sim::fiber::moved();
}

inline void mbarrier_init(uint64_t* bar, int count) {
  const uint32_t address = sim::shared_address(bar);
  SIM_CHECK(address % 8 == 0 && count >= 1 && count < (1 << 20), "mbarrier.init at %u, count %d", address, count);
  own().barriers[address] = Barrier{count, count, 0, 0};
  sim::fiber::moved();
}

// An arrival on the mbarrier at `address` of block `rank` of the cluster.
inline void arrive(unsigned rank, uint32_t address, uint32_t expect_tx_bytes) {
  Barrier& b = barrier_at(block_of_rank(rank), address);
  SIM_CHECK(b.pending > 0, "an arrival on the mbarrier at %u, whose phase has all its %d arrivals and awaits only "
            "transaction bytes", address, b.count);
  b.tx += expect_tx_bytes;
  check_tx(b, address);
  --b.pending;
  complete_if_done(b);
}

inline void mbarrier_arrive(uint64_t* bar, uint32_t expect_tx_bytes = 0) {
  arrive(sim::cluster_rank, sim::shared_address(bar), expect_tx_bytes);
}

inline void mbarrier_arrive_cluster(uint64_t* bar, uint32_t rank) { arrive(rank, sim::shared_address(bar), 0); }

// Calls f(i0, i1, i2, shared address) for each element of the box of `t`
// that a copy writes to, or a store reads from, shared memory at `smem`.
template <class F>
void for_each_box_element(const TensorMap& t, uint32_t smem, F&& f) {
  const bool swizzle = t.swizzle == CU_TENSOR_MAP_SWIZZLE_128B;
  // A swizzled box is modelled where its rows are whole 128-byte swizzle rows.
  SIM_CHECK(t.swizzle == CU_TENSOR_MAP_SWIZZLE_NONE || (swizzle && t.box[0] * t.element_bytes == 128),
            "swizzle mode %d with a %u-byte inner box is not modelled", int(t.swizzle), t.box[0] * t.element_bytes);
  for (uint32_t i2 = 0; i2 < t.box[2]; ++i2)
    for (uint32_t i1 = 0; i1 < t.box[1]; ++i1)
      for (uint32_t i0 = 0; i0 < t.box[0]; ++i0) {
        const uint32_t address = model::tma_box_address(smem, t.box, t.element_bytes, i0, i1, i2, swizzle);
        SIM_CHECK(address + t.element_bytes <= sim::shared_size, "a box reaches past the block's shared memory");
        f(i0, i1, i2, address);
      }
}

// The byte offset from the tensor's base of element `at` of `t`; false
// where it lies outside the tensor.
inline bool global_offset(const TensorMap& t, const int64_t (&at)[4], int64_t& offset) {
  offset = 0;
  for (int d = 0; d < 4; ++d) {
    if (at[d] < 0 || at[d] >= int64_t(t.dims[d])) return false;
    offset += at[d] * int64_t(t.strides[d]);
  }
  return true;
}

// Writes a copy's box into its block's shared memory.
inline void land(const Copy& c) {
  const TensorMap& t = c.map;
  Block& to = block_of_rank(c.rank);
  std::vector<int>& reads = chunk_counts(to.reads);
  std::vector<int>& writes = chunk_counts(to.writes);
  std::vector<int>& written = chunk_counts(to.written);
  // An im2col box's pixels, each as the tensor coordinates of its channel 0 (hopper_models.h).
  std::vector<model::Im2colElement> pixels;
  if (t.im2col) {
    const model::Im2colBox box{{int64_t(t.dims[0]), int64_t(t.dims[1]), int64_t(t.dims[2]), int64_t(t.dims[3])},
                               {t.lower[0], t.lower[1]}, {t.upper[0], t.upper[1]},
                               {t.traversal[1], t.traversal[2]}};
    for (uint32_t pixel = 0; pixel < t.box[1]; ++pixel)
      pixels.push_back(model::im2col_element(box, c.origin, c.offsets[0], c.offsets[1], pixel, 0));
  }
  for_each_box_element(t, c.dst, [&](uint32_t i0, uint32_t i1, uint32_t i2, uint32_t address) {
    int64_t at[4] = {c.origin[0] + i0, c.origin[1] + i1, c.origin[2] + i2, 0};
    if (t.im2col) {
      for (int d = 0; d < 4; ++d) at[d] = pixels[i1].at[d];
      at[0] += i0;
    }
    int64_t offset;
    const bool inside = global_offset(t, at, offset);
    SIM_CHECK(reads[address / 16] == 0, "a box copy lands on shared memory (byte %u) that a wgmma not yet "
              "retired by wait_group reads", address);
    unsigned char* dst = sim::cluster_shared[c.rank] + address;
    if (inside) memcpy(dst, t.base + offset, t.element_bytes);  // AddressSanitizer checks the read
    else memset(dst, 0, t.element_bytes);
    --writes[address / 16];
    written[address / 16] = 1;
  });
  Barrier& b = barrier_at(to, c.barrier);
  b.tx -= int64_t(t.box[0]) * t.box[1] * t.box[2] * t.element_bytes;  // the whole box counts, zeros too
  check_tx(b, c.barrier);
  complete_if_done(b);
}

// Lands the copies in flight to the calling thread's block that complete its
// mbarrier at `address`, in a random order; whether there were any.
inline bool land_copies_for(uint32_t address) {
  std::vector<Copy> now, later;
  for (const Copy& c : own().in_flight) (c.barrier == address ? now : later).push_back(c);
  if (now.empty()) return false;
  own().in_flight = std::move(later);
  std::shuffle(now.begin(), now.end(), rng);
  for (const Copy& c : now) land(c);
  return true;
}

inline void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  const uint32_t address = sim::shared_address(bar);
  // The phase of parity `parity` has completed once the phase in progress has the other one.
  const auto done = [&] {
    while (barrier_at(own(), address).phase == (parity & 1))
      if (!copies_late || !land_copies_for(address)) return false;
    return true;
  };
  wait_until(done, "for the phase of parity %u of the mbarrier at %u", parity & 1, address);
}

// A box copy into the calling thread's block, or with `ranks` (a cluster's
// multicast mask) into the same place of each block whose bit is set; an
// im2col copy (an im2col map, c3 and `offsets` given) into this block alone.
inline void tma_load(void* dst, const void* map, uint64_t* bar, int c0, int c1, int c2, uint16_t ranks = 0,
                     int c3 = 0, const int (&offsets)[2] = {0, 0}, bool im2col = false) {
  const TensorMap& t = sim::tensor_map(map);
  SIM_CHECK(t.im2col == im2col, "a %s copy through a%s map", im2col ? "im2col" : "tiled",
            t.im2col ? "n im2col" : " tiled");
  // A 4-D tensor's two im2col offsets share the instruction's 16 bits (PTX ISA, "Im2col mode").
  SIM_CHECK(offsets[0] >= 0 && offsets[0] < 256 && offsets[1] >= 0 && offsets[1] < 256,
            "im2col offsets (%d, %d) past 8 bits each", offsets[0], offsets[1]);
  const uint32_t to = sim::shared_address(dst), barrier = sim::shared_address(bar);
  // A swizzled box's pattern starts over every 1024 bytes (hopper_models.h):
  // the destination must start one, as it does for the descriptors' base offset 0.
  SIM_CHECK(to % (t.swizzle == CU_TENSOR_MAP_SWIZZLE_128B ? 1024 : 128) == 0, "box copy to byte %u", to);
  SIM_CHECK(ranks < (1u << sim::cluster_size), "multicast mask %#x in a cluster of %u", ranks, sim::cluster_size);
  for (unsigned rank = 0; rank < sim::cluster_size; ++rank) {
    if (ranks == 0 ? rank != sim::cluster_rank : !(ranks >> rank & 1)) continue;
    const Copy c{t, rank, to, {c0, c1, c2, c3}, barrier, {offsets[0], offsets[1]}};
    Block& into = block_of_rank(rank);
    barrier_at(into, c.barrier);
    std::vector<int>& writes = chunk_counts(into.writes);
    for_each_box_element(t, c.dst, [&](uint32_t, uint32_t, uint32_t, uint32_t address) { ++writes[address / 16]; });
    if (copies_late) {
      into.in_flight.push_back(c);  // which a wait on its mbarrier lands
      sim::fiber::moved();
    } else {
      land(c);
    }
  }
}

// Writes a store's box from the calling thread's block to global memory,
// leaving out the elements outside the tensor.
inline void perform(const Store& st) {
  const TensorMap& t = st.map;
  for_each_box_element(t, st.src, [&](uint32_t i0, uint32_t i1, uint32_t i2, uint32_t address) {
    const int64_t at[4] = {st.origin[0] + i0, st.origin[1] + i1, st.origin[2] + i2, 0};
    int64_t offset;
    if (!global_offset(t, at, offset)) return;
    memcpy(const_cast<unsigned char*>(t.base) + offset, sim::shared_memory + address, t.element_bytes);
  });
}

// The calling thread's vector clock in its block.
inline std::vector<uint32_t>& own_clock() {
  Block& b = own();
  if (b.clocks.size() != blockDim.x) b.clocks.assign(blockDim.x, std::vector<uint32_t>(blockDim.x, 0));
  return b.clocks[threadIdx.x];
}

// An ordinary access (st.shared or ld.shared) of `bytes` at shared address
// `address` by the calling thread, checked against the other threads': a
// word another thread wrote may be read or
// written again, and a word another thread read may be written, only after
// a named barrier that the other thread arrived at after its access and
// this thread waited on (or one met later through a chain of such). The
// warpgroups' strips (sm90/epilogue.cuh) rely on nothing else.
inline void ordinary_access(uint32_t address, uint32_t bytes, bool write) {
  Block& b = own();
  if (b.words.size() < sim::shared_capacity / 4) b.words.assign(sim::shared_capacity / 4, WordAccess{});
  const std::vector<uint32_t>& clock = own_clock();
  const int self = int(threadIdx.x);
  const auto seen = [&](int other, uint32_t at) { return other == self || clock[other] > at; };
  for (uint32_t word = address / 4; word < (address + bytes + 3) / 4; ++word) {
    WordAccess& w = b.words[word];
    SIM_CHECK(w.writer < 0 || seen(w.writer, w.written_at),
              "thread %d %s shared memory (byte %u) that thread %d wrote, with no barrier between", self,
              write ? "writes" : "reads", word * 4, w.writer);
    if (write) {
      for (const auto& [reader, at] : w.readers)
        SIM_CHECK(seen(reader, at), "thread %d writes shared memory (byte %u) that thread %d read, with no barrier "
                  "between", self, word * 4, reader);
      w.writer = self, w.written_at = clock[self], w.readers.clear();
    } else {
      const auto it = std::find_if(w.readers.begin(), w.readers.end(), [&](const auto& r) { return r.first == self; });
      if (it == w.readers.end()) w.readers.emplace_back(self, clock[self]);
      else it->second = clock[self];
    }
  }
}

// An ordinary store of `bytes` at shared address `address` of the calling thread's block.
inline void st_shared(uint32_t address, const void* value, uint32_t bytes) {
  SIM_CHECK(address % bytes == 0 && address + bytes <= sim::shared_size, "st.shared of %u bytes at %u", bytes,
            address);
  ordinary_access(address, bytes, true);
  memcpy(sim::shared_memory + address, value, bytes);
  const uint32_t chunk = address / 16;
  if (std::find(unfenced_writes.begin(), unfenced_writes.end(), chunk) != unfenced_writes.end()) return;
  ++chunk_counts(own().unfenced)[chunk];
  unfenced_writes.push_back(chunk);
}

inline uint64_t shared_loads = 0;  // ld.shared since the run began

// An ordinary load of `bytes` at shared address `address` of the calling thread's block.
inline void ld_shared(uint32_t address, void* value, uint32_t bytes) {
  SIM_CHECK(address % bytes == 0 && address + bytes <= sim::shared_size, "ld.shared of %u bytes at %u", bytes,
            address);
  ++shared_loads;
  ordinary_access(address, bytes, false);
  memcpy(value, sim::shared_memory + address, bytes);
}

// fence.proxy.async.shared::cta: the async proxy (box stores, wgmma) may
// read what this thread wrote.
inline void fence_proxy_async_shared() {
  std::vector<int>& unfenced = chunk_counts(own().unfenced);
  std::vector<int>& written = chunk_counts(own().written);
  for (uint32_t chunk : unfenced_writes) --unfenced[chunk], written[chunk] = 1;
  unfenced_writes.clear();
}

inline uint64_t stores_issued = 0;  // box stores since the run began
// Waits on another block's flag since the run began (arch/grid_flags.cuh: stream-K's fix-ups).
inline uint64_t grid_flag_waits = 0;

inline void tma_store(const void* map, const void* src, int c0, int c1, int c2) {
  ++stores_issued;
  const TensorMap& t = sim::tensor_map(map);
  const uint32_t from = sim::shared_address(src);
  SIM_CHECK(from % (t.swizzle == CU_TENSOR_MAP_SWIZZLE_128B ? 1024 : 128) == 0, "box store from byte %u", from);
  std::vector<int>& unfenced = chunk_counts(own().unfenced);
  for_each_box_element(t, from, [&](uint32_t, uint32_t, uint32_t, uint32_t address) {
    SIM_CHECK(unfenced[address / 16] == 0, "a box store reads shared memory (byte %u) that a thread wrote "
              "without fence.proxy.async since", address);
  });
  open_stores.push_back(Store{t, from, {c0, c1, c2}});
}

inline void bulk_commit_group() {
  store_groups.push_back(std::move(open_stores));
  open_stores.clear();
  if (!copies_late) {
    for (const Store& st : store_groups.back()) perform(st);
    store_groups.pop_back();
  }
}

// wait_group N, with or without .read: the oldest groups are done (read
// and written) until at most N remain. Late, their reads wait until every
// other thread waits, so that a thread of the warpgroup that writes a
// strip's buffer without waiting for this wait (through a barrier after it)
// has done so before the store reads it.
inline void bulk_wait_group(int n) {
  if (copies_late && store_groups.size() > size_t(n)) sim::fiber::let_others_run();
  while (store_groups.size() > size_t(n)) {
    for (const Store& st : store_groups.front()) perform(st);
    store_groups.pop_front();
  }
}

// bar.sync (wait) or bar.arrive (not) at barrier `id` of `count` threads.
inline void named_barrier(int id, int count, bool wait) {
  SIM_CHECK(id >= 1 && id < 16 && count > 0 && count % 32 == 0 && count <= int(blockDim.x),
            "bar.%s %d, %d in a block of %u threads", wait ? "sync" : "arrive", id, count, blockDim.x);
  NamedBarrier& b = own().named[id];
  if (b.arrived == 0) b.count = count;
  SIM_CHECK(b.count == count, "threads meet at barrier %d counting %d and %d threads", id, b.count, count);
  const uint64_t generation = b.generation;
  // The arrival ticks this thread's clock and joins it to the opening's.
  std::vector<uint32_t>& clock = own_clock();
  ++clock[threadIdx.x];
  if (b.joined.size() != clock.size()) b.joined.assign(clock.size(), 0);
  for (size_t u = 0; u < clock.size(); ++u) b.joined[u] = std::max(b.joined[u], clock[u]);
  const auto take_joined = [&] {
    for (size_t u = 0; u < clock.size(); ++u) clock[u] = std::max(clock[u], b.released[u]);
  };
  if (++b.arrived == count) {
    b.arrived = 0;
    ++b.generation;
    b.released = std::move(b.joined);
    b.joined.clear();
    if (wait) take_joined();
    sim::fiber::moved();
    return;
  }
  if (wait) {
    wait_until([&] { return b.generation != generation; }, "at named barrier %d", id);
    take_joined();
  }
}
inline void named_barrier_sync(int id, int count) { named_barrier(id, count, true); }
inline void named_barrier_arrive(int id, int count) { named_barrier(id, count, false); }

// Element (row, col) of a wgmma operand as fp32, from the calling thread's
// block.
template <class Element>
float operand(const model::MatrixDescriptor& d, bool mn_major, uint32_t mn, uint32_t k) {
  const uint32_t address = model::wgmma_operand_address(d, mn_major, mn, k);
  SIM_CHECK(address + 2 <= sim::shared_size, "a wgmma reads past the block's shared memory");
  Element e;
  memcpy(&e, sim::shared_memory + address, 2);
  return float(e);
}

// D (64 x N, fp32) = A (64 x 16) B (16 x N) + (accumulate ? D : 0) for each
// thread's registers.
template <class Element>
void execute(Wgmma& op) {
  const model::MatrixDescriptor da = model::decode_descriptor(op.desc_a), db = model::decode_descriptor(op.desc_b);
  std::vector<float> a(64 * 16), b(size_t(op.n) * 16);
  for (uint32_t k = 0; k < 16; ++k) {
    for (uint32_t m = 0; m < 64; ++m) a[m * 16 + k] = operand<Element>(da, op.a_mn_major, m, k);
    for (uint32_t n = 0; n < uint32_t(op.n); ++n) b[n * 16 + k] = operand<Element>(db, op.b_mn_major, n, k);
  }
  for (int t = 0; t < kWarpgroupThreads; ++t)
    for (int r = 0; r < op.n / 2; ++r) {
      const model::FragmentElement e = model::accumulator_element(t, r);
      float sum = 0.0f;
      for (int k = 0; k < 16; ++k) sum += a[e.row * 16 + k] * b[e.col * 16 + k];
      op.acc[t][r] = (op.scale_d ? op.acc[t][r] : 0.0f) + sum;
    }
  op.executed = true;
}

inline void execute_any(Wgmma& op) {
  if (op.bf16) execute<__nv_bfloat16>(op);
  else execute<__half>(op);
}

// The 16-byte chunks a wgmma reads, once its descriptors pass the checks.
inline std::vector<uint32_t> operand_chunks(uint64_t desc_a, bool a_mn_major, uint64_t desc_b, bool b_mn_major, int n) {
  std::vector<uint32_t> chunks;
  for (auto [desc, mn_major, rows] : {std::tuple{desc_a, a_mn_major, 64}, std::tuple{desc_b, b_mn_major, n}}) {
    const model::MatrixDescriptor d = model::decode_descriptor(desc);
    // Only what the kernels use is modelled: 128-byte swizzle from the start
    // of a pattern row (base offset 0, start bits 7-9 zero).
    SIM_CHECK(d.swizzle_mode == 1 && d.base_offset == 0 && (d.start >> 7) % 8 == 0,
              "descriptor swizzle %u base offset %u start %u", d.swizzle_mode, d.base_offset, d.start);
    for (int mn = 0; mn < rows; ++mn)
      for (int k = 0; k < 16; ++k) chunks.push_back(model::wgmma_operand_address(d, mn_major, mn, k) / 16);
  }
  std::sort(chunks.begin(), chunks.end());
  chunks.erase(std::unique(chunks.begin(), chunks.end()), chunks.end());
  return chunks;
}

// The widths (N) of the wgmmas issued since a driver last cleared them: a
// tile's own, and 8 where a kernel sums A's rows (sm90/mainloop.cuh's RowSums).
inline std::set<int> wgmma_widths;

template <class Element, int N>
void wgmma(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b, bool accumulate, bool a_mn_major, bool b_mn_major) {
  Warpgroup& w = own().warpgroups[threadIdx.x / kWarpgroupThreads];
  const int thread = threadIdx.x % kWarpgroupThreads;
  // The accumulators may have been touched by other instructions (PTX ISA, wgmma.fence).
  SIM_CHECK(fenced, "thread %u issues a wgmma without wgmma.fence since it last waited on its wgmmas", threadIdx.x);
  const size_t index = issued_since_commit++;
  if (index == w.open.size()) {  // the first thread to issue it
    Wgmma op;
    op.desc_a = desc_a, op.desc_b = desc_b, op.a_mn_major = a_mn_major, op.b_mn_major = b_mn_major;
    op.bf16 = std::is_same_v<Element, __nv_bfloat16>, op.n = N;
    wgmma_widths.insert(N);
    op.chunks = operand_chunks(desc_a, a_mn_major, desc_b, b_mn_major, N);
    std::vector<int>& reads = chunk_counts(own().reads);
    std::vector<int>& writes = chunk_counts(own().writes);
    std::vector<int>& written = chunk_counts(own().written);
    std::vector<int>& unfenced = chunk_counts(own().unfenced);
    for (uint32_t c : op.chunks) {
      SIM_CHECK(writes[c] == 0, "a wgmma is issued on shared memory (byte %u) that a box copy has yet to write",
                c * 16);
      SIM_CHECK(unfenced[c] == 0, "a wgmma is issued on shared memory (byte %u) that a thread wrote without "
                "fence.proxy.async since", c * 16);
      SIM_CHECK(written[c], "a wgmma is issued on shared memory (byte %u) that no box copy (or fenced store) has "
                "written", c * 16);
      ++reads[c];
    }
    w.open.push_back(std::move(op));
  }
  Wgmma& op = w.open[index];
  SIM_CHECK(op.desc_a == desc_a && op.desc_b == desc_b && op.a_mn_major == a_mn_major &&
                op.b_mn_major == b_mn_major && op.n == N && op.acc[thread] == nullptr &&
                (op.issued == 0 || op.scale_d == accumulate),
            "the threads of warpgroup %u issue different wgmmas", threadIdx.x / kWarpgroupThreads);
  op.acc[thread] = d;
  op.scale_d = accumulate;
  ++op.issued;
}

// What a collective step does once all 128 threads have met in it (the
// caller holds the mutex).
inline void complete_step(Warpgroup& w) {
  if (w.step < 0) {
    for (const Wgmma& op : w.open)
      SIM_CHECK(op.issued == kWarpgroupThreads, "only %d threads of a warpgroup issued a wgmma", op.issued);
    w.committed.push_back(std::move(w.open));
    w.open.clear();
    if (!wgmma_late)
      for (Wgmma& op : w.committed.back()) execute_any(op);
  } else {
    std::vector<int>& reads = chunk_counts(own().reads);
    while (w.committed.size() > size_t(w.step)) {
      for (Wgmma& op : w.committed.front()) {
        if (!op.executed) execute_any(op);
        for (uint32_t c : op.chunks) --reads[c];
      }
      w.committed.pop_front();
    }
  }
}

// commit_group (step -1) and wait_group N (step N): every thread of the
// warpgroup meets the others there, as .sync.aligned requires.
inline void warpgroup_step(int step) {
  const unsigned index = threadIdx.x / kWarpgroupThreads;
  // The later blocks of a cluster wait on their wgmmas slowly, so that the
  // first runs ahead of them as far as the barriers let it: a producer that
  // does not wait for the other block's consumers then copies over a stage
  // they still read.
  if (step >= 0 && sim::cluster_rank > 0) sim::fiber::let_others_run();
  Warpgroup& w = own().warpgroups[index];
  if (w.arrived == 0) w.step = step;
  SIM_CHECK(w.step == step, "the threads of warpgroup %u meet in different wgmma steps", index);
  if (step < 0) issued_since_commit = 0;
  else fenced = false;  // the accumulators are the thread's again
  const uint64_t generation = w.generation;
  if (++w.arrived == kWarpgroupThreads) {
    w.arrived = 0;
    complete_step(w);
    ++w.generation;
    sim::fiber::moved();
    return;
  }
  wait_until([&] { return w.generation != generation; }, "for the rest of warpgroup %u at a wgmma %s", index,
             step < 0 ? "commit_group" : "wait_group");
}

inline void wgmma_fence() { fenced = true; }

inline unsigned cluster_rank() { return sim::cluster_rank; }

// barrier.cluster: every thread of every block of the cluster.
inline void cluster_sync() { sim::wait_at(*sim::cluster_barrier, "barrier.cluster"); }

// A thread leaves the kernel; its block has exited once all its threads have,
// and nothing of it may be in flight then.
inline void thread_exit() {
  SIM_CHECK(store_groups.empty() && open_stores.empty(), "thread %u exits with box stores never waited for",
            threadIdx.x);
  // This thread's fiber runs its next block next, or a later launch's
  // thread of the same index: nothing of this one's may carry over.
  unfenced_writes.clear();
  issued_since_commit = 0;
  fenced = false;
  Block& b = own();
  if (++b.finished < int(blockDim.x)) return;
  for (const Warpgroup& w : b.warpgroups)
    SIM_CHECK(w.open.empty() && w.committed.empty(), "a block exits with wgmmas never retired by wait_group");
  SIM_CHECK(b.in_flight.empty(), "a block exits with %zu box copies in flight", b.in_flight.size());
  for (const auto& [id, named] : b.named)
    SIM_CHECK(named.arrived == 0, "a block exits with %d threads at named barrier %d, which never opened",
              named.arrived, id);
  b.exited = true;
  sim::fiber::moved();
}
inline const bool thread_exit_registered = (sim::thread_exit_hooks.push_back(&thread_exit), true);

// After each cluster (or lone block): its blocks' barriers go.
inline void end_block() {
  for (Block& b : blocks) {
    b.barriers.clear();
    b.named.clear();
    b.clocks.clear();
    b.words.clear();
    std::fill(b.unfenced.begin(), b.unfenced.end(), 0);
    std::fill(b.written.begin(), b.written.end(), 0);
    b.exited = false;
    b.finished = 0;
  }
}
inline const bool end_block_registered = (sim::block_exit_hooks.push_back(&end_block), true);

}  // namespace sim::hopper
