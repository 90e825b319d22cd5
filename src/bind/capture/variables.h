// Value trackers of the symbolic interpreter: what it knows about each stack slot and local.
#pragma once
#include <Python.h>

#include <functional>

#include <memory>
#include <optional>
#include <stdexcept>
#include <type_traits>
#include <variant>
#include <string>
#include <vector>

#include "bind/guards/source.h"
#include "bind/torch/tensor_bridge.h"
#include "core/ir/graph.h"

#include "core/sym/expr.h"

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

// A reason to stop capturing, carried to the top of the interpreter loop.
namespace detail {
struct Unsupported : std::runtime_error {
  using std::runtime_error::runtime_error;
};
}  // namespace detail

// What a tracker knows, one struct per kind. Python objects in them are owned by the tracker.
struct ConstV {  // a Python value known at capture time (guarded if it came from the frame)
  PyObject* value = nullptr;
  // A symbolic int (a dynamic size, or arithmetic on one): `value` is its value for this call
  // (the hint). Reading the value (Var::obj) specializes it: the entry then holds for that
  // value only. Code that knows sizes (shape arithmetic, view/reshape sizes, tensor operands)
  // reads `sym` instead and stays shape-generic.
  mutable sym::Expr sym;
  // A slice whose bounds are symbolic ints (x[:, :T]): start, stop, step as expressions
  // (invalid: None), `value` the slice of their hints. Reading the value specializes them.
  mutable std::vector<sym::Expr> slice;
  // A symbolic float (a Python float argument that changed between calls, or arithmetic on one):
  // the graph node computing it (a wrapped Float64 0-d value), `value` its value for this call.
  // Reading the value (Var::obj) specializes the floats it is made of, as for `sym`.
  mutable ir::Node* symf = nullptr;
  bool by_type = false;  // from the frame, guarded by its type and the attributes read, not its
                         // identity (Interpreter::by_structure)
  VarPtr super_self;     // a super() object: the receiver tracker its methods bind to
};
// What Python type a graph value stands for: a torch.Tensor, or (NumPy code, numpy.cpp) an
// np.ndarray or a NumPy scalar (np.float64: what NumPy's reductions and full indexing give).
enum class PyForm : uint8_t { Tensor, NdArray, NumpyScalar };
struct TensorV {  // a tensor in the graph; rebinding `node` updates every alias
  ir::Node* node = nullptr;
  PyForm form = PyForm::Tensor;
};
struct TupleV {
  std::vector<VarPtr> items;
  PyObject* structseq = nullptr;  // its structseq type (torch.return_types.max), if not a plain tuple
};
struct DictView {  // a list that shows a dict's keys(), values() or items(), refreshed on reads
  VarPtr dict;
  std::string which;
};
struct ListV {
  std::vector<VarPtr> items;
  std::optional<DictView> view;
  bool deque = false;      // a collections.deque made in the frame (its left end is items[0])
  Py_ssize_t maxlen = -1;  // a deque's maxlen (-1: unbounded)
  // modules[a:b] of an nn.Sequential or ModuleList: its children, read as a list; eager's value
  // is a new container of the module's class (rebuilt from the Var's source, base[slice]).
  std::shared_ptr<Var> sliced_module;
};
struct NullV {};  // the NULL that CALL's calling convention pushes
struct MethodV {  // a bound method: receiver + name
  VarPtr self;
  std::string name;
  PyObject* fn = nullptr;  // a base-class function reached through super(), bound to self
};
struct ModuleV {  // an nn.Module instance
  PyObject* module = nullptr;
};
// A loop over values known at capture time. The items sit behind a shared pointer with a read
// position: a snapshot (taken before each instruction that may break the graph) then shares
// them where none can change, instead of copying them; a loop over range(n) made every
// snapshot O(n), and capture quadratic in the loop's length.
struct IteratorV {
  IteratorV() : all(std::make_shared<const std::vector<VarPtr>>()) {}
  explicit IteratorV(std::vector<VarPtr> v);
  bool empty() const { return next >= all->size(); }
  const VarPtr& front() const { return (*all)[next]; }
  void pop_front() { ++next; }
  std::vector<VarPtr> left() const { return {all->begin() + static_cast<std::ptrdiff_t>(next), all->end()}; }

  std::shared_ptr<const std::vector<VarPtr>> all;
  size_t next = 0;        // the first item left
  bool immutable = true;  // every item a constant, a module or a function: shared by copies
  VarPtr returned;        // a generator's return value (what `yield from` it gives); nullptr: None
  // The exception a generator raised after its last item (kept by the capture): raised where the
  // iteration reaches the end, after the loop body ran for each item before it
  PyObject* raises = nullptr;
  // iter() of a list: Python's list iterator reads the list at each step (a loop body that
  // appends or deletes changes what comes next), so `all` is the list again before each step
  // (Interpreter::sync_list_iterator)
  std::shared_ptr<Var> list;
  // enumerate() / zip() over lists: the items made again from the lists where one changed since
  // (false: none did), before each step, as Python's lazy enumerate/zip read them
  std::function<bool(std::vector<VarPtr>&)> remake;
};
struct Entries {  // keys (constants, owned) and one value tracker each
  std::vector<PyObject*> keys;
  std::vector<VarPtr> values;
};
struct DictV : Entries {  // a dict made in the frame
  PyObject* cls = nullptr;      // collections.OrderedDict or defaultdict; nullptr: a dict (owned)
  PyObject* factory = nullptr;  // a defaultdict's default_factory (owned; None: it has none)
  std::shared_ptr<Var> made_factory;  // instead, a function made in the frame (a lambda)
};
struct CellV {              // a closure cell of the frame
  VarPtr content;           // nullptr while empty
  // A free variable of the compiled function, passed on to a function made in the frame: the
  // caller's own cell, which a store through this tracker or a rebuilt closure would miss.
  bool callers = false;
};
struct FunctionV {          // a function made in the frame (def, lambda, comprehension)
  PyObject* fn = nullptr;   // a real function for its code, defaults and globals
  std::vector<VarPtr> cells;  // its closure cells (Cell trackers)
  bool rebuildable = false;   // fn is complete (real cells with the values): a graph break can
                              // hand it to Python
  ModeChangePtr mode;         // a decorator's modes for its body (torch.no_grad()(f))
  bool makes_context = false;  // @contextlib.contextmanager of it: a call makes a context manager
  // Decorated with a @contextmanager object (ContextDecorator): each call runs in a fresh one
  // made as that one was (a Context tracker with a generator)
  VarPtr decorator;
};
struct RecordV : Entries {  // an object made in the frame: a dataclass instance (records.cpp) or,
  PyObject* cls = nullptr;  // with `plain`, any plain class's (user_objects.cpp); its class;
                            // keys/values its attributes (a dataclass's fields first)
  std::vector<size_t> view;  // a mapping dataclass: the keys of its mapping, as indices into keys
  bool plain = false;  // built by object.__new__ and its attributes, not by its constructor
  // A frozen dataclass of Python values used as one (a dict key, in an f-string): the object
  // made for real from its fields, once (borrowed: the interpreter keeps it)
  PyObject* made = nullptr;
};
namespace detail { struct GeneratorContext; }  // interpreter.h: a @contextmanager function's generator frame
struct ContextV {  // torch.no_grad(), torch.autocast(...), nullcontext(): what it changes
  ModeChangePtr mode;
  // torch.set_grad_enabled(b): set when called, so the modes its block's exit restores are those
  // before the call (nullptr: those before the block)
  ModeChangePtr restore;
  // A call of a @contextlib.contextmanager function: its generator, not started (no modes)
  std::shared_ptr<detail::GeneratorContext> generator;
};
struct ContextExitV {  // the __exit__ of an entered Context: what it restores
  ModeChangePtr mode;
  ModeChangePtr entered;  // what entering set (the block's modes), for a graph break inside it
  // A context manager written in Python: its class's bound __exit__, called at the block's end,
  // or the @contextmanager generator left at its yield, run on from there (no modes either way)
  VarPtr python_exit;
  std::shared_ptr<detail::GeneratorContext> generator;
};

// A value tracker. Trackers are shared (VarPtr) and updated in place, so every alias sees a
// change. Reading the data of another kind than the tracker's throws Unsupported.
struct Var {
  enum class Kind { Const, Tensor, Tuple, List, Null, Method, Module, Iterator, Dict, Cell, Function, Record, Context, ContextExit };
  using Data = std::variant<ConstV, TensorV, TupleV, ListV, NullV, MethodV, ModuleV, IteratorV, DictV, CellV, FunctionV,
                            RecordV, ContextV, ContextExitV>;
  Data data;
  SourcePtr source;  // where it was read from, when it came from the frame

  explicit Var(Data d, SourcePtr src = nullptr) : data(std::move(d)), source(std::move(src)) {}
  Var(const Var&) = delete;
  Var& operator=(const Var&) = delete;
  ~Var() {
    if (!Py_IsInitialized()) return;
    std::visit(
        [](auto& d) {
          using T = std::decay_t<decltype(d)>;
          if constexpr (std::is_same_v<T, ConstV>) Py_XDECREF(d.value);
          if constexpr (std::is_same_v<T, TupleV>) Py_XDECREF(d.structseq);
          if constexpr (std::is_same_v<T, MethodV>) Py_XDECREF(d.fn);
          if constexpr (std::is_same_v<T, ModuleV>) Py_XDECREF(d.module);
          if constexpr (std::is_same_v<T, FunctionV>) Py_XDECREF(d.fn);
          if constexpr (std::is_same_v<T, RecordV>) Py_XDECREF(d.cls);
          if constexpr (std::is_same_v<T, DictV>) Py_XDECREF(d.cls), Py_XDECREF(d.factory);
          if constexpr (std::is_base_of_v<Entries, T>)
            for (PyObject* k : d.keys) Py_DECREF(k);
        },
        data);
  }

  Kind kind() const { return static_cast<Kind>(data.index()); }
  static const char* kind_name(Kind k) {
    static const char* names[] = {"constant", "tensor", "tuple", "list", "NULL", "method", "module",
                                  "iterator", "dict", "cell", "function", "record", "context manager",
                                  "context exit"};
    return names[static_cast<size_t>(k)];
  }
  [[noreturn]] void wrong_kind(const char* wanted) const {
    throw detail::Unsupported(std::string("internal: a ") + kind_name(kind()) + " tracker used as " + wanted);
  }

  template <class T> bool is() const { return std::holds_alternative<T>(data); }
  template <class T> T* get_if() { return std::get_if<T>(&data); }
  template <class T> const T* get_if() const { return std::get_if<T>(&data); }
  template <class T> T& as() {
    if (T* p = std::get_if<T>(&data)) return *p;
    wrong_kind(kind_name(static_cast<Kind>(Data(std::in_place_type<T>).index())));
  }
  template <class T> const T& as() const { return const_cast<Var*>(this)->as<T>(); }

  bool is_const() const { return is<ConstV>(); }
  // A torch.Tensor. NumPy values are graph nodes too (node() works on them), but never pass
  // for tensors: torch code handed one is not captured (eager raises there).
  bool is_tensor() const {
    auto* t = get_if<TensorV>();
    return t && t->form == PyForm::Tensor;
  }
  bool in_graph() const { return is<TensorV>(); }  // a graph node: a tensor or a NumPy value
  bool is_array() const {  // an np.ndarray or NumPy scalar in the graph
    auto* t = get_if<TensorV>();
    return t && t->form != PyForm::Tensor;
  }
  // The Python object a constant or a module tracker stands for.
  PyObject* obj() const {
    if (auto* c = get_if<ConstV>()) {
      if (c->sym.valid()) {
        if (auto* f = specialize_hook()) (*f)(c->sym);
        c->sym = sym::Expr();
      }
      for (const sym::Expr& e : c->slice)
        if (e.valid())
          if (auto* f = specialize_hook()) (*f)(e);
      c->slice.clear();
      if (c->symf) {
        if (auto* f = specialize_float_hook()) (*f)(c->symf);
        c->symf = nullptr;
      }
      return c->value;
    }
    if (auto* m = get_if<ModuleV>()) return m->module;
    wrong_kind("a Python object");
  }
  // The symbolic int a constant stands for (invalid: a plain Python value).
  sym::Expr symint() const {
    auto* c = get_if<ConstV>();
    return c ? c->sym : sym::Expr();
  }
  // What reading a symbolic int's value does: capture's specialization of its symbols.
  static std::function<void(const sym::Expr&)>*& specialize_hook() {
    thread_local std::function<void(const sym::Expr&)>* hook = nullptr;
    return hook;
  }
  // The graph node a symbolic float stands for (nullptr: not one).
  ir::Node* symfloat() const {
    auto* c = get_if<ConstV>();
    return c ? c->symf : nullptr;
  }
  // What reading a symbolic float's value does: capture guards the floats it is made of.
  static std::function<void(const ir::Node*)>*& specialize_float_hook() {
    thread_local std::function<void(const ir::Node*)>* hook = nullptr;
    return hook;
  }
  static VarPtr symfloat(ir::Node* n, double hint) {
    auto v = std::make_shared<Var>(ConstV{PyFloat_FromDouble(hint)});
    v->as<ConstV>().symf = n;
    return v;
  }
  // A slice with symbolic bounds (empty: not one).
  const std::vector<sym::Expr>* symslice() const {
    auto* c = get_if<ConstV>();
    return c && !c->slice.empty() ? &c->slice : nullptr;
  }
  static VarPtr symint(const sym::Expr& e, int64_t hint) {
    auto v = std::make_shared<Var>(ConstV{PyLong_FromLongLong(hint)});
    if (!e.as_const()) v->as<ConstV>().sym = e;
    return v;
  }
  // The same, or nullptr for a tracker of another kind (for comparisons with known objects;
  // a symbolic int or float is not specialized by this: identity says nothing about its value;
  // code that reads a number's value through it checks symint() and symfloat() first).
  PyObject* known() const {
    if (auto* c = get_if<ConstV>()) return c->value;
    if (auto* m = get_if<ModuleV>()) return m->module;
    return nullptr;
  }
  ir::Node*& node() { return as<TensorV>().node; }
  ir::Node* node() const { return as<TensorV>().node; }
  // The items of a tuple or a list.
  std::vector<VarPtr>& seq() {
    if (auto* t = get_if<TupleV>()) return t->items;
    if (auto* l = get_if<ListV>()) return l->items;
    wrong_kind("a tuple or list");
  }
  const std::vector<VarPtr>& seq() const { return const_cast<Var*>(this)->seq(); }
  // The entries of a dict or a record.
  Entries& entries() {
    if (auto* d = get_if<DictV>()) return *d;
    if (auto* r = get_if<RecordV>()) return *r;
    wrong_kind("a dict");
  }
  // A list showing a dict (keys(), values(), items()), or nullptr.
  const DictView* dict_view() const {
    auto* l = get_if<ListV>();
    return l && l->view ? &*l->view : nullptr;
  }

  static VarPtr constant(PyObject* o, SourcePtr src = nullptr) {  // borrows o
    Py_INCREF(o);
    return std::make_shared<Var>(ConstV{o}, std::move(src));
  }
  static VarPtr steal_constant(PyObject* o) { return std::make_shared<Var>(ConstV{o}); }
  static VarPtr tensor(ir::Node* n, SourcePtr src = nullptr, PyForm form = PyForm::Tensor) {
    VarPtr v = std::make_shared<Var>(TensorV{n, form}, std::move(src));
    if (auto* f = tensor_hook()) (*f)(v);
    return v;
  }
  // Called with every tensor tracker made while capture runs (the interpreter keeps the views
  // among them, to take them again from a tensor an in-place op replaced).
  static std::function<void(const VarPtr&)>*& tensor_hook() {
    thread_local std::function<void(const VarPtr&)>* hook = nullptr;
    return hook;
  }
  static VarPtr tuple(std::vector<VarPtr> items, bool list = false) {
    if (list) return std::make_shared<Var>(ListV{std::move(items)});
    return std::make_shared<Var>(TupleV{std::move(items)});
  }
  static VarPtr list(std::vector<VarPtr> items) { return tuple(std::move(items), true); }
  static VarPtr iterator(std::vector<VarPtr> items) { return std::make_shared<Var>(IteratorV{std::move(items)}); }
  static VarPtr null() { return std::make_shared<Var>(NullV{}); }
  static VarPtr method(VarPtr self, std::string name, PyObject* fn = nullptr) {  // borrows fn
    return std::make_shared<Var>(MethodV{std::move(self), std::move(name), Py_XNewRef(fn)});
  }
  static VarPtr module(PyObject* m, SourcePtr src) {
    return std::make_shared<Var>(ModuleV{Py_NewRef(m)}, std::move(src));
  }
  static VarPtr cell(VarPtr content) { return std::make_shared<Var>(CellV{std::move(content)}); }
  static VarPtr dict() { return std::make_shared<Var>(DictV{}); }
  static VarPtr context(ModeChange m, Kind k = Kind::Context) {
    auto mode = std::make_shared<const ModeChange>(std::move(m));
    if (k == Kind::ContextExit) return std::make_shared<Var>(ContextExitV{std::move(mode)});
    return std::make_shared<Var>(ContextV{std::move(mode)});
  }
};

inline IteratorV::IteratorV(std::vector<VarPtr> v) {
  for (const VarPtr& x : v) {
    const Var::Kind k = x->kind();
    immutable = immutable && (k == Var::Kind::Const || k == Var::Kind::Module || k == Var::Kind::Function ||
                              k == Var::Kind::Null);
  }
  all = std::make_shared<const std::vector<VarPtr>>(std::move(v));
}

// A list as Python's list iterator walks it, by index (not a dict view, a deque or an
// nn.Sequential's slice, which iterate otherwise).
inline bool is_plain_list(const VarPtr& v) {
  const auto* l = v->get_if<ListV>();
  return l && !l->view && !l->deque && !l->sliced_module;
}

}  // namespace kiln::bind
