// kiln._C: the Python module. A thin surface over the binding layer; the package `kiln`
// (Python) only shapes arguments and results.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdlib>

#include "bind/capture/capture.h"
#include "bind/runtime/compiled_function.h"
#include "bind/runtime/stats.h"
#include "core/compile/disk_cache.h"

namespace nb = nanobind;
using namespace kiln::bind;

namespace {

nb::object compile_fn(nb::handle fn, const std::string& mode, bool fullgraph, bool disable, int cache_limit) {
  CompileConfig cfg;
  cfg.mode = mode;
  cfg.fullgraph = fullgraph;
  cfg.disable = disable;
  cfg.cache_limit = cache_limit;
  PyObject* o = make_compiled_function(fn.ptr(), cfg);
  if (!o) throw nb::python_error();
  return nb::steal(o);
}

// Captures and compiles one call of `fn` afresh (nothing cached) and describes the result.
nb::dict explain(nb::handle fn, nb::tuple args, nb::dict kwargs) {
  if (!PyFunction_Check(fn.ptr())) throw nb::type_error("kiln.explain: expected a Python function");
  std::vector<PyObject*> flat;
  for (nb::handle a : args) flat.push_back(a.ptr());
  nb::list names;
  for (auto [k, v] : kwargs) {
    names.append(k);
    flat.push_back(v.ptr());
  }
  nb::tuple kwnames = nb::tuple(names);
  BoundArgs bound;
  std::vector<PyObject*> owned;
  if (!bind_arguments(fn.ptr(), flat.data(), args.size(), kwargs.size() ? kwnames.ptr() : nullptr, bound, owned))
    throw nb::python_error();
  CompileConfig cfg;
  auto* code = reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(fn.ptr()));
  std::unique_ptr<Entry> e = build_entry(fn.ptr(), bound, cfg, PyUnicode_AsUTF8(code->co_qualname));
  for (PyObject* o : owned) Py_DECREF(o);

  nb::dict d;
  nb::list graphs, kernels, reasons, guards;
  for (const std::string& g : e->capture.guards.strs()) guards.append(g);
  if (e->eager) {
    nb::dict r;
    r["reason"] = e->reason;
    r["location"] = e->location;
    reasons.append(r);
  }
  size_t op_count = 0;
  if (e->compiled) {
    graphs.append(e->compiled->graph_text);
    op_count = e->compiled->op_count;
    for (const auto& k : e->compiled->kernels) {
      nb::dict kd;
      kd["name"] = k.name;
      kd["source"] = k.source;
      kernels.append(kd);
    }
    d["loop_ir"] = e->compiled->loop_text;
    d["source"] = e->compiled->source;
    d["source_path"] = e->compiled->source_path;
    d["compile_seconds"] = e->compiled->compile_seconds;
    d["disk_cache_hit"] = e->compiled->disk_cache_hit;
    d["device"] = e->compiled->program.device.str();
  }
  d["captured"] = e->capture.captured_text;
  d["graphs"] = graphs;
  d["graph_count"] = e->compiled ? 1 : 0;
  // A frame kiln cannot capture runs eagerly as a whole: one break, no graph.
  d["graph_break_count"] = e->eager ? 1 : 0;
  d["op_count"] = op_count;
  d["break_reasons"] = reasons;
  d["guards"] = guards;
  d["kernels"] = kernels;
  return d;
}

nb::dict stats_dict() {
  const Stats& s = stats();
  nb::dict d, reasons;
  d["frames_captured"] = s.frames_captured;
  d["graphs_compiled"] = s.graphs_compiled;
  d["recompiles"] = s.recompiles;
  d["cache_hits_memory"] = s.cache_hits_memory;
  d["cache_hits_disk"] = s.cache_hits_disk;
  d["eager_fallbacks"] = s.eager_fallbacks;
  d["kernels_generated"] = s.kernels_generated;
  d["capture_seconds"] = s.capture_seconds;
  d["compile_seconds"] = s.compile_seconds;
  for (auto& [k, v] : s.fallback_reasons) reasons[k.c_str()] = v;
  d["fallback_reasons"] = reasons;
  return d;
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "kiln's C++ engine: capture, guards, compilation and execution.";
  PyTypeObject* t = compiled_function_type();
  if (!t) throw nb::python_error();
  m.attr("CompiledFunction") = nb::borrow(reinterpret_cast<PyObject*>(t));
  m.def("compile", &compile_fn, nb::arg("fn"), nb::arg("mode") = "default", nb::arg("fullgraph") = false,
        nb::arg("disable") = false, nb::arg("cache_limit") = 8);
  m.def("explain", &explain);
  m.def("reset", &reset_all);
  m.def("stats", &stats_dict);
  m.def("is_compiled", [](nb::handle o) { return is_compiled_function(o.ptr()); });
  m.def("target", [](nb::handle o) { return nb::borrow(compiled_function_target(o.ptr())); });
  m.def("cache_dir", [] { return kiln::compile::cache_dir(); });
}
