// Dataclass instances made during capture: model outputs and small config records.
//
// `Out(last_hidden_state=h, pooler_output=p)` never runs for real while capturing: its fields
// are trackers (tensors, tuples, None), read back by attribute, and the object is built for real
// only where the program hands it out (a return, a graph break), from its fields, so that its
// own __init__ and __post_init__ run as in eager. Only the dataclass-generated __init__ is
// modelled: it stores each field. A dataclass that is also a dict follows the protocol of
// transformers' ModelOutput: its mapping holds the fields that are not None, in field order,
// integers index the tuple of those, and setting a field or an item updates both views.
#include "bind/capture/interpreter.h"
#include "bind/interrupts.h"
#include "bind/python_objects.h"

namespace kiln::bind::detail {

namespace {

bool is_none(const VarPtr& v) { return v && v->is_const() && v->known() == Py_None; }

PyObject* dataclass_fields(PyObject* cls) {
  static PyObject* fields = object_at("dataclasses.fields");
  PyObject* r = fields ? PyObject_CallOneArg(fields, cls) : nullptr;
  if (!r) clear_error();
  return r;
}

Py_ssize_t key_index(const VarPtr& rec, const char* name) {
  for (size_t i = 0; i < rec->as<RecordV>().keys.size(); ++i)
    if (PyUnicode_CompareWithASCIIString(rec->as<RecordV>().keys[i], name) == 0) return static_cast<Py_ssize_t>(i);
  return -1;
}

bool is_mapping(const VarPtr& rec) { return PyObject_IsSubclass(rec->as<RecordV>().cls, reinterpret_cast<PyObject*>(&PyDict_Type)) == 1; }

}  // namespace

VarPtr Interpreter::make_record(PyObject* cls, const std::vector<VarPtr>& args, const KwArgs& kwargs) {
  if (!PyType_Check(cls) || !PyObject_HasAttrString(cls, "__dataclass_fields__")) return nullptr;
  // Only the generated __init__ (it assigns each field; a hand-written one is inlined like any call)
  PyObject* init = PyObject_GetAttrString(cls, "__init__");
  bool generated = init && PyFunction_Check(init) &&
                   PyUnicode_CompareWithASCIIString(
                       reinterpret_cast<PyCodeObject*>(PyFunction_GET_CODE(init))->co_filename, "<string>") == 0;
  Py_XDECREF(init);
  clear_error();
  if (!generated) return nullptr;
  auto* type = reinterpret_cast<PyTypeObject*>(cls);
  const bool mapping = PyObject_IsSubclass(cls, reinterpret_cast<PyObject*>(&PyDict_Type)) == 1;
  const bool post_init = PyObject_HasAttrString(cls, "__post_init__");
  // A __post_init__ or a __setattr__ of its own (frozen dataclasses, torch's pytree TreeSpec) is
  // code to run: the class is made as any user class, its generated __init__ inlined.
  if (!mapping && (post_init || type->tp_setattro != PyObject_GenericSetAttr)) return nullptr;
  PyObject* fields = dataclass_fields(cls);
  if (!fields) return nullptr;
  keep_.push_back(fields);
  PyObject* all = PyObject_GetAttrString(cls, "__dataclass_fields__");
  bool initvars = all && PyDict_Check(all) && PyDict_Size(all) != PyTuple_GET_SIZE(fields);
  Py_XDECREF(all);
  if (initvars) unsupported(std::string("dataclass ") + type->tp_name + " with InitVar or ClassVar fields");
  static PyObject* missing = object_at("dataclasses.MISSING");
  auto rec = std::make_shared<Var>(RecordV{});
  rec->as<RecordV>().cls = Py_NewRef(cls);
  size_t pos = 0;
  std::vector<bool> used(kwargs.size(), false);
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(fields); ++i) {
    PyObject* f = PyTuple_GET_ITEM(fields, i);
    PyObject* name = PyObject_GetAttrString(f, "name");
    PyObject* in_init = PyObject_GetAttrString(f, "init");
    PyObject* dflt = PyObject_GetAttrString(f, "default");
    PyObject* factory = PyObject_GetAttrString(f, "default_factory");
    rec->as<RecordV>().keys.push_back(name);  // owned by the tracker
    VarPtr v;
    if (in_init == Py_True) {
      if (pos < args.size()) v = args[pos++];
      for (size_t k = 0; k < kwargs.size(); ++k)
        if (PyUnicode_CompareWithASCIIString(name, kwargs[k].first.c_str()) == 0) {
          if (v) unsupported(std::string(type->tp_name) + "() got multiple values for argument '" + kwargs[k].first + "'");
          v = kwargs[k].second;
          used[k] = true;
        }
    }
    if (!v && dflt && dflt != missing) v = Var::constant(dflt);
    if (!v && factory && factory != missing) {
      Py_XDECREF(in_init), Py_XDECREF(dflt), Py_XDECREF(factory);
      unsupported(std::string("dataclass ") + type->tp_name + " field with a default_factory");
    }
    Py_XDECREF(in_init), Py_XDECREF(dflt), Py_XDECREF(factory);
    if (!v) unsupported(std::string(type->tp_name) + "() missing argument '" + PyUnicode_AsUTF8(name) + "'");
    rec->as<RecordV>().values.push_back(v);
  }
  if (pos < args.size()) unsupported(std::string(type->tp_name) + "() takes too many positional arguments");
  for (size_t k = 0; k < kwargs.size(); ++k)
    if (!used[k]) unsupported(std::string(type->tp_name) + "() got an unexpected keyword argument '" + kwargs[k].first + "'");
  if (mapping && post_init) {
    // ModelOutput.__post_init__: a tensor (or any other field set) means "map the fields as they are"
    RecordV& r = rec->as<RecordV>();
    bool others_none = std::all_of(r.values.begin() + (r.values.empty() ? 0 : 1), r.values.end(), is_none);
    if (r.values.empty()) unsupported(std::string(type->tp_name) + " has no fields: ValueError");
    if (others_none && !r.values[0]->is_tensor()) {
      // __post_init__ tries iter(first): None is not iterable and maps nothing; a tuple or list
      // whose first item is not a (key, value) pair maps the first field as it is. A first
      // field of pairs sets the fields the pairs name (not modelled: the call runs in Python).
      const VarPtr& first = r.values[0];
      const bool sequence = first->kind() == Var::Kind::Tuple || first->kind() == Var::Kind::List;
      auto is_pair = [](const VarPtr& v) {
        return (v->kind() == Var::Kind::Tuple || v->kind() == Var::Kind::List) && v->seq().size() == 2 &&
               v->seq()[0]->is_const() && PyUnicode_Check(v->seq()[0]->known());
      };
      if (is_none(first)) return rec;
      if (!sequence || first->seq().empty() || is_pair(first->seq()[0]))
        unsupported(std::string(type->tp_name) + " built from a single non-tensor value");
      r.view.push_back(0);
      return rec;
    }
    for (size_t i = 0; i < r.values.size(); ++i)
      if (!is_none(r.values[i])) r.view.push_back(i);
  }
  return rec;
}

VarPtr Interpreter::record_attr(const VarPtr& rec, const std::string& name) {
  Py_ssize_t i = key_index(rec, name.c_str());
  if (i >= 0) return rec->as<RecordV>().values[i];
  if (name == "__class__") return Var::constant(rec->as<RecordV>().cls);
  PyObject* a = PyObject_GetAttrString(rec->as<RecordV>().cls, name.c_str());
  if (!a) real(nullptr);
  if (PyFunction_Check(a) || PyCFunction_Check(a) || Py_TYPE(a) == &PyMethodDescr_Type ||
      Py_TYPE(a) == &PyWrapperDescr_Type) {
    VarPtr m = Var::method(rec, name, PyFunction_Check(a) ? a : nullptr);
    Py_DECREF(a);
    return m;
  }
  if (PyObject_HasAttrString(reinterpret_cast<PyObject*>(Py_TYPE(a)), "__get__")) {
    Py_DECREF(a);
    unsupported("attribute " + name + " of a dataclass instance is a descriptor");
  }
  return Var::steal_constant(a);
}

void Interpreter::record_store(const VarPtr& rec, PyObject* name, VarPtr value, bool item) {
  const bool mapping = is_mapping(rec);
  if (item && !mapping) unsupported("item assignment into a dataclass instance that is not a dict");
  if (!PyUnicode_Check(name)) unsupported("a dataclass mapping key that is not a str");
  Py_ssize_t i = key_index(rec, PyUnicode_AsUTF8(name));
  PyObject* fields = dataclass_fields(rec->as<RecordV>().cls);
  const bool field = i >= 0 && fields && i < PyTuple_GET_SIZE(fields);
  Py_XDECREF(fields);
  if (i < 0) {
    rec->as<RecordV>().keys.push_back(Py_NewRef(name));
    rec->as<RecordV>().values.push_back(value);
    i = static_cast<Py_ssize_t>(rec->as<RecordV>().keys.size()) - 1;
  } else {
    rec->as<RecordV>().values[i] = value;
  }
  const bool mapped = std::find(rec->as<RecordV>().view.begin(), rec->as<RecordV>().view.end(), static_cast<size_t>(i)) != rec->as<RecordV>().view.end();
  if (mapping && !mapped && (item || (field && !is_none(value)))) rec->as<RecordV>().view.push_back(static_cast<size_t>(i));
}

VarPtr Interpreter::record_subscript(const VarPtr& rec, const VarPtr& key) {
  if (!is_mapping(rec)) unsupported("subscript of a dataclass instance that is not a dict");
  PyObject* k = const_obj(key, "key");
  if (PyUnicode_Check(k)) {
    for (size_t i : rec->as<RecordV>().view)
      if (PyUnicode_Compare(rec->as<RecordV>().keys[i], k) == 0) return rec->as<RecordV>().values[i];
    unsupported(std::string("KeyError: '") + PyUnicode_AsUTF8(k) + "'");
  }
  return subscript(call_record_method(rec, "to_tuple", {}, {}), key);
}

VarPtr Interpreter::call_record_method(const VarPtr& rec, const std::string& name, const std::vector<VarPtr>& args,
                                       const KwArgs& kwargs) {
  if (is_mapping(rec) && kwargs.empty()) {
    std::vector<VarPtr> out;
    if ((name == "to_tuple" || name == "values" || name == "keys" || name == "items") && args.empty()) {
      for (size_t i : rec->as<RecordV>().view) {
        VarPtr k = Var::constant(rec->as<RecordV>().keys[i]);
        out.push_back(name == "keys" ? k : name == "items" ? Var::tuple({k, rec->as<RecordV>().values[i]}) : rec->as<RecordV>().values[i]);
      }
      return Var::tuple(std::move(out), name != "to_tuple");
    }
    if (name == "__getitem__" && args.size() == 1) return record_subscript(rec, args[0]);
    if (name == "get" && (args.size() == 1 || args.size() == 2)) {
      PyObject* k = const_obj(args[0], "key");
      for (size_t i : rec->as<RecordV>().view)
        if (PyObject_RichCompareBool(rec->as<RecordV>().keys[i], k, Py_EQ) == 1) return rec->as<RecordV>().values[i];
      return args.size() == 2 ? args[1] : Var::constant(Py_None);
    }
    if (name == "__setitem__" && args.size() == 2) {
      record_store(rec, const_obj(args[0], "key"), args[1], true);
      return Var::constant(Py_None);
    }
  }
  PyObject* f = PyObject_GetAttrString(rec->as<RecordV>().cls, name.c_str());
  if (!f) real(nullptr);
  keep_.push_back(f);
  if (!PyFunction_Check(f)) unsupported("method " + name + " of a dataclass instance");
  std::vector<VarPtr> all = {rec};
  all.insert(all.end(), args.begin(), args.end());
  return inline_call(f, nullptr, std::move(all), kwargs);
}

OutSpec Interpreter::record_spec(const VarPtr& rec, bool at_break) {
  // Built anew from its fields: only a state that construction reproduces can be handed out.
  PyObject* fields = dataclass_fields(rec->as<RecordV>().cls);
  const size_t nfields = fields ? static_cast<size_t>(PyTuple_GET_SIZE(fields)) : 0;
  Py_XDECREF(fields);
  bool standard = rec->as<RecordV>().keys.size() == nfields;
  if (standard && is_mapping(rec) && PyObject_HasAttrString(rec->as<RecordV>().cls, "__post_init__")) {
    std::vector<size_t> expect;
    for (size_t i = 0; i < rec->as<RecordV>().values.size(); ++i)
      if (!is_none(rec->as<RecordV>().values[i])) expect.push_back(i);
    standard = expect == rec->as<RecordV>().view;
  }
  if (!standard) unsupported(std::string("a ") + reinterpret_cast<PyTypeObject*>(rec->as<RecordV>().cls)->tp_name +
                             " changed after construction in a way kiln cannot rebuild");
  OutSpec kw;
  kw.kind = OutSpec::Kind::Dict;
  kw.value = PyTuple_New(static_cast<Py_ssize_t>(nfields));
  for (size_t i = 0; i < nfields; ++i) {
    PyTuple_SET_ITEM(kw.value, i, Py_NewRef(rec->as<RecordV>().keys[i]));
    kw.items.push_back(at_break ? break_spec(rec->as<RecordV>().values[i]) : output_spec(rec->as<RecordV>().values[i]));
  }
  OutSpec s;
  s.kind = OutSpec::Kind::Construct;
  s.value = Py_NewRef(rec->as<RecordV>().cls);
  s.items.push_back(std::move(kw));
  return s;
}

}  // namespace kiln::bind::detail
