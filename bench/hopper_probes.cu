// GPU probes of the Hopper GEMM's building blocks (issue 16), each a few
// seconds, run before the GEMM itself so that a failure names its part:
//   tma    the box copies with 128-byte swizzle of an iota tile, per operand
//          layout and tile height: every element must land where
//          SwizzledOperandTile::offset says;
//   wgmma  one K slice of m64nNk16 for the tiles' widths N = 256, 128 and 64
//          (four k16 steps, two warpgroups, with
//          the GEMM's descriptors) on small-integer operands placed by
//          SwizzledOperandTile::offset, per pair of layouts: every accumulator
//          register must hold the exact product at (accumulator_row,
//          accumulator_col) of its warpgroup's rows;
//   im2col the copy engine's im2col box of an iota NHWC tensor, as the
//          convolution's producer issues it (sm90/conv_producer.cuh) on the
//          map its launcher builds (sm90/conv_launch.cu's corners), for
//          tiles at image edges and past the last image, taps with padding,
//          stride and dilation: every element must hold what the host
//          model of the PTX ISA's im2col mode (tests/kernels/kernel_sim/
//          hopper_models.h) says, zero where that lies outside the tensor.
// The host models (tests/kernels/kernel_sim/hopper_models.h, run by
// tests/kernels/test_kernel_sim.py) check the same index code against the PTX ISA's
// text on any machine; these check it against the chip.
//
//   nvcc -std=c++17 -O2 -gencode=arch=compute_90a,code=sm_90a -I csrc/kernels -I tests/kernels \
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
#include "kernel_sim/hopper_models.h"
#include "sm90/layout.h"
#include "sm90/tensor_maps.h"

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

// Runs issue(tile, full) on one thread (it issues copies of `bytes` bytes in
// all into `tile`, completing on `full`, as the kernels' producers do), waits
// for them, and writes the tile's bytes to `out`.
template <class Issue>
__device__ void copy_and_dump(int bytes, uint8_t* out, Issue issue) {
  __shared__ alignas(1024) uint8_t tile[kMaxTileBytes];
  __shared__ uint64_t full;
  if (threadIdx.x == 0) {
    mbarrier_init(&full, 1);
    fence_barrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_tx(&full, bytes);
    issue(tile, &full);
  }
  mbarrier_wait(&full, 0);
  for (int i = threadIdx.x; i < bytes; i += blockDim.x) out[i] = tile[i];
}

// The tile of `boxes` boxes at (0, 0) of `map`: box `box` holds rows (M or N)
// from box * box_rows, as the GEMM's producer copies them.
__global__ void tma_probe(const __grid_constant__ CUtensorMap map, int boxes, int box_bytes, int box_rows,
                          bool k_major, uint8_t* out) {
  copy_and_dump(boxes * box_bytes, out, [&](uint8_t* tile, uint64_t* full) {
    for (int box = 0; box < boxes; ++box)
      tma_load_3d(tile + box * box_bytes, &map, full, k_major ? 0 : box * box_rows, k_major ? box * box_rows : 0, 0);
  });
}

// One im2col box: 64 channels from c of the map's pixels from (w, h, n), read
// at the im2col offsets, as the convolution's producer issues it.
__global__ void im2col_probe(const __grid_constant__ CUtensorMap map, int c, int w, int h, int n, uint16_t w_offset,
                             uint16_t h_offset, int box_bytes, uint8_t* out) {
  copy_and_dump(box_bytes, out, [&](uint8_t* tile, uint64_t* full) {
    tma_load_im2col_4d(tile, &map, full, c, w, h, n, w_offset, h_offset);
  });
}

// One 64-deep K slice of wgmmas on the GEMM's A (128 rows) and B (N rows)
// tiles, already in the SwizzledOperandTile layout in `a_bytes` / `b_bytes`: two
// warpgroups, each issuing the four k16 steps on its 64 rows as the GEMM's
// consumers do, then dumping each thread's N / 2 accumulators. Dynamic shared
// memory, aligned to the swizzle pattern as in the GEMM.
template <int N, bool AKMajor, bool BKMajor>
__global__ void wgmma_probe(const uint8_t* a_bytes, const uint8_t* b_bytes, float* out) {
  using ATile = SwizzledOperandTile<128, AKMajor>;
  using BTile = SwizzledOperandTile<N, BKMajor>;
  constexpr int kRegisters = N / 2;
  extern __shared__ uint8_t probe_smem[];
  uint8_t* a = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(probe_smem) + kSwizzleAtomBytes - 1) &
                                          ~uintptr_t(kSwizzleAtomBytes - 1));
  uint8_t* b = a + ATile::kBytes;
  for (int i = threadIdx.x; i < ATile::kBytes; i += blockDim.x) a[i] = a_bytes[i];
  for (int i = threadIdx.x; i < BTile::kBytes; i += blockDim.x) b[i] = b_bytes[i];
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // ordinary stores, read by wgmma
  __syncthreads();
  const int warpgroup = threadIdx.x / 128;
  float acc[kRegisters];
  for (int i = 0; i < kRegisters; ++i) acc[i] = 0.0f;
  wgmma_fence();
  for (int k16 = 0; k16 < 4; ++k16)
    wgmma_m64nNk16<N, __half, AKMajor ? 0 : 1, BKMajor ? 0 : 1>(
        acc, ATile::descriptor(smem_address(a), k16, warpgroup), BTile::descriptor(smem_address(b), k16), k16 > 0);
  wgmma_commit();
  wgmma_wait<0>();
  for (int i = 0; i < kRegisters; ++i) out[threadIdx.x * kRegisters + i] = acc[i];
}


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

template <int N, bool AKMajor, bool BKMajor>
int probe_wgmma() {
  using ATile = SwizzledOperandTile<128, AKMajor>;
  using BTile = SwizzledOperandTile<N, BKMajor>;
  constexpr int kThreads = 256, kRegisters = N / 2, kSmemBytes = ATile::kBytes + BTile::kBytes + kSwizzleAtomBytes;
  std::vector<__half> a(ATile::kBytes / 2, __float2half(0.0f)), b(BTile::kBytes / 2, __float2half(0.0f));
  for (int k = 0; k < 64; ++k) {
    for (int m = 0; m < 128; ++m) a[ATile::offset(m, k) / 2] = __float2half(a_value(m, k));
    for (int n = 0; n < N; ++n) b[BTile::offset(n, k) / 2] = __float2half(b_value(k, n));
  }
  uint8_t *a_dev = nullptr, *b_dev = nullptr;
  float* out = nullptr;
  CHECK(cudaMalloc(&a_dev, a.size() * 2));
  CHECK(cudaMalloc(&b_dev, b.size() * 2));
  CHECK(cudaMalloc(&out, kThreads * kRegisters * sizeof(float)));
  CHECK(cudaMemcpy(a_dev, a.data(), a.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaMemcpy(b_dev, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
  CHECK(cudaFuncSetAttribute(wgmma_probe<N, AKMajor, BKMajor>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kSmemBytes));
  wgmma_probe<N, AKMajor, BKMajor><<<1, kThreads, kSmemBytes>>>(a_dev, b_dev, out);
  CHECK(cudaGetLastError());
  std::vector<float> d(kThreads * kRegisters);
  CHECK(cudaMemcpy(d.data(), out, d.size() * sizeof(float), cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int t = 0; t < kThreads; ++t)
    for (int r = 0; r < kRegisters; ++r) {
      const int row = 64 * (t / 128) + accumulator_row(t % 128, r), col = accumulator_col(t % 128, r);
      float expected = 0.0f;
      for (int k = 0; k < 64; ++k) expected += a_value(row, k) * b_value(k, col);
      if (d[t * kRegisters + r] != expected && wrong++ < 8)
        std::printf("wgmma n%d A %s B %s: thread %d register %d (row %d, column %d) holds %g, expected %g\n", N,
                    AKMajor ? "K-major" : "M-major", BKMajor ? "K-major" : "N-major", t, r, row, col,
                    d[t * kRegisters + r], expected);
    }
  std::printf("wgmma A %-7s B %-7s 2 x 4 m64n%dk16: %s\n", AKMajor ? "K-major" : "M-major",
              BKMajor ? "K-major" : "N-major", N, wrong ? "WRONG" : "ok");
  CHECK(cudaFree(a_dev));
  CHECK(cudaFree(b_dev));
  CHECK(cudaFree(out));
  return wrong != 0;
}

// A convolution's geometry for the im2col probe: x is n x h x w x channels
// (fewer than a box's 64: the rest arrive as zeros).
struct Im2colGeometry {
  int n, h, w, channels, r, s, stride, pad, dilation;
  int out(int extent, int taps) const { return (extent + 2 * pad - dilation * (taps - 1) - 1) / stride + 1; }
};

// Boxes of 128 pixels from a few tiles' first output pixels (an image edge,
// mid-image, the last tile, past the last image) at every tap of `g`.
int probe_im2col(EncodeIm2col encode, const Im2colGeometry& g) {
  constexpr int kBoxChannels = 64, kPixels = 128, kBoxBytes = kPixels * kBoxChannels * 2;
  const int64_t channels = g.channels;
  const int p = g.out(g.h, g.r), q = g.out(g.w, g.s), pixels = g.n * p * q;
  // Element (n, h, w, c): its index + 1, so that a zero-filled element differs from every element.
  std::vector<uint16_t> host(size_t(g.n) * g.h * g.w * channels);
  for (size_t i = 0; i < host.size(); ++i) host[i] = uint16_t(i + 1);
  void* global = nullptr;
  uint8_t* out = nullptr;
  CHECK(cudaMalloc(&global, host.size() * 2));
  CHECK(cudaMalloc(&out, kBoxBytes));
  CHECK(cudaMemcpy(global, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
  // The map as the convolution's launcher builds it: corners at the first
  // taps of the first and last windows, traversal strides the convolution's.
  const int upper_w = (q - 1) * g.stride - g.pad - (g.w - 1), upper_h = (p - 1) * g.stride - g.pad - (g.h - 1);
  const sim::hopper_model::Im2colBox box{
      {channels, g.w, g.h, g.n}, {-g.pad, -g.pad}, {upper_w, upper_h}, {uint32_t(g.stride), uint32_t(g.stride)}};
  CUtensorMap map;
  const cuuint64_t dims[4] = {cuuint64_t(channels), cuuint64_t(g.w), cuuint64_t(g.h), cuuint64_t(g.n)};
  const cuuint64_t strides[3] = {cuuint64_t(channels) * 2, cuuint64_t(g.w * channels) * 2,
                                 cuuint64_t(g.h * g.w * channels) * 2};
  const cuuint32_t traversal[4] = {1, cuuint32_t(g.stride), cuuint32_t(g.stride), 1};
  if (encode(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4, global, dims, strides, box.lower, box.upper, kBoxChannels, kPixels,
             traversal, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_NONE,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    std::printf("im2col: cuTensorMapEncodeIm2col failed\n");
    return 1;
  }
  using ATile = SwizzledOperandTile<kPixels, true>;
  int wrong = 0, boxes = 0;
  std::vector<uint16_t> smem(kBoxBytes / 2);
  for (const int m0 : {0, q + 1, pixels - 1 - (pixels - 1) % kPixels, pixels - 5})
    for (int r = 0; r < g.r; ++r)
      for (int s = 0; s < g.s; ++s, ++boxes) {
        const int image = m0 / (p * q), oh = m0 % (p * q) / q, ow = m0 % q;
        const int64_t start[4] = {0, ow * g.stride - g.pad, oh * g.stride - g.pad, image};
        im2col_probe<<<1, 128>>>(map, 0, int(start[1]), int(start[2]), image, uint16_t(s * g.dilation),
                                 uint16_t(r * g.dilation), kBoxBytes, out);
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpy(smem.data(), out, kBoxBytes, cudaMemcpyDeviceToHost));
        for (int pixel = 0; pixel < kPixels; ++pixel)
          for (int c = 0; c < kBoxChannels; ++c) {
            const auto e = sim::hopper_model::im2col_element(box, start, s * g.dilation, r * g.dilation, pixel, c);
            const bool inside = e.at[0] < channels && e.at[1] >= 0 && e.at[1] < g.w && e.at[2] >= 0 &&
                                e.at[2] < g.h && e.at[3] >= 0 && e.at[3] < g.n;
            const uint16_t expected =
                inside ? host[((size_t(e.at[3]) * g.h + e.at[2]) * g.w + e.at[1]) * channels + c] : 0;
            const uint16_t got = smem[ATile::offset(pixel, c) / 2];
            if (got != expected && wrong++ < 8)
              std::printf("im2col from output pixel %d, tap (%d, %d): pixel %d channel %d holds 0x%04x, the model "
                          "says 0x%04x\n", m0, r, s, pixel, c, got, expected);
          }
      }
  std::printf("im2col %dx%dx%dx%d, %dx%d taps, stride %d, pad %d, dilation %d: %d boxes %s\n", g.n, g.h, g.w,
              g.channels, g.r, g.s, g.stride, g.pad, g.dilation, boxes, wrong ? "WRONG" : "ok");
  CHECK(cudaFree(global));
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
  // The wide tile's wgmma and the narrow tiles' (m64n128k16, m64n64k16), on every pair of layouts.
  failed += probe_wgmma<256, true, true>() + probe_wgmma<256, true, false>() + probe_wgmma<256, false, true>() +
            probe_wgmma<256, false, false>();
  failed += probe_wgmma<128, true, true>() + probe_wgmma<128, true, false>() + probe_wgmma<128, false, true>() +
            probe_wgmma<128, false, false>();
  failed += probe_wgmma<64, true, true>() + probe_wgmma<64, true, false>() + probe_wgmma<64, false, true>() +
            probe_wgmma<64, false, false>();
  CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeIm2col", &fn, 12000, cudaEnableDefault, &found));
  const EncodeIm2col encode_im2col = reinterpret_cast<EncodeIm2col>(fn);
  // ResNet-50's 3x3 (stride 1 and 2) and 1x1 stride-2 shapes, small; a dilated one with 24 channels.
  failed += probe_im2col(encode_im2col, {3, 9, 9, 64, 3, 3, 1, 1, 1});
  failed += probe_im2col(encode_im2col, {3, 15, 15, 64, 3, 3, 2, 1, 1});
  failed += probe_im2col(encode_im2col, {2, 14, 14, 64, 1, 1, 2, 0, 1});
  failed += probe_im2col(encode_im2col, {2, 12, 11, 24, 3, 2, 1, 2, 2});
  CHECK(cudaDeviceSynchronize());
  std::printf("%s\n", failed ? "PROBES FAILED" : "all probes match the kernel's index code");
  return failed ? 1 : 0;
}
