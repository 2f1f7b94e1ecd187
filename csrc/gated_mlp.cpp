// mpgemm.gated_mlp: a gated MLP block (Llama's SwiGLU, Gemma's GeGLU),
//     g = x @ w_gate^T + b_gate,  u = x @ w_up^T + b_up   (16-bit, the block's product type)
//     p = act(g) * u                                     (16-bit)
//     y = p @ w_down^T + b_down                           (x's dtype)
// as one op: its C++ autograd (GatedMlpBackward), its forward on each
// backend, and its two internal elementwise ops. Backward:
//     dp = dy @ w_down,  dg = dp * u * act'(g),  du = dp * act(g)
//     dx = dg @ w_gate + du @ w_up (each in x's dtype, then added, as
//     autograd adds the two uses of x), the weights' and biases' as linear's
//     (b_down's summed from dy as rounded to the product type, as mlp's b2
//     and torch.amp's 16-bit dy).
// The gating runs one of two ways. By default (MPGEMM_GATED_KERNEL unset or
// "1"): _gated_activation computes p in fp32, rounded once, in one pass;
// only g and u are saved; _gated_activation_backward gives dg, du and p
// again (for w_down's gradient) in one pass (kernels/gated/gated.cu says why
// that moves 18 bytes an element where torch's passes move 28). With
// MPGEMM_GATED_KERNEL=0, as torch.amp runs it: torch's activation, then the
// multiply, each rounded to the product type; saved as torch.amp saves them
// (g, act(g), u and p), and backward's three passes torch's.
// Every product is mpgemm's linear or gemm.
#include <tuple>

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/add.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/silu_backward.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include "autograd.h"
#include "gated/gated_math.h"
#include "op_handles.h"
#include "ops.h"

namespace mpgemm {
namespace {

using kernels::GateActivation;

// ---- The elementwise ops on each backend --------------------------------

template <class Step>
void for_each_element(int64_t count, const Step& step) {
  at::parallel_for(0, count, 16384, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) step(i);
  });
}

// The CPU backend: gated_math.h's functions in fp32, each result rounded
// once, as the kernels compute them.
template <class T>
void gated_forward_cpu(const at::Tensor& gate, const at::Tensor& up, at::Tensor& out, GateActivation activation) {
  const T *g = gate.const_data_ptr<T>(), *u = up.const_data_ptr<T>();
  T* p = out.mutable_data_ptr<T>();
  for_each_element(gate.numel(), [&](int64_t i) {
    p[i] = T(kernels::gate_value(activation, float(g[i])) * float(u[i]));
  });
}

template <class T>
void gated_backward_cpu(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up, GatedGrads& out,
                        GateActivation activation) {
  const T *dp = grad.const_data_ptr<T>(), *g = gate.const_data_ptr<T>(), *u = up.const_data_ptr<T>();
  T *dg = std::get<0>(out).mutable_data_ptr<T>(), *du = std::get<1>(out).mutable_data_ptr<T>(),
    *p = std::get<2>(out).mutable_data_ptr<T>();
  for_each_element(gate.numel(), [&](int64_t i) {
    const kernels::GatedGrads r = kernels::gated_grads(activation, float(dp[i]), float(g[i]), float(u[i]));
    dg[i] = T(r.grad_gate), du[i] = T(r.grad_up), p[i] = T(r.out);
  });
}

enum class Backend { kCpu, kCuda, kMeta };

template <Backend B>
at::Tensor gated_activation(const at::Tensor& gate, const at::Tensor& up, std::string_view activation) {
  constexpr const char* op = "mpgemm._gated_activation";
  const GateActivation act = check_gated_activation_args(op, {{&gate, "gate"}, {&up, "up"}}, activation);
  if constexpr (B == Backend::kMeta) {
    return at::empty_like(gate, at::MemoryFormat::Contiguous);
  }
#ifdef MPGEMM_WITH_CUDA
  else if constexpr (B == Backend::kCuda) {
    return gated_activation_cuda(gate.contiguous(), up.contiguous(), act);
  }
#endif
  else {
    const at::Tensor g = gate.contiguous(), u = up.contiguous();
    at::Tensor out = at::empty_like(g, at::MemoryFormat::Contiguous);
    if (g.scalar_type() == at::kHalf) gated_forward_cpu<c10::Half>(g, u, out, act);
    else gated_forward_cpu<c10::BFloat16>(g, u, out, act);
    return out;
  }
}

template <Backend B>
GatedGrads gated_activation_backward(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up,
                                     std::string_view activation) {
  constexpr const char* op = "mpgemm._gated_activation_backward";
  const GateActivation act =
      check_gated_activation_args(op, {{&grad, "grad"}, {&gate, "gate"}, {&up, "up"}}, activation);
  if constexpr (B == Backend::kMeta) {
    const auto like = [&] { return at::empty_like(gate, at::MemoryFormat::Contiguous); };
    return {like(), like(), like()};
  }
#ifdef MPGEMM_WITH_CUDA
  else if constexpr (B == Backend::kCuda) {
    return gated_activation_backward_cuda(grad.contiguous(), gate.contiguous(), up.contiguous(), act);
  }
#endif
  else {
    const at::Tensor dp = grad.contiguous(), g = gate.contiguous(), u = up.contiguous();
    const auto like = [&] { return at::empty_like(g, at::MemoryFormat::Contiguous); };
    GatedGrads out{like(), like(), like()};
    if (g.scalar_type() == at::kHalf) gated_backward_cpu<c10::Half>(dp, g, u, out, act);
    else gated_backward_cpu<c10::BFloat16>(dp, g, u, out, act);
    return out;
  }
}

// ---- The block ----------------------------------------------------------

// MPGEMM_GATED_KERNEL: unset or "1" runs the gating on the fused passes
// (_gated_activation and its backward) and saves g and u alone; "0" runs
// torch's activation and multiply and saves what torch.amp saves. The
// default since its kernels passed the GPU tests and took Llama-7B's gated
// MLP from 1.01x of torch's forward + backward to 1.06x (H200, fe39419,
// 2026-11-29). Asked by each forward (torch.compile asks once, when it
// traces); a backward runs the way its forward did.
bool gated_kernel() { return environment_switch("MPGEMM_GATED_KERNEL", true); }

at::Tensor call_gated_activation(const at::Tensor& gate, const at::Tensor& up, std::string_view activation) {
  static const auto op = op_handle<GatedActivationSignature>("mpgemm::_gated_activation");
  return op.call(gate, up, activation);
}

GatedGrads call_gated_activation_backward(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up,
                                          std::string_view activation) {
  static const auto op = op_handle<GatedActivationBackwardSignature>("mpgemm::_gated_activation_backward");
  return op.call(grad, gate, up, activation);
}

// torch's activation of g, in g's dtype (what torch.amp's SiLU or GELU module computes).
at::Tensor torch_activation(const at::Tensor& g, std::string_view activation) {
  if (activation == "silu") return at::silu(g);
  return at::gelu(g, gelu_approximate(activation));
}

// torch's gradient of the activation's input from its output's.
at::Tensor torch_activation_backward(const at::Tensor& grad, const at::Tensor& g, std::string_view activation) {
  if (activation == "silu") return at::silu_backward(grad, g);
  return at::gelu_backward(grad, g, gelu_approximate(activation));
}

// The gate's and up projection's products (g, u) in the block's product type.
std::tuple<at::Tensor, at::Tensor> gate_and_up(const at::Tensor& x, const at::Tensor& w_gate,
                                               const std::optional<at::Tensor>& b_gate, const at::Tensor& w_up,
                                               const std::optional<at::Tensor>& b_up, at::ScalarType dtype) {
  return {call_linear(x, block_weight(x, w_gate, dtype), b_gate, std::nullopt, dtype),
          call_linear(x, block_weight(x, w_up, dtype), b_up, std::nullopt, dtype)};
}

// gated_mlp without autograd: torch's activation and multiply by default
// (torch.amp's values), the fused pass with gated_kernel().
at::Tensor gated_mlp_forward(const at::Tensor& x, const at::Tensor& w_gate, const std::optional<at::Tensor>& b_gate,
                             const at::Tensor& w_up, const std::optional<at::Tensor>& b_up, const at::Tensor& w_down,
                             const std::optional<at::Tensor>& b_down, std::string_view activation) {
  const at::ScalarType dtype =
      check_gated_mlp_args<c10::SymInt>(x, w_gate, b_gate, w_up, b_up, w_down, b_down, activation);
  const auto [g, u] = gate_and_up(x, w_gate, b_gate, w_up, b_up, dtype);
  const at::Tensor p =
      gated_kernel() ? call_gated_activation(g, u, activation) : torch_activation(g, activation).mul(u);
  return call_linear(p, w_down, b_down, std::nullopt, x.scalar_type());
}

// Its node (op_node.h): edges x, w_gate, b_gate, w_up, b_up, w_down, b_down (0-6;
// empty where a bias is absent); saved x, the weights, g and u, and with the
// gating as torch.amp runs it (`fused` false) its activation a and p too.
struct GatedMlpBackward final : OpNode<GatedMlpBackward, 8> {
  enum Slot : size_t { kX, kWGate, kWUp, kWDown, kG, kU, kA, kP };
  std::string activation;
  std::optional<at::ScalarType> b_gate_dtype, b_up_dtype, b_down_dtype;
  bool fused = false;

  static constexpr const char* kOp = "mpgemm.gated_mlp";
  std::string name() const override { return "MpgemmGatedMlpBackward"; }
  template <class Self>
  static auto fields(Self& node) {
    return std::tie(node.activation, node.b_gate_dtype, node.b_up_dtype, node.b_down_dtype, node.fused);
  }

  variable_list gradients(const std::vector<at::Tensor>& saved, const at::Tensor& grad,
                          const std::vector<bool>& wanted) const {
    const at::Tensor &x = saved[kX], &w_gate = saved[kWGate], &w_up = saved[kWUp], &w_down = saved[kWDown],
                     &g = saved[kG], &u = saved[kU];
    const bool want_x = wanted[0], want_gate = wanted[1], want_b_gate = b_gate_dtype && wanted[2],
               want_up = wanted[3], want_b_up = b_up_dtype && wanted[4];
    const bool want_first = want_x || want_gate || want_b_gate || want_up || want_b_up;
    const at::ScalarType dtype = g.scalar_type();
    const auto g_sizes = g.sym_sizes();
    const c10::SymInt rows = product(g_sizes.slice(0, g_sizes.size() - 1)), hidden = g_sizes.back();
    const at::Tensor grad_y = grad.reshape_symint({rows, w_down.sym_size(0)}).to(dtype);
    const at::Tensor g2d = g.reshape_symint({rows, hidden}), u2d = u.reshape_symint({rows, hidden});
    at::Tensor grad_gate, grad_up, p;
    if (want_first) {
      const at::Tensor grad_p = call_gemm(grad_y, w_down.to(dtype), std::nullopt, std::nullopt, dtype);
      if (fused) {
        std::tie(grad_gate, grad_up, p) = call_gated_activation_backward(grad_p, g2d, u2d, activation);
      } else {
        const at::Tensor a = saved[kA].reshape_symint({rows, hidden});
        grad_up = grad_p.mul(a);
        grad_gate = torch_activation_backward(grad_p.mul(u2d), g2d, activation);
      }
    }
    const bool want_down = wanted[5];
    if (!fused) p = saved[kP].reshape_symint({rows, hidden});
    else if (want_down && !p.defined()) p = call_gated_activation(g2d, u2d, activation);
    // Without w_down's gradient, p stands in for the layer's input only by its shape.
    const variable_list down = linear_gradients(grad_y, p.defined() ? p : g2d, w_down, dtype, b_down_dtype, false,
                                                want_down, b_down_dtype && wanted[6]);
    variable_list gate(3), up(3);
    if (want_first) {
      const at::Tensor x2d = x.reshape_symint({rows, x.sym_size(-1)});
      gate = linear_gradients(grad_gate, x2d, w_gate, dtype, b_gate_dtype, want_x, want_gate, want_b_gate);
      up = linear_gradients(grad_up, x2d, w_up, dtype, b_up_dtype, want_x, want_up, want_b_up);
    }
    const at::Tensor grad_x = want_x ? gate[0].add(up[0]).view_symint(x.sym_sizes()) : at::Tensor();
    return {grad_x, gate[1], gate[2], up[1], up[2], down[1], down[2]};
  }
};

std::optional<at::ScalarType> dtype_of(const std::optional<at::Tensor>& bias) {
  return bias && bias->defined() ? std::optional(bias->scalar_type()) : std::nullopt;
}

at::Tensor gated_mlp_autograd(const at::Tensor& x, const at::Tensor& w_gate, const std::optional<at::Tensor>& b_gate,
                              const at::Tensor& w_up, const std::optional<at::Tensor>& b_up, const at::Tensor& w_down,
                              const std::optional<at::Tensor>& b_down, std::string_view activation) {
  refuse_forward_ad("mpgemm.gated_mlp", x, w_gate, b_gate, w_up, b_up, w_down, b_down);
  if (!records_graph(x, w_gate, b_gate) && !records_graph(x, w_up, b_up) && !records_graph(x, w_down, b_down)) {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return gated_mlp_forward(x, w_gate, b_gate, w_up, b_up, w_down, b_down, activation);
  }
  auto node = make_node<GatedMlpBackward>();
  // Saved after the forward and outside its guard, as autograd saves: a
  // saved-tensor hook's own ops record as they would anywhere.
  at::Tensor g, u, a, p, y;
  {
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    const at::ScalarType dtype =
        check_gated_mlp_args<c10::SymInt>(x, w_gate, b_gate, w_up, b_up, w_down, b_down, activation);
    std::tie(g, u) = gate_and_up(x, w_gate, b_gate, w_up, b_up, dtype);
    node->fused = gated_kernel();
    if (node->fused) {
      p = call_gated_activation(g, u, activation);
    } else {
      a = torch_activation(g, activation);
      p = a.mul(u);
    }
    y = call_linear(p, w_down, b_down, std::nullopt, x.scalar_type());
  }
  if (!node->fused) {
    node->save(GatedMlpBackward::kA, a);
    node->save(GatedMlpBackward::kP, p);
  }
  node->set_next_edges(torch::autograd::collect_next_edges(x, w_gate, b_gate, w_up, b_up, w_down, b_down));
  node->activation = std::string(activation);
  node->b_gate_dtype = dtype_of(b_gate), node->b_up_dtype = dtype_of(b_up), node->b_down_dtype = dtype_of(b_down);
  node->save(GatedMlpBackward::kX, x);
  node->save(GatedMlpBackward::kWGate, w_gate);
  node->save(GatedMlpBackward::kWUp, w_up);
  node->save(GatedMlpBackward::kWDown, w_down);
  node->save(GatedMlpBackward::kG, g);
  node->save(GatedMlpBackward::kU, u);
  torch::autograd::set_history(y, node);
  node_complete(node);
  return y;
}

}  // namespace

TORCH_LIBRARY_IMPL(mpgemm, Autograd, m) { m.impl("gated_mlp", &gated_mlp_autograd); }

TORCH_LIBRARY_IMPL(mpgemm, CPU, m) {
  m.impl("gated_mlp", &gated_mlp_forward);
  m.impl("_gated_activation", &gated_activation<Backend::kCpu>);
  m.impl("_gated_activation_backward", &gated_activation_backward<Backend::kCpu>);
}

TORCH_LIBRARY_IMPL(mpgemm, Meta, m) {
  m.impl("gated_mlp", &gated_mlp_forward);
  m.impl("_gated_activation", &gated_activation<Backend::kMeta>);
  m.impl("_gated_activation_backward", &gated_activation_backward<Backend::kMeta>);
}

#ifdef MPGEMM_WITH_CUDA
TORCH_LIBRARY_IMPL(mpgemm, CUDA, m) {
  m.impl("gated_mlp", &gated_mlp_forward);
  m.impl("_gated_activation", &gated_activation<Backend::kCuda>);
  m.impl("_gated_activation_backward", &gated_activation_backward<Backend::kCuda>);
}
#endif

}  // namespace mpgemm
