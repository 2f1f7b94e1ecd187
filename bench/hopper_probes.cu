// GPU probes of the Hopper GEMM's building blocks (issue 16), each a few
// seconds, run before the GEMM itself so that a failure names its part:
//   tma    the box copies with 128-byte swizzle of an iota tile, per operand
//          layout and tile height: every element must land where
//          SwizzledOperandTile::offset says;
//   wgmma  one K slice of m64n256k16 (four k16 steps, two warpgroups, with
//          the GEMM's descriptors) on small-integer operands placed by
//          SwizzledOperandTile::offset, per pair of layouts: every accumulator
//          register must hold the exact product at (accumulator_row,
//          accumulator_col) of its warpgroup's rows.
// The host models (tests/kernels/kernel_sim/hopper_models.h, run by
// tests/kernels/test_kernel_sim.py) check the same index code against the PTX ISA's
// text on any machine; these check it against the chip.
//
//   nvcc -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -I csrc/kernels \
//        bench/hopper_probes.cu -o hopper_probes && ./hopper_probes
// Exit status 0 when every probe matches; each mismatch is printed (first 8).
#include <cuda.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "arch/copy_engine.cuh"
#include "arch/mbarrier.cuh"
#include "arch/smem.cuh"
#include "arch/wgmma.cuh"
#include "sm90/layout.h"

using namespace mpgemm::kernels;
using namespace mpgemm::kernels::sm90;

#define CHECK(call)                                                                      \
  do {                                                                                   \
    cudaError_t err_ = (call);                                                           \
    if (err_ != cudaSuccess) {                                                           \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      std::exit(2);                                                                      \
    }                                                                                    \
  } while (0)

constexpr int kMaxTileBytes = 256 * 64 * 2;

// Copies the tile of `boxes` boxes at (0, 0) of `map` into shared memory (one
// thread issues, as the GEMM's producer does) and writes its bytes to `out`.
__global__ void tma_probe(const __grid_constant__ CUtensorMap map, int boxes, int box_bytes, int box_rows,
                          bool k_major, uint8_t* out) {
  __shared__ alignas(1024) uint8_t tile[kMaxTileBytes];
  __shared__ uint64_t full;
  if (threadIdx.x == 0) {
    mbarrier_init(&full, 1);
    fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_tx(&full, boxes * box_bytes);
    // Box `box` holds rows (M or N) from box * box_rows, as the GEMM's producer copies them.
    for (int box = 0; box < boxes; ++box)
      tma_load_3d(tile + box * box_bytes, &map, &full, k_major ? 0 : box * box_rows, k_major ? box * box_rows : 0, 0);
  }
  mbarrier_wait(&full, 0);
  for (int i = threadIdx.x; i < boxes * box_bytes; i += blockDim.x) out[i] = tile[i];
}

// One 64-deep K slice of wgmmas on the GEMM's A (128 rows) and B (256 rows)
// tiles, already in the SwizzledOperandTile layout in `a_bytes` / `b_bytes`: two
// warpgroups, each issuing the four k16 steps on its 64 rows as the GEMM's
// consumers do, then dumping each thread's 128 accumulators. Dynamic shared
// memory, aligned to the swizzle pattern as in the GEMM.
template <bool AKMajor, bool BKMajor>
__global__ void wgmma_probe(const uint8_t* a_bytes, const uint8_t* b_bytes, float* out) {
  using ATile = SwizzledOperandTile<128, AKMajor>;
  using BTile = SwizzledOperandTile<256, BKMajor>;
  extern __shared__ uint8_t probe_smem[];
  uint8_t* a = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(probe_smem) + kSwizzleAtomBytes - 1) &
                                          ~uintptr_t(kSwizzleAtomBytes - 1));
  uint8_t* b = a + ATile::kBytes;
  for (int i = threadIdx.x; i < ATile::kBytes; i += blockDim.x) a[i] = a_bytes[i];
  for (int i = threadIdx.x; i < BTile::kBytes; i += blockDim.x) b[i] = b_bytes[i];
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // ordinary stores, read by wgmma
  __syncthreads();
  const int warpgroup = threadIdx.x / 128;
  float acc[128];
  for (int i = 0; i < 128; ++i) acc[i] = 0.0f;
  wgmma_fence();
  for (int k16 = 0; k16 < 4; ++k16)
    wgmma_m64n256k16<__half, AKMajor ? 0 : 1, BKMajor ? 0 : 1>(acc, ATile::descriptor(smem_address(a), k16, warpgroup),
                                                              BTile::descriptor(smem_address(b), k16), k16 > 0);
  wgmma_commit();
  wgmma_wait<0>();
  for (int i = 0; i < 128; ++i) out[threadIdx.x * 128 + i] = acc[i];
}

using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// Element (mn, k) of an iota operand: a distinct 16-bit pattern per element.
uint16_t iota_bits(int mn, int k) { return uint16_t(mn * 64 + k); }

template <int Rows, bool KMajor>
int probe_tma(EncodeTiled encode) {
  using Tile = SwizzledOperandTile<Rows, KMajor>;
  const int inner = KMajor ? 64 : Rows, outer = KMajor ? Rows : 64;
  std::vector<uint16_t> host(size_t(inner) * outer);
  for (int mn = 0; mn < Rows; ++mn)
    for (int k = 0; k < 64; ++k) host[KMajor ? size_t(mn) * 64 + k : size_t(k) * Rows + mn] = iota_bits(mn, k);
  void* global = nullptr;
  uint8_t* out = nullptr;
  CHECK(cudaMalloc(&global, host.size() * 2));
  CHECK(cudaMalloc(&out, Tile::kBytes));
  CHECK(cudaMemcpy(global, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
  CUtensorMap map;
  const cuuint64_t dims[3] = {cuuint64_t(inner), cuuint64_t(outer), 1};
  const cuuint64_t strides[2] = {cuuint64_t(inner) * 2, cuuint64_t(inner) * outer * 2};
  const cuuint32_t box[3] = {KMajor ? 64u : cuuint32_t(Tile::kBoxRows), KMajor ? cuuint32_t(Tile::kBoxRows) : 64u, 1},
                   unit[3] = {1, 1, 1};
  if (encode(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, global, dims, strides, box, unit,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    std::printf("tma %s %d rows: cuTensorMapEncodeTiled failed\n", KMajor ? "K-major" : "MN-major", Rows);
    return 1;
  }
  tma_probe<<<1, 128>>>(map, Tile::kBoxes, Tile::kBoxBytes, Tile::kBoxRows, KMajor, out);
  CHECK(cudaGetLastError());
  std::vector<uint16_t> smem(Tile::kBytes / 2);
  CHECK(cudaMemcpy(smem.data(), out, Tile::kBytes, cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int mn = 0; mn < Rows; ++mn)
    for (int k = 0; k < 64; ++k) {
      const uint16_t got = smem[Tile::offset(mn, k) / 2];
      if (got != iota_bits(mn, k) && wrong++ < 8)
        std::printf("tma %s: element (%d, %d) expected at byte %u, found 0x%04x there\n", KMajor ? "K-major" : "MN-major",
                    mn, k, Tile::offset(mn, k), got);
    }
  std::printf("tma %-8s %3d rows x 64 K: %s\n", KMajor ? "K-major" : "MN-major", Rows, wrong ? "WRONG" : "ok");
  CHECK(cudaFree(global));
  CHECK(cudaFree(out));
  return wrong != 0;
}

// Small integers, exact in fp16 and in fp32 sums of 64 products.
float a_value(int m, int k) { return float((m * 3 + k * 5) % 7 - 3); }
float b_value(int k, int n) { return float((k * 2 + n * 7) % 9 - 4); }

template <bool AKMajor, bool BKMajor>
int probe_wgmma() {
  using ATile = SwizzledOperandTile<128, AKMajor>;
  using BTile = SwizzledOperandTile<256, BKMajor>;
  constexpr int kThreads = 256, kSmemBytes = ATile::kBytes + BTile::kBytes + kSwizzleAtomBytes;
  std::vector<__half> a(ATile::kBytes / 2, __float2half(0.0f)), b(BTile::kBytes / 2, __float2half(0.0f));
  for (int k = 0; k < 64; ++k) {
    for (int m = 0; m < 128; ++m) a[ATile::offset(m, k) / 2] = __float2half(a_value(m, k));
    for (int n = 0; n < 256; ++n) b[BTile::offset(n, k) / 2] = __float2half(b_value(k, n));
  }
  uint8_t *a_dev = nullptr, *b_dev = nullptr;
  float* out = nullptr;
  CHECK(cudaMalloc(&a_dev, a.size() * 2));
  CHECK(cudaMalloc(&b_dev, b.size() * 2));
  CHECK(cudaMalloc(&out, kThreads * 128 * sizeof(float)));
  CHECK(cudaMemcpy(a_dev, a.data(), a.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(b_dev, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaFuncSetAttribute(wgmma_probe<AKMajor, BKMajor>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes));
  wgmma_probe<AKMajor, BKMajor><<<1, kThreads, kSmemBytes>>>(a_dev, b_dev, out);
  CHECK(cudaGetLastError());
  std::vector<float> d(kThreads * 128);
  CHECK(cudaMemcpy(d.data(), out, d.size() * sizeof(float), cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int t = 0; t < kThreads; ++t)
    for (int r = 0; r < 128; ++r) {
      const int row = 64 * (t / 128) + accumulator_row(t % 128, r), col = accumulator_col(t % 128, r);
      float expected = 0.0f;
      for (int k = 0; k < 64; ++k) expected += a_value(row, k) * b_value(k, col);
      if (d[t * 128 + r] != expected && wrong++ < 8)
        std::printf("wgmma A %s B %s: thread %d register %d (row %d, column %d) holds %g, expected %g\n",
                    AKMajor ? "K-major" : "M-major", BKMajor ? "K-major" : "N-major", t, r, row, col,
                    d[t * 128 + r], expected);
    }
  std::printf("wgmma A %-7s B %-7s 2 x 4 m64n256k16: %s\n", AKMajor ? "K-major" : "M-major",
              BKMajor ? "K-major" : "N-major", wrong ? "WRONG" : "ok");
  CHECK(cudaFree(a_dev));
  CHECK(cudaFree(b_dev));
  CHECK(cudaFree(out));
  return wrong != 0;
}

int main() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
  const EncodeTiled encode = reinterpret_cast<EncodeTiled>(fn);
  int failed = 0;
  // A's tiles (128 rows, 64 with ping-pong consumers) and B's.
  failed += probe_tma<64, true>(encode);
  failed += probe_tma<128, true>(encode);
  failed += probe_tma<256, true>(encode);
  failed += probe_tma<64, false>(encode);
  failed += probe_tma<128, false>(encode);
  failed += probe_tma<256, false>(encode);
  failed += probe_wgmma<true, true>();
  failed += probe_wgmma<true, false>();
  failed += probe_wgmma<false, true>();
  failed += probe_wgmma<false, false>();
  CHECK(cudaDeviceSynchronize());
  std::printf("%s\n", failed ? "PROBES FAILED" : "all probes match the kernel's index code");
  return failed ? 1 : 0;
}
