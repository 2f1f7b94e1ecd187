// Stand-in for <cuda_runtime.h> in the host-side kernel simulation
// (tests/kernels/test_kernel_sim.py), so that g++ compiles the real kernel sources and
// runs them without a GPU. A launch runs its blocks one after another (the
// blocks of a thread block cluster together, each with its own shared
// memory), each block's threads as fibers (fibers.h) on the launching
// thread, each running until it waits at a barrier, so a missing
// __syncthreads or __syncwarp shows up as wrong results; shared memory
// starts out as NaN each block so reading what no thread wrote does too; and
// AddressSanitizer sees every global access. Launch limits of real devices are
// checked, and every misuse aborts with a message.
#pragma once

#include <math.h>  // ::isfinite and ::erff, as device code sees them

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <new>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#if __has_include(<sanitizer/asan_interface.h>)
#include <sanitizer/asan_interface.h>
#endif
#include "fibers.h"

#ifndef ASAN_POISON_MEMORY_REGION
#define ASAN_POISON_MEMORY_REGION(addr, size)
#define ASAN_UNPOISON_MEMORY_REGION(addr, size)
#endif

#define __host__
#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__
#define __shared__
#define __align__(n) __attribute__((aligned(n)))

#define SIM_CHECK(cond, ...)                                                          \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      fprintf(stderr, "simulation check failed at %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                                   \
      fprintf(stderr, "\n");                                                          \
      abort();                                                                        \
    }                                                                                 \
  } while (0)

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDeviceFunction = 98,
  cudaErrorInvalidDevice = 101,
  cudaErrorNoKernelImageForDevice = 209,
  cudaErrorNotSupported = 801
};
using cudaStream_t = struct CUstream_st*;
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaLaunchAttributeID { cudaLaunchAttributeClusterDimension = 4 };
enum cudaDeviceAttr {
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97
};
struct cudaFuncAttributes {
  int binaryVersion, ptxVersion;  // of the arch the code was built for: 10 * major + minor
  size_t sharedSizeBytes;         // static shared memory
};

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x = 1, unsigned y = 1, unsigned z = 1) : x(x), y(y), z(z) {}
};
struct uint3 { unsigned x, y, z; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
inline float2 make_float2(float x, float y) { return {x, y}; }

struct cudaLaunchAttributeValue {
  struct {
    unsigned x, y, z;
  } clusterDim;
};
struct cudaLaunchAttribute {
  cudaLaunchAttributeID id;
  cudaLaunchAttributeValue val;
};
struct cudaLaunchConfig_t {
  dim3 gridDim, blockDim;
  size_t dynamicSmemBytes;
  cudaStream_t stream;
  cudaLaunchAttribute* attrs;
  unsigned numAttrs;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

// A CUDA thread's own variables, here and in namespace sim below, are
// globals that the fibers swap (fibers.h's Locals).
inline uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

namespace sim {
// The simulated device's arch, as __CUDA_ARCH__ writes it: defined once per
// driver, by the unit that holds its main(), so that what a kernel unit asks
// of the device is the driver's arch even where the unit was compiled at
// another whose code is the same (the Hopper driver links sim arch 800's
// objects of the units whose code does not differ at 900: test_kernel_sim.py).
extern const int device_arch;
// A planted build (test_kernel_sim.py) carries several bugs, each behind its
// number; a run plants the one SIM_PLANTED_BUG names.
inline bool planted(int bug) {
  static const int chosen = [] {
    const char* value = std::getenv("SIM_PLANTED_BUG");
    if (value == nullptr) return -1;
    char* end = nullptr;
    const long number = std::strtol(value, &end, 10);
    SIM_CHECK(*value != '\0' && *end == '\0' && number >= 0, "SIM_PLANTED_BUG=%s is not a bug's number", value);
    return int(number);
  }();
  return chosen == bug;
}
// The simulated device, as cudaGetDevice names it, and its multiprocessors.
// A real device's count never changes, and launchers keep what they asked of
// a device (common/launch_utils.h's PerDeviceFact), so each count is a device of its
// own: a case sets both with use_multiprocessors.
inline int multiprocessors = 108, device = 0;
inline void use_multiprocessors(int count) {
  static std::map<int, int> devices{{108, 0}};
  multiprocessors = count;
  device = devices.emplace(count, int(devices.size())).first->second;
}
// How often cudaOccupancyMaxActiveClusters was asked, by (device, kernel);
// the grid of the last launch, as asked for, its dynamic shared memory and
// its blocks per cluster.
inline std::map<std::pair<int, const void*>, int> cluster_occupancy_queries;
inline dim3 last_grid;
inline size_t last_smem = 0;
inline unsigned last_cluster = 1;
// The threads each launch asked for (grid x block), in order, while a check
// records them.
inline bool recording_launch_threads = false;
inline std::vector<uint64_t> launch_threads;
// Launches run on a grid clipped to this. Stands in for the 65535-block limit
// that only huge problems reach: kernels that grid-stride must still cover
// everything.
inline dim3 max_grid(1u << 31, 65535, 65535);
// What `extern __shared__` arrays name (set up by the driver), and how much of
// it the running launch asked for. Each thread of a launch sees its own
// block's: the driver's for the first block of a cluster, kMaxCluster - 1
// more of the same capacity for the others (cluster_shared: by rank).
inline unsigned char* shared_memory = nullptr;
inline size_t shared_capacity = 0, shared_size = 0;
inline constexpr int kMaxCluster = 2;
inline unsigned char* cluster_shared[kMaxCluster] = {};
inline unsigned cluster_rank = 0, cluster_size = 1;
inline size_t shared_limit =  // opt-in maximum per block
    device_arch >= 900 ? 227 * 1024 : device_arch >= 800 ? 163 * 1024 : 64 * 1024;
// The dynamic shared memory each kernel was opted into, by (device, kernel):
// as the driver keeps it, per device.
inline std::map<std::pair<int, const void*>, size_t> opted_in_smem;
// cudaFuncSetAttribute and cudaFuncGetAttributes calls since the run began
// (launchers ask once per kernel and device: common/launch_utils.h's
// KernelAttributes).
inline uint64_t function_attribute_calls = 0;
inline std::set<const void*> launched;  // distinct kernels, for the driver's coverage report
// Kernel launches and memsets since the run began (a launcher's count of them).
inline uint64_t launches = 0, memsets = 0;
// Run once after each block (each cluster), all its threads done: checks and
// resets of state that lives for one block (../hopper_sim.h's barriers and
// copies); and by each thread as it leaves the kernel.
inline std::vector<void (*)()> block_exit_hooks;
inline std::vector<void (*)()> thread_exit_hooks;

inline fiber::Barrier<>* block_barrier;
inline fiber::Barrier<>* warp_barrier;
inline double* warp_lanes;  // the warp's 32 slots that __shfl_xor_sync exchanges through (fp32 held exactly)
inline fiber::Barrier<>* cluster_barrier;
// cp.async (../arch/cp_async.cuh): whether copies land only when waited for, and
// this thread's copies in flight: committed groups, oldest first, and the open one.
inline bool async_copies_late = false;
inline std::vector<std::vector<std::function<void()>>> async_groups;
inline std::vector<std::function<void()>> async_open;
inline const bool thread_variables_registered =
    fiber::Locals::add(threadIdx) && fiber::Locals::add(blockIdx) && fiber::Locals::add(blockDim) &&
    fiber::Locals::add(gridDim) && fiber::Locals::add(shared_memory) && fiber::Locals::add(cluster_rank) &&
    fiber::Locals::add(cluster_size) && fiber::Locals::add(block_barrier) && fiber::Locals::add(warp_barrier) &&
    fiber::Locals::add(warp_lanes) && fiber::Locals::add(cluster_barrier) && fiber::Locals::add(async_groups) &&
    fiber::Locals::add(async_open);

// Waits at `barrier`, or reports what it waits for should nothing be able to move.
inline void wait_at(fiber::Barrier<>& barrier, const char* what) {
  barrier.arrive_and_wait([what] {
    fprintf(stderr, "deadlock: thread %u of block %u waits at %s, and no thread of the launch can move\n",
            threadIdx.x, blockIdx.x, what);
  });
}
}  // namespace sim

namespace sim {
// The address of `p` in the shared state space: its offset in the block's
// shared memory, which stands at address 0.
inline uint32_t shared_address(const void* p) {
  const auto* byte = static_cast<const unsigned char*>(p);
  SIM_CHECK(byte >= shared_memory && byte < shared_memory + shared_size, "not in the launch's shared memory");
  return uint32_t(byte - shared_memory);
}
}  // namespace sim

inline void __syncthreads() { sim::wait_at(*sim::block_barrier, "__syncthreads"); }
// fp32 arithmetic rounded once per step: g++ contracts nothing into an FMA
// here (no FMA instructions at the simulation's target), as nvcc does not
// for these intrinsics.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
// A store with the write-back cache policy (st.global.wb): a plain store here.
template <class T>
inline void __stwb(T* p, T v) { *p = v; }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  SIM_CHECK(mask == 0xffffffffu, "partial warp masks are not modelled");
  sim::wait_at(*sim::warp_barrier, "__syncwarp");
}
// Every lane of the warp takes part: each leaves its value in its slot, the
// warp meets, reads its partner's, and meets again before a slot is reused.
namespace sim {
template <class V>
inline V shfl_xor(unsigned mask, V value, int lane_mask) {
  SIM_CHECK(mask == 0xffffffffu, "partial warp masks are not modelled");
  SIM_CHECK(lane_mask >= 0 && lane_mask < 32, "lane mask %d", lane_mask);
  const unsigned lane = threadIdx.x % 32;
  warp_lanes[lane] = double(value);
  wait_at(*warp_barrier, "__shfl_xor_sync");
  const V other = V(warp_lanes[lane ^ unsigned(lane_mask)]);
  wait_at(*warp_barrier, "__shfl_xor_sync");
  return other;
}
}  // namespace sim
inline float __shfl_xor_sync(unsigned mask, float value, int lane_mask) {
  return sim::shfl_xor(mask, value, lane_mask);
}
inline double __shfl_xor_sync(unsigned mask, double value, int lane_mask) {
  return sim::shfl_xor(mask, value, lane_mask);
}

namespace sim {
// Whether the calling thread has the device's primary context current. A
// thread starts without; runtime calls that need a context make it current
// (bind_context below), cudaGetDevice and cudaDeviceGetAttribute do not, and
// the driver's encoders (mock/cuda.h) refuse without one, as the driver does.
inline thread_local bool context_current = false;
inline void bind_context() { context_current = true; }
}  // namespace sim

// Calls here return their errors; none is left behind.
inline cudaError_t cudaGetLastError() { return cudaSuccess; }
inline cudaError_t cudaGetDevice(int* device) { *device = sim::device; return cudaSuccess; }
inline cudaError_t cudaSetDevice(int device) {
  if (device != sim::device) return cudaErrorInvalidDevice;
  sim::bind_context();
  return cudaSuccess;
}
inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = sim::multiprocessors; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = int(sim::shared_limit); break;
    // The simulated device is of the arch the driver was built for.
    case cudaDevAttrComputeCapabilityMajor: *value = sim::device_arch / 100; break;
    case cudaDevAttrComputeCapabilityMinor: *value = sim::device_arch / 10 % 10; break;
    default: SIM_CHECK(false, "attribute %d", int(attr));
  }
  return cudaSuccess;
}
template <class... P>
cudaError_t cudaFuncSetAttribute(void (*kernel)(P...), cudaFuncAttribute attr, int value) {
  SIM_CHECK(attr == cudaFuncAttributeMaxDynamicSharedMemorySize, "attribute %d", int(attr));
  sim::bind_context();
  ++sim::function_attribute_calls;
  if (value < 0 || size_t(value) > sim::shared_limit) return cudaErrorInvalidValue;
  sim::opted_in_smem[{sim::device, reinterpret_cast<const void*>(kernel)}] = value;
  return cudaSuccess;
}

// Device memory is host memory here, and a stream runs at once.
inline cudaError_t cudaMemsetAsync(void* dst, int value, size_t count, cudaStream_t = nullptr) {
  sim::bind_context();
  ++sim::memsets;
  memset(dst, value, count);
  return cudaSuccess;
}

// A 2D copy, checked as the runtime documents it: pitches at least the
// width, device to device only (the only kind the kernels' launchers make).
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice,
  cudaMemcpyDeviceToHost,
  cudaMemcpyDeviceToDevice
};
inline cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                                     size_t height, cudaMemcpyKind kind, cudaStream_t = nullptr) {
  sim::bind_context();
  SIM_CHECK(kind == cudaMemcpyDeviceToDevice, "copy kind %d", int(kind));
  if (dpitch < width || spitch < width) return cudaErrorInvalidValue;
  for (size_t row = 0; row < height; ++row)
    memcpy(static_cast<unsigned char*>(dst) + row * dpitch, static_cast<const unsigned char*>(src) + row * spitch,
           width);
  return cudaSuccess;
}

// Every kernel was built for the simulated arch (sim arch 900 is sm_90a).
// Static shared memory is declared by sm90/block.cuh's probe kernel alone, in
// sm_90a code, where ptxas counts it as 1040 bytes: its 16 after the 1 KiB
// the arch reserves.
template <class... P>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attributes, void (*)(P...)) {
  ++sim::function_attribute_calls;
  attributes->binaryVersion = attributes->ptxVersion = sim::device_arch / 10;
  attributes->sharedSizeBytes = sim::device_arch >= 900 ? 1040 : 0;
  return cudaSuccess;
}

namespace sim {
// Runs `kernel` on a grid of clusters of `cluster` blocks (1: plain blocks),
// on arguments already copied as the runtime copies them.
template <class... P>
cudaError_t launch(void (*kernel)(P...), dim3 grid, dim3 block, const std::tuple<P...>& params, size_t smem,
                   unsigned cluster) {
  launched.insert(reinterpret_cast<const void*>(kernel));
  ++launches;
  last_grid = grid;
  if (recording_launch_threads) launch_threads.push_back(uint64_t(grid.x) * grid.y * block.x);
  last_smem = smem;
  last_cluster = cluster;
  const auto opted = opted_in_smem.find({device, reinterpret_cast<const void*>(kernel)});
  SIM_CHECK(smem <= 48 * 1024 || (opted != opted_in_smem.end() && smem <= opted->second),
            "%zu bytes of dynamic shared memory without opting in", smem);
  // A kept opt-in is no licence past the device's limit, which a case may lower.
  SIM_CHECK(smem <= shared_limit, "%zu bytes of dynamic shared memory past the device's %zu", smem, shared_limit);
  SIM_CHECK(smem <= shared_capacity, "the driver's shared memory is too small");
  SIM_CHECK(block.y == 1 && block.z == 1 && block.x % 32 == 0 && block.x >= 32 && block.x <= 1024, "block %u",
            block.x);
  SIM_CHECK(grid.x >= 1 && grid.y >= 1 && grid.y <= 65535 && grid.z == 1, "grid %u x %u", grid.x, grid.y);
  SIM_CHECK(cluster >= 1 && cluster <= unsigned(kMaxCluster) && grid.x % cluster == 0 && (cluster == 1 || grid.y == 1),
            "clusters of %u blocks on a grid of %u x %u", cluster, grid.x, grid.y);
  grid = dim3(std::min(grid.x, max_grid.x / cluster * cluster), std::min(grid.y, max_grid.y), 1);

  const unsigned threads = block.x;
  shared_size = smem;
  cluster_shared[0] = shared_memory;
  struct AlignedDelete {
    void operator()(unsigned char* p) const { ::operator delete(p, std::align_val_t(1024)); }
  };
  std::vector<std::unique_ptr<unsigned char, AlignedDelete>> others;
  for (unsigned r = 1; r < cluster; ++r) {
    others.emplace_back(static_cast<unsigned char*>(::operator new(shared_capacity, std::align_val_t(1024))));
    cluster_shared[r] = others.back().get();
  }
  for (unsigned r = 0; r < cluster; ++r)
    ASAN_POISON_MEMORY_REGION(cluster_shared[r] + smem, shared_capacity - smem);
  auto poison = [&]() noexcept {  // NaN as fp16 and fp32
    for (unsigned r = 0; r < cluster; ++r) memset(cluster_shared[r], 0xff, smem);
  };
  auto end_block = [&]() noexcept {
    for (auto hook : block_exit_hooks) hook();
    poison();
  };
  poison();
  std::vector<fiber::Barrier<>> block_barriers(cluster, fiber::Barrier<>(int(threads)));
  std::vector<fiber::Barrier<>> warp_barriers(cluster * threads / 32, fiber::Barrier<>(32));
  std::vector<double> lanes(cluster * threads);
  fiber::Barrier<> cluster_barrier(int(cluster * threads));
  fiber::Barrier<decltype(end_block)> next_block(int(cluster * threads), end_block);
  fiber::run(cluster * threads, [&](unsigned t) {
    const unsigned rank = t / threads;
    threadIdx = {t % threads, 0, 0};
    blockDim = block;
    gridDim = grid;
    shared_memory = cluster_shared[rank];
    cluster_rank = rank, cluster_size = cluster;
    block_barrier = &block_barriers[rank];
    warp_barrier = &warp_barriers[t / 32];
    warp_lanes = lanes.data() + t / 32 * 32;
    sim::cluster_barrier = &cluster_barrier;
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = rank; x < grid.x; x += cluster) {
        blockIdx = {x, y, 0};
        std::apply(kernel, params);
        SIM_CHECK(async_groups.empty() && async_open.empty(), "cp.async copies never waited for");
        for (auto hook : thread_exit_hooks) hook();
        next_block.arrive_and_wait([] {
          fprintf(stderr, "deadlock: thread %u of block %u has left the kernel, and no thread of the launch can "
                  "move\n", threadIdx.x, blockIdx.x);
        });
      }
  });
  for (unsigned r = 0; r < cluster; ++r) ASAN_UNPOISON_MEMORY_REGION(cluster_shared[r], shared_capacity);
  cluster_shared[0] = nullptr;
  for (unsigned r = 1; r < cluster; ++r) cluster_shared[r] = nullptr;
  return cudaSuccess;
}

inline unsigned cluster_of(const cudaLaunchConfig_t& config) {
  unsigned cluster = 1;
  for (unsigned i = 0; i < config.numAttrs; ++i) {
    SIM_CHECK(config.attrs[i].id == cudaLaunchAttributeClusterDimension, "launch attribute %d", int(config.attrs[i].id));
    const auto& dim = config.attrs[i].val.clusterDim;
    SIM_CHECK(dim.y == 1 && dim.z == 1, "clusters of %u x %u x %u", dim.x, dim.y, dim.z);
    cluster = dim.x;
  }
  return cluster;
}
}  // namespace sim

template <class... P>
cudaError_t cudaLaunchKernel(void (*kernel)(P...), dim3 grid, dim3 block, void** args, size_t smem, cudaStream_t) {
  // Arguments are copied at launch, as the runtime does.
  const std::tuple<P...> params = [&]<size_t... I>(std::index_sequence<I...>) {
    return std::tuple<P...>(*static_cast<P*>(args[I])...);
  }(std::index_sequence_for<P...>{});
  sim::bind_context();
  return sim::launch(kernel, grid, block, params, smem, 1);
}

template <class... P, class... A>
cudaError_t cudaLaunchKernelEx(const cudaLaunchConfig_t* config, void (*kernel)(P...), A&&... args) {
  const std::tuple<P...> params(std::forward<A>(args)...);
  sim::bind_context();
  return sim::launch(kernel, config->gridDim, config->blockDim, params, config->dynamicSmemBytes,
                     sim::cluster_of(*config));
}

// Every multiprocessor holds a block of any kernel the simulation runs.
template <class... P>
cudaError_t cudaOccupancyMaxActiveClusters(int* clusters, void (*kernel)(P...), const cudaLaunchConfig_t* config) {
  sim::bind_context();
  ++sim::cluster_occupancy_queries[{sim::device, reinterpret_cast<const void*>(kernel)}];
  *clusters = sim::multiprocessors / int(sim::cluster_of(*config));
  return cudaSuccess;
}
