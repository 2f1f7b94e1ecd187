// The gated MLP's elementwise passes: forward p = act(g) * u, backward dg =
// dp * u * act'(g), du = dp * act(g) and p again, over `count` contiguous
// elements of one 16-bit type, in fp32, each result rounded once.
//
// Why one pass each: torch.amp runs the forward as two passes (the
// activation, the multiply: 10 bytes an element) and the backward as three
// (the multiply's two gradients, the activation's: 18 bytes), and keeps g,
// act(g), u and p for backward. These read g and u once a pass (6 and 12
// bytes) and keep only g and u: backward writes p again for the down
// projection's weight gradient.
//
// Tiling: one thread a 16-byte run of 8 elements (one load of each input,
// one store of each output) where every tensor's base is 16-byte aligned,
// then one thread an element of the last count % 8 (of all of them where
// some base is not). No loop: a grid of 2^31 - 1 blocks covers 4 * 10^12
// elements. The activation is a template parameter, so each kernel holds
// one function.
#include <cstdint>
#include <type_traits>

#include "common/element_traits.cuh"
#include "common/math.h"
#include "common/vector_access.cuh"
#include "gated/gated.h"

namespace mpgemm::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kVector = 8;  // 16-bit elements in 16 bytes
constexpr int64_t kMaxBlocks = (int64_t(1) << 31) - 1;  // gridDim.x's limit

template <class T, GateActivation kActivation, int kWidth>
__device__ __forceinline__ void forward_step(const GatedTensors& t, int64_t i) {
  float g[kWidth], u[kWidth], p[kWidth];
  load<T, kWidth>(t.gate, i, g);
  load<T, kWidth>(t.up, i, u);
#pragma unroll
  for (int e = 0; e < kWidth; ++e) p[e] = gate_value(kActivation, g[e]) * u[e];
  store<T, kWidth>(t.out, i, p);
}

template <class T, GateActivation kActivation, int kWidth>
__device__ __forceinline__ void backward_step(const GatedTensors& t, int64_t i) {
  float dp[kWidth], g[kWidth], u[kWidth], dg[kWidth], du[kWidth], p[kWidth];
  load<T, kWidth>(t.grad, i, dp);
  load<T, kWidth>(t.gate, i, g);
  load<T, kWidth>(t.up, i, u);
#pragma unroll
  for (int e = 0; e < kWidth; ++e) {
    const GatedGrads r = gated_grads(kActivation, dp[e], g[e], u[e]);
    dg[e] = r.grad_gate, du[e] = r.grad_up, p[e] = r.out;
  }
  store<T, kWidth>(t.grad_gate, i, dg);
  store<T, kWidth>(t.grad_up, i, du);
  store<T, kWidth>(t.out, i, p);
}

// Threads below `vectors` take a run of kVector elements each, the next
// ones an element each of what the runs leave.
template <class T, GateActivation kActivation, bool kBackward>
__global__ void __launch_bounds__(kThreads) gated_kernel(GatedTensors t, int64_t vectors) {
  const int64_t thread = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (thread < vectors) {
    if constexpr (kBackward) backward_step<T, kActivation, kVector>(t, thread * kVector);
    else forward_step<T, kActivation, kVector>(t, thread * kVector);
    return;
  }
  const int64_t i = vectors * kVector + (thread - vectors);
  if (i >= t.count) return;
  if constexpr (kBackward) backward_step<T, kActivation, 1>(t, i);
  else forward_step<T, kActivation, 1>(t, i);
}

bool aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <bool kBackward>
cudaError_t launch(const GatedTensors& t, cudaStream_t stream) {
  if (t.count == 0) return cudaSuccess;
  if (t.type != ElementType::kFloat16 && t.type != ElementType::kBFloat16) return cudaErrorInvalidValue;
  const bool vectors_fit = aligned(t.gate) && aligned(t.up) && aligned(t.out) &&
                           (!kBackward || (aligned(t.grad) && aligned(t.grad_gate) && aligned(t.grad_up)));
  int64_t vectors = vectors_fit ? t.count / kVector : 0;
  const int64_t blocks = ceil_div(vectors + (t.count - vectors * kVector), int64_t(kThreads));
  if (blocks > kMaxBlocks) return cudaErrorInvalidConfiguration;
  const auto run = [&](auto tag, auto activation) {
    using T = typename decltype(tag)::type;
    GatedTensors params = t;
    void* args[] = {&params, &vectors};
    return cudaLaunchKernel(&gated_kernel<T, decltype(activation)::value, kBackward>, dim3(unsigned(blocks)),
                            dim3(kThreads), args, 0, stream);
  };
  const auto with_activation = [&](auto tag) {
    switch (t.activation) {
      case GateActivation::kSilu:
        return run(tag, std::integral_constant<GateActivation, GateActivation::kSilu>{});
      case GateActivation::kGelu:
        return run(tag, std::integral_constant<GateActivation, GateActivation::kGelu>{});
      default:
        return run(tag, std::integral_constant<GateActivation, GateActivation::kGeluTanh>{});
    }
  };
  return t.type == ElementType::kFloat16 ? with_activation(ElementTag<__half>{})
                                         : with_activation(ElementTag<__nv_bfloat16>{});
}

}  // namespace

cudaError_t launch_gated_forward(const GatedTensors& t, cudaStream_t stream) { return launch<false>(t, stream); }

cudaError_t launch_gated_backward(const GatedTensors& t, cudaStream_t stream) { return launch<true>(t, stream); }

}  // namespace mpgemm::kernels
