// mpgemm._C's direct entries to the public ops (mpgemm._C.gemm, linear,
// mlp, gated_mlp, layer_norm and conv2d), called by mpgemm/ops.py in eager
// mode.
//
// Why: torch.ops.mpgemm.<op>.default parses its Python arguments against the
// schema into a boxed stack of IValues, then unboxes them for the kernel:
// about 1 µs a call for gemm's five arguments and 3-4 µs for conv2d's three
// int lists on this project's CPU machine (bench/NOTES.md), where torch's own
// F.linear and F.conv2d take their arguments through generated bindings.
// These entries read the same arguments straight into the kernel's C++ types
// and call the op's typed handle: the same dispatcher call (autograd,
// autocast, dispatch modes, fake tensors and functorch all sit behind it),
// without the boxed detour. Errors are translated as torch.ops translates
// them; a C++ warning becomes a Python warning, as torch's generated
// bindings make it (torch.ops prints it; mpgemm's ops raise none).
//
// An entry takes its arguments only where it can prove the call is the one
// torch.ops would make, and returns NotImplemented otherwise, so that the
// caller makes the torch.ops call instead (whose parsing, errors and
// __torch_function__ handling are then torch's own):
//   - a torch function mode is active, or a tensor argument's class has a
//     __torch_function__ of its own (anything but torch.Tensor and classes,
//     such as nn.Parameter, that disable it);
//   - an argument is not of the exact Python type the entry reads: a tensor,
//     None where the schema allows it, a str, a torch.dtype, a tuple (or
//     torch.Size) or list of Python ints, a Python int, a Python float or
//     int for a float.
// mpgemm/ops.py also takes the torch.ops call while torch.compile or
// torch.export traces, so that the graph holds the op.
#include <Python.h>

#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/Size.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/csrc/utils/pybind.h>

#include "op_handles.h"

namespace mpgemm {
namespace {

// torch._C._disabled_torch_function_impl and the interned name
// "__torch_function__", looked up once when the module loads (torch is
// imported by then) and kept for the process's life.
PyObject* disabled_torch_function = nullptr;
PyObject* torch_function_name = nullptr;

// Whether torch's dispatch of __torch_function__ passes an instance of
// `type` by, as torch's own check decides it: torch.Tensor's, or a class's
// whose __torch_function__ is the disabled one (nn.Parameter's).
bool torch_function_passes_by(PyTypeObject* type) {
  return type == reinterpret_cast<PyTypeObject*>(THPVariableClass) ||
         _PyType_Lookup(type, torch_function_name) == disabled_torch_function;
}

// One argument of Python type T's C++ form, read from a PyObject or refused
// (`read` false, no Python error set).
template <class T>
struct Arg;

// Held by a reference of its own, as torch.ops holds it, not through the
// Python object, whose tensor torch.utils.swap_tensors may swap while the
// GIL is released.
template <>
struct Arg<const at::Tensor&> {
  at::Tensor tensor;
  bool read(PyObject* o) {
    if (!THPVariable_Check(o) || !torch_function_passes_by(Py_TYPE(o))) return false;
    tensor = THPVariable_Unpack(o);
    return true;
  }
  const at::Tensor& get() const { return tensor; }
};

template <>
struct Arg<const std::optional<at::Tensor>&> {
  std::optional<at::Tensor> tensor;
  bool read(PyObject* o) {
    if (o == Py_None) return true;
    Arg<const at::Tensor&> given;
    if (!given.read(o)) return false;
    tensor = given.get();
    return true;
  }
  const std::optional<at::Tensor>& get() const { return tensor; }
};

template <>
struct Arg<std::string_view> {
  std::string_view text;
  bool read(PyObject* o) {
    if (!PyUnicode_CheckExact(o)) return false;
    Py_ssize_t size = 0;
    const char* data = PyUnicode_AsUTF8AndSize(o, &size);
    if (data == nullptr) {
      PyErr_Clear();  // not encodable: torch.ops says what is wrong
      return false;
    }
    text = std::string_view(data, size_t(size));
    return true;
  }
  std::string_view get() const { return text; }
};

template <>
struct Arg<std::optional<std::string_view>> {
  std::optional<std::string_view> text;
  bool read(PyObject* o) {
    if (o == Py_None) return true;
    Arg<std::string_view> given;
    if (!given.read(o)) return false;
    text = given.get();
    return true;
  }
  std::optional<std::string_view> get() const { return text; }
};

template <>
struct Arg<std::optional<at::ScalarType>> {
  std::optional<at::ScalarType> dtype;
  bool read(PyObject* o) {
    if (o == Py_None) return true;
    if (!THPDtype_Check(o)) return false;
    dtype = reinterpret_cast<THPDtype*>(o)->scalar_type;
    return true;
  }
  std::optional<at::ScalarType> get() const { return dtype; }
};

// A Python int that fits in int64 (not a bool, which the schema refuses).
bool read_int(PyObject* o, int64_t& value) {
  if (!PyLong_CheckExact(o)) return false;
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
  if (overflow != 0 || (v == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    return false;
  }
  value = v;
  return true;
}

template <>
struct Arg<int64_t> {
  int64_t value = 0;
  bool read(PyObject* o) { return read_int(o, value); }
  int64_t get() const { return value; }
};

template <>
struct Arg<double> {
  double value = 0;
  bool read(PyObject* o) {
    if (PyFloat_CheckExact(o)) {
      value = PyFloat_AS_DOUBLE(o);
      return true;
    }
    int64_t whole = 0;
    if (!read_int(o, whole)) return false;
    value = double(whole);
    return true;
  }
  double get() const { return value; }
};

// A tuple, torch.Size or list of Python ints; its length is the op's to
// check. Not another tuple subclass, which may have a __torch_function__ or
// items of its own.
template <>
struct Arg<at::IntArrayRef> {
  c10::SmallVector<int64_t, 4> values;
  bool read(PyObject* o) {
    if (!PyTuple_CheckExact(o) && !THPSize_Check(o) && !PyList_CheckExact(o)) return false;
    const Py_ssize_t size = PySequence_Fast_GET_SIZE(o);
    PyObject** items = PySequence_Fast_ITEMS(o);
    values.resize(size_t(size));
    for (Py_ssize_t i = 0; i < size; ++i)
      if (!read_int(items[i], values[size_t(i)])) return false;
    return true;
  }
  at::IntArrayRef get() const { return values; }
};

template <class Signature>
struct Entry;

// The entry of an op of this signature: its arguments read in order, all
// given positionally; its tensor returned.
template <class... Args>
struct Entry<at::Tensor(Args...)> {
  template <const char* kName>
  static PyObject* call(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
    HANDLE_TH_ERRORS
    // A mode, or torch's "skip the next __torch_function__" flag, which
    // torch.ops's check would consume.
    if (nargs != Py_ssize_t(sizeof...(Args)) || at::impl::torch_function_mode_enabled() ||
        at::impl::PythonTorchFunctionTLS::peek_skip_next())
      Py_RETURN_NOTIMPLEMENTED;
    static const auto op = op_handle<at::Tensor(Args...)>(kName);
    return read_and_call(op, args, std::index_sequence_for<Args...>{});
    END_HANDLE_TH_ERRORS
  }

 private:
  template <class Op, size_t... I>
  static PyObject* read_and_call(const Op& op, PyObject* const* args, std::index_sequence<I...>) {
    std::tuple<Arg<Args>...> read;
    if (!(std::get<I>(read).read(args[I]) && ...)) Py_RETURN_NOTIMPLEMENTED;
    at::Tensor out;
    {
      const pybind11::gil_scoped_release no_gil;
      out = op.call(std::get<I>(read).get()...);
    }
    return THPVariable_Wrap(std::move(out));
  }
};

constexpr char kGemm[] = "mpgemm::gemm";
constexpr char kLinear[] = "mpgemm::linear";
constexpr char kMlp[] = "mpgemm::mlp";
constexpr char kGatedMlp[] = "mpgemm::gated_mlp";
constexpr char kLayerNorm[] = "mpgemm::layer_norm";
constexpr char kConv2d[] = "mpgemm::conv2d";

template <class Signature, const char* kName>
PyCFunction entry() {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&Entry<Signature>::template call<kName>));
}

PyMethodDef methods[] = {
    {"gemm", entry<GemmSignature, kGemm>(), METH_FASTCALL,
     "gemm(a, b, bias, activation, out_dtype): torch.ops.mpgemm.gemm's call, or NotImplemented."},
    {"linear", entry<GemmSignature, kLinear>(), METH_FASTCALL,
     "linear(x, weight, bias, activation, out_dtype): torch.ops.mpgemm.linear's call, or NotImplemented."},
    {"mlp", entry<MlpSignature, kMlp>(), METH_FASTCALL,
     "mlp(x, w1, b1, w2, b2, activation): torch.ops.mpgemm.mlp's call, or NotImplemented."},
    {"gated_mlp", entry<GatedMlpSignature, kGatedMlp>(), METH_FASTCALL,
     "gated_mlp(x, w_gate, b_gate, w_up, b_up, w_down, b_down, activation): torch.ops.mpgemm.gated_mlp's call, "
     "or NotImplemented."},
    {"layer_norm", entry<LayerNormSignature, kLayerNorm>(), METH_FASTCALL,
     "layer_norm(x, normalized_shape, weight, bias, eps): torch.ops.mpgemm.layer_norm's call, or NotImplemented."},
    {"conv2d", entry<ConvSignature, kConv2d>(), METH_FASTCALL,
     "conv2d(x, weight, bias, stride, padding, dilation, groups, out_dtype): torch.ops.mpgemm.conv2d's call, or "
     "NotImplemented."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

int add_op_entry_functions(PyObject* module) {
  PyObject* torch_c = PyImport_ImportModule("torch._C");
  if (torch_c == nullptr) return -1;
  disabled_torch_function = PyObject_GetAttrString(torch_c, "_disabled_torch_function_impl");
  Py_DECREF(torch_c);
  torch_function_name = PyUnicode_InternFromString("__torch_function__");
  if (disabled_torch_function == nullptr || torch_function_name == nullptr) return -1;
  return PyModule_AddFunctions(module, methods);
}

}  // namespace mpgemm
