// The callable that kiln.compile returns for a function: a CPython type with vectorcall, so a
// call that hits the cache goes from Python straight into C++ guard checks and kernels.
#pragma once
#include <Python.h>

#include <memory>
#include <string>
#include <vector>

#include "bind/capture/capture.h"
#include "bind/runtime/cuda_graphs.h"
#include "core/pipeline/compile_graph.h"

namespace kiln::bind {

struct PreparedProgram;
struct TorchProgram;
struct BackwardProgram;
class PrologueCache;

// Who runs a captured graph: kiln's compiler (kernels), or torch's own ops one node at a time
// (kiln.compile(backend="eager"), as torch.compile(backend="eager") runs its FX graph).
enum class Backend { Inductor, Eager };

// torch.compile's `dynamic`: None (automatic: static first, then the dims that changed made
// symbolic), True (symbolic from the first compile), False (static; marked dims still symbolic).
enum class Dynamic { Automatic, Always, Never };

struct CompileConfig {
  Backend backend = Backend::Inductor;
  Dynamic dynamic = Dynamic::Automatic;
  std::string mode = "default";
  bool fullgraph = false;
  bool disable = false;
  int cache_limit = 8;
};

// One specialisation of a function: guards, and either a compiled graph (or, with the eager
// backend, the graph as torch calls) or the reason it runs eagerly under those guards.
struct Entry {
  CaptureResult capture;
  bool eager = false;
  std::string reason;
  std::string location;
  CompileConfig cfg;
  std::unique_ptr<pipeline::CompiledGraph> compiled;
  std::shared_ptr<PreparedProgram> prepared;
  // The program's prologue and its kept results (compiled->prologue; prologue.h).
  std::unique_ptr<PrologueCache> prologue;
  // A graph with results autograd tracks: `compiled` is the forward program (the outputs, then
  // the values saved for backward) and this the backward (autograd_node.h).
  std::shared_ptr<BackwardProgram> backward;
  // mode="reduce-overhead": the program recorded as a CUDA graph (cuda_graphs.h).
  std::unique_ptr<CudaGraphRunner> cudagraphs;
  std::string cudagraphs_note;  // for explain: recorded, or why not
  // Backend::Eager: the captured graph as calls of torch's callables (eager_backend.h).
  std::shared_ptr<TorchProgram> torch_program;
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

// Builds an entry for a call: capture, then compile (never throws; failures become eager
// entries with a reason).
std::unique_ptr<Entry> build_entry(PyObject* fn, const BoundArgs& args, const CompileConfig& cfg, const std::string& name);

// Rebuilds a Python value after a compiled entry ran (new reference, nullptr with an error set).
// `memo` (at a break): one object per OutSpec::memo id, shared by every spec that names it.
PyObject* build_output(const OutSpec& spec, const std::vector<PyObject*>& graph_outputs, const FrameView& frame,
                       std::vector<PyObject*>* memo = nullptr);

// Runs a compiled (not eager) entry for the bound arguments: its graph, then any graph break
// and the resume function after it (new reference, or nullptr with an error set). Where the
// graph raises and the entry updates inputs or stores attributes, nullptr with no error and
// `*rerun_eagerly` set when given: the caller runs the call eagerly for eager's partial effects.
PyObject* run_entry(Entry& e, PyObject* fn, const BoundArgs& bound, bool* rerun_eagerly = nullptr);

// The entries of one code object: a compiled function's, or a frame's the hook took.
struct CodeCache {
  CompileConfig cfg;
  std::vector<std::unique_ptr<Entry>> entries;
  bool eager_forever = false;  // the cache limit was reached
  bool warned = false;         // the one warning about running eagerly was given
  std::string name;
  Py_ssize_t argcount = 0;
  Py_ssize_t nargs = 0;        // parameter slots: positional, keyword-only, *args, **kwargs
  bool simple = false;         // positional parameters only: calls with exactly those bind for free
  std::vector<std::string> names;  // of the parameter slots
  std::vector<bool> private_params;  // see BoundArgs::private_slots (resume functions)
  DynamicDims dynamic;               // input dims captured with symbolic sizes from now on
  CodeCache() = default;
  CodeCache(PyObject* code, const CompileConfig& cfg);
};

// The entry whose guards hold for these arguments, built on a miss. nullptr: run eagerly
// (`failed`: with a Python error set, as fullgraph=True raises).
Entry* select_entry(CodeCache& cache, PyObject* fn, BoundArgs& bound, bool& failed);

// A call that runs entirely eagerly (e: its eager entry; nullptr: past the cache limit): counted
// in kiln.stats(), and (with `warn`) one warning per code object with the reason, unless
// kiln.config.suppress_fallback_warnings is set. A user's shape or dtype error is not a fallback:
// the eager run raises it.
void record_eager_call(CodeCache& cache, const Entry* e, bool warn);
bool fallback_warnings_silenced();
bool config_flag(const char* name);  // kiln.config's switch of that name (False if absent)

// Module-level API used by module.cpp.
PyObject* make_compiled_function(PyObject* fn, const CompileConfig& cfg);  // new reference
bool is_compiled_function(PyObject* obj);
PyObject* compiled_function_target(PyObject* obj);  // borrowed
bool compiled_function_disabled(PyObject* obj);
const CompileConfig& compiled_function_config(PyObject* obj);
void set_private_params(PyObject* obj, std::vector<bool> mask);  // see CodeCache::private_params
void reset_all();
PyTypeObject* compiled_function_type();

}  // namespace kiln::bind
