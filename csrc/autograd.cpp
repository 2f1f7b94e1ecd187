// Autograd of gemm, linear, mlp and conv2d, registered at the Autograd key:
// each call that records a graph makes a node of its own (op_node.h says
// why and how), the inputs saved after the forward, outside its
// below-autograd guard, as autograd saves them, so that saved-tensor hooks
// see each saved tensor.
//
// For y = activation(a @ b + bias) (gemm, linear) the gradients are
//     dz = dy * activation'(z)       (ReLU's from y, saved as torch's relu
//                                     saves it: y > 0 exactly where z > 0;
//                                     GELU's in y's dtype from z saved by the
//                                     forward, as torch.amp's gelu saves its
//                                     input, or with
//                                     MPGEMM_EPILOGUE_PRE_ACTIVATION=0 in
//                                     fp32, z recomputed)
//     da = dz @ b^T,  db = a^T @ dz  (on the mpgemm kernels, dz rounded to the
//                                     product's input type, fp16 or bf16;
//                                     transposes read in place)
//     dbias = sum(dz)                (accumulated in fp32; linear's, with
//                                     MPGEMM_EPILOGUE_BIAS_GRAD=1, by its
//                                     weight's gradient product, which reads
//                                     dz^T as its A: the row sums of A, of dz
//                                     as rounded for the product, as torch.amp
//                                     sums its 16-bit dz)
// and each gradient has the dtype of its input. mlp's are its two linears',
// the activation's input gradient dz = (dy @ w2) * activation'(z) from one
// product with MPGEMM_EPILOGUE_ACTIVATION_GRAD=1. conv2d's are its dgrad and
// wgrad implicit GEMMs (one op, conv2d_backward, where both are wanted) and
// an fp32 sum for the bias. Each saves its operands, and the bias where
// GELU's pre-activation is recomputed (or that pre-activation), or the
// output where ReLU's mask is read off it. Sizes are SymInts throughout, so
// that torch.compile traces backward with symbolic shapes. Gradients are
// computed once, without a graph: differentiating them again raises an
// error.
#include <string>

#include <ATen/core/Tensor.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/threshold_backward.h>
#include <ATen/ExpandUtils.h>
#include <torch/library.h>

#include "autograd.h"
#include "op_handles.h"
#include "ops.h"

namespace mpgemm {

at::Tensor call_gemm(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                     std::optional<std::string_view> activation, std::optional<at::ScalarType> out_dtype) {
  static const auto op = op_handle<GemmSignature>("mpgemm::gemm");
  return op.call(a, b, bias, activation, out_dtype);
}

at::Tensor call_linear(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       std::optional<std::string_view> activation, std::optional<at::ScalarType> out_dtype) {
  static const auto op = op_handle<GemmSignature>("mpgemm::linear");
  return op.call(x, weight, bias, activation, out_dtype);
}

c10::SymInt product(c10::SymIntArrayRef sizes) {
  c10::SymInt n = 1;
  for (const c10::SymInt& s : sizes) n = n * s;
  return n;
}

at::ScalarType product_dtype(const at::Tensor& x, const at::Tensor& weight) {
  return x.scalar_type() == at::kBFloat16 || weight.scalar_type() == at::kBFloat16 ? at::kBFloat16 : at::kHalf;
}

at::Tensor block_weight(const at::Tensor& x, const at::Tensor& w, at::ScalarType dtype) {
  return product_dtype(x, w) == dtype ? w : w.to(dtype);
}

bool records_graph(const at::Tensor& first, const at::Tensor& second, const std::optional<at::Tensor>& bias) {
  return at::GradMode::is_enabled() &&
         (first.requires_grad() || second.requires_grad() || (bias && bias->defined() && bias->requires_grad()));
}

namespace {

at::Tensor call_conv2d(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                       std::optional<at::ScalarType> out_dtype) {
  static const auto op = op_handle<ConvSignature>("mpgemm::conv2d");
  return op.call(x, weight, bias, stride, padding, dilation, groups, out_dtype);
}

// gemm or linear (Op) returning y and its pre-activation.
template <const char* Op>
std::tuple<at::Tensor, at::Tensor> call_with_pre_activation(const at::Tensor& a, const at::Tensor& b,
                                                            const std::optional<at::Tensor>& bias,
                                                            std::optional<std::string_view> activation,
                                                            std::optional<at::ScalarType> out_dtype) {
  static const auto op = op_handle<GemmPreActivationSignature>(Op);
  return op.call(a, b, bias, activation, out_dtype);
}
constexpr char kGemmPreActivation[] = "mpgemm::_gemm_pre_activation";
constexpr char kLinearPreActivation[] = "mpgemm::_linear_pre_activation";

// a @ b and a's row sums over K, in fp32.
std::tuple<at::Tensor, at::Tensor> call_gemm_row_sums(const at::Tensor& a, const at::Tensor& b,
                                                      at::ScalarType out_dtype) {
  static const auto op = op_handle<GemmRowSumsSignature>("mpgemm::_gemm_row_sums");
  return op.call(a, b, out_dtype);
}

std::tuple<at::Tensor, at::Tensor> call_conv2d_batch_stats(const at::Tensor& x, const at::Tensor& weight,
                                                           const std::optional<at::Tensor>& bias,
                                                           at::IntArrayRef stride, at::IntArrayRef padding,
                                                           at::IntArrayRef dilation, int64_t groups) {
  static const auto op = op_handle<ConvBatchStatsSignature>("mpgemm::conv2d_batch_stats");
  return op.call(x, weight, bias, stride, padding, dilation, groups);
}

std::optional<at::Tensor> optional(const at::Tensor& t) {
  return t.defined() ? std::optional<at::Tensor>(t) : std::nullopt;
}

// MPGEMM_EPILOGUE_PRE_ACTIVATION: unset or "1" has gemm's and linear's GELU
// save its input z from the forward (the Hopper kernel's epilogue stores it
// beside y; elsewhere the launcher runs the product again there), as
// torch.amp's GELU saves its input, rather than run the product again in
// backward; "0" recomputes it. The default since its kernel passed the GPU
// tests and took linear + GELU's forward + backward from 0.53-0.76x of
// torch's to 0.89-1.01x (H200, fe39419, 2026-11-29). Asked on each GELU call
// that records a graph, so that a bad value is refused there (torch.compile
// asks once, when it traces). mlp keeps GELU's input either way (below) and
// asks with the switch off unless "1" (mlp_pre_activation_from_epilogue).
bool pre_activation_saved() { return environment_switch("MPGEMM_EPILOGUE_PRE_ACTIVATION", true); }

// Whether mlp takes GELU's input from the first product's epilogue: only
// where MPGEMM_EPILOGUE_PRE_ACTIVATION is "1". Its default (the linear, then
// torch's gelu pass) is the measured one (GPT-2 small's MLP block 0.88x of
// torch's forward + backward, H200, fe39419); the epilogue's way has been
// timed only together with the activation derivative's epilogue (0.70x),
// and off the Hopper wide tile it runs the first product twice (GELU's
// erf form; its tanh form there runs the product once and torch's pass, as
// by default). The tanh form's kernel is opt-in by this switch alone until
// it passes the GPU tests.
bool mlp_pre_activation_from_epilogue() { return environment_switch("MPGEMM_EPILOGUE_PRE_ACTIVATION", false); }

// MPGEMM_EPILOGUE_BIAS_GRAD: "1" has linear's backward sum its bias's
// gradient in the product that gives the weight's (_gemm_row_sums: the
// Hopper kernels sum dz^T's rows beside it; elsewhere torch sums dz after
// it), where both gradients are wanted; unset or "0" sums dz apart. Opt-in
// until those kernels have passed the GPU tests. Asked by each backward
// that wants both.
bool bias_grad_from_weight_grad() { return environment_switch("MPGEMM_EPILOGUE_BIAS_GRAD"); }

// t summed over dims, accumulated in fp32, in dtype: one op where t has that
// dtype (torch's sums of fp16 and bf16 accumulate in fp32), not a sum in fp32
// and a cast.
at::Tensor sum_to(const at::Tensor& t, at::IntArrayRef dims, at::ScalarType dtype) {
  return t.scalar_type() == dtype ? t.sum(dims) : t.sum(dims, false, at::kFloat).to(dtype);
}


at::Tensor bias_grad(const at::Tensor& grad_z, at::ScalarType bias_dtype) {
  const auto sizes = grad_z.sym_sizes();
  const c10::SymInt rows = product(sizes.slice(0, sizes.size() - 1));
  return sum_to(grad_z.reshape_symint({rows, sizes.back()}), {0}, bias_dtype);
}

// x @ y as the gradient of a 16-bit operand of `operand_shape` and x's dtype,
// summed over the batch it was broadcast across.
at::Tensor operand_grad(const at::Tensor& x, const at::Tensor& y, c10::SymIntArrayRef operand_shape) {
  const auto xs = x.sym_sizes(), ys = y.sym_sizes();
  c10::SymDimVector full = at::infer_size_symdimvector(xs.slice(0, xs.size() - 2), ys.slice(0, ys.size() - 2));
  full.push_back(xs[xs.size() - 2]);
  full.push_back(ys.back());
  if (c10::SymIntArrayRef(full) == operand_shape) return call_gemm(x, y, std::nullopt, std::nullopt, x.scalar_type());
  return call_gemm(x, y, std::nullopt, std::nullopt, at::kFloat).sum_to_size_symint(operand_shape).to(x.scalar_type());
}


// The bias's edge: the third of (x, weight, bias), which the nodes below
// give an empty edge where there is no bias.
constexpr size_t kBiasEdge = 2;

// The graph node of one gemm (Linear false) or linear (Linear true) call
// (op_node.h): a, b and the bias as edges 0-2 (an empty edge where there is
// no bias), and what backward needs besides the operands: GELU's input z
// saved by the forward (in y's dtype, as torch.amp's gelu saves its input;
// `pre_activation_saved`) or the bias to compute it again, ReLU's output
// (its mask is y > 0, which is where z > 0 but for z too small for y's
// type, as under torch.amp, whose z has y's type: no product is run again).
template <bool Linear>
struct ProductBackward final : OpNode<ProductBackward<Linear>, 4> {
  enum Slot : size_t { kA, kB, kGeluInput, kOut };
  std::string activation;  // "", "relu" or "gelu"
  std::optional<at::ScalarType> bias_dtype;
  bool pre_activation_saved = false;

  static constexpr const char* kOp = Linear ? "mpgemm.linear" : "mpgemm.gemm";
  std::string name() const override { return Linear ? "MpgemmLinearBackward" : "MpgemmGemmBackward"; }
  template <class Self>
  static auto fields(Self& node) {
    return std::tie(node.activation, node.bias_dtype, node.pre_activation_saved);
  }

  static at::Tensor product(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                            at::ScalarType out_dtype) {
    return Linear ? call_linear(a, b, bias, std::nullopt, out_dtype) : call_gemm(a, b, bias, std::nullopt, out_dtype);
  }

  // dL/dz for y = activation(z): ReLU's from y (exact, dy or 0, in
  // grad_out's type, which autograd makes y's), GELU's from z saved (in y's
  // dtype) or in fp32 from z computed again, or grad_out itself without an
  // activation.
  at::Tensor pre_activation_grad(const std::vector<at::Tensor>& saved, const at::Tensor& grad_out) const {
    if (activation.empty()) return grad_out;
    if (activation == "relu") return at::threshold_backward(grad_out, saved[kOut], 0);
    if (pre_activation_saved) return at::gelu_backward(grad_out, saved[kGeluInput]);
    return at::gelu_backward(grad_out.to(at::kFloat), product(saved[kA], saved[kB], optional(saved[kGeluInput]),
                                                              at::kFloat));
  }

  variable_list gradients(const std::vector<at::Tensor>& saved, const at::Tensor& grad,
                          const std::vector<bool>& wanted) const {
    const at::Tensor &a = saved[kA], &b = saved[kB];
    const at::Tensor grad_z = pre_activation_grad(saved, grad);
    const bool want_bias = bias_dtype && wanted[kBiasEdge];
    if (Linear) return linear_gradients(grad_z, a, b, product_dtype(a, b), bias_dtype, wanted[0], wanted[1], want_bias);
    const at::Tensor grad_z16 = grad_z.to(a.scalar_type());
    at::Tensor grad_a, grad_b, grad_bias;
    if (wanted[0]) grad_a = operand_grad(grad_z16, b.transpose(-1, -2), a.sym_sizes());
    if (wanted[1]) {
      if (b.dim() == 2 && a.dim() == 3) {
        // One GEMM over the flattened batch instead of a batched one and a sum.
        const c10::SymInt k = b.sym_size(0), n = b.sym_size(1), rows = a.sym_size(0) * a.sym_size(1);
        grad_b = call_gemm(a.reshape_symint({rows, k}).t(), grad_z16.reshape_symint({rows, n}), std::nullopt,
                           std::nullopt, a.scalar_type());
      } else {
        grad_b = operand_grad(a.transpose(-1, -2), grad_z16, b.sym_sizes());
      }
    }
    if (want_bias) grad_bias = bias_grad(grad_z, *bias_dtype);
    return {grad_a, grad_b, grad_bias};
  }
};

}  // namespace

// linear_gradients (autograd.h).
variable_list linear_gradients(const at::Tensor& grad_z, const at::Tensor& x, const at::Tensor& weight,
                               at::ScalarType dtype, std::optional<at::ScalarType> bias_dtype, bool want_x,
                               bool want_weight, bool want_bias) {
  const c10::SymInt out_features = weight.sym_size(0), in_features = weight.sym_size(1);
  // Not -1: an empty feature dimension leaves -1 ambiguous.
  const auto x_sizes = x.sym_sizes();
  const c10::SymInt rows = product(x_sizes.slice(0, x_sizes.size() - 1));
  const at::Tensor grad_z16 = grad_z.reshape_symint({rows, out_features}).to(dtype);
  at::Tensor grad_x, grad_weight, grad_bias;
  if (want_x)
    grad_x = call_gemm(grad_z16, weight.to(dtype), std::nullopt, std::nullopt, x.scalar_type()).view_symint(x_sizes);
  want_bias = want_bias && bias_dtype;
  if (want_weight) {
    const at::Tensor x16 = x.reshape_symint({rows, in_features}).to(dtype);
    if (want_bias && bias_grad_from_weight_grad()) {
      at::Tensor row_sums;
      std::tie(grad_weight, row_sums) = call_gemm_row_sums(grad_z16.t(), x16, weight.scalar_type());
      grad_bias = row_sums.to(*bias_dtype);
    } else {
      grad_weight = call_gemm(grad_z16.t(), x16, std::nullopt, std::nullopt, weight.scalar_type());
    }
  }
  if (want_bias && !grad_bias.defined()) grad_bias = bias_grad(grad_z, *bias_dtype);
  return {grad_x, grad_weight, grad_bias};
}

namespace {

// MPGEMM_EPILOGUE_ACTIVATION_GRAD: "1" has mlp's backward give its
// activation's input gradient from the second linear's dgrad
// (_gemm_activation_grad: on sm_90 the Hopper kernel's epilogue multiplies
// by the derivative, where it takes the product; elsewhere split-K's
// reduction or a pass after the product does, the same bytes as torch's
// pass), unset or "0" runs that dgrad and torch's gelu_backward (or
// threshold_backward) apart. Opt-in until that kernel has passed the GPU
// tests. Asked by each backward that wants the first linear's gradients.
bool activation_grad_in_epilogue() { return environment_switch("MPGEMM_EPILOGUE_ACTIVATION_GRAD"); }

at::Tensor call_activation_grad(const at::Tensor& a, const at::Tensor& b, const at::Tensor& activation_input,
                                std::string_view activation) {
  static const auto op = op_handle<GemmActivationGradSignature>("mpgemm::_gemm_activation_grad");
  return op.call(a, b, activation_input, activation);
}


// mlp's hidden activation h in the block's product type `dtype`, and GELU's
// input z where `keep_z` (undefined otherwise): the first linear with its
// activation fused (ReLU; GELU where z is not kept), or the linear and
// torch's gelu of its output (GELU kept, and its tanh form, whose one
// forward epilogue stores z too: mlp_autograd's).
std::tuple<at::Tensor, at::Tensor> mlp_hidden(const at::Tensor& x, const at::Tensor& w1,
                                              const std::optional<at::Tensor>& b1, std::string_view activation,
                                              at::ScalarType dtype, bool keep_z) {
  const at::Tensor w = block_weight(x, w1, dtype);
  if (activation == "relu" || (activation == "gelu" && !keep_z))
    return {call_linear(x, w, b1, activation, dtype), at::Tensor()};
  at::Tensor z = call_linear(x, w, b1, std::nullopt, dtype);
  at::Tensor h = at::gelu(z, gelu_approximate(activation));
  return {h, keep_z ? z : at::Tensor()};
}

// mlp without autograd: the two linears, the hidden activation in the
// product's 16-bit type, y in x's dtype (linear's default).
at::Tensor mlp_forward(const at::Tensor& x, const at::Tensor& w1, const std::optional<at::Tensor>& b1,
                       const at::Tensor& w2, const std::optional<at::Tensor>& b2, std::string_view activation) {
  const at::ScalarType dtype = check_mlp_args<c10::SymInt>(x, w1, b1, w2, b2, activation);
  return call_linear(std::get<0>(mlp_hidden(x, w1, b1, activation, dtype, /*keep_z=*/false)), w2, b2, std::nullopt,
                     x.scalar_type());
}

// mlp's forward computes what mlp_forward does; it saves x, w1, w2 and the
// hidden activation h (the second linear's input, as torch saves it), and,
// where the first linear's inputs want gradients, GELU's input z in h's type
// (as torch.amp's gelu saves it): from the first linear's epilogue with
// mlp_pre_activation_from_epilogue() (either GELU form), else from the linear, h from torch's
// gelu of it (a pass over memory, where computing z again in backward would
// be a product of its own; GELU is then rounded twice, as under torch.amp). ReLU's
// derivative is read off h (h > 0 exactly where z > 0 but for z too small
// for h's type). Backward: dY rounded to h's type once, for every product and the
// second bias's sum; dZ = (dY @ W2) * activation'(z) in one product
// (activation_grad_in_epilogue) or a product and torch's pass, then the
// linears' gradients, all in h's type.
// Its node (op_node.h): edges x, w1, b1, w2, b2 (0-4; empty where a bias
// is absent).
struct MlpBackward final : OpNode<MlpBackward, 5> {
  enum Slot : size_t { kX, kW1, kW2, kH, kZ };
  std::string activation;
  std::optional<at::ScalarType> b1_dtype, b2_dtype;

  static constexpr const char* kOp = "mpgemm.mlp";
  std::string name() const override { return "MpgemmMlpBackward"; }
  template <class Self>
  static auto fields(Self& node) {
    return std::tie(node.activation, node.b1_dtype, node.b2_dtype);
  }

  variable_list gradients(const std::vector<at::Tensor>& saved, const at::Tensor& grad,
                          const std::vector<bool>& wanted) const {
    const at::Tensor &x = saved[kX], &w1 = saved[kW1], &w2 = saved[kW2], &h = saved[kH];
    const bool want_x = wanted[0], want_w1 = wanted[1], want_b1 = b1_dtype && wanted[2];
    const at::ScalarType dtype = h.scalar_type();
    const c10::SymInt hidden = w1.sym_size(0), out_features = w2.sym_size(0);
    const auto h_sizes = h.sym_sizes();
    const c10::SymInt rows = product(h_sizes.slice(0, h_sizes.size() - 1));
    const at::Tensor grad_y = grad.reshape_symint({rows, out_features}).to(dtype);
    const variable_list second =
        linear_gradients(grad_y, h, w2, dtype, b2_dtype, false, wanted[3], b2_dtype && wanted[4]);
    variable_list first(3);
    if (want_x || want_w1 || want_b1) {
      const at::Tensor h2d = h.reshape_symint({rows, hidden});
      const at::Tensor w2_16 = w2.to(dtype);
      // The forward kept GELU's input wherever x, w1 or b1 wanted a gradient.
      TORCH_INTERNAL_ASSERT(activation == "relu" || saved[kZ].defined(), "mpgemm.mlp: GELU's input was not saved");
      const at::Tensor z = activation == "relu" ? h2d : saved[kZ].reshape_symint({rows, hidden});
      at::Tensor grad_z;
      if (activation_grad_in_epilogue()) {
        grad_z = call_activation_grad(grad_y, w2_16, z, activation);
      } else {
        const at::Tensor grad_h = call_gemm(grad_y, w2_16, std::nullopt, std::nullopt, dtype);
        grad_z = activation == "relu" ? at::threshold_backward(grad_h, z, 0)
                                      : at::gelu_backward(grad_h, z, gelu_approximate(activation));
      }
      first = linear_gradients(grad_z, x, w1, dtype, b1_dtype, want_x, want_w1, want_b1);
    }
    return {first[0], first[1], first[2], second[1], second[2]};
  }
};

// The graph node of one conv2d or conv2d_batch_stats call (op_node.h): x,
// the weight and the bias as edges 0-2 (empty where there is no bias);
// backward runs dgrad and wgrad (one op where both are wanted) and an fp32
// sum for the bias.
struct Conv2dBackward final : OpNode<Conv2dBackward, 2> {
  enum Slot : size_t { kX, kWeight };
  std::vector<int64_t> stride, padding, dilation;
  int64_t groups = 1;
  std::optional<at::ScalarType> bias_dtype;

  static constexpr const char* kOp = "mpgemm.conv2d";
  std::string name() const override { return "MpgemmConv2dBackward"; }
  template <class Self>
  static auto fields(Self& node) {
    return std::tie(node.stride, node.padding, node.dilation, node.groups, node.bias_dtype);
  }

  variable_list gradients(const std::vector<at::Tensor>& saved, const at::Tensor& grad_out,
                          const std::vector<bool>& wanted) const {
    static const auto both = op_handle<ConvGradientsSignature>("mpgemm::conv2d_backward");
    static const auto input = op_handle<ConvGradientSignature>("mpgemm::conv2d_grad_input");
    static const auto filters = op_handle<ConvGradientSignature>("mpgemm::conv2d_grad_weight");
    const at::Tensor &x = saved[kX], &weight = saved[kWeight];
    at::Tensor grad_x, grad_weight, grad_bias;
    if (wanted[0] && wanted[1])
      std::tie(grad_x, grad_weight) = both.call(grad_out, x, weight, stride, padding, dilation, groups);
    else if (wanted[0])
      grad_x = input.call(grad_out, x, weight, stride, padding, dilation, groups);
    else if (wanted[1])
      grad_weight = filters.call(grad_out, x, weight, stride, padding, dilation, groups);
    if (bias_dtype && wanted[kBiasEdge]) grad_bias = sum_to(grad_out, {0, 2, 3}, *bias_dtype);
    return {grad_x, grad_weight, grad_bias};
  }
};

// gemm's (Linear false) or linear's kernel at the Autograd key: below
// autograd where no graph is recorded; else the product, then its node
// (ProductBackward) as y's history, the operands and what the epilogue
// needs saved after the product, in the order a, b, GELU's input, y.
template <bool Linear>
at::Tensor product_autograd(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                            std::optional<std::string_view> activation, std::optional<at::ScalarType> out_dtype) {
  using Backward = ProductBackward<Linear>;
  refuse_forward_ad(Backward::kOp, a, b, bias);
  const bool graph = records_graph(a, b, bias);
  const bool gelu = activation == "gelu", saves_pre_activation = graph && gelu && pre_activation_saved();
  at::Tensor out, pre_activation;
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    if (saves_pre_activation)
      std::tie(out, pre_activation) =
          call_with_pre_activation<Linear ? kLinearPreActivation : kGemmPreActivation>(a, b, bias, activation,
                                                                                       out_dtype);
    else
      out = Linear ? call_linear(a, b, bias, activation, out_dtype) : call_gemm(a, b, bias, activation, out_dtype);
  }
  if (!graph) return out;
  auto node = make_node<Backward>();
  node->set_next_edges(torch::autograd::collect_next_edges(a, b, bias));
  node->activation = activation.value_or("");
  if (bias && bias->defined()) node->bias_dtype = bias->scalar_type();
  node->pre_activation_saved = saves_pre_activation;
  node->save(Backward::kA, a);
  node->save(Backward::kB, b);
  if (saves_pre_activation) node->save(Backward::kGeluInput, pre_activation);
  else if (gelu && bias && bias->defined()) node->save(Backward::kGeluInput, *bias);
  torch::autograd::set_history(out, node);
  if (activation == "relu") node->save(Backward::kOut, out, /*is_output=*/true);
  node_complete(node);
  return out;
}

// conv2d's and conv2d_batch_stats's (y's) history and what backward needs:
// x, the weight, the geometry and the bias's dtype.
void record_conv2d(const at::Tensor& y, const at::Tensor& x, const at::Tensor& weight,
                   const std::optional<at::Tensor>& bias, at::IntArrayRef stride, at::IntArrayRef padding,
                   at::IntArrayRef dilation, int64_t groups) {
  auto node = make_node<Conv2dBackward>();
  node->set_next_edges(torch::autograd::collect_next_edges(x, weight, bias));
  node->stride = stride.vec();
  node->padding = padding.vec();
  node->dilation = dilation.vec();
  node->groups = groups;
  if (bias && bias->defined()) node->bias_dtype = bias->scalar_type();
  node->save(Conv2dBackward::kX, x);
  node->save(Conv2dBackward::kWeight, weight);
  torch::autograd::set_history(y, node);
  node_complete(node);
}

at::Tensor conv2d_autograd(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                           at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                           std::optional<at::ScalarType> out_dtype) {
  refuse_forward_ad("mpgemm.conv2d", x, weight, bias);
  at::Tensor y;
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    y = call_conv2d(x, weight, bias, stride, padding, dilation, groups, out_dtype);
  }
  if (records_graph(x, weight, bias)) record_conv2d(y, x, weight, bias, stride, padding, dilation, groups);
  return y;
}

// y as conv2d's; the statistics are not differentiable (batch norm's
// backward differentiates them through y).
std::tuple<at::Tensor, at::Tensor> conv2d_batch_stats_autograd(const at::Tensor& x, const at::Tensor& weight,
                                                              const std::optional<at::Tensor>& bias,
                                                              at::IntArrayRef stride, at::IntArrayRef padding,
                                                              at::IntArrayRef dilation, int64_t groups) {
  refuse_forward_ad("mpgemm.conv2d_batch_stats", x, weight, bias);
  at::Tensor y, batch_mean_var;
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    std::tie(y, batch_mean_var) = call_conv2d_batch_stats(x, weight, bias, stride, padding, dilation, groups);
  }
  if (records_graph(x, weight, bias)) record_conv2d(y, x, weight, bias, stride, padding, dilation, groups);
  return {y, batch_mean_var};
}

at::Tensor mlp_autograd(const at::Tensor& x, const at::Tensor& w1, const std::optional<at::Tensor>& b1,
                       const at::Tensor& w2, const std::optional<at::Tensor>& b2, std::string_view activation) {
  refuse_forward_ad("mpgemm.mlp", x, w1, b1, w2, b2);
  if (!records_graph(x, w1, b1) && !records_graph(x, w2, b2)) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return mlp_forward(x, w1, b1, w2, b2, activation);
  }
  at::Tensor h, z, y;
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    const at::ScalarType dtype = check_mlp_args<c10::SymInt>(x, w1, b1, w2, b2, activation);
    const bool first_wanted = x.requires_grad() || w1.requires_grad() || (b1 && b1->defined() && b1->requires_grad());
    if (activation != "relu" && first_wanted && mlp_pre_activation_from_epilogue())
      std::tie(h, z) = call_with_pre_activation<kLinearPreActivation>(x, block_weight(x, w1, dtype), b1, activation,
                                                                      dtype);
    else
      std::tie(h, z) = mlp_hidden(x, w1, b1, activation, dtype, /*keep_z=*/first_wanted);
    y = call_linear(h, w2, b2, std::nullopt, x.scalar_type());
  }
  auto node = make_node<MlpBackward>();
  node->set_next_edges(torch::autograd::collect_next_edges(x, w1, b1, w2, b2));
  node->activation = std::string(activation);
  if (b1 && b1->defined()) node->b1_dtype = b1->scalar_type();
  if (b2 && b2->defined()) node->b2_dtype = b2->scalar_type();
  node->save(MlpBackward::kX, x);
  node->save(MlpBackward::kW1, w1);
  node->save(MlpBackward::kW2, w2);
  node->save(MlpBackward::kH, h);
  if (z.defined()) node->save(MlpBackward::kZ, z);
  torch::autograd::set_history(y, node);
  node_complete(node);
  return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(mpgemm, Autograd, m) {
  m.impl("gemm", &product_autograd<false>);
  m.impl("linear", &product_autograd<true>);
  m.impl("conv2d", &conv2d_autograd);
  m.impl("conv2d_batch_stats", &conv2d_batch_stats_autograd);
  m.impl("mlp", &mlp_autograd);
}

// mlp below autograd, on each backend: the linears' own kernels.
TORCH_LIBRARY_IMPL(mpgemm, CPU, m) { m.impl("mlp", &mlp_forward); }
TORCH_LIBRARY_IMPL(mpgemm, Meta, m) { m.impl("mlp", &mlp_forward); }
#ifdef MPGEMM_WITH_CUDA
TORCH_LIBRARY_IMPL(mpgemm, CUDA, m) { m.impl("mlp", &mlp_forward); }
#endif

}  // namespace mpgemm
