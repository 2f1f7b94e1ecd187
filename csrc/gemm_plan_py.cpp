// mpgemm._C's functions for the tile choice (kernels/plan/), wrapped by
// mpgemm/plan.py: the table, the plan of a shape on given device limits, the
// tuner's candidates, the process's tuned table, and an operand's load width. Plain Python functions,
// not ops: they take no tensors and run on the host alone, CPU builds included.
#include <Python.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>

#include "plan/gemm_plan.h"
#include "plan/operand_layout.h"

namespace mpgemm {
namespace {

using kernels::DeviceLimits;
using kernels::GemmPlan;
using kernels::GemmShape;
using kernels::TileConfigId;
using kernels::TileConfigInfo;

PyObject* config_dict(const TileConfigInfo& c) {
  return Py_BuildValue("{s:s,s:s,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:i,s:O,s:s}", "name", c.name,
                       "type", c.type, "block_m", c.block_m, "block_n", c.block_n, "block_k", c.block_k, "warp_m",
                       c.warp_m, "warp_n", c.warp_n, "stages", c.stages, "threads", c.threads, "min_blocks_per_sm",
                       c.min_blocks_per_sm, "smem_bytes", c.smem_bytes, "min_arch", c.min_arch, "load_width",
                       c.load_width, "narrowest_load", c.narrowest_load, "cluster_m", c.cluster_m, "wgmma",
                       c.wgmma ? Py_True : Py_False, "schedule", c.schedule);
}

PyObject* plan_dict(const GemmPlan& plan, const GemmShape& shape) {
  return Py_BuildValue("{s:s,s:i,s:i,s:O,s:O,s:i,s:K}", "config", kernels::tile_config(plan.config).name, "split_k",
                       plan.split_k, "raster_group", plan.raster_group, "tuned", plan.tuned ? Py_True : Py_False,
                       "padded_operands", plan.padded ? Py_True : Py_False, "stream_k_blocks", plan.stream_k_blocks,
                       "workspace_bytes", static_cast<unsigned long long>(kernels::workspace_bytes(shape, plan)));
}

// (batch, m, n, k, load_width, multiprocessors, max_smem_per_block, arch);
// load_width (8, 4, 2 or 1) checked by mpgemm/plan.py. The copy engine
// describes operands that allow 16-byte loads; D is of an op's own type.
// Narrower ones it would describe once copied to aligned pitches, both
// counted as copied, every matrix of the batch (which of them needs it, and
// whether one broadcasts, the width does not say).
bool parse_problem(PyObject* args, GemmShape& shape, DeviceLimits& device) {
  if (!PyArg_ParseTuple(args, "LLLLiiii", &shape.batch, &shape.m, &shape.n, &shape.k, &shape.vector,
                        &device.multiprocessors, &device.max_smem_per_block, &device.arch))
    return false;
  shape.wgmma = shape.vector == 8;
  shape.a_copies = shape.b_copies = shape.wgmma ? 0 : shape.batch;
  return true;
}

PyObject* tile_configs(PyObject*, PyObject*) {
  PyObject* list = PyList_New(0);
  for (const TileConfigInfo& c : kernels::kTileConfigs) {
    PyObject* entry = config_dict(c);
    if (entry == nullptr || PyList_Append(list, entry) != 0) {
      Py_XDECREF(entry);
      Py_DECREF(list);
      return nullptr;
    }
    Py_DECREF(entry);
  }
  return list;
}

PyObject* default_device_limits(PyObject*, PyObject*) {
  const DeviceLimits d = kernels::kH100Limits;
  return Py_BuildValue("{s:i,s:i,s:i}", "multiprocessors", d.multiprocessors, "max_smem_per_block",
                       d.max_smem_per_block, "arch", d.arch);
}

// Runs f, turning a bad MPGEMM_GEMM_PATH, MPGEMM_NARROW_TILES,
// MPGEMM_WGMMA_SPLIT_K or MPGEMM_PADDED_OPERANDS (kernels::gemm_path and the
// like) into a ValueError.
template <class F>
PyObject* raising_value_error(F&& f) {
  try {
    return f();
  } catch (const std::invalid_argument& e) {
    return PyErr_Format(PyExc_ValueError, "%s", e.what());
  }
}

PyObject* gemm_plan(PyObject*, PyObject* args) {
  GemmShape shape;
  DeviceLimits device;
  if (!parse_problem(args, shape, device)) return nullptr;
  return raising_value_error([&] { return plan_dict(kernels::plan_gemm(shape, device), shape); });
}

PyObject* gemm_candidates(PyObject*, PyObject* args) {
  GemmShape shape;
  DeviceLimits device;
  if (!parse_problem(args, shape, device)) return nullptr;
  std::vector<GemmPlan> plans;
  if (PyObject* error = raising_value_error([&]() -> PyObject* {
        plans = kernels::candidate_plans(shape, device);
        return Py_None;
      });
      error == nullptr)
    return nullptr;
  PyObject* list = PyList_New(0);
  for (const GemmPlan& plan : plans) {
    PyObject* entry = plan_dict(plan, shape);
    if (entry == nullptr || PyList_Append(list, entry) != 0) {
      Py_XDECREF(entry);
      Py_DECREF(list);
      return nullptr;
    }
    Py_DECREF(entry);
  }
  return list;
}

// (batch, m, n, k, config name, split_k[, stream_k])
PyObject* set_tuned_gemm_plan(PyObject*, PyObject* args) {
  GemmShape shape;
  const char* name = nullptr;
  int split_k = 1, stream_k = 0;
  if (!PyArg_ParseTuple(args, "LLLLsi|p", &shape.batch, &shape.m, &shape.n, &shape.k, &name, &split_k, &stream_k))
    return nullptr;
  for (const TileConfigInfo& c : kernels::kTileConfigs)
    if (std::strcmp(c.name, name) == 0) {
      if (split_k < 1 || split_k > kernels::kMaxSplitK)
        return PyErr_Format(PyExc_ValueError, "split_k must be in [1, %d], got %d", kernels::kMaxSplitK, split_k);
      if (!kernels::has_gemm_kernels(c.id))
        return PyErr_Format(PyExc_ValueError, "config: the GEMM has no kernels on '%s' (a convolution's tile)", name);
      if (stream_k && (!kernels::has_stream_k_kernels(c.id) || split_k != 1))
        return PyErr_Format(PyExc_ValueError,
                            "stream_k: runs on 'wgmma', 'wgmma_n128' or 'wgmma_n64' with split_k 1, got '%s' with %d",
                            name, split_k);
      kernels::set_tuned_plan(shape, c.id, split_k, stream_k != 0);
      Py_RETURN_NONE;
    }
  return PyErr_Format(PyExc_ValueError, "config: no tile configuration named '%s'", name);
}

PyObject* clear_tuned_gemm_plans(PyObject*, PyObject*) {
  kernels::clear_tuned_plans();
  Py_RETURN_NONE;
}

// (address, rows, cols, row_stride, col_stride, batch, batch_stride): the
// load width the launcher takes for one operand, read in place or from a
// fresh copy.
PyObject* operand_load_width(PyObject*, PyObject* args) {
  unsigned long long address = 0;
  long long rows = 0, cols = 0, row_stride = 0, col_stride = 0, batch = 1, batch_stride = 0;
  if (!PyArg_ParseTuple(args, "KLLLLLL", &address, &rows, &cols, &row_stride, &col_stride, &batch, &batch_stride))
    return nullptr;
  const kernels::MatrixLayout layout =
      kernels::matrix_layout(rows, cols, row_stride, col_stride, batch, batch_stride);
  // A copy is a fresh allocation, aligned to more than any load.
  const void* data = layout.copied ? nullptr : reinterpret_cast<const void*>(uintptr_t(address));
  return PyLong_FromLong(
      kernels::operand_load_width(data, layout.batch_stride, kernels::matrix_runs(rows, cols, layout)));
}

PyMethodDef methods[] = {
    {"tile_configs", tile_configs, METH_NOARGS, "The GEMM's tile configurations, as dicts."},
    {"default_device_limits", default_device_limits, METH_NOARGS, "The device profile used without a GPU (H100)."},
    {"gemm_plan", gemm_plan, METH_VARARGS,
     "gemm_plan(batch, m, n, k, load_width, multiprocessors, max_smem_per_block, arch) -> plan dict."},
    {"gemm_candidates", gemm_candidates, METH_VARARGS, "The plans a tuner should time, same arguments."},
    {"set_tuned_gemm_plan", set_tuned_gemm_plan, METH_VARARGS,
     "set_tuned_gemm_plan(batch, m, n, k, config, split_k[, stream_k]): overrides the heuristic for that shape."},
    {"clear_tuned_gemm_plans", clear_tuned_gemm_plans, METH_NOARGS, "Forgets every tuned plan of this process."},
    {"operand_load_width", operand_load_width, METH_VARARGS,
     "operand_load_width(address, rows, cols, row_stride, col_stride, batch, batch_stride) -> 8, 4, 2 or 1."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

int add_gemm_plan_functions(PyObject* module) { return PyModule_AddFunctions(module, methods); }

}  // namespace mpgemm
