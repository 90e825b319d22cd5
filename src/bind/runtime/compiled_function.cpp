#include "bind/runtime/compiled_function.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_map>

#include "bind/capture/mode_setter.h"
#include "bind/hook/frame_hook.h"
#include "bind/torch/tensor_bridge.h"
#include "bind/hook/frame_policy.h"
#include "bind/interrupts.h"
#include "bind/python_objects.h"
#include "bind/runtime/autograd_node.h"
#include "bind/runtime/eager_backend.h"
#include "bind/runtime/executor.h"
#include "bind/runtime/prologue.h"
#include "bind/runtime/stats.h"
#include "core/autodiff/training_graphs.h"
#include "core/ops/registry.h"
#include "core/support/log.h"

namespace kiln::bind {

Stats& stats() {
  static Stats s;
  return s;
}

std::vector<ExplainRecord>*& explain_log() {
  static std::vector<ExplainRecord>* log = nullptr;
  return log;
}

namespace {

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Shape and dtype errors found while capturing are the user's errors: eager raises them.
bool is_user_error(const std::string& reason) { return reason.rfind("shape/dtype check", 0) == 0; }

}  // namespace

Entry::~Entry() {
  if (!Py_IsInitialized()) return;
  for (PyObject* f : resume) Py_XDECREF(f);
}

namespace {

void record_explain(const Entry& e, const std::string& name) {
  std::vector<ExplainRecord>* log = explain_log();
  if (!log) return;
  ExplainRecord r;
  r.name = name;
  r.eager = e.eager;
  r.guards = e.capture.guards.strs();
  r.captured = e.capture.captured_text;
  if (e.eager) {
    r.reason = e.reason;
    r.location = e.location;
  } else if (e.capture.graph_break) {
    r.graph_break = true;
    r.reason = e.capture.graph_break->reason;
    r.location = e.capture.graph_break->location;
  }
  if (e.torch_program) {  // the eager backend: the graph as captured, run by torch's ops
    const ir::Graph& g = *e.capture.graph;
    r.has_graph = true;
    r.graph = g.str();
    r.op_count = g.op_count();
    for (const auto& n : g.nodes())
      if (!n->meta.wrapped_number && n->op_name() != "scalar") {
        r.device = n->meta.device.str();
        break;
      }
  }
  if (e.compiled) {
    r.has_graph = true;
    r.graph = e.compiled->graph_text;
    r.op_count = e.compiled->op_count;
    r.loop_ir = e.compiled->loop_text;
    r.source = e.compiled->source;
    r.source_path = e.compiled->source_path;
    r.compile_seconds = e.compiled->compile_seconds;
    r.device = e.compiled->program.device.str();
    for (const auto& k : e.compiled->kernels) {
      std::string launch;
      if (k.cuda_fn) {
        launch = "grid=" + (k.grid_expr.valid() ? k.grid_expr.str() : std::to_string(k.grid)) +
                 " block=" + std::to_string(k.block);
        if (!k.tuned.empty()) launch += k.tuned == "disk" ? " (autotuned, from the disk cache)" : " (autotuned)";
      }
      r.kernels.push_back({k.name, k.source, launch});
    }
    r.cudagraphs = e.cudagraphs_note;
  }
  if (e.compiled && e.compiled->prologue) {
    r.prologue_graph = e.compiled->prologue->graph_text;
    for (const auto& k : e.compiled->prologue->kernels) r.prologue_kernels.push_back(k.name);
  }
  if (e.backward) {
    const auto& stages = e.backward->stages;
    for (size_t i = 0; i < stages.size(); ++i) {
      const pipeline::CompiledGraph& b = *stages[i].compiled;
      const std::string head = stages.size() > 1 ? "# stage " + std::to_string(i) + " of " + std::to_string(stages.size()) +
                                                       " (a DistributedDataParallel bucket boundary after it)\n"
                                                 : "";
      r.backward_graph += head + b.graph_text;
      r.backward_source += b.source;
      for (const auto& k : b.kernels) r.backward_kernels.push_back(k.name);
    }
    r.backward_stages = stages.size();
    r.saved = e.backward->saved;
  }
  log->push_back(std::move(r));
}

// A graph may compute nothing: its outputs (the return value, what a break needs) are inputs,
// and it has no node that must run for its errors (an unused torch_call).
bool plan_passthrough(Entry& e) {
  const ir::Graph& g = *e.capture.graph;
  for (const auto& n : g.nodes())
    if (n->op->keep_unused && n->op->keep_unused(*n)) return false;
  std::vector<int> idx;
  for (const ir::Node* o : g.outputs()) {
    auto it = std::find(g.inputs().begin(), g.inputs().end(), o);
    if (it == g.inputs().end()) return false;
    idx.push_back(static_cast<int>(it - g.inputs().begin()));
  }
  e.passthrough = true;
  e.passthrough_inputs = std::move(idx);
  return true;
}

}  // namespace

namespace {

// How torch's own CPU kernels round, as kiln/_torch_kernels.py finds out by running them (once
// per process; not kept if that was interrupted). On failure kiln follows none of them.
loop::TorchNumerics torch_numerics() {
  static std::optional<loop::TorchNumerics> found;
  if (found) return *found;
  loop::TorchNumerics t;
  t.prod_vector_bytes = 0;
  PyObject* mod = PyImport_ImportModule("kiln._torch_kernels");
  PyObject* r = mod ? PyObject_CallMethod(mod, "probe", nullptr) : nullptr;
  if (r && PyTuple_Check(r) && PyTuple_GET_SIZE(r) == 2) {
    t.prod_vector_bytes = static_cast<int>(PyLong_AsLong(PyTuple_GET_ITEM(r, 0)));
    const long form = PyLong_AsLong(PyTuple_GET_ITEM(r, 1));
    if (form >= 0 && form <= 2) t.gelu_contiguous_f32 = static_cast<loop::TorchNumerics::GeluForm>(form);
  }
  bool failed = !r;
  Py_XDECREF(r);
  Py_XDECREF(mod);
  if (PyErr_Occurred()) clear_error();
  if (failed && interrupt_pending()) return t;
  found = t;
  return t;
}

// The torch facts a backward's derivatives follow (ops::TorchFacts), found out once per process
// by kiln/_torch_kernels.py; on failure the defaults stand (torch 2.14's behaviour).
void find_torch_facts() {
  static bool found = false;
  if (found) return;
  PyObject* mod = PyImport_ImportModule("kiln._torch_kernels");
  PyObject* r = mod ? PyObject_CallMethod(mod, "clamp_gradient_at_bounds", nullptr) : nullptr;
  if (r) ops::torch_facts().clamp_gradient_at_bounds = r == Py_True;
  PyObject* a = r ? PyObject_CallMethod(mod, "cpu_attention_like_query", nullptr) : nullptr;
  if (a) ops::torch_facts().cpu_attention_like_query = a == Py_True;
  found = (r && a) || !interrupt_pending();
  Py_XDECREF(a);
  Py_XDECREF(r);
  Py_XDECREF(mod);
  if (PyErr_Occurred()) clear_error();
}

// Inside DistributedDataParallel's forward (the module it makes active for torch.compile's
// DDPOptimizer while it runs the wrapped module): its bucket caps in bytes, the first bucket's
// and the others'. False outside DDP (or when torch's names have moved).
bool ddp_bucket_caps(int64_t& first_cap, int64_t& cap) {
  if (!config_flag("optimize_ddp")) return false;
  PyObject* modules = PyImport_GetModuleDict();  // borrowed; DDP is in use only if imported
  PyObject* mod = PyDict_GetItemString(modules, "torch.nn.parallel.distributed");  // borrowed
  if (!mod) return false;
  PyObject* ddp = PyObject_GetAttrString(mod, "DistributedDataParallel");
  PyObject* active = ddp ? PyObject_GetAttrString(ddp, "_active_ddp_module") : nullptr;
  bool found = false;
  if (active && active != Py_None) {
    PyObject* c = PyObject_GetAttrString(active, "bucket_bytes_cap");
    if (c && PyLong_Check(c)) {
      cap = PyLong_AsLongLong(c);
      found = cap > 0;
    }
    Py_XDECREF(c);
    // DDP's first bucket is 1 MiB (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES) unless the
    // user gave bucket_cap_mb, when all buckets take that cap.
    first_cap = cap;
    PyObject* small_first = PyObject_GetAttrString(active, "bucket_bytes_cap_default");
    if (small_first == Py_True) {
      first_cap = int64_t{1} << 20;
      PyObject* dist = PyDict_GetItemString(modules, "torch.distributed");  // borrowed
      PyObject* d = dist ? PyObject_GetAttrString(dist, "_DEFAULT_FIRST_BUCKET_BYTES") : nullptr;
      if (d && PyLong_Check(d)) first_cap = PyLong_AsLongLong(d);
      Py_XDECREF(d);
    }
    Py_XDECREF(small_first);
  }
  Py_XDECREF(active);
  Py_XDECREF(ddp);
  if (PyErr_Occurred()) clear_error();
  return found && first_cap > 0;
}

// mode="reduce-overhead" (and max-autotune, which includes it): a CUDA program gets a runner
// that records it; one a graph cannot hold runs as usual, with the reason.
void plan_cuda_graphs(Entry& e) {
  if (e.compiled->program.device.type != DeviceType::CUDA) return;  // as torch's: CPU ignores the mode
  const std::string why = cuda_graph_refusal(*e.compiled, *e.prepared);
  if (why.empty()) {
    e.cudagraphs = std::make_unique<CudaGraphRunner>();
    e.cudagraphs_note = e.compiled->program.symbols.empty()
                            ? "recorded on the entry's second call, replayed from then on"
                            : "recorded per size on its second call (at most 8 sizes), replayed from then on";
  } else {
    e.cudagraphs_note = "not recorded: " + why;
    ++stats().fallback_reasons["cudagraphs: " + why];
  }
}

// Which inputs of an inference graph are stable (ir::Graph::stable_inputs): parameters, and
// tensors a module holds (buffers, reached through a module on their source), that the graph
// does not update. Anything else (the call's tensors, what the frame builds) is read afresh.
std::vector<bool> stable_inputs(const CaptureResult& c, PyObject* fn, const BoundArgs& args) {
  static PyObject* parameter = nullptr;
  static PyObject* module = nullptr;
  if (!parameter) {
    PyObject* nn = PyImport_ImportModule("torch.nn");
    parameter = nn ? PyObject_GetAttrString(nn, "Parameter") : nullptr;
    module = nn ? PyObject_GetAttrString(nn, "Module") : nullptr;
    Py_XDECREF(nn);
    if (!parameter || !module) {
      PyErr_Clear();
      Py_CLEAR(parameter);
      Py_CLEAR(module);
      return {};
    }
  }
  std::set<int> updated;
  for (const auto& [input, output] : c.writebacks) updated.insert(input);
  for (const auto& [input, output] : c.graph->input_updates) updated.insert(input);
  FrameView fv{args.locals.data(), PyFunction_GET_GLOBALS(fn), PyEval_GetBuiltins(), PyFunction_GET_CLOSURE(fn), nullptr};
  std::vector<bool> stable(c.input_sources.size(), false);
  bool any = false;
  for (size_t i = 0; i < c.input_sources.size(); ++i) {
    const SourcePtr& src = c.input_sources[i];
    if (!src || updated.count(static_cast<int>(i)) || src->made_in_frame() || src->kind == Source::Kind::Seed) continue;
    PyObject* v = eval_source(*src, fv);
    bool is = v && PyObject_IsInstance(v, parameter) == 1;
    Py_XDECREF(v);
    for (SourcePtr b = src->base; !is && b; b = b->base) {
      PyObject* owner = eval_source(*b, fv);
      is = owner && PyObject_IsInstance(owner, module) == 1;
      Py_XDECREF(owner);
    }
    if (PyErr_Occurred()) PyErr_Clear();
    stable[i] = is;
    any = any || is;
  }
  if (!any) stable.clear();
  return stable;
}

// nullptr: interrupted (with the exception set), or (with none set) a cancelled compile whose
// SIGINT handler did not raise.
std::unique_ptr<Entry> build_entry_once(PyObject* fn, const BoundArgs& args, const CompileConfig& cfg,
                                        const std::string& name, bool cancellable) {
  auto e = std::make_unique<Entry>();
  e->cfg = cfg;
  auto t0 = std::chrono::steady_clock::now();
  find_torch_facts();  // shape rules read them at capture (attention's result layout), derivatives after
  e->capture = capture(fn, args);
  Stats& s = stats();
  ++s.frames_captured;
  const double capture_s = since(t0);
  s.capture_seconds += capture_s;
  log("timing", name + ": capture " + std::to_string(static_cast<int>(capture_s * 1e3 + 0.5)) + " ms");
  // Ctrl-C during capture: a KeyboardInterrupt kept from one of capture's Python calls, or a
  // signal that arrived while C++ ran. Nothing is cached, so the next call captures afresh.
  if (check_interrupt()) return nullptr;
  if (!e->capture.ok) {
    e->eager = true;
    // An entry that runs eagerly is right whatever its guards say; an identity guard on an
    // object the caller makes anew (a context manager, a ContextVar token) would only make
    // every call capture again, to the cache limit.
    e->capture.guards.drop_instance_identities();
    e->reason = e->capture.reason;
    e->location = e->capture.location;
    log("fallback", name + ": runs eagerly: " + e->reason + " at " + e->location);
    record_explain(*e, name);
    return e;
  }
  log("guards", name + ":\n  " + [&] {
    std::string g;
    for (const std::string& x : e->capture.guards.strs()) g += x + "\n  ";
    return g;
  }());
  if (const GraphBreak* b = e->capture.graph_break.get()) {
    ++s.graph_breaks;
    ++s.fallback_reasons[b->reason];  // what runs in Python, whole frames or single instructions
    log("graph_breaks", name + ": graph break: " + b->reason + " at " + b->location);
    // The resume function's parameters: the locals, then the stack values (then a call's result);
    // containers rebuilt at the break are the resume function's own.
    std::vector<bool> fresh;
    auto is_fresh = [](const OutSpec& s) {
      return s.kind == OutSpec::Kind::List || s.kind == OutSpec::Kind::Dict || s.kind == OutSpec::Kind::Copy ||
             s.kind == OutSpec::Kind::Tuple || s.kind == OutSpec::Kind::Construct || s.kind == OutSpec::Kind::Object ||
             s.kind == OutSpec::Kind::MakeDict;
    };
    // A container that another value handed on also reaches (d and d.update, or a list inside
    // another) is one object the resume function must see as one: not its own tracker.
    std::map<int, int> memo_uses;
    std::function<void(const OutSpec&)> count = [&](const OutSpec& s) {
      if (s.memo >= 0) ++memo_uses[s.memo];
      for (const OutSpec& i : s.items) count(i);
    };
    for (const OutSpec& s : b->locals) count(s);
    for (const OutSpec& s : b->stack) count(s);
    for (const OutSpec& s : b->operands) count(s);
    auto is_private = [&](const OutSpec& s) { return is_fresh(s) && (s.memo < 0 || memo_uses[s.memo] == 1); };
    for (const OutSpec& s : b->locals) fresh.push_back(is_private(s));
    for (const OutSpec& s : b->stack)
      if (s.kind != OutSpec::Kind::Null) fresh.push_back(is_private(s));
    for (PyObject* f : b->resume) {
      PyObject* cf = make_compiled_function(f, cfg);
      if (cf) set_private_params(cf, fresh);
      if (!cf) {
        PyErr_Clear();
        e->eager = true;
        e->reason = "could not wrap a resume function";
        record_explain(*e, name);
        return e;
      }
      e->resume.push_back(cf);
    }
  }
  if (plan_passthrough(*e)) {
    record_explain(*e, name);
    return e;
  }
  auto t1 = std::chrono::steady_clock::now();
  std::string error;
  // The eager backend runs the graph node by node through torch: no passes, kernels or compiler.
  if (cfg.backend == Backend::Eager) {
    if (!e->capture.guards.symbols().empty()) {
      e->eager = true;  // build_entry captures again with static sizes
      e->reason = "shape-generic graphs run through compiled kernels only";
      return e;
    }
    if (e->capture.graph->scalar_inputs > 0) {
      e->eager = true;
      e->reason = "eager backend: Python floats read per call (an optimizer's step) run through compiled kernels only";
      record_explain(*e, name);
      return e;
    }
    e->torch_program = prepare_torch_program(*e->capture.graph, error, &e->capture.tracked);
    s.compile_seconds += since(t1);
    if (!e->torch_program) {
      e->eager = true;
      e->reason = "eager backend: " + error;
      e->location = e->capture.location;
      log("fallback", name + ": runs eagerly: " + e->reason);
      record_explain(*e, name);
      return e;
    }
    ++s.graphs_compiled;
    log("graph", name + " (backend=eager):\n" + e->capture.graph->str());
    record_explain(*e, name);
    return e;
  }
  // Sizes the capture specialized are constants in the kernels (their guards hold them).
  e->capture.graph->substitute_sizes(e->capture.guards.specializations());
  // A result autograd tracks: the forward and backward programs of the joint graph instead.
  ir::Graph* forward = e->capture.graph.get();
  autodiff::TrainingGraphs training;
  std::vector<autodiff::BackwardStage> backward_stages;
  if (e->capture.needs_backward) {
    auto bp = std::make_shared<BackwardProgram>();
    std::vector<ir::Node*> wrt;
    const auto& graph_inputs = forward->inputs();
    for (size_t i = 0; i < graph_inputs.size(); ++i)
      if (e->capture.tracked.count(graph_inputs[i])) {
        wrt.push_back(graph_inputs[i]);
        bp->wrt.push_back(static_cast<int>(i));
      }
    bool built;
    {
      // Symbolic sizes read the capture's hints and facts here as in the compile below: a
      // reshape of the gradient is a view in both or a copy in both (without them its shape
      // rule took it for a copy, and the compile then made it a view with a copy's strides)
      GuardShapeEnv env(e->capture.guards, true);
      sym::ShapeEnvScope env_scope(&env);
      built = autodiff::make_training_graphs(*forward, wrt, e->capture.tracked, training, error);
    }
    if (!built) {
      e->eager = true;
      e->reason = "the backward cannot be built: " + error;
      e->location = e->capture.location;
      s.compile_seconds += since(t1);
      log("fallback", name + ": runs eagerly: " + e->reason);
      record_explain(*e, name);
      return e;
    }
    forward = training.forward.get();
    bp->outputs = training.outputs;
    bp->saved = training.saved;
    bp->tangent_of = training.tangent_of;
    bp->saved_as_output = training.saved_as_output;
    bp->grad_of = training.grad_of;
    bp->grad_tangents = training.grad_tangents;
    bp->forward_int_symbols = training.forward->scalar_symbols.size();
    bp->symbol_dims = training.backward_symbol_dims;
    bp->backward_error = training.backward_error;
    bp->error_tangents = training.error_tangents;
    bp->result_witnesses = training.result_witnesses;
    for (int t : bp->tangent_of) bp->tangents += t >= 0;
    // Inside DistributedDataParallel's forward, the backward is cut at its bucket boundaries so
    // that the all-reduces overlap it (core/autodiff/backward_stages.h).
    if (int64_t first_cap = 0, cap = 0; ddp_bucket_caps(first_cap, cap)) {
      std::string why;
      if (!autodiff::split_backward_stages(*training.backward, training.saved, first_cap, cap, backward_stages, why)) {
        log("graph", name + ": the backward stays one program: " + why);
        backward_stages.clear();
      }
    }
    // One backward program reads the saved values in whatever layout the forward leaves them
    // (a convolution's channels-last result, not a row-major copy); staged ones as captured.
    if (backward_stages.empty()) autodiff::free_saved_layouts(training);
    bp->stages.resize(std::max<size_t>(backward_stages.size(), 1));
    for (BackwardStageProgram& st : bp->stages) st.compiled = std::make_unique<pipeline::CompiledGraph>();
    plan_backward_stages(*bp, backward_stages);
    e->backward = std::move(bp);
    log("graph", name + ": training: saves " + std::to_string(training.saved) + " values (" +
                     std::to_string(training.saved_bytes) + " bytes), the backward recomputes " +
                     std::to_string(training.recomputed) + " nodes");
  }
  // An inference graph: what parameters alone make is computed once, in a prologue.
  if (!e->capture.needs_backward) forward->stable_inputs = stable_inputs(e->capture, fn, args);
  e->compiled = std::make_unique<pipeline::CompiledGraph>();
  pipeline::CompileOptions opts;
  opts.mode = cfg.mode;
  opts.name = name + "_" + std::to_string(s.graphs_compiled);
  // Asked while the C++ compiler runs: Ctrl-C stops it (the handler runs below, unlocked).
  if (cancellable) opts.cancel = [] { return interrupt_requested(); };
  opts.torch = torch_numerics();
  if (opts.autotunes()) opts.time_extern = torch_extern_timing(0);
  bool ok;
  {
    // The core compiles without Python: other threads run meanwhile. Compiles themselves take
    // turns (the core's caches expect one at a time, as under the GIL).
    static std::mutex compiling;
    GilRelease unlocked;
    std::lock_guard<std::mutex> one_at_a_time(compiling);
    // Layout choices for symbolic sizes read the capture's hints; no new facts.
    GuardShapeEnv env(e->capture.guards, true);
    sym::ShapeEnvScope env_scope(&env);
    ok = pipeline::compile_graph(*forward, opts, *e->compiled, error);
    const std::string forward_name = opts.name;
    if (ok && e->backward && backward_stages.empty()) {
      try {
        autodiff::adopt_saved_layouts(training);
      } catch (const std::exception& x) {
        ok = false, error = x.what();
      }
    }
    for (size_t i = 0; ok && e->backward && i < e->backward->stages.size(); ++i) {
      opts.name = forward_name + "_backward" + (i ? "_" + std::to_string(i) : std::string());
      ir::Graph& graph = backward_stages.empty() ? *training.backward : *backward_stages[i].graph;
      ok = pipeline::compile_graph(graph, opts, *e->backward->stages[i].compiled, error);
      if (!ok) error = "the backward: " + error;
    }
  }
  s.compile_seconds += since(t1);
  if (check_interrupt()) return nullptr;   // a compile that ran to its end is in the disk cache
  bool cancelled = e->compiled->cancelled;
  for (size_t i = 0; e->backward && i < e->backward->stages.size(); ++i) cancelled = cancelled || e->backward->stages[i].compiled->cancelled;
  if (cancelled) return nullptr;  // the handler did not raise: compile again
  if (ok) {
    const auto preparing = std::chrono::steady_clock::now();
    e->prepared = prepare_program(*e->compiled, error);
    if (e->prepared && e->compiled->prologue && !(e->prologue = PrologueCache::make(*e->compiled, error)))
      e->prepared.reset();
    for (size_t i = 0; e->prepared && e->backward && i < e->backward->stages.size(); ++i) {
      BackwardStageProgram& st = e->backward->stages[i];
      st.prepared = prepare_program(*st.compiled, error);
      if (!st.prepared) e->prepared.reset();
    }
    log("timing", name + ": compile " + std::to_string(static_cast<int>(since(t1) * 1e3 + 0.5)) +
                      " ms, of which preparing the program " +
                      std::to_string(static_cast<int>(since(preparing) * 1e3 + 0.5)) + " ms");
  }
  if (!ok || !e->prepared) {
    e->eager = true;
    e->reason = "compilation failed: " + error;
    e->location = e->capture.location;
    log("fallback", name + ": runs eagerly: " + e->reason);
    e->compiled.reset();
    e->prologue.reset();
    e->backward.reset();
    record_explain(*e, name);
    return e;
  }
  if (cfg.mode == "reduce-overhead" || cfg.mode == "max-autotune") {
    if (e->backward) e->cudagraphs_note = "not recorded: a graph with a backward runs without CUDA graphs (not built yet)";
    else plan_cuda_graphs(*e);
  }
  ++s.graphs_compiled;
  if (e->backward) {
    ++s.backward_graphs_compiled;
    for (const BackwardStageProgram& st : e->backward->stages) s.kernels_generated += static_cast<long>(st.compiled->kernels.size());
  }
  s.kernels_generated += static_cast<long>(e->compiled->kernels.size());
  s.kernels_autotuned += e->compiled->tuned_kernels;
  s.autotune_cache_hits += e->compiled->tuned_from_disk;
  if (e->compiled->disk_cache_hit) ++s.cache_hits_disk;
  record_explain(*e, name);
  return e;
}

}  // namespace

namespace {
std::unique_ptr<Entry> build_entry_interruptible(PyObject* fn, const BoundArgs& args, const CompileConfig& cfg,
                                                 const std::string& name) {
  // A C++ exception no stage caught (a shape rule meeting a case it does not cover) must not
  // cross into Python's call, which would end the process: the call runs eagerly, with it named.
  try {
    std::unique_ptr<Entry> e = build_entry_once(fn, args, cfg, name, true);
    // A SIGINT handler of the program's own that does not raise: the program goes on, and so
    // does the compile, this time to its end.
    if (!e && !PyErr_Occurred()) e = build_entry_once(fn, args, cfg, name, false);
    return e;
  } catch (const std::exception& ex) {
    auto e = std::make_unique<Entry>();
    e->cfg = cfg;
    e->eager = true;
    e->reason = std::string("internal error while compiling: ") + ex.what();
    log("fallback", name + ": runs eagerly: " + e->reason);
    record_explain(*e, name);
    return e;
  }
}
}  // namespace

std::unique_ptr<Entry> build_entry(PyObject* fn, const BoundArgs& args, const CompileConfig& cfg, const std::string& name) {
  const Stats before = stats();
  const size_t explained = explain_log() ? explain_log()->size() : 0;
  // Capture guards it (Interpreter::run); shape rules read it while capture and compilation run.
  ops::DefaultFloatScope default_float(default_dtype());
  std::unique_ptr<Entry> e = build_entry_interruptible(fn, args, cfg, name);
  // A shape-generic entry must compile: if capture or compilation with symbolic sizes stopped
  // (a shape rule that needs constant sizes, a graph that runs through torch), capture again
  // with every size static. A graph break is no reason: what the break hands on (the resume
  // function's locals, the instruction's operands) evaluates its symbolic ints per call.
  // The same for an entry that reads Python floats at each call (the eager backend refuses it).
  if (e && (!e->capture.guards.symbols().empty() || e->capture.dynamic_floats) && e->eager) {
    log("recompiles", name + ": a shape-generic entry failed (" + e->reason + "): captured with static sizes and floats");
    // The attempt counts as nothing but time: its breaks and fallbacks did not happen.
    Stats& s = stats();
    const double capture_s = s.capture_seconds, compile_s = s.compile_seconds;
    s = before;
    s.capture_seconds = capture_s;
    s.compile_seconds = compile_s;
    if (explain_log()) explain_log()->resize(explained);
    DynamicDims none;
    none.none = true;
    BoundArgs fixed = args;
    fixed.dynamic = &none;
    if (fixed.memo) fixed.memo->clear();
    e = build_entry_interruptible(fn, fixed, cfg, name);
  }
  // The guards as one walk that also reads the inputs (guard_tree.h).
  if (e) {
    std::vector<SourcePtr> fetch;
    if (!e->eager) {
      fetch = e->capture.input_sources;
      fetch.insert(fetch.end(), e->capture.scalar_sources.begin(), e->capture.scalar_sources.end());
    }
    e->capture.guards.finalize(fetch);
  }
  return e;
}

PyObject* build_output(const OutSpec& spec, const std::vector<PyObject*>& outs, const FrameView& frame,
                       std::vector<PyObject*>* memo) {
  if (memo && spec.memo >= 0) {
    PyObject*& slot = (*memo)[spec.memo];
    if (!slot) {
      OutSpec fresh = spec;
      fresh.memo = -1;
      slot = build_output(fresh, outs, frame, memo);
    }
    return Py_XNewRef(slot);
  }
  switch (spec.kind) {
    case OutSpec::Kind::Graph: {
      PyObject* o = outs[spec.index];
      Py_INCREF(o);
      return o;
    }
    case OutSpec::Kind::Array:
    case OutSpec::Kind::NumpyScalar: {
      PyObject* a = ndarray_from_tensor(outs[spec.index]);
      if (!a || spec.kind == OutSpec::Kind::Array) return a;
      PyObject* none = PyTuple_New(0);
      PyObject* scalar = PyObject_GetItem(a, none);  // arr[()]: NumPy's scalar of a 0-d array
      Py_DECREF(none);
      Py_DECREF(a);
      return scalar;
    }
    case OutSpec::Kind::ModeExit: {
      // the with block's modes, set for real; its __exit__, the setter of the modes before it
      PyObject* entered = PyObject_CallNoArgs(PyTuple_GET_ITEM(spec.value, 1));
      if (!entered) return nullptr;
      Py_DECREF(entered);
      return Py_NewRef(PyTuple_GET_ITEM(spec.value, 0));
    }
    case OutSpec::Kind::Const: Py_INCREF(spec.value); return spec.value;
    case OutSpec::Kind::Copy: {
      // A container the function made from constants, anew per call: a plain dict, list or set
      // of atoms copied as it is; any other (a defaultdict, nested lists) through copy.deepcopy.
      auto atom = [](PyObject* x) {
        return x == Py_None || PyBool_Check(x) || PyLong_CheckExact(x) || PyFloat_CheckExact(x) ||
               PyUnicode_CheckExact(x) || PyBytes_CheckExact(x);
      };
      PyObject* v = spec.value;
      bool atoms = PyList_CheckExact(v) || PySet_CheckExact(v) || PyDict_CheckExact(v);
      if (PyList_CheckExact(v))
        for (Py_ssize_t i = 0; atoms && i < PyList_GET_SIZE(v); ++i) atoms = atom(PyList_GET_ITEM(v, i));
      if (PyDict_CheckExact(v)) {
        PyObject *k, *x;
        for (Py_ssize_t pos = 0; atoms && PyDict_Next(v, &pos, &k, &x);) atoms = atom(k) && atom(x);
      }
      if (PySet_CheckExact(v)) {
        PyObject* it = PyObject_GetIter(v);
        while (PyObject* x = it ? PyIter_Next(it) : nullptr) {
          atoms = atoms && atom(x);
          Py_DECREF(x);
        }
        Py_XDECREF(it);
        if (PyErr_Occurred()) return nullptr;
      }
      if (atoms && PyDict_CheckExact(v)) return PyDict_Copy(v);
      if (atoms && PyList_CheckExact(v)) return PyList_GetSlice(v, 0, PyList_GET_SIZE(v));
      if (atoms) return PySet_New(v);
      static PyObject* deepcopy = [] {
        PyObject* m = PyImport_ImportModule("copy");
        PyObject* f = m ? PyObject_GetAttrString(m, "deepcopy") : nullptr;
        Py_XDECREF(m);
        return f;
      }();
      if (!deepcopy) return nullptr;
      return PyObject_CallOneArg(deepcopy, v);
    }
    case OutSpec::Kind::Source: {
      PyObject* o = eval_source(*spec.source, frame);
      if (!o && !PyErr_Occurred())
        PyErr_Format(PyExc_RuntimeError, "kiln: %s vanished between guard and use", spec.source->str().c_str());
      return o;
    }
    case OutSpec::Kind::Method: {
      PyObject* self = build_output(spec.items[0], outs, frame, memo);
      if (!self) return nullptr;
      PyObject* m = PyObject_GetAttr(self, spec.value);
      Py_DECREF(self);
      return m;
    }
    case OutSpec::Kind::Tuple:
    case OutSpec::Kind::List: {
      bool tuple = spec.kind == OutSpec::Kind::Tuple;
      PyObject* r = tuple ? PyTuple_New(spec.items.size()) : PyList_New(spec.items.size());
      for (size_t i = 0; i < spec.items.size(); ++i) {
        PyObject* item = build_output(spec.items[i], outs, frame, memo);
        if (!item) {
          Py_DECREF(r);
          return nullptr;
        }
        if (tuple) PyTuple_SET_ITEM(r, i, item);
        else PyList_SET_ITEM(r, i, item);
      }
      if (tuple && spec.value) {  // torch.return_types.max((values, indices))
        PyObject* named = PyObject_CallOneArg(spec.value, r);
        Py_DECREF(r);
        return named;
      }
      return r;
    }
    case OutSpec::Kind::Dict: {
      PyObject* d = PyDict_New();
      for (size_t i = 0; i < spec.items.size(); ++i) {
        PyObject* item = build_output(spec.items[i], outs, frame, memo);
        if (!item || PyDict_SetItem(d, PyTuple_GET_ITEM(spec.value, i), item) < 0) {
          Py_XDECREF(item);
          Py_DECREF(d);
          return nullptr;
        }
        Py_DECREF(item);
      }
      return d;
    }
    case OutSpec::Kind::MakeDict: {
      PyObject* d = build_output(spec.items[0], outs, frame, memo);
      if (!d) return nullptr;
      const Py_ssize_t n = PyTuple_GET_SIZE(spec.value);
      PyObject* args = PyTuple_New(n);  // the factory (defaultdict), then the entries
      for (Py_ssize_t i = 1; i < n; ++i) PyTuple_SET_ITEM(args, i - 1, Py_NewRef(PyTuple_GET_ITEM(spec.value, i)));
      PyTuple_SET_ITEM(args, n - 1, d);
      PyObject* r = PyObject_Call(PyTuple_GET_ITEM(spec.value, 0), args, nullptr);
      Py_DECREF(args);
      return r;
    }
    case OutSpec::Kind::Construct: {
      PyObject* kw = build_output(spec.items[0], outs, frame, memo);
      if (!kw) return nullptr;
      PyObject* empty = PyTuple_New(0);
      PyObject* r = PyObject_Call(spec.value, empty, kw);
      Py_DECREF(empty);
      Py_DECREF(kw);
      return r;
    }
    case OutSpec::Kind::Closure: {
      auto* f = reinterpret_cast<PyFunctionObject*>(spec.value);
      PyObject* fn = PyFunction_NewWithQualName(f->func_code, f->func_globals, f->func_qualname);
      PyObject* cells = fn ? PyTuple_New(static_cast<Py_ssize_t>(spec.items.size())) : nullptr;
      for (size_t i = 0; cells && i < spec.items.size(); ++i) {
        PyObject* content = nullptr;
        if (spec.items[i].kind != OutSpec::Kind::Unbound && !(content = build_output(spec.items[i], outs, frame, memo))) {
          Py_CLEAR(cells);
          break;
        }
        PyTuple_SET_ITEM(cells, i, PyCell_New(content));
        Py_XDECREF(content);
      }
      if (!cells || PyFunction_SetClosure(fn, cells) < 0 ||
          (f->func_defaults && PyFunction_SetDefaults(fn, f->func_defaults) < 0) ||
          (f->func_kwdefaults && PyFunction_SetKwDefaults(fn, f->func_kwdefaults) < 0))
        Py_CLEAR(fn);
      Py_XDECREF(cells);
      return fn;
    }
    case OutSpec::Kind::Int: {
      if (!frame.symbols || !frame.symbol_values) {
        PyErr_SetString(PyExc_RuntimeError, "kiln: a symbolic int without the call's sizes");
        return nullptr;
      }
      const int64_t v = sym::evaluate(spec.expr, [&](const sym::Expr& s) -> int64_t {
        for (size_t i = 0; i < frame.symbols->size(); ++i)
          if ((*frame.symbols)[i] == s) return frame.symbol_values[i];
        return 0;
      });
      return PyLong_FromLongLong(v);
    }
    case OutSpec::Kind::Bound: {
      PyObject* self = build_output(spec.items[0], outs, frame, memo);
      if (!self) return nullptr;
      PyObject* m = PyMethod_New(spec.value, self);
      Py_DECREF(self);
      return m;
    }
    case OutSpec::Kind::Object: {
      PyObject* attrs = build_output(spec.items[0], outs, frame, memo);
      if (!attrs) return nullptr;
      PyObject* empty = PyTuple_New(0);
      auto* cls = reinterpret_cast<PyTypeObject*>(spec.value);
      PyObject* obj = PyBaseObject_Type.tp_new(cls, empty, nullptr);
      Py_DECREF(empty);
      // object's own store: into the __dict__ or a __slots__ member, past the class's __setattr__
      int rc = obj ? 0 : -1;
      PyObject *k, *v;
      for (Py_ssize_t pos = 0; rc == 0 && PyDict_Next(attrs, &pos, &k, &v);) rc = PyObject_GenericSetAttr(obj, k, v);
      Py_DECREF(attrs);
      if (rc < 0) Py_CLEAR(obj);
      return obj;
    }
    case OutSpec::Kind::Null:
    case OutSpec::Kind::Unbound: break;
  }
  Py_RETURN_NONE;
}

namespace {

// `a (op) b` as the BINARY_OP instruction computes it, by dis's operator name.
PyObject* binary_op(const std::string& name, PyObject* a, PyObject* b) {
  static const std::unordered_map<std::string, binaryfunc> ops = {
      {"NB_ADD", PyNumber_Add}, {"NB_AND", PyNumber_And}, {"NB_FLOOR_DIVIDE", PyNumber_FloorDivide},
      {"NB_LSHIFT", PyNumber_Lshift}, {"NB_MATRIX_MULTIPLY", PyNumber_MatrixMultiply},
      {"NB_MULTIPLY", PyNumber_Multiply}, {"NB_REMAINDER", PyNumber_Remainder}, {"NB_OR", PyNumber_Or},
      {"NB_RSHIFT", PyNumber_Rshift}, {"NB_SUBTRACT", PyNumber_Subtract}, {"NB_TRUE_DIVIDE", PyNumber_TrueDivide},
      {"NB_XOR", PyNumber_Xor}, {"NB_INPLACE_ADD", PyNumber_InPlaceAdd}, {"NB_INPLACE_AND", PyNumber_InPlaceAnd},
      {"NB_INPLACE_FLOOR_DIVIDE", PyNumber_InPlaceFloorDivide}, {"NB_INPLACE_LSHIFT", PyNumber_InPlaceLshift},
      {"NB_INPLACE_MATRIX_MULTIPLY", PyNumber_InPlaceMatrixMultiply},
      {"NB_INPLACE_MULTIPLY", PyNumber_InPlaceMultiply}, {"NB_INPLACE_REMAINDER", PyNumber_InPlaceRemainder},
      {"NB_INPLACE_OR", PyNumber_InPlaceOr}, {"NB_INPLACE_RSHIFT", PyNumber_InPlaceRshift},
      {"NB_INPLACE_SUBTRACT", PyNumber_InPlaceSubtract}, {"NB_INPLACE_TRUE_DIVIDE", PyNumber_InPlaceTrueDivide},
      {"NB_INPLACE_XOR", PyNumber_InPlaceXor}};
  if (name == "NB_POWER") return PyNumber_Power(a, b, Py_None);
  if (name == "NB_INPLACE_POWER") return PyNumber_InPlacePower(a, b, Py_None);
  auto it = ops.find(name);
  if (it == ops.end()) {
    PyErr_Format(PyExc_SystemError, "kiln: unknown binary operator %s", name.c_str());
    return nullptr;
  }
  return it->second(a, b);
}

// Whether a call of `e` changes state the caller sees beyond its result: inputs updated in
// place, an optimizer's step counter, attribute stores.
bool has_side_effects(const Entry& e, const std::vector<PyObject*>& counters) {
  return !e.capture.writebacks.empty() || !counters.empty() || !e.capture.replays.empty();
}

// The pending exception as "Type: message", left pending.
std::string current_error_text() {
  PyObject *t, *v, *tb;
  PyErr_Fetch(&t, &v, &tb);
  std::string text = t ? reinterpret_cast<PyTypeObject*>(t)->tp_name : "error";
  if (PyObject* s = v ? PyObject_Str(v) : nullptr) {
    if (const char* c = PyUnicode_AsUTF8(s)) text += std::string(": ") + c;
    Py_DECREF(s);
  }
  PyErr_Clear();
  PyErr_Restore(t, v, tb);
  return text;
}

// After the graph: rebuild the frame, run the instruction kiln could not capture, and go on
// in the resume function (itself compiled when first called).
// Breaks nest in C (a resume function that breaks again calls the next one): bounded here, as
// Python bounds its own recursion, so that runaway recursion raises instead of overflowing.
thread_local int t_break_depth = 0;

// Does the attribute stores the captured code left done (StoreReplay), in program order, and
// gives the caller's changed lists and dicts their new contents. Every object and value is
// read before anything changes: a value may be read from the caller's objects (an item that
// moved in a list the code changed), and those reads must see them as the code found them.
bool replay_stores(const Entry& e, const std::vector<PyObject*>& outs, const FrameView& frame, std::vector<PyObject*>* memo) {
  const std::vector<StoreReplay>& replays = e.capture.replays;
  std::vector<PyObject*> objects, values;  // owned
  auto drop = [&] {
    for (PyObject* o : objects) Py_XDECREF(o);
    for (PyObject* v : values) Py_XDECREF(v);
    return false;
  };
  for (const StoreReplay& r : replays) {
    PyObject* obj = eval_source(*r.object, frame);
    if (!obj) {
      if (!PyErr_Occurred())
        PyErr_Format(PyExc_RuntimeError, "kiln: %s vanished between guard and use", r.object->str().c_str());
      return drop();
    }
    objects.push_back(obj);
    PyObject* v = r.value.kind == OutSpec::Kind::Unbound ? nullptr : build_output(r.value, outs, frame, memo);
    if (!v && r.value.kind != OutSpec::Kind::Unbound) return drop();
    values.push_back(v);
  }
  for (size_t i = 0; i < replays.size(); ++i) {
    const StoreReplay& r = replays[i];
    PyObject *obj = objects[i], *v = values[i];
    int rc;
    if (r.contents && PyList_Check(obj)) rc = PyList_SetSlice(obj, 0, PY_SSIZE_T_MAX, v);
    else if (r.contents && PyDict_CheckExact(obj)) rc = (PyDict_Clear(obj), PyDict_Update(obj, v));
    else if (r.contents) {  // an OrderedDict, a defaultdict: through its own methods (its order is its own)
      PyObject* c = PyObject_CallMethod(obj, "clear", nullptr);
      PyObject* u = c ? PyObject_CallMethod(obj, "update", "(O)", v) : nullptr;
      rc = u ? 0 : -1;
      Py_XDECREF(c);
      Py_XDECREF(u);
    }
    else if (r.object->kind == Source::Kind::Globals && PyDict_Check(obj)) {  // `global name` set or deleted
      // (a del follows the capture's own store, which the replay skipped where it ended deleted)
      rc = v ? PyDict_SetItemString(obj, r.name.c_str(), v) : PyDict_DelItemString(obj, r.name.c_str());
      if (rc < 0 && !v && PyErr_ExceptionMatches(PyExc_KeyError)) rc = (PyErr_Clear(), 0);
    }
    else if (r.generic && v) {  // object.__setattr__: the class's own __setattr__ ran at capture
      PyObject* key = PyUnicode_FromString(r.name.c_str());
      rc = key ? PyObject_GenericSetAttr(obj, key, v) : -1;
      Py_XDECREF(key);
    } else if (!v) rc = PyObject_DelAttrString(obj, r.name.c_str());
    else rc = PyObject_SetAttrString(obj, r.name.c_str(), v);
    if (rc < 0) return drop();
  }
  drop();
  return true;
}

PyObject* call_with_closure(PyObject* compiled, PyObject* closure, PyObject* const* args, size_t nargs);
PyObject* run_break_impl(const Entry& e, const std::vector<PyObject*>& outs, const FrameView& frame);

PyObject* run_break(const Entry& e, const std::vector<PyObject*>& outs, const FrameView& frame) {
  if (t_break_depth >= 200) {
    PyErr_SetString(PyExc_RecursionError, "maximum recursion depth exceeded in kiln's graph breaks");
    return nullptr;
  }
  ++t_break_depth;
  PyObject* r = run_break_impl(e, outs, frame);
  --t_break_depth;
  return r;
}

PyObject* run_break_impl(const Entry& e, const std::vector<PyObject*>& outs, const FrameView& frame) {
  const CompileConfig& cfg = e.cfg;
  const GraphBreak& b = *e.capture.graph_break;
  std::vector<PyObject*> owned;
  std::vector<PyObject*> memo(b.memo_slots, nullptr);
  // The __exit__ setters of with blocks the break is inside, once their modes are set: an error
  // before the resume function runs (the instruction raised) leaves those blocks as their
  // __exit__ would, innermost first, the error kept.
  std::vector<PyObject*> exits;
  auto done = [&](PyObject* r) {
    if (!r && !exits.empty()) {
      PyObject *t, *v, *tb;
      PyErr_Fetch(&t, &v, &tb);
      for (auto it = exits.rbegin(); it != exits.rend(); ++it) {
        PyObject* x = PyObject_CallNoArgs(*it);
        if (x) Py_DECREF(x);
        else PyErr_Clear();
      }
      PyErr_Restore(t, v, tb);
    }
    for (PyObject* o : owned) Py_XDECREF(o);
    for (PyObject* o : memo) Py_XDECREF(o);
    return r;
  };
  auto build = [&](const OutSpec& s) -> PyObject* {
    PyObject* o = s.kind == OutSpec::Kind::Unbound ? Py_NewRef(Py_None) : build_output(s, outs, frame, &memo);
    if (o) owned.push_back(o);
    return o;
  };
  std::vector<PyObject*> resume_args;
  for (const OutSpec& s : b.locals) {
    if (!build(s)) return done(nullptr);
    resume_args.push_back(owned.back());
  }
  for (const OutSpec& s : b.stack) {
    if (s.kind == OutSpec::Kind::Null) continue;
    if (!build(s)) return done(nullptr);
    resume_args.push_back(owned.back());
    if (s.kind == OutSpec::Kind::ModeExit) exits.push_back(owned.back());
  }
  // The instruction's operands (nullptr for a CALL's NULL slot).
  std::vector<PyObject*> ops;
  for (const OutSpec& s : b.operands) {
    if (s.kind == OutSpec::Kind::Null) {
      ops.push_back(nullptr);
      continue;
    }
    if (!build(s)) return done(nullptr);
    ops.push_back(owned.back());
  }
  // The cells' values (passed after the stack and the instruction's result)
  std::vector<PyObject*> cell_args;
  for (const OutSpec& s : b.cells) {
    if (!build(s)) return done(nullptr);
    cell_args.push_back(owned.back());
  }
  if (!replay_stores(e, outs, frame, &memo)) return done(nullptr);
  PyObject* resume_fn;
  if (b.kind == GraphBreak::Kind::Call) {
    PyObject* callable = ops[0] ? ops[0] : ops[1];
    std::vector<PyObject*> args(ops.begin() + (ops[0] ? 1 : 2), ops.end());
    size_t nkw = b.kwnames ? static_cast<size_t>(PyTuple_GET_SIZE(b.kwnames)) : 0;
    PyObject* result;
    {
      HookScope hook(cfg);  // frames the instruction runs (a helper with a break of its own) are offered
      result = PyObject_Vectorcall(callable, args.data(), args.size() - nkw, b.kwnames);
    }
    if (!result) return done(nullptr);
    owned.push_back(result);
    resume_args.push_back(result);
    resume_fn = e.resume[0];
  } else if (b.kind == GraphBreak::Kind::Jump) {
    int t = PyObject_IsTrue(ops[0]);
    if (t < 0) return done(nullptr);
    resume_fn = e.resume[(t == 1) == b.jump_if_true ? 1 : 0];
  } else {
    PyObject* result = nullptr;
    int rc = 0;
    {
      HookScope hook(cfg);  // __getitem__/__setitem__ of user classes are offered too
      switch (b.kind) {
        case GraphBreak::Kind::Subscr:
          if (ops.size() == 3) {  // BINARY_SLICE: container, start, stop
            PyObject* sl = PySlice_New(ops[1], ops[2], nullptr);
            result = sl ? PyObject_GetItem(ops[0], sl) : nullptr;
            Py_XDECREF(sl);
          } else {
            result = PyObject_GetItem(ops[0], ops[1]);
          }
          break;
        case GraphBreak::Kind::StoreSubscr:
          if (ops.size() == 4) {  // STORE_SLICE: value, container, start, stop
            PyObject* sl = PySlice_New(ops[2], ops[3], nullptr);
            rc = sl ? PyObject_SetItem(ops[1], sl, ops[0]) : -1;
            Py_XDECREF(sl);
          } else {
            rc = PyObject_SetItem(ops[1], ops[2], ops[0]);
          }
          break;
        case GraphBreak::Kind::DeleteSubscr: rc = PyObject_DelItem(ops[0], ops[1]); break;
        case GraphBreak::Kind::StoreAttr: rc = PyObject_SetAttr(ops[1], b.name, ops[0]); break;
        case GraphBreak::Kind::BinaryOp: result = binary_op(b.binary_op, ops[0], ops[1]); break;
        default: break;
      }
    }
    bool pushes = b.kind == GraphBreak::Kind::Subscr || b.kind == GraphBreak::Kind::BinaryOp;
    if (pushes ? !result : rc < 0) return done(nullptr);
    if (pushes) {
      owned.push_back(result);
      resume_args.push_back(result);
    }
    resume_fn = e.resume[0];
  }
  resume_args.insert(resume_args.end(), cell_args.begin(), cell_args.end());
  // The resume function was made at capture around that call's closure cells; a helper defined
  // anew at every call of its caller has cells of its own, which the resume function must read
  // (the guards did).
  if (frame.closure) return done(call_with_closure(resume_fn, frame.closure, resume_args.data(), resume_args.size()));
  return done(PyObject_Vectorcall(resume_fn, resume_args.data(), resume_args.size(), nullptr));
}

}  // namespace

PyObject* run_entry(Entry& e, PyObject* fn, const BoundArgs& bound, bool* rerun_eagerly) {
  const auto& sources = e.capture.input_sources;
  FrameView fv{bound.locals.data(), PyFunction_GET_GLOBALS(fn), PyEval_GetBuiltins(), PyFunction_GET_CLOSURE(fn), bound.memo};
  PyObject* stack_inputs[16];
  std::vector<PyObject*> heap_inputs;
  PyObject** inputs = stack_inputs;
  if (sources.size() > 16) {
    heap_inputs.resize(sources.size());
    inputs = heap_inputs.data();
  }
  // The guards' walk read the inputs (then the int scalars) already, or they are read here.
  const auto& scalar_sources = e.capture.scalar_sources;
  const bool walked = bound.fetched && bound.fetched->size() == sources.size() + scalar_sources.size();
  // Per-call sources (a seed, a module built at every call) are read here, once each: a call's
  // parameters of one built module come from one build.
  SourceMemo own_memo;
  if (!fv.memo) fv.memo = &own_memo;
  size_t fetched = 0;
  bool ok = true;
  for (; fetched < sources.size(); ++fetched) {
    inputs[fetched] = walked ? bound.fetched->take(fetched) : nullptr;
    if (!inputs[fetched]) inputs[fetched] = eval_source(*sources[fetched], fv);
    if (!inputs[fetched]) {
      ok = false;
      break;
    }
  }
  // Python ints the entry keeps symbolic: their values for this call (guards checked them)
  std::vector<int64_t> scalars;
  for (size_t i = 0; ok && i < scalar_sources.size(); ++i) {
    PyObject* v = walked ? bound.fetched->take(sources.size() + i) : eval_source(*scalar_sources[i], fv);
    scalars.push_back(v ? PyLong_AsLongLong(v) : 0);
    Py_XDECREF(v);
  }
  if (walked) bound.fetched->release();
  // Python floats read per call (a learning rate), as doubles after the ints; a counter (an
  // optimizer's step count in a 0-d CPU tensor) is kept to be incremented after the graph.
  std::vector<PyObject*> counters;
  for (size_t i = 0; ok && i < e.capture.scalar_inputs.size(); ++i) {
    const CaptureResult::ScalarInput& in = e.capture.scalar_inputs[i];
    PyObject* v = eval_source(*in.source, fv);
    double d = 0;
    ok = v && (in.counter ? cpu_scalar_value(v, d) : (d = PyFloat_AsDouble(v), !PyErr_Occurred()));
    int64_t bits;
    std::memcpy(&bits, &d, sizeof bits);
    scalars.push_back(bits);
    if (ok && in.counter) {
      for (int k = 1; k < in.counter; ++k) counters.push_back(Py_NewRef(v));  // one increment per step
      counters.push_back(v);
    } else {
      Py_XDECREF(v);
    }
  }
  // Every size symbol's value, where a symbolic int is handed out (a counter stored back)
  std::vector<int64_t> symbol_values;
  for (size_t i = 0; ok && i < e.capture.symbol_sources.size(); ++i) {
    const CaptureResult::SymbolSource& w = e.capture.symbol_sources[i];
    symbol_values.push_back(w.fixed >= 0 ? w.fixed : w.input >= 0 ? tensor_dim_size(inputs[w.input], w.dim) : scalars[w.scalar]);
  }
  if (!symbol_values.empty()) {
    fv.symbols = &e.capture.guards.symbols();
    fv.symbol_values = symbol_values.data();
  }
  // Outputs are built after the graph and any break ran: read their sources afresh.
  fv.memo = nullptr;
  PyObject* result = nullptr;
  if (ok) {
    std::vector<PyObject*> outs;
    bool ran;
    // The versions of the inputs the graph updates: one torch's own in-place op updated where it
    // lies (passes::reinplace_input_updates) has been counted already, and is not counted again
    // (no allocation for the usual few updated inputs: this is every call's path)
    int64_t few_versions[8];
    std::vector<int64_t> many_versions(e.capture.writebacks.size() > 8 ? e.capture.writebacks.size() : 0);
    int64_t* versions_before = many_versions.empty() ? few_versions : many_versions.data();
    for (size_t k = 0; k < e.capture.writebacks.size(); ++k) versions_before[k] = tensor_version(inputs[e.capture.writebacks[k].first]);
    if (e.capture.modes_after) apply_modes(*e.capture.modes_after);  // a with block a break had entered, left
    if (e.passthrough) {
      for (int i : e.passthrough_inputs) outs.push_back(Py_NewRef(inputs[i]));
      ran = true;
    } else if (e.torch_program) {
      ran = run_torch_program(*e.torch_program, inputs, outs);
    } else {
      // The program's inputs: the captured ones, then what the prologue made of them.
      std::vector<PyObject*> with_prologue;
      PyObject* const* program_inputs = inputs;
      ran = true;
      if (e.prologue) {
        with_prologue.assign(inputs, inputs + sources.size());
        ran = e.prologue->append_results(inputs, with_prologue);
        program_inputs = with_prologue.data();
      }
      ran = ran && (e.backward    ? run_forward_with_backward(*e.compiled, *e.prepared, e.backward, program_inputs, outs,
                                                              scalars.data(), scalars.size())
                    : e.cudagraphs ? e.cudagraphs->run(*e.compiled, *e.prepared, program_inputs, outs, scalars.data())
                                   : run_program(*e.compiled, *e.prepared, program_inputs, outs, scalars.data()));
    }
    // The graph raised (an integer division by zero, a torch call's error) before any of its
    // effects reached the caller (no step writing an input in place had run): eager would have
    // made the in-place updates and stores that come before the failing op, and raised there.
    // The call runs again eagerly to do exactly that, with eager's error and traceback.
    auto untouched = [&] {
      const int first_write = e.compiled->program.first_step_writing_inputs();
      return first_write < 0 || (!e.backward && !e.cudagraphs && failed_step() >= 0 && failed_step() < first_write);
    };
    if (!ran && rerun_eagerly && !e.passthrough && !e.torch_program && e.compiled && untouched() &&
        has_side_effects(e, counters) && PyErr_ExceptionMatches(PyExc_Exception)) {
      log("fallback", "kiln: " + e.location + ": the compiled graph raised (" + current_error_text() +
                          "); the call runs again eagerly for eager's effects before the error");
      PyErr_Clear();
      *rerun_eagerly = true;
      for (PyObject* o : outs) Py_XDECREF(o);
      for (size_t i = 0; i < fetched; ++i) Py_XDECREF(inputs[i]);
      for (PyObject* c : counters) Py_DECREF(c);
      return nullptr;
    }
    // A branch capture took on a tensor's value (CaptureResult::checks) that this call does not
    // take: its other side raises in eager. Before anything reaches the caller, the call runs
    // again eagerly, for eager's error (or, from a program that updated an input where it lies
    // already, an error saying so: eager raises there too, after the same updates).
    for (size_t k = 0; ran && k < e.capture.checks.size(); ++k) {
      const int holds = PyObject_IsTrue(outs[static_cast<size_t>(e.capture.checks[k])]);
      if (holds == 1) continue;
      ran = false;
      if (holds < 0) break;
      if (rerun_eagerly && (!e.compiled || e.compiled->program.first_step_writing_inputs() < 0)) {
        log("fallback", "kiln: " + e.location + ": a check of the compiled graph failed (a branch on a tensor whose " +
                            "other side raises); the call runs again eagerly");
        *rerun_eagerly = true;
        for (PyObject* o : outs) Py_XDECREF(o);
        for (size_t i = 0; i < fetched; ++i) Py_XDECREF(inputs[i]);
        for (PyObject* c : counters) Py_DECREF(c);
        return nullptr;
      }
      PyErr_SetString(PyExc_RuntimeError,
                      "kiln: a branch on a tensor's value took the side that raises in eager (an assert or a "
                      "validation failed), after the compiled graph had updated an input in place");
    }
    for (size_t k = 0; ran && k < e.capture.detached_outputs.size(); ++k) {
      PyObject*& o = outs[static_cast<size_t>(e.capture.detached_outputs[k])];
      Py_SETREF(o, detached(o));
      ran = o != nullptr;
    }
    for (size_t k = 0; ran && k < e.capture.data_outputs.size(); ++k) {
      PyObject*& o = outs[static_cast<size_t>(e.capture.data_outputs[k])];
      Py_SETREF(o, PyObject_GetAttrString(o, "data"));
      ran = o != nullptr;
    }
    // In-place updates of inputs, into the caller's tensors, before anything reads them.
    for (size_t k = 0; ran && k < e.capture.writebacks.size(); ++k) {
      const auto [input, output] = e.capture.writebacks[k];
      if (!copy_into(inputs[input], outs[output], tensor_version(inputs[input]) == versions_before[k])) ran = false;
    }
    for (PyObject* c : counters)
      if (ran && !add_one_in_place(c)) ran = false;
    if (ran) {
      std::vector<PyObject*> memo(static_cast<size_t>(e.capture.output_memo_slots), nullptr);
      if (e.capture.graph_break) result = run_break(e, outs, fv);
      else if (replay_stores(e, outs, fv, &memo)) result = build_output(e.capture.output, outs, fv, &memo);
      for (PyObject* o : memo) Py_XDECREF(o);
    }
    for (PyObject* o : outs) Py_XDECREF(o);
  } else {
    PyErr_SetString(PyExc_RuntimeError, "kiln: an input of a compiled graph vanished between guard and use");
  }
  for (size_t i = 0; i < fetched; ++i) Py_XDECREF(inputs[i]);
  for (PyObject* c : counters) Py_DECREF(c);
  return result;
}

// ---------------------------------------------------------------------------------------------
// Choosing the entry for a call.

CodeCache::CodeCache(PyObject* code, const CompileConfig& c) : cfg(c) {
  auto* co = reinterpret_cast<PyCodeObject*>(code);
  name = PyUnicode_AsUTF8(co->co_qualname);
  argcount = co->co_argcount;
  nargs = co->co_argcount + co->co_kwonlyargcount + !!(co->co_flags & CO_VARARGS) + !!(co->co_flags & CO_VARKEYWORDS);
  simple = co->co_kwonlyargcount == 0 && !(co->co_flags & (CO_VARARGS | CO_VARKEYWORDS));
  PyObject* vn = PyCode_GetVarnames(co);
  for (Py_ssize_t i = 0; vn && i < nargs; ++i) names.push_back(PyUnicode_AsUTF8(PyTuple_GET_ITEM(vn, i)));
  Py_XDECREF(vn);
  dynamic.all = cfg.dynamic == Dynamic::Always;
}

namespace {

// For each cached entry, the first of its guards that fails on this call, as torch's recompile
// logs give them: "entry 0: L['x'] size changed; entry 1: ...".
std::string failed_guards(const CodeCache& c, const FrameView& fv) {
  std::string out;
  for (size_t i = 0; i < c.entries.size(); ++i) {
    std::string why;
    c.entries[i]->capture.guards.check(fv, &why);
    out += (i ? "; entry " : "entry ") + std::to_string(i) + ": " + why;
  }
  return out;
}

}  // namespace

void record_eager_call(CodeCache& c, const Entry* e, bool warn) {
  if (e && is_user_error(e->reason)) return;  // the eager run raises the user's error itself
  const std::string reason = e ? e->reason : "cache limit reached";
  const std::string location = e ? e->location : "";
  Stats& s = stats();
  ++s.eager_fallbacks;
  ++s.fallback_reasons[reason];
  if (!warn || c.warned || fallback_warnings_silenced()) return;
  c.warned = true;
  std::string msg = "kiln: " + c.name + " runs eagerly: " + reason + (location.empty() ? "" : " (at " + location + ")");
  if (PyErr_WarnEx(PyExc_UserWarning, msg.c_str(), 1) < 0) PyErr_Clear();  // a warning filter set to "error"
}

bool config_flag(const char* name) {
  PyObject* config = PyImport_ImportModule("kiln.config");
  PyObject* flag = config ? PyObject_GetAttrString(config, name) : nullptr;
  bool set = flag && PyObject_IsTrue(flag) == 1;
  Py_XDECREF(flag);
  Py_XDECREF(config);
  PyErr_Clear();
  return set;
}

bool fallback_warnings_silenced() { return config_flag("suppress_fallback_warnings"); }

// Whether an entry was made for the modules this call was handed: each identity guard on a
// module in an argument slot (a forward's `self`) holds for this call. The cache limit counts
// these entries only, as TorchDynamo counts entries per id-matched nn.Module, so that a graph
// break inside a layer's forward gives each layer of a model entries of its own rather than
// sending the ninth layer to eager. All entries of a code object stay under a second limit.
bool for_these_modules(const Entry& e, const FrameView& f) {
  static PyObject* module_type = object_at("torch.nn.Module");
  for (const Guard& g : e.capture.guards.guards())
    if (g.kind == Guard::Kind::Identity && g.source && g.source->kind == Source::Kind::Local && module_type &&
        f.locals[g.source->local] != g.expected && PyObject_IsInstance(g.expected, module_type) == 1)
      return false;
  return true;
}

constexpr int kAccumulatedCacheLimit = 256;  // TorchDynamo's accumulated_recompile_limit

Entry* select_entry(CodeCache& c, PyObject* fn, BoundArgs& bound, bool& failed) {
  failed = false;
  InterruptWatch watch;  // Ctrl-C in Python code that guards and capture run (see interrupts.h)
  FrameView fv{bound.locals.data(), PyFunction_GET_GLOBALS(fn), PyEval_GetBuiltins(), PyFunction_GET_CLOSURE(fn), bound.memo};
  for (auto& e : c.entries) {
    const GuardSet& guards = e->capture.guards;
    const bool hit = guards.finalized() && bound.fetched ? guards.check_and_fetch(fv, *bound.fetched)
                                                         : guards.check(fv, nullptr);
    if (hit) {
      if (interrupt_pending() && watch.raised()) {
        failed = true;
        return nullptr;
      }
      ++stats().cache_hits_memory;
      return e.get();
    }
  }
  if (interrupt_pending() && watch.raised()) {
    failed = true;
    return nullptr;
  }
  if (c.eager_forever) return nullptr;
  const bool all_full = static_cast<int>(c.entries.size()) >= std::max(c.cfg.cache_limit, kAccumulatedCacheLimit);
  const bool full = all_full || std::count_if(c.entries.begin(), c.entries.end(), [&](const auto& e) {
                                  return for_these_modules(*e, fv);
                                }) >= c.cfg.cache_limit;
  if (full) {
    c.eager_forever = all_full;  // else only calls with these modules run eagerly
    if (c.warned) return nullptr;
    std::string msg = "kiln: " + c.name + " hit the cache limit (" +
                      (all_full ? std::to_string(c.entries.size()) + " entries in all"
                                : std::to_string(c.cfg.cache_limit) + " entries, cache_limit") +
                      ") and now runs eagerly; the guards that failed: " + failed_guards(c, fv);
    log("recompiles", msg);
    if (!fallback_warnings_silenced() && PyErr_WarnEx(PyExc_UserWarning, msg.c_str(), 1) < 0) failed = true;
    c.warned = true;  // one warning for this code object
    return nullptr;
  }
  std::string why;
  if (!c.entries.empty()) {
    why = failed_guards(c, fv);
    log("recompiles", c.name + ": recompiling: " + why);
  }
  // Automatic dynamic (dynamic=None): an input dim whose size differs from what an entry was
  // specialized on is captured with a symbolic size from now on, so one entry serves all. Under
  // dynamic=True too, for what it did not make symbolic at first (an int attribute, a counter).
  if (c.cfg.dynamic != Dynamic::Never)
    for (auto& e : c.entries) e->capture.guards.size_changes(fv, c.dynamic.by_source);
  bound.dynamic = &c.dynamic;
  // Capture runs Python code and creates and frees sources: what the memo holds may be stale.
  if (bound.memo) bound.memo->clear();
  if (bound.names.empty()) bound.names = c.names;
  if (!c.private_params.empty()) bound.private_slots = &c.private_params;
  std::unique_ptr<Entry> built = build_entry(fn, bound, c.cfg, c.name);
  if (!built) {  // interrupted: the exception propagates and nothing is cached
    failed = true;
    return nullptr;
  }
  if (!c.entries.empty()) {  // counted once the entry exists: an interrupted one is not
    Stats& st = stats();
    ++st.recompiles;
    st.recompile_reasons.push_back(c.name + ": " + why);
    if (st.recompile_reasons.size() > 64) st.recompile_reasons.erase(st.recompile_reasons.begin());
  }
  c.entries.push_back(std::move(built));
  Entry* e = c.entries.back().get();
  const GraphBreak* brk = e->capture.graph_break.get();
  if (c.cfg.fullgraph && brk && is_user_error(brk->reason)) {
    e->eager = true;  // eager raises the user's own error, at the same point
  } else if (c.cfg.fullgraph && (e->eager || brk) && !is_user_error(e->reason)) {
    const std::string& why = brk ? brk->reason : e->reason;
    const std::string& where = brk ? brk->location : e->location;
    PyErr_Format(PyExc_RuntimeError, "kiln.compile(fullgraph=True): %s %s: %s (at %s)",
                 brk ? "graph break in" : "cannot capture", c.name.c_str(), why.c_str(), where.c_str());
    c.entries.pop_back();
    failed = true;
    return nullptr;
  }
  return e;
}

// ---------------------------------------------------------------------------------------------
// The CompiledFunction type.

namespace {

struct State : CodeCache {
  PyObject* fn = nullptr;
  using CodeCache::CodeCache;
};

struct CompiledFunctionObject {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  State* state;
  PyObject* dict;
};

std::set<CompiledFunctionObject*>& live() {
  static std::set<CompiledFunctionObject*> s;
  return s;
}

// Runs the function itself; frames it calls are offered to kiln (the frame hook).
PyObject* eager(State* st, PyObject* fn, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  if (!PyFunction_Check(fn)) return PyObject_Vectorcall(fn, args, nargsf, kwnames);
  HookScope hook(st->cfg);
  kiln_hook_skip_next(PyFunction_GET_CODE(fn));
  PyObject* r = PyObject_Vectorcall(fn, args, nargsf, kwnames);
  kiln_hook_skip_next(nullptr);
  return r;
}

PyObject* eager(State* st, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  return eager(st, st->fn, args, nargsf, kwnames);
}

// A call of the compiled function as the function `fn`: its own target, or the target's code
// around other closure cells (call_with_closure), with the entries of its code.
PyObject* call_as(State* st, PyObject* fn, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  if (st->cfg.disable || !PyFunction_Check(fn)) return PyObject_Vectorcall(fn, args, nargsf, kwnames);
  Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  SourceMemo memo;
  FetchedValues fetched;
  BoundArgs bound;
  bound.memo = &memo;
  bound.fetched = &fetched;
  std::vector<PyObject*> owned;
  if (st->simple && !kwnames && nargs == st->argcount) {
    bound.locals.assign(args, args + nargs);
  } else if (!bind_arguments(fn, args, nargs, kwnames, bound, owned)) {
    PyErr_Clear();  // the real call raises the same TypeError, from the right frame
    return eager(st, fn, args, nargsf, kwnames);
  }
  bool failed;
  Entry* e;
  {
    HookPause pause;  // a compiled function called from code the hook watches: kiln's own work
    e = select_entry(*st, fn, bound, failed);
  }
  PyObject* result = nullptr;
  if (!failed) {
    if (!e || e->eager) {
      record_eager_call(*st, e, e != nullptr);  // the cache limit warned already
      result = eager(st, fn, args, nargsf, kwnames);
    } else {
      bool rerun = false;
      {
        HookPause pause;
        result = run_entry(*e, fn, bound, &rerun);
      }
      if (rerun) result = eager(st, fn, args, nargsf, kwnames);
    }
  }
  for (PyObject* o : owned) Py_DECREF(o);
  return result;
}

PyObject* cf_vectorcall(PyObject* self, PyObject* const* args, size_t nargsf, PyObject* kwnames) {
  State* st = reinterpret_cast<CompiledFunctionObject*>(self)->state;
  return call_as(st, st->fn, args, nargsf, kwnames);
}

// A resume function (compiled) called for a frame whose closure cells are not the ones it was
// made around: a helper defined anew at every call of its caller. Its code runs around this
// call's cells, as the guards read them, with the entries compiled for that code.
PyObject* call_with_closure(PyObject* compiled, PyObject* closure, PyObject* const* args, size_t nargs) {
  State* st = reinterpret_cast<CompiledFunctionObject*>(compiled)->state;
  if (!PyFunction_Check(st->fn) || PyFunction_GET_CLOSURE(st->fn) == closure) return PyObject_Vectorcall(compiled, args, nargs, nullptr);
  auto* f = reinterpret_cast<PyFunctionObject*>(st->fn);
  PyObject* fn = PyFunction_NewWithQualName(f->func_code, f->func_globals, f->func_qualname);
  if (!fn) return nullptr;
  if (PyFunction_SetClosure(fn, closure) < 0) {
    Py_DECREF(fn);
    return nullptr;
  }
  PyObject* r = call_as(st, fn, args, nargs, nullptr);
  Py_DECREF(fn);
  return r;
}

PyObject* cf_call(PyObject* self, PyObject* args, PyObject* kwargs) { return PyVectorcall_Call(self, args, kwargs); }

void cf_dealloc(PyObject* self) {
  auto* o = reinterpret_cast<CompiledFunctionObject*>(self);
  live().erase(o);
  if (o->state) {
    Py_XDECREF(o->state->fn);
    delete o->state;
  }
  Py_XDECREF(o->dict);
  Py_TYPE(self)->tp_free(self);
}

// A compiled function stored on a class binds like a plain function.
PyObject* cf_descr_get(PyObject* self, PyObject* obj, PyObject*) {
  if (!obj || obj == Py_None) {
    Py_INCREF(self);
    return self;
  }
  return PyMethod_New(self, obj);
}

PyObject* cf_get_fn(PyObject* self, void*) {
  PyObject* fn = reinterpret_cast<CompiledFunctionObject*>(self)->state->fn;
  Py_INCREF(fn);
  return fn;
}

// __name__, __qualname__, __module__ and __doc__ are the wrapped function's, as functools.wraps
// gives torch.compile's result (logging, pytest ids and other decorators read them).
PyObject* cf_get_wrapped_attr(PyObject* self, void* name) {
  PyObject* fn = reinterpret_cast<CompiledFunctionObject*>(self)->state->fn;
  PyObject* v = PyObject_GetAttrString(fn, static_cast<const char*>(name));
  if (!v && PyErr_ExceptionMatches(PyExc_AttributeError)) {
    PyErr_Clear();
    if (std::string(static_cast<const char*>(name)) == "__doc__") Py_RETURN_NONE;
    PyErr_Format(PyExc_AttributeError, "'kiln._C.CompiledFunction' object has no attribute '%s'", static_cast<const char*>(name));
  }
  return v;
}

PyGetSetDef cf_getset[] = {
    {"__name__", cf_get_wrapped_attr, nullptr, nullptr, const_cast<char*>("__name__")},
    {"__qualname__", cf_get_wrapped_attr, nullptr, nullptr, const_cast<char*>("__qualname__")},
    {"__module__", cf_get_wrapped_attr, nullptr, nullptr, const_cast<char*>("__module__")},
    {"__doc__", cf_get_wrapped_attr, nullptr, nullptr, const_cast<char*>("__doc__")},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, nullptr, nullptr},
    {"__wrapped__", cf_get_fn, nullptr, "the original function", nullptr},
    {"_torchdynamo_orig_callable", cf_get_fn, nullptr, nullptr, nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyTypeObject* make_type() {
  static PyTypeObject t = {PyVarObject_HEAD_INIT(nullptr, 0)};
  t.tp_name = "kiln._C.CompiledFunction";
  t.tp_basicsize = sizeof(CompiledFunctionObject);
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR;
  t.tp_vectorcall_offset = offsetof(CompiledFunctionObject, vectorcall);
  t.tp_call = cf_call;
  t.tp_dealloc = cf_dealloc;
  t.tp_descr_get = cf_descr_get;
  t.tp_getset = cf_getset;
  t.tp_dictoffset = offsetof(CompiledFunctionObject, dict);
  t.tp_doc = "A function compiled by kiln: guards, a per-call cache and compiled graphs.";
  if (PyType_Ready(&t) < 0) return nullptr;
  return &t;
}

}  // namespace

PyTypeObject* compiled_function_type() {
  static PyTypeObject* t = make_type();
  return t;
}

PyObject* make_compiled_function(PyObject* fn, const CompileConfig& cfg) {
  PyTypeObject* type = compiled_function_type();
  auto* o = PyObject_New(CompiledFunctionObject, type);
  if (!o) return nullptr;
  o->vectorcall = cf_vectorcall;
  o->dict = nullptr;
  if (PyFunction_Check(fn)) {
    o->state = new State(PyFunction_GET_CODE(fn), cfg);
  } else {
    o->state = new State();
    o->state->cfg = cfg;
    o->state->name = Py_TYPE(fn)->tp_name;
  }
  Py_INCREF(fn);
  o->state->fn = fn;
  live().insert(o);
  return reinterpret_cast<PyObject*>(o);
}

bool is_compiled_function(PyObject* obj) { return Py_TYPE(obj) == compiled_function_type(); }

PyObject* compiled_function_target(PyObject* obj) {
  return reinterpret_cast<CompiledFunctionObject*>(obj)->state->fn;
}

void set_private_params(PyObject* obj, std::vector<bool> mask) {
  reinterpret_cast<CompiledFunctionObject*>(obj)->state->private_params = std::move(mask);
}

const CompileConfig& compiled_function_config(PyObject* obj) {
  return reinterpret_cast<CompiledFunctionObject*>(obj)->state->cfg;
}

bool compiled_function_disabled(PyObject* obj) {
  return reinterpret_cast<CompiledFunctionObject*>(obj)->state->cfg.disable;
}

void reset_all() {
  for (CompiledFunctionObject* o : live()) {
    o->state->entries.clear();
    o->state->eager_forever = false;
    o->state->warned = false;
  }
  reset_frame_caches();
  stats() = Stats{};
}

}  // namespace kiln::bind
