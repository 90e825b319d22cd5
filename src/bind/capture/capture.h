// Capture: a symbolic interpreter over a function's CPython bytecode (3.11, 3.12) that
// records its tensor computation as a graph, plus the guards under which that graph holds.
//
// The interpreter walks instructions with a stack of value trackers (variables.h). Tensor
// operations become graph nodes through the op registry; Python values known at capture time
// are evaluated for real and guarded. What it cannot follow ends the capture with a reason and
// a source location; the caller then runs that code eagerly.
#pragma once
#include <Python.h>

#include <memory>
#include <string>
#include <vector>

#include "bind/guards/guards.h"
#include "core/ir/graph.h"

namespace kiln::bind {

// How the compiled function rebuilds its Python return value.
struct OutSpec {
  enum class Kind { Graph, Const, Tuple, List } kind = Kind::Const;
  int index = 0;                 // Graph: which graph output
  PyObject* value = nullptr;     // Const (owned)
  std::vector<OutSpec> items;    // Tuple / List
  OutSpec() = default;
  OutSpec(const OutSpec& o) : kind(o.kind), index(o.index), value(o.value), items(o.items) { Py_XINCREF(value); }
  OutSpec& operator=(const OutSpec& o) {
    if (this != &o) {
      Py_XINCREF(o.value);
      Py_XDECREF(value);
      kind = o.kind, index = o.index, value = o.value, items = o.items;
    }
    return *this;
  }
  ~OutSpec() {
    if (Py_IsInitialized()) Py_XDECREF(value);
  }
};

struct CaptureResult {
  bool ok = false;
  std::string reason;            // why capture stopped (when !ok)
  std::string location;          // "file.py:12" of the instruction it stopped at
  std::unique_ptr<ir::Graph> graph;
  std::vector<SourcePtr> input_sources;  // one per graph placeholder
  GuardSet guards;
  OutSpec output;
  std::string captured_text;     // the graph as captured, before any pass
};

// The arguments of one call, bound to the code's parameters (positional, keyword, defaults).
struct BoundArgs {
  std::vector<PyObject*> locals;  // borrowed; one per parameter slot, then nullptr for the rest
  std::vector<std::string> names;
};

// Binds args/kwargs to `fn`'s parameters like CPython does. False with a Python error set
// when the call itself is invalid (the caller then lets CPython raise it).
bool bind_arguments(PyObject* fn, PyObject* const* args, size_t nargs, PyObject* kwnames, BoundArgs& out,
                    std::vector<PyObject*>& owned);

// Captures a call of `fn` (a Python function; for a module, its forward with `self` bound
// first) with these bound arguments.
CaptureResult capture(PyObject* fn, const BoundArgs& args);

}  // namespace kiln::bind
