#include "bind/capture/interpreter.h"
#include "bind/python_objects.h"
#include "bind/interrupts.h"
#include "bind/capture/resume.h"
#include "bind/capture/torch_call.h"
#include "bind/runtime/compiled_function.h"
#include "bind/torch/tensor_bridge.h"

namespace kiln::bind::detail {

VarPtr Interpreter::known_tensor(PyObject* real) {
  if (!real || !is_tensor(real)) return nullptr;
  PyObject* dim = PyObject_CallMethod(real, "dim", nullptr);
  PyObject* rg = PyObject_GetAttrString(real, "requires_grad");
  PyObject* cpu = PyObject_GetAttrString(real, "is_cpu");
  const bool scalar = dim && PyLong_Check(dim) && PyLong_AsLong(dim) == 0 && rg == Py_False && cpu == Py_True;
  Py_XDECREF(dim), Py_XDECREF(rg), Py_XDECREF(cpu);
  clear_error();
  PyObject* dt = scalar ? PyObject_GetAttrString(real, "dtype") : nullptr;
  DType t;
  const bool typed = dt && dtype_from_object(dt, t);
  Py_XDECREF(dt);
  PyObject* item = typed ? PyObject_CallMethod(real, "item", nullptr) : nullptr;
  if (!item) {
    clear_error();
    return nullptr;
  }
  const double value = PyFloat_Check(item) ? PyFloat_AsDouble(item) : static_cast<double>(PyLong_AsLongLong(item));
  const bool exact = PyFloat_Check(item) || PyBool_Check(item) ||
                     (PyLong_AsLongLong(item) < (1LL << 53) && PyLong_AsLongLong(item) > -(1LL << 53));
  Py_DECREF(item);
  clear_error();
  if (!exact || (!is_floating(t) && !is_integral(t, true))) return nullptr;
  ir::Attrs a;
  a.set("size", std::vector<sym::Expr>{});
  a.set("value", value);
  a.set("dtype", t);
  a.set("device", std::string("cpu"));
  ir::Node* n = add_node("full", {}, a);
  Interpreter* r = root();
  r->keep_.push_back(Py_NewRef(real));
  r->known_values_[n] = real;
  return Var::tensor(n);
}

PyObject* Interpreter::known_value(const VarPtr& v) {
  if (!v || !v->is_tensor()) return nullptr;
  auto it = root()->known_values_.find(v->node());
  return it == root()->known_values_.end() ? nullptr : it->second;
}

VarPtr Interpreter::known_int(const VarPtr& v) {
  PyObject* real = known_value(v);
  if (!real || (v->node()->meta.dtype != DType::Int64 && v->node()->meta.dtype != DType::Int32)) return v;
  PyObject* i = PyNumber_Index(real);
  if (!i) {
    clear_error();
    return v;
  }
  return Var::steal_constant(i);
}

PyObject* Interpreter::key_obj(const VarPtr& v, const char* what, const VarPtr& caller_dict) {
  if (!v->is_tensor()) {
    PyObject* k = const_obj(v, what);
    if (PyObject_Hash(k) == -1) real(nullptr);  // TypeError: unhashable type, as the dict raises
    return k;
  }
  Interpreter* r = root();
  // A tensor the function was handed, as a key of a dict the caller holds (a parameter keying an
  // optimizer's state): the object itself, as a tensor hashes by identity, so a lookup finds
  // its key and an insert puts that key into the caller's dict
  for (size_t i = 0; caller_dict && caller_dict->source && i < r->input_vars_.size() && i < r->input_objects_.size(); ++i)
    if (r->input_vars_[i] == v) {
      r->input_keys_.emplace(r->input_objects_[i], v);
      return r->input_objects_[i];
    }
  auto [it, fresh] = r->tensor_keys_.emplace(v->node(), nullptr);
  if (fresh && v->source) {
    // Two tensors the function was handed hash as two keys: guarded distinct objects (the
    // caller may pass one tensor twice, {a, b} then has one element)
    for (const VarPtr& u : r->hashed_inputs_) out_.guards.add_not_same(v->source, u->source);
    r->hashed_inputs_.push_back(v);
  }
  if (fresh) {
    it->second = PyObject_CallNoArgs(reinterpret_cast<PyObject*>(&PyBaseObject_Type));
    if (!it->second) real(nullptr);
    r->keep_.push_back(it->second);
    r->key_tensors_.emplace(it->second, v);
  }
  return it->second;
}

VarPtr Interpreter::key_var(PyObject* k) {
  Interpreter* r = root();
  auto it = r->key_tensors_.find(k);
  if (it != r->key_tensors_.end()) return it->second;
  auto in = r->input_keys_.find(k);
  return in != r->input_keys_.end() ? in->second : Var::constant(k);
}

bool Interpreter::holds_tensor_key(PyObject* o) {
  Interpreter* r = root();
  if (r->key_tensors_.empty() || !o) return false;
  if (r->key_tensors_.count(o)) return true;
  if (PyAnySet_Check(o) || PyDict_Check(o) || PyTuple_Check(o) || PyList_Check(o)) {
    PyObject* items = PySequence_List(o);  // a dict's keys
    if (!items) {
      clear_error();
      return false;
    }
    bool found = false;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items) && !found; ++i) found = holds_tensor_key(PyList_GET_ITEM(items, i));
    Py_DECREF(items);
    return found;
  }
  return false;
}

Py_ssize_t Interpreter::dict_find(const VarPtr& d, PyObject* key) {
  for (size_t i = 0; i < d->entries().keys.size(); ++i) {
    int eq = PyObject_RichCompareBool(d->entries().keys[i], key, Py_EQ);
    if (eq < 0) clear_error();
    if (eq == 1) return static_cast<Py_ssize_t>(i);
  }
  return -1;
}

void Interpreter::dict_set(const VarPtr& d, PyObject* key, VarPtr v) {
  Py_ssize_t i = dict_find(d, key);
  if (i >= 0) {
    d->entries().values[i] = std::move(v);
    return;
  }
  d->entries().keys.push_back(Py_NewRef(key));
  d->entries().values.push_back(std::move(v));
}

std::vector<std::pair<PyObject*, VarPtr>> Interpreter::dict_entries(const VarPtr& d) {
  std::vector<std::pair<PyObject*, VarPtr>> out;
  if (d->kind() == Var::Kind::Dict) {
    for (size_t i = 0; i < d->entries().keys.size(); ++i) out.emplace_back(d->entries().keys[i], d->entries().values[i]);
    return out;
  }
  // A caller's dict subclass guarded by structure (a ModelOutput handed back in) is read from its
  // storage, its key order and each value guarded below: not pinned by identity (every
  // generate() makes a new one).
  PyObject* o = structural(d) && d->source && PyDict_Check(d->known()) ? d->known() : const_obj(d, "dict");
  if (!PyDict_Check(o)) unsupported("expected a dict");
  // The entries in the dict's order, which a loop over it follows: the keys guarded in order
  // (an item popped and set again moves to the end).
  if (d->source) out_.guards.add_key_order(d->source, o);
  PyObject *k, *v;
  Py_ssize_t pos = 0;
  if (PyDict_CheckExact(o) || !dict_storage_reads(Py_TYPE(o), "keys")) {
    while (PyDict_Next(o, &pos, &k, &v)) {
      keep_.push_back(Py_NewRef(k));
      out.emplace_back(k, d->source ? wrap(v, Source::key_of(d->source, k)) : Var::constant(v));
    }
    return out;
  }
  // A subclass of OrderedDict (or dict) iterates in its own order (move_to_end): its keys as its
  // iteration gives them, in C, the values from the storage.
  PyObject* keys = PySequence_Tuple(o);
  if (!keys) real(nullptr);
  keep_.push_back(keys);
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(keys); ++i) {
    k = PyTuple_GET_ITEM(keys, i);
    v = PyDict_GetItemWithError(o, k);
    if (!v) real(nullptr);
    out.emplace_back(k, d->source ? wrap(v, Source::key_of(d->source, k)) : Var::constant(v));
  }
  return out;
}

void Interpreter::dict_merge(const VarPtr& d, const VarPtr& other) {
  if (is_dict(other)) {
    for (auto& [k, v] : dict_entries(other)) dict_set(d, k, v);
    return;
  }
  for (const VarPtr& pair : drain(other)) {  // an iterable of (key, value) pairs
    std::vector<VarPtr> kv = items_of(pair);
    if (kv.size() != 2) unsupported("dict update sequence element of length " + std::to_string(kv.size()) + ": ValueError");
    dict_set(d, key_obj(kv[0], "dict key"), kv[1]);
  }
}

VarPtr Interpreter::make_typed_dict(PyObject* cls, const std::vector<VarPtr>& args, const KwArgs& kwargs) {
  static PyObject* ordered = object_at("collections.OrderedDict");
  static PyObject* defaultdict = object_at("collections.defaultdict");
  if (!cls || (cls != ordered && cls != defaultdict)) return nullptr;
  size_t first = 0;
  PyObject* factory = nullptr;
  if (cls == defaultdict) {
    factory = Py_None;
    if (!args.empty()) {
      if (args[0]->kind() == Var::Kind::Function) {
        factory = nullptr;  // a lambda made here: called as a tracker (made_factory below)
      } else {
        if (!args[0]->is_const()) unsupported("defaultdict with a default factory kiln does not track");
        factory = args[0]->obj();
        if (factory != Py_None && !PyCallable_Check(factory)) unsupported("first argument must be callable or None: TypeError");
      }
      first = 1;
    }
  }
  if (args.size() > first + 1) unsupported("OrderedDict/defaultdict with more arguments: TypeError");
  VarPtr d = Var::dict();
  DictV& dv = d->as<DictV>();
  dv.cls = Py_NewRef(cls);
  dv.factory = Py_XNewRef(factory);
  if (cls == defaultdict && !args.empty() && args[0]->kind() == Var::Kind::Function) dv.made_factory = args[0];
  if (args.size() == first + 1) dict_merge(d, args[first]);
  for (const auto& [k, v] : kwargs) {
    PyObject* key = PyUnicode_FromString(k.c_str());
    dict_set(d, key, v);
    Py_DECREF(key);
  }
  return d;
}

bool Interpreter::is_dict(const VarPtr& v) { return v->kind() == Var::Kind::Dict || (v->is_const() && PyDict_Check(v->obj())); }

void Interpreter::refresh_dict_view(const VarPtr& view) {
  ListV& l = view->as<ListV>();
  if (!l.view) return;
  const DictView dv = *l.view;
  l.items.clear();
  for (auto& [k, v] : dict_entries(dv.dict)) {
    if (dv.which == "items") l.items.push_back(Var::tuple({key_var(k), v}));
    else l.items.push_back(dv.which == "keys" ? key_var(k) : v);
  }
}

VarPtr Interpreter::call_dict_method(const VarPtr& d, const std::string& name, std::vector<VarPtr> args, const KwArgs& kwargs) {
  const bool tracker = d->kind() == Var::Kind::Dict;
  if (name == "update" && tracker && args.size() <= 1) {
    note_mutation(d, "dict.update()");
    if (!args.empty()) dict_merge(d, args[0]);
    for (auto& [k, v] : kwargs) {
      PyObject* key = PyUnicode_FromString(k.c_str());
      dict_set(d, key, v);
      Py_DECREF(key);
    }
    return Var::constant(Py_None);
  }
  if ((name == "popitem" || name == "move_to_end") && kwargs.size() == 1 && kwargs[0].first == "last" &&
      args.size() == (name == "popitem" ? 0u : 1u)) {  // OrderedDict's last=, as a positional
    args.push_back(kwargs[0].second);
    return call_dict_method(d, name, std::move(args), {});
  }
  if (!kwargs.empty()) unsupported("dict." + name + "() with keyword arguments");
  if (name == "items" || name == "keys" || name == "values") {
    VarPtr view = Var::tuple({}, true);
    view->as<ListV>().view = DictView{d, name};
    refresh_dict_view(view);
    return view;
  }
  if (name == "get" && (args.size() == 1 || args.size() == 2)) {
    // Reading every entry guards the dict's exact key set, so a missing key stays missing.
    PyObject* key = key_obj(args[0], "dict key", d);
    for (auto& [k, v] : dict_entries(d)) {
      int eq = PyObject_RichCompareBool(k, key, Py_EQ);
      if (eq < 0) real(nullptr);
      if (eq == 1) return v;
    }
    return args.size() == 2 ? args[1] : Var::constant(Py_None);
  }
  if (name == "copy" && args.empty()) {
    VarPtr c = Var::dict();
    if (auto* dv = d->get_if<DictV>(); dv && dv->cls) {  // an OrderedDict's copy is one, a defaultdict's too
      c->as<DictV>().cls = Py_NewRef(dv->cls);
      c->as<DictV>().factory = Py_XNewRef(dv->factory);
      c->as<DictV>().made_factory = dv->made_factory;
    }
    for (auto& [k, v] : dict_entries(d)) dict_set(c, k, v);
    return c;
  }
  if (!tracker) unsupported("dict." + name + "() on a dict the caller can see");
  if (name == "clear" && args.empty()) {
    note_mutation(d, "dict.clear()");
    for (PyObject* k : d->entries().keys) Py_DECREF(k);
    d->entries().keys.clear();
    d->entries().values.clear();
    return Var::constant(Py_None);
  }
  if (name == "pop" && (args.size() == 1 || args.size() == 2)) {
    Py_ssize_t i = dict_find(d, key_obj(args[0], "dict key", d));
    if (i < 0) {
      if (args.size() == 2) return args[1];
      raise_new(PyExc_KeyError, Py_BuildValue("(O)", key_obj(args[0], "dict key", d)));
    }
    note_mutation(d, "dict.pop()");
    VarPtr v = d->entries().values[i];
    Py_DECREF(d->entries().keys[i]);
    d->entries().keys.erase(d->entries().keys.begin() + i);
    d->entries().values.erase(d->entries().values.begin() + i);
    return v;
  }
  if (name == "popitem" && args.size() <= 1) {
    // the last entry (LIFO), or with OrderedDict's last=False the first
    const bool last = args.empty() || truth(args[0]);
    Entries& e = d->entries();
    if (e.keys.empty()) raise_new(PyExc_KeyError, "popitem(): dictionary is empty");
    note_mutation(d, "dict.popitem()");
    const size_t i = last ? e.keys.size() - 1 : 0;
    VarPtr item = Var::tuple({Var::steal_constant(e.keys[i]), e.values[i]});
    e.keys.erase(e.keys.begin() + static_cast<std::ptrdiff_t>(i));
    e.values.erase(e.values.begin() + static_cast<std::ptrdiff_t>(i));
    return item;
  }
  if (name == "move_to_end" && (args.size() == 1 || args.size() == 2) && d->as<DictV>().cls) {
    const bool last = args.size() == 1 || truth(args[1]);
    Py_ssize_t i = dict_find(d, key_obj(args[0], "dict key", d));
    if (i < 0) raise_new(PyExc_KeyError, Py_BuildValue("(O)", key_obj(args[0], "dict key", d)));
    note_mutation(d, "OrderedDict.move_to_end()");
    Entries& e = d->entries();
    PyObject* k = e.keys[i];
    VarPtr v = e.values[i];
    e.keys.erase(e.keys.begin() + i);
    e.values.erase(e.values.begin() + i);
    e.keys.insert(last ? e.keys.end() : e.keys.begin(), k);
    e.values.insert(last ? e.values.end() : e.values.begin(), v);
    return Var::constant(Py_None);
  }
  if (name == "setdefault" && (args.size() == 1 || args.size() == 2)) {
    PyObject* key = key_obj(args[0], "dict key", d);
    Py_ssize_t i = dict_find(d, key);
    if (i >= 0) return d->entries().values[i];
    VarPtr v = args.size() == 2 ? args[1] : Var::constant(Py_None);
    note_mutation(d, "dict.setdefault()");
    dict_set(d, key, v);
    return v;
  }
  if (name == "__setitem__" && args.size() == 2) return store_subscript(d, args[0], args[1]), Var::constant(Py_None);
  unsupported("dict." + name + "() is not captured yet");
}

VarPtr Interpreter::real(PyObject* r) {
  if (!r) {
    if (keep_interrupt()) throw Interrupted("interrupted");
    std::string msg = "Python operation raised";
    PyObject *t, *v, *tb;
    PyErr_Fetch(&t, &v, &tb);
    PyErr_NormalizeException(&t, &v, &tb);
    if (v) {
      PyObject* s = PyObject_Str(v);
      if (s) msg += ": " + std::string(PyUnicode_AsUTF8(s));
      Py_XDECREF(s);
    }
    Py_XDECREF(t);
    Py_XDECREF(tb);
    clear_error();
    if (!v) unsupported(msg);
    root()->keep_.push_back(v);
    throw Raised(v, msg);
  }
  return Var::steal_constant(r);
}

PyObject* Interpreter::call_for_real(PyObject* f, const std::vector<VarPtr>& args, const KwArgs& kwargs, const char* what) {
  std::vector<PyObject*> values;  // borrowed; read before any Python object is made, so a refusal leaks nothing
  for (const VarPtr& a : args) values.push_back(const_obj(a, what));
  std::vector<std::pair<const char*, PyObject*>> named;
  for (const auto& [k, v] : kwargs) named.emplace_back(k.c_str(), const_obj(v, what));
  PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(values.size()));
  for (size_t i = 0; i < values.size(); ++i) PyTuple_SET_ITEM(t, static_cast<Py_ssize_t>(i), Py_NewRef(values[i]));
  PyObject* kw = named.empty() ? nullptr : PyDict_New();
  for (auto& [k, v] : named) PyDict_SetItemString(kw, k, v);
  PyObject* r = PyObject_Call(f, t, kw);
  Py_DECREF(t);
  Py_XDECREF(kw);
  return r;
}

bool Interpreter::replace_slice(std::vector<VarPtr>& items, PyObject* slice, const std::vector<VarPtr>* values) {
  Py_ssize_t start = 0, stop = 0, step = 1;
  if (PySlice_Unpack(slice, &start, &stop, &step) < 0) {
    PyErr_Clear();
    return false;
  }
  const Py_ssize_t len = PySlice_AdjustIndices(static_cast<Py_ssize_t>(items.size()), &start, &stop, step);
  if (step == 1) {  // a range, replaced by any number of values (items[1:1] = [...] inserts)
    stop = std::max(stop, start);
    items.erase(items.begin() + start, items.begin() + stop);
    if (values) items.insert(items.begin() + start, values->begin(), values->end());
    return true;
  }
  std::vector<Py_ssize_t> at;
  for (Py_ssize_t i = 0; i < len; ++i) at.push_back(start + i * step);
  if (!values) {
    std::sort(at.rbegin(), at.rend());
    for (Py_ssize_t i : at) items.erase(items.begin() + i);
    return true;
  }
  if (static_cast<Py_ssize_t>(values->size()) != len) return false;
  for (Py_ssize_t i = 0; i < len; ++i) items[at[i]] = (*values)[i];
  return true;
}

void Interpreter::store_subscript(const VarPtr& container, const VarPtr& key, const VarPtr& value) {
  if (container->is_array()) return array_store_subscript(container, key, value);
  if (auto* r = container->get_if<RecordV>(); r && r->plain) {
    if (!object_dunder(container, "__setitem__", {key, value})) unsupported("item assignment into an object without __setitem__: TypeError");
    return;
  }
  if (container->kind() == Var::Kind::Record) return record_store(container, const_obj(key, "key"), value, true);
  if (container->kind() == Var::Kind::Dict) {
    PyObject* k = key_obj(key, "dict key", container);
    note_mutation(container, "item assignment");
    dict_set(container, k, value);
    return;
  }
  if (container->kind() == Var::Kind::List && key->is_const() && PySlice_Check(key->obj())) {
    const std::vector<VarPtr> values = items_of(value);
    note_mutation(container, "slice assignment");
    std::vector<VarPtr> items = container->seq();
    if (!replace_slice(items, key->obj(), &values)) unsupported("assignment of another number of values to an extended slice: ValueError");
    container->seq() = std::move(items);
    return;
  }
  if (container->kind() == Var::Kind::List && key->is_const() && PyLong_Check(key->obj())) {
    Py_ssize_t n = static_cast<Py_ssize_t>(container->seq().size()), i = PyLong_AsSsize_t(key->obj());
    if (i < 0) i += n;
    if (i < 0 || i >= n) unsupported("list assignment index out of range");
    note_mutation(container, "item assignment");
    container->seq()[i] = value;
    return;
  }
  if (container->is_tensor()) {
    // x[k] += 1 updates the view x[k] in place, then stores it back into x[k]: storing a view
    // of x into the very elements it views changes nothing.
    if (value->is_tensor() && value->node() != container->node()) {
      const ir::Node* root = value->node();
      while (is_view(root) && root != container->node()) root = root->inputs[0];
      if (root == container->node()) {
        const size_t before = g_->nodes().size();
        VarPtr there = subscript(container, key);
        const bool same = there->is_tensor() && there->node()->meta.dtype == value->node()->meta.dtype &&
                          there->node()->meta.sizes == value->node()->meta.sizes &&
                          there->node()->meta.strides == value->node()->meta.strides &&
                          there->node()->meta.offset == value->node()->meta.offset;
        there.reset();
        // The views this probe took are not used: they must not count as live views of x.
        for (bool erased = true; erased && g_->nodes().size() > before;) {
          erased = false;
          ir::Node* last = g_->nodes().back().get();
          if (last->users.empty() && std::find(g_->outputs().begin(), g_->outputs().end(), last) == g_->outputs().end()) {
            g_->erase_if([&](const ir::Node* n) { return n == last; });
            erased = true;
          }
        }
        if (same) return;
      }
    }
    // x[idx] = v on a tensor only the graph sees: a copy with the assignment, which every
    // name of x then holds (like any in-place op)
    check_inplace_target(container, "indexed assignment");
    VarPtr r = torch_extern(functional_setitem(), "setitem", {container, key, value}, {});
    offer_in_place(r, container, inplace_setitem());
    mutate(container, r->node());
    return;
  }
  if (container->is_const() && !container->source &&
      (PyList_CheckExact(container->obj()) || PyDict_CheckExact(container->obj()))) {
    // a list or dict made during capture by a Python call (list(x.shape)): nobody else holds it
    if (PyObject_SetItem(container->obj(), const_obj(key, "key"), const_obj(value, "value")) < 0) real(nullptr);
    return;
  }
  unsupported("item assignment into an object the caller can see");
}

VarPtr Interpreter::call_deque_method(const VarPtr& dq, const std::string& name, const std::vector<VarPtr>& args,
                                      const KwArgs& kwargs) {
  ListV& l = dq->as<ListV>();
  auto& items = l.items;
  auto none = [] { return Var::constant(Py_None); };
  // a bounded deque drops items from the other end as new ones arrive
  auto trim = [&](bool from_left) {
    while (l.maxlen >= 0 && static_cast<Py_ssize_t>(items.size()) > l.maxlen)
      items.erase(from_left ? items.begin() : items.end() - 1);
  };
  if (!kwargs.empty()) unsupported("deque." + name + "() with keyword arguments");
  if (name == "append" && args.size() == 1) return items.push_back(args[0]), trim(true), none();
  if (name == "appendleft" && args.size() == 1) return items.insert(items.begin(), args[0]), trim(false), none();
  if (name == "extend" && args.size() == 1) {
    for (const VarPtr& v : drain(args[0])) items.push_back(v), trim(true);
    return none();
  }
  if (name == "extendleft" && args.size() == 1) {
    for (const VarPtr& v : drain(args[0])) items.insert(items.begin(), v), trim(false);
    return none();
  }
  if ((name == "pop" || name == "popleft") && args.empty()) {
    if (items.empty()) raise_new(PyExc_IndexError, "pop from an empty deque");
    VarPtr v = name == "pop" ? items.back() : items.front();
    items.erase(name == "pop" ? items.end() - 1 : items.begin());
    return v;
  }
  if (name == "rotate" && args.size() <= 1) {
    Py_ssize_t n = 1;
    if (!args.empty()) {
      PyObject* o = const_obj(args[0], "rotate count");
      if (!PyLong_Check(o)) unsupported("deque.rotate() of a non-integer: TypeError");
      n = PyLong_AsSsize_t(o);
    }
    if (!items.empty()) {
      const Py_ssize_t size = static_cast<Py_ssize_t>(items.size());
      const Py_ssize_t k = ((n % size) + size) % size;  // rotate(1) moves the last item to the front
      std::rotate(items.begin(), items.end() - k, items.end());
    }
    return none();
  }
  if (name == "copy" && args.empty()) {
    VarPtr r = Var::list(items);
    r->as<ListV>().deque = true;
    r->as<ListV>().maxlen = l.maxlen;
    return r;
  }
  if (name == "insert" || name == "sort") unsupported("deque." + name + "() is not captured");
  return nullptr;  // clear, remove, index, count, reverse: as a list's
}

VarPtr Interpreter::call_sequence_method(const VarPtr& seq, const std::string& name, std::vector<VarPtr> args, const KwArgs& kwargs) {
  const bool list = seq->kind() == Var::Kind::List;
  static PyObject* size_type = resolve_torch("Size");
  if (auto* t = seq->get_if<TupleV>(); t && t->structseq == size_type && name == "numel" && args.empty() && kwargs.empty()) {
    VarPtr n = Var::steal_constant(PyLong_FromLong(1));  // torch.Size.numel() of symbolic sizes
    for (const VarPtr& d : t->items) n = binary("NB_MULTIPLY", n, d);
    return n;
  }
  if (auto* t = seq->get_if<TupleV>(); t && t->structseq && name == "_replace" && args.empty() &&
                                        is_namedtuple_class(t->structseq)) {
    // nt._replace(b=x): a new tuple of the class with those fields changed
    PyObject* fields = PyObject_GetAttrString(t->structseq, "_fields");
    keep_.push_back(fields);
    std::vector<VarPtr> items = t->items;
    for (const auto& [k, v] : kwargs) {
      const Py_ssize_t at = namedtuple_field(fields, k);
      if (at < 0 || static_cast<size_t>(at) >= items.size()) unsupported("_replace() of an unknown field " + k);
      items[static_cast<size_t>(at)] = v;
    }
    VarPtr r = Var::tuple(std::move(items));
    r->as<TupleV>().structseq = Py_NewRef(t->structseq);
    return r;
  }
  if (auto* l = seq->get_if<ListV>(); l && l->deque) {
    if (VarPtr r = call_deque_method(seq, name, args, kwargs)) return r;
  }
  if (name == "sort" && args.empty() && !kwargs.empty() && seq->kind() == Var::Kind::List) {
    // l.sort(key=fn, reverse=r): the order sorted() gives (both are stable), put into the list
    note_mutation(seq, "list.sort()");
    VarPtr ordered = order_by_key(builtin("sorted"), seq, kwargs);
    if (!ordered) unsupported("list.sort() with these keyword arguments, or keys that are not Python values");
    seq->seq() = ordered->seq();
    return Var::constant(Py_None);
  }
  if (!kwargs.empty()) unsupported(name + "() with keyword arguments");
  static const char* mutating[] = {"append", "extend", "insert", "pop", "clear", "reverse", "remove", "sort"};
  bool mutates = std::any_of(std::begin(mutating), std::end(mutating), [&](const char* m) { return name == m; });
  if (mutates && !list) unsupported("tuple has no attribute " + name);
  if (mutates) note_mutation(seq, "list." + name + "()");
  auto& items = seq->seq();
  if (name == "append" && args.size() == 1) {
    items.push_back(args[0]);
    return Var::constant(Py_None);
  }
  if (name == "extend" && args.size() == 1) {
    for (const VarPtr& v : drain(args[0])) items.push_back(v);
    return Var::constant(Py_None);
  }
  if (name == "insert" && args.size() == 2 && args[0]->is_const() && PyLong_Check(args[0]->obj())) {
    Py_ssize_t n = static_cast<Py_ssize_t>(items.size()), i = PyLong_AsSsize_t(args[0]->obj());
    i = i < 0 ? std::max<Py_ssize_t>(0, i + n) : std::min(i, n);
    items.insert(items.begin() + i, args[1]);
    return Var::constant(Py_None);
  }
  if (name == "pop" && args.size() <= 1) {
    Py_ssize_t n = static_cast<Py_ssize_t>(items.size());
    if (!args.empty() && !(args[0]->is_const() && PyLong_Check(args[0]->obj()))) unsupported("list.pop of an index kiln does not know");
    Py_ssize_t i = args.empty() ? n - 1 : PyLong_AsSsize_t(args[0]->obj());
    if (i < 0) i += n;
    if (i < 0 || i >= n) raise_new(PyExc_IndexError, n == 0 ? "pop from empty list" : "pop index out of range");
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
    if (items[i]->in_graph() || x->in_graph()) return items[i]->in_graph() && x->in_graph() && items[i]->node() == x->node();
    int eq = PyObject_RichCompareBool(const_obj(items[i], "item"), const_obj(x, "item"), Py_EQ);
    if (eq < 0) real(nullptr);
    return eq == 1;
  };
  if (name == "index" && (args.size() == 2 || args.size() == 3)) {  // index(x, start[, stop])
    const Py_ssize_t n = static_cast<Py_ssize_t>(items.size());
    auto bound = [&](const VarPtr& v) {
      Py_ssize_t b = PyNumber_AsSsize_t(const_obj(v, "index bound"), nullptr);
      if (b < 0) b = std::max<Py_ssize_t>(0, b + n);
      return std::min(b, n);
    };
    const Py_ssize_t start = bound(args[1]), stop = args.size() == 3 ? bound(args[2]) : n;
    for (Py_ssize_t i = start; i < stop; ++i)
      if (equal_at(static_cast<size_t>(i), args[0])) return Var::steal_constant(PyLong_FromSsize_t(i));
    if (!list) raise_new(PyExc_ValueError, "tuple.index(x): x not in tuple");
    if (!args[0]->is_const()) unsupported("list.index(x): x not in the range: ValueError");
    PyObject* r = PyObject_Repr(args[0]->obj());
    if (!r) real(nullptr);
    keep_.push_back(r);
    raise_new(PyExc_ValueError, std::string(PyUnicode_AsUTF8(r)) + " is not in list");
  }
  if ((name == "remove" || name == "index") && args.size() == 1) {
    for (size_t i = 0; i < items.size(); ++i)
      if (equal_at(i, args[0])) {
        if (name == "index") return Var::steal_constant(PyLong_FromSize_t(i));
        items.erase(items.begin() + i);
        return Var::constant(Py_None);
      }
    if (!list) raise_new(PyExc_ValueError, "tuple.index(x): x not in tuple");
    if (name == "remove") raise_new(PyExc_ValueError, "list.remove(x): x not in list");
    if (!args[0]->is_const()) unsupported("list.index(x): x not in the sequence: ValueError");
    PyObject* r = PyObject_Repr(args[0]->obj());
    if (!r) real(nullptr);
    keep_.push_back(r);
    raise_new(PyExc_ValueError, std::string(PyUnicode_AsUTF8(r)) + " is not in list");
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
  if (list && name == "__setitem__" && args.size() == 2) return store_subscript(seq, args[0], args[1]), Var::constant(Py_None);
  unsupported(std::string(list ? "list." : "tuple.") + name + "() is not captured yet");
}

}  // namespace kiln::bind::detail
