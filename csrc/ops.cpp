// The mpgemm operator library: schemas, their CPU, CUDA and Meta implementations,
// and the Python module that loading the library needs.
#include <Python.h>

#include <tuple>

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/MemoryOverlap.h>
#include <torch/library.h>

#include "common/tile_configs.h"
#include "ops.h"
#include "workspace.h"

namespace mpgemm {
namespace {

using GemmInto = void (*)(const GemmProblem<int64_t>&, const at::Tensor&, const at::Tensor&,
                          const std::optional<at::Tensor>&, at::Tensor&, const GemmSideTensors&);
using WithPreActivation = std::tuple<at::Tensor, at::Tensor>;
using WithRowSums = std::tuple<at::Tensor, at::Tensor>;

// The pre-activation ops take gemm's and linear's activations and GELU's
// tanh form, "gelu_tanh" (mlp's GPT-2 form: the Hopper pre-activation kernel
// applies it, the backends' own way elsewhere, kernels/gemm/launch.h): the
// activation for gemm's and linear's checks ("gelu" for the tanh form), and
// in `gelu_tanh` whether the problem's activation is then the tanh form.
constexpr char kGemmPreActivation[] = "mpgemm._gemm_pre_activation";
constexpr char kLinearPreActivation[] = "mpgemm._linear_pre_activation";

std::optional<std::string_view> pre_activation_checked(const char* op, std::optional<std::string_view> activation,
                                                        bool& gelu_tanh) {
  gelu_tanh = activation && *activation == "gelu_tanh";
  TORCH_CHECK_VALUE(!activation || gelu_tanh || *activation == "relu" || *activation == "gelu", op,
                    ": activation must be None, 'relu', 'gelu' or 'gelu_tanh', got '", *activation, "'");
  return gelu_tanh ? std::optional<std::string_view>("gelu") : activation;
}

template <GemmInto Into>
at::Tensor gemm(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                std::optional<std::string_view> activation, std::optional<at::ScalarType> out_dtype) {
  const auto problem = check_gemm_args<int64_t>(a, b, bias, activation, out_dtype);
  at::Tensor out = at::empty(problem.out_shape, a.options().dtype(problem.out_dtype));
  Into(problem, a, b, bias, out, {});
  return out;
}

template <GemmInto Into>
WithPreActivation gemm_pre_activation(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                                      std::optional<std::string_view> activation,
                                      std::optional<at::ScalarType> out_dtype) {
  bool gelu_tanh;
  auto problem = check_gemm_args<int64_t>(
      a, b, bias, pre_activation_checked(kGemmPreActivation, activation, gelu_tanh), out_dtype);
  if (gelu_tanh) problem.activation = kernels::Activation::kGeluTanh;
  at::Tensor out = at::empty(problem.out_shape, a.options().dtype(problem.out_dtype));
  at::Tensor pre_activation = at::empty_like(out);
  Into(problem, a, b, bias, out, {.pre_activation = &pre_activation});
  return {out, pre_activation};
}

template <GemmInto Into>
WithRowSums gemm_row_sums(const at::Tensor& a, const at::Tensor& b, std::optional<at::ScalarType> out_dtype) {
  const auto problem = check_2d_gemm_args<int64_t>("mpgemm._gemm_row_sums", a, b, out_dtype);
  at::Tensor out = at::empty(problem.out_shape, a.options().dtype(problem.out_dtype));
  at::Tensor a_row_sums = at::empty({problem.m}, a.options().dtype(at::kFloat));
  Into(problem, a, b, std::nullopt, out, {.a_row_sums = &a_row_sums});
  return {out, a_row_sums};
}

template <GemmInto Into>
at::Tensor gemm_activation_grad(const at::Tensor& a, const at::Tensor& b, const at::Tensor& activation_input,
                                std::string_view activation) {
  const auto problem = check_activation_grad_args<int64_t>(a, b, activation_input, activation);
  at::Tensor out = at::empty(problem.out_shape, a.options().dtype(problem.out_dtype));
  const at::Tensor z = activation_input.contiguous();
  Into(problem, a, b, std::nullopt, out, {.activation_input = &z});
  return out;
}

template <GemmInto Into>
void gemm_out(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                     std::optional<std::string_view> activation, at::Tensor& out) {
  const auto problem = check_gemm_args<int64_t>(a, b, bias, activation, out.scalar_type());
  check_gemm_out(problem, a, out);
  at::assert_no_overlap(out, a);
  at::assert_no_overlap(out, b);
  if (bias) at::assert_no_overlap(out, *bias);
  Into(problem, a, b, bias, out, {});
}

// fp32 operands are rounded to the product's input type here, for the Tensor
// Core product only: an fp32 weight stays the master copy. The (out, in)
// weight is read in place as a column-major (in, out) operand. With
// PreActivation, z = x @ weight.T + bias before the activation too, as y.
template <GemmInto Into, bool PreActivation>
auto linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
            std::optional<std::string_view> activation, std::optional<at::ScalarType> out_dtype) {
  bool gelu_tanh = false;
  auto problem = check_linear_args<int64_t>(
      x, weight, bias,
      PreActivation ? pre_activation_checked(kLinearPreActivation, activation, gelu_tanh) : activation,
      out_dtype);
  if (gelu_tanh) problem.activation = kernels::Activation::kGeluTanh;
  const at::Tensor a = x.reshape({problem.m, problem.k}).to(problem.input_dtype);
  const at::Tensor b = weight.to(problem.input_dtype).t();
  // Allocated in the output's shape, so that what is returned is no view
  // (FSDP2 warns about a module that returns one).
  const at::Tensor out = at::empty(problem.out_shape, x.options().dtype(problem.out_dtype));
  at::Tensor rows = out.view({problem.m, problem.n});
  if constexpr (PreActivation) {
    const at::Tensor pre_activation = at::empty_like(out);
    at::Tensor pre_activation_rows = pre_activation.view({problem.m, problem.n});
    Into(problem, a, b, bias, rows, {.pre_activation = &pre_activation_rows});
    return WithPreActivation{out, pre_activation};
  } else {
    Into(problem, a, b, bias, rows, {});
    return out;
  }
}

at::Tensor gemm_meta(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                     std::optional<std::string_view> activation, std::optional<at::ScalarType> out_dtype) {
  const auto problem = check_gemm_args<c10::SymInt>(a, b, bias, activation, out_dtype);
  return at::empty_symint(problem.out_shape, a.options().dtype(problem.out_dtype));
}

void gemm_out_meta(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                   std::optional<std::string_view> activation, at::Tensor& out) {
  check_gemm_args<c10::SymInt>(a, b, bias, activation, out.scalar_type());
}

at::Tensor linear_meta(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       std::optional<std::string_view> activation, std::optional<at::ScalarType> out_dtype) {
  const auto problem = check_linear_args<c10::SymInt>(x, weight, bias, activation, out_dtype);
  return at::empty_symint(problem.out_shape, x.options().dtype(problem.out_dtype));
}

template <at::Tensor (*Meta)(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                             std::optional<std::string_view>, std::optional<at::ScalarType>),
          const char* Op>
WithPreActivation pre_activation_meta(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                                      std::optional<std::string_view> activation,
                                      std::optional<at::ScalarType> out_dtype) {
  bool gelu_tanh;
  const at::Tensor out = Meta(a, b, bias, pre_activation_checked(Op, activation, gelu_tanh), out_dtype);
  return {out, at::empty_like(out)};
}

at::Tensor gemm_activation_grad_meta(const at::Tensor& a, const at::Tensor& b, const at::Tensor& activation_input,
                                     std::string_view activation) {
  const auto problem = check_activation_grad_args<c10::SymInt>(a, b, activation_input, activation);
  return at::empty_symint(problem.out_shape, a.options().dtype(problem.out_dtype));
}

WithRowSums gemm_row_sums_meta(const at::Tensor& a, const at::Tensor& b, std::optional<at::ScalarType> out_dtype) {
  const auto problem = check_2d_gemm_args<c10::SymInt>("mpgemm._gemm_row_sums", a, b, out_dtype);
  return {at::empty_symint(problem.out_shape, a.options().dtype(problem.out_dtype)),
          at::empty_symint({problem.m}, a.options().dtype(at::kFloat))};
}

template <void (*Impl)(at::TensorList, at::TensorList, at::Tensor&, const at::Tensor&)>
void unscale_grads(at::TensorList grads, at::TensorList outs, at::Tensor& found_inf, const at::Tensor& inv_scale) {
  check_unscale_args(grads, outs, found_inf, inv_scale);  // outs are dense: no internal overlap
  Impl(grads, outs, found_inf, inv_scale);
}

void unscale_grads_meta(at::TensorList grads, at::TensorList outs, at::Tensor& found_inf,
                        const at::Tensor& inv_scale) {
  check_unscale_args(grads, outs, found_inf, inv_scale);
}

template <void (*Impl)(at::Tensor&, at::Tensor&, const at::Tensor&, const kernels::LossScaleRule&)>
void update_loss_scale(at::Tensor& scale, at::Tensor& counters, const at::Tensor& found_inf, double growth_factor,
                       double backoff_factor, int64_t growth_interval, double min_scale, int64_t hysteresis,
                       bool dynamic) {
  check_update_loss_scale_args(scale, counters, found_inf);
  TORCH_CHECK_VALUE(growth_interval > 0 && hysteresis > 0,
                    "mpgemm.update_loss_scale_: expected growth_interval and hysteresis to be positive, got ",
                    growth_interval, " and ", hysteresis);
  Impl(scale, counters, found_inf,
       {float(growth_factor), float(backoff_factor), float(min_scale), growth_interval, hysteresis, dynamic});
}

void update_loss_scale_meta(at::Tensor& scale, at::Tensor& counters, const at::Tensor& found_inf, double, double,
                            int64_t, double, int64_t, bool) {
  check_update_loss_scale_args(scale, counters, found_inf);
}

using ConvForward = at::Tensor (*)(const ConvProblem<int64_t>&, const at::Tensor&, const at::Tensor&,
                                   const std::optional<at::Tensor>&);
using ConvGradient = at::Tensor (*)(const ConvProblem<int64_t>&, const at::Tensor&, const at::Tensor&,
                                    const at::Tensor&);

template <ConvForward Impl>
at::Tensor conv2d(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                  at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                  std::optional<at::ScalarType> out_dtype) {
  const auto problem =
      check_conv2d_args<int64_t>("mpgemm.conv2d", x, weight, bias, stride, padding, dilation, groups, out_dtype);
  return Impl(problem, x, weight, bias);
}

template <ConvWithBatchStats (*Impl)(const ConvProblem<int64_t>&, const at::Tensor&, const at::Tensor&,
                                     const std::optional<at::Tensor>&)>
ConvWithBatchStats conv2d_batch_stats(const at::Tensor& x, const at::Tensor& weight,
                                      const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                                      at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups) {
  const auto problem = check_conv2d_args<int64_t>("mpgemm.conv2d_batch_stats", x, weight, bias, stride, padding,
                                                  dilation, groups, std::nullopt);
  return Impl(problem, x, weight, bias);
}

// grad_out of a conv2d of x and weight; the result has the dtype and memory
// format of x (grad_input) or weight (grad_weight).
template <ConvGradient Impl>
at::Tensor conv2d_gradient(const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& weight,
                           at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups) {
  const auto problem = check_conv2d_args<int64_t>("mpgemm.conv2d backward", x, weight, std::nullopt, stride, padding,
                                                  dilation, groups, std::nullopt);
  check_conv2d_grad_out("mpgemm.conv2d backward", problem, x, grad_out);
  return Impl(problem, grad_out, x, weight);
}

// grad_input of a conv2d plus addend (x's shape and dtype): a gradient of x
// with a second term, summed by the dgrad.
template <at::Tensor (*Impl)(const ConvProblem<int64_t>&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                             const at::Tensor&)>
at::Tensor conv2d_grad_input_add(const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& weight,
                                 const at::Tensor& addend, at::IntArrayRef stride, at::IntArrayRef padding,
                                 at::IntArrayRef dilation, int64_t groups) {
  constexpr const char* op = "mpgemm._conv2d_grad_input_add";
  const auto problem =
      check_conv2d_args<int64_t>(op, x, weight, std::nullopt, stride, padding, dilation, groups, std::nullopt);
  check_conv2d_grad_out(op, problem, x, grad_out);
  check_conv2d_grad_input_addend(op, x, addend);
  return Impl(problem, grad_out, x, weight, addend);
}

// Both gradients of one conv2d in one call (what training's backward asks for),
// checked once: the input's and the weight's, as conv2d_gradient returns them.
template <ConvGradient InputImpl, ConvGradient WeightImpl>
std::tuple<at::Tensor, at::Tensor> conv2d_gradients(const at::Tensor& grad_out, const at::Tensor& x,
                                                    const at::Tensor& weight, at::IntArrayRef stride,
                                                    at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups) {
  const auto problem = check_conv2d_args<int64_t>("mpgemm.conv2d backward", x, weight, std::nullopt, stride, padding,
                                                  dilation, groups, std::nullopt);
  check_conv2d_grad_out("mpgemm.conv2d backward", problem, x, grad_out);
  return {InputImpl(problem, grad_out, x, weight), WeightImpl(problem, grad_out, x, weight)};
}

at::Tensor conv2d_meta(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                       std::optional<at::ScalarType> out_dtype) {
  const auto pr =
      check_conv2d_args<c10::SymInt>("mpgemm.conv2d", x, weight, bias, stride, padding, dilation, groups, out_dtype);
  return at::empty_symint({pr.n, pr.k, pr.p, pr.q},
                          x.options().dtype(pr.out_dtype).memory_format(memory_format_of(pr)));
}

ConvWithBatchStats conv2d_batch_stats_meta(const at::Tensor& x, const at::Tensor& weight,
                                           const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                                           at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups) {
  const auto pr = check_conv2d_args<c10::SymInt>("mpgemm.conv2d_batch_stats", x, weight, bias, stride, padding,
                                                 dilation, groups, std::nullopt);
  return {at::empty_symint({pr.n, pr.k, pr.p, pr.q},
                           x.options().dtype(pr.out_dtype).memory_format(memory_format_of(pr))),
          at::empty_symint({c10::SymInt(2), pr.k}, x.options().dtype(at::kFloat))};
}

// Gradients take the shape, dtype and memory format of their input.
template <bool OfInput>
at::Tensor conv2d_gradient_meta(const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& weight,
                                at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                                int64_t groups) {
  check_conv2d_args<c10::SymInt>("mpgemm.conv2d backward", x, weight, std::nullopt, stride, padding, dilation, groups,
                                 std::nullopt);
  const at::Tensor& like = OfInput ? x : weight;
  return at::empty_symint(like.sym_sizes(), like.options().memory_format(like.suggest_memory_format()));
}

at::Tensor conv2d_grad_input_add_meta(const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& weight,
                                      const at::Tensor& addend, at::IntArrayRef stride, at::IntArrayRef padding,
                                      at::IntArrayRef dilation, int64_t groups) {
  check_conv2d_grad_input_addend("mpgemm._conv2d_grad_input_add", x, addend);
  return conv2d_gradient_meta<true>(grad_out, x, weight, stride, padding, dilation, groups);
}

std::tuple<at::Tensor, at::Tensor> conv2d_gradients_meta(const at::Tensor& grad_out, const at::Tensor& x,
                                                         const at::Tensor& weight, at::IntArrayRef stride,
                                                         at::IntArrayRef padding, at::IntArrayRef dilation,
                                                         int64_t groups) {
  return {conv2d_gradient_meta<true>(grad_out, x, weight, stride, padding, dilation, groups),
          conv2d_gradient_meta<false>(grad_out, x, weight, stride, padding, dilation, groups)};
}

at::Tensor cublas_gemm_meta(const at::Tensor& a, const at::Tensor& b, std::optional<at::ScalarType> out_dtype) {
  const auto problem = check_2d_gemm_args<c10::SymInt>("mpgemm._cublas_gemm", a, b, out_dtype);
  return at::empty_symint(problem.out_shape, a.options().dtype(problem.out_dtype));
}

template <void (*Impl)(const at::Tensor&, const at::Tensor&, int64_t, at::Tensor&)>
void mma_ceiling(const at::Tensor& a, const at::Tensor& b, int64_t iterations, at::Tensor& out) {
  check_mma_ceiling_args(a, b, iterations, out);
  at::assert_no_overlap(out, a);
  at::assert_no_overlap(out, b);
  Impl(a, b, iterations, out);
}

void mma_ceiling_meta(const at::Tensor& a, const at::Tensor& b, int64_t iterations, at::Tensor& out) {
  check_mma_ceiling_args(a, b, iterations, out);
}

}  // namespace

// bias is positional, as autograd's other tensor inputs (csrc/autograd.cpp);
// the Python wrappers keep it keyword-only for gemm.
TORCH_LIBRARY(mpgemm, m) {
  m.def("gemm(Tensor a, Tensor b, Tensor? bias=None, *, str? activation=None, ScalarType? out_dtype=None) -> Tensor");
  // Returns nothing: functionalization (torch.compile) refuses custom ops whose outputs alias inputs.
  m.def("gemm.out(Tensor a, Tensor b, Tensor? bias=None, *, str? activation=None, Tensor(a!) out) -> ()");
  m.def(
      "linear(Tensor x, Tensor weight, Tensor? bias=None, *, str? activation=None, ScalarType? out_dtype=None) -> "
      "Tensor");
  // gemm's and linear's y with z = a @ b + bias before the activation beside
  // it, in y's dtype and shape: what GELU's backward reads unless
  // MPGEMM_EPILOGUE_PRE_ACTIVATION=0 (csrc/autograd.cpp calls them; they
  // have no autograd of their own). Their activation may also be
  // "gelu_tanh", GELU's tanh form (mlp's).
  m.def(
      "_gemm_pre_activation(Tensor a, Tensor b, Tensor? bias=None, *, str? activation=None, "
      "ScalarType? out_dtype=None) -> (Tensor y, Tensor pre_activation)");
  m.def(
      "_linear_pre_activation(Tensor x, Tensor weight, Tensor? bias=None, *, str? activation=None, "
      "ScalarType? out_dtype=None) -> (Tensor y, Tensor pre_activation)");
  // a @ b (2-D, no epilogue) and a's row sums over K in fp32, (M,): linear's
  // wgrad, dW = dZ^T @ X, with its bias's gradient, which every Hopper tile's
  // kernels sum beside the product where MPGEMM_EPILOGUE_BIAS_GRAD=1
  // (csrc/autograd.cpp calls it; it has no autograd of its own).
  m.def("_gemm_row_sums(Tensor a, Tensor b, *, ScalarType? out_dtype=None) -> (Tensor y, Tensor a_row_sums)");
  // (a @ b) * activation'(activation_input), 2-D, in the inputs' 16-bit type,
  // rounded once: an MLP's dgrad with its activation's backward, dZ = (dY @
  // W2) * gelu'(Z), which the Hopper kernel's epilogue applies where
  // MPGEMM_EPILOGUE_ACTIVATION_GRAD=1 (csrc/autograd.cpp calls it; it has no
  // autograd of its own).
  m.def("_gemm_activation_grad(Tensor a, Tensor b, Tensor activation_input, *, str activation) -> Tensor");
  // linear(activation(linear(x, w1, b1)), w2, b2): a transformer's MLP, whose
  // backward gives GELU's (or ReLU's) input gradient from the second
  // linear's dgrad (_gemm_activation_grad); its forward is the two linears'.
  m.def("mlp(Tensor x, Tensor w1, Tensor? b1, Tensor w2, Tensor? b2, *, str activation) -> Tensor");
  // linear(act(linear(x, w_gate, b_gate)) * linear(x, w_up, b_up), w_down,
  // b_down): a gated MLP (SwiGLU, GeGLU; csrc/gated_mlp.cpp), and its
  // gating's two elementwise passes over tensors of one shape and 16-bit
  // type: act(gate) * up, and backward's (grad_gate, grad_up, act(gate) *
  // up) from grad, each in fp32, rounded once (gated_mlp calls them unless
  // MPGEMM_GATED_KERNEL=0; they have no autograd of their own).
  m.def(
      "gated_mlp(Tensor x, Tensor w_gate, Tensor? b_gate, Tensor w_up, Tensor? b_up, Tensor w_down, Tensor? b_down, "
      "*, str activation) -> Tensor");
  m.def("_gated_activation(Tensor gate, Tensor up, *, str activation) -> Tensor");
  m.def(
      "_gated_activation_backward(Tensor grad, Tensor gate, Tensor up, *, str activation) -> "
      "(Tensor grad_gate, Tensor grad_up, Tensor out)");
  // Layer norm over x's last dimensions (normalized_shape) with x fp16 or
  // bf16 and the weights fp16, bf16 or fp32, in fp32 from x as it is, y in
  // x's type (csrc/layer_norm.cpp; kernels/norm/layer_norm_math.h has the
  // arithmetic). Its internal ops (no autograd of their own): the forward's
  // y with each row's mean and rstd ((rows,) fp32), and backward's dx and
  // the weights' gradients as fp32 column sums (sum of dy * xhat, of dy; of
  // shape (cols,)): dx an empty tensor where output_mask (dx, weight, bias)
  // does not ask for it, the sums where it asks for neither.
  m.def(
      "layer_norm(Tensor x, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None, float eps=1e-05) -> "
      "Tensor");
  m.def(
      "_layer_norm_forward(Tensor x, int[] normalized_shape, Tensor? weight, Tensor? bias, float eps) -> "
      "(Tensor y, Tensor mean, Tensor rstd)");
  m.def(
      "_layer_norm_backward(Tensor grad, Tensor x, Tensor mean, Tensor rstd, int[] normalized_shape, "
      "Tensor? weight, bool[3] output_mask) -> (Tensor grad_x, Tensor sum_dy_xhat, Tensor sum_dy)");
  // Loss scaling: outs[i] = grads[i] * inv_scale (outs may be the grads
  // themselves), found_inf set to 1 if any result is inf or NaN.
  m.def("unscale_grads_(Tensor[] grads, Tensor(a!)[] outs, Tensor(b!) found_inf, Tensor inv_scale) -> ()");
  // Dynamic loss scaling's update after a step (kernels/amp/loss_scale.h):
  // the scale (fp32, 0-dim) and its int64 counters (growth tracker, overflows
  // in a row, skipped steps, last step skipped) in place, from the step's
  // overflow flag, on the device: no host synchronization.
  m.def(
      "update_loss_scale_(Tensor(a!) scale, Tensor(b!) counters, Tensor found_inf, float growth_factor, "
      "float backoff_factor, int growth_interval, float min_scale, int hysteresis, bool dynamic) -> ()");
  // Convolution: padding is (top, bottom, left, right); the gradients of x and
  // weight have their dtype and memory format.
  m.def(
      "conv2d(Tensor x, Tensor weight, Tensor? bias=None, int[2] stride=1, int[4] padding=0, int[2] dilation=1, "
      "int groups=1, *, ScalarType? out_dtype=None) -> Tensor");
  m.def(
      "conv2d_grad_input(Tensor grad_out, Tensor x, Tensor weight, int[2] stride, int[4] padding, int[2] dilation, "
      "int groups) -> Tensor");
  m.def(
      "conv2d_grad_weight(Tensor grad_out, Tensor x, Tensor weight, int[2] stride, int[4] padding, int[2] dilation, "
      "int groups) -> Tensor");
  m.def(
      "conv2d_backward(Tensor grad_out, Tensor x, Tensor weight, int[2] stride, int[4] padding, int[2] dilation, "
      "int groups) -> (Tensor grad_input, Tensor grad_weight)");
  // conv2d_grad_input(...) + addend (x's shape and dtype), summed in fp32
  // and rounded once where the dgrad's epilogue adds it
  // (MPGEMM_DGRAD_ADDEND=1 on the Hopper convolution at stride 1; the CPU
  // backend too), else the rounded gradient plus the addend: a gradient of
  // x with a second term (a ResNet block input's residual), with no pass of
  // its own over x. No autograd of its own.
  m.def(
      "_conv2d_grad_input_add(Tensor grad_out, Tensor x, Tensor weight, Tensor addend, int[2] stride, "
      "int[4] padding, int[2] dilation, int groups) -> Tensor");
  // conv2d's y, in x's dtype, and its batch statistics for a training batch
  // norm after it: batch_mean_var (2, K) fp32, each channel's mean and biased
  // variance over (N, P, Q) of y as stored (not differentiable: batch norm's
  // backward differentiates its statistics through y).
  m.def(
      "conv2d_batch_stats(Tensor x, Tensor weight, Tensor? bias=None, int[2] stride=1, int[4] padding=0, "
      "int[2] dilation=1, int groups=1) -> (Tensor y, Tensor batch_mean_var)");
  // Training batch norm with its residual add and ReLU (batch_norm_ops.cpp;
  // mpgemm/fusion/batch_norm.py is its autograd). Forward: out = relu?(y *
  // scale + shift + residual), from batch statistics (the running ones
  // updated with `momentum`) or running ones; returns the mean, invstd and
  // scale backward takes, the shift, and with a ReLU, where 16-bit elements and 8 | C
  // allow, out > 0 as bits (uint8, bit e of byte j for element 8j + e of y's
  // NHWC order; else empty). Backward takes the ReLU's output or those bits;
  // output_mask asks for grad_y, gamma's and beta's (sum_dz_xhat, sum_dz) and
  // the residual's (grad_z); what is not asked for is an empty tensor.
  // Tensors of y's shape have y's dtype.
  m.def(
      "batch_norm_act(Tensor y, Tensor? weight, Tensor? bias, Tensor? residual, Tensor(a!)? running_mean, "
      "Tensor(b!)? running_var, bool batch_stats, float momentum, float eps, bool relu, "
      "Tensor? batch_mean_var=None) -> (Tensor out, Tensor mean, Tensor invstd, Tensor scale, Tensor shift, "
      "Tensor relu_mask)");
  m.def(
      "batch_norm_act_backward(Tensor grad_out, Tensor? out, Tensor? relu_mask, Tensor y, Tensor mean, "
      "Tensor invstd, Tensor scale, bool batch_stats, bool[3] output_mask) -> "
      "(Tensor grad_y, Tensor sum_dz, Tensor sum_dz_xhat, Tensor grad_z)");
  // The forward's elementwise pass alone without a residual: relu?(y * scale
  // + shift) from the scale and shift batch_norm_act returned, its out bit
  // for bit (a fused chain's output recomputed in backward). Not
  // differentiable.
  m.def("batch_norm_apply(Tensor y, Tensor scale, Tensor shift, bool relu) -> Tensor");
  // batch_norm_act with its ReLU and then a max pool (torch's MaxPool2d
  // window; at most 128 taps) in its one elementwise pass: out is the
  // pooled output; window (uint8, out's shape, channels_last) names each
  // element's maximum, its tap in the window (row * kernel_w + column), | 128
  // where the ReLU passed it. The chain's output itself is never made.
  // max_pool_window_backward is the pool's and the ReLU's gradient from it
  // (y's shape: input_size; channels_last), summed in fp32 in torch's order;
  // batch_norm_act_backward takes it with no ReLU.
  m.def(
      "batch_norm_relu_max_pool(Tensor y, Tensor? weight, Tensor? bias, Tensor(a!)? running_mean, "
      "Tensor(b!)? running_var, bool batch_stats, float momentum, float eps, int[2] kernel_size, int[2] stride, "
      "int[2] padding, int[2] dilation, bool ceil_mode, Tensor? batch_mean_var=None) -> (Tensor out, "
      "Tensor mean, Tensor invstd, Tensor scale, Tensor shift, Tensor window)");
  m.def(
      "max_pool_window_backward(Tensor grad_out, Tensor window, int[2] input_size, int[2] kernel_size, "
      "int[2] stride, int[2] padding, int[2] dilation, bool ceil_mode) -> Tensor");
  // The cuBLAS baseline of benchmarks and checks (2-D, CUDA builds only).
  m.def("_cublas_gemm(Tensor a, Tensor b, *, ScalarType? out_dtype=None) -> Tensor");
  // The mma.sync ceiling of benchmarks: Tensor Core instructions from registers
  // alone (kernels/wmma/mma_ceiling.cu); build_info()["mma_ceiling"] gives the shapes.
  m.def("_mma_ceiling(Tensor a, Tensor b, int iterations, *, Tensor(a!) out) -> ()");
}

TORCH_LIBRARY_IMPL(mpgemm, CPU, m) {
  m.impl("gemm", &gemm<gemm_cpu_into>);
  m.impl("gemm.out", &gemm_out<gemm_cpu_into>);
  m.impl("linear", &linear<gemm_cpu_into, false>);
  m.impl("_gemm_pre_activation", &gemm_pre_activation<gemm_cpu_into>);
  m.impl("_linear_pre_activation", &linear<gemm_cpu_into, true>);
  m.impl("_gemm_row_sums", &gemm_row_sums<gemm_cpu_into>);
  m.impl("_gemm_activation_grad", &gemm_activation_grad<gemm_cpu_into>);
  m.impl("unscale_grads_", &unscale_grads<unscale_grads_cpu>);
  m.impl("update_loss_scale_", &update_loss_scale<update_loss_scale_cpu>);
  m.impl("conv2d", &conv2d<conv2d_cpu>);
  m.impl("conv2d_grad_input", &conv2d_gradient<conv2d_grad_input_cpu>);
  m.impl("conv2d_grad_weight", &conv2d_gradient<conv2d_grad_weight_cpu>);
  m.impl("_conv2d_grad_input_add", &conv2d_grad_input_add<conv2d_grad_input_add_cpu>);
  m.impl("conv2d_backward", &conv2d_gradients<conv2d_grad_input_cpu, conv2d_grad_weight_cpu>);
  m.impl("conv2d_batch_stats", &conv2d_batch_stats<conv2d_batch_stats_cpu>);
  m.impl("_mma_ceiling", &mma_ceiling<mma_ceiling_cpu>);
}

TORCH_LIBRARY_IMPL(mpgemm, Meta, m) {
  m.impl("gemm", &gemm_meta);
  m.impl("gemm.out", &gemm_out_meta);
  m.impl("linear", &linear_meta);
  m.impl("_gemm_pre_activation", &pre_activation_meta<gemm_meta, kGemmPreActivation>);
  m.impl("_linear_pre_activation", &pre_activation_meta<linear_meta, kLinearPreActivation>);
  m.impl("_gemm_row_sums", &gemm_row_sums_meta);
  m.impl("_gemm_activation_grad", &gemm_activation_grad_meta);
  m.impl("unscale_grads_", &unscale_grads_meta);
  m.impl("update_loss_scale_", &update_loss_scale_meta);
  m.impl("conv2d", &conv2d_meta);
  m.impl("conv2d_grad_input", &conv2d_gradient_meta<true>);
  m.impl("conv2d_grad_weight", &conv2d_gradient_meta<false>);
  m.impl("_conv2d_grad_input_add", &conv2d_grad_input_add_meta);
  m.impl("conv2d_backward", &conv2d_gradients_meta);
  m.impl("conv2d_batch_stats", &conv2d_batch_stats_meta);
  m.impl("_cublas_gemm", &cublas_gemm_meta);
  m.impl("_mma_ceiling", &mma_ceiling_meta);
}

#ifdef MPGEMM_WITH_CUDA
TORCH_LIBRARY_IMPL(mpgemm, CUDA, m) {
  m.impl("gemm", &gemm<gemm_cuda_into>);
  m.impl("gemm.out", &gemm_out<gemm_cuda_into>);
  m.impl("linear", &linear<gemm_cuda_into, false>);
  m.impl("_gemm_pre_activation", &gemm_pre_activation<gemm_cuda_into>);
  m.impl("_linear_pre_activation", &linear<gemm_cuda_into, true>);
  m.impl("_gemm_row_sums", &gemm_row_sums<gemm_cuda_into>);
  m.impl("_gemm_activation_grad", &gemm_activation_grad<gemm_cuda_into>);
  m.impl("unscale_grads_", &unscale_grads<unscale_grads_cuda>);
  m.impl("update_loss_scale_", &update_loss_scale<update_loss_scale_cuda>);
  m.impl("conv2d", &conv2d<conv2d_cuda>);
  m.impl("conv2d_grad_input", &conv2d_gradient<conv2d_grad_input_cuda>);
  m.impl("conv2d_grad_weight", &conv2d_gradient<conv2d_grad_weight_cuda>);
  m.impl("_conv2d_grad_input_add", &conv2d_grad_input_add<conv2d_grad_input_add_cuda>);
  m.impl("conv2d_backward", &conv2d_gradients<conv2d_grad_input_cuda, conv2d_grad_weight_cuda>);
  m.impl("conv2d_batch_stats", &conv2d_batch_stats<conv2d_batch_stats_cuda>);
  m.impl("_cublas_gemm", &cublas_gemm_cuda);
  m.impl("_mma_ceiling", &mma_ceiling<mma_ceiling_cuda>);
}
#endif

}  // namespace mpgemm

// How this binary was built; setup.py passes the values in.
#ifndef MPGEMM_BUILD_BACKEND
#define MPGEMM_BUILD_BACKEND "cpu"
#endif
#ifndef MPGEMM_CUDA_ARCHS
#define MPGEMM_CUDA_ARCHS ""
#endif
#ifndef MPGEMM_CUDA_VERSION
#define MPGEMM_CUDA_VERSION ""
#endif
#ifndef MPGEMM_TORCH_VERSION
#define MPGEMM_TORCH_VERSION ""
#endif

namespace mpgemm {
int add_gemm_plan_functions(PyObject* module);  // gemm_plan_py.cpp
int add_op_entry_functions(PyObject* module);   // op_entry_py.cpp
}

static PyObject* build_info(PyObject*, PyObject*) {
  using Ceiling = mpgemm::kernels::MmaCeilingTile;
  return Py_BuildValue("{s:s,s:s,s:s,s:s,s:{s:i,s:i,s:i,s:i}}", "backend", MPGEMM_BUILD_BACKEND, "cuda_archs",
                       MPGEMM_CUDA_ARCHS, "cuda_version", MPGEMM_CUDA_VERSION, "torch_version", MPGEMM_TORCH_VERSION,
                       "mma_ceiling", "warps", Ceiling::kWarpsM * Ceiling::kWarpsN, "warp_m", Ceiling::kWarpM,
                       "warp_n", Ceiling::kWarpN, "k", Ceiling::kFragment);
}

static PyObject* workspace_stats(PyObject*, PyObject*) {
  const mpgemm::WorkspaceStats stats = mpgemm::workspace_stats();
  return Py_BuildValue("{s:L,s:L,s:L}", "calls", static_cast<long long>(stats.calls), "bytes",
                       static_cast<long long>(stats.bytes), "largest_bytes", static_cast<long long>(stats.largest_bytes));
}

static PyObject* reset_workspace_stats(PyObject*, PyObject*) {
  mpgemm::reset_workspace_stats();
  Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"build_info", build_info, METH_NOARGS, "How the extension was built."},
    {"workspace_stats", workspace_stats, METH_NOARGS, "The CUDA launchers' workspaces since the last reset."},
    {"reset_workspace_stats", reset_workspace_stats, METH_NOARGS, "Zeroes the workspace counts."},
    {nullptr, nullptr, 0, nullptr},
};

// Importing mpgemm._C loads this library, whose static initializers register the ops.
extern "C" PyMODINIT_FUNC PyInit__C() {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, module_methods};
  PyObject* m = PyModule_Create(&module);
  if (m != nullptr && (mpgemm::add_gemm_plan_functions(m) != 0 || mpgemm::add_op_entry_functions(m) != 0))
    Py_CLEAR(m);
  return m;
}
