#include <algorithm>
#include <functional>
#include <stdexcept>
#include <unordered_map>
#include <unordered_set>

#include "bind/capture/bytecode.h"
#include "bind/capture/capture.h"
#include "bind/capture/resume.h"
#include "bind/capture/torch_call.h"
#include "bind/capture/torch_ops.h"
#include "bind/capture/variables.h"
#include "bind/runtime/compiled_function.h"
#include "bind/torch/tensor_bridge.h"
#include "core/ops/registry.h"

namespace kiln::bind {
namespace {

// A reason to stop capturing, carried to the top of the interpreter loop.
struct Unsupported : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] void unsupported(const std::string& why) { throw Unsupported(why); }

bool is_python_scalar(PyObject* o) { return PyBool_Check(o) || PyLong_CheckExact(o) || PyFloat_CheckExact(o); }

class Interpreter {
 public:
  // The root interpreter of a capture, or (with `parent`) one that inlines a call: it shares
  // the graph, the guards and the graph inputs of the root.
  Interpreter(PyObject* fn, CaptureResult& out, Interpreter* parent = nullptr, SourcePtr fn_source = nullptr)
      : fn_(fn), out_(out), code_(PyFunction_GET_CODE(fn)), globals_(PyFunction_GET_GLOBALS(fn)),
        parent_(parent), fn_source_(std::move(fn_source)) {
    builtins_ = PyEval_GetBuiltins();
    if (!parent) out_.graph = std::make_unique<ir::Graph>();
    g_ = out_.graph.get();
    depth_ = parent ? parent->depth_ + 1 : 0;
    auto* co = reinterpret_cast<PyCodeObject*>(code_);
    filename_ = PyUnicode_AsUTF8(co->co_filename);
    locals_.assign(co->co_nlocalsplus, nullptr);
  }

  // Captures a call of the root function with these arguments.
  void run(const BoundArgs& args) {
    grad_mode_ = grad_enabled();
    out_.guards.add_grad_mode(grad_mode_);
    for (size_t i = 0; i < args.locals.size(); ++i) {
      if (!args.locals[i]) continue;
      locals_[i] = wrap(args.locals[i], Source::local_(static_cast<int>(i), args.names[i]));
      // *args and **kwargs are made for this call: the frame's own, whatever the caller passed
      auto* co = reinterpret_cast<PyCodeObject*>(code_);
      const size_t star = static_cast<size_t>(co->co_argcount + co->co_kwonlyargcount);
      bool packed = (i == star && (co->co_flags & CO_VARARGS)) ||
                    (i == star + !!(co->co_flags & CO_VARARGS) && (co->co_flags & CO_VARKEYWORDS));
      bool priv = packed || (args.private_slots && i < args.private_slots->size() && (*args.private_slots)[i]);
      Var::Kind k = locals_[i]->kind;
      if (priv && (k == Var::Kind::List || k == Var::Kind::Dict || k == Var::Kind::Tuple))
        locals_[i]->source = nullptr;  // its items keep their sources: graph inputs are read through them
    }
    VarPtr r = run_frame();
    if (r) out_.output = output_spec(r);  // else the capture ended in a graph break
  }

  // Interprets the frame until it returns; the value it returns.
  VarPtr run_frame() {
    const CodeInfo& ci = decode(code_);
    size_t pc = 0;
    while (pc < ci.instrs.size()) {
      const Instr& in = ci.instrs[pc];
      current_line_ = in.line;
      g_->source_loc = filename_ + ":" + std::to_string(in.line);
      int next;
      if (!parent_ && breakable(in)) {
        // What the frame held before this instruction, in case it must run in Python instead.
        Snapshot before = snapshot();
        try {
          next = step(in, ci);
        } catch (const Unsupported& e) {
          if (!graph_break(in, ci, pc, before, e.what())) throw;
          return nullptr;
        }
      } else {
        next = step(in, ci);
      }
      if (next == kReturn) return return_value_;
      if (next >= 0) {
        auto it = ci.by_offset.find(next);
        if (it == ci.by_offset.end()) unsupported("jump to an unknown offset");
        pc = it->second;
      } else {
        ++pc;
      }
      if (++root()->steps_ > 100000) unsupported("capture exceeded 100000 instructions");
    }
    unsupported("fell off the end of the bytecode");
  }

  Interpreter* root() { return parent_ ? parent_->root() : this; }

  // Where capture is: the innermost instruction, inlined calls included.
  std::string location() const { return g_ && !g_->source_loc.empty() ? g_->source_loc : filename_; }

 private:
  static constexpr int kReturn = -2;
  using KwArgs = std::vector<std::pair<std::string, VarPtr>>;

  // ---- values read from the frame: wrap and guard ----
  VarPtr wrap(PyObject* v, SourcePtr src) {
    if (is_tensor(v)) {
      for (size_t i = 0; i < out_.input_sources.size(); ++i)
        if (out_.input_sources[i]->str() == src->str()) return Var::tensor(g_->inputs()[i], src);
      TensorInfo info;
      std::string why;
      if (!tensor_info(v, info, why)) unsupported("input " + src->str() + ": " + why);
      out_.guards.add_tensor(src, info);
      const bool requires_grad = info.requires_grad;
      ir::TensorMeta m;
      m.dtype = info.dtype;
      m.device = info.device;
      for (int64_t s : info.sizes) m.sizes.push_back(s);
      for (int64_t s : info.strides) m.strides.push_back(s);
      // A readable placeholder name from the source: L['self'].fc1.weight -> self_fc1_weight.
      std::string name;
      for (char c : src->str().substr(src->kind == Source::Kind::Global ? 1 : 0)) {
        if (isalnum(static_cast<unsigned char>(c))) name += c;
        else if (!name.empty() && name.back() != '_') name += '_';
      }
      while (!name.empty() && name.back() == '_') name.pop_back();
      if (name.size() > 1 && (name[0] == 'L' || name[0] == 'G' || name[0] == 'C') && name[1] == '_') name = name.substr(2);
      if (name.empty() || isdigit(static_cast<unsigned char>(name[0]))) name = "arg" + name;
      ir::Node* n = g_->placeholder(name, m);
      if (requires_grad) root()->needs_grad_.insert(n);
      out_.input_sources.push_back(src);
      return Var::tensor(n, src);
    }
    if (is_python_scalar(v) || v == Py_None || PyUnicode_CheckExact(v) || PyAnySet_CheckExact(v)) {
      out_.guards.add_equals(src, v);
      return Var::constant(v, src);
    }
    DType dt;
    if (dtype_from_object(v, dt)) {
      out_.guards.add_identity(src, v);
      return Var::constant(v, src);
    }
    if (PyTuple_CheckExact(v) || PyList_CheckExact(v)) {
      out_.guards.add_type(src, reinterpret_cast<PyObject*>(Py_TYPE(v)));
      Py_ssize_t n = PySequence_Size(v);
      out_.guards.add_length(src, n);
      std::vector<VarPtr> items;
      for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* item = PySequence_GetItem(v, i);
        items.push_back(wrap(item, Source::item(src, i)));
        Py_DECREF(item);
      }
      VarPtr seq = Var::tuple(std::move(items), PyList_CheckExact(v));
      seq->source = src;  // the caller's object: changing it runs in Python
      return seq;
    }
    if (PyDict_CheckExact(v)) {
      // A dict from the caller (keyword arguments, a batch of inputs): its keys and values are
      // guarded, not its identity, so a new dict with the same contents hits the cache.
      out_.guards.add_type(src, reinterpret_cast<PyObject*>(Py_TYPE(v)));
      out_.guards.add_length(src, PyDict_Size(v));
      VarPtr d = Var::dict();
      d->source = src;
      PyObject *k, *item;
      Py_ssize_t pos = 0;
      while (PyDict_Next(v, &pos, &k, &item)) {
        d->keys.push_back(Py_NewRef(k));
        d->items.push_back(wrap(item, Source::key_of(src, k)));
      }
      return d;
    }
    if (is_nn_module(v)) {
      out_.guards.add_identity(src, v);
      return Var::module(v, src);
    }
    if (PyMethod_Check(v)) {
      // Bound methods are made afresh at each attribute access: guard what they bind.
      out_.guards.add_identity(Source::attr(src, "__func__"), PyMethod_GET_FUNCTION(v));
      out_.guards.add_identity(Source::attr(src, "__self__"), PyMethod_GET_SELF(v));
      return Var::constant(v, src);
    }
    if (PyCFunction_Check(v) && PyCFunction_GET_SELF(v) && !PyModule_Check(PyCFunction_GET_SELF(v)))
      return Var::constant(v, src);  // "abc".startswith: made afresh at each access; its receiver is guarded
    // Modules, functions, classes and other objects: their identity.
    out_.guards.add_identity(src, v);
    return Var::constant(v, src);
  }

  static bool is_nn_module(PyObject* v) {
    static PyObject* module_type = [] {
      PyObject* m = PyImport_ImportModule("torch.nn");
      PyObject* t = m ? PyObject_GetAttrString(m, "Module") : nullptr;
      Py_XDECREF(m);
      return t;
    }();
    return module_type && PyObject_IsInstance(v, module_type) == 1;
  }

  // ---- the stack ----
  VarPtr pop() {
    if (stack_.empty()) unsupported("stack underflow");
    VarPtr v = stack_.back();
    stack_.pop_back();
    return v;
  }
  void push(VarPtr v) { stack_.push_back(std::move(v)); }
  VarPtr& peek(size_t i) { return stack_[stack_.size() - i]; }

  // ---- graph building ----
  ir::Node* add_node(const ops::OpDef* op, std::vector<ir::Node*> inputs, ir::Attrs attrs) {
    std::string err;
    Interpreter* r = root();
    bool grad = r->grad_mode_ && std::any_of(inputs.begin(), inputs.end(), [&](ir::Node* i) { return r->needs_grad_.count(i); });
    ir::Node* n = g_->add(op, std::move(inputs), std::move(attrs), err);
    if (!n) unsupported("shape/dtype check of " + op->name + " failed: " + err);
    if (grad) r->needs_grad_.insert(n);
    return n;
  }
  ir::Node* add_node(const std::string& op, std::vector<ir::Node*> inputs, ir::Attrs attrs = {}) {
    return add_node(ops::find_op(op), std::move(inputs), std::move(attrs));
  }

  ir::Node* as_node(const VarPtr& v, const char* what) {
    if (v->is_tensor()) return v->node;
    if (v->is_const() && !is_python_scalar(v->obj) && (PyLong_Check(v->obj) || PyFloat_Check(v->obj))) {
      // an IntEnum or a float subclass: the number it is
      PyObject* plain = PyLong_Check(v->obj) ? PyNumber_Index(v->obj) : PyFloat_FromDouble(PyFloat_AsDouble(v->obj));
      return as_node(real(plain), what);
    }
    if (v->is_const() && is_python_scalar(v->obj)) {
      if (PyBool_Check(v->obj)) return g_->scalar(v->obj == Py_True, DType::Bool);
      if (PyLong_Check(v->obj)) {
        int overflow = 0;
        long long x = PyLong_AsLongLongAndOverflow(v->obj, &overflow);
        if (overflow) unsupported("integer too large for a tensor operand");
        return g_->scalar(static_cast<double>(x), DType::Int64);
      }
      return g_->scalar(PyFloat_AsDouble(v->obj), DType::Float64);
    }
    unsupported(std::string("expected a tensor for ") + what);
  }

  // Python value of a constant, or capture stops.
  PyObject* const_obj(const VarPtr& v, const char* what) {
    if (v->is_const() || v->kind == Var::Kind::Module) return v->obj;  // modules are guarded by identity
    if (v->kind == Var::Kind::Tuple || v->kind == Var::Kind::List) {
      // Materialize containers of constants (e.g. a shape tuple).
      PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(v->items.size()));
      for (size_t i = 0; i < v->items.size(); ++i) {
        PyObject* o = const_obj(v->items[i], what);
        Py_INCREF(o);
        PyTuple_SET_ITEM(t, i, o);
      }
      keep_.push_back(t);
      if (v->kind == Var::Kind::List) {
        PyObject* l = PySequence_List(t);
        keep_.push_back(l);
        return l;
      }
      return t;
    }
    if (v->kind == Var::Kind::Dict) {
      PyObject* d = PyDict_New();
      keep_.push_back(d);
      for (size_t i = 0; i < v->keys.size(); ++i)
        if (PyDict_SetItem(d, v->keys[i], const_obj(v->items[i], what)) < 0) real(nullptr);
      return d;
    }
    unsupported(std::string("expected a Python value for ") + what + ", got a tensor");
  }

  // ---- dicts made in the frame: constant keys, tracked values ----
  static Py_ssize_t dict_find(const VarPtr& d, PyObject* key) {
    for (size_t i = 0; i < d->keys.size(); ++i) {
      int eq = PyObject_RichCompareBool(d->keys[i], key, Py_EQ);
      if (eq < 0) PyErr_Clear();
      if (eq == 1) return static_cast<Py_ssize_t>(i);
    }
    return -1;
  }

  static void dict_set(const VarPtr& d, PyObject* key, VarPtr v) {
    Py_ssize_t i = dict_find(d, key);
    if (i >= 0) {
      d->items[i] = std::move(v);
      return;
    }
    d->keys.push_back(Py_NewRef(key));
    d->items.push_back(std::move(v));
  }

  // The entries of a dict value: a tracker's, or a real dict's. Values of a dict read from
  // the frame are guarded like any read (and so is its length).
  std::vector<std::pair<PyObject*, VarPtr>> dict_entries(const VarPtr& d) {
    std::vector<std::pair<PyObject*, VarPtr>> out;
    if (d->kind == Var::Kind::Dict) {
      for (size_t i = 0; i < d->keys.size(); ++i) out.emplace_back(d->keys[i], d->items[i]);
      return out;
    }
    PyObject* o = const_obj(d, "dict");
    if (!PyDict_Check(o)) unsupported("expected a dict");
    if (d->source) out_.guards.add_length(d->source, PyDict_Size(o));
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(o, &pos, &k, &v)) {
      keep_.push_back(Py_NewRef(k));
      out.emplace_back(k, d->source ? wrap(v, Source::key_of(d->source, k)) : Var::constant(v));
    }
    return out;
  }

  bool is_dict(const VarPtr& v) { return v->kind == Var::Kind::Dict || (v->is_const() && PyDict_Check(v->obj)); }

  VarPtr call_dict_method(const VarPtr& d, const std::string& name, std::vector<VarPtr> args, const KwArgs& kwargs) {
    const bool tracker = d->kind == Var::Kind::Dict;
    if (name == "update" && tracker && !d->source && args.size() <= 1) {
      if (!args.empty())
        for (auto& [k, v] : dict_entries(args[0])) dict_set(d, k, v);
      for (auto& [k, v] : kwargs) {
        PyObject* key = PyUnicode_FromString(k.c_str());
        dict_set(d, key, v);
        Py_DECREF(key);
      }
      return Var::constant(Py_None);
    }
    if (!kwargs.empty()) unsupported("dict." + name + "() with keyword arguments");
    auto key_var = [&](PyObject* k) { return Var::constant(k); };
    if (name == "items" || name == "keys" || name == "values") {
      std::vector<VarPtr> out;
      for (auto& [k, v] : dict_entries(d)) {
        if (name == "items") out.push_back(Var::tuple({key_var(k), v}));
        else out.push_back(name == "keys" ? key_var(k) : v);
      }
      return Var::tuple(std::move(out), true);
    }
    if (name == "get" && (args.size() == 1 || args.size() == 2)) {
      // Reading every entry guards the dict's exact key set, so a missing key stays missing.
      PyObject* key = const_obj(args[0], "dict key");
      for (auto& [k, v] : dict_entries(d)) {
        int eq = PyObject_RichCompareBool(k, key, Py_EQ);
        if (eq < 0) real(nullptr);
        if (eq == 1) return v;
      }
      return args.size() == 2 ? args[1] : Var::constant(Py_None);
    }
    if (name == "copy" && args.empty()) {
      VarPtr c = Var::dict();
      for (auto& [k, v] : dict_entries(d)) dict_set(c, k, v);
      return c;
    }
    if (!tracker || d->source) unsupported("dict." + name + "() on a dict the caller can see");
    if (name == "clear" && args.empty()) {
      for (PyObject* k : d->keys) Py_DECREF(k);
      d->keys.clear();
      d->items.clear();
      return Var::constant(Py_None);
    }
    if (name == "pop" && (args.size() == 1 || args.size() == 2)) {
      Py_ssize_t i = dict_find(d, const_obj(args[0], "dict key"));
      if (i < 0) {
        if (args.size() == 2) return args[1];
        unsupported("KeyError in dict.pop");
      }
      VarPtr v = d->items[i];
      Py_DECREF(d->keys[i]);
      d->keys.erase(d->keys.begin() + i);
      d->items.erase(d->items.begin() + i);
      return v;
    }
    if (name == "setdefault" && (args.size() == 1 || args.size() == 2)) {
      PyObject* key = const_obj(args[0], "dict key");
      Py_ssize_t i = dict_find(d, key);
      if (i >= 0) return d->items[i];
      VarPtr v = args.size() == 2 ? args[1] : Var::constant(Py_None);
      dict_set(d, key, v);
      return v;
    }
    unsupported("dict." + name + "() is not captured yet");
  }

  // Runs a real Python operation on constants: it is what the eager code would compute.
  VarPtr real(PyObject* r) {
    if (!r) {
      std::string msg = "Python operation raised";
      PyObject *t, *v, *tb;
      PyErr_Fetch(&t, &v, &tb);
      if (v) {
        PyObject* s = PyObject_Str(v);
        if (s) msg += ": " + std::string(PyUnicode_AsUTF8(s));
        Py_XDECREF(s);
      }
      Py_XDECREF(t);
      Py_XDECREF(v);
      Py_XDECREF(tb);
      PyErr_Clear();
      unsupported(msg);
    }
    return Var::steal_constant(r);
  }

  // ---- binding Python arguments to an op's schema ----
  bool to_int_list(PyObject* o, std::vector<int64_t>& out) {
    if (PyLong_Check(o) && !PyBool_Check(o)) {
      out.push_back(PyLong_AsLongLong(o));
      return true;
    }
    if (!PySequence_Check(o) || PyUnicode_Check(o)) return false;
    Py_ssize_t n = PySequence_Size(o);
    for (Py_ssize_t i = 0; i < n; ++i) {
      PyObject* it = PySequence_GetItem(o, i);
      bool ok = PyLong_Check(it) && !PyBool_Check(it);
      if (ok) out.push_back(PyLong_AsLongLong(it));
      Py_DECREF(it);
      if (!ok) return false;
    }
    return true;
  }

  VarPtr call_op(const OpBinding& b, std::vector<VarPtr> args, const std::vector<std::pair<std::string, VarPtr>>& kwargs) {
    bool inplace = false;
    const ops::Schema& s = b.op->schema;
    std::vector<ir::Node*> inputs;
    ir::Attrs attrs = b.fixed;
    size_t pos = 0;
    std::vector<bool> used_kw(kwargs.size(), false);
    for (size_t pi = 0; pi < s.params.size(); ++pi) {
      const ops::Param& p = s.params[pi];
      if (attrs.has(p.name)) continue;
      VarPtr v;
      if (!p.kwarg_only && pos < args.size()) {
        // int[] takes the rest of the positionals when given as varargs: x.view(2, 3).
        if (p.type.rfind("int[]", 0) == 0 && args[pos]->is_const() && PyLong_Check(args[pos]->obj) &&
            pos + 1 < args.size() && pi + 1 == s.params.size()) {
          std::vector<VarPtr> rest(args.begin() + pos, args.end());
          v = Var::tuple(rest);
          pos = args.size();
        } else {
          v = args[pos++];
        }
      } else {
        for (size_t k = 0; k < kwargs.size(); ++k) {
          bool alias = (p.name == "self" && kwargs[k].first == "input");
          if (kwargs[k].first == p.name || alias) {
            v = kwargs[k].second;
            used_kw[k] = true;
          }
        }
      }
      if (!v) {
        if (!p.has_default) unsupported(b.op->name + "() missing argument '" + p.name + "'");
        if (p.is_tensor()) {
          if (p.type == "Tensor?") inputs.push_back(nullptr);
          else unsupported("tensor default for " + p.name);
        } else if (auto d = p.default_value()) {
          attrs.set(p.name, *d);  // explicit, as FX prints defaults: shape rules see every argument
        }
        continue;
      }
      if (p.is_tensor()) {
        if (p.type == "Tensor?" && v->is_const() && v->obj == Py_None) {
          inputs.push_back(nullptr);
          continue;
        }
        if (b.op->tensors_only && !v->is_tensor())
          unsupported("shape/dtype check of " + b.op->name + " failed: TypeError: " + b.op->name + "(): argument '" +
                      p.name + "' must be Tensor, not " + (v->is_const() ? Py_TYPE(v->obj)->tp_name : "a value"));
        inputs.push_back(as_node(v, p.name.c_str()));
        continue;
      }
      PyObject* o = const_obj(v, p.name.c_str());
      if (o == Py_None) {
        if (p.type.back() != '?' && !(p.has_default && p.dflt == "None")) unsupported(p.name + " must not be None");
        continue;
      }
      if (p.type == "bool") {
        if (!PyBool_Check(o)) unsupported(p.name + " must be a bool");
        if (p.name == "inplace" && o == Py_True) {
          inplace = true;  // F.relu(x, inplace=True): the op, then x takes the result
          attrs.set(p.name, false);
          continue;
        }
        attrs.set(p.name, o == Py_True);
      } else if (p.is_int_list()) {
        std::vector<int64_t> l;
        if (!to_int_list(o, l)) unsupported(p.name + " must be a list of ints");
        if (p.list_size() > 1 && l.size() == 1) l.assign(p.list_size(), l[0]);  // stride=2 -> [2, 2]
        attrs.set(p.name, l);
      } else if (p.type.rfind("int", 0) == 0) {
        if (!PyLong_Check(o) || PyBool_Check(o)) unsupported(p.name + " must be an int");
        attrs.set(p.name, static_cast<int64_t>(PyLong_AsLongLong(o)));
      } else if (p.type.rfind("float", 0) == 0 || p.type == "Scalar" || p.type == "Scalar?") {
        if (PyBool_Check(o)) attrs.set(p.name, o == Py_True);
        else if (PyLong_Check(o)) attrs.set(p.name, static_cast<int64_t>(PyLong_AsLongLong(o)));
        else if (PyFloat_Check(o)) attrs.set(p.name, PyFloat_AsDouble(o));
        else unsupported(p.name + " must be a number");
      } else if (p.type.rfind("ScalarType", 0) == 0) {
        DType t;
        if (!dtype_from_object(o, t)) unsupported(p.name + " must be a supported torch.dtype");
        attrs.set(p.name, t);
      } else if (p.type.rfind("str", 0) == 0) {
        if (!PyUnicode_Check(o)) unsupported(p.name + " must be a str");
        attrs.set(p.name, std::string(PyUnicode_AsUTF8(o)));
      } else {
        unsupported("argument type " + p.type);
      }
    }
    if (pos < args.size()) unsupported(b.op->name + "() got too many positional arguments");
    for (size_t k = 0; k < kwargs.size(); ++k)
      if (!used_kw[k]) unsupported(b.op->name + "() got an unexpected keyword argument '" + kwargs[k].first + "'");
    // Python numbers only as operands of ops with other tensor operands (torch.sin(2.0) is eager's).
    bool any_tensor = false;
    for (ir::Node* n : inputs) any_tensor |= n && !n->meta.wrapped_number;
    if (!any_tensor) unsupported(b.op->name + "() called without tensor arguments");
    if (inplace) {
      const VarPtr& target = args.empty() ? kwargs.front().second : args.front();
      if (!target->is_tensor()) unsupported("in-place " + b.op->name + " on a non-tensor");
      check_inplace_target(target, b.op->name);
      return mutate(target, add_node(b.op, inputs, attrs));
    }
    return Var::tensor(add_node(b.op, inputs, attrs));
  }

  // ---- calls ----

  VarPtr call(VarPtr fn, std::vector<VarPtr> args, KwArgs kwargs) {
    switch (fn->kind) {
      case Var::Kind::Method:
        if (fn->obj) {  // a base-class function reached through super()
          args.insert(args.begin(), fn->self);
          return inline_call(fn->obj, nullptr, std::move(args), kwargs);
        }
        if (fn->self->kind == Var::Kind::Tuple || fn->self->kind == Var::Kind::List)
          return call_sequence_method(fn->self, fn->name, std::move(args), kwargs);
        if (is_dict(fn->self)) return call_dict_method(fn->self, fn->name, std::move(args), kwargs);
        if (fn->self->kind == Var::Kind::Module) return call_module_method(fn->self, fn->name, std::move(args), kwargs);
        return call_tensor_method(fn->self, fn->name, std::move(args), kwargs);
      case Var::Kind::Module: return call_module(fn, std::move(args), kwargs);
      case Var::Kind::Function: return inline_call(fn->obj, nullptr, std::move(args), kwargs, &fn->items);
      case Var::Kind::Const:
        if (fn->name == "grad_mode_exit") {  // the __exit__ of with torch.no_grad() and friends
          root()->grad_mode_ = fn->self->obj == Py_True;
          return Var::constant(Py_False);
        }
        return call_const(fn, std::move(args), kwargs);
      default: unsupported("call of a non-callable value");
    }
  }

  // Inlines a call of a Python function: its frame is interpreted into the same graph.
  // `cells`: for a function made in the frame, its closure cells (trackers).
  VarPtr inline_call(PyObject* f, SourcePtr f_source, std::vector<VarPtr> args, const KwArgs& kwargs,
                     const std::vector<VarPtr>* cells = nullptr) {
    auto* co = reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(f));
    std::string name = PyUnicode_AsUTF8(co->co_qualname);
    if (depth_ >= 32) unsupported("inlining deeper than 32 calls (recursion?) at " + name);
    if (co->co_flags & (CO_COROUTINE | CO_ASYNC_GENERATOR | CO_ITERABLE_COROUTINE))
      unsupported(name + " is a coroutine");
    Interpreter child(f, out_, this, std::move(f_source));
    if (cells) {
      int first_free = co->co_nlocalsplus - co->co_nfreevars;
      for (size_t k = 0; k < cells->size(); ++k) child.locals_[first_free + k] = (*cells)[k];
    }
    const int npos = co->co_argcount, nkwonly = co->co_kwonlyargcount;
    const bool varargs = co->co_flags & CO_VARARGS, varkw = co->co_flags & CO_VARKEYWORDS;
    PyObject* varnames = PyCode_GetVarnames(co);
    keep_.push_back(varnames);
    auto slot_name = [&](int i) { return std::string(PyUnicode_AsUTF8(PyTuple_GET_ITEM(varnames, i))); };
    std::vector<VarPtr>& L = child.locals_;
    for (size_t i = 0; i < args.size() && i < static_cast<size_t>(npos); ++i) L[i] = args[i];
    if (args.size() > static_cast<size_t>(npos)) {
      if (!varargs) unsupported(name + "() takes " + std::to_string(npos) + " positional arguments");
      L[npos + nkwonly] = Var::tuple(std::vector<VarPtr>(args.begin() + npos, args.end()));
    } else if (varargs) {
      L[npos + nkwonly] = Var::tuple({});
    }
    VarPtr extra = Var::dict();  // keywords no parameter takes: **kwargs
    for (const auto& [k, v] : kwargs) {
      int slot = -1;
      for (int i = co->co_posonlyargcount; i < npos + nkwonly; ++i)
        if (slot_name(i) == k) slot = i;
      if (slot < 0) {
        if (!varkw) unsupported(name + "() got an unexpected keyword argument '" + k + "'");
        PyObject* key = PyUnicode_FromString(k.c_str());
        dict_set(extra, key, v);
        Py_DECREF(key);
        continue;
      }
      if (L[slot]) unsupported(name + "() got multiple values for argument '" + k + "'");
      L[slot] = v;
    }
    if (varkw) L[npos + nkwonly + varargs] = extra;
    PyObject* defaults = PyFunction_GET_DEFAULTS(f);
    Py_ssize_t ndef = defaults ? PyTuple_GET_SIZE(defaults) : 0;
    for (int i = 0; i < npos; ++i) {
      if (L[i]) continue;
      Py_ssize_t d = i - (npos - ndef);
      if (d < 0) unsupported(name + "() missing argument '" + slot_name(i) + "'");
      PyObject* dv = PyTuple_GET_ITEM(defaults, d);
      // Defaults can be reassigned (f.__defaults__ = ...): guarded like any other value read.
      L[i] = child.fn_source_ ? wrap(dv, Source::item(Source::attr(child.fn_source_, "__defaults__"), d)) : Var::constant(dv);
    }
    PyObject* kwdefaults = PyFunction_GET_KW_DEFAULTS(f);
    for (int i = npos; i < npos + nkwonly; ++i) {
      if (L[i]) continue;
      PyObject* v = kwdefaults ? PyDict_GetItemString(kwdefaults, slot_name(i).c_str()) : nullptr;
      if (!v) unsupported(name + "() missing keyword argument '" + slot_name(i) + "'");
      // Keyword-only defaults: the dict is guarded by identity (reassigning it recompiles).
      if (child.fn_source_) out_.guards.add_identity(Source::attr(child.fn_source_, "__kwdefaults__"), kwdefaults);
      L[i] = Var::constant(v);
    }
    VarPtr r = child.run_frame();
    if (co->co_flags & CO_GENERATOR) {
      // A generator runs to its end at once: the caller iterates over what it yielded.
      VarPtr it = Var::tuple(std::move(child.yields_));
      it->kind = Var::Kind::Iterator;
      return it;
    }
    return r;
  }

  // The items of a value that a loop could walk at capture time.
  std::vector<VarPtr> items_of(const VarPtr& v) {
    if (v->kind == Var::Kind::Tuple || v->kind == Var::Kind::List || v->kind == Var::Kind::Iterator) return v->items;
    if (is_dict(v)) {
      std::vector<VarPtr> keys;
      for (auto& [k, unused] : dict_entries(v)) keys.push_back(Var::constant(k));
      return keys;
    }
    if (v->is_const() && (PyAnySet_Check(v->obj) || PyUnicode_Check(v->obj) || PyDictViewSet_Check(v->obj) ||
                          PyDictValues_Check(v->obj))) {
      if (v->source) unsupported("iteration over a set or view the caller can see");
      PyObject* fast = PySequence_List(v->obj);
      if (!fast) real(nullptr);
      keep_.push_back(fast);
      std::vector<VarPtr> out;
      for (Py_ssize_t i = 0; i < PyList_GET_SIZE(fast); ++i) out.push_back(Var::constant(PyList_GET_ITEM(fast, i)));
      return out;
    }
    if (v->kind == Var::Kind::Module) {
      // Children in order, by name (Sequential may name them: OrderedDict construction); a
      // ModuleDict or ParameterDict yields its keys, like a dict.
      std::string type = Py_TYPE(v->obj)->tp_name;
      bool keys = type == "ModuleDict" || type == "ParameterDict";
      std::vector<VarPtr> out;
      for (const std::string& n : module_keys(v))
        out.push_back(keys ? real(PyUnicode_FromString(n.c_str())) : module_attr(v, n.c_str()));
      return out;
    }
    if (v->is_const()) {
      PyObject* o = v->obj;
      if (!(PyRange_Check(o) || PyTuple_Check(o) || PyList_Check(o))) unsupported("iteration over a " + std::string(Py_TYPE(o)->tp_name));
      Py_ssize_t n = PySequence_Size(o);
      if (n > 10000) unsupported("loop of more than 10000 iterations");
      std::vector<VarPtr> out;
      for (Py_ssize_t i = 0; i < n; ++i) out.push_back(Var::steal_constant(PySequence_GetItem(o, i)));
      return out;
    }
    unsupported("iteration over a tensor is not captured yet");
  }

  // zip / enumerate / reversed over values known at capture time: tuples of trackers.
  VarPtr iteration_builtin(PyObject* f, const std::vector<VarPtr>& args) {
    std::vector<VarPtr> out;
    if (f == builtin("reversed")) {
      if (args.size() != 1) unsupported("reversed() takes one argument");
      out = items_of(args[0]);
      std::reverse(out.begin(), out.end());
    } else if (f == builtin("enumerate")) {
      if (args.empty() || args.size() > 2) unsupported("enumerate() with unusual arguments");
      long start = args.size() == 2 ? PyLong_AsLong(const_obj(args[1], "start")) : 0;
      std::vector<VarPtr> items = items_of(args[0]);
      for (size_t i = 0; i < items.size(); ++i)
        out.push_back(Var::tuple({Var::steal_constant(PyLong_FromLong(start + static_cast<long>(i))), items[i]}));
    } else {
      std::vector<std::vector<VarPtr>> seqs;
      size_t n = SIZE_MAX;
      for (const VarPtr& a : args) {
        seqs.push_back(items_of(a));
        n = std::min(n, seqs.back().size());
      }
      if (seqs.empty()) n = 0;
      for (size_t i = 0; i < n; ++i) {
        std::vector<VarPtr> t;
        for (auto& sq : seqs) t.push_back(sq[i]);
        out.push_back(Var::tuple(std::move(t)));
      }
    }
    VarPtr it = Var::tuple(std::move(out));
    it->kind = Var::Kind::Iterator;
    return it;
  }

  static bool is_torch_internal(PyObject* f) {
    PyObject* mod = PyObject_GetAttrString(f, "__module__");
    if (!mod) PyErr_Clear();
    std::string m = mod && PyUnicode_Check(mod) ? PyUnicode_AsUTF8(mod) : "";
    bool torch = m == "torch" || m.rfind("torch.", 0) == 0;  // torchvision and others are user code here
    Py_XDECREF(mod);
    return torch;
  }

  VarPtr call_const(VarPtr fn, std::vector<VarPtr> args, KwArgs kwargs) {
    PyObject* f = fn->obj;
    if (const OpBinding* b = function_binding(f)) return call_op(*b, std::move(args), kwargs);
    if (f == builtin("super") && kwargs.empty()) return make_super(args);
    if (!function_binding(f) && !args.empty() && args[0]->is_tensor()) {
      // torch.relu_(x), torch.sigmoid_(x): the Tensor method of the same name
      std::string n = callable_name(f);
      if (n.rfind("torch.", 0) == 0 && n.size() > 7 && n.back() == '_' && n[n.size() - 2] != '_') {
        std::string method = n.substr(n.rfind('.') + 1);
        if (method_binding(method.substr(0, method.size() - 1))) {
          std::vector<VarPtr> rest(args.begin() + 1, args.end());
          return call_tensor_method(args[0], method, std::move(rest), kwargs);
        }
      }
    }
    if ((f == builtin("getattr") || f == builtin("hasattr")) && kwargs.empty() && args.size() >= 2 &&
        (args[0]->kind == Var::Kind::Module || (args[0]->is_const() && args[0]->source)) && args[1]->is_const() &&
        PyUnicode_Check(args[1]->obj)) {
      // getattr(self, f"fc{i}"), getattr(cfg, "eps"): read as self.fc0 / cfg.eps would be, guarded
      const char* attr = PyUnicode_AsUTF8(args[1]->obj);
      int has = PyObject_HasAttrString(args[0]->obj, attr);
      if (f == builtin("hasattr")) {
        if (has) getattr(args[0], attr);
        return Var::constant(has ? Py_True : Py_False);
      }
      if (!has && args.size() == 3) return args[2];
      return getattr(args[0], attr);
    }
    if (VarPtr r = grad_mode_context(f, args, kwargs)) return r;
    if (VarPtr r = builtin_over_trackers(f, args, kwargs)) return r;
    static PyObject* partial_type = [] {
      PyObject* ft = PyImport_ImportModule("functools");
      PyObject* t = ft ? PyObject_GetAttrString(ft, "partial") : nullptr;
      Py_XDECREF(ft);
      PyErr_Clear();
      return t;
    }();
    if (f == partial_type && !args.empty() && std::all_of(args.begin(), args.end(), [](auto& a) { return a->is_const() || a->kind == Var::Kind::Module; }) &&
        std::all_of(kwargs.begin(), kwargs.end(), [](auto& kv) { return kv.second->is_const(); })) {
      // functools.partial(g, ...) of values known here: a real partial, built now.
      PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(args.size()));
      for (size_t i = 0; i < args.size(); ++i) PyTuple_SET_ITEM(t, i, Py_NewRef(args[i]->obj));
      PyObject* kw = PyDict_New();
      for (auto& [k, v] : kwargs) PyDict_SetItemString(kw, k.c_str(), v->obj);
      PyObject* p = PyObject_Call(partial_type, t, kw);
      Py_DECREF(t);
      Py_DECREF(kw);
      return real(p);
    }
    if (partial_type && Py_TYPE(f) == reinterpret_cast<PyTypeObject*>(partial_type)) {
      // functools.partial(g, *a, **k)(...): g(*a, ..., **k, ...); its fields are read-only.
      PyObject* pargs = PyObject_GetAttrString(f, "args");
      PyObject* pkw = PyObject_GetAttrString(f, "keywords");
      keep_.push_back(pargs);
      keep_.push_back(pkw);
      std::vector<VarPtr> all;
      for (Py_ssize_t i = 0; pargs && i < PyTuple_GET_SIZE(pargs); ++i) all.push_back(Var::constant(PyTuple_GET_ITEM(pargs, i)));
      all.insert(all.end(), args.begin(), args.end());
      KwArgs kw;
      PyObject *k, *v;
      Py_ssize_t pos = 0;
      while (pkw && PyDict_Check(pkw) && PyDict_Next(pkw, &pos, &k, &v)) kw.emplace_back(PyUnicode_AsUTF8(k), Var::constant(v));
      for (auto& x : kwargs) kw.push_back(x);
      PyObject* inner = PyObject_GetAttrString(f, "func");
      keep_.push_back(inner);
      VarPtr g = fn->source ? wrap(inner, Source::attr(fn->source, "func")) : Var::constant(inner);
      return call(g, std::move(all), std::move(kw));
    }
    if (is_compiled_function(f) && !compiled_function_disabled(f)) {
      // A compiled function called from compiled code: its body is inlined into this graph.
      PyObject* target = compiled_function_target(f);
      if (PyFunction_Check(target) && fn->source)
        return inline_call(target, Source::attr(fn->source, "__wrapped__"), std::move(args), kwargs);
    }
    if (PyFunction_Check(f) && !is_torch_internal(f)) return inline_call(f, fn->source, std::move(args), kwargs);
    if (PyMethod_Check(f) && PyFunction_Check(PyMethod_GET_FUNCTION(f)) && !is_torch_internal(PyMethod_GET_FUNCTION(f))) {
      // A bound method of a user object: inline its function with the receiver first.
      if (!fn->source) unsupported("bound method with no known source");
      VarPtr self = wrap(PyMethod_GET_SELF(f), Source::attr(fn->source, "__self__"));
      args.insert(args.begin(), self);
      return inline_call(PyMethod_GET_FUNCTION(f), Source::attr(fn->source, "__func__"), std::move(args), kwargs);
    }
    if (fn->source && !PyType_Check(f) && !PyCFunction_Check(f) &&
        PyObject_HasAttrString(reinterpret_cast<PyObject*>(Py_TYPE(f)), "__call__")) {
      PyObject* call_attr = PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(f)), "__call__");
      bool python = call_attr && PyFunction_Check(call_attr);
      Py_XDECREF(call_attr);
      PyErr_Clear();
      if (python) return call(getattr(fn, "__call__"), std::move(args), std::move(kwargs));  // obj(x): type(obj).__call__
    }
    std::string name = callable_name(f);
    std::function<bool(const VarPtr&)> has_tensor = [&](const VarPtr& a) {
      if (a->is_tensor()) return true;
      if (a->kind == Var::Kind::Tuple || a->kind == Var::Kind::List) return std::any_of(a->items.begin(), a->items.end(), has_tensor);
      return false;
    };
    bool any_tensor = std::any_of(args.begin(), args.end(), has_tensor) ||
                      std::any_of(kwargs.begin(), kwargs.end(), [&](auto& kv) { return has_tensor(kv.second); });
    static PyObject* torch_max = resolve_torch("max");
    static PyObject* torch_min = resolve_torch("min");
    if (f == torch_max || f == torch_min) {
      name = f == torch_max ? "torch.max" : "torch.min";
      if (args.size() == 1 && kwargs.empty())
        return call_op(*function_binding(resolve_torch(name == "torch.max" ? "amax" : "amin")), args, {});
      if (args.size() == 2 && args[1]->is_tensor() && kwargs.empty())
        return call_op(*function_binding(resolve_torch(name == "torch.max" ? "maximum" : "minimum")), args, {});
      unsupported(name + " with a dim returns (values, indices): not captured yet");
    }
    if ((f == builtin("zip") || f == builtin("enumerate") || f == builtin("reversed")) && kwargs.empty())
      return iteration_builtin(f, args);
    if (f == builtin("enumerate") && kwargs.size() == 1 && kwargs[0].first == "start" && args.size() == 1)
      return iteration_builtin(f, {args[0], kwargs[0].second});
    if (f == builtin("next") && (args.size() == 1 || args.size() == 2) && args[0]->kind == Var::Kind::Iterator) {
      VarPtr& it = args[0];
      if (it->items.empty()) {
        if (args.size() == 2) return args[1];
        unsupported("next() of an exhausted iterator: StopIteration");
      }
      VarPtr v = it->items.front();
      it->items.erase(it->items.begin());
      return v;
    }
    if (f == builtin("iter") && args.size() == 1 && kwargs.empty()) {
      VarPtr it = Var::tuple(items_of(args[0]));
      it->kind = Var::Kind::Iterator;
      return it;
    }
    // Questions models ask about how they run: not scripted, not traced (eager's answers).
    static const std::vector<PyObject*> answers_false = [this] {
      std::vector<PyObject*> fs;
      for (const char* path : {"torch.jit.is_scripting", "torch.jit.is_tracing", "torch._jit_internal.is_scripting",
                               "torch._C._get_tracing_state", "torch.compiler.is_compiling",
                               "torch.compiler.is_dynamo_compiling", "torch._utils.is_compiling"}) {
        try {
          fs.push_back(resolve_torch_path(path));
        } catch (const Unsupported&) {
        }
      }
      return fs;
    }();
    if (args.empty() && kwargs.empty() && std::find(answers_false.begin(), answers_false.end(), f) != answers_false.end())
      return Var::constant(f == answers_false[3] ? Py_None : Py_False);
    static PyObject* torch_assert = resolve_torch("_assert");
    if (f == torch_assert && !args.empty() && args[0]->is_const()) {
      if (!truth(args[0])) unsupported("torch._assert fails: eager raises");
      return Var::constant(Py_None);
    }
    static PyObject* is_grad_enabled = resolve_torch("is_grad_enabled");
    if (f == is_grad_enabled && args.empty()) return Var::constant(root()->grad_mode_ ? Py_True : Py_False);
    if (f == builtin("type") && args.size() == 1 && args[0]->is_tensor() && args[0]->node->op_name() != "placeholder")
      return Var::constant(resolve_torch("Tensor"));
    if (f == builtin("callable") && args.size() == 1 && !args[0]->is_const())
      return Var::constant(args[0]->kind == Var::Kind::Module || args[0]->kind == Var::Kind::Function ||
                                   args[0]->kind == Var::Kind::Method
                               ? Py_True
                               : Py_False);
    if (f == builtin("abs") && args.size() == 1 && args[0]->is_tensor())
      return Var::tensor(add_node("abs", {args[0]->node}));
    if (f == builtin("len") && args.size() == 1 && args[0]->kind == Var::Kind::Module)
      return Var::steal_constant(PyLong_FromSsize_t(module_children(args[0])));
    if (f == builtin("len") && args.size() == 1 && args[0]->is_tensor()) {
      const ir::TensorMeta& m = args[0]->node->meta;
      if (m.dim() == 0) unsupported("len() of a 0-d tensor");
      return size_const(m.sizes[0]);
    }
    if (f == builtin("isinstance") && args.size() == 2 && args[0]->is_tensor()) {
      PyObject* tensor_type = resolve_torch("Tensor");
      return Var::constant(PyObject_IsSubclass(tensor_type, args[1]->obj) == 1 ? Py_True : Py_False);
    }
    static const std::vector<PyObject*> dropouts = [this] {
      std::vector<PyObject*> fs;
      for (const char* d : {"dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"})
        fs.push_back(resolve_torch_path(std::string("torch.nn.functional.") + d));
      return fs;
    }();
    if (std::find(dropouts.begin(), dropouts.end(), f) != dropouts.end() && !args.empty() && args[0]->is_tensor()) {
      // F.dropout(x, p, training=False) is x; in training it draws random numbers (Python's)
      VarPtr training;
      for (auto& [k, v] : kwargs)
        if (k == "training") training = v;
      if (!training && args.size() >= 3) training = args[2];
      if (training && training->is_const() && training->obj == Py_False) return args[0];
    }
    static const std::vector<PyObject*> torch_function_checks = [this] {
      std::vector<PyObject*> fs;
      for (const char* n : {"_has_torch_function", "_has_torch_function_unary", "_has_torch_function_variadic"})
        fs.push_back(resolve_torch_path(std::string("torch._C.") + n));
      return fs;
    }();
    if (std::find(torch_function_checks.begin(), torch_function_checks.end(), f) != torch_function_checks.end())
      return Var::constant(Py_False);  // graph tensors are plain tensors (inputs' types are guarded)
    static PyObject* dispatch_stack_len = resolve_torch_path("torch._C._len_torch_dispatch_stack");
    if (f == dispatch_stack_len && args.empty()) return Var::steal_constant(PyLong_FromLong(0));  // no modes in a graph
    if (any_tensor && is_torch_internal(f)) {
      if (VarPtr r = torch_extern(f, name, args, kwargs)) return r;
      // a torch Python helper that answers with Python values (a check, a size): inlined
      return inline_call(f, fn->source, std::move(args), kwargs);
    }
    // torch's own Python helpers on Python values (F._none_or_dtype, ...): inlined like user code
    if (!any_tensor && PyFunction_Check(f)) return inline_call(f, fn->source, std::move(args), kwargs);
    static const std::vector<PyObject*> state_queries = [this] {
      std::vector<PyObject*> fs;
      for (const char* path : {"torch.is_autocast_enabled", "torch.is_autocast_cpu_enabled", "torch.get_default_dtype",
                               "torch.is_inference_mode_enabled", "torch.get_autocast_gpu_dtype"}) {
        try {
          fs.push_back(resolve_torch_path(path));
        } catch (const Unsupported&) {
        }
      }
      return fs;
    }();
    if (!any_tensor && std::find(state_queries.begin(), state_queries.end(), f) != state_queries.end()) {
      // torch's global modes, read as they are now (kiln does not compile under autocast)
      PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(args.size()));
      for (size_t i = 0; i < args.size(); ++i) PyTuple_SET_ITEM(t, i, Py_NewRef(const_obj(args[i], "argument")));
      PyObject* r = PyObject_Call(f, t, nullptr);
      Py_DECREF(t);
      return real(r);
    }
    static PyObject* log_usage = resolve_torch_path("torch._C._log_api_usage_once");
    if (f == log_usage) return Var::constant(Py_None);  // usage logging: nothing the program sees
    if (any_tensor) unsupported("call to " + name + " with tensor arguments is not captured");
    if (!pure_callable(f) && !(!fn->source && private_container_method(f))) unsupported("call to " + name);
    PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(args.size()));
    for (size_t i = 0; i < args.size(); ++i) {
      PyObject* o = const_obj(args[i], "argument");
      Py_INCREF(o);
      PyTuple_SET_ITEM(tuple, i, o);
    }
    PyObject* kw = nullptr;
    if (!kwargs.empty()) {
      kw = PyDict_New();
      for (auto& [k, v] : kwargs) PyDict_SetItemString(kw, k.c_str(), const_obj(v, "argument"));
    }
    PyObject* r = PyObject_Call(f, tuple, kw);
    Py_DECREF(tuple);
    Py_XDECREF(kw);
    return real(r);
  }

  // torch.no_grad() and friends, for `with`: a marker holding the grad mode the block runs in.
  VarPtr grad_mode_context(PyObject* f, const std::vector<VarPtr>& args, const KwArgs& kwargs) {
    static PyObject* no_grad = resolve_torch("no_grad");
    static PyObject* enable_grad = resolve_torch("enable_grad");
    static PyObject* inference_mode = resolve_torch("inference_mode");
    static PyObject* set_grad_enabled = resolve_torch("set_grad_enabled");
    bool mode;
    if (f == no_grad && args.empty() && kwargs.empty()) mode = false;
    else if (f == enable_grad && args.empty() && kwargs.empty()) mode = true;
    else if (f == inference_mode && kwargs.empty() && args.size() <= 1)
      mode = args.empty() ? false : !truth(args[0]);
    else if (f == set_grad_enabled && kwargs.empty() && args.size() == 1)
      unsupported("torch.set_grad_enabled() changes grad mode when called: not captured yet");
    else return nullptr;
    VarPtr v = Var::constant(mode ? Py_True : Py_False);
    v->name = "grad_mode";
    return v;
  }

  // Builtins applied to lists, tuples, dicts and iterators of trackers.
  VarPtr builtin_over_trackers(PyObject* f, const std::vector<VarPtr>& args, const KwArgs& kwargs) {
    auto tracker = [](const VarPtr& v) {
      return v->kind == Var::Kind::Tuple || v->kind == Var::Kind::List || v->kind == Var::Kind::Dict ||
             v->kind == Var::Kind::Iterator;
    };
    if (!kwargs.empty()) return nullptr;
    if ((f == builtin("list") || f == builtin("tuple")) && args.empty()) return Var::tuple({}, f == builtin("list"));
    if (f == builtin("dict") && args.empty()) return Var::dict();
    if (f == builtin("map") && args.size() >= 2 && std::any_of(args.begin() + 1, args.end(), tracker)) {
      std::vector<std::vector<VarPtr>> cols;
      for (size_t i = 1; i < args.size(); ++i) cols.push_back(items_of(args[i]));
      size_t n = cols[0].size();
      for (auto& c : cols) n = std::min(n, c.size());
      std::vector<VarPtr> out;
      for (size_t j = 0; j < n; ++j) {
        std::vector<VarPtr> call_args;
        for (auto& c : cols) call_args.push_back(c[j]);
        out.push_back(call(args[0], std::move(call_args), {}));
      }
      VarPtr it = Var::tuple(std::move(out));
      it->kind = Var::Kind::Iterator;
      return it;
    }
    if (f == builtin("filter") && args.size() == 2 && (tracker(args[1]) || args[0]->kind == Var::Kind::Function)) {
      std::vector<VarPtr> out;
      for (const VarPtr& x : items_of(args[1])) {
        bool keep = args[0]->is_const() && args[0]->obj == Py_None ? truth(x) : truth(call(args[0], {x}, {}));
        if (keep) out.push_back(x);
      }
      VarPtr it = Var::tuple(std::move(out));
      it->kind = Var::Kind::Iterator;
      return it;
    }
    if (args.empty() || !tracker(args[0])) return nullptr;
    const VarPtr& a = args[0];
    if (f == builtin("len") && args.size() == 1 && a->kind != Var::Kind::Iterator)
      return Var::steal_constant(PyLong_FromSize_t(a->items.size()));
    if ((f == builtin("list") || f == builtin("tuple")) && args.size() == 1) return Var::tuple(items_of(a), f == builtin("list"));
    if (f == builtin("dict") && args.size() == 1) {
      VarPtr d = Var::dict();
      if (a->kind == Var::Kind::Dict) {
        for (auto& [k, v] : dict_entries(a)) dict_set(d, k, v);
      } else {
        for (const VarPtr& pair : items_of(a)) {
          std::vector<VarPtr> kv = items_of(pair);
          if (kv.size() != 2) unsupported("dict() of items that are not pairs");
          dict_set(d, const_obj(kv[0], "dict key"), kv[1]);
        }
      }
      return d;
    }
    if ((f == builtin("min") || f == builtin("max") || f == builtin("sorted") || f == builtin("set") ||
         f == builtin("frozenset")) && args.size() == 1) {
      // over values known here: Python computes it
      std::vector<VarPtr> items = items_of(a);
      PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(items.size()));
      for (size_t i = 0; i < items.size(); ++i) PyTuple_SET_ITEM(t, i, Py_NewRef(const_obj(items[i], "item")));
      PyObject* r = PyObject_CallOneArg(f, t);
      Py_DECREF(t);
      return real(r);
    }
    if (f == builtin("sum") && (args.size() == 1 || args.size() == 2)) {
      VarPtr acc = args.size() == 2 ? args[1] : Var::steal_constant(PyLong_FromLong(0));
      for (const VarPtr& x : items_of(a)) acc = binary("NB_ADD", acc, x);
      return acc;
    }
    if ((f == builtin("any") || f == builtin("all")) && args.size() == 1) {
      bool any = f == builtin("any");
      for (const VarPtr& x : items_of(a))
        if (truth(x) == any) return Var::constant(any ? Py_True : Py_False);
      return Var::constant(any ? Py_False : Py_True);
    }
    if (f == builtin("isinstance") && args.size() == 2) {
      PyTypeObject* t = a->kind == Var::Kind::Tuple ? &PyTuple_Type : a->kind == Var::Kind::List ? &PyList_Type : &PyDict_Type;
      int r = PyObject_IsSubclass(reinterpret_cast<PyObject*>(t), const_obj(args[1], "class"));
      if (r < 0) real(nullptr);
      return Var::constant(r ? Py_True : Py_False);
    }
    return nullptr;
  }

  // A method of a list, dict or set made during capture (no source: nobody else holds it): it
  // may change that object for real, which is the value the frame then holds.
  static bool private_container_method(PyObject* f) {
    if (!PyCFunction_Check(f)) return false;
    PyObject* self = PyCFunction_GET_SELF(f);
    return self && (PyList_CheckExact(self) || PyDict_CheckExact(self) || PySet_CheckExact(self));
  }

  // Builtins and math functions whose result depends only on their arguments.
  bool pure_callable(PyObject* f) {
    static const char* names[] = {"len",   "abs",     "min",        "max",     "int",     "float",     "bool",
                                  "range", "tuple",   "list",       "round",   "pow",     "divmod",    "isinstance",
                                  "sum",   "any",     "all",        "str",     "hasattr", "getattr",   "set",
                                  "frozenset", "sorted", "callable", "repr",   "dict",    "issubclass", "chr", "ord"};
    for (const char* n : names)
      if (f == builtin(n)) return true;
    if (f == builtin("type")) return true;  // type(obj) of a Python value
    // Methods of strings, numbers and tuples (immutable receivers): "{}".format, "-".join, ...
    if (PyCFunction_Check(f)) {
      PyObject* self = PyCFunction_GET_SELF(f);
      if (self && (PyUnicode_Check(self) || PyLong_Check(self) || PyFloat_Check(self) || PyTuple_Check(self) ||
                   PyBytes_Check(self)))
        return true;
    }
    PyObject* mod = PyObject_GetAttrString(f, "__module__");
    if (!mod) PyErr_Clear();
    bool math = mod && PyUnicode_Check(mod) && std::string(PyUnicode_AsUTF8(mod)) == "math";
    Py_XDECREF(mod);
    if (!math) {
      // Builtin functions of the math module report no __module__ on some versions.
      PyObject* self = PyCFunction_Check(f) ? PyCFunction_GET_SELF(f) : nullptr;
      math = self && PyModule_Check(self) && std::string(PyModule_GetName(self)) == "math";
      if (PyErr_Occurred()) PyErr_Clear();
    }
    if (math) return true;
    DType t;
    return dtype_from_object(f, t);
  }

  PyObject* builtin(const char* name) { return PyDict_GetItemString(builtins_, name); }

  PyObject* resolve_torch(const std::string& attr) {
    static PyObject* torch = PyImport_ImportModule("torch");
    PyObject* r = PyObject_GetAttrString(torch, attr.c_str());
    if (!r) PyErr_Clear();
    if (r) keep_.push_back(r);
    return r;
  }

  std::string callable_name(PyObject* f) {
    PyObject* mod = PyObject_GetAttrString(f, "__module__");
    PyObject* qn = PyObject_GetAttrString(f, "__qualname__");
    PyErr_Clear();
    std::string m = mod && PyUnicode_Check(mod) ? PyUnicode_AsUTF8(mod) : "";
    std::string q = qn && PyUnicode_Check(qn) ? PyUnicode_AsUTF8(qn) : Py_TYPE(f)->tp_name;
    Py_XDECREF(mod);
    Py_XDECREF(qn);
    if (m == "torch" || m.empty()) return m.empty() ? q : "torch." + q;
    return m + "." + q;
  }

  VarPtr size_const(const sym::Expr& e) {
    auto c = e.as_const();
    if (!c) unsupported("symbolic size");
    return Var::steal_constant(PyLong_FromLongLong(*c));
  }

  VarPtr shape_tuple(const ir::TensorMeta& m) {
    static PyObject* size_type = resolve_torch("Size");
    PyObject* t = PyTuple_New(m.dim());
    for (int64_t i = 0; i < m.dim(); ++i) {
      auto c = m.sizes[i].as_const();
      if (!c) unsupported("symbolic size");
      PyTuple_SET_ITEM(t, i, PyLong_FromLongLong(*c));
    }
    PyObject* size = PyObject_CallOneArg(size_type, t);
    Py_DECREF(t);
    return real(size);
  }

  VarPtr call_tensor_method(VarPtr self, const std::string& name, std::vector<VarPtr> args, const KwArgs& kwargs) {
    const ir::TensorMeta& m = self->node->meta;
    if (name == "size") {
      if (args.empty() && kwargs.empty()) return shape_tuple(m);
      int64_t d = PyLong_AsLongLong(const_obj(args.empty() ? kwargs[0].second : args[0], "dim"));
      std::string err;
      if (!ops::wrap_dim(d, m.dim(), err)) unsupported(err);
      return size_const(m.sizes[d]);
    }
    if (name == "dim" || name == "ndimension") return Var::steal_constant(PyLong_FromLongLong(m.dim()));
    if (name == "numel" || name == "nelement") return size_const(m.numel());
    if (name == "is_contiguous") return Var::constant(m.strides == ir::contiguous_strides(m.sizes) ? Py_True : Py_False);
    if (name == "element_size") return Var::steal_constant(PyLong_FromLong(dtype_size(m.dtype)));
    if (name == "is_floating_point" && args.empty()) return Var::constant(is_floating(m.dtype) ? Py_True : Py_False);
    if (name == "is_complex" && args.empty()) return Var::constant(Py_False);
    if (name == "get_device" && args.empty())
      return Var::steal_constant(PyLong_FromLong(m.device.type == DeviceType::CUDA ? m.device.index : -1));
    if (name == "item" || name == "tolist" || name == "numpy" || name == "__bool__" || name == "nonzero")
      unsupported("Tensor." + name + "() depends on tensor data");
    if (name == "to" || name == "type") {
      // Only dtype conversions: device moves and copies stay eager for now.
      if (args.size() == 1 && kwargs.empty() && args[0]->is_const()) {
        DType t;
        if (dtype_from_object(args[0]->obj, t)) {
          if (t == m.dtype) return self;
        }
      }
    }
    if (name == "contiguous" && args.empty() && m.strides == ir::contiguous_strides(m.sizes)) return self;
    if ((name == "max" || name == "min") && args.empty() && kwargs.empty())  // over all elements
      return call_op(*function_binding(resolve_torch(name == "max" ? "amax" : "amin")), {self}, {});
    if (name == "where") {
      // x.where(condition, y) == torch.where(condition, x, y)
      if (args.size() != 2 || !kwargs.empty()) unsupported("Tensor.where() takes (condition, other)");
      return call_op(*function_binding(resolve_torch_path("torch.where")), {args[0], self, args[1]}, {});
    }
    if (name.size() > 1 && name.back() == '_' && name[name.size() - 2] != '_') {
      // x.add_(y), x.relu_(): the out-of-place op, then every alias of x takes the result.
      std::string base = name.substr(0, name.size() - 1);
      if (base == "copy" && args.size() == 1 && args[0]->is_tensor() && kwargs.empty()) {
        // x.copy_(src): src broadcast to x's shape, in x's dtype
        check_inplace_target(self, name);
        ir::Node* src = args[0]->node;
        if (src->meta.sizes != m.sizes) {
          std::vector<int64_t> size;
          for (const auto& e : m.sizes) {
            auto c = e.as_const();
            if (!c) unsupported("copy_ into a tensor of symbolic shape");
            size.push_back(*c);
          }
          ir::Attrs a;
          a.set("size", size);
          src = add_node("expand", {src}, a);
        }
        if (src->meta.dtype != m.dtype) {
          ir::Attrs a;
          a.set("dtype", m.dtype);
          src = add_node("convert", {src}, a);
        }
        return mutate(self, add_node("add", {src, g_->scalar(0.0, DType::Int64)}));
      }
      const OpBinding* ob = method_binding(base);
      if (!ob || ob->op->kind == ops::OpKind::View || ob->op->aliases())
        unsupported("Tensor." + name + "() is not captured yet");
      check_inplace_target(self, name);
      args.insert(args.begin(), self);
      VarPtr r = call_op(*ob, std::move(args), kwargs);
      return mutate(self, r->node);
    }
    const OpBinding* b = method_binding(name);
    if (!b) {
      PyObject* method = PyObject_GetAttrString(resolve_torch("Tensor"), name.c_str());
      if (!method) {
        PyErr_Clear();
        unsupported("Tensor." + name + "() does not exist");
      }
      keep_.push_back(method);
      args.insert(args.begin(), self);
      return torch_extern(method, "Tensor." + name, args, kwargs);
    }
    // x.float() on a float32 x is x itself in eager (an alias, not a copy).
    if (b->op->name == "convert" && args.empty() && b->fixed.get_dtype("dtype") == m.dtype) return self;
    args.insert(args.begin(), self);
    return call_op(*b, std::move(args), kwargs);
  }

  // Number of children of a container module, guarded.
  Py_ssize_t module_children(const VarPtr& mod) {
    std::string type = Py_TYPE(mod->obj)->tp_name;
    const char* store = type == "ParameterList" || type == "ParameterDict" ? "_parameters" : "_modules";
    if (type != "ModuleList" && type != "Sequential" && type != "ModuleDict" && store[1] != 'p')
      unsupported("len() or indexing of module " + type);
    PyObject* children = PyObject_GetAttrString(mod->obj, store);
    if (!children || !PyDict_Check(children)) unsupported("container module without _modules");
    Py_ssize_t n = PyDict_Size(children);
    Py_DECREF(children);
    out_.guards.add_length(Source::attr(mod->source, store), n);
    return n;
  }

  // The names of a container module's children (ModuleList, Sequential, ModuleDict,
  // ParameterList, ParameterDict), in order; each read through module_attr, so guarded.
  std::vector<std::string> module_keys(const VarPtr& mod) {
    module_children(mod);
    std::string type = Py_TYPE(mod->obj)->tp_name;
    const char* store = type == "ParameterList" || type == "ParameterDict" ? "_parameters" : "_modules";
    PyObject* children = PyObject_GetAttrString(mod->obj, store);
    std::vector<std::string> names;
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(children, &pos, &key, &value)) names.push_back(PyUnicode_AsUTF8(key));
    Py_DECREF(children);
    for (const std::string& n : names) module_attr(mod, n.c_str());  // guards each child
    return names;
  }

  // self.helper(x) on a module: the class's function, inlined with the module as self.
  VarPtr call_module_method(VarPtr mod, const std::string& name, std::vector<VarPtr> args, const KwArgs& kwargs) {
    std::string type = Py_TYPE(mod->obj)->tp_name;
    if ((type == "ModuleDict" || type == "ParameterDict") && args.empty() &&
        (name == "keys" || name == "values" || name == "items")) {
      std::vector<VarPtr> out;
      for (const std::string& n : module_keys(mod)) {
        VarPtr k = real(PyUnicode_FromString(n.c_str()));
        if (name == "keys") out.push_back(k);
        else if (name == "values") out.push_back(module_attr(mod, n.c_str()));
        else out.push_back(Var::tuple({k, module_attr(mod, n.c_str())}));
      }
      return Var::tuple(std::move(out), true);
    }
    PyObject* key = PyUnicode_FromString(name.c_str());
    PyObject* f = _PyType_Lookup(Py_TYPE(mod->obj), key);  // borrowed
    Py_DECREF(key);
    if (PyErr_Occurred()) PyErr_Clear();
    if (!f || !PyFunction_Check(f)) unsupported("method " + name + " of module " + Py_TYPE(mod->obj)->tp_name);
    args.insert(args.begin(), mod);
    // type(self).<name>: the function itself, so its defaults and closure are guarded.
    SourcePtr src = mod->source ? Source::attr(Source::attr(mod->source, "__class__"), name) : nullptr;
    return inline_call(f, src, std::move(args), kwargs);
  }

  VarPtr module_attr(const VarPtr& mod, const char* name) {
    PyObject* v = PyObject_GetAttrString(mod->obj, name);
    if (!v) {
      PyErr_Clear();
      unsupported(std::string("module has no attribute ") + name);
    }
    if (PyMethod_Check(v) && PyMethod_GET_SELF(v) == mod->obj) {
      // Bound methods are made afresh at each access: track the method, not the object.
      Py_DECREF(v);
      return Var::method(mod, name);
    }
    VarPtr r = wrap(v, Source::attr(mod->source, name));
    Py_DECREF(v);
    return r;
  }

  // A module call as nn.Module.__call__ makes it: forward pre-hooks, forward, forward hooks
  // (each inlined; the hook dicts are guarded, so adding or removing a hook recompiles).
  VarPtr call_module(VarPtr mod, std::vector<VarPtr> args, const KwArgs& kwargs) {
    PyObject* m = mod->obj;
    std::string type = Py_TYPE(m)->tp_name;
    Interpreter* r = root();
    if (!r->global_hooks_checked_) {
      r->global_hooks_checked_ = true;
      static PyObject* mm = [] {
        PyObject* mod = PyImport_ImportModule("torch.nn.modules.module");
        PyObject* d = mod ? PyModule_GetDict(mod) : nullptr;
        Py_XINCREF(d);
        Py_XDECREF(mod);
        PyErr_Clear();
        return d;
      }();
      for (const char* g : {"_global_forward_hooks", "_global_forward_pre_hooks"}) {
        PyObject* d = mm ? PyDict_GetItemString(mm, g) : nullptr;
        if (!d || !PyDict_Check(d)) continue;
        if (PyDict_Size(d) > 0) unsupported("global module forward hooks are not captured yet");
        out_.guards.add_length(Source::global(g, mm), 0);
      }
    }
    std::vector<VarPtr> pre_hooks, post_hooks;
    for (const char* h : {"_forward_pre_hooks", "_forward_hooks"}) {
      PyObject* d = PyObject_GetAttrString(m, h);
      if (!d) PyErr_Clear();
      if (d && PyDict_Check(d)) {
        keep_.push_back(d);
        if (!mod->source) {
          if (PyDict_Size(d)) unsupported("hooks on a module with no known source");
        } else {
          SourcePtr ds = Source::attr(mod->source, h);
          out_.guards.add_length(ds, PyDict_Size(d));
          PyObject *k, *v;
          Py_ssize_t pos = 0;
          while (PyDict_Next(d, &pos, &k, &v))
            (h[9] == 'p' ? pre_hooks : post_hooks).push_back(wrap(v, Source::key_of(ds, k)));
        }
      } else {
        Py_XDECREF(d);
      }
    }
    if (!pre_hooks.empty() || !post_hooks.empty()) {
      for (const char* h : {"_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs"}) {
        PyObject* d = PyObject_GetAttrString(m, h);
        if (!d) PyErr_Clear();
        bool any = d && PyObject_Length(d) > 0;
        Py_XDECREF(d);
        PyErr_Clear();
        if (any) unsupported("forward hooks with keyword arguments are not captured yet");
      }
    }
    for (const VarPtr& hook : pre_hooks) {
      VarPtr res = call(hook, {mod, Var::tuple(args)}, {});
      if (res->is_const() && res->obj == Py_None) continue;
      args = res->kind == Var::Kind::Tuple ? res->items : std::vector<VarPtr>{res};
    }
    VarPtr out = call_module_body(mod, args, kwargs);
    for (const VarPtr& hook : post_hooks) {
      VarPtr res = call(hook, {mod, Var::tuple(args), out}, {});
      if (!(res->is_const() && res->obj == Py_None)) out = res;
    }
    return out;
  }

  VarPtr call_module_body(VarPtr mod, std::vector<VarPtr> args, const KwArgs& kwargs) {
    PyObject* m = mod->obj;
    std::string type = Py_TYPE(m)->tp_name;
    VarPtr training = module_attr(mod, "training");
    bool train = training->obj == Py_True;
    auto op = [&](const char* fn) { return call_op(*function_binding(resolve_torch_path(fn)), args, kwargs); };
    if (type == "Linear") {
      if (args.size() != 1 || !kwargs.empty()) unsupported("Linear called with extra arguments");
      std::vector<VarPtr> a = {args[0], module_attr(mod, "weight"), module_attr(mod, "bias")};
      return call_op(*function_binding(resolve_torch_path("torch.nn.functional.linear")), a, {});
    }
    if (type == "ReLU") {
      bool inplace = module_attr(mod, "inplace")->obj == Py_True;
      if (!inplace) return op("torch.relu");
      if (args.size() != 1 || !args[0]->is_tensor()) unsupported("ReLU(inplace=True) on a non-tensor");
      check_inplace_target(args[0], "relu");
      return mutate(args[0], add_node("relu", {args[0]->node}));
    }
    if (type == "SiLU" || type == "Hardswish" || type == "Hardsigmoid" || type == "LeakyReLU" || type == "ELU" ||
        type == "Softplus") {
      if (args.size() != 1 || !kwargs.empty()) unsupported(type + " called with extra arguments");
      static const std::unordered_map<std::string, std::pair<const char*, std::vector<const char*>>> fns = {
          {"SiLU", {"torch.nn.functional.silu", {}}},
          {"Hardswish", {"torch.nn.functional.hardswish", {}}},
          {"Hardsigmoid", {"torch.nn.functional.hardsigmoid", {}}},
          {"LeakyReLU", {"torch.nn.functional.leaky_relu", {"negative_slope"}}},
          {"ELU", {"torch.nn.functional.elu", {"alpha"}}},
          {"Softplus", {"torch.nn.functional.softplus", {"beta", "threshold"}}}};
      const auto& [fn, params] = fns.at(type);
      KwArgs kw;
      for (const char* p : params) kw.emplace_back(p, module_attr(mod, p));
      VarPtr r = call_op(*function_binding(resolve_torch_path(fn)), args, kw);
      PyObject* inplace = PyObject_GetAttrString(m, "inplace");
      if (!inplace) PyErr_Clear();
      bool in_place = inplace == Py_True;
      Py_XDECREF(inplace);
      if (!in_place) return r;
      if (!args[0]->is_tensor()) unsupported(type + "(inplace=True) on a non-tensor");
      out_.guards.add_equals(Source::attr(mod->source, "inplace"), Py_True);
      check_inplace_target(args[0], type);
      return mutate(args[0], r->node);
    }
    if (type == "LayerNorm") {
      std::vector<VarPtr> a = {args.at(0), module_attr(mod, "normalized_shape"), module_attr(mod, "weight"),
                               module_attr(mod, "bias"), module_attr(mod, "eps")};
      return call_op(*function_binding(resolve_torch_path("torch.nn.functional.layer_norm")), a, {});
    }
    if (type == "Embedding") {
      if (module_attr(mod, "max_norm")->obj != Py_None) unsupported("Embedding with max_norm renormalizes its weight in place");
      std::vector<VarPtr> a = {args.at(0), module_attr(mod, "weight"), module_attr(mod, "padding_idx")};
      return call_op(*function_binding(resolve_torch_path("torch.nn.functional.embedding")), a, {});
    }
    if (type == "Sigmoid") return op("torch.sigmoid");
    if (type == "Tanh") return op("torch.tanh");
    if (type == "Identity") return args.at(0);
    if (type == "Dropout") {
      if (train) unsupported("Dropout in training mode is random: not captured yet");
      return args.at(0);
    }
    if (type == "GELU") {
      VarPtr approx = module_attr(mod, "approximate");
      return call_op(*function_binding(resolve_torch_path("torch.nn.functional.gelu")), args, {{"approximate", approx}});
    }
    if (type == "Softmax" || type == "LogSoftmax") {
      VarPtr dim = module_attr(mod, "dim");
      if (dim->obj == Py_None) unsupported(type + " with dim=None");
      std::vector<VarPtr> a = {args.at(0), dim};
      return call_op(*function_binding(resolve_torch_path(type == "Softmax" ? "torch.softmax" : "torch.log_softmax")), a, {});
    }
    if (type == "Conv2d") {
      if (args.size() != 1 || !kwargs.empty()) unsupported("Conv2d called with extra arguments");
      VarPtr mode = module_attr(mod, "padding_mode");
      if (!PyUnicode_Check(mode->obj) || std::string(PyUnicode_AsUTF8(mode->obj)) != "zeros")
        unsupported("Conv2d with padding_mode other than 'zeros'");
      VarPtr padding = module_attr(mod, "padding");
      if (padding->is_const() && PyUnicode_Check(padding->obj)) unsupported("Conv2d with string padding");
      std::vector<VarPtr> a = {args[0], module_attr(mod, "weight"), module_attr(mod, "bias"), module_attr(mod, "stride"),
                               padding, module_attr(mod, "dilation"), module_attr(mod, "groups")};
      return call_op(*function_binding(resolve_torch_path("torch.nn.functional.conv2d")), a, {});
    }
    if (type == "BatchNorm2d" || type == "BatchNorm1d") {
      VarPtr mean = module_attr(mod, "running_mean"), var = module_attr(mod, "running_var");
      bool no_stats = mean->is_const() && mean->obj == Py_None;
      if (train || no_stats) unsupported(type + " in training mode (batch statistics) is not compiled yet");
      std::vector<VarPtr> a = {args.at(0), mean, var, module_attr(mod, "weight"), module_attr(mod, "bias")};
      return call_op(*function_binding(resolve_torch_path("torch.nn.functional.batch_norm")), a,
                     {{"eps", module_attr(mod, "eps")}});
    }
    if (type == "MaxPool2d") {
      if (module_attr(mod, "return_indices")->obj == Py_True) unsupported("MaxPool2d with return_indices");
      VarPtr stride = module_attr(mod, "stride");
      std::vector<VarPtr> a = {args.at(0), module_attr(mod, "kernel_size"), stride, module_attr(mod, "padding"),
                               module_attr(mod, "dilation"), module_attr(mod, "ceil_mode")};
      if (stride->is_const() && stride->obj == Py_None) a[2] = Var::tuple({});
      return call_op(*function_binding(resolve_torch_path("torch.nn.functional.max_pool2d")), a, {});
    }
    if (type == "AdaptiveAvgPool2d") {
      std::vector<VarPtr> a = {args.at(0), module_attr(mod, "output_size")};
      return call_op(*function_binding(resolve_torch_path("torch.nn.functional.adaptive_avg_pool2d")), a, {});
    }
    if (type == "Flatten") {
      std::vector<VarPtr> a = {args.at(0), module_attr(mod, "start_dim"), module_attr(mod, "end_dim")};
      return call_op(*function_binding(resolve_torch_path("torch.flatten")), a, {});
    }
    static PyObject* sequential_forward = [] {
      PyObject* nn = PyImport_ImportModule("torch.nn");
      PyObject* seq = nn ? PyObject_GetAttrString(nn, "Sequential") : nullptr;
      PyObject* fwd = seq ? PyObject_GetAttrString(seq, "forward") : nullptr;
      Py_XDECREF(seq);
      Py_XDECREF(nn);
      PyErr_Clear();
      return fwd;
    }();
    PyObject* own_forward = PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(m)), "forward");
    if (!own_forward) PyErr_Clear();
    Py_XDECREF(own_forward);
    if (type == "Sequential" || (own_forward && own_forward == sequential_forward)) {  // and subclasses that keep its forward
      PyObject* children = PyObject_GetAttrString(m, "_modules");
      if (!children || !PyDict_Check(children)) unsupported("Sequential without _modules");
      VarPtr x = args.at(0);
      PyObject *key, *value;
      Py_ssize_t pos = 0;
      out_.guards.add_length(Source::attr(mod->source, "_modules"), PyDict_Size(children));
      while (PyDict_Next(children, &pos, &key, &value)) {
        VarPtr child = module_attr(mod, PyUnicode_AsUTF8(key));
        x = call(child, {x}, {});
      }
      Py_DECREF(children);
      return x;
    }
    // Any other module: inline its forward, with the module as self.
    PyObject* forward = PyObject_GetAttrString(reinterpret_cast<PyObject*>(Py_TYPE(m)), "forward");
    if (!forward) PyErr_Clear();
    keep_.push_back(forward);
    if (!forward || !PyFunction_Check(forward)) unsupported("module " + type + " has no Python forward");
    // torch.nn's own modules with no rule above are inlined like user modules: their forwards
    // call torch functions, which become ops or extern calls.
    args.insert(args.begin(), mod);
    return inline_call(forward, nullptr, std::move(args), kwargs);
  }

  PyObject* resolve_torch_path(const std::string& path) {
    size_t dot = path.find('.');
    PyObject* obj = PyImport_ImportModule(path.substr(0, dot).c_str());
    while (obj && dot != std::string::npos) {
      size_t next = path.find('.', dot + 1);
      PyObject* child = PyObject_GetAttrString(obj, path.substr(dot + 1, next - dot - 1).c_str());
      Py_DECREF(obj);
      obj = child;
      dot = next;
    }
    if (!obj) {
      PyErr_Clear();
      unsupported("cannot resolve " + path);
    }
    keep_.push_back(obj);
    return obj;
  }

  // ---- attributes ----
  // ---- closures and functions made in the frame ----
  bool is_own_cell(int slot) const {
    auto* co = reinterpret_cast<PyCodeObject*>(code_);
    return slot < co->co_nlocalsplus - co->co_nfreevars;
  }

  // A free variable of a real closure (the root function's, or an inlined real function's).
  VarPtr read_free_var(const Instr& in) {
    auto* co = reinterpret_cast<PyCodeObject*>(code_);
    int first_free = co->co_nlocalsplus - co->co_nfreevars;
    if (in.arg < first_free) unsupported("read of an unbound cell variable");
    PyObject* closure = PyFunction_GET_CLOSURE(fn_);
    Py_ssize_t k = in.arg - first_free;
    PyObject* v = closure ? PyCell_GET(PyTuple_GET_ITEM(closure, k)) : nullptr;
    if (!v) unsupported("read of an empty closure cell");
    PyObject* name = PyTuple_GET_ITEM(co->co_localsplusnames, in.arg);
    SourcePtr src;
    if (!parent_) src = Source::closure(k, PyUnicode_AsUTF8(name));
    else if (fn_source_) src = Source::attr(Source::item(Source::attr(fn_source_, "__closure__"), k), "cell_contents");
    // A function reached through super() or a made function has no source of its own: its
    // cells (__class__ above all) are read as they are.
    else return Var::constant(v);
    return wrap(v, src);
  }

  // def / lambda / comprehension inside the frame. The real function object carries code,
  // globals and constant defaults; the cells stay trackers (their contents may be tensors).
  VarPtr make_function(const VarPtr& code, const VarPtr& defaults, const VarPtr& kwdefaults, const VarPtr& closure) {
    PyObject* co = const_obj(code, "code");
    if (!PyCode_Check(co)) unsupported("MAKE_FUNCTION without a code object");
    PyObject* f = PyFunction_New(co, globals_);
    if (!f) real(nullptr);
    VarPtr fv = Var::steal_constant(f);
    fv->kind = Var::Kind::Function;
    if (defaults && PyFunction_SetDefaults(f, const_obj(defaults, "default argument")) < 0) real(nullptr);
    if (kwdefaults && PyFunction_SetKwDefaults(f, const_obj(kwdefaults, "keyword default")) < 0) real(nullptr);
    fv->rebuildable = true;
    if (closure) {
      if (closure->kind != Var::Kind::Tuple) unsupported("malformed closure");
      PyObject* cells = PyTuple_New(static_cast<Py_ssize_t>(closure->items.size()));
      for (size_t i = 0; i < closure->items.size(); ++i) {
        const VarPtr& c = closure->items[i];
        if (c->kind != Var::Kind::Cell) unsupported("malformed closure cell");
        fv->items.push_back(c);
        const VarPtr& content = c->items[0];
        bool constant = content && (content->is_const() || content->kind == Var::Kind::Module);
        if (!constant) fv->rebuildable = false;
        PyTuple_SET_ITEM(cells, i, PyCell_New(constant ? content->obj : nullptr));
      }
      int rc = PyFunction_SetClosure(f, cells);
      Py_DECREF(cells);
      if (rc < 0) real(nullptr);
    }
    return fv;
  }

  void store_subscript(const VarPtr& container, const VarPtr& key, const VarPtr& value) {
    if (container->kind == Var::Kind::Dict && !container->source) {
      dict_set(container, const_obj(key, "dict key"), value);
      return;
    }
    if (container->kind == Var::Kind::List && !container->source && key->is_const() && PyLong_Check(key->obj)) {
      Py_ssize_t n = static_cast<Py_ssize_t>(container->items.size()), i = PyLong_AsSsize_t(key->obj);
      if (i < 0) i += n;
      if (i < 0 || i >= n) unsupported("list assignment index out of range");
      container->items[i] = value;
      return;
    }
    if (container->is_tensor()) {
      // x[idx] = v on a tensor only the graph sees: a copy with the assignment, which every
      // name of x then holds (like any in-place op)
      check_inplace_target(container, "indexed assignment");
      VarPtr r = torch_extern(functional_setitem(), "setitem", {container, key, value}, {});
      mutate(container, r->node);
      return;
    }
    if (container->is_const() && !container->source &&
        (PyList_CheckExact(container->obj) || PyDict_CheckExact(container->obj))) {
      // a list or dict made during capture by a Python call (list(x.shape)): nobody else holds it
      if (PyObject_SetItem(container->obj, const_obj(key, "key"), const_obj(value, "value")) < 0) real(nullptr);
      return;
    }
    unsupported("item assignment into an object the caller can see");
  }

  // super() and super(cls, self): a real super object that remembers the receiver's tracker,
  // so that super().forward(x) inlines the base class's function with the same `self`.
  VarPtr make_super(const std::vector<VarPtr>& args) {
    VarPtr self;
    PyObject* cls = nullptr;
    if (args.size() == 2) {
      cls = const_obj(args[0], "super() class");
      self = args[1];
    } else if (args.empty()) {
      auto* co = reinterpret_cast<PyCodeObject*>(code_);
      PyObject* frees = PyCode_GetFreevars(co);
      Py_ssize_t k = -1;
      for (Py_ssize_t i = 0; frees && i < PyTuple_GET_SIZE(frees); ++i)
        if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(frees, i), "__class__") == 0) k = i;
      Py_XDECREF(frees);
      PyObject* closure = PyFunction_GET_CLOSURE(fn_);
      if (k < 0 || !closure) unsupported("super() outside a method");
      cls = PyCell_GET(PyTuple_GET_ITEM(closure, k));
      self = locals_.empty() ? nullptr : locals_[0];
    } else {
      unsupported("super() with one argument");
    }
    if (!cls || !self || !(self->kind == Var::Kind::Module || self->is_const())) unsupported("super() of this receiver");
    VarPtr v = real(PyObject_CallFunctionObjArgs(builtin("super"), cls, self->obj, nullptr));
    v->self = self;
    return v;
  }

  VarPtr super_attr(const VarPtr& sup, const std::string& name) {
    PyObject* a = PyObject_GetAttrString(sup->obj, name.c_str());
    if (!a) return real(nullptr);
    if (PyMethod_Check(a) && PyFunction_Check(PyMethod_GET_FUNCTION(a))) {
      VarPtr m = Var::method(sup->self, name);
      m->obj = Py_NewRef(PyMethod_GET_FUNCTION(a));
      Py_DECREF(a);
      return m;
    }
    return Var::steal_constant(a);
  }

  VarPtr getattr(VarPtr base, const std::string& name) {
    if (base->is_const() && base->self && PyObject_TypeCheck(base->obj, &PySuper_Type)) return super_attr(base, name);
    if (base->is_tensor()) {
      const ir::TensorMeta& m = base->node->meta;
      if (name == "shape") return shape_tuple(m);
      if (name == "dtype") return Var::constant(torch_dtype_object(m.dtype));
      if (name == "device") return Var::constant(torch_device_object(m.device));
      if (name == "ndim") return Var::steal_constant(PyLong_FromLongLong(m.dim()));
      if (name == "is_cuda") return Var::constant(m.device.type == DeviceType::CUDA ? Py_True : Py_False);
      if (name == "T" || name == "mT") {
        std::vector<int64_t> perm;
        if (name == "T") for (int64_t i = m.dim(); i-- > 0;) perm.push_back(i);
        else {
          for (int64_t i = 0; i < m.dim(); ++i) perm.push_back(i);
          if (m.dim() < 2) unsupported("mT of a tensor with fewer than 2 dims");
          std::swap(perm[m.dim() - 1], perm[m.dim() - 2]);
        }
        ir::Attrs a;
        a.set("dims", perm);
        return Var::tensor(add_node("permute", {base->node}, a));
      }
      if (name == "requires_grad") return Var::constant(root()->needs_grad_.count(base->node) ? Py_True : Py_False);
      // kiln's tensors are dense, strided, plain: the layout flags models test
      if (name == "is_nested" || name == "is_sparse" || name == "is_quantized" || name == "is_meta" ||
          name == "is_mkldnn" || name == "is_complex_" )
        return Var::constant(Py_False);
      if (name == "layout") return Var::constant(resolve_torch("strided"));
      return Var::method(base, name);
    }
    if (base->kind == Var::Kind::Module) return module_attr(base, name.c_str());
    if (base->is_const() && PyDict_CheckExact(base->obj) &&
        (name == "items" || name == "keys" || name == "values" || name == "get" || name == "copy"))
      return Var::method(base, name);  // entries read through dict_entries, guarded
    if (base->is_const()) {
      PyObject* v = PyObject_GetAttrString(base->obj, name.c_str());
      if (!v) return real(nullptr);
      // Attributes of Python modules (torch.sin) are stable; other objects' are guarded, and so
      // are a module's mutable containers (a registry list someone may append to).
      bool container = PyList_Check(v) || PyDict_Check(v) || PyAnySet_Check(v);
      if (base->source && (!PyModule_Check(base->obj) || container)) {
        VarPtr r = wrap(v, Source::attr(base->source, name));
        Py_DECREF(v);
        return r;
      }
      return Var::steal_constant(v);
    }
    if (base->kind == Var::Kind::Tuple || base->kind == Var::Kind::List || base->kind == Var::Kind::Dict)
      return Var::method(base, name);
    unsupported("attribute " + name + " of a value");
  }

  // Methods of lists and tuples. A list only this frame can see changes in the trackers; one the
  // caller can see (a global, an argument) changes for real, so that call runs in Python.
  VarPtr call_sequence_method(const VarPtr& seq, const std::string& name, std::vector<VarPtr> args, const KwArgs& kwargs) {
    const bool list = seq->kind == Var::Kind::List;
    if (!kwargs.empty()) unsupported(name + "() with keyword arguments");
    static const char* mutating[] = {"append", "extend", "insert", "pop", "clear", "reverse", "remove", "sort"};
    bool mutates = std::any_of(std::begin(mutating), std::end(mutating), [&](const char* m) { return name == m; });
    if (mutates && !list) unsupported("tuple has no attribute " + name);
    if (mutates && seq->source) unsupported("list." + name + "() on a list the caller can see");
    auto& items = seq->items;
    if (name == "append" && args.size() == 1) {
      items.push_back(args[0]);
      return Var::constant(Py_None);
    }
    if (name == "extend" && args.size() == 1) {
      for (const VarPtr& v : items_of(args[0])) items.push_back(v);
      return Var::constant(Py_None);
    }
    if (name == "insert" && args.size() == 2 && args[0]->is_const() && PyLong_Check(args[0]->obj)) {
      Py_ssize_t n = static_cast<Py_ssize_t>(items.size()), i = PyLong_AsSsize_t(args[0]->obj);
      i = i < 0 ? std::max<Py_ssize_t>(0, i + n) : std::min(i, n);
      items.insert(items.begin() + i, args[1]);
      return Var::constant(Py_None);
    }
    if (name == "pop" && args.size() <= 1) {
      Py_ssize_t n = static_cast<Py_ssize_t>(items.size());
      Py_ssize_t i = args.empty() ? n - 1 : (args[0]->is_const() && PyLong_Check(args[0]->obj) ? PyLong_AsSsize_t(args[0]->obj) : -n - 1);
      if (i < 0) i += n;
      if (i < 0 || i >= n) unsupported("pop index out of range");
      VarPtr v = items[i];
      items.erase(items.begin() + i);
      return v;
    }
    if (name == "clear" && args.empty()) {
      items.clear();
      return Var::constant(Py_None);
    }
    if (name == "reverse" && args.empty()) {
      std::reverse(items.begin(), items.end());
      return Var::constant(Py_None);
    }
    if (name == "copy" && args.empty() && list) return Var::tuple(items, true);
    auto equal_at = [&](size_t i, const VarPtr& x) {
      if (items[i]->is_tensor() || x->is_tensor()) return items[i]->is_tensor() && x->is_tensor() && items[i]->node == x->node;
      int eq = PyObject_RichCompareBool(const_obj(items[i], "item"), const_obj(x, "item"), Py_EQ);
      if (eq < 0) real(nullptr);
      return eq == 1;
    };
    if ((name == "remove" || name == "index") && args.size() == 1) {
      for (size_t i = 0; i < items.size(); ++i)
        if (equal_at(i, args[0])) {
          if (name == "index") return Var::steal_constant(PyLong_FromSize_t(i));
          items.erase(items.begin() + i);
          return Var::constant(Py_None);
        }
      unsupported(std::string(list ? "list." : "tuple.") + name + "(x): x not in the sequence");
    }
    if (name == "count" && args.size() == 1) {
      size_t n = 0;
      for (size_t i = 0; i < items.size(); ++i) n += equal_at(i, args[0]);
      return Var::steal_constant(PyLong_FromSize_t(n));
    }
    if (name == "sort" && args.empty()) {
      // Sorting values known here: Python's own sort over them, then the trackers in that order.
      PyObject* vals = const_obj(seq, "list item");
      PyObject* order = PyList_New(0);
      for (Py_ssize_t i = 0; i < PySequence_Size(vals); ++i) {
        PyObject* pair = Py_BuildValue("(On)", PySequence_Fast_GET_ITEM(vals, i), i);
        PyList_Append(order, pair);
        Py_DECREF(pair);
      }
      keep_.push_back(order);
      if (PyList_Sort(order) < 0) real(nullptr);
      std::vector<VarPtr> sorted;
      for (Py_ssize_t i = 0; i < PyList_GET_SIZE(order); ++i)
        sorted.push_back(items[PyLong_AsSsize_t(PyTuple_GET_ITEM(PyList_GET_ITEM(order, i), 1))]);
      items = std::move(sorted);
      return Var::constant(Py_None);
    }
    unsupported(std::string(list ? "list." : "tuple.") + name + "() is not captured yet");
  }

  // ---- in-place updates ----
  // An in-place op on a tensor only the graph can see is the out-of-place op whose result
  // every name of that tensor now holds: the tracker is shared by all its aliases (locals,
  // containers), so rebinding it updates them all. Memory others can observe (inputs,
  // parameters, views and tensors with views) is not captured yet.
  void check_inplace_target(const VarPtr& a, const std::string& what) {
    const ir::Node* n = a->node;
    if (n->op_name() == "placeholder") unsupported("in-place " + what + " on an input mutates the caller's tensor: not captured yet");
    if (n->op->aliases() || n->attrs.get_bool("view")) unsupported("in-place " + what + " on a view: not captured yet");
    for (const ir::Node* u : n->users)
      if (u->op->aliases() || u->attrs.get_bool("view")) unsupported("in-place " + what + " on a tensor that has views: not captured yet");
  }

  VarPtr mutate(const VarPtr& a, ir::Node* result) {
    if (result->meta.dtype != a->node->meta.dtype || result->meta.sizes != a->node->meta.sizes) {
      // torch keeps the tensor's dtype and shape in place: a result that changes either is an error
      // there (or a cast), which eager reports.
      unsupported("in-place result of another dtype or shape");
    }
    a->node = result;
    return a;
  }

  // ---- operators ----
  VarPtr binary(const std::string& nb, VarPtr a, VarPtr b) {
    bool inplace = nb.rfind("NB_INPLACE_", 0) == 0;
    std::string base = inplace ? nb.substr(11) : nb.substr(3);
    if (a->is_tensor() || b->is_tensor()) {
      if (inplace && a->is_tensor()) check_inplace_target(a, base);
      static const std::unordered_map<std::string, std::string> ops = {
          {"ADD", "add"}, {"SUBTRACT", "sub"}, {"MULTIPLY", "mul"}, {"TRUE_DIVIDE", "div"},
          {"FLOOR_DIVIDE", "floor_divide"}, {"REMAINDER", "remainder"}, {"POWER", "pow"}, {"MATRIX_MULTIPLY", "matmul"}};
      auto it = ops.find(base);
      if (it == ops.end()) unsupported("operator " + base + " on tensors is not captured yet");
      if (a->kind == Var::Kind::Tuple || b->kind == Var::Kind::Tuple) unsupported("tensor operator with a tuple");
      ir::Node* r = add_node(it->second, {as_node(a, "operand"), as_node(b, "operand")});
      if (inplace && a->is_tensor()) return mutate(a, r);
      return Var::tensor(r);
    }
    const bool seq_a = a->kind == Var::Kind::Tuple || a->kind == Var::Kind::List;
    const bool seq_b = b->kind == Var::Kind::Tuple || b->kind == Var::Kind::List;
    if ((seq_a || seq_b) && !(a->is_const() && b->is_const())) {
      if (base == "ADD" && a->kind == b->kind) {  // (x,) + rest, [a] + [b]
        if (inplace && a->kind == Var::Kind::List) {
          if (a->source) unsupported("+= on a list the caller can see");
          for (const VarPtr& x : b->items) a->items.push_back(x);
          return a;
        }
        std::vector<VarPtr> items = a->items;
        items.insert(items.end(), b->items.begin(), b->items.end());
        return Var::tuple(std::move(items), a->kind == Var::Kind::List);
      }
      if (base == "MULTIPLY" && (seq_a != seq_b)) {  // [x] * 3
        const VarPtr& seq = seq_a ? a : b;
        PyObject* n = const_obj(seq_a ? b : a, "repeat count");
        if (!PyLong_Check(n)) unsupported("sequence repeated by a non-integer");
        std::vector<VarPtr> items;
        for (long k = 0; k < PyLong_AsLong(n); ++k) items.insert(items.end(), seq->items.begin(), seq->items.end());
        return Var::tuple(std::move(items), seq->kind == Var::Kind::List);
      }
    }
    static const std::unordered_map<std::string, binaryfunc> py = {
        {"ADD", PyNumber_Add}, {"SUBTRACT", PyNumber_Subtract}, {"MULTIPLY", PyNumber_Multiply},
        {"TRUE_DIVIDE", PyNumber_TrueDivide}, {"FLOOR_DIVIDE", PyNumber_FloorDivide}, {"REMAINDER", PyNumber_Remainder},
        {"AND", PyNumber_And}, {"OR", PyNumber_Or}, {"XOR", PyNumber_Xor}, {"LSHIFT", PyNumber_Lshift},
        {"RSHIFT", PyNumber_Rshift}, {"MATRIX_MULTIPLY", PyNumber_MatrixMultiply}};
    PyObject *x = const_obj(a, "operand"), *y = const_obj(b, "operand");
    if (base == "POWER") return real(PyNumber_Power(x, y, Py_None));
    auto it = py.find(base);
    if (it == py.end()) unsupported("operator " + nb);
    return real(it->second(x, y));
  }

  VarPtr compare(const std::string& op, VarPtr a, VarPtr b) {
    if (a->is_tensor() || b->is_tensor()) {
      static const std::unordered_map<std::string, std::string> ops = {{"<", "lt"}, {"<=", "le"}, {"==", "eq"},
                                                                       {"!=", "ne"}, {">", "gt"}, {">=", "ge"}};
      return Var::tensor(add_node(ops.at(op), {as_node(a, "operand"), as_node(b, "operand")}));
    }
    static const std::unordered_map<std::string, int> cmp = {{"<", Py_LT}, {"<=", Py_LE}, {"==", Py_EQ},
                                                            {"!=", Py_NE}, {">", Py_GT}, {">=", Py_GE}};
    return real(PyObject_RichCompare(const_obj(a, "operand"), const_obj(b, "operand"), cmp.at(op)));
  }

  bool truth(const VarPtr& v) {
    if (v->is_tensor()) unsupported("data-dependent branch on a tensor value");
    if (v->kind == Var::Kind::Tuple || v->kind == Var::Kind::List || v->kind == Var::Kind::Dict) return !v->items.empty();
    if (v->kind == Var::Kind::Module || v->kind == Var::Kind::Function) return true;
    int r = PyObject_IsTrue(const_obj(v, "condition"));
    if (r < 0) real(nullptr);
    return r == 1;
  }

  VarPtr subscript(VarPtr base, VarPtr index) {
    if (base->kind == Var::Kind::Tuple || base->kind == Var::Kind::List) {
      if (index->is_const() && PyLong_Check(index->obj)) {
        Py_ssize_t i = PyLong_AsSsize_t(index->obj), n = static_cast<Py_ssize_t>(base->items.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) unsupported("index out of range");
        return base->items[i];
      }
      if (index->is_const() && PySlice_Check(index->obj)) {
        Py_ssize_t start, stop, step, n = static_cast<Py_ssize_t>(base->items.size());
        if (PySlice_Unpack(index->obj, &start, &stop, &step) < 0) real(nullptr);
        Py_ssize_t len = PySlice_AdjustIndices(n, &start, &stop, step);
        std::vector<VarPtr> items;
        for (Py_ssize_t k = 0; k < len; ++k) items.push_back(base->items[start + k * step]);
        return Var::tuple(std::move(items), base->kind == Var::Kind::List);
      }
      unsupported("subscript of a container with a non-constant index");
    }
    if (base->kind == Var::Kind::Dict) {
      Py_ssize_t i = dict_find(base, const_obj(index, "dict key"));
      if (i < 0) unsupported("KeyError: a key the dict does not have");
      return base->items[i];
    }
    if (base->is_tensor()) return index_tensor(base, index);
    if (base->kind == Var::Kind::Module && index->is_const() && PyUnicode_Check(index->obj)) {
      module_children(base);  // ModuleDict["name"], ParameterDict["name"]
      return module_attr(base, PyUnicode_AsUTF8(index->obj));
    }
    if (base->kind == Var::Kind::Module && index->is_const() && PySlice_Check(index->obj)) {
      std::vector<std::string> names = module_keys(base);
      Py_ssize_t start, stop, step, n = static_cast<Py_ssize_t>(names.size());
      if (PySlice_Unpack(index->obj, &start, &stop, &step) < 0) real(nullptr);
      Py_ssize_t len = PySlice_AdjustIndices(n, &start, &stop, step);
      std::vector<VarPtr> items;
      for (Py_ssize_t k = 0; k < len; ++k) items.push_back(module_attr(base, names[start + k * step].c_str()));
      return Var::tuple(std::move(items), true);
    }
    if (base->kind == Var::Kind::Module) {
      // self.layers[i] on a ModuleList/Sequential: the child module, guarded like any other.
      if (!index->is_const() || !PyLong_Check(index->obj)) unsupported("module indexed by a non-integer");
      Py_ssize_t n = module_children(base), i = PyLong_AsSsize_t(index->obj);
      if (i < 0) i += n;
      if (i < 0 || i >= n) unsupported("module index out of range");
      PyObject* children = PyObject_GetAttrString(base->obj, "_modules");
      PyObject *key, *value;
      Py_ssize_t pos = 0, k = 0;
      std::string name;
      while (PyDict_Next(children, &pos, &key, &value))
        if (k++ == i) name = PyUnicode_AsUTF8(key);
      Py_DECREF(children);
      return module_attr(base, name.c_str());
    }
    PyObject* container = const_obj(base, "container");
    PyObject* key = const_obj(index, "index");
    PyObject* v = PyObject_GetItem(container, key);
    if (!v) return real(nullptr);
    // An item of a container read from the frame (a config dict, a list) is guarded itself.
    if (base->source && (PyDict_Check(container) || PyList_Check(container)) && !PySlice_Check(key)) {
      VarPtr r = wrap(v, Source::key_of(base->source, key));
      Py_DECREF(v);
      return r;
    }
    return Var::steal_constant(v);
  }

  // ---- graph breaks ----
  // Only the function kiln was asked to run breaks; a failure inside an inlined call surfaces
  // at the CALL of its outermost caller, which then runs that call in Python.
  static bool breakable(const Instr& in) {
    switch (in.op) {
      case OP_BINARY_SUBSCR:
      case OP_BINARY_SLICE:
      case OP_STORE_SUBSCR:
      case OP_STORE_SLICE:
      case OP_DELETE_SUBSCR:
      case OP_STORE_ATTR:
      case OP_BINARY_OP:
      case OP_CALL:
      case OP_POP_JUMP_IF_FALSE:
      case OP_POP_JUMP_IF_TRUE:
      case OP_POP_JUMP_FORWARD_IF_FALSE:
      case OP_POP_JUMP_FORWARD_IF_TRUE: return true;
      default: return false;
    }
  }

  // Whether normal control flow (exception handlers aside: 3.12 jumps back from a with
  // block's handler) can come back to instruction pc.
  static bool in_loop(const CodeInfo& ci, size_t pc) {
    std::vector<char> seen(ci.instrs.size(), 0);
    std::vector<size_t> work = {pc + 1};
    while (!work.empty()) {
      size_t i = work.back();
      work.pop_back();
      if (i >= ci.instrs.size() || seen[i]) continue;
      if (i == pc) return true;
      seen[i] = 1;
      const std::string& name = ci.opnames[i];
      const Instr& x = ci.instrs[i];
      bool jumps = name.find("JUMP") != std::string::npos || name == "FOR_ITER";
      if (jumps && x.jump_target >= 0) {
        auto t = ci.by_offset.find(x.jump_target);
        if (t != ci.by_offset.end()) work.push_back(t->second);
      }
      bool ends = name == "JUMP_FORWARD" || name == "JUMP_BACKWARD" || name == "JUMP_BACKWARD_NO_INTERRUPT" ||
                  name == "RETURN_VALUE" || name == "RETURN_CONST" || name == "RAISE_VARARGS" || name == "RERAISE";
      if (!ends) work.push_back(i + 1);
    }
    return false;
  }

  struct Snapshot {
    std::vector<VarPtr> stack, locals;
    std::vector<std::string> kwnames;
  };

  // Trackers are shared and updated in place (in-place ops, list appends), so a snapshot copies
  // them, keeping aliases among them aliases.
  static VarPtr clone(const VarPtr& v, std::unordered_map<const Var*, VarPtr>& memo) {
    if (!v) return v;
    switch (v->kind) {
      case Var::Kind::Const:
      case Var::Kind::Module:
      case Var::Kind::Function:
      case Var::Kind::Null: return v;
      default: break;
    }
    auto it = memo.find(v.get());
    if (it != memo.end()) return it->second;
    auto c = std::make_shared<Var>(Var{v->kind});
    memo[v.get()] = c;
    c->node = v->node;
    c->name = v->name;
    c->source = v->source;
    for (PyObject* k : v->keys) c->keys.push_back(Py_NewRef(k));
    for (const VarPtr& x : v->items) c->items.push_back(clone(x, memo));
    c->self = clone(v->self, memo);
    return c;
  }

  Snapshot snapshot() const {
    Snapshot s;
    std::unordered_map<const Var*, VarPtr> memo;
    for (const VarPtr& v : stack_) s.stack.push_back(clone(v, memo));
    for (const VarPtr& v : locals_) s.locals.push_back(clone(v, memo));
    s.kwnames = kwnames_;
    return s;
  }

  // How the runtime rebuilds a value of the frame at a break. A mutable container tracked by
  // one tracker becomes one object, however many names and stack slots hold it.
  OutSpec break_spec(const VarPtr& v) {
    OutSpec s = break_spec_of(v);
    if (s.kind == OutSpec::Kind::List || s.kind == OutSpec::Kind::Dict || s.kind == OutSpec::Kind::Copy) {
      auto [it, fresh] = break_memo_.emplace(v.get(), static_cast<int>(break_memo_.size()));
      s.memo = it->second;
    }
    return s;
  }

  OutSpec break_spec_of(const VarPtr& v) {
    OutSpec s;
    switch (v->kind) {
      case Var::Kind::Tensor: return output_spec(v);
      case Var::Kind::Tuple:
      case Var::Kind::List:
        // A container read from the frame must stay the caller's object.
        if (v->source) {
          s.kind = OutSpec::Kind::Source;
          s.source = v->source;
          return s;
        }
        s.kind = v->kind == Var::Kind::Tuple ? OutSpec::Kind::Tuple : OutSpec::Kind::List;
        for (auto& item : v->items) s.items.push_back(break_spec(item));
        return s;
      case Var::Kind::Const:
      case Var::Kind::Module:
        s.kind = !v->source && (PyDict_CheckExact(v->obj) || PyList_CheckExact(v->obj) || PySet_CheckExact(v->obj))
                     ? OutSpec::Kind::Copy
                     : OutSpec::Kind::Const;
        Py_INCREF(v->obj);
        s.value = v->obj;
        return s;
      case Var::Kind::Null: s.kind = OutSpec::Kind::Null; return s;
      case Var::Kind::Method:
        if (v->obj) {  // a base-class function reached through super(): bind it to the receiver
          if (!(v->self->kind == Var::Kind::Module || v->self->is_const())) unsupported("super() method of this receiver");
          s.kind = OutSpec::Kind::Const;
          s.value = PyMethod_New(v->obj, v->self->obj);
          return s;
        }
        s.kind = OutSpec::Kind::Method;
        s.value = PyUnicode_FromString(v->name.c_str());
        s.items.push_back(break_spec(v->self));
        return s;
      case Var::Kind::Iterator: unsupported("graph break inside a loop kiln unrolls");
      case Var::Kind::Dict:
        if (v->source) {
          s.kind = OutSpec::Kind::Source;
          s.source = v->source;
          return s;
        }
        return dict_spec(v, true);
      case Var::Kind::Cell:
        // A cell of the frame: the resume function makes a new one (MAKE_CELL) around this.
        if (!v->items[0]) unsupported("an empty closure cell at a graph break");
        return break_spec(v->items[0]);
      case Var::Kind::Function:
        if (!v->rebuildable) unsupported("a function closing over tensors at a graph break");
        s.kind = OutSpec::Kind::Const;
        s.value = Py_NewRef(v->obj);
        return s;
    }
    unsupported("a value kiln cannot rebuild at a graph break");
  }

  // Ends the capture at `in` with a graph break, if the frame can resume after it; false
  // leaves the original failure to end the capture (the whole call then runs eagerly).
  bool graph_break(const Instr& in, const CodeInfo& ci, size_t pc, const Snapshot& before, const std::string& why) {
    if (PyErr_Occurred()) PyErr_Clear();
    if (pc + 1 >= ci.instrs.size()) return false;
    if (in_loop(ci, pc)) return false;  // each iteration would resume anew
    if (in_exception_block(code_, in.offset)) return false;
    auto* co = reinterpret_cast<PyCodeObject*>(code_);
    const int nv = co->co_nlocals;
    for (int i = nv; i < co->co_nlocalsplus - co->co_nfreevars; ++i)
      if (before.locals[i]) return false;  // a bound cell: closures made before would lose it
    auto brk = std::make_unique<GraphBreak>();
    brk->reason = why;
    brk->location = location();
    size_t operands;
    if (in.op == OP_CALL) {
      brk->kind = GraphBreak::Kind::Call;
      operands = static_cast<size_t>(in.arg) + 2;
      if (!before.kwnames.empty()) {
        brk->kwnames = PyTuple_New(static_cast<Py_ssize_t>(before.kwnames.size()));
        for (size_t k = 0; k < before.kwnames.size(); ++k)
          PyTuple_SET_ITEM(brk->kwnames, k, PyUnicode_FromString(before.kwnames[k].c_str()));
      }
    } else if (in.op == OP_BINARY_SUBSCR || in.op == OP_BINARY_SLICE) {
      brk->kind = GraphBreak::Kind::Subscr;
      operands = in.op == OP_BINARY_SLICE ? 3 : 2;
    } else if (in.op == OP_STORE_SUBSCR || in.op == OP_STORE_SLICE) {
      brk->kind = GraphBreak::Kind::StoreSubscr;
      operands = in.op == OP_STORE_SLICE ? 4 : 3;
    } else if (in.op == OP_DELETE_SUBSCR) {
      brk->kind = GraphBreak::Kind::DeleteSubscr;
      operands = 2;
    } else if (in.op == OP_STORE_ATTR) {
      brk->kind = GraphBreak::Kind::StoreAttr;
      operands = 2;
      brk->name = Py_NewRef(in.argval);
    } else if (in.op == OP_BINARY_OP) {
      brk->kind = GraphBreak::Kind::BinaryOp;
      operands = 2;
      if (in.arg < 0 || static_cast<size_t>(in.arg) >= ci.nb_ops.size()) return false;
      brk->binary_op = ci.nb_ops[in.arg];
    } else {
      brk->kind = GraphBreak::Kind::Jump;
      operands = 1;
      if (before.stack.empty() || !before.stack.back()->is_tensor()) return false;
      brk->jump_if_true = in.op == OP_POP_JUMP_IF_TRUE || in.op == OP_POP_JUMP_FORWARD_IF_TRUE;
    }
    if (before.stack.size() < operands) return false;
    if (in.op == OP_CALL) {
      // super() without arguments reads its frame: it cannot run from outside one.
      const VarPtr& f = before.stack[before.stack.size() - operands];
      const VarPtr& g = before.stack[before.stack.size() - operands + 1];
      for (const VarPtr& c : {f, g})
        if (c->is_const() && c->obj == builtin("super")) return false;
    }
    const size_t below = before.stack.size() - operands;
    ResumeShape shape;
    try {
      for (size_t i = 0; i < before.stack.size(); ++i) {
        OutSpec spec = break_spec(before.stack[i]);
        if (i < below) {
          shape.stack_is_null.push_back(spec.kind == OutSpec::Kind::Null);
          brk->stack.push_back(std::move(spec));
        } else {
          brk->operands.push_back(std::move(spec));
        }
      }
      for (int i = 0; i < nv; ++i) {
        OutSpec spec;
        if (before.locals[i]) spec = break_spec(before.locals[i]);
        else spec.kind = OutSpec::Kind::Unbound;
        shape.local_unbound.push_back(spec.kind == OutSpec::Kind::Unbound);
        brk->locals.push_back(std::move(spec));
      }
    } catch (const Unsupported&) {
      return false;
    }
    std::vector<int> targets = {ci.instrs[pc + 1].offset};
    switch (brk->kind) {
      case GraphBreak::Kind::Call:
      case GraphBreak::Kind::Subscr:
      case GraphBreak::Kind::BinaryOp: shape.stack_is_null.push_back(false); break;  // the result
      case GraphBreak::Kind::Jump: targets.push_back(in.jump_target); break;
      default: break;
    }
    for (int t : targets) {
      std::string error;
      shape.offset = t;
      PyObject* f = make_resume_function(fn_, shape, error);
      if (!f) return false;
      brk->resume.push_back(f);
    }
    brk->memo_slots = static_cast<int>(break_memo_.size());
    out_.graph_break = std::move(brk);
    return true;
  }

  OutSpec dict_spec(const VarPtr& v, bool at_break) {
    OutSpec s;
    s.kind = OutSpec::Kind::Dict;
    s.value = PyTuple_New(static_cast<Py_ssize_t>(v->keys.size()));
    for (size_t i = 0; i < v->keys.size(); ++i) {
      PyTuple_SET_ITEM(s.value, i, Py_NewRef(v->keys[i]));
      s.items.push_back(at_break ? break_spec(v->items[i]) : output_spec(v->items[i]));
    }
    return s;
  }

  // x[...] with ints, slices, None and Ellipsis: a chain of select / slice / unsqueeze views.
  // Tensor and list indices (advanced indexing) are not captured yet.
  VarPtr index_tensor(const VarPtr& base, const VarPtr& index) {
    std::vector<VarPtr> parts = index->kind == Var::Kind::Tuple ? index->items : std::vector<VarPtr>{index};
    if (index->is_const() && PyTuple_Check(index->obj)) {
      parts.clear();
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(index->obj); ++i) parts.push_back(Var::constant(PyTuple_GET_ITEM(index->obj, i)));
    }
    int64_t consumed = 0;
    for (const VarPtr& p : parts) {
      if (!p->is_const()) {
        // advanced indexing (tensors, lists of tensors): torch's own __getitem__ as an extern
        static PyObject* getitem = PyObject_GetAttrString(resolve_torch("Tensor"), "__getitem__");
        return torch_extern(getitem, "Tensor.__getitem__", {base, index}, {});
      }
      PyObject* o = p->obj;
      if (o == Py_None || o == Py_Ellipsis) continue;
      if (PyBool_Check(o) || !(PyLong_Check(o) || PySlice_Check(o)))
        unsupported("indexing a tensor with a " + std::string(Py_TYPE(o)->tp_name) + " is not captured yet");
      ++consumed;
    }
    ir::Node* x = base->node;
    const int64_t rank = x->meta.dim();
    if (consumed > rank)
      unsupported("shape/dtype check of index failed: IndexError: too many indices for tensor of dimension " + std::to_string(rank));
    int64_t dim = 0;
    bool seen_ellipsis = false;
    for (const VarPtr& p : parts) {
      PyObject* o = p->obj;
      if (o == Py_Ellipsis) {
        if (seen_ellipsis) unsupported("an index can only have a single ellipsis");
        seen_ellipsis = true;
        dim += rank - consumed;
        continue;
      }
      ir::Attrs a;
      a.set("dim", dim);
      if (o == Py_None) {
        x = add_node("unsqueeze", {x}, a);
        ++dim;
      } else if (PyLong_Check(o)) {
        a.set("index", static_cast<int64_t>(PyLong_AsLongLong(o)));
        x = add_node("select", {x}, a);
      } else {
        auto* sl = reinterpret_cast<PySliceObject*>(o);
        auto attr = [&](PyObject* v, const char* k) {
          if (v == Py_None) return;
          if (!PyLong_Check(v)) unsupported("slice bounds must be integers");
          a.set(k, static_cast<int64_t>(PyLong_AsLongLong(v)));
        };
        attr(sl->start, "start");
        attr(sl->stop, "end");
        attr(sl->step, "step");
        bool whole = sl->start == Py_None && sl->stop == Py_None && sl->step == Py_None;
        if (!whole) x = add_node("slice", {x}, a);
        ++dim;
      }
    }
    return Var::tensor(x);
  }

  // A torch operator with no registry entry: an extern `torch_call` node in the graph. Its
  // result's layout comes from running it on meta tensors now; the runtime calls it for real.
  // nullptr: `f` is a Python function whose result is not tensors (the caller inlines it).
  VarPtr torch_extern(PyObject* f, const std::string& name, const std::vector<VarPtr>& args, const KwArgs& kwargs) {
    std::string leaf = name.substr(name.rfind('.') + 1);
    // Random draws (their order against eager's RNG stream matters), device moves, data reads
    // and autograd state stay in Python.
    static const char* random[] = {"rand", "dropout", "bernoulli", "normal", "multinomial", "poisson", "exponential"};
    static const char* refused[] = {"empty", "item", "tolist", "numpy", "to", "cuda", "cpu", "type", "data_ptr",
                                    "backward", "register_hook", "requires_grad", "detach", "set_", "share_memory",
                                    "pin_memory", "new_empty"};
    for (const char* r : random)
      if (leaf.find(r) != std::string::npos) unsupported("call to " + name + " draws random numbers: not captured yet");
    for (const char* r : refused)
      if (leaf == r) unsupported("call to " + name + " is not captured (device, data or autograd state)");
    bool dunder = leaf.size() > 4 && leaf.rfind("__", 0) == 0 && leaf.substr(leaf.size() - 2) == "__";
    if (!leaf.empty() && leaf.back() == '_' && !dunder) unsupported("in-place " + name + " is not captured yet");
    for (auto& [k, v] : kwargs)
      if (k == "out") unsupported(name + "(out=...) is not captured");
    std::vector<ir::Node*> inputs;
    std::function<PyObject*(const VarPtr&)> tmpl = [&](const VarPtr& v) -> PyObject* {
      switch (v->kind) {
        case Var::Kind::Tensor:
          inputs.push_back(v->node);
          return tensor_slot(static_cast<int>(inputs.size()) - 1);
        case Var::Kind::Tuple:
        case Var::Kind::List: {
          PyObject* t = v->kind == Var::Kind::Tuple ? PyTuple_New(static_cast<Py_ssize_t>(v->items.size()))
                                                    : PyList_New(static_cast<Py_ssize_t>(v->items.size()));
          for (size_t i = 0; i < v->items.size(); ++i) {
            PyObject* item = tmpl(v->items[i]);
            if (v->kind == Var::Kind::Tuple) PyTuple_SET_ITEM(t, i, item);
            else PyList_SET_ITEM(t, i, item);
          }
          return t;
        }
        case Var::Kind::Const: return Py_NewRef(v->obj);
        default: unsupported("call to " + name + " with an argument kiln cannot pass");
      }
    };
    PyObject* targs = PyTuple_New(static_cast<Py_ssize_t>(args.size()));
    keep_.push_back(targs);
    for (size_t i = 0; i < args.size(); ++i) PyTuple_SET_ITEM(targs, i, tmpl(args[i]));
    PyObject* tkw = nullptr;
    if (!kwargs.empty()) {
      tkw = PyDict_New();
      keep_.push_back(tkw);
      for (auto& [k, v] : kwargs) {
        PyObject* item = tmpl(v);
        PyDict_SetItemString(tkw, k.c_str(), item);
        Py_DECREF(item);
      }
    }
    if (inputs.empty()) unsupported("call to " + name + " without tensor arguments");
    // The layout of the result: the operator on meta tensors of the inputs' layouts.
    static PyObject* empty_strided = resolve_torch("empty_strided");
    std::vector<PyObject*> metas;
    auto drop_metas = [&] {
      for (PyObject* m : metas) Py_DECREF(m);
    };
    for (ir::Node* n : inputs) {
      std::vector<int64_t> sizes, strides;
      for (const auto& e : n->meta.sizes) sizes.push_back(e.as_const().value_or(-1));
      for (const auto& e : n->meta.strides) strides.push_back(e.as_const().value_or(-1));
      PyObject* sz = PyTuple_New(static_cast<Py_ssize_t>(sizes.size()));
      PyObject* st = PyTuple_New(static_cast<Py_ssize_t>(strides.size()));
      for (size_t i = 0; i < sizes.size(); ++i) PyTuple_SET_ITEM(sz, i, PyLong_FromLongLong(sizes[i]));
      for (size_t i = 0; i < strides.size(); ++i) PyTuple_SET_ITEM(st, i, PyLong_FromLongLong(strides[i]));
      PyObject* kw = Py_BuildValue("{s:O,s:s}", "dtype", torch_dtype_object(n->meta.dtype), "device", "meta");
      PyObject* a = PyTuple_Pack(2, sz, st);
      PyObject* m = PyObject_Call(empty_strided, a, kw);
      Py_DECREF(a);
      Py_DECREF(kw);
      Py_DECREF(sz);
      Py_DECREF(st);
      if (!m) {
        drop_metas();
        real(nullptr);
      }
      metas.push_back(m);
    }
    PyObject* margs = substitute(targs, metas.data());
    PyObject* mkw = tkw ? substitute(tkw, metas.data()) : nullptr;
    PyObject* r = PyObject_Call(f, margs, mkw);
    Py_DECREF(margs);
    Py_XDECREF(mkw);
    drop_metas();
    if (!r) {
      PyErr_Clear();  // no meta kernel, or an error eager raises itself when the call runs there
      unsupported("call to " + name + " (no layout from meta tensors)");
    }
    keep_.push_back(r);
    auto all_tensors = [&] {
      if (!PyTuple_Check(r)) return is_tensor(r);
      for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(r); ++i)
        if (!is_tensor(PyTuple_GET_ITEM(r, i))) return false;
      return PyTuple_GET_SIZE(r) > 0;
    };
    if (!all_tensors() && PyFunction_Check(f)) return nullptr;  // the caller inlines it instead
    std::vector<PyObject*> results;
    const bool tuple = PyTuple_Check(r);
    if (tuple) for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(r); ++i) results.push_back(PyTuple_GET_ITEM(r, i));
    else results.push_back(r);
    std::vector<VarPtr> outs;
    for (size_t k = 0; k < results.size(); ++k) {
      TensorInfo info;
      std::string why;
      if (!is_tensor(results[k]) || !tensor_info(results[k], info, why)) unsupported(name + " returns something other than tensors");
      ir::Attrs a;
      a.set("fn", static_cast<int64_t>(register_torch_call(f, targs, tkw, tuple ? static_cast<int>(k) : -1)));
      a.set("target", name);
      a.set("out_sizes", info.sizes);
      a.set("out_strides", info.strides);
      a.set("out_dtype", info.dtype);
      PyObject* is_view = PyObject_CallMethod(results[k], "_is_view", nullptr);
      if (is_view == Py_True) a.set("view", true);  // in-place updates must not go through it
      Py_XDECREF(is_view);
      PyErr_Clear();
      outs.push_back(Var::tensor(add_node("torch_call", inputs, a)));
    }
    if (!tuple) return outs[0];
    return Var::tuple(std::move(outs));
  }

  // ---- output ----
  OutSpec output_spec(const VarPtr& v) {
    OutSpec s;
    switch (v->kind) {
      case Var::Kind::Tensor: {
        if (root()->needs_grad_.count(v->node) && v->node->op_name() != "placeholder")
          unsupported("a result requires grad (its inputs do, and grad mode is on): kiln does not build backward graphs yet (AOTAutograd is a later stage); run under torch.no_grad() or torch.inference_mode()");
        auto& outs = g_->outputs();
        auto it = std::find(outs.begin(), outs.end(), v->node);
        s.kind = OutSpec::Kind::Graph;
        s.index = static_cast<int>(it - outs.begin());
        if (it == outs.end()) outs.push_back(v->node);
        return s;
      }
      case Var::Kind::Tuple:
      case Var::Kind::List:
        if (v->source) {  // the caller's own list or tuple, unchanged
          s.kind = OutSpec::Kind::Source;
          s.source = v->source;
          return s;
        }
        s.kind = v->kind == Var::Kind::Tuple ? OutSpec::Kind::Tuple : OutSpec::Kind::List;
        for (auto& item : v->items) s.items.push_back(output_spec(item));
        return s;
      case Var::Kind::Const:
        s.kind = OutSpec::Kind::Const;
        Py_INCREF(v->obj);
        s.value = v->obj;
        return s;
      case Var::Kind::Dict:
        if (v->source) {
          s.kind = OutSpec::Kind::Source;
          s.source = v->source;
          return s;
        }
        return dict_spec(v, false);
      case Var::Kind::Function:
        if (!v->rebuildable) unsupported("returns a function closing over tensors");
        s.kind = OutSpec::Kind::Const;
        s.value = Py_NewRef(v->obj);
        return s;
      default: unsupported("returns a value kiln cannot rebuild");
    }
  }

  // ---- the dispatch ----
  int step(const Instr& in, const CodeInfo& ci) {
    switch (in.op) {
      case OP_NOP:
      case OP_RESUME:
      case OP_CACHE:
      case OP_EXTENDED_ARG:
      case OP_PRECALL:
      case OP_COPY_FREE_VARS: return -1;  // free variables are read lazily, or set by the caller
      case OP_MAKE_CELL: locals_.at(in.arg) = Var::cell(locals_.at(in.arg)); return -1;
      case OP_LOAD_CLOSURE: {
        VarPtr& slot = locals_.at(in.arg);
        if (!slot) slot = Var::cell(read_free_var(in));  // a free variable passed on to an inner function
        if (slot->kind != Var::Kind::Cell) slot = Var::cell(slot);
        push(slot);
        return -1;
      }
      case OP_LOAD_FAST:
      case OP_LOAD_FAST_CHECK:
      case OP_LOAD_FAST_AND_CLEAR: {
        VarPtr v = locals_.at(in.arg);
        if (!v) {
          if (in.op == OP_LOAD_FAST_AND_CLEAR) v = Var::null();
          else unsupported("read of an unbound local");
        }
        if (in.op == OP_LOAD_FAST_AND_CLEAR) locals_[in.arg] = nullptr;
        push(v);
        return -1;
      }
      case OP_STORE_FAST: locals_.at(in.arg) = pop(); return -1;
      case OP_LOAD_DEREF: {
        // Cells made in the frame hold their content; free variables of a real closure are
        // read (and guarded) on first use.
        VarPtr& slot = locals_.at(in.arg);
        if (!slot) slot = read_free_var(in);
        VarPtr v = slot->kind == Var::Kind::Cell ? slot->items[0] : slot;
        if (!v) unsupported("read of an empty closure cell");
        push(v);
        return -1;
      }
      case OP_STORE_DEREF: {
        VarPtr& slot = locals_.at(in.arg);
        if (slot && slot->kind == Var::Kind::Cell) {
          if (!is_own_cell(in.arg) && !parent_) unsupported("assignment to a closure variable (nonlocal)");
          slot->items[0] = pop();
          return -1;
        }
        if (!is_own_cell(in.arg)) unsupported("assignment to a closure variable (nonlocal)");
        slot = pop();
        return -1;
      }
      case OP_DELETE_DEREF: unsupported("del of a closure variable");
      case OP_MAKE_FUNCTION: {
        VarPtr code = pop();
        VarPtr closure = (in.arg & 0x08) ? pop() : nullptr;
        if (in.arg & 0x04) pop();  // annotations
        VarPtr kwdefaults = (in.arg & 0x02) ? pop() : nullptr;
        VarPtr defaults = (in.arg & 0x01) ? pop() : nullptr;
        push(make_function(code, defaults, kwdefaults, closure));
        return -1;
      }
      case OP_RETURN_GENERATOR: push(Var::constant(Py_None)); return -1;
      case OP_YIELD_VALUE:
        yields_.push_back(pop());
        push(Var::constant(Py_None));  // what send() would pass in
        return -1;
      case OP_BEFORE_WITH: {
        VarPtr ctx = pop();
        if (ctx->name != "grad_mode") unsupported("with of a context manager other than torch.no_grad/enable_grad/inference_mode/set_grad_enabled");
        VarPtr exit = Var::constant(Py_None);
        exit->name = "grad_mode_exit";
        exit->self = Var::constant(root()->grad_mode_ ? Py_True : Py_False);
        root()->grad_mode_ = ctx->obj == Py_True;
        push(exit);
        push(Var::constant(Py_None));
        return -1;
      }
      case OP_FORMAT_VALUE: {
        VarPtr spec = (in.arg & 0x04) ? pop() : nullptr;
        VarPtr v = pop();
        PyObject* o = const_obj(v, "formatted value");
        PyObject* conv = nullptr;
        switch (in.arg & 0x03) {
          case 1: conv = PyObject_Str(o); break;
          case 2: conv = PyObject_Repr(o); break;
          case 3: conv = PyObject_ASCII(o); break;
          default: conv = Py_NewRef(o);
        }
        if (!conv) real(nullptr);
        PyObject* r = PyObject_Format(conv, spec ? const_obj(spec, "format spec") : nullptr);
        Py_DECREF(conv);
        push(real(r));
        return -1;
      }
      case OP_BUILD_STRING: {
        std::vector<VarPtr> parts(in.arg);
        for (int i = in.arg - 1; i >= 0; --i) parts[i] = pop();
        PyObject* list = PyList_New(in.arg);
        for (int i = 0; i < in.arg; ++i) PyList_SET_ITEM(list, i, Py_NewRef(const_obj(parts[i], "string")));
        PyObject* empty = PyUnicode_FromString("");
        PyObject* r = PyUnicode_Join(empty, list);
        Py_DECREF(empty);
        Py_DECREF(list);
        push(real(r));
        return -1;
      }
      case OP_JUMP_IF_TRUE_OR_POP:
      case OP_JUMP_IF_FALSE_OR_POP: {
        bool t = truth(peek(1));
        if (t == (in.op == OP_JUMP_IF_TRUE_OR_POP)) return in.jump_target;
        pop();
        return -1;
      }
      case OP_UNPACK_EX: {
        int before = in.arg & 0xff, after = in.arg >> 8;
        VarPtr seq = pop();
        std::vector<VarPtr> items = seq->kind == Var::Kind::Tuple || seq->kind == Var::Kind::List ? seq->items : items_of(seq);
        if (static_cast<int>(items.size()) < before + after) unsupported("not enough values to unpack");
        std::vector<VarPtr> out(items.begin(), items.begin() + before);
        out.push_back(Var::tuple(std::vector<VarPtr>(items.begin() + before, items.end() - after), true));
        out.insert(out.end(), items.end() - after, items.end());
        for (auto it = out.rbegin(); it != out.rend(); ++it) push(*it);
        return -1;
      }
      case OP_STORE_SUBSCR: {
        VarPtr key = pop(), container = pop(), value = pop();
        store_subscript(container, key, value);
        return -1;
      }
      case OP_BUILD_SET: {
        std::vector<VarPtr> items(in.arg);
        for (int i = in.arg - 1; i >= 0; --i) items[i] = pop();
        PyObject* set = PySet_New(nullptr);
        for (auto& v : items)
          if (PySet_Add(set, const_obj(v, "set item")) < 0) {
            Py_DECREF(set);
            real(nullptr);
          }
        push(Var::steal_constant(set));
        return -1;
      }
      case OP_SET_ADD:
      case OP_SET_UPDATE: {
        VarPtr v = pop();
        VarPtr& set = peek(in.arg);
        if (!set->is_const() || !PySet_Check(set->obj) || set->source) unsupported("update of a set the caller can see");
        int rc;
        if (in.op == OP_SET_ADD) {
          rc = PySet_Add(set->obj, const_obj(v, "set item"));
        } else {
          rc = 0;
          for (const VarPtr& x : items_of(v))
            if (PySet_Add(set->obj, const_obj(x, "set item")) < 0) rc = -1;
        }
        if (rc < 0) real(nullptr);
        return -1;
      }
      case OP_MAP_ADD: {
        VarPtr value = pop(), key = pop();
        VarPtr& d = peek(in.arg);
        if (d->kind != Var::Kind::Dict) unsupported("dict comprehension into a non-dict");
        dict_set(d, const_obj(key, "dict key"), value);
        return -1;
      }
      case OP_LOAD_ASSERTION_ERROR: unsupported("an assert fails (or depends on tensor data): eager raises");
      case OP_RAISE_VARARGS: unsupported("raise: eager raises the exception");
      case OP_STORE_ATTR: unsupported("attribute assignment on an object the caller can see");
      case OP_STORE_SLICE: {
        VarPtr stop = pop(), start = pop(), container = pop(), value = pop();
        PyObject* sl = PySlice_New(const_obj(start, "slice"), const_obj(stop, "slice"), nullptr);
        store_subscript(container, real(sl), value);
        return -1;
      }
      case OP_DELETE_SUBSCR: {
        VarPtr key = pop(), container = pop();
        if (container->kind == Var::Kind::Dict && !container->source) {
          Py_ssize_t i = dict_find(container, const_obj(key, "dict key"));
          if (i < 0) unsupported("KeyError in del");
          Py_DECREF(container->keys[i]);
          container->keys.erase(container->keys.begin() + i);
          container->items.erase(container->items.begin() + i);
          return -1;
        }
        if (container->kind == Var::Kind::List && !container->source && key->is_const() && PyLong_Check(key->obj)) {
          Py_ssize_t n = static_cast<Py_ssize_t>(container->items.size()), i = PyLong_AsSsize_t(key->obj);
          if (i < 0) i += n;
          if (i < 0 || i >= n) unsupported("list index out of range in del");
          container->items.erase(container->items.begin() + i);
          return -1;
        }
        unsupported("del of an item of an object the caller can see");
      }
      case OP_DELETE_FAST: locals_.at(in.arg) = nullptr; return -1;
      case OP_LOAD_CONST: push(Var::constant(in.argval)); return -1;
      case OP_RETURN_CONST: return_value_ = Var::constant(in.argval); return kReturn;
      case OP_RETURN_VALUE: return_value_ = pop(); return kReturn;
      case OP_PUSH_NULL: push(Var::null()); return -1;
      case OP_LOAD_GLOBAL: {
        if (in.arg & 1) push(Var::null());
        std::string name = PyUnicode_AsUTF8(in.argval);
        PyObject* v = PyDict_GetItemString(globals_, name.c_str());
        if (!v) v = PyDict_GetItemString(builtins_, name.c_str());
        if (!v) unsupported("NameError: name '" + name + "' is not defined");
        push(wrap(v, Source::global(name, parent_ ? globals_ : nullptr)));
        return -1;
      }
      case OP_LOAD_ATTR:
      case OP_LOAD_METHOD: {
        std::string name = PyUnicode_AsUTF8(in.argval);
        bool method = in.op == OP_LOAD_METHOD || (PY_VERSION_HEX >= 0x030C0000 && (in.arg & 1));
        VarPtr base = pop();
        VarPtr attr = getattr(base, name);
        if (method) {
          push(Var::null());  // kiln resolves methods to bound callables, so the slot is NULL
        }
        push(attr);
        return -1;
      }
      case OP_KW_NAMES: {
        // The names tuple is co_consts[arg] (dis leaves argval unresolved on 3.11).
        kwnames_.clear();
        PyObject* t = PyTuple_GetItem(reinterpret_cast<PyCodeObject*>(code_)->co_consts, in.arg);
        if (!t || !PyTuple_Check(t)) unsupported("malformed KW_NAMES");
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(t); ++i) kwnames_.push_back(PyUnicode_AsUTF8(PyTuple_GET_ITEM(t, i)));
        return -1;
      }
      case OP_CALL: {
        int argc = in.arg;
        std::vector<VarPtr> args(argc);
        for (int i = argc - 1; i >= 0; --i) args[i] = pop();
        VarPtr second = pop(), first = pop();
        VarPtr fn;
        if (first->kind == Var::Kind::Null) fn = second;
        else {
          fn = first;
          args.insert(args.begin(), second);
        }
        KwArgs kwargs;
        size_t nkw = kwnames_.size();
        if (nkw > args.size()) unsupported("malformed call");
        for (size_t k = 0; k < nkw; ++k) kwargs.emplace_back(kwnames_[k], args[args.size() - nkw + k]);
        args.resize(args.size() - nkw);
        kwnames_.clear();
        push(call(fn, std::move(args), std::move(kwargs)));
        return -1;
      }
      case OP_LOAD_SUPER_ATTR: {
        VarPtr self = pop(), cls = pop();
        pop();  // the global `super`
        VarPtr attr = super_attr(make_super({cls, self}), PyUnicode_AsUTF8(in.argval));
        if (in.arg & 1) push(Var::null());
        push(attr);
        return -1;
      }
      case OP_BUILD_MAP: {
        std::vector<VarPtr> kv(2 * in.arg);
        for (int i = 2 * in.arg - 1; i >= 0; --i) kv[i] = pop();
        VarPtr d = Var::dict();
        for (int i = 0; i < in.arg; ++i) dict_set(d, const_obj(kv[2 * i], "dict key"), kv[2 * i + 1]);
        push(d);
        return -1;
      }
      case OP_BUILD_CONST_KEY_MAP: {
        VarPtr keys = pop();
        std::vector<VarPtr> values(in.arg);
        for (int i = in.arg - 1; i >= 0; --i) values[i] = pop();
        PyObject* k = const_obj(keys, "dict keys");
        if (!PyTuple_Check(k) || PyTuple_GET_SIZE(k) != in.arg) unsupported("malformed BUILD_CONST_KEY_MAP");
        VarPtr d = Var::dict();
        for (int i = 0; i < in.arg; ++i) dict_set(d, PyTuple_GET_ITEM(k, i), values[i]);
        push(d);
        return -1;
      }
      case OP_DICT_MERGE:
      case OP_DICT_UPDATE: {
        VarPtr update = pop();
        VarPtr& target = peek(in.arg);
        if (target->kind != Var::Kind::Dict || !is_dict(update)) unsupported("dict merge of a non-dict");
        for (auto& [k, v] : dict_entries(update)) {
          if (in.op == OP_DICT_MERGE && dict_find(target, k) >= 0) unsupported("got multiple values for a keyword argument");
          dict_set(target, k, v);
        }
        return -1;
      }
      case OP_CALL_FUNCTION_EX: {
        // f(*args) and f(*args, **kwargs): the sequence and the dict must be known here.
        KwArgs kwargs;
        if (in.arg & 1) {
          VarPtr kw = pop();
          if (!is_dict(kw)) unsupported("** of a non-dict");
          for (auto& [k, v] : dict_entries(kw)) {
            if (!PyUnicode_Check(k)) unsupported("keywords must be strings");
            kwargs.emplace_back(PyUnicode_AsUTF8(k), v);
          }
        }
        VarPtr seq = pop();
        std::vector<VarPtr> args;
        if (seq->kind == Var::Kind::Tuple || seq->kind == Var::Kind::List) {
          args = seq->items;
        } else {
          PyObject* fast = PySequence_Fast(const_obj(seq, "*args"), "not a sequence");
          if (!fast) real(nullptr);
          for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i)
            args.push_back(Var::constant(PySequence_Fast_GET_ITEM(fast, i)));
          Py_DECREF(fast);
        }
        VarPtr fn = pop();
        if (!stack_.empty() && stack_.back()->kind == Var::Kind::Null) pop();
        push(call(fn, std::move(args), std::move(kwargs)));
        return -1;
      }
      case OP_BINARY_OP: {
        VarPtr b = pop(), a = pop();
        if (in.arg < 0 || static_cast<size_t>(in.arg) >= ci.nb_ops.size()) unsupported("unknown BINARY_OP");
        push(binary(ci.nb_ops[in.arg], a, b));
        return -1;
      }
      case OP_COMPARE_OP: {
        VarPtr b = pop(), a = pop();
        push(compare(PyUnicode_AsUTF8(in.argval), a, b));
        return -1;
      }
      case OP_IS_OP: {
        VarPtr b = pop(), a = pop();
        bool same;
        if (a->is_const() && b->is_const()) same = a->obj == b->obj;
        else if (a->is_tensor() && b->is_tensor()) same = a->node == b->node;
        else same = false;  // a tensor is never None, a module never a number
        push(Var::constant((same != (in.arg == 1)) ? Py_True : Py_False));
        return -1;
      }
      case OP_CONTAINS_OP: {
        VarPtr b = pop(), a = pop();
        if (b->kind == Var::Kind::Module) {
          std::vector<std::string> keys = module_keys(b);
          std::string k = PyUnicode_Check(const_obj(a, "key")) ? PyUnicode_AsUTF8(a->obj) : "";
          bool found = std::find(keys.begin(), keys.end(), k) != keys.end();
          push(Var::constant((found != (in.arg == 1)) ? Py_True : Py_False));
          return -1;
        }
        if (b->kind == Var::Kind::Dict || b->kind == Var::Kind::Tuple || b->kind == Var::Kind::List) {
          bool found = false;
          if (b->kind == Var::Kind::Dict) {
            found = dict_find(b, const_obj(a, "key")) >= 0;
          } else {
            for (const VarPtr& x : b->items) {
              if (x->is_tensor() || a->is_tensor()) {
                if (x->is_tensor() && a->is_tensor() && x->node == a->node) found = true;
                else if (x->is_tensor() != a->is_tensor()) continue;
                else unsupported("`in` comparing tensors by value");
              } else {
                int eq = PyObject_RichCompareBool(const_obj(x, "item"), const_obj(a, "item"), Py_EQ);
                if (eq < 0) real(nullptr);
                found = found || eq == 1;
              }
            }
          }
          push(Var::constant((found != (in.arg == 1)) ? Py_True : Py_False));
          return -1;
        }
        int r = PySequence_Contains(const_obj(b, "container"), const_obj(a, "item"));
        if (r < 0) real(nullptr);
        push(Var::constant(((r == 1) != (in.arg == 1)) ? Py_True : Py_False));
        return -1;
      }
      case OP_UNARY_NEGATIVE: {
        VarPtr a = pop();
        if (a->is_tensor()) push(Var::tensor(add_node("neg", {a->node})));
        else push(real(PyNumber_Negative(const_obj(a, "operand"))));
        return -1;
      }
      case OP_UNARY_POSITIVE: {
        VarPtr a = pop();
        if (!a->is_tensor()) a = real(PyNumber_Positive(const_obj(a, "operand")));
        push(a);
        return -1;
      }
      case OP_UNARY_NOT: push(Var::constant(truth(pop()) ? Py_False : Py_True)); return -1;
      case OP_UNARY_INVERT: {
        VarPtr a = pop();
        if (a->is_tensor()) {
          if (a->node->meta.dtype != DType::Bool) unsupported("bitwise not of an integer tensor");
          push(Var::tensor(add_node("logical_not", {a->node})));
        } else {
          push(real(PyNumber_Invert(const_obj(a, "operand"))));
        }
        return -1;
      }
      case OP_CALL_INTRINSIC_1: {
        const std::string& n = in.argrepr;
        if (n == "INTRINSIC_UNARY_POSITIVE") {
          VarPtr a = pop();
          if (!a->is_tensor()) a = real(PyNumber_Positive(const_obj(a, "operand")));
          push(a);
          return -1;
        }
        if (n == "INTRINSIC_LIST_TO_TUPLE") {
          VarPtr a = pop();
          push(Var::tuple(a->items));
          return -1;
        }
        unsupported("intrinsic " + n);
      }
      case OP_BUILD_TUPLE:
      case OP_BUILD_LIST: {
        std::vector<VarPtr> items(in.arg);
        for (int i = in.arg - 1; i >= 0; --i) items[i] = pop();
        push(Var::tuple(std::move(items), in.op == OP_BUILD_LIST));
        return -1;
      }
      case OP_LIST_EXTEND: {
        VarPtr seq = pop();
        VarPtr& list = peek(in.arg);
        if (seq->kind == Var::Kind::Tuple || seq->kind == Var::Kind::List) {
          for (auto& x : seq->items) list->items.push_back(x);
        } else {
          PyObject* o = const_obj(seq, "sequence");
          PyObject* fast = PySequence_Fast(o, "not a sequence");
          if (!fast) real(nullptr);
          for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i)
            list->items.push_back(Var::constant(PySequence_Fast_GET_ITEM(fast, i)));
          Py_DECREF(fast);
        }
        return -1;
      }
      case OP_LIST_APPEND: {
        VarPtr v = pop();
        peek(in.arg)->items.push_back(v);
        return -1;
      }
      case OP_LIST_TO_TUPLE: {
        VarPtr a = pop();
        push(Var::tuple(a->items));
        return -1;
      }
      case OP_UNPACK_SEQUENCE: {
        VarPtr seq = pop();
        std::vector<VarPtr> items;
        if (seq->kind == Var::Kind::Tuple || seq->kind == Var::Kind::List) {
          items = seq->items;
        } else if (seq->is_const()) {
          PyObject* fast = PySequence_Fast(seq->obj, "cannot unpack");
          if (!fast) real(nullptr);
          for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i)
            items.push_back(Var::constant(PySequence_Fast_GET_ITEM(fast, i)));
          Py_DECREF(fast);
        } else if (seq->kind == Var::Kind::Iterator || seq->kind == Var::Kind::Dict) {
          items = items_of(seq);
        } else {
          unsupported("unpacking a tensor is not captured yet");
        }
        if (static_cast<int>(items.size()) != in.arg) unsupported("unpack length mismatch");
        for (auto it = items.rbegin(); it != items.rend(); ++it) push(*it);
        return -1;
      }
      case OP_BINARY_SUBSCR: {
        VarPtr idx = pop(), base = pop();
        push(subscript(base, idx));
        return -1;
      }
      case OP_BUILD_SLICE: {
        std::vector<VarPtr> parts(in.arg);
        for (int i = in.arg - 1; i >= 0; --i) parts[i] = pop();
        PyObject* s = PySlice_New(const_obj(parts[0], "slice"), const_obj(parts[1], "slice"),
                                  in.arg == 3 ? const_obj(parts[2], "slice") : nullptr);
        push(real(s));
        return -1;
      }
      case OP_BINARY_SLICE: {
        VarPtr stop = pop(), start = pop(), base = pop();
        PyObject* s = PySlice_New(const_obj(start, "slice"), const_obj(stop, "slice"), nullptr);
        push(subscript(base, real(s)));
        return -1;
      }
      case OP_POP_TOP: pop(); return -1;
      case OP_COPY: push(peek(in.arg)); return -1;
      case OP_SWAP: std::swap(peek(1), peek(in.arg)); return -1;
      case OP_POP_JUMP_IF_FALSE:
      case OP_POP_JUMP_FORWARD_IF_FALSE:
      case OP_POP_JUMP_BACKWARD_IF_FALSE: return truth(pop()) ? -1 : in.jump_target;
      case OP_POP_JUMP_IF_TRUE:
      case OP_POP_JUMP_FORWARD_IF_TRUE:
      case OP_POP_JUMP_BACKWARD_IF_TRUE: return truth(pop()) ? in.jump_target : -1;
      case OP_POP_JUMP_IF_NONE:
      case OP_POP_JUMP_FORWARD_IF_NONE:
      case OP_POP_JUMP_BACKWARD_IF_NONE: {
        VarPtr v = pop();
        return (v->is_const() && v->obj == Py_None) ? in.jump_target : -1;
      }
      case OP_POP_JUMP_IF_NOT_NONE:
      case OP_POP_JUMP_FORWARD_IF_NOT_NONE:
      case OP_POP_JUMP_BACKWARD_IF_NOT_NONE: {
        VarPtr v = pop();
        return (v->is_const() && v->obj == Py_None) ? -1 : in.jump_target;
      }
      case OP_GET_ITER: {
        // Loops over values known at capture time unroll: the iterator is a list of trackers.
        VarPtr seq = pop();
        VarPtr it = Var::tuple(items_of(seq));
        it->kind = Var::Kind::Iterator;
        push(it);
        return -1;
      }
      case OP_FOR_ITER: {
        VarPtr& it = peek(1);
        if (it->kind != Var::Kind::Iterator) unsupported("FOR_ITER over an unknown iterator");
        if (it->items.empty()) {
          pop();
          // 3.12 jumps to END_FOR and skips it; 3.11 jumps past the loop directly.
          return PY_VERSION_HEX >= 0x030C0000 ? in.jump_target + 2 : in.jump_target;
        }
        VarPtr next = it->items.front();
        it->items.erase(it->items.begin());
        push(next);
        return -1;
      }
      case OP_END_FOR: pop(); pop(); return -1;
      case OP_JUMP_FORWARD:
      case OP_JUMP_BACKWARD:
      case OP_JUMP_BACKWARD_NO_INTERRUPT: return in.jump_target;
      default: break;
    }
    size_t idx = &in - ci.instrs.data();
    unsupported("bytecode " + ci.opnames[idx] + " is not supported yet");
  }

  PyObject* fn_;
  CaptureResult& out_;
  PyObject* code_;
  PyObject* globals_;
  PyObject* builtins_;
  ir::Graph* g_;
  std::string filename_;
  std::vector<VarPtr> locals_;
  std::vector<VarPtr> stack_;
  std::vector<std::string> kwnames_;
  std::vector<PyObject*> keep_;
  int current_line_ = 0;
  size_t steps_ = 0;
  Interpreter* parent_ = nullptr;
  SourcePtr fn_source_;   // where the inlined function came from (closure cells are read through it)
  int depth_ = 0;
  VarPtr return_value_;
  std::vector<VarPtr> yields_;        // a generator's values, produced all at once
  std::unordered_map<const Var*, int> break_memo_;  // break_spec's tracker -> object ids
  bool grad_mode_ = true;             // root: torch.is_grad_enabled() where capture is
  bool global_hooks_checked_ = false; // root: the global module hook dicts are guarded
  std::unordered_set<const ir::Node*> needs_grad_;  // root: nodes autograd would track

 public:
  ~Interpreter() {
    for (PyObject* o : keep_) Py_DECREF(o);
  }
};

}  // namespace

CaptureResult capture(PyObject* fn, const BoundArgs& args) {
  CaptureResult r;
  Interpreter it(fn, r);
  try {
    auto* co = reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(fn));
    if (co->co_flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR | CO_ITERABLE_COROUTINE))
      throw Unsupported("generators and coroutines run eagerly");
    it.run(args);
    r.ok = true;
    r.captured_text = r.graph->str();
  } catch (const Unsupported& e) {
    r.ok = false;
    r.reason = e.what();
    r.location = it.location();
  } catch (const std::exception& e) {
    r.ok = false;
    r.reason = std::string("internal error during capture: ") + e.what();
    r.location = it.location();
  }
  if (PyErr_Occurred()) PyErr_Clear();
  return r;
}

}  // namespace kiln::bind
