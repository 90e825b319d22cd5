// kiln._C: the Python module. A thin surface over the binding layer; the package `kiln`
// (Python) only shapes arguments and results.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdlib>
#include <set>

#include "bind/capture/polyfills.h"
#include "bind/capture/capture.h"
#include "bind/runtime/compiled_function.h"
#include "bind/runtime/eager_backend.h"
#include "bind/runtime/executor.h"
#include "bind/runtime/stats.h"
#include "bind/torch/vector_math.h"
#include "core/compile/cpu_compiler.h"
#include "core/compile/disk_cache.h"
#include "core/ops/registry.h"

namespace nb = nanobind;
using namespace kiln::bind;

namespace {

Backend backend_named(const std::string& name) {
  if (name == "inductor") return Backend::Inductor;
  if (name == "eager") return Backend::Eager;
  throw nb::value_error(("kiln._C: unknown backend " + name).c_str());
}

nb::object compile_fn(nb::handle fn, const std::string& mode, bool fullgraph, bool disable, int cache_limit,
                      const std::string& backend, nb::handle dynamic) {
  CompileConfig cfg;
  cfg.dynamic = dynamic.is_none() ? Dynamic::Automatic : PyObject_IsTrue(dynamic.ptr()) ? Dynamic::Always : Dynamic::Never;
  cfg.backend = backend_named(backend);
  cfg.mode = mode;
  cfg.fullgraph = fullgraph;
  cfg.disable = disable;
  cfg.cache_limit = cache_limit;
  PyObject* o = make_compiled_function(fn.ptr(), cfg);
  if (!o) throw nb::python_error();
  return nb::steal(o);
}

// Runs one call of `fn` under kiln with every cache cleared first (like torch._dynamo.explain)
// and describes every frame captured on the way: graphs, breaks, guards, kernels. `like`: a
// compiled function whose configuration (backend, mode) to use, or None for the defaults.
nb::dict explain(nb::handle fn, nb::tuple args, nb::dict kwargs, nb::handle like) {
  if (!PyFunction_Check(fn.ptr())) throw nb::type_error("kiln.explain: expected a Python function");
  CompileConfig cfg;
  if (like.is_valid() && !like.is_none()) {
    if (!is_compiled_function(like.ptr())) throw nb::type_error("kiln.explain: `like` must be a compiled function");
    cfg = compiled_function_config(like.ptr());
    cfg.disable = false;
  }
  reset_all();
  std::vector<ExplainRecord> records;
  explain_log() = &records;
  PyObject* cf = make_compiled_function(fn.ptr(), cfg);
  PyObject* result = cf ? PyObject_Call(cf, args.ptr(), kwargs.ptr()) : nullptr;
  explain_log() = nullptr;
  Py_XDECREF(cf);
  if (!result) throw nb::python_error();
  Py_DECREF(result);

  nb::dict d;
  nb::list graphs, kernels, reasons, guards, cudagraphs, backward_graphs, backward_kernels, prologues;
  size_t op_count = 0, graph_count = 0, breaks = 0;
  std::string loop_ir, source, captured, source_path, device;
  double compile_seconds = 0;
  // A break inside a helper that the caller cannot resume around (a helper called in a loop)
  // shows twice: the caller's frame runs eagerly for it, and the helper's own frame breaks
  // there. It is one break, as Dynamo counts it.
  std::set<std::pair<std::string, std::string>> break_sites;
  for (const ExplainRecord& r : records)
    if (r.graph_break && !r.eager) break_sites.emplace(r.reason, r.location);
  for (const ExplainRecord& r : records) {
    for (const std::string& g : r.guards) guards.append(g);
    if (r.eager && !r.graph_break && break_sites.count({r.reason, r.location})) {
      // counted at the helper's break
    } else if (r.eager || r.graph_break) {
      ++breaks;
      nb::dict br;
      br["reason"] = r.reason;
      br["location"] = r.location;
      reasons.append(br);
    }
    captured += r.captured;
    if (!r.has_graph) continue;
    ++graph_count;
    graphs.append(r.graph);
    op_count += r.op_count;
    for (const ExplainRecord::Kernel& k : r.kernels) {
      nb::dict kd;
      kd["name"] = k.name;
      kd["source"] = k.source;
      kd["launch"] = k.launch;
      kernels.append(kd);
    }
    if (!r.cudagraphs.empty()) cudagraphs.append(r.cudagraphs);
    if (!r.backward_graph.empty()) {
      nb::dict bd;
      bd["graph"] = r.backward_graph;
      bd["saved"] = r.saved;
      bd["source"] = r.backward_source;
      bd["stages"] = r.backward_stages;
      backward_graphs.append(bd);
      for (const std::string& k : r.backward_kernels) backward_kernels.append(k);
    }
    if (!r.prologue_graph.empty()) {
      nb::dict pd;
      pd["graph"] = r.prologue_graph;
      nb::list pk;
      for (const std::string& k : r.prologue_kernels) pk.append(k);
      pd["kernels"] = pk;
      prologues.append(pd);
    }
    loop_ir += r.loop_ir;
    source += r.source;
    if (source_path.empty()) source_path = r.source_path;
    if (device.empty()) device = r.device;
    compile_seconds += r.compile_seconds;
  }
  d["loop_ir"] = loop_ir;
  d["source"] = source;
  d["source_path"] = source_path;
  d["compile_seconds"] = compile_seconds;
  d["device"] = device;
  d["captured"] = captured;
  d["graphs"] = graphs;
  d["graph_count"] = graph_count;
  d["graph_break_count"] = breaks;
  d["op_count"] = op_count;
  d["break_reasons"] = reasons;
  d["guards"] = guards;
  d["kernels"] = kernels;
  d["cudagraphs"] = cudagraphs;
  d["backward_graphs"] = backward_graphs;
  d["backward_kernels"] = backward_kernels;
  d["prologues"] = prologues;
  return d;
}

// The op registry, one dict per op (docs/ops.md is generated from this).
nb::list ops_list() {
  nb::list out;
  for (const kiln::ops::OpDef* d : kiln::ops::all_ops()) {
    nb::dict o;
    o["name"] = d->name;
    o["schema"] = d->schema.str();
    static const char* kinds[] = {"source", "pointwise", "reduction", "view", "extern", "composite", "gather"};  // OpKind order
    int k = static_cast<int>(d->kind);
    o["kind"] = k >= 0 && k < 7 ? kinds[k] : "other";
    o["lowering"] = d->decompose ? std::string("decomposed") : d->kind == kiln::ops::OpKind::Extern ? "extern " + d->aten
                    : d->kind == kiln::ops::OpKind::View ? std::string("view (index remap)") : std::string("loop IR");
    nb::list py;
    for (const std::string& p : d->python) py.append(p);
    o["python"] = py;
    o["eager"] = torch_spelling(*d);  // the callable the eager backend runs it with
    o["derivative"] = static_cast<bool>(d->derivative);
    out.append(o);
  }
  return out;
}

nb::dict stats_dict() {
  const Stats& s = stats();
  nb::dict d, reasons;
  d["frames_captured"] = s.frames_captured;
  d["graphs_compiled"] = s.graphs_compiled;
  d["backward_graphs_compiled"] = s.backward_graphs_compiled;
  d["recompiles"] = s.recompiles;
  d["cache_hits_memory"] = s.cache_hits_memory;
  d["cache_hits_disk"] = s.cache_hits_disk;
  d["eager_fallbacks"] = s.eager_fallbacks;
  d["graph_breaks"] = s.graph_breaks;
  d["kernels_generated"] = s.kernels_generated;
  d["cudagraph_recordings"] = s.cudagraph_recordings;
  d["cudagraph_replays"] = s.cudagraph_replays;
  d["prologue_runs"] = s.prologue_runs;
  d["kernels_autotuned"] = s.kernels_autotuned;
  d["autotune_cache_hits"] = s.autotune_cache_hits;
  d["capture_seconds"] = s.capture_seconds;
  d["compile_seconds"] = s.compile_seconds;
  for (auto& [k, v] : s.fallback_reasons) reasons[k.c_str()] = v;
  nb::list recompile_reasons;
  for (const std::string& r : s.recompile_reasons) recompile_reasons.append(r);
  d["recompile_reasons"] = recompile_reasons;
  d["fallback_reasons"] = reasons;
  return d;
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "kiln's C++ engine: capture, guards, compilation and execution.";
  provide_torch_vector_math();
  PyTypeObject* t = compiled_function_type();
  if (!t) throw nb::python_error();
  m.attr("CompiledFunction") = nb::borrow(reinterpret_cast<PyObject*>(t));
  m.def("compile", &compile_fn, nb::arg("fn"), nb::arg("mode") = "default", nb::arg("fullgraph") = false,
        nb::arg("disable") = false, nb::arg("cache_limit") = 8, nb::arg("backend") = "inductor",
        nb::arg("dynamic") = nb::none());
  m.def("explain", &explain, nb::arg("fn"), nb::arg("args"), nb::arg("kwargs"), nb::arg("like") = nb::none());
  m.def("reset", &reset_all);
  m.def("stats", &stats_dict);
  m.def("_profile_steps", [](bool on) {
    nb::list out;
    for (const StepTime& t : profile_steps(on)) out.append(nb::make_tuple(t.label, t.seconds, t.runs));
    return out;
  }, nb::arg("on"));
  m.def("ops", &ops_list);
  m.def("is_compiled", [](nb::handle o) { return is_compiled_function(o.ptr()); });
  m.def("target", [](nb::handle o) { return nb::borrow(compiled_function_target(o.ptr())); });
  m.def("cache_dir", [] { return kiln::compile::cache_dir(); });
  m.def("_vector_math", [] { return kiln::compile::vector_math_in_use(); });
  m.def("_register_polyfill", [](nb::handle original, nb::handle model, bool always) {
    kiln::bind::register_polyfill(original.ptr(), model.ptr(), always);
  }, nb::arg("original"), nb::arg("model"), nb::arg("always") = false);
}
