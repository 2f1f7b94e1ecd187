// The ops' shared pieces: argument validation (one path for every backend,
// Meta included) and the per-backend implementations.
#pragma once

#include <array>
#include <initializer_list>
#include <optional>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include "amp/loss_scale.h"
#include "common/gemm_params.h"
#include "gated/gated_math.h"
#include "norm/max_pool_window.h"

namespace mpgemm {

// A validated gemm call. Size is int64_t for real tensors and c10::SymInt for
// fake ones, so torch.compile traces through the same checks.
template <class Size>
struct GemmProblem {
  Size batch, m, n, k;
  std::vector<Size> out_shape;  // (batch, m, n) if either operand is 3-D, else (m, n)
  at::ScalarType input_dtype;   // of the Tensor Core product: at::kHalf or at::kBFloat16
  at::ScalarType out_dtype;     // at::kFloat or input_dtype
  kernels::Activation activation;
  const char* op = "mpgemm.gemm";  // the op checked, for the backends' messages
};

template <class Size>
GemmProblem<Size> check_gemm_args(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                                  std::optional<std::string_view> activation,
                                  std::optional<at::ScalarType> out_dtype);

// mpgemm.linear as a gemm: x (..., in_features) flattened to (m, k), weight
// (out_features, in_features) read as (k, n); out_shape is (..., out_features).
template <class Size>
GemmProblem<Size> check_linear_args(const at::Tensor& x, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, std::optional<std::string_view> activation,
                                    std::optional<at::ScalarType> out_dtype);

// The arguments of the internal ops `op` names, _cublas_gemm,
// _gemm_row_sums and _gemm_activation_grad: gemm's, 2-D only, with no
// epilogue.
template <class Size>
GemmProblem<Size> check_2d_gemm_args(const char* op, const at::Tensor& a, const at::Tensor& b,
                                     std::optional<at::ScalarType> out_dtype);

// _gemm_activation_grad's: 2-D a (M, K) and b (K, N) of one 16-bit type,
// activation_input (M, N) of that type, activation "relu", "gelu" or
// "gelu_tanh"; the result in the inputs' type.
template <class Size>
GemmProblem<Size> check_activation_grad_args(const at::Tensor& a, const at::Tensor& b,
                                             const at::Tensor& activation_input, std::string_view activation);

// mlp's: x (..., in_features), w1 (hidden, in_features), w2 (out_features,
// hidden), optional biases (hidden,) and (out_features,), activation "relu",
// "gelu" or "gelu_tanh". Returns the 16-bit type of both products (bf16 where any of x,
// w1, w2 is, else fp16; fp16 with bf16 refused).
template <class Size>
at::ScalarType check_mlp_args(const at::Tensor& x, const at::Tensor& w1, const std::optional<at::Tensor>& b1,
                              const at::Tensor& w2, const std::optional<at::Tensor>& b2, std::string_view activation);

// gated_mlp's: x (..., in_features), w_gate and w_up (hidden, in_features),
// w_down (out_features, hidden), optional biases (hidden,), (hidden,) and
// (out_features,), activation "silu", "gelu" or "gelu_tanh". Returns the
// 16-bit type of the three products (bf16 where any of x and the weights
// is, else fp16; fp16 with bf16 refused).
template <class Size>
at::ScalarType check_gated_mlp_args(const at::Tensor& x, const at::Tensor& w_gate,
                                    const std::optional<at::Tensor>& b_gate, const at::Tensor& w_up,
                                    const std::optional<at::Tensor>& b_up, const at::Tensor& w_down,
                                    const std::optional<at::Tensor>& b_down, std::string_view activation);
kernels::GateActivation parse_gate_activation(const char* op, std::string_view activation);

// The gated MLP's elementwise passes over gate, up (and grad) of one shape
// and one 16-bit type, contiguous (kernels/gated/gated.h): the forward's
// act(gate) * up; the backward's (grad_gate, grad_up, act(gate) * up).
using GatedGrads = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
at::Tensor gated_activation_cuda(const at::Tensor& gate, const at::Tensor& up, kernels::GateActivation activation);
GatedGrads gated_activation_backward_cuda(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up,
                                          kernels::GateActivation activation);

// Checks a caller-provided output against the problem.
void check_gemm_out(const GemmProblem<int64_t>& problem, const at::Tensor& a, const at::Tensor& out);

// What a GEMM backend writes besides `out`, where given: the pre-activation
// (a tensor laid out as `out`), a @ b + bias before the activation, rounded
// to its dtype; A's row sums over K (fp32, (m,); 2-D a only), summed from
// a's 16-bit elements.
struct GemmSideTensors {
  at::Tensor* pre_activation = nullptr;
  at::Tensor* a_row_sums = nullptr;
  // Read, where given: the activation's input Z ((m, n), contiguous, of the
  // product's input dtype). `out` is then a @ b times the activation's
  // derivative at Z (kernels::GemmParams::activation_input), rounded once;
  // no bias, 2-D a and b.
  const at::Tensor* activation_input = nullptr;
};

// Backends: write activation(a @ b + bias) into `out`, already checked, and
// what `side` asks for.
void gemm_cpu_into(const GemmProblem<int64_t>& problem, const at::Tensor& a, const at::Tensor& b,
                   const std::optional<at::Tensor>& bias, at::Tensor& out, const GemmSideTensors& side);
void gemm_cuda_into(const GemmProblem<int64_t>& problem, const at::Tensor& a, const at::Tensor& b,
                    const std::optional<at::Tensor>& bias, at::Tensor& out, const GemmSideTensors& side);

// A validated conv2d call: x (N, C, H, W), weight (K, C / groups, R, S), output
// (N, K, P, Q). Padding is (top, bottom, left, right).
template <class Size>
struct ConvProblem {
  Size n, c, h, w, k, r, s, p, q;
  int64_t groups;
  std::array<int64_t, 2> stride, dilation;
  std::array<int64_t, 4> padding;
  at::ScalarType input_dtype;  // of the Tensor Core product: at::kHalf or at::kBFloat16
  at::ScalarType out_dtype;    // at::kFloat or input_dtype
  bool channels_last;  // of x; the output follows it
  const char* op;      // the op checked, for the backends' messages
};

template <class Size>
ConvProblem<Size> check_conv2d_args(const char* op, const at::Tensor& x, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                                    at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                                    std::optional<at::ScalarType> out_dtype);

// Backends of conv2d and its two gradients. Tensors are rounded to the
// problem's input_dtype first; products are summed in fp32.
at::Tensor conv2d_cpu(const ConvProblem<int64_t>& problem, const at::Tensor& x, const at::Tensor& weight,
                      const std::optional<at::Tensor>& bias);
at::Tensor conv2d_grad_input_cpu(const ConvProblem<int64_t>& problem, const at::Tensor& grad_out,
                                 const at::Tensor& x, const at::Tensor& weight);
at::Tensor conv2d_grad_weight_cpu(const ConvProblem<int64_t>& problem, const at::Tensor& grad_out,
                                  const at::Tensor& x, const at::Tensor& weight);
at::Tensor conv2d_cuda(const ConvProblem<int64_t>& problem, const at::Tensor& x, const at::Tensor& weight,
                       const std::optional<at::Tensor>& bias);
at::Tensor conv2d_grad_input_cuda(const ConvProblem<int64_t>& problem, const at::Tensor& grad_out,
                                  const at::Tensor& x, const at::Tensor& weight);
at::Tensor conv2d_grad_weight_cuda(const ConvProblem<int64_t>& problem, const at::Tensor& grad_out,
                                   const at::Tensor& x, const at::Tensor& weight);

// _conv2d_grad_input_add: conv2d_grad_input plus `addend` (x's shape and
// dtype, any layout), the sum in fp32 rounded once to x's dtype: the CPU
// backend always, the CUDA backend where the dgrad's epilogue adds it
// (kernels::Conv2dPlan::addend_in_epilogue; elsewhere it adds the rounded
// gradient and the addend after the pass, as torch's add would).
at::Tensor conv2d_grad_input_add_cpu(const ConvProblem<int64_t>& problem, const at::Tensor& grad_out,
                                     const at::Tensor& x, const at::Tensor& weight, const at::Tensor& addend);
at::Tensor conv2d_grad_input_add_cuda(const ConvProblem<int64_t>& problem, const at::Tensor& grad_out,
                                      const at::Tensor& x, const at::Tensor& weight, const at::Tensor& addend);
// Checks the addend of _conv2d_grad_input_add against x: its shape, dtype and device.
void check_conv2d_grad_input_addend(const char* op, const at::Tensor& x, const at::Tensor& addend);

// conv2d_batch_stats: conv2d's output y and its batch statistics for a
// training batch norm after it, batch_mean_var (2, K) fp32: each channel's
// mean and biased variance over (N, P, Q) of y as stored. The CUDA backend
// gathers them in the convolution's epilogue where its kernels can (Conv2dPlan::moment_rows), and
// otherwise, as the CPU backend does, from y (batch_mean_var_of).
using ConvWithBatchStats = std::tuple<at::Tensor, at::Tensor>;
ConvWithBatchStats conv2d_batch_stats_cpu(const ConvProblem<int64_t>& problem, const at::Tensor& x,
                                          const at::Tensor& weight, const std::optional<at::Tensor>& bias);
ConvWithBatchStats conv2d_batch_stats_cuda(const ConvProblem<int64_t>& problem, const at::Tensor& x,
                                           const at::Tensor& weight, const std::optional<at::Tensor>& bias);
at::Tensor batch_mean_var_of(const at::Tensor& y);

// Checks the output gradient of a conv2d against its problem: (N, K, P, Q),
// fp32 or the problem's input_dtype.
void check_conv2d_grad_out(const char* op, const ConvProblem<int64_t>& problem, const at::Tensor& x,
                           const at::Tensor& grad_out);

// The kernels' name for a dtype the checks let through (fp16, bf16 or fp32).
inline kernels::ElementType element_type(at::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf: return kernels::ElementType::kFloat16;
    case at::kBFloat16: return kernels::ElementType::kBFloat16;
    default: return kernels::ElementType::kFloat32;
  }
}

// The memory format of a conv2d's x, which its output follows.
template <class Size>
at::MemoryFormat memory_format_of(const ConvProblem<Size>& problem) {
  return problem.channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
}

// unscale_grads_: outs[i] = grads[i] * inv_scale, found_inf = 1 on any inf/NaN.
void check_unscale_args(at::TensorList grads, at::TensorList outs, const at::Tensor& found_inf,
                        const at::Tensor& inv_scale);
void unscale_grads_cpu(at::TensorList grads, at::TensorList outs, at::Tensor& found_inf, const at::Tensor& inv_scale);
void unscale_grads_cuda(at::TensorList grads, at::TensorList outs, at::Tensor& found_inf,
                        const at::Tensor& inv_scale);

// update_loss_scale_: the scale (fp32, 0-dim) and its counters (int64, one
// per kernels::LossScaleCounter) updated in place after a step whose overflow
// flag is found_inf (fp32, one element), all on one device.
void check_update_loss_scale_args(const at::Tensor& scale, const at::Tensor& counters, const at::Tensor& found_inf);
// A switch of the environment (the kernels' plan/switches.h): true where
// `name` is "1", false where it is "0", `default_on` where it is unset or
// empty; any other value is refused (a ValueError).
bool environment_switch(const char* name, bool default_on = false);
// MPGEMM_LOSS_SCALE_KERNEL: unset or "1" runs the one-thread kernel's function
// (kernels/amp/loss_scale.h), "0" a few tensor ops (any device), the way
// before the kernel passed the GPU tests (H200, 2026-11-29).
inline bool loss_scale_kernel_enabled() { return environment_switch("MPGEMM_LOSS_SCALE_KERNEL", true); }
void update_loss_scale_with_tensor_ops(at::Tensor& scale, at::Tensor& counters, const at::Tensor& found_inf,
                                       const kernels::LossScaleRule& rule);
void update_loss_scale_cpu(at::Tensor& scale, at::Tensor& counters, const at::Tensor& found_inf,
                           const kernels::LossScaleRule& rule);
void update_loss_scale_cuda(at::Tensor& scale, at::Tensor& counters, const at::Tensor& found_inf,
                            const kernels::LossScaleRule& rule);

// Batch norm with its residual add and ReLU over y (N, C, H, W), fp32,
// fp16 or bf16 in any memory format, with per-channel vectors of C fp32
// values and tensors of y's shape and dtype; every result of y's shape has
// its dtype and memory format. kernels/norm/batch_norm.h has the formulas.
// check_batch_norm_args names op's arguments: y, the per-channel vectors,
// the tensors of y's shape.
using NamedTensor = std::pair<const at::Tensor*, const char*>;
void check_batch_norm_args(const char* op, const at::Tensor& y, std::initializer_list<NamedTensor> per_channel,
                           const std::vector<NamedTensor>& like_y = {});

// The gated MLP's elementwise ops' tensors (the first names the shape,
// dtype and device the others must have: one 16-bit type) and activation.
kernels::GateActivation check_gated_activation_args(const char* op, std::initializer_list<NamedTensor> tensors,
                                                    std::string_view activation);

// Layer norm over x's last dimensions (normalized_shape) as `rows` x `cols`:
// x fp16 or bf16; weight and bias (where given: fp16, bf16 or fp32, of
// normalized_shape) on x's device. Returns the shape.
struct LayerNormShape {
  c10::SymInt rows;
  int64_t cols;
};
LayerNormShape check_layer_norm_args(const char* op, const at::Tensor& x, at::IntArrayRef normalized_shape,
                                     const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias);
// _layer_norm_backward's grad (x's shape and dtype), mean and rstd ((rows,)
// fp32), all on x's device.
void check_layer_norm_backward_args(const char* op, const at::Tensor& x, const LayerNormShape& shape,
                                    const at::Tensor& grad, const at::Tensor& mean, const at::Tensor& rstd);
// The CUDA backend of mpgemm.layer_norm's two internal ops (csrc/layer_norm.cpp
// has the CPU one): contiguous x (and grad, x's type), weight and bias fp32
// contiguous or undefined. Forward: y, mean, rstd ((rows,) fp32). Backward:
// dx where want_x, and where want_weights the sums of dy * xhat and dy per
// column ((cols,) fp32), each an empty tensor where not asked for.
using LayerNormResult = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
LayerNormResult layer_norm_forward_cuda(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                                        int64_t rows, int64_t cols, double eps);
LayerNormResult layer_norm_backward_cuda(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& mean,
                                         const at::Tensor& rstd, const at::Tensor& weight, int64_t rows, int64_t cols,
                                         bool want_x, bool want_weights);

struct BatchNormForward {
  at::Tensor y;
  std::optional<at::Tensor> weight, bias, residual, running_mean, running_var;
  bool batch_stats, relu;
  double momentum, eps;
  // The batch's statistics where given ((2, C) fp32: mean, biased variance;
  // conv2d_batch_stats's), used instead of y's own (batch_stats only).
  std::optional<at::Tensor> batch_mean_var;
};

struct BatchNormBackward {
  at::Tensor grad_out;
  std::optional<at::Tensor> out, relu_mask;  // where the chain ends in a ReLU: its output, or out > 0 as bits
  at::Tensor y, mean, invstd, scale;
  bool batch_stats;
  std::array<bool, 3> output_mask;  // grad_y, the sums (gamma's and beta's gradients), grad_z
};

// out, mean, invstd, scale, shift, relu_mask
using BatchNormForwardResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using BatchNormBackwardResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;  // grad_y, sums, grad_z

// Whether the forward returns the ReLU's mask as bits: 16-bit y, a channel
// count that is a multiple of 8 (the CUDA backend also needs its tensors
// 16-byte aligned).
bool batch_norm_relu_mask_shape(const at::Tensor& y);

BatchNormForwardResult batch_norm_act_cpu(const BatchNormForward& args);
BatchNormBackwardResult batch_norm_act_backward_cpu(const BatchNormBackward& args);
BatchNormForwardResult batch_norm_act_cuda(const BatchNormForward& args);
BatchNormBackwardResult batch_norm_act_backward_cuda(const BatchNormBackward& args);
// batch_norm_apply's backends: y, scale and shift checked.
at::Tensor batch_norm_apply_cpu(const at::Tensor& y, const at::Tensor& scale, const at::Tensor& shift, bool relu);
at::Tensor batch_norm_apply_cuda(const at::Tensor& y, const at::Tensor& scale, const at::Tensor& shift, bool relu);

// A max pool fused into batch norm and ReLU (batch_norm_relu_max_pool):
// torch's MaxPool2d window, checked as torch checks it (positive kernel,
// stride and dilation; padding at most half the kernel; a non-empty
// output), with at most kernels::kMaxPoolTaps taps.
struct MaxPoolArgs {
  std::array<int64_t, 2> kernel, stride, padding, dilation;
  bool ceil_mode = false;
};
// The window over an input of height x width (N images): its output size
// as torch's pool computes it.
kernels::MaxPoolWindow max_pool_window(const MaxPoolArgs& pool, int64_t batch, int64_t height, int64_t width);
// out, mean, invstd, scale, shift, window (uint8, out's shape, channels_last:
// each element's tap | 0x80 where the ReLU passed)
BatchNormForwardResult batch_norm_relu_max_pool_cpu(const BatchNormForward& args, const MaxPoolArgs& pool);
BatchNormForwardResult batch_norm_relu_max_pool_cuda(const BatchNormForward& args, const MaxPoolArgs& pool);
// The pool's and ReLU's gradient before batch norm's, in grad_out's dtype,
// (N, C, height, width), channels_last.
at::Tensor max_pool_window_backward_cpu(const at::Tensor& grad_out, const at::Tensor& window,
                                        kernels::MaxPoolWindow pool);
at::Tensor max_pool_window_backward_cuda(const at::Tensor& grad_out, const at::Tensor& window,
                                         kernels::MaxPoolWindow pool);

// cuBLAS (cublasGemmEx, CUBLAS_COMPUTE_32F) on 2-D fp16 or bf16 operands: the baseline.
at::Tensor cublas_gemm_cuda(const at::Tensor& a, const at::Tensor& b, std::optional<at::ScalarType> out_dtype);

// _mma_ceiling: every (block, warp) slot of out = iterations rounds of
// acc += a @ b in fp32 (kernels::MmaCeilingTile fixes the shapes), the
// Tensor Cores' mma.sync rate with nothing else in the way.
void check_mma_ceiling_args(const at::Tensor& a, const at::Tensor& b, int64_t iterations, const at::Tensor& out);
void mma_ceiling_cpu(const at::Tensor& a, const at::Tensor& b, int64_t iterations, at::Tensor& out);
void mma_ceiling_cuda(const at::Tensor& a, const at::Tensor& b, int64_t iterations, at::Tensor& out);

}  // namespace mpgemm
