// Value trackers of the symbolic interpreter: what it knows about each stack slot and local.
#pragma once
#include <Python.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bind/guards/source.h"
#include "bind/torch/tensor_bridge.h"
#include "core/ir/graph.h"

namespace kiln::bind {

struct Var;
using VarPtr = std::shared_ptr<Var>;

// The modes a `with` block or a decorated function runs its body in: grad mode and
// torch.autocast's state. A field left empty keeps the mode it finds.
struct ModeChange {
  std::optional<bool> grad;
  std::optional<AutocastState> autocast;
};
using ModeChangePtr = std::shared_ptr<const ModeChange>;

struct Var {
  enum class Kind {
    Const,   // a Python value known at capture time (guarded if it came from the frame)
    Tensor,  // a tensor in the graph
    Tuple,
    List,
    Null,    // the NULL that CALL's calling convention pushes
    Method,  // a bound method of a tensor: self + name
    Module,  // an nn.Module instance
    Iterator,  // a loop over values known at capture time: the items left
    Dict,      // a dict made in the frame: keys (constants) and value trackers
    Cell,      // a closure cell of the frame: items[0] is its content (nullptr while empty)
    Function,  // a function made in the frame (def, lambda, comprehension): obj is a real
               // function for its code, defaults and globals; items are its closure cells
    Record,    // an instance of a dataclass made in the frame (records.cpp): obj is the class,
               // keys/items its attributes, fields first; view the keys of its mapping
    Context,   // torch.no_grad(), torch.autocast(...), nullcontext(): `mode` is what it changes
    ContextExit,  // the __exit__ of an entered Context: `mode` is what it restores
  } kind;
  PyObject* obj = nullptr;      // Const / Module; Tuple: its structseq type (torch.return_types.max),
                                // when it is not a plain tuple (owned)
  ir::Node* node = nullptr;     // Tensor
  std::vector<VarPtr> items;    // Tuple / List
  VarPtr self;                  // Method; List: the dict a view (keys/values/items) shows
  std::string name;             // Method
  SourcePtr source;             // where it was read from, when it came from the frame
  std::vector<PyObject*> keys;  // Dict: one per item (owned)
  std::vector<size_t> view;     // Record of a mapping dataclass: its keys, as indices into keys
  bool rebuildable = false;     // Function: obj is complete (real cells with the values), so a
                                // graph break can hand it to Python
  ModeChangePtr mode;           // Context / ContextExit; Function: a decorator's modes for its body
  bool by_type = false;         // Const from the frame guarded by its type and the attributes
                                // read, not its identity (Interpreter::by_structure)

  ~Var() {
    if (!Py_IsInitialized()) return;
    Py_XDECREF(obj);
    for (PyObject* k : keys) Py_DECREF(k);
  }

  static VarPtr constant(PyObject* o, SourcePtr src = nullptr) {  // borrows o
    auto v = std::make_shared<Var>(Var{Kind::Const});
    Py_INCREF(o);
    v->obj = o;
    v->source = std::move(src);
    return v;
  }
  static VarPtr steal_constant(PyObject* o) {
    auto v = std::make_shared<Var>(Var{Kind::Const});
    v->obj = o;
    return v;
  }
  static VarPtr tensor(ir::Node* n, SourcePtr src = nullptr) {
    auto v = std::make_shared<Var>(Var{Kind::Tensor});
    v->node = n;
    v->source = std::move(src);
    return v;
  }
  static VarPtr tuple(std::vector<VarPtr> items, bool list = false) {
    auto v = std::make_shared<Var>(Var{list ? Kind::List : Kind::Tuple});
    v->items = std::move(items);
    return v;
  }
  static VarPtr null() { return std::make_shared<Var>(Var{Kind::Null}); }
  static VarPtr method(VarPtr self, std::string name) {
    auto v = std::make_shared<Var>(Var{Kind::Method});
    v->self = std::move(self);
    v->name = std::move(name);
    return v;
  }
  static VarPtr module(PyObject* m, SourcePtr src) {
    auto v = std::make_shared<Var>(Var{Kind::Module});
    Py_INCREF(m);
    v->obj = m;
    v->source = std::move(src);
    return v;
  }
  static VarPtr cell(VarPtr content) {
    auto v = std::make_shared<Var>(Var{Kind::Cell});
    v->items.push_back(std::move(content));
    return v;
  }
  static VarPtr dict() { return std::make_shared<Var>(Var{Kind::Dict}); }
  static VarPtr context(ModeChange m, Kind k = Kind::Context) {
    auto v = std::make_shared<Var>(Var{k});
    v->mode = std::make_shared<const ModeChange>(std::move(m));
    return v;
  }
  bool is_const() const { return kind == Kind::Const; }
  bool is_tensor() const { return kind == Kind::Tensor; }
};

}  // namespace kiln::bind
