// Sees torch's C++ API for tensors' identity, memory and version counters.
#include "bind/runtime/prologue.h"

#include <torch/csrc/autograd/python_variable.h>

#include "bind/runtime/executor.h"
#include "bind/runtime/stats.h"

namespace kiln::bind {

struct PrologueCache::State {
  const pipeline::CompiledGraph* graph = nullptr;
  std::shared_ptr<PreparedProgram> prepared;
  std::vector<int> inputs;              // captured input of each prologue input
  // What each prologue input was when the kept results were computed.
  std::vector<at::Tensor> seen;
  std::vector<const void*> memory;
  std::vector<uint32_t> versions;
  std::vector<PyObject*> results;       // owned; empty until the first run

  ~State() {
    if (results.empty() || !Py_IsInitialized()) return;
    PyGILState_STATE g = PyGILState_Ensure();
    for (PyObject* r : results) Py_DECREF(r);
    PyGILState_Release(g);
  }

  bool fresh(PyObject* const* captured) const {
    if (results.empty()) return false;
    for (size_t k = 0; k < inputs.size(); ++k) {
      const at::Tensor& t = THPVariable_Unpack(captured[inputs[k]]);
      if (!t.is_same(seen[k]) || t.data_ptr() != memory[k] || t._version() != versions[k]) return false;
    }
    return true;
  }

  bool run(PyObject* const* captured) {
    std::vector<PyObject*> args;
    for (int i : inputs) args.push_back(captured[i]);
    std::vector<PyObject*> outs;
    if (!run_program(*graph, *prepared, args.data(), outs)) return false;
    ++stats().prologue_runs;
    seen.clear();
    memory.clear();
    versions.clear();
    for (PyObject* a : args) {
      const at::Tensor& t = THPVariable_Unpack(a);
      seen.push_back(t);
      memory.push_back(t.data_ptr());
      versions.push_back(t._version());
    }
    if (results.empty()) {
      results = std::move(outs);
      return true;
    }
    // Again: into the kept tensors where they can take it, so that what reads them where they
    // lie (a CUDA-graph recording) reads the new values.
    for (size_t r = 0; r < outs.size(); ++r) {
      at::Tensor kept = THPVariable_Unpack(results[r]);
      const at::Tensor& now = THPVariable_Unpack(outs[r]);
      bool shares = false;
      for (const at::Tensor& t : seen) shares = shares || kept.is_alias_of(t);
      if (!shares && kept.sizes() == now.sizes() && kept.strides() == now.strides() && kept.dtype() == now.dtype()) {
        kept.copy_(now);
        Py_DECREF(outs[r]);
      } else {
        Py_SETREF(results[r], outs[r]);
      }
    }
    return true;
  }
};

PrologueCache::PrologueCache() : s_(std::make_unique<State>()) {}
PrologueCache::~PrologueCache() = default;

std::unique_ptr<PrologueCache> PrologueCache::make(const pipeline::CompiledGraph& cg, std::string& error) {
  std::unique_ptr<PrologueCache> c(new PrologueCache());
  c->s_->graph = cg.prologue.get();
  c->s_->inputs = cg.prologue_inputs;
  c->s_->prepared = prepare_program(*cg.prologue, error);
  if (!c->s_->prepared) return nullptr;
  return c;
}

bool PrologueCache::append_results(PyObject* const* inputs, std::vector<PyObject*>& program_inputs) {
  try {
    if (!s_->fresh(inputs) && !s_->run(inputs)) return false;
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, (std::string("kiln: the prologue: ") + e.what()).c_str());
    return false;
  }
  program_inputs.insert(program_inputs.end(), s_->results.begin(), s_->results.end());
  return true;
}

}  // namespace kiln::bind
