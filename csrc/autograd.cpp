// Autograd of gemm, linear, mlp and conv2d: C++ autograd Functions registered at
// the Autograd key, so that a call costs the host what one of torch's own
// differentiable ops does (torch.library's Python autograd wrapper cost 5-8x
// a torch.nn.functional.linear call; bench/NOTES.md).
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

std::optional<at::ScalarType> saved_bias_dtype(AutogradContext* ctx, const char* key) {
  const auto found = ctx->saved_data.find(key);
  return found == ctx->saved_data.end() ? std::nullopt : std::optional(found->second.toScalarType());
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

// What a forward keeps of its activation and bias for backward: the
// activation's name (none: empty), and the bias's dtype where it has one.
void save_epilogue(AutogradContext* ctx, std::optional<std::string_view> activation,
                   const std::optional<at::Tensor>& bias) {
  ctx->saved_data["activation"] = std::string(activation.value_or(""));
  if (bias && bias->defined()) ctx->saved_data["bias_dtype"] = bias->scalar_type();
}

const std::string& saved_activation(AutogradContext* ctx) {
  return ctx->saved_data["activation"].toStringRef();
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
// and off the Hopper wide tile it runs the first product twice.
bool mlp_pre_activation_from_epilogue() { return environment_switch("MPGEMM_EPILOGUE_PRE_ACTIVATION", false); }

// MPGEMM_EPILOGUE_BIAS_GRAD: "1" has linear's backward sum its bias's
// gradient in the product that gives the weight's (_gemm_row_sums: the
// Hopper kernels sum dz^T's rows beside it; elsewhere torch sums dz after
// it), where both gradients are wanted; unset or "0" sums dz apart. Opt-in
// until those kernels have passed the GPU tests. Asked by each backward
// that wants both.
bool bias_grad_from_weight_grad() { return environment_switch("MPGEMM_EPILOGUE_BIAS_GRAD"); }

// gemm's or linear's forward (Op, OpPreActivation: the op, and the one that
// returns the pre-activation too), and what it keeps for backward besides the
// operands: GELU's bias (its pre-activation is then recomputed) or with
// pre_activation_saved() its pre-activation z (in y's dtype, as torch.amp's
// gelu saves its input; marked by saved_data "pre_activation"), ReLU's
// output (its mask is y > 0, which is where z > 0 but for z too small for
// y's type, as under torch.amp, whose z has y's type: no product is run
// again).
template <at::Tensor (*Op)(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                           std::optional<std::string_view>, std::optional<at::ScalarType>),
          const char* OpPreActivation>
at::Tensor forward_saving_epilogue(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b,
                                   const std::optional<at::Tensor>& bias,
                                   std::optional<std::string_view> activation,
                                   std::optional<at::ScalarType> out_dtype) {
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  save_epilogue(ctx, activation, bias);
  if (activation == "gelu" && pre_activation_saved()) {
    auto [out, pre_activation] = call_with_pre_activation<OpPreActivation>(a, b, bias, activation, out_dtype);
    ctx->saved_data["pre_activation"] = true;
    ctx->save_for_backward({a, b, pre_activation, at::Tensor()});
    return out;
  }
  at::Tensor out = Op(a, b, bias, activation, out_dtype);
  const bool relu = activation == "relu", gelu = activation == "gelu";
  ctx->save_for_backward({a, b, gelu ? bias.value_or(at::Tensor()) : at::Tensor(), relu ? out : at::Tensor()});
  return out;
}

// dL/dz for y = activation(z): ReLU's from y (`saved[3]`; exact, dy or 0,
// in grad_out's type, which autograd makes y's), GELU's from z saved
// (`saved[2]`, in y's dtype) or in fp32 from z recomputed, or grad_out
// itself without an activation.
template <class Recompute>
at::Tensor pre_activation_grad(AutogradContext* ctx, const at::Tensor& grad_out, const variable_list& saved,
                               const Recompute& pre_activation) {
  const std::string& activation = saved_activation(ctx);
  if (activation.empty()) return grad_out;
  if (activation == "relu") return at::threshold_backward(grad_out, saved[3], 0);
  if (ctx->saved_data.count("pre_activation")) return at::gelu_backward(grad_out, saved[2]);
  return at::gelu_backward(grad_out.to(at::kFloat), pre_activation());
}

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


// Autograd numbers its edges by the tensors a Function got, so the bias,
// last of them, is edge 2 where it was given.
constexpr size_t kBiasEdge = 2;

struct GemmFunction : torch::autograd::Function<GemmFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& a, const at::Tensor& b,
                            const std::optional<at::Tensor>& bias, std::optional<std::string_view> activation,
                            std::optional<at::ScalarType> out_dtype) {
    return forward_saving_epilogue<call_gemm, kGemmPreActivation>(ctx, a, b, bias, activation, out_dtype);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outs) {
    return once_differentiable("mpgemm.gemm", [&]() -> variable_list {
      const variable_list saved = ctx->get_saved_variables();
      const at::Tensor &a = saved[0], &b = saved[1];
      const at::Tensor grad_z = pre_activation_grad(ctx, grad_outs[0], saved, [&] {
        return call_gemm(a, b, optional(saved[2]), std::nullopt, at::kFloat);
      });
      const at::Tensor grad_z16 = grad_z.to(a.scalar_type());
      at::Tensor grad_a, grad_b, grad_bias;
      if (ctx->needs_input_grad(0)) grad_a = operand_grad(grad_z16, b.transpose(-1, -2), a.sym_sizes());
      if (ctx->needs_input_grad(1)) {
        if (b.dim() == 2 && a.dim() == 3) {
          // One GEMM over the flattened batch instead of a batched one and a sum.
          const c10::SymInt k = b.sym_size(0), n = b.sym_size(1), rows = a.sym_size(0) * a.sym_size(1);
          grad_b = call_gemm(a.reshape_symint({rows, k}).t(), grad_z16.reshape_symint({rows, n}), std::nullopt,
                             std::nullopt, a.scalar_type());
        } else {
          grad_b = operand_grad(a.transpose(-1, -2), grad_z16, b.sym_sizes());
        }
      }
      const auto bias_dtype = saved_bias_dtype(ctx);
      if (bias_dtype && ctx->needs_input_grad(kBiasEdge)) grad_bias = bias_grad(grad_z, *bias_dtype);
      return {grad_a, grad_b, grad_bias, at::Tensor(), at::Tensor()};
    });
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

struct LinearFunction : torch::autograd::Function<LinearFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, std::optional<std::string_view> activation,
                            std::optional<at::ScalarType> out_dtype) {
    return forward_saving_epilogue<call_linear, kLinearPreActivation>(ctx, x, weight, bias, activation, out_dtype);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outs) {
    return once_differentiable("mpgemm.linear", [&]() -> variable_list {
      const variable_list saved = ctx->get_saved_variables();
      const at::Tensor &x = saved[0], &weight = saved[1];
      const at::Tensor grad_z = pre_activation_grad(ctx, grad_outs[0], saved, [&] {
        return call_linear(x, weight, optional(saved[2]), std::nullopt, at::kFloat);
      });
      const auto bias_dtype = saved_bias_dtype(ctx);
      variable_list grads =
          linear_gradients(grad_z, x, weight, product_dtype(x, weight), bias_dtype, ctx->needs_input_grad(0),
                           ctx->needs_input_grad(1), bias_dtype && ctx->needs_input_grad(kBiasEdge));
      grads.resize(5);  // activation, out_dtype
      return grads;
    });
  }
};

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
// torch's gelu of its output (GELU kept, and its tanh form, which no forward
// epilogue applies).
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
// mlp_pre_activation_from_epilogue(), else from the linear, h from torch's
// gelu of it (a pass over memory, where computing z again in backward would
// be a product of its own; GELU is then rounded twice, as under torch.amp). ReLU's
// derivative is read off h (h > 0 exactly where z > 0 but for z too small
// for h's type). Backward: dY rounded to h's type once, for every product and the
// second bias's sum; dZ = (dY @ W2) * activation'(z) in one product
// (activation_grad_in_epilogue) or a product and torch's pass, then the
// linears' gradients, all in h's type.
struct MlpFunction : torch::autograd::Function<MlpFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w1,
                            const std::optional<at::Tensor>& b1, const at::Tensor& w2,
                            const std::optional<at::Tensor>& b2, std::string_view activation) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    const at::ScalarType dtype = check_mlp_args<c10::SymInt>(x, w1, b1, w2, b2, activation);
    const bool gelu = activation == "gelu";
    ctx->saved_data["activation"] = std::string(activation);
    if (b1 && b1->defined()) ctx->saved_data["b1_dtype"] = b1->scalar_type();
    if (b2 && b2->defined()) ctx->saved_data["b2_dtype"] = b2->scalar_type();
    const bool first_wanted = x.requires_grad() || w1.requires_grad() || (b1 && b1->defined() && b1->requires_grad());
    at::Tensor h, z;
    if (gelu && first_wanted && mlp_pre_activation_from_epilogue())
      std::tie(h, z) = call_with_pre_activation<kLinearPreActivation>(x, block_weight(x, w1, dtype), b1, activation,
                                                                      dtype);
    else
      std::tie(h, z) = mlp_hidden(x, w1, b1, activation, dtype, /*keep_z=*/first_wanted);
    ctx->save_for_backward({x, w1, w2, h, z});
    return call_linear(h, w2, b2, std::nullopt, x.scalar_type());
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outs) {
    return once_differentiable("mpgemm.mlp", [&]() -> variable_list {
      const variable_list saved = ctx->get_saved_variables();
      const at::Tensor &x = saved[0], &w1 = saved[1], &w2 = saved[2], &h = saved[3];
      // Autograd numbers the edges by the tensors given: x, w1, b1 (if any), w2, b2 (if any).
      const auto b1_dtype = saved_bias_dtype(ctx, "b1_dtype"), b2_dtype = saved_bias_dtype(ctx, "b2_dtype");
      const size_t w2_edge = b1_dtype ? 3 : 2;
      const bool want_x = ctx->needs_input_grad(0), want_w1 = ctx->needs_input_grad(1),
                 want_b1 = b1_dtype && ctx->needs_input_grad(kBiasEdge);
      const at::ScalarType dtype = h.scalar_type();
      const c10::SymInt hidden = w1.sym_size(0), out_features = w2.sym_size(0);
      const auto h_sizes = h.sym_sizes();
      const c10::SymInt rows = product(h_sizes.slice(0, h_sizes.size() - 1));
      const at::Tensor grad_y = grad_outs[0].reshape_symint({rows, out_features}).to(dtype);
      const variable_list second = linear_gradients(grad_y, h, w2, dtype, b2_dtype, false,
                                                    ctx->needs_input_grad(w2_edge),
                                                    b2_dtype && ctx->needs_input_grad(w2_edge + 1));
      variable_list first(3);
      if (want_x || want_w1 || want_b1) {
        const std::string& activation = saved_activation(ctx);
        const at::Tensor h2d = h.reshape_symint({rows, hidden});
        const at::Tensor w2_16 = w2.to(dtype);
        // The forward kept GELU's input wherever x, w1 or b1 wanted a gradient.
        TORCH_INTERNAL_ASSERT(activation == "relu" || saved[4].defined(), "mpgemm.mlp: GELU's input was not saved");
        const at::Tensor z = activation == "relu" ? h2d : saved[4].reshape_symint({rows, hidden});
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
      return {first[0], first[1], first[2], second[1], second[2], at::Tensor()};
    });
  }
};

// What conv2d's backward needs of its forward: x, the weight, the geometry
// and the bias's dtype.
void save_conv2d(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                 const std::optional<at::Tensor>& bias, at::IntArrayRef stride, at::IntArrayRef padding,
                 at::IntArrayRef dilation, int64_t groups) {
  save_epilogue(ctx, std::nullopt, bias);
  ctx->saved_data["stride"] = stride;
  ctx->saved_data["padding"] = padding;
  ctx->saved_data["dilation"] = dilation;
  ctx->saved_data["groups"] = groups;
  ctx->save_for_backward({x, weight});
}

// The gradients of x, the weight and the bias from y's, then `extra` undefined
// ones for the geometry's arguments.
variable_list conv2d_gradients(AutogradContext* ctx, const at::Tensor& grad_out, int extra) {
  return once_differentiable("mpgemm.conv2d", [&]() -> variable_list {
    static const auto both = op_handle<ConvGradientsSignature>("mpgemm::conv2d_backward");
    static const auto input = op_handle<ConvGradientSignature>("mpgemm::conv2d_grad_input");
    static const auto filters = op_handle<ConvGradientSignature>("mpgemm::conv2d_grad_weight");
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1];
    const std::vector<int64_t> stride = ctx->saved_data["stride"].toIntVector(),
                               padding = ctx->saved_data["padding"].toIntVector(),
                               dilation = ctx->saved_data["dilation"].toIntVector();
    const int64_t groups = ctx->saved_data["groups"].toInt();
    at::Tensor grad_x, grad_weight, grad_bias;
    const bool want_x = ctx->needs_input_grad(0), want_weight = ctx->needs_input_grad(1);
    if (want_x && want_weight)
      std::tie(grad_x, grad_weight) = both.call(grad_out, x, weight, stride, padding, dilation, groups);
    else if (want_x)
      grad_x = input.call(grad_out, x, weight, stride, padding, dilation, groups);
    else if (want_weight)
      grad_weight = filters.call(grad_out, x, weight, stride, padding, dilation, groups);
    const auto bias_dtype = saved_bias_dtype(ctx);
    if (bias_dtype && ctx->needs_input_grad(kBiasEdge)) grad_bias = sum_to(grad_out, {0, 2, 3}, *bias_dtype);
    variable_list grads{grad_x, grad_weight, grad_bias};
    grads.resize(grads.size() + extra);
    return grads;
  });
}

struct Conv2dFunction : torch::autograd::Function<Conv2dFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const std::optional<at::Tensor>& bias, at::IntArrayRef stride, at::IntArrayRef padding,
                            at::IntArrayRef dilation, int64_t groups, std::optional<at::ScalarType> out_dtype) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    save_conv2d(ctx, x, weight, bias, stride, padding, dilation, groups);
    return call_conv2d(x, weight, bias, stride, padding, dilation, groups, out_dtype);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outs) {
    return conv2d_gradients(ctx, grad_outs[0], 5);  // stride, padding, dilation, groups, out_dtype
  }
};

// conv2d_batch_stats: y as conv2d's; the statistics are not differentiable
// (batch norm's backward differentiates them through y).
struct Conv2dBatchStatsFunction : torch::autograd::Function<Conv2dBatchStatsFunction> {
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                               const std::optional<at::Tensor>& bias, at::IntArrayRef stride, at::IntArrayRef padding,
                               at::IntArrayRef dilation, int64_t groups) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    save_conv2d(ctx, x, weight, bias, stride, padding, dilation, groups);
    auto [y, batch_mean_var] = call_conv2d_batch_stats(x, weight, bias, stride, padding, dilation, groups);
    ctx->mark_non_differentiable({batch_mean_var});
    return {y, batch_mean_var};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outs) {
    return conv2d_gradients(ctx, grad_outs[0], 4);  // stride, padding, dilation, groups
  }
};

at::Tensor gemm_autograd(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                         std::optional<std::string_view> activation, std::optional<at::ScalarType> out_dtype) {
  if (records_graph(a, b, bias)) return GemmFunction::apply(a, b, bias, activation, out_dtype);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return call_gemm(a, b, bias, activation, out_dtype);
}

at::Tensor linear_autograd(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                           std::optional<std::string_view> activation, std::optional<at::ScalarType> out_dtype) {
  if (records_graph(x, weight, bias)) return LinearFunction::apply(x, weight, bias, activation, out_dtype);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return call_linear(x, weight, bias, activation, out_dtype);
}

at::Tensor conv2d_autograd(const at::Tensor& x, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                           at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                           std::optional<at::ScalarType> out_dtype) {
  if (records_graph(x, weight, bias))
    return Conv2dFunction::apply(x, weight, bias, stride, padding, dilation, groups, out_dtype);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return call_conv2d(x, weight, bias, stride, padding, dilation, groups, out_dtype);
}

at::Tensor mlp_autograd(const at::Tensor& x, const at::Tensor& w1, const std::optional<at::Tensor>& b1,
                       const at::Tensor& w2, const std::optional<at::Tensor>& b2, std::string_view activation) {
  if (records_graph(x, w1, b1) || records_graph(x, w2, b2))
    return MlpFunction::apply(x, w1, b1, w2, b2, activation);
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return mlp_forward(x, w1, b1, w2, b2, activation);
}

std::tuple<at::Tensor, at::Tensor> conv2d_batch_stats_autograd(const at::Tensor& x, const at::Tensor& weight,
                                                              const std::optional<at::Tensor>& bias,
                                                              at::IntArrayRef stride, at::IntArrayRef padding,
                                                              at::IntArrayRef dilation, int64_t groups) {
  if (records_graph(x, weight, bias)) {
    const variable_list out = Conv2dBatchStatsFunction::apply(x, weight, bias, stride, padding, dilation, groups);
    return {out[0], out[1]};
  }
  const at::AutoDispatchBelowADInplaceOrView below_autograd;
  return call_conv2d_batch_stats(x, weight, bias, stride, padding, dilation, groups);
}

}  // namespace

TORCH_LIBRARY_IMPL(mpgemm, Autograd, m) {
  m.impl("gemm", &gemm_autograd);
  m.impl("linear", &linear_autograd);
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
