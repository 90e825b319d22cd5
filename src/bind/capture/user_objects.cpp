// Instances of plain user classes made during capture: `DynamicCache(config=...)` in a model's
// forward, a helper object built and used in the function.
//
// `cls(...)` does not run for real while capturing. The object is a Record tracker (the same
// tracker dataclass instances use, with `plain` set) of its instance attributes; `__init__`
// (and `super().__init__`) is inlined with the tracker as `self`, so its stores fill the
// tracker. Attribute reads follow Python's order: a data descriptor of the class (a property,
// inlined), then the instance's attributes, then the class's (methods bind to the tracker);
// `__getattr__` is inlined for a name found nowhere. The object is built for real only where the
// program hands it out (a return, a graph break): object.__new__(cls) with its attributes set
// into its __dict__, without running __init__ again, so what the program saw is what it gets.
//
// Only classes whose instances are plain Python objects qualify: object's __new__, a __dict__,
// the generic __getattribute__ and __setattr__, a metaclass that does not override __call__,
// not abstract, not an nn.Module. Others stay calls that end capture with a reason.
#include "bind/capture/interpreter.h"
#include "bind/interrupts.h"
#include "bind/python_objects.h"

namespace kiln::bind::detail {

namespace {

PyTypeObject* type_of(const VarPtr& rec) { return reinterpret_cast<PyTypeObject*>(rec->as<RecordV>().cls); }

// The class attribute `name` as Python's lookup finds it along the MRO (borrowed), or nullptr.
PyObject* class_lookup(PyTypeObject* t, const char* name) {
  PyObject* key = PyUnicode_FromString(name);
  PyObject* a = key ? _PyType_Lookup(t, key) : nullptr;
  Py_XDECREF(key);
  return a;
}

}  // namespace

PyObject* python_function(PyTypeObject* t, const char* name) {
  PyObject* f = class_lookup(t, name);
  return f && PyFunction_Check(f) ? f : nullptr;
}

namespace {

bool is_nn_module_class(PyObject* cls) {
  static PyObject* module_type = object_at("torch.nn.Module");
  return module_type && PyObject_IsSubclass(cls, module_type) == 1;
}

// The class's `name` (__setattr__, __delattr__) is a Python function or object's own.
// A __slots__ member of the class: its value is one of the instance's attributes, stored in
// the tracker as a __dict__ entry would be (unset, it reads as an AttributeError).
bool is_slot(PyObject* a) { return a && Py_IS_TYPE(a, &PyMemberDescr_Type); }

bool python_or_object(PyTypeObject* t, const char* name) {
  PyObject* f = class_lookup(t, name);
  PyObject* generic = PyObject_GetAttrString(reinterpret_cast<PyObject*>(&PyBaseObject_Type), name);
  Py_XDECREF(generic);  // object's slot wrapper lives as long as object
  return f && (PyFunction_Check(f) || f == generic);
}

PyObject* object_init() {
  static PyObject* init = PyObject_GetAttrString(reinterpret_cast<PyObject*>(&PyBaseObject_Type), "__init__");
  return init;
}

}  // namespace

const char* Interpreter::plain_class_problem(PyObject* cls) {
  if (!PyType_Check(cls)) return "not a class";
  auto* t = reinterpret_cast<PyTypeObject*>(cls);
  if (!PyType_HasFeature(t, Py_TPFLAGS_HEAPTYPE)) return "a built-in class";
  if (Py_TYPE(cls)->tp_call != PyType_Type.tp_call) return "its metaclass overrides __call__";
  if (t->tp_new != PyBaseObject_Type.tp_new) return "it has its own __new__ (or a built-in base)";
  if (t->tp_dictoffset == 0 && !PyObject_HasAttrString(cls, "__slots__")) return "its instances have no __dict__";
  if (PyType_HasFeature(t, Py_TPFLAGS_IS_ABSTRACT)) return "it is abstract";
  static PyObject* generic_getattribute =
      PyObject_GetAttrString(reinterpret_cast<PyObject*>(&PyBaseObject_Type), "__getattribute__");
  PyObject* getattribute = class_lookup(t, "__getattribute__");
  if (t->tp_getattro != PyObject_GenericGetAttr && getattribute != generic_getattribute)
    return "it overrides __getattribute__";  // a class with __getattr__ only is modelled
  if (t->tp_setattro != PyObject_GenericSetAttr && !(python_or_object(t, "__setattr__") && python_or_object(t, "__delattr__")))
    return "it overrides __setattr__ in C";
  if (is_nn_module_class(cls)) return "it is an nn.Module";
  return nullptr;
}

VarPtr Interpreter::make_object(PyObject* cls, std::vector<VarPtr> args, const KwArgs& kwargs) {
  if (plain_class_problem(cls)) return nullptr;
  auto* t = reinterpret_cast<PyTypeObject*>(cls);
  auto rec = std::make_shared<Var>(RecordV{});
  rec->as<RecordV>().cls = Py_NewRef(cls);
  rec->as<RecordV>().plain = true;
  PyObject* init = class_lookup(t, "__init__");
  if (!init || init == object_init()) {
    if (!args.empty() || !kwargs.empty()) unsupported(std::string(t->tp_name) + "() takes no arguments: TypeError");
    return rec;
  }
  if (!PyFunction_Check(init)) unsupported(std::string(t->tp_name) + ".__init__ is not a Python function");
  keep_.push_back(Py_NewRef(init));
  args.insert(args.begin(), rec);
  VarPtr r = inline_call(init, nullptr, std::move(args), kwargs);
  if (!(r->is_const() && r->known() == Py_None)) unsupported("__init__() should return None: TypeError");
  return rec;
}

// A descriptor whose class is written in Python (torch.distributions' lazy_property, a
// library's own cached attribute): its __get__ inlined with the object and its class, as
// Python's attribute lookup calls it. nullptr where __get__ is not a Python function.
VarPtr Interpreter::python_descriptor_get(PyObject* descriptor, const VarPtr& rec) {
  PyObject* get = python_function(Py_TYPE(descriptor), "__get__");
  if (!get) return nullptr;
  keep_.push_back(Py_NewRef(descriptor));
  keep_.push_back(Py_NewRef(get));
  return inline_call(get, nullptr, {Var::constant(descriptor), rec, Var::constant(rec->as<RecordV>().cls)}, {});
}

// obj.__dict__ of an object made in the frame: a dict of its attributes, kept equal to them as
// the function sets and deletes attributes (object_store). A change made through the dict itself
// (`obj.__dict__[k] = v`) is refused (note_mutation): it would not reach the object.
VarPtr Interpreter::record_dict_view(const VarPtr& rec) {
  VarPtr d = Var::dict();
  fill_dict_view(rec, d);
  root()->dict_views_.emplace_back(rec, d);
  return d;
}

void Interpreter::fill_dict_view(const VarPtr& rec, const VarPtr& d) {
  Entries& e = d->entries();
  for (PyObject* k : e.keys) Py_DECREF(k);
  e.keys.clear();
  e.values.clear();
  const RecordV& r = rec->as<RecordV>();
  for (size_t i = 0; i < r.keys.size(); ++i) {
    e.keys.push_back(Py_NewRef(r.keys[i]));
    e.values.push_back(r.values[i]);
  }
}

VarPtr Interpreter::object_attr(const VarPtr& rec, const std::string& name) {
  PyTypeObject* t = type_of(rec);
  if (name == "__dict__" && rec->as<RecordV>().plain) return record_dict_view(rec);
  if (name == "__class__") return Var::constant(rec->as<RecordV>().cls);  // (object's own descriptor: type(obj))
  PyObject* a = class_lookup(t, name.c_str());
  if (a && Py_TYPE(a)->tp_descr_set && !is_slot(a)) {  // a data descriptor wins over the instance's attributes
    if (PyObject_TypeCheck(a, &PyProperty_Type)) {
      PyObject* fget = PyObject_GetAttrString(a, "fget");
      if (!fget) real(nullptr);
      keep_.push_back(fget);
      if (!PyFunction_Check(fget)) unsupported("property " + name + " without a Python getter");
      return inline_call(fget, nullptr, {rec}, {});
    }
    if (VarPtr v = python_descriptor_get(a, rec)) return v;
    unsupported("attribute " + name + " of a " + t->tp_name + " is a data descriptor kiln does not model");
  }
  const RecordV& r = rec->as<RecordV>();
  for (size_t i = 0; i < r.keys.size(); ++i)
    if (PyUnicode_CompareWithASCIIString(r.keys[i], name.c_str()) == 0) return r.values[i];
  if (name == "__class__") return Var::constant(r.cls);
  if (name == "__dict__") unsupported("__dict__ of an object made during capture");
  if (a && !is_slot(a)) {
    if (PyFunction_Check(a)) return Var::method(rec, name, a);
    static PyObject* cached_property = object_at("functools.cached_property");
    if (cached_property && PyObject_TypeCheck(a, reinterpret_cast<PyTypeObject*>(cached_property))) {
      // functools.cached_property: computed on first read and kept in the object's attributes,
      // where the next read finds it (above)
      PyObject* func = PyObject_GetAttrString(a, "func");
      if (!func) real(nullptr);
      keep_.push_back(func);
      if (!PyFunction_Check(func)) unsupported("cached_property " + name + " without a Python function");
      VarPtr v = inline_call(func, nullptr, {rec}, {});
      object_store(rec, name, v);
      return v;
    }
    if (Py_IS_TYPE(a, &PyStaticMethod_Type) || Py_IS_TYPE(a, &PyClassMethod_Type) || !Py_TYPE(a)->tp_descr_get ||
        Py_IS_TYPE(a, &PyMethodDescr_Type) || Py_IS_TYPE(a, &PyWrapperDescr_Type)) {
      if (Py_IS_TYPE(a, &PyMethodDescr_Type) || Py_IS_TYPE(a, &PyWrapperDescr_Type))
        return Var::method(rec, name, a);  // object's own (__repr__, __eq__): called with the object
      if (Py_IS_TYPE(a, &PyClassMethod_Type) || Py_IS_TYPE(a, &PyStaticMethod_Type)) {
        PyObject* func = PyObject_GetAttrString(a, "__func__");
        if (!func) real(nullptr);
        keep_.push_back(func);
        if (PyFunction_Check(func))  // a classmethod binds the class, a staticmethod nothing
          return Py_IS_TYPE(a, &PyClassMethod_Type) ? Var::method(Var::constant(r.cls), name, func) : Var::constant(func);
      }
      if (const AttrStore* st = logged_attr(r.cls, name)) {  // Base.made = 5 earlier in the capture
        if (!st->value) unsupported("read of class attribute " + name + " deleted during capture: AttributeError");
        return st->value;
      }
      return real(PyObject_GetAttrString(r.cls, name.c_str()));  // a plain class attribute
    }
    if (VarPtr v = python_descriptor_get(a, rec)) return v;
    unsupported("attribute " + name + " of a " + t->tp_name + " is a descriptor kiln does not model");
  }
  if (PyObject* ga = class_lookup(t, "__getattr__"); ga && PyFunction_Check(ga)) {
    keep_.push_back(Py_NewRef(ga));
    return inline_call(ga, nullptr, {rec, real(PyUnicode_FromString(name.c_str()))}, {});
  }
  // the AttributeError eager raises: a handler in the function (try/except AttributeError) takes it
  PyErr_Format(PyExc_AttributeError, "'%s' object has no attribute '%s'", t->tp_name, name.c_str());
  PyObject *type, *err, *tb;  // with its `name`, as Python's lookup gives it
  PyErr_Fetch(&type, &err, &tb);
  PyErr_NormalizeException(&type, &err, &tb);
  PyObject* attr_name = PyUnicode_FromString(name.c_str());
  if (attr_name && err) PyObject_SetAttrString(err, "name", attr_name);
  Py_XDECREF(attr_name);
  PyErr_Restore(type, err, tb);
  real(nullptr);
  return nullptr;
}

bool Interpreter::object_has_attr(const VarPtr& rec, const std::string& name) {
  const RecordV& r = rec->as<RecordV>();
  for (PyObject* k : r.keys)
    if (PyUnicode_CompareWithASCIIString(k, name.c_str()) == 0) return true;
  if (!r.plain) return PyObject_HasAttrString(r.cls, name.c_str());
  PyObject* a = class_lookup(type_of(rec), name.c_str());
  if ((a && !is_slot(a)) || name == "__class__") return true;
  if (class_lookup(type_of(rec), "__getattr__")) unsupported("hasattr() on an object with __getattr__");
  return false;
}

void Interpreter::object_store(const VarPtr& rec, const std::string& name, VarPtr value, bool generic) {
  PyTypeObject* t = type_of(rec);
  if (!generic && t->tp_setattro != PyObject_GenericSetAttr) {
    // The class's own __setattr__ / __delattr__ decides what is stored (a frozen dataclass
    // raises): inlined, its object.__setattr__(self, ...) the generic store below.
    if (PyObject* f = python_function(t, value ? "__setattr__" : "__delattr__")) {
      keep_.push_back(Py_NewRef(f));
      std::vector<VarPtr> args = {rec, Var::steal_constant(PyUnicode_FromString(name.c_str()))};
      if (value) args.push_back(std::move(value));
      inline_call(f, nullptr, std::move(args), {});
      return;
    }
  }
  PyObject* a = class_lookup(t, name.c_str());
  if (!a && t->tp_dictoffset == 0)  // neither a slot nor a __dict__ to hold it
    unsupported(std::string("AttributeError: '") + t->tp_name + "' object has no attribute '" + name + "'");
  if (a && Py_TYPE(a)->tp_descr_set && !is_slot(a)) {
    if (PyObject_TypeCheck(a, &PyProperty_Type)) {
      PyObject* f = PyObject_GetAttrString(a, value ? "fset" : "fdel");
      if (!f) real(nullptr);
      keep_.push_back(f);
      if (!PyFunction_Check(f)) unsupported("property " + name + " cannot be set: AttributeError");
      std::vector<VarPtr> args = {rec};
      if (value) args.push_back(value);
      inline_call(f, nullptr, std::move(args), {});
      return;
    }
    // a descriptor class written in Python: its __set__ (or __delete__) inlined
    if (PyObject* f = python_function(Py_TYPE(a), value ? "__set__" : "__delete__")) {
      keep_.push_back(Py_NewRef(a));
      keep_.push_back(Py_NewRef(f));
      std::vector<VarPtr> args = {Var::constant(a), rec};
      if (value) args.push_back(value);
      inline_call(f, nullptr, std::move(args), {});
      return;
    }
    unsupported("attribute " + name + " of a " + t->tp_name + " is a data descriptor kiln does not model");
  }
  RecordV& r = rec->as<RecordV>();
  r.made = nullptr;  // a frozen object made for real from the fields before this store
  for (size_t i = 0; i < r.keys.size(); ++i)
    if (PyUnicode_CompareWithASCIIString(r.keys[i], name.c_str()) == 0) {
      if (value) {
        r.values[i] = std::move(value);
      } else {
        Py_DECREF(r.keys[i]);
        r.keys.erase(r.keys.begin() + static_cast<std::ptrdiff_t>(i));
        r.values.erase(r.values.begin() + static_cast<std::ptrdiff_t>(i));
      }
      for (const auto& [obj, view] : root()->dict_views_)
        if (obj == rec) fill_dict_view(rec, view);
      return;
    }
  if (!value) unsupported("AttributeError: del of attribute " + name + " the object does not have");
  r.keys.push_back(PyUnicode_FromString(name.c_str()));
  r.values.push_back(std::move(value));
  for (const auto& [obj, view] : root()->dict_views_)
    if (obj == rec) fill_dict_view(rec, view);
}

VarPtr Interpreter::object_dunder(const VarPtr& obj, const char* name, std::vector<VarPtr> args) {
  PyTypeObject* t = obj->get_if<RecordV>() ? type_of(obj) : Py_TYPE(obj->known());
  PyObject* f = class_lookup(t, name);
  if (f && !PyFunction_Check(f)) unsupported(std::string(name) + " of a " + t->tp_name + " is not a Python function");
  return python_dunder(obj, t, name, std::move(args));
}

PyTypeObject* Interpreter::dunder_class(const VarPtr& v) {
  if (auto* r = v->get_if<RecordV>()) return r->plain ? type_of(v) : nullptr;
  return structural(v) ? Py_TYPE(v->known()) : nullptr;
}

VarPtr Interpreter::python_dunder(const VarPtr& self, PyTypeObject* type, const char* name, std::vector<VarPtr> args) {
  PyObject* f = class_lookup(type, name);
  if (!f || !PyFunction_Check(f)) return nullptr;
  keep_.push_back(Py_NewRef(f));
  args.insert(args.begin(), self);
  return inline_call(f, nullptr, std::move(args), {});
}

OutSpec Interpreter::object_spec(const VarPtr& rec, bool at_break) {
  Interpreter* r = root();
  if (!r->building_.insert(rec.get()).second)
    unsupported(std::string("a ") + type_of(rec)->tp_name + " made during capture refers to itself");
  const RecordV& rv = rec->as<RecordV>();
  OutSpec attrs = dict_spec(rv, at_break);
  r->building_.erase(rec.get());
  OutSpec s;
  s.kind = OutSpec::Kind::Object;
  s.value = Py_NewRef(rv.cls);
  s.items.push_back(std::move(attrs));
  return s;
}

// A frozen dataclass made in the frame whose fields are Python values, used where Python needs
// the object itself (a dict key, hash, an f-string): made for real from its fields, as the
// program hands objects out, once per tracker. Its fields cannot change afterwards but through
// object.__setattr__, which drops the made object (object_store).
PyObject* Interpreter::frozen_record_object(const VarPtr& v, const char* what) {
  auto* r = v->get_if<RecordV>();
  if (!r || !r->plain) return nullptr;
  if (r->made) return r->made;
  PyObject* params = PyObject_GetAttrString(r->cls, "__dataclass_params__");
  PyObject* frozen = params ? PyObject_GetAttrString(params, "frozen") : nullptr;
  const bool is_frozen = frozen == Py_True;
  Py_XDECREF(frozen);
  Py_XDECREF(params);
  clear_error();
  if (!is_frozen) return nullptr;
  PyObject* empty = PyTuple_New(0);
  PyObject* obj = PyBaseObject_Type.tp_new(reinterpret_cast<PyTypeObject*>(r->cls), empty, nullptr);
  Py_DECREF(empty);
  if (!obj) real(nullptr);
  keep_.push_back(obj);
  for (size_t i = 0; i < r->keys.size(); ++i)
    if (PyObject_GenericSetAttr(obj, r->keys[i], const_obj(r->values[i], what)) < 0) real(nullptr);
  r->made = obj;
  return obj;
}

// ---- nn.Module subclasses made during capture ----
//
// `Block(dim)(x)` in a forward: the object is made for real with object.__new__ (no user code
// runs), and the class's __init__ is inlined with it as `self`. torch's own Module.__init__,
// reached through super(), runs for real on it; the object is private to this capture, so each
// attribute store is done on it at once (a Python value, or a module made here), and reads see
// them. Calls of it inline its forward as for any module. A module whose __init__ leaves it
// owning parameters, buffers or tensors is refused: eager makes them afresh at every call, where
// an entry would keep the first call's. Handing the object out (a return, a graph break) is
// refused as for torch's modules made here.
VarPtr Interpreter::make_user_module(PyObject* cls, std::vector<VarPtr> args, const KwArgs& kwargs) {
  if (!PyType_Check(cls) || !is_nn_module_class(cls)) return nullptr;
  auto* t = reinterpret_cast<PyTypeObject*>(cls);
  if (!PyType_HasFeature(t, Py_TPFLAGS_HEAPTYPE) || Py_TYPE(cls)->tp_call != PyType_Type.tp_call ||
      t->tp_new != PyBaseObject_Type.tp_new || PyType_HasFeature(t, Py_TPFLAGS_IS_ABSTRACT))
    return nullptr;
  PyObject* modname = PyObject_GetAttrString(cls, "__module__");
  const bool torchs = modname && PyUnicode_Check(modname) && PyUnicode_AsUTF8(modname) &&
                      std::string(PyUnicode_AsUTF8(modname)).rfind("torch.", 0) == 0;
  Py_XDECREF(modname);
  clear_error();
  if (torchs) return nullptr;  // torch's own classes: make_torch_module's, or not captured
  PyObject* init = class_lookup(t, "__init__");
  if (!init || !PyFunction_Check(init)) return nullptr;
  PyObject* empty = PyTuple_New(0);
  PyObject* obj = t->tp_new(t, empty, nullptr);
  Py_DECREF(empty);
  if (!obj) real(nullptr);
  keep_.push_back(obj);
  root()->private_.insert(obj);
  keep_.push_back(Py_NewRef(init));
  VarPtr m = Var::module(obj, Source::made(obj));
  // A class without an __init__ of its own gets torch's, run for real by the call of the bound
  // method (calls.cpp), as super().__init__() is.
  VarPtr r = call(Var::method(m, "__init__", init), std::move(args), kwargs);
  if (!(r->is_const() && r->known() == Py_None)) unsupported("__init__() should return None: TypeError");
  // What eager makes afresh at every call cannot be made once here.
  if (const char* owned = fresh_state(obj, true))
    unsupported(std::string(t->tp_name) + " built in the function owns " + owned + " (made afresh at every call)");
  return m;
}

}  // namespace kiln::bind::detail
