// The graph node of one call of an op of mpgemm, made as torch's generated
// autograd code makes its own (a Node subclass with SavedVariables and plain
// fields, set as the output's history by the op's Autograd kernel), where a
// torch::autograd::Function's context, saved_data map and output wrapping
// cost a linear's call about 2.7x torch's autograd share (bench/NOTES.md).
//
// OpNode<Derived, kSaved> is what every such node shares: its saved
// tensors, apply (the tensors unpacked, then Derived::gradients once,
// without a graph), their release after backward, and compiled autograd
// (torch._dynamo.compiled_autograd), which runs the node as one opaque call,
// as it runs a C++ torch::autograd::Function's that is not traceable: the
// saved tensors (the graph's proxies while it is traced) and Derived's
// fields are packed as IValues, and `functional` unpacks them into a node
// of its own and runs its gradients. Derived provides
//     static constexpr const char* kOp;   the op's name in messages
//     std::string name() const;           Node's
//     static auto fields(Self& node);     std::tie of its plain fields
//                                         (strings, bools, ints, dtypes,
//                                         optionals and vectors of them)
//     variable_list gradients(const std::vector<at::Tensor>& saved,
//                             const at::Tensor& grad,
//                             const std::vector<bool>& wanted) const;
// where `saved` holds its saved tensors by slot and wanted[i] says whether
// edge i's gradient is asked for.
#pragma once

#include <array>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include <ATen/core/Tensor.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/basic_ops.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>
#include <torch/csrc/dynamo/compiled_autograd.h>

namespace mpgemm {

using torch::autograd::SavedVariable;
using torch::autograd::variable_list;

// How autograd holds a node: std::shared_ptr up to torch 2.11, c10::intrusive_ptr after.
using NodePtr = decltype(torch::autograd::Edge::function);

namespace detail {
// torch::autograd::deleteNode, found by argument-dependent lookup where
// nodes are shared_ptrs (it frees a long graph without deep recursion).
template <class T>
void delete_node(T* node) {
  deleteNode(node);
}
}  // namespace detail

// A new graph node T (a torch::autograd::Node), owned as autograd owns nodes.
template <class T>
auto make_node() {
  if constexpr (std::is_same_v<NodePtr, std::shared_ptr<torch::autograd::Node>>)
    return std::shared_ptr<T>(new T(), [](T* node) { detail::delete_node(node); });
  else
    return c10::make_intrusive<T>();
}

namespace detail {
// torch.autograd.graph.node_creation_hook's callbacks, which from torch 2.15
// on whoever attaches a node runs once the node is complete (found by
// argument-dependent lookup); torch before that has no such call.
template <class Pointer>
auto fire_creation_hooks(const Pointer& node, int) -> decltype(fire_node_creation_hooks(node)) {
  return fire_node_creation_hooks(node);
}
template <class Pointer>
void fire_creation_hooks(const Pointer&, long) {}
}  // namespace detail

// Says that `node` is complete (its edges, the output's history, every saved
// tensor), as torch's own ops and Functions say it.
inline void node_complete(const NodePtr& node) { detail::fire_creation_hooks(node, 0); }

// Refuses forward-mode AD, which no op of mpgemm implements, as torch's
// generated code refuses it for its ops without a forward derivative: a
// dual tensor's tangent would otherwise be dropped without a word.
// (torch's isFwGradDefined takes an optional: a copy of each tensor a call.)
inline bool is_dual(const at::Tensor& t) { return t.defined() && t._fw_grad(/*level=*/0).defined(); }
inline bool is_dual(const std::optional<at::Tensor>& t) { return t && is_dual(*t); }

template <class... Tensors>
void refuse_forward_ad(const char* op, const Tensors&... tensors) {
  const bool dual = (is_dual(tensors) || ...);
  TORCH_CHECK_NOT_IMPLEMENTED(!dual, op, ": forward-mode AD is not supported (an input is a dual tensor)");
}

// Runs a node's backward without a graph. Where create_graph asked for
// one, the gradients come back through a node whose own backward raises.
template <class Backward>
variable_list once_differentiable(const char* op, const Backward& backward) {
  variable_list grads;
  {
    const at::NoGradGuard no_grad;
    grads = backward();
  }
  if (!at::GradMode::is_enabled()) return grads;
  const auto raise_on_backward = std::make_shared<torch::autograd::DelayedError>(
      std::string(op) + ": double backward is not supported; its gradients are computed without a graph",
      int64_t(grads.size()));
  variable_list detached;
  detached.reserve(grads.size());
  for (const at::Tensor& g : grads) detached.push_back(g.defined() ? g.detach().requires_grad_() : at::Tensor());
  return (*raise_on_backward)(std::move(detached));
}

template <class Derived, size_t kSaved>
struct OpNode : torch::autograd::Node {
  // Saves t in `slot`; an output of the call (ReLU's y) after its history is set.
  void save(size_t slot, const at::Tensor& t, bool is_output = false) {
    saved_[slot] = SavedVariable(t, is_output);
    if (is_output) output_slot_ = static_cast<int>(slot);
  }

  void release_variables() override {
    const std::lock_guard<std::mutex> lock(mutex_);
    for (SavedVariable& saved : saved_) saved.reset_data();
  }

  variable_list apply(variable_list&& grads) override {
    const std::lock_guard<std::mutex> lock(mutex_);
    const std::vector<at::Tensor> saved = unpack_saved();
    // No gradient for the output: none for the inputs, as torch's own ops give.
    if (!grads[0].defined()) return variable_list(num_outputs());
    return once_differentiable(Derived::kOp, [&] { return derived().gradients(saved, grads[0], wanted()); });
  }

  void compiled_args(torch::dynamo::autograd::CompiledNodeArgs& args) const override {
    args.collect(name());
    for (size_t slot = 0; slot < kSaved; ++slot) args.collect(saved_[slot], static_cast<int>(slot) == output_slot_);
    std::apply([&](const auto&... field) { (args.collect(field), ...); }, Derived::fields(derived()));
  }

  variable_list apply_with_saved(const variable_list& grads,
                                 torch::dynamo::autograd::SwapSavedVariables& swap) override {
    using torch::dynamo::autograd::IValuePacker;
    for (SavedVariable& saved : saved_) swap.before(saved);
    torch::dynamo::autograd::PackedArgs packed;
    std::apply([&](const auto&... field) { (packed.pack(field), ...); }, Derived::fields(derived()));
    packed.pack(unpack_saved());
    packed.pack(wanted());
    const std::vector<at::IValue>& args = packed.vec();
    std::vector<at::TypePtr> schema;
    schema.reserve(args.size());
    for (const at::IValue& arg : args) schema.push_back(arg.isTensor() ? at::TensorType::get() : arg.type());
    const auto& python = torch::dynamo::autograd::getPyCompilerInterface();
    const std::string function = python->bind_function(swap.get_py_compiler(), name(), &OpNode::functional, schema,
                                                       /*is_custom_function=*/true, /*is_traceable=*/false);
    const auto output_metadata = IValuePacker<std::vector<std::optional<torch::autograd::InputMetadata>>>::pack(
        torch::dynamo::autograd::get_input_metadata(next_edges()));
    variable_list results =
        python->call_function(swap.get_py_compiler(), "apply_functional", function, grads, args, output_metadata);
    for (SavedVariable& saved : saved_) swap.after(saved);
    return results;
  }

 private:
  Derived& derived() { return static_cast<Derived&>(*this); }
  const Derived& derived() const { return static_cast<const Derived&>(*this); }

  std::vector<at::Tensor> unpack_saved() {
    std::vector<at::Tensor> tensors;
    tensors.reserve(kSaved);
    for (size_t slot = 0; slot < kSaved; ++slot)
      tensors.push_back(static_cast<int>(slot) == output_slot_ ? saved_[slot].unpack(getptr()) : saved_[slot].unpack());
    return tensors;
  }

  std::vector<bool> wanted() const {
    std::vector<bool> wanted(num_outputs());
    for (size_t edge = 0; edge < wanted.size(); ++edge) wanted[edge] = task_should_compute_output(edge);
    return wanted;
  }

  // Compiled autograd's call of the node: apply_with_saved's IValues back
  // into a node's fields, its saved tensors and the gradients wanted.
  static variable_list functional(const variable_list& grads, const std::vector<at::IValue>& args) {
    torch::dynamo::autograd::PackedArgs packed(args);
    Derived node;
    std::apply([&](auto&... field) { ((field = packed.unpack<std::decay_t<decltype(field)>>()), ...); },
               Derived::fields(node));
    const auto saved = packed.unpack<std::vector<at::Tensor>>();
    const auto wanted = packed.unpack<std::vector<bool>>();
    if (!grads[0].defined()) return variable_list(wanted.size());
    return once_differentiable(Derived::kOp, [&] { return node.gradients(saved, grads[0], wanted); });
  }

  std::array<SavedVariable, kSaved> saved_;
  int output_slot_ = -1;  // the slot of a saved output, or none
};

}  // namespace mpgemm
