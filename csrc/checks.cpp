// Argument validation for the ops, and the environment's opt-in switches.
// Every backend, Meta included, runs these checks, so a bad call fails the
// same way everywhere.
#include <limits>
#include <sstream>
#include <stdexcept>
#include <string>

#include <ATen/MemoryOverlap.h>
#include <c10/core/SymInt.h>
#include <c10/util/Exception.h>

#include "common/tile_configs.h"
#include "ops.h"
#include "plan/switches.h"

namespace mpgemm {
namespace {

template <class Size>
Size dim_size(const at::Tensor& t, int64_t dim);
template <>
int64_t dim_size<int64_t>(const at::Tensor& t, int64_t dim) {
  return t.size(dim);
}
template <>
c10::SymInt dim_size<c10::SymInt>(const at::Tensor& t, int64_t dim) {
  return t.sym_size(dim);
}

// Python spelling, so messages say what a Python caller writes.
std::string dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf: return "torch.float16";
    case at::kFloat: return "torch.float32";
    case at::kDouble: return "torch.float64";
    case at::kBFloat16: return "torch.bfloat16";
    default: {
      std::string name = c10::toString(dtype);
      for (char& c : name) c = static_cast<char>(std::tolower(c));
      return "torch." + name;
    }
  }
}

std::string shape_of(const at::Tensor& t) {
  std::ostringstream out;
  out << "(";
  for (int64_t d = 0; d < t.dim(); ++d) out << (d ? ", " : "") << t.sym_size(d);
  out << (t.dim() == 1 ? ",)" : ")");
  return out.str();
}

void check_same_device(const char* op, const at::Tensor& anchor, const char* anchor_name, const at::Tensor& t,
                       const char* name) {
  TORCH_CHECK_VALUE(t.device() == anchor.device(), op, ": expected ", name, " on the same device as ", anchor_name,
                    " (", anchor.device(), "), got ", name, " on ", t.device());
}

bool is_16_bit(at::ScalarType dtype) { return dtype == at::kHalf || dtype == at::kBFloat16; }
bool is_float_type(at::ScalarType dtype) { return is_16_bit(dtype) || dtype == at::kFloat; }
constexpr const char* kFloatTypes = "torch.float16, torch.bfloat16 or torch.float32";

// The one rule for the type of a Tensor Core product's inputs. gemm takes two
// 16-bit operands of one type. linear and conv2d take fp16, bf16 or fp32 for
// each: the product is in bf16 if either is bf16, else in fp16, and an fp32
// tensor is rounded to that type. fp16 with bf16 is refused, as no rounding of
// one to the other is exact.
at::ScalarType product_input_dtype(const char* op, const at::Tensor& x, const char* x_name, const at::Tensor& w,
                                   const char* w_name, bool fp32_allowed) {
  for (const auto& [t, name] : {std::pair{&x, x_name}, std::pair{&w, w_name}}) {
    if (fp32_allowed) {
      TORCH_CHECK_TYPE(is_float_type(t->scalar_type()), op, ": expected ", name, " to be ", kFloatTypes, ", got ",
                       dtype_name(t->scalar_type()));
    } else {
      TORCH_CHECK_TYPE(is_16_bit(t->scalar_type()), op, ": expected ", name,
                       " to be torch.float16 or torch.bfloat16, got ", dtype_name(t->scalar_type()),
                       "; convert it with ", name, ".half() or ", name, ".bfloat16()");
    }
  }
  const at::ScalarType xt = x.scalar_type(), wt = w.scalar_type();
  TORCH_CHECK_TYPE(!(is_16_bit(xt) && is_16_bit(wt) && xt != wt), op, ": ", x_name, " is ", dtype_name(xt), " but ",
                   w_name, " is ", dtype_name(wt), "; expected both torch.float16 or both torch.bfloat16",
                   fp32_allowed ? " (an fp32 one is rounded to the other's type)" : "");
  return xt == at::kBFloat16 || wt == at::kBFloat16 ? at::kBFloat16 : at::kHalf;
}

// An output is fp32 or the product's input type.
void check_output_dtype(const char* op, const char* name, at::ScalarType dtype, at::ScalarType input_dtype) {
  TORCH_CHECK_VALUE(dtype == at::kFloat || dtype == input_dtype, op, ": ", name, " must be torch.float32 or ",
                    dtype_name(input_dtype), " (the type of the product's inputs), got ", dtype_name(dtype));
}

void check_gemm_operand(const at::Tensor& t, const char* name, const char* shape_2d, const char* shape_3d) {
  TORCH_CHECK_VALUE(t.dim() == 2 || t.dim() == 3, "mpgemm.gemm: expected ", name, " to be 2-D ", shape_2d,
                    " or 3-D ", shape_3d, ", got a ", t.dim(), "-D tensor of shape ", shape_of(t));
}

kernels::Activation parse_activation(const char* op, std::optional<std::string_view> activation) {
  if (!activation) return kernels::Activation::kNone;
  if (*activation == "relu") return kernels::Activation::kRelu;
  if (*activation == "gelu") return kernels::Activation::kGelu;
  TORCH_CHECK_VALUE(false, op, ": activation must be None, 'relu' or 'gelu', got '", *activation, "'");
}

// A bias of `n` elements (named `shape_name` in messages), on anchor's
// device; `name`, the argument's.
template <class Size>
void check_bias(const char* op, const std::optional<at::Tensor>& bias, const Size& n, const char* shape_name,
                const at::Tensor& anchor, const char* anchor_name, const char* name = "bias") {
  if (!bias) return;
  const at::Tensor& t = *bias;
  TORCH_CHECK_TYPE(is_float_type(t.scalar_type()), op, ": expected ", name, " to be ", kFloatTypes, ", got ",
                   dtype_name(t.scalar_type()));
  TORCH_CHECK_VALUE(t.dim() == 1 && dim_size<Size>(t, 0) == n, op, ": expected ", name, " of shape ", shape_name,
                    " = (", n, ",), got shape ", shape_of(t));
  check_same_device(op, anchor, anchor_name, t, name);
}

// Each of `tensors` has `anchor`'s dtype, shape and device (`anchor_name`
// names it in the messages).
template <class NamedTensors>
void check_like(const char* op, const at::Tensor& anchor, const char* anchor_name, const NamedTensors& tensors) {
  for (const auto& [t, name] : tensors) {
    TORCH_CHECK_TYPE(t->scalar_type() == anchor.scalar_type(), op, ": expected ", name, " to have ", anchor_name,
                     "'s dtype (", dtype_name(anchor.scalar_type()), "), got ", dtype_name(t->scalar_type()));
    TORCH_CHECK_VALUE(t->sym_sizes() == anchor.sym_sizes(), op, ": expected ", name, " of ", anchor_name,
                      "'s shape ", shape_of(anchor), ", got shape ", shape_of(*t));
    check_same_device(op, anchor, anchor_name, *t, name);
  }
}

// The epilogue's arguments, common to every op that ends in one.
template <class Size>
void check_epilogue(const char* op, GemmProblem<Size>& problem, const at::Tensor& anchor, const char* anchor_name,
                    const std::optional<at::Tensor>& bias, const char* bias_shape,
                    std::optional<std::string_view> activation, std::optional<at::ScalarType> out_dtype,
                    at::ScalarType default_out_dtype) {
  check_bias(op, bias, problem.n, bias_shape, anchor, anchor_name);
  problem.activation = parse_activation(op, activation);
  problem.out_dtype = out_dtype.value_or(default_out_dtype);
  check_output_dtype(op, "out_dtype", problem.out_dtype, problem.input_dtype);
}

}  // namespace

template <class Size>
GemmProblem<Size> check_gemm_args(const at::Tensor& a, const at::Tensor& b, const std::optional<at::Tensor>& bias,
                                  std::optional<std::string_view> activation,
                                  std::optional<at::ScalarType> out_dtype) {
  GemmProblem<Size> problem;
  problem.input_dtype = product_input_dtype("mpgemm.gemm", a, "a", b, "b", /*fp32_allowed=*/false);
  check_gemm_operand(a, "a", "(M, K)", "(B, M, K)");
  check_gemm_operand(b, "b", "(K, N)", "(B, K, N)");
  check_same_device("mpgemm.gemm", a, "a", b, "b");

  problem.m = dim_size<Size>(a, -2);
  problem.k = dim_size<Size>(a, -1);
  problem.n = dim_size<Size>(b, -1);
  TORCH_CHECK_VALUE(dim_size<Size>(b, -2) == problem.k, "mpgemm.gemm: mismatched inner dimensions: a has shape ",
                    shape_of(a), " and b has shape ", shape_of(b), "; a.shape[-1] (K) must equal b.shape[-2]");

  problem.batch = 1;
  if (a.dim() == 3 && b.dim() == 3) {
    const Size batch_a = dim_size<Size>(a, 0), batch_b = dim_size<Size>(b, 0);
    TORCH_CHECK_VALUE(batch_a == batch_b || batch_a == 1 || batch_b == 1,
                      "mpgemm.gemm: batch sizes do not broadcast: a has shape ", shape_of(a), " and b has shape ",
                      shape_of(b), "; a.shape[0] and b.shape[0] must be equal or 1");
    problem.batch = batch_a == 1 ? batch_b : batch_a;
  } else if (a.dim() == 3) {
    problem.batch = dim_size<Size>(a, 0);
  } else if (b.dim() == 3) {
    problem.batch = dim_size<Size>(b, 0);
  }
  if (a.dim() == 3 || b.dim() == 3) problem.out_shape = {problem.batch, problem.m, problem.n};
  else problem.out_shape = {problem.m, problem.n};

  check_epilogue("mpgemm.gemm", problem, a, "a", bias, "(N,)", activation, out_dtype, at::kFloat);
  return problem;
}

template <class Size>
GemmProblem<Size> check_linear_args(const at::Tensor& x, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, std::optional<std::string_view> activation,
                                    std::optional<at::ScalarType> out_dtype) {
  constexpr const char* op = "mpgemm.linear";
  const at::ScalarType input_dtype = product_input_dtype(op, x, "x", weight, "weight", /*fp32_allowed=*/true);
  TORCH_CHECK_VALUE(weight.dim() == 2, op, ": expected weight to be 2-D (out_features, in_features), got a ",
                    weight.dim(), "-D tensor of shape ", shape_of(weight));
  TORCH_CHECK_VALUE(x.dim() >= 1, op, ": expected x of shape (..., in_features), got a 0-D tensor");
  check_same_device(op, x, "x", weight, "weight");

  GemmProblem<Size> problem;
  problem.op = op;
  problem.input_dtype = input_dtype;
  problem.batch = 1;
  problem.k = dim_size<Size>(x, -1);
  problem.n = dim_size<Size>(weight, 0);
  TORCH_CHECK_VALUE(dim_size<Size>(weight, 1) == problem.k, op, ": x has shape ", shape_of(x),
                    " but weight has shape ", shape_of(weight),
                    "; x.shape[-1] must equal in_features = weight.shape[1]");
  problem.m = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) {
    problem.m = problem.m * dim_size<Size>(x, d);
    problem.out_shape.push_back(dim_size<Size>(x, d));
  }
  problem.out_shape.push_back(problem.n);
  check_epilogue(op, problem, x, "x", bias, "(out_features,)", activation, out_dtype, x.scalar_type());
  return problem;
}

template <class Size>
GemmProblem<Size> check_2d_gemm_args(const char* op, const at::Tensor& a, const at::Tensor& b,
                                     std::optional<at::ScalarType> out_dtype) {
  auto problem = check_gemm_args<Size>(a, b, std::nullopt, std::nullopt, out_dtype);
  problem.op = op;
  TORCH_CHECK_VALUE(a.dim() == 2 && b.dim() == 2, op, ": expected 2-D a and b, got ", a.dim(), "-D and ", b.dim(),
                    "-D");
  return problem;
}

// The activations whose derivative _gemm_activation_grad and mlp take:
// gemm's and linear's, and GELU's tanh form (torch's approximate="tanh").
kernels::Activation parse_differentiated_activation(const char* op, std::string_view activation) {
  if (activation == "gelu_tanh") return kernels::Activation::kGeluTanh;
  TORCH_CHECK_VALUE(activation == "relu" || activation == "gelu", op,
                    ": activation must be 'relu', 'gelu' or 'gelu_tanh', got '", activation, "'");
  return parse_activation(op, activation);
}

template <class Size>
GemmProblem<Size> check_activation_grad_args(const at::Tensor& a, const at::Tensor& b,
                                             const at::Tensor& activation_input, std::string_view activation) {
  constexpr const char* op = "mpgemm._gemm_activation_grad";
  auto problem = check_2d_gemm_args<Size>(op, a, b, a.scalar_type());
  problem.activation = parse_differentiated_activation(op, activation);
  TORCH_CHECK_TYPE(activation_input.scalar_type() == problem.input_dtype, op,
                   ": expected activation_input to have a's dtype (", dtype_name(problem.input_dtype), "), got ",
                   dtype_name(activation_input.scalar_type()));
  TORCH_CHECK_VALUE(activation_input.dim() == 2 && dim_size<Size>(activation_input, 0) == problem.m &&
                        dim_size<Size>(activation_input, 1) == problem.n,
                    op, ": expected activation_input of shape (M, N) = (", problem.m, ", ", problem.n,
                    "), got shape ", shape_of(activation_input));
  check_same_device(op, a, "a", activation_input, "activation_input");
  return problem;
}

template <class Size>
at::ScalarType check_mlp_args(const at::Tensor& x, const at::Tensor& w1, const std::optional<at::Tensor>& b1,
                              const at::Tensor& w2, const std::optional<at::Tensor>& b2,
                              std::string_view activation) {
  constexpr const char* op = "mpgemm.mlp";
  parse_differentiated_activation(op, activation);
  // One product type for both linears: pairwise, fp16 with bf16 is refused.
  const at::ScalarType dtype = product_input_dtype(op, x, "x", w1, "w1", /*fp32_allowed=*/true);
  product_input_dtype(op, x, "x", w2, "w2", /*fp32_allowed=*/true);
  const at::ScalarType weights_dtype = product_input_dtype(op, w1, "w1", w2, "w2", /*fp32_allowed=*/true);
  for (const auto& [w, name] : {std::pair{&w1, "w1"}, std::pair{&w2, "w2"}})
    TORCH_CHECK_VALUE(w->dim() == 2, op, ": expected ", name, " to be 2-D (out_features, in_features), got a ",
                      w->dim(), "-D tensor of shape ", shape_of(*w));
  TORCH_CHECK_VALUE(x.dim() >= 1, op, ": expected x of shape (..., in_features), got a 0-D tensor");
  check_same_device(op, x, "x", w1, "w1");
  check_same_device(op, x, "x", w2, "w2");
  const Size in_features = dim_size<Size>(w1, 1), hidden = dim_size<Size>(w1, 0);
  TORCH_CHECK_VALUE(dim_size<Size>(x, -1) == in_features, op, ": x has shape ", shape_of(x), " but w1 has shape ",
                    shape_of(w1), "; x.shape[-1] must equal w1.shape[1]");
  TORCH_CHECK_VALUE(dim_size<Size>(w2, 1) == hidden, op, ": w1 has shape ", shape_of(w1), " but w2 has shape ",
                    shape_of(w2), "; w2.shape[1] must equal w1.shape[0] (the hidden features)");
  check_bias(op, b1, hidden, "(w1.shape[0],)", x, "x", "b1");
  check_bias(op, b2, dim_size<Size>(w2, 0), "(w2.shape[0],)", x, "x", "b2");
  return dtype == at::kBFloat16 || weights_dtype == at::kBFloat16 ? at::kBFloat16 : at::kHalf;
}

kernels::GateActivation parse_gate_activation(const char* op, std::string_view activation) {
  if (activation == "silu") return kernels::GateActivation::kSilu;
  if (activation == "gelu") return kernels::GateActivation::kGelu;
  TORCH_CHECK_VALUE(activation == "gelu_tanh", op, ": activation must be 'silu', 'gelu' or 'gelu_tanh', got '",
                    activation, "'");
  return kernels::GateActivation::kGeluTanh;
}

kernels::GateActivation check_gated_activation_args(const char* op, std::initializer_list<NamedTensor> tensors,
                                                    std::string_view activation) {
  const auto& [first, first_name] = *tensors.begin();
  TORCH_CHECK_TYPE(is_16_bit(first->scalar_type()), op, ": expected ", first_name,
                   " to be torch.float16 or torch.bfloat16, got ", dtype_name(first->scalar_type()));
  check_like(op, *first, first_name, tensors);
  return parse_gate_activation(op, activation);
}

template <class Size>
at::ScalarType check_gated_mlp_args(const at::Tensor& x, const at::Tensor& w_gate,
                                    const std::optional<at::Tensor>& b_gate, const at::Tensor& w_up,
                                    const std::optional<at::Tensor>& b_up, const at::Tensor& w_down,
                                    const std::optional<at::Tensor>& b_down, std::string_view activation) {
  constexpr const char* op = "mpgemm.gated_mlp";
  parse_gate_activation(op, activation);
  const NamedTensor weights[] = {{&w_gate, "w_gate"}, {&w_up, "w_up"}, {&w_down, "w_down"}};
  // One product type for the three products: pairwise, fp16 with bf16 is refused.
  bool bf16 = false;
  for (const auto& [w, name] : weights) {
    bf16 |= product_input_dtype(op, x, "x", *w, name, /*fp32_allowed=*/true) == at::kBFloat16;
    TORCH_CHECK_VALUE(w->dim() == 2, op, ": expected ", name, " to be 2-D (out_features, in_features), got a ",
                      w->dim(), "-D tensor of shape ", shape_of(*w));
    check_same_device(op, x, "x", *w, name);
  }
  product_input_dtype(op, w_gate, "w_gate", w_up, "w_up", /*fp32_allowed=*/true);
  product_input_dtype(op, w_gate, "w_gate", w_down, "w_down", /*fp32_allowed=*/true);
  product_input_dtype(op, w_up, "w_up", w_down, "w_down", /*fp32_allowed=*/true);
  TORCH_CHECK_VALUE(x.dim() >= 1, op, ": expected x of shape (..., in_features), got a 0-D tensor");
  const Size in_features = dim_size<Size>(w_gate, 1), hidden = dim_size<Size>(w_gate, 0);
  TORCH_CHECK_VALUE(dim_size<Size>(x, -1) == in_features, op, ": x has shape ", shape_of(x), " but w_gate has shape ",
                    shape_of(w_gate), "; x.shape[-1] must equal w_gate.shape[1]");
  TORCH_CHECK_VALUE(dim_size<Size>(w_up, 0) == hidden && dim_size<Size>(w_up, 1) == in_features, op,
                    ": w_gate has shape ", shape_of(w_gate), " but w_up has shape ", shape_of(w_up),
                    "; expected the same shape");
  TORCH_CHECK_VALUE(dim_size<Size>(w_down, 1) == hidden, op, ": w_gate has shape ", shape_of(w_gate),
                    " but w_down has shape ", shape_of(w_down),
                    "; w_down.shape[1] must equal w_gate.shape[0] (the hidden features)");
  check_bias(op, b_gate, hidden, "(w_gate.shape[0],)", x, "x", "b_gate");
  check_bias(op, b_up, hidden, "(w_up.shape[0],)", x, "x", "b_up");
  check_bias(op, b_down, dim_size<Size>(w_down, 0), "(w_down.shape[0],)", x, "x", "b_down");
  return bf16 ? at::kBFloat16 : at::kHalf;
}

#define MPGEMM_INSTANTIATE_CHECKS(Size)                                                                         \
  template GemmProblem<Size> check_gemm_args<Size>(const at::Tensor&, const at::Tensor&,                      \
                                                   const std::optional<at::Tensor>&,                           \
                                                   std::optional<std::string_view>, std::optional<at::ScalarType>); \
  template GemmProblem<Size> check_linear_args<Size>(const at::Tensor&, const at::Tensor&,                    \
                                                     const std::optional<at::Tensor>&,                         \
                                                     std::optional<std::string_view>, std::optional<at::ScalarType>); \
  template GemmProblem<Size> check_2d_gemm_args<Size>(const char*, const at::Tensor&, const at::Tensor&,        \
                                                      std::optional<at::ScalarType>);                              \
  template GemmProblem<Size> check_activation_grad_args<Size>(const at::Tensor&, const at::Tensor&,             \
                                                              const at::Tensor&, std::string_view);             \
  template at::ScalarType check_mlp_args<Size>(const at::Tensor&, const at::Tensor&,                            \
                                               const std::optional<at::Tensor>&, const at::Tensor&,             \
                                               const std::optional<at::Tensor>&, std::string_view);      \
  template at::ScalarType check_gated_mlp_args<Size>(                                                           \
      const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, const at::Tensor&,               \
      const std::optional<at::Tensor>&, const at::Tensor&, const std::optional<at::Tensor>&, std::string_view);
MPGEMM_INSTANTIATE_CHECKS(int64_t)
MPGEMM_INSTANTIATE_CHECKS(c10::SymInt)

template <class Size>
ConvProblem<Size> check_conv2d_args(const char* op, const at::Tensor& x, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                                    at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                                    std::optional<at::ScalarType> out_dtype) {
  const at::ScalarType input_dtype = product_input_dtype(op, x, "x", weight, "weight", /*fp32_allowed=*/true);
  TORCH_CHECK_VALUE(x.dim() == 4, op, ": expected x to be 4-D (N, C, H, W) or 3-D (C, H, W), got a ", x.dim(),
                    "-D tensor of shape ", shape_of(x));
  TORCH_CHECK_VALUE(weight.dim() == 4, op, ": expected weight to be 4-D (out_channels, in_channels / groups, kH, kW),",
                    " got a ", weight.dim(), "-D tensor of shape ", shape_of(weight));
  check_same_device(op, x, "x", weight, "weight");
  TORCH_CHECK_VALUE(stride.size() == 2 && stride[0] > 0 && stride[1] > 0, op,
                    ": stride must be two positive integers, got ", stride);
  TORCH_CHECK_VALUE(dilation.size() == 2 && dilation[0] > 0 && dilation[1] > 0, op,
                    ": dilation must be two positive integers, got ", dilation);
  TORCH_CHECK_VALUE(padding.size() == 4 && padding[0] >= 0 && padding[1] >= 0 && padding[2] >= 0 && padding[3] >= 0,
                    op, ": padding must be non-negative, got ", padding);
  TORCH_CHECK_VALUE(groups > 0, op, ": groups must be positive, got ", groups);

  ConvProblem<Size> problem;
  problem.op = op;
  problem.input_dtype = input_dtype;
  problem.n = dim_size<Size>(x, 0);
  problem.c = dim_size<Size>(x, 1);
  problem.h = dim_size<Size>(x, 2);
  problem.w = dim_size<Size>(x, 3);
  problem.k = dim_size<Size>(weight, 0);
  problem.r = dim_size<Size>(weight, 2);
  problem.s = dim_size<Size>(weight, 3);
  problem.groups = groups;
  TORCH_CHECK_VALUE(problem.c % groups == 0 && problem.k % groups == 0, op, ": groups (", groups,
                    ") must divide the input channels (", problem.c, ") and the output channels (", problem.k, ")");
  TORCH_CHECK_VALUE(dim_size<Size>(weight, 1) * groups == problem.c, op, ": x has ", problem.c,
                    " channels but weight expects ", dim_size<Size>(weight, 1), " per group x ", groups,
                    " groups; weight.shape[1] * groups must equal x.shape[1]");
  std::copy(stride.begin(), stride.end(), problem.stride.begin());
  std::copy(dilation.begin(), dilation.end(), problem.dilation.begin());
  std::copy(padding.begin(), padding.end(), problem.padding.begin());
  const Size span_h = (problem.r - 1) * dilation[0] + 1, span_w = (problem.s - 1) * dilation[1] + 1;
  const Size padded_h = problem.h + padding[0] + padding[1], padded_w = problem.w + padding[2] + padding[3];
  TORCH_CHECK_VALUE(padded_h >= span_h && padded_w >= span_w, op, ": the padded input (", padded_h, ", ", padded_w,
                    ") is smaller than the dilated kernel (", span_h, ", ", span_w, ")");
  problem.p = (padded_h - span_h) / stride[0] + 1;
  problem.q = (padded_w - span_w) / stride[1] + 1;
  problem.channels_last = x.suggest_memory_format() == at::MemoryFormat::ChannelsLast;

  check_bias(op, bias, problem.k, "(out_channels,)", x, "x");
  problem.out_dtype = out_dtype.value_or(x.scalar_type());
  check_output_dtype(op, "out_dtype", problem.out_dtype, problem.input_dtype);
  return problem;
}

template ConvProblem<int64_t> check_conv2d_args<int64_t>(const char*, const at::Tensor&, const at::Tensor&,
                                                         const std::optional<at::Tensor>&, at::IntArrayRef,
                                                         at::IntArrayRef, at::IntArrayRef, int64_t,
                                                         std::optional<at::ScalarType>);
template ConvProblem<c10::SymInt> check_conv2d_args<c10::SymInt>(const char*, const at::Tensor&, const at::Tensor&,
                                                                 const std::optional<at::Tensor>&, at::IntArrayRef,
                                                                 at::IntArrayRef, at::IntArrayRef, int64_t,
                                                                 std::optional<at::ScalarType>);

void check_conv2d_grad_out(const char* op, const ConvProblem<int64_t>& problem, const at::Tensor& x,
                           const at::Tensor& grad_out) {
  const at::ScalarType dtype = grad_out.scalar_type();
  TORCH_CHECK_TYPE(dtype == at::kFloat || dtype == problem.input_dtype, op, ": expected grad_out to be torch.float32 or ",
                   dtype_name(problem.input_dtype), " (the type of the product's inputs), got ", dtype_name(dtype));
  const std::vector<int64_t> expected{problem.n, problem.k, problem.p, problem.q};
  TORCH_CHECK_VALUE(grad_out.sizes() == at::IntArrayRef(expected), op, ": expected grad_out of shape ",
                    at::IntArrayRef(expected), ", got ", grad_out.sizes());
  check_same_device(op, x, "x", grad_out, "grad_out");
}

void check_conv2d_grad_input_addend(const char* op, const at::Tensor& x, const at::Tensor& addend) {
  TORCH_CHECK_TYPE(addend.scalar_type() == x.scalar_type(), op, ": expected addend to have x's dtype ",
                   dtype_name(x.scalar_type()), ", got ", dtype_name(addend.scalar_type()));
  TORCH_CHECK_VALUE(addend.sym_sizes() == x.sym_sizes(), op, ": expected addend of x's shape ", shape_of(x),
                    ", got ", shape_of(addend));
  check_same_device(op, x, "x", addend, "addend");
}

bool environment_switch(const char* name, bool default_on) {
  bool on = false;
  try {
    on = kernels::switch_on(name, default_on);
  } catch (const std::invalid_argument& e) {
    TORCH_CHECK_VALUE(false, e.what());
  }
  return on;
}

void check_gemm_out(const GemmProblem<int64_t>& problem, const at::Tensor& a, const at::Tensor& out) {
  TORCH_CHECK_VALUE(out.sizes() == at::IntArrayRef(problem.out_shape), "mpgemm.gemm: expected out of shape ",
                    at::IntArrayRef(problem.out_shape), ", got ", out.sizes());
  check_same_device("mpgemm.gemm", a, "a", out, "out");
  TORCH_CHECK_VALUE(out.is_contiguous(), "mpgemm.gemm: expected a contiguous out tensor");
  at::assert_no_internal_overlap(out);
}

void check_unscale_args(at::TensorList grads, at::TensorList outs, const at::Tensor& found_inf,
                        const at::Tensor& inv_scale) {
  constexpr const char* op = "mpgemm.unscale_grads_";
  TORCH_CHECK_VALUE(grads.size() == outs.size(), op, ": expected as many outs as grads, got ", outs.size(), " and ",
                    grads.size());
  for (const auto& [t, name] : {std::pair{&found_inf, "found_inf"}, std::pair{&inv_scale, "inv_scale"}}) {
    TORCH_CHECK_TYPE(t->scalar_type() == at::kFloat, op, ": expected ", name, " to be torch.float32, got ",
                     dtype_name(t->scalar_type()));
    TORCH_CHECK_VALUE(t->numel() == 1, op, ": expected ", name, " to hold one element, got shape ", shape_of(*t));
  }
  check_same_device(op, found_inf, "found_inf", inv_scale, "inv_scale");
  for (size_t i = 0; i < grads.size(); ++i) {
    const std::string grad = "grads[" + std::to_string(i) + "]", out = "outs[" + std::to_string(i) + "]";
    TORCH_CHECK_TYPE(is_float_type(grads[i].scalar_type()) && is_float_type(outs[i].scalar_type()), op,
                     ": expected ", grad, " and ", out, " to be ", kFloatTypes, ", got ",
                     dtype_name(grads[i].scalar_type()), " and ", dtype_name(outs[i].scalar_type()));
    TORCH_CHECK_VALUE(grads[i].sym_sizes() == outs[i].sym_sizes(), op, ": ", grad, " has shape ",
                      shape_of(grads[i]), " but ", out, " has shape ", shape_of(outs[i]));
    check_same_device(op, found_inf, "found_inf", grads[i], grad.c_str());
    check_same_device(op, found_inf, "found_inf", outs[i], out.c_str());
    // Dense outputs of any layout (channels_last, transposed) are written in memory order.
    TORCH_CHECK_VALUE(outs[i].is_non_overlapping_and_dense(), op, ": expected ", out,
                      " to be dense (no gaps or overlapping elements)");
  }
}

void check_update_loss_scale_args(const at::Tensor& scale, const at::Tensor& counters, const at::Tensor& found_inf) {
  constexpr const char* op = "mpgemm.update_loss_scale_";
  TORCH_CHECK_TYPE(scale.scalar_type() == at::kFloat && found_inf.scalar_type() == at::kFloat, op,
                   ": expected scale and found_inf to be torch.float32, got ", dtype_name(scale.scalar_type()),
                   " and ", dtype_name(found_inf.scalar_type()));
  TORCH_CHECK_VALUE(scale.dim() == 0, op, ": expected scale to be 0-dim, got shape ", shape_of(scale));
  TORCH_CHECK_VALUE(found_inf.numel() == 1, op, ": expected found_inf to hold one element, got shape ",
                    shape_of(found_inf));
  TORCH_CHECK_TYPE(counters.scalar_type() == at::kLong, op, ": expected counters to be torch.int64, got ",
                   dtype_name(counters.scalar_type()));
  TORCH_CHECK_VALUE(counters.dim() == 1 && counters.sym_size(0) == kernels::kLossScaleCounters &&
                        counters.is_contiguous(),
                    op, ": expected counters to be a contiguous tensor of shape (", kernels::kLossScaleCounters,
                    ",), got shape ", shape_of(counters));
  check_same_device(op, scale, "scale", counters, "counters");
  check_same_device(op, scale, "scale", found_inf, "found_inf");
}

void check_mma_ceiling_args(const at::Tensor& a, const at::Tensor& b, int64_t iterations, const at::Tensor& out) {
  constexpr const char* op = "mpgemm._mma_ceiling";
  using Config = kernels::MmaCeilingTile;
  constexpr int64_t kWarps = Config::kWarpsM * Config::kWarpsN;
  auto has_shape = [](const at::Tensor& t, std::initializer_list<int64_t> shape, size_t from) {
    if (t.dim() != int64_t(shape.size())) return false;
    for (size_t d = from; d < shape.size(); ++d)
      if (t.sym_size(d) != shape.begin()[d]) return false;
    return true;
  };
  TORCH_CHECK_TYPE(a.scalar_type() == at::kHalf && b.scalar_type() == at::kHalf, op,
                   ": expected a and b to be torch.float16, got ", dtype_name(a.scalar_type()), " and ",
                   dtype_name(b.scalar_type()));
  TORCH_CHECK_VALUE(has_shape(a, {Config::kWarpM, Config::kFragment}, 0), op, ": expected a of shape (",
                    Config::kWarpM, ", ", Config::kFragment, ") (one warp tile's A), got shape ", shape_of(a));
  TORCH_CHECK_VALUE(has_shape(b, {Config::kFragment, Config::kWarpN}, 0), op, ": expected b of shape (",
                    Config::kFragment, ", ", Config::kWarpN, ") (one warp tile's B), got shape ", shape_of(b));
  TORCH_CHECK_TYPE(out.scalar_type() == at::kFloat, op, ": expected out to be torch.float32, got ",
                   dtype_name(out.scalar_type()));
  TORCH_CHECK_VALUE(has_shape(out, {0, kWarps, Config::kWarpM, Config::kWarpN}, 1) && out.sym_size(0) >= 1 &&
                        out.sym_size(0) <= std::numeric_limits<int>::max(),
                    op, ": expected out of shape (blocks, ", kWarps, ", ", Config::kWarpM, ", ", Config::kWarpN,
                    ") with 1 <= blocks <= 2^31 - 1, got shape ", shape_of(out));
  TORCH_CHECK_VALUE(a.is_contiguous() && b.is_contiguous() && out.is_contiguous(), op,
                    ": expected a, b and out to be contiguous");
  TORCH_CHECK_VALUE(iterations >= 0 && iterations <= std::numeric_limits<int>::max(), op,
                    ": expected 0 <= iterations <= 2^31 - 1, got ", iterations);
  check_same_device(op, a, "a", b, "b");
  check_same_device(op, a, "a", out, "out");
}

LayerNormShape check_layer_norm_args(const char* op, const at::Tensor& x, at::IntArrayRef normalized_shape,
                                     const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias) {
  TORCH_CHECK_TYPE(is_16_bit(x.scalar_type()), op, ": expected x to be torch.float16 or torch.bfloat16, got ",
                   dtype_name(x.scalar_type()));
  const int64_t dims = static_cast<int64_t>(normalized_shape.size());
  TORCH_CHECK_VALUE(dims >= 1 && x.dim() >= dims, op, ": expected normalized_shape of 1 to ", x.dim(),
                    " dimensions (x's last ones), got ", normalized_shape, " for x of shape ", shape_of(x));
  int64_t cols = 1;
  for (int64_t d = 0; d < dims; ++d) {
    TORCH_CHECK_VALUE(x.sym_size(x.dim() - dims + d) == normalized_shape[d], op,
                      ": expected x's last dimensions to be ", normalized_shape, " (normalized_shape), got shape ",
                      shape_of(x));
    cols *= normalized_shape[d];
  }
  TORCH_CHECK_VALUE(cols > 0, op, ": expected normalized_shape to hold at least one element, got ", normalized_shape);
  for (const auto& [t, name] : {std::pair{&weight, "weight"}, std::pair{&bias, "bias"}}) {
    if (!*t) continue;
    TORCH_CHECK_TYPE(is_float_type((*t)->scalar_type()), op, ": expected ", name, " to be ", kFloatTypes, ", got ",
                     dtype_name((*t)->scalar_type()));
    TORCH_CHECK_VALUE((*t)->sym_sizes() == c10::fromIntArrayRefSlow(normalized_shape), op, ": expected ", name,
                      " of shape ", normalized_shape, " (normalized_shape), got shape ", shape_of(**t));
    check_same_device(op, x, "x", **t, name);
  }
  c10::SymInt rows = 1;
  for (int64_t d = 0; d < x.dim() - dims; ++d) rows = rows * x.sym_size(d);
  return {rows, cols};
}

void check_layer_norm_backward_args(const char* op, const at::Tensor& x, const LayerNormShape& shape,
                                    const at::Tensor& grad, const at::Tensor& mean, const at::Tensor& rstd) {
  TORCH_CHECK_TYPE(grad.scalar_type() == x.scalar_type(), op, ": expected grad to have x's dtype (",
                   dtype_name(x.scalar_type()), "), got ", dtype_name(grad.scalar_type()));
  TORCH_CHECK_VALUE(grad.sym_sizes() == x.sym_sizes(), op, ": expected grad of x's shape ", shape_of(x), ", got ",
                    shape_of(grad));
  check_same_device(op, x, "x", grad, "grad");
  for (const auto& [t, name] : {std::pair{&mean, "mean"}, std::pair{&rstd, "rstd"}}) {
    TORCH_CHECK_TYPE(t->scalar_type() == at::kFloat, op, ": expected ", name, " to be torch.float32, got ",
                     dtype_name(t->scalar_type()));
    TORCH_CHECK_VALUE(t->dim() == 1 && t->sym_size(0) == shape.rows, op, ": expected ", name, " of shape (",
                      shape.rows, ",) (x's rows), got shape ", shape_of(*t));
    check_same_device(op, x, "x", *t, name);
  }
}

void check_batch_norm_args(const char* op, const at::Tensor& y, std::initializer_list<NamedTensor> per_channel,
                           const std::vector<NamedTensor>& like_y) {
  TORCH_CHECK_VALUE(y.dim() == 4, op, ": expected y to be 4-D (N, C, H, W), got shape ", shape_of(y));
  TORCH_CHECK_TYPE(is_float_type(y.scalar_type()), op, ": expected y to be ", kFloatTypes, ", got ",
                   dtype_name(y.scalar_type()));
  for (const auto& [t, name] : per_channel) {
    TORCH_CHECK_TYPE(t->scalar_type() == at::kFloat, op, ": expected ", name, " to be torch.float32, got ",
                     dtype_name(t->scalar_type()));
    TORCH_CHECK_VALUE(t->dim() == 1 && t->sym_size(0) == y.sym_size(1), op, ": expected ", name,
                      " of shape (C,) = (", y.sym_size(1), ",), got shape ", shape_of(*t));
    check_same_device(op, y, "y", *t, name);
  }
  check_like(op, y, "y", like_y);
}

}  // namespace mpgemm
