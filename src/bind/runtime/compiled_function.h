// The callable that kiln.compile returns for a function: a CPython type with vectorcall, so a
// call that hits the cache goes from Python straight into C++ guard checks and kernels.
#pragma once
#include <Python.h>

#include <memory>
#include <string>
#include <vector>

#include "bind/capture/capture.h"
#include "core/pipeline/compile_graph.h"

namespace kiln::bind {

struct PreparedProgram;

// One specialisation of a function: guards, and either a compiled graph or the reason it runs
// eagerly under those guards.
struct Entry {
  CaptureResult capture;
  bool eager = false;
  std::string reason;
  std::string location;
  std::unique_ptr<pipeline::CompiledGraph> compiled;
  std::shared_ptr<PreparedProgram> prepared;
  // A graph whose outputs are all inputs (nothing to compute before a break): no program, the
  // outputs are these inputs.
  bool passthrough = false;
  std::vector<int> passthrough_inputs;
  // At a graph break: the resume functions, as compiled functions of their own (owned).
  std::vector<PyObject*> resume;
  Entry() = default;
  Entry(const Entry&) = delete;
  Entry& operator=(const Entry&) = delete;
  ~Entry();
};

struct CompileConfig {
  std::string mode = "default";
  bool fullgraph = false;
  bool disable = false;
  int cache_limit = 8;
};

// Builds an entry for a call: capture, then compile (never throws; failures become eager
// entries with a reason).
std::unique_ptr<Entry> build_entry(PyObject* fn, const BoundArgs& args, const CompileConfig& cfg, const std::string& name);

// Rebuilds a Python value after a compiled entry ran (new reference, nullptr with an error set).
PyObject* build_output(const OutSpec& spec, const std::vector<PyObject*>& graph_outputs, const FrameView& frame);

// Runs an entry for the bound arguments (new reference, or nullptr with an error set).
PyObject* run_entry(Entry& e, PyObject* fn, PyObject* const* args, size_t nargsf, PyObject* kwnames,
                    const BoundArgs& bound);

// Module-level API used by module.cpp.
PyObject* make_compiled_function(PyObject* fn, const CompileConfig& cfg);  // new reference
bool is_compiled_function(PyObject* obj);
PyObject* compiled_function_target(PyObject* obj);  // borrowed
void reset_all();
PyTypeObject* compiled_function_type();

}  // namespace kiln::bind
