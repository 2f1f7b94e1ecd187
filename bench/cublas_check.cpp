// Cross-checks mpgemm's WMMA GEMM against cuBLAS on the GPU, without torch.
//
// For each case: random fp16 or bf16 operands from a fixed seed, mpgemm's
// launch_gemm into a NaN-filled output, cublasGemmStridedBatchedEx (the same
// inputs, fp32 out, CUBLAS_COMPUTE_32F) with bias and activation applied on the
// host afterwards, then ||out - ref|| / ||ref|| in double. Exits non-zero on
// any error >= 1e-3 (5e-3 for bf16 outputs), any NaN left in the output, or any
// CUDA/cuBLAS error. bf16 cases are skipped on GPUs older than sm_80.
//
// The larger cases are also timed (median of a few runs). That is a quick
// sanity timing to spot a gross slowdown, not the benchmark.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/epilogue_math.h"
#include "common/gemm_params.h"
#include "gemm/launch.h"

namespace {

using mpgemm::kernels::Activation;
using mpgemm::kernels::ElementType;
using mpgemm::kernels::GemmParams;

constexpr double kTolerance = 1e-3;
// A bf16 output keeps 8 significant bits: its one rounding errs by up to 2^-8
// (3.9e-3) of each element, so by less than that in the norm.
constexpr double kBFloat16OutTolerance = 5e-3;
constexpr int kWarmupRuns = 3;
constexpr int kTimedRuns = 10;

// Errors unwind to main, which reports them and exits non-zero.
void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

void check_cublas(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + ": " + cublasGetStatusName(status) + ": " +
                             cublasGetStatusString(status));
}

#define CUDA_CHECK(call) check_cuda((call), #call)
#define CUBLAS_CHECK(call) check_cublas((call), #call)

enum class Bias { kNone, kFloat16, kFloat32, kBFloat16 };

struct Case {
  int64_t batch, m, n, k;
  bool a_row_major, b_row_major;
  bool a_broadcast = false, b_broadcast = false;  // batch stride 0
  Bias bias = Bias::kNone;
  Activation activation = Activation::kNone;
  ElementType out = ElementType::kFloat32;
  bool timed = false;
  ElementType input = ElementType::kFloat16;  // of A and B
};

constexpr ElementType kF16 = ElementType::kFloat16, kBF16 = ElementType::kBFloat16, kF32 = ElementType::kFloat32;

const std::vector<Case> kCases = {
    {1, 1, 1, 1, true, true},
    {1, 1, 1, 1, false, false},
    {1, 127, 255, 129, true, true},
    {1, 127, 255, 129, false, true},
    {1, 127, 255, 129, true, false},
    {1, 127, 255, 129, false, false},
    {1, 1, 300, 77, true, true},
    {1, 300, 1, 77, false, false},
    {1, 33, 17, 2049, true, false},
    {1, 128, 128, 128, true, true, false, false, Bias::kNone, Activation::kNone, ElementType::kFloat16},
    {1, 64, 80, 96, true, true, false, false, Bias::kFloat32, Activation::kRelu},
    {1, 257, 129, 65, false, false, false, false, Bias::kFloat16, Activation::kGelu, ElementType::kFloat16},
    {1, 200, 136, 40, true, false, false, false, Bias::kFloat32, Activation::kGelu, ElementType::kFloat32},
    {1, 96, 72, 31, false, true, false, false, Bias::kFloat16, Activation::kRelu, ElementType::kFloat16},
    {4, 192, 160, 72, true, false, true, false},
    {3, 100, 37, 53, false, true, false, true, Bias::kFloat32, Activation::kGelu, ElementType::kFloat16},
    {5, 64, 64, 64, true, true, false, false, Bias::kFloat16, Activation::kRelu},
    {1, 1024, 1024, 1024, true, false, false, false, Bias::kFloat16, Activation::kGelu, ElementType::kFloat16, true},
    {8, 512, 512, 512, true, true, false, true, Bias::kNone, Activation::kNone, ElementType::kFloat32, true},
    {1, 2048, 2048, 2048, true, true, false, false, Bias::kNone, Activation::kNone, ElementType::kFloat32, true},
    {1, 2048, 2048, 2048, false, false, false, false, Bias::kNone, Activation::kNone, ElementType::kFloat16, true},
    {1, 2048, 2048, 2048, true, true, false, false, Bias::kFloat32, Activation::kRelu, ElementType::kFloat16, true},
    // bf16 inputs (sm_80 and newer).
    {1, 127, 255, 129, false, true, false, false, Bias::kNone, Activation::kNone, kF32, false, kBF16},
    {1, 257, 129, 65, true, false, false, false, Bias::kBFloat16, Activation::kGelu, kBF16, false, kBF16},
    {3, 100, 37, 53, false, false, false, true, Bias::kFloat16, Activation::kRelu, kF32, false, kBF16},
    {4, 192, 160, 72, true, true, true, false, Bias::kFloat32, Activation::kNone, kBF16, false, kBF16},
    {1, 2048, 2048, 2048, true, true, false, false, Bias::kNone, Activation::kNone, kF32, true, kBF16},
    {1, 2048, 2048, 2048, false, false, false, false, Bias::kNone, Activation::kNone, kBF16, true, kBF16},
};

const char* activation_name(Activation a) {
  return a == Activation::kRelu ? "relu" : a == Activation::kGelu ? "gelu" : "none";
}

const char* type_name(ElementType t) {
  return t == ElementType::kFloat16 ? "f16" : t == ElementType::kBFloat16 ? "bf16" : "f32";
}

ElementType bias_type(Bias b) { return b == Bias::kFloat16 ? kF16 : b == Bias::kBFloat16 ? kBF16 : kF32; }

const char* bias_name(Bias b) { return b == Bias::kNone ? "none" : type_name(bias_type(b)); }

cudaDataType_t cuda_type(ElementType t) {
  return t == ElementType::kFloat16 ? CUDA_R_16F : t == ElementType::kBFloat16 ? CUDA_R_16BF : CUDA_R_32F;
}

size_t element_size(ElementType t) { return t == ElementType::kFloat32 ? sizeof(float) : sizeof(uint16_t); }

// v in a 16-bit `type`, as its bits, and back.
uint16_t to_bits(ElementType type, float v) {
  if (type == ElementType::kBFloat16) return __bfloat16_as_ushort(__float2bfloat16(v));
  return __half_as_ushort(__float2half(v));
}
float from_bits(ElementType type, uint16_t bits) {
  if (type == ElementType::kBFloat16) return __bfloat162float(__ushort_as_bfloat16(bits));
  return __half2float(__ushort_as_half(bits));
}

template <class T>
struct DeviceBuffer {
  T* ptr = nullptr;
  explicit DeviceBuffer(size_t count) {
    CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr), std::max<size_t>(count, 1) * sizeof(T)));
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept : ptr(std::exchange(other.ptr, nullptr)) {}
  DeviceBuffer& operator=(DeviceBuffer&&) = delete;
  ~DeviceBuffer() { cudaFree(ptr); }
};

template <class T>
DeviceBuffer<T> upload(const std::vector<T>& host) {
  DeviceBuffer<T> buffer(host.size());
  CUDA_CHECK(cudaMemcpy(buffer.ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  return buffer;
}

// `count` random values in a 16-bit `type`, as their bits.
std::vector<uint16_t> random_16bit(ElementType type, size_t count, std::mt19937& gen) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<uint16_t> out(count);
  for (auto& x : out) x = to_bits(type, dist(gen));
  return out;
}

// Median of kTimedRuns calls of `run`, in milliseconds, after kWarmupRuns.
template <class F>
float median_ms(F&& run) {
  cudaEvent_t start, stop;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < kWarmupRuns; ++i) run();
  std::vector<float> times;
  for (int i = 0; i < kTimedRuns; ++i) {
    CUDA_CHECK(cudaEventRecord(start));
    run();
    CUDA_CHECK(cudaEventRecord(stop));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    times.push_back(ms);
  }
  CUDA_CHECK(cudaEventDestroy(start));
  CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Runs one case; returns true when it passes.
bool run_case(const Case& c, cublasHandle_t handle, std::mt19937& gen) {
  const int64_t a_batches = c.a_broadcast ? 1 : c.batch;
  const int64_t b_batches = c.b_broadcast ? 1 : c.batch;
  const DeviceBuffer<uint16_t> a = upload(random_16bit(c.input, a_batches * c.m * c.k, gen));
  const DeviceBuffer<uint16_t> b = upload(random_16bit(c.input, b_batches * c.k * c.n, gen));

  std::vector<float> bias_host(c.bias == Bias::kNone ? 0 : c.n);
  std::vector<uint16_t> bias_bits;
  for (auto& x : bias_host) x = std::uniform_real_distribution<float>(-1.0f, 1.0f)(gen);
  if (c.bias == Bias::kFloat16 || c.bias == Bias::kBFloat16) {
    for (auto& x : bias_host) {
      bias_bits.push_back(to_bits(bias_type(c.bias), x));
      x = from_bits(bias_type(c.bias), bias_bits.back());  // the reference sees the rounded values
    }
  }
  const DeviceBuffer<float> bias32 = upload(c.bias == Bias::kFloat32 ? bias_host : std::vector<float>{});
  const DeviceBuffer<uint16_t> bias16 = upload(bias_bits);

  const int64_t out_count = c.batch * c.m * c.n;
  const size_t out_elem = element_size(c.out);
  DeviceBuffer<unsigned char> d(out_count * out_elem);
  DeviceBuffer<float> ref(out_count);
  // All-ones bytes are NaN in fp16, bf16 and fp32, so any element the kernel skips shows up.
  CUDA_CHECK(cudaMemset(d.ptr, 0xFF, out_count * out_elem));
  CUDA_CHECK(cudaMemset(ref.ptr, 0xFF, out_count * sizeof(float)));

  GemmParams p;
  p.batch = c.batch, p.m = c.m, p.n = c.n, p.k = c.k;
  p.ab_type = c.input;
  p.a = a.ptr;
  p.a_batch_stride = c.a_broadcast ? 0 : c.m * c.k;
  p.a_row_stride = c.a_row_major ? c.k : 1;
  p.a_col_stride = c.a_row_major ? 1 : c.m;
  p.b = b.ptr;
  p.b_batch_stride = c.b_broadcast ? 0 : c.k * c.n;
  p.b_row_stride = c.b_row_major ? c.n : 1;
  p.b_col_stride = c.b_row_major ? 1 : c.k;
  p.bias = c.bias == Bias::kNone      ? nullptr
           : c.bias == Bias::kFloat32 ? static_cast<const void*>(bias32.ptr)
                                      : static_cast<const void*>(bias16.ptr);
  p.bias_type = bias_type(c.bias);
  p.activation = c.activation;
  p.d = d.ptr;
  p.d_type = c.out;
  p.d_batch_stride = c.m * c.n;
  p.d_row_stride = c.n;

  // cuBLAS is column-major: the row-major D (m x n) is the column-major D^T
  // (n x m) = B^T A^T. A row-major operand read column-major is already its
  // transpose, so it goes in untransposed; a column-major one needs op T.
  const float alpha = 1.0f, beta = 0.0f;
  auto run_cublas = [&] {
    CUBLAS_CHECK(cublasGemmStridedBatchedEx(
        handle, c.b_row_major ? CUBLAS_OP_N : CUBLAS_OP_T, c.a_row_major ? CUBLAS_OP_N : CUBLAS_OP_T,
        static_cast<int>(c.n), static_cast<int>(c.m), static_cast<int>(c.k), &alpha, b.ptr, cuda_type(c.input),
        static_cast<int>(c.b_row_major ? c.n : c.k), p.b_batch_stride, a.ptr, cuda_type(c.input),
        static_cast<int>(c.a_row_major ? c.k : c.m), p.a_batch_stride, &beta, ref.ptr, CUDA_R_32F,
        static_cast<int>(c.n), c.m * c.n, static_cast<int>(c.batch), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  };
  const mpgemm::kernels::GemmLaunch launch = mpgemm::kernels::plan_gemm(p);
  DeviceBuffer<unsigned char> workspace(launch.workspace_bytes);
  auto run_mpgemm = [&] { CUDA_CHECK(mpgemm::kernels::launch_gemm(p, launch, workspace.ptr, nullptr)); };

  run_mpgemm();
  run_cublas();
  CUDA_CHECK(cudaDeviceSynchronize());

  std::vector<float> out(out_count), expected(out_count);
  if (c.out != ElementType::kFloat32) {
    std::vector<uint16_t> out16(out_count);
    CUDA_CHECK(cudaMemcpy(out16.data(), d.ptr, out_count * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    std::transform(out16.begin(), out16.end(), out.begin(), [&](uint16_t x) { return from_bits(c.out, x); });
  } else {
    CUDA_CHECK(cudaMemcpy(out.data(), d.ptr, out_count * sizeof(float), cudaMemcpyDeviceToHost));
  }
  CUDA_CHECK(cudaMemcpy(expected.data(), ref.ptr, out_count * sizeof(float), cudaMemcpyDeviceToHost));

  int64_t nans = 0;
  double diff2 = 0, ref2 = 0;
  for (int64_t i = 0; i < out_count; ++i) {
    float r = expected[i];
    if (!bias_host.empty()) r += bias_host[i % c.n];
    r = mpgemm::kernels::apply_activation(c.activation, r);
    if (std::isnan(out[i]) || std::isnan(r)) {
      ++nans;
      continue;
    }
    const double delta = static_cast<double>(out[i]) - r;
    diff2 += delta * delta;
    ref2 += static_cast<double>(r) * r;
  }
  const double rel = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
  const bool pass = nans == 0 && rel < (c.out == ElementType::kBFloat16 ? kBFloat16OutTolerance : kTolerance);

  std::printf("%2lldx%5lldx%5lldx%5lld  in %-4s A %s%s  B %s%s  bias %-4s act %-4s out %-4s  rel_err %.3e%s  %s\n",
              static_cast<long long>(c.batch), static_cast<long long>(c.m), static_cast<long long>(c.n),
              static_cast<long long>(c.k), type_name(c.input), c.a_row_major ? "row" : "col", c.a_broadcast ? "(bcast)" : "       ",
              c.b_row_major ? "row" : "col", c.b_broadcast ? "(bcast)" : "       ", bias_name(c.bias),
              activation_name(c.activation), type_name(c.out), rel,
              nans ? (" NaN x" + std::to_string(nans)).c_str() : "", pass ? "PASS" : "FAIL");

  if (c.timed) {
    const double flop = 2.0 * c.batch * c.m * c.n * c.k;
    const float mp_ms = median_ms(run_mpgemm);
    const float cb_ms = median_ms(run_cublas);
    // The cuBLAS time leaves out the bias/activation, done on the host here.
    std::printf("    sanity timing (not the benchmark): mpgemm %.3f ms %.1f TFLOP/s, cuBLAS %.3f ms %.1f TFLOP/s, "
                "mpgemm/cuBLAS throughput %.2f\n",
                mp_ms, flop / (mp_ms * 1e9), cb_ms, flop / (cb_ms * 1e9), cb_ms / mp_ms);
  }
  std::fflush(stdout);
  return pass;
}

}  // namespace

int main() {
  try {
    int device = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    cudaDeviceProp prop{};
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    std::printf("device: %s (sm_%d%d), tolerance rel_err < %.0e\n", prop.name, prop.major, prop.minor, kTolerance);

    cublasHandle_t handle;
    CUBLAS_CHECK(cublasCreate(&handle));
    std::mt19937 gen(20240607);
    int failed = 0, skipped = 0;
    for (const Case& c : kCases) {
      if (c.input == ElementType::kBFloat16 && prop.major < 8) {
        ++skipped;  // no bf16 Tensor Cores
        continue;
      }
      failed += run_case(c, handle, gen) ? 0 : 1;
    }
    CUBLAS_CHECK(cublasDestroy(handle));

    std::printf("%d of %zu cases failed, %d skipped (bf16 needs sm_80)\n", failed, kCases.size() - skipped, skipped);
    return failed ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
