// Attribute stores on objects capture does not track: logged, read back, and checked undone.
#include <algorithm>

#include "bind/capture/interpreter.h"
#include "bind/interrupts.h"

namespace kiln::bind::detail {

VarPtr Interpreter::private_copy(PyObject* copier, const VarPtr& of) {
  PyObject* src = const_obj(of, "object to copy");  // an object of the caller's: now pinned by identity
  PyObject* copy = PyObject_CallOneArg(copier, src);
  if (!copy) real(nullptr);
  keep_.push_back(copy);
  root()->private_.insert(copy);
  return Var::constant(copy);
}

void Interpreter::store_attr(const VarPtr& obj, const std::string& name, VarPtr value, bool generic) {
  const bool private_module = obj->kind() == Var::Kind::Module && obj->obj() && is_private(obj->obj());
  if ((obj->is_const() && is_private(obj->known())) || private_module) {  // a private object: the store is done now
    PyObject* v = !value ? nullptr
                  : value->kind() == Var::Kind::Module && value->source && value->source->made_in_frame() ? value->obj()
                                                                                                        : const_obj(value, "attribute value");
    if ((v ? PyObject_SetAttrString(obj->known(), name.c_str(), v) : PyObject_DelAttrString(obj->known(), name.c_str())) < 0)
      real(nullptr);
    return;
  }
  if (auto* r = obj->get_if<RecordV>(); r && r->plain) return object_store(obj, name, std::move(value), generic);
  if (obj->kind() == Var::Kind::Record) {
    if (!value) unsupported("del of a dataclass field");
    PyObject* key = PyUnicode_FromString(name.c_str());
    record_store(obj, key, std::move(value), false);
    Py_DECREF(key);
    return;
  }
  if (!(obj->is_const() || obj->kind() == Var::Kind::Module) || !obj->obj())
    unsupported("attribute assignment on a value kiln does not track");
  if (obj->is_const()) {
    // The log holds the value as stored; a class that changes it on the way in (its own
    // __setattr__, a data descriptor) would be read back differently in this call.
    PyTypeObject* t = Py_TYPE(obj->obj());
    if (!generic && !PyType_Check(obj->obj()) && t->tp_setattro != PyObject_GenericSetAttr) {
      // The class's own __setattr__ written in Python (transformers' configs map attribute
      // names): inlined, its super().__setattr__ a generic store logged here.
      static PyObject* setattr_name = PyUnicode_InternFromString("__setattr__");
      PyObject* f = _PyType_Lookup(t, setattr_name);
      if (value && f && PyFunction_Check(f) && !is_torch_internal(f)) {
        call(Var::method(obj, "__setattr__", f), {Var::steal_constant(PyUnicode_FromString(name.c_str())), std::move(value)}, {});
        return;
      }
      unsupported(std::string("attribute assignment through ") + t->tp_name + ".__setattr__");
    }
    PyObject* key = PyUnicode_FromString(name.c_str());
    PyObject* d = key && !PyType_Check(obj->obj()) ? _PyType_Lookup(t, key) : nullptr;  // borrowed
    Py_XDECREF(key);
    // (a __slots__ member, or a C type's field as autograd's ctx.to_save, stores as is)
    if (d && Py_TYPE(d)->tp_descr_set && !Py_IS_TYPE(d, &PyMemberDescr_Type) && !Py_IS_TYPE(d, &PyGetSetDescr_Type))
      unsupported("attribute " + name + " of a " + t->tp_name + " is a data descriptor: its store runs in Python");
  }
  if (value && value->kind() == Var::Kind::Module && is_private(value->obj()))
    unsupported("a module the function made (a user nn.Module) stored where the caller sees it");  // its state is this capture's
  keep_.push_back(Py_NewRef(obj->obj()));
  root()->attr_stores_.push_back(AttrStore{obj->obj(), name, std::move(value), obj->source, generic});
}

const Interpreter::AttrStore* Interpreter::logged_attr(PyObject* obj, const std::string& name) {
  auto& log = root()->attr_stores_;
  // a module's attribute is an item of its dict, which `global name` stores into
  PyObject* dict = PyModule_Check(obj) ? PyModule_GetDict(obj) : nullptr;
  auto find = [&](PyObject* o) -> const AttrStore* {
    for (auto it = log.rbegin(); it != log.rend(); ++it)
      if ((it->obj == o || (dict && it->obj == dict)) && it->name == name) return &*it;
    return nullptr;
  };
  if (const AttrStore* st = find(obj)) return st;
  // (the walk below only where some class has this name stored: most reads find none)
  if (PyModule_Check(obj) ||
      std::none_of(log.begin(), log.end(), [&](const AttrStore& a) { return a.name == name && PyType_Check(a.obj); }))
    return nullptr;
  // Not stored on the object itself: a store on a class it finds the name on (Base.made = 5,
  // then Child.made or an instance's read), unless the object or a class before it in the
  // MRO holds the name itself
  PyObject* key = PyUnicode_FromString(name.c_str());
  if (!key) return clear_error(), nullptr;
  const bool is_class = PyType_Check(obj);
  PyObject* own = is_class ? Py_XNewRef(reinterpret_cast<PyTypeObject*>(obj)->tp_dict) : PyObject_GenericGetDict(obj, nullptr);
  if (!own) clear_error();
  const bool shadowed = own && PyDict_Check(own) && PyDict_Contains(own, key) == 1;
  Py_XDECREF(own);
  const AttrStore* found = nullptr;
  PyObject* mro = shadowed ? nullptr : (is_class ? reinterpret_cast<PyTypeObject*>(obj) : Py_TYPE(obj))->tp_mro;
  for (Py_ssize_t i = is_class ? 1 : 0; mro && i < PyTuple_GET_SIZE(mro); ++i) {
    PyObject* c = PyTuple_GET_ITEM(mro, i);
    if ((found = find(c))) break;
    PyObject* cd = reinterpret_cast<PyTypeObject*>(c)->tp_dict;
    if (cd && PyDict_Contains(cd, key) == 1) break;
  }
  Py_DECREF(key);
  return found;
}

namespace {

// Whether `v` is what obj.name (an item of a module's dict: a global) holds now: the same
// object, or an equal Python scalar.
bool holds(PyObject* obj, const std::string& name, const VarPtr& v, bool global) {
  PyObject* now = global ? Py_XNewRef(PyDict_GetItemString(obj, name.c_str())) : PyObject_GetAttrString(obj, name.c_str());
  if (!now) {
    clear_error();
    return !v;
  }
  bool same = false;
  if (v && v->symint().valid()) {  // a symbolic int (a counter): replayed, never read as a value
    Py_DECREF(now);
    return false;
  }
  if (v && v->is_const()) {
    same = now == v->obj();
    if (!same && Py_TYPE(now) == Py_TYPE(v->obj()) && is_python_scalar(now)) {
      int eq = PyObject_RichCompareBool(now, v->obj(), Py_EQ);
      if (eq < 0) clear_error();
      same = eq == 1;
    }
  } else if (v && v->kind() == Var::Kind::Module) {
    same = now == v->obj();
  }
  Py_DECREF(now);
  return same;
}

}  // namespace

std::vector<StoreReplay> Interpreter::store_replays(size_t upto, bool at_break) {
  auto& log = root()->attr_stores_;
  std::vector<StoreReplay> out;
  for (size_t i = 0; i < upto && i < log.size(); ++i) {
    bool last = true;  // only the last store of each attribute decides
    for (size_t j = i + 1; j < upto && j < log.size(); ++j)
      if (log[j].obj == log[i].obj && log[j].name == log[i].name) last = false;
    const bool global = log[i].source && log[i].source->kind == Source::Kind::Globals;
    if (!last || holds(log[i].obj, log[i].name, log[i].value, global)) continue;
    if (log[i].source && log[i].source->made_in_frame()) continue;  // the frame's own object: gone after the call
    if (!log[i].source)
      unsupported("attribute assignment on an object the caller can see (" + std::string(Py_TYPE(log[i].obj)->tp_name) + "." +
                  log[i].name + " would stay changed, and kiln has no source to redo the store on)");
    StoreReplay r{log[i].source, log[i].name, {}};
    r.generic = log[i].generic;
    if (log[i].value) r.value = at_break ? break_spec(log[i].value) : output_spec(log[i].value);
    else r.value.kind = OutSpec::Kind::Unbound;
    out.push_back(std::move(r));
  }
  for (StoreReplay& r : container_replays(at_break)) out.push_back(std::move(r));
  return out;
}

}  // namespace kiln::bind::detail
