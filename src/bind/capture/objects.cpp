#include "bind/capture/interpreter.h"
#include "bind/interrupts.h"
#include "bind/python_objects.h"
#include "bind/capture/resume.h"
#include "bind/capture/torch_call.h"
#include "bind/runtime/compiled_function.h"
#include "bind/torch/tensor_bridge.h"

namespace kiln::bind::detail {

bool Interpreter::is_own_cell(int slot) const {
  auto* co = reinterpret_cast<PyCodeObject*>(code_);
  return slot < co->co_nlocalsplus - co->co_nfreevars;
}

VarPtr Interpreter::read_free_var(const Instr& in) {
  auto* co = reinterpret_cast<PyCodeObject*>(code_);
  int first_free = co->co_nlocalsplus - co->co_nfreevars;
  if (in.arg < first_free) unsupported("read of an unbound cell variable");
  PyObject* closure = PyFunction_GET_CLOSURE(fn_);
  Py_ssize_t k = in.arg - first_free;
  PyObject* cell = closure ? PyTuple_GET_ITEM(closure, k) : nullptr;
  if (const AttrStore* st = cell ? logged_attr(cell, "cell_contents") : nullptr) {  // `nonlocal` stored in this capture
    if (!st->value) unsupported("read of an empty closure cell");
    return st->value;
  }
  PyObject* v = cell ? PyCell_GET(cell) : nullptr;
  if (!v) unsupported("read of an empty closure cell");
  PyObject* name = PyTuple_GET_ITEM(co->co_localsplusnames, in.arg);
  SourcePtr src;
  if (!parent_) src = Source::closure(k, PyUnicode_AsUTF8(name));
  else if (fn_source_) src = Source::attr(Source::item(Source::attr(fn_source_, "__closure__"), k), "cell_contents");
  // A function with no source of its own (a method found on a class, one reached through
  // super()): its cell, which the function holds for good, is read at every call and guarded
  // (the enclosing function may rebind the variable, or change the list it holds).
  else src = Source::attr(Source::pinned_object(PyTuple_GET_ITEM(closure, k), std::string("cell '") + PyUnicode_AsUTF8(name) + "' of " +
                                                                                   PyUnicode_AsUTF8(co->co_qualname)),
                          "cell_contents");
  return wrap(v, src);
}

VarPtr Interpreter::frame_locals() {
  auto* co = reinterpret_cast<PyCodeObject*>(code_);
  VarPtr d = Var::dict();
  const int first_free = co->co_nlocalsplus - co->co_nfreevars;
  for (int i = 0; i < co->co_nlocalsplus; ++i) {
#if PY_VERSION_HEX >= 0x030C0000
    constexpr unsigned char kHidden = 0x10;  // CO_FAST_HIDDEN (CPython's internal pycore_code.h)
    if (reinterpret_cast<const unsigned char*>(PyBytes_AS_STRING(co->co_localspluskinds))[i] & kHidden)
      continue;  // an inlined comprehension's variable: not in locals()
#endif
    VarPtr slot = locals_.at(i);
    if (!slot && i >= first_free) {
      Instr in{};
      in.arg = i;
      slot = locals_.at(i) = read_free_var(in);
    }
    VarPtr v = slot && slot->kind() == Var::Kind::Cell ? slot->as<CellV>().content : slot;
    if (v) dict_set(d, PyTuple_GET_ITEM(co->co_localsplusnames, i), v);
  }
  return d;
}

VarPtr Interpreter::make_function(const VarPtr& code, const VarPtr& defaults, const VarPtr& kwdefaults, const VarPtr& closure) {
  PyObject* co = const_obj(code, "code");
  if (!PyCode_Check(co)) unsupported("MAKE_FUNCTION without a code object");
  PyObject* f = PyFunction_New(co, globals_);
  if (!f) real(nullptr);
  VarPtr fv = std::make_shared<Var>(FunctionV{f});
  FunctionV& fd = fv->as<FunctionV>();
  if (defaults && PyFunction_SetDefaults(f, const_obj(defaults, "default argument")) < 0) real(nullptr);
  if (kwdefaults && PyFunction_SetKwDefaults(f, const_obj(kwdefaults, "keyword default")) < 0) real(nullptr);
  fd.rebuildable = true;
  if (closure) {
    if (closure->kind() != Var::Kind::Tuple) unsupported("malformed closure");
    const auto& items = closure->seq();
    PyObject* cells = PyTuple_New(static_cast<Py_ssize_t>(items.size()));
    for (size_t i = 0; i < items.size(); ++i) {
      const VarPtr& c = items[i];
      if (c->kind() != Var::Kind::Cell) unsupported("malformed closure cell");
      fd.cells.push_back(c);
      const VarPtr& content = c->as<CellV>().content;
      bool constant = content && (content->is_const() || content->kind() == Var::Kind::Module);
      if (!constant) fd.rebuildable = false;
      PyTuple_SET_ITEM(cells, i, PyCell_New(constant ? content->obj() : nullptr));
    }
    int rc = PyFunction_SetClosure(f, cells);
    Py_DECREF(cells);
    if (rc < 0) real(nullptr);
  }
  return fv;
}

VarPtr Interpreter::make_super(const std::vector<VarPtr>& args) {
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
  // super(cls, type(self)): the lookup along type(self)'s MRO after cls, never bound to the
  // object capture saw (a compiled entry serves other objects of that type); super_attr binds
  // what it finds to the receiver's tracker.
  PyObject* self_type = nullptr;
  if (auto* r = self ? self->get_if<RecordV>() : nullptr; r && r->plain) self_type = r->cls;
  else if (self && (self->kind() == Var::Kind::Module || self->is_const()))
    self_type = reinterpret_cast<PyObject*>(Py_TYPE(self->known()));
  if (!cls || !self_type) unsupported("super() of this receiver");
  if (!PyType_Check(cls) || PyObject_IsSubclass(self_type, cls) != 1) unsupported("super(type, obj): obj must be an instance or subtype of type: TypeError");
  VarPtr v = real(PyObject_CallFunctionObjArgs(builtin("super"), cls, self_type, nullptr));
  v->as<ConstV>().super_self = self;
  return v;
}

VarPtr Interpreter::super_attr(const VarPtr& sup, const std::string& name) {
  const VarPtr& self = sup->as<ConstV>().super_self;
  PyObject* thisclass = PyObject_GetAttrString(sup->obj(), "__thisclass__");
  PyObject* self_type = PyObject_GetAttrString(sup->obj(), "__self_class__");
  keep_.push_back(thisclass), keep_.push_back(self_type);
  if (!thisclass || !self_type) real(nullptr);
  // The attribute as the class after `thisclass` in the MRO defines it (the raw descriptor).
  PyObject* mro = reinterpret_cast<PyTypeObject*>(self_type)->tp_mro;
  PyObject* raw = nullptr;
  bool after = false;
  Py_ssize_t found_at = -1;
  for (Py_ssize_t i = 0; mro && i < PyTuple_GET_SIZE(mro) && !raw; ++i) {
    PyObject* base = PyTuple_GET_ITEM(mro, i);
    found_at = i;
    if (after) {
      // the class's own namespace (a mappingproxy: built-in types keep theirs out of tp_dict on 3.12)
      PyObject* ns = PyObject_GetAttrString(base, "__dict__");
      raw = ns ? PyMapping_GetItemString(ns, name.c_str()) : nullptr;
      Py_XDECREF(ns);
      if (raw) keep_.push_back(raw);
      else clear_error();
    }
    after |= base == thisclass;
  }
  if (!raw) return real(PyObject_GetAttrString(sup->obj(), name.c_str()));  // raises AttributeError as Python does
  if (self->known() && PyDict_Check(self->known()) && Py_IS_TYPE(raw, &PyMethodDescr_Type) &&
      (name == "get" || name == "keys" || name == "items" || name == "values"))
    return Var::method(self, name);  // super().get(k) in a dict subclass: dict's read of the entries, guarded
  if (PyFunction_Check(raw) || Py_IS_TYPE(raw, &PyWrapperDescr_Type) || Py_IS_TYPE(raw, &PyMethodDescr_Type))
    return Var::method(self, name, raw);  // bound to the receiver's tracker when called or handed out
  if (Py_IS_TYPE(raw, &PyClassMethod_Type)) {
    PyObject* func = PyObject_GetAttrString(raw, "__func__");
    keep_.push_back(func);
    if (func && PyFunction_Check(func)) {
      // cls: the receiver's class, read through itself so what the method reads off it
      // (cls.coeff) is guarded
      VarPtr cls = Var::constant(self_type);
      cls->source = Source::pinned_object(self_type, std::string("class ") + reinterpret_cast<PyTypeObject*>(self_type)->tp_name);
      return Var::method(cls, name, func);
    }
  }
  if (PyObject_TypeCheck(raw, &PyProperty_Type)) {
    PyObject* fget = PyObject_GetAttrString(raw, "fget");
    keep_.push_back(fget);
    if (fget && PyFunction_Check(fget)) return inline_call(fget, nullptr, {self}, {});
  }
  // a staticmethod's function, a plain class attribute: what super(cls, type(self)) gives,
  // guarded where it lives (type(self).__mro__[i].name) when self came from the caller, since a
  // class attribute can be reassigned between calls
  PyObject* v = PyObject_GetAttrString(sup->obj(), name.c_str());
  if (v && self->source && !self->source->made_in_frame() && found_at >= 0 && !PyFunction_Check(v)) {
    SourcePtr where = Source::attr(Source::item(Source::attr(Source::attr(self->source, "__class__"), "__mro__"), found_at), name);
    VarPtr r = wrap(v, where);
    Py_DECREF(v);
    return r;
  }
  return real(v);
}

VarPtr Interpreter::generic_getattr(PyObject* f, const VarPtr& obj, const std::vector<VarPtr>& args, const KwArgs& kwargs) {
  static PyObject* object_getattribute =
      PyObject_GetAttrString(reinterpret_cast<PyObject*>(&PyBaseObject_Type), "__getattribute__");
  if (f != object_getattribute || args.size() != 1 || !kwargs.empty() || !args[0]->is_const() ||
      !PyUnicode_Check(args[0]->obj()))
    return nullptr;
  const std::string name = PyUnicode_AsUTF8(args[0]->obj());
  if (obj->kind() == Var::Kind::Record) return getattr(obj, name);  // kiln's own model of the object
  if (!obj->is_const() || !obj->obj()) return nullptr;
  if (const AttrStore* st = logged_attr(obj->obj(), name)) {
    if (!st->value) unsupported("read of attribute " + name + " deleted during capture: AttributeError");
    return st->value;
  }
  PyObject* v = PyObject_GenericGetAttr(obj->obj(), args[0]->obj());
  if (!v) return real(nullptr);  // AttributeError, as eager raises it
  // Guarded through the object's source: reading it there goes through the class's override,
  // which hands this same lookup back.
  if (obj->source) {
    VarPtr r = wrap(v, Source::attr(obj->source, name));
    Py_DECREF(v);
    return r;
  }
  return Var::steal_constant(v);
}

bool Interpreter::stable_module(PyObject* module) {
  static std::unordered_map<PyObject*, bool> known;  // modules live for the process
  if (auto it = known.find(module); it != known.end()) return it->second;
  PyObject* name = PyModule_GetNameObject(module);
  std::string n = name && PyUnicode_Check(name) ? PyUnicode_AsUTF8(name) : "";
  Py_XDECREF(name);
  const std::string top = n.substr(0, n.find('.'));
  static PyObject* stdlib = object_at("sys.stdlib_module_names");
  PyObject* top_name = PyUnicode_FromString(top.c_str());
  const bool in_stdlib = stdlib && top_name && PySet_Contains(stdlib, top_name) == 1;
  Py_XDECREF(top_name);
  clear_error();
  const bool stable = top == "torch" || in_stdlib || top == "numpy";
  known.emplace(module, stable);
  return stable;
}

bool Interpreter::dict_storage_reads(PyTypeObject* type, const std::string& name) {
  static PyObject* ordered = object_at("collections.OrderedDict");
  auto* base_type = ordered && PyType_IsSubtype(type, reinterpret_cast<PyTypeObject*>(ordered))
                        ? reinterpret_cast<PyTypeObject*>(ordered)
                        : &PyDict_Type;
  bool same = true;
  for (const char* n : {name.c_str(), "__iter__"}) {
    PyObject* key = PyUnicode_FromString(n);
    same = same && key && _PyType_Lookup(type, key) == _PyType_Lookup(base_type, key);
    Py_XDECREF(key);
  }
  clear_error();
  return same;
}

VarPtr Interpreter::getattr(VarPtr base, const std::string& name) {
  if ((base->is_const() || base->kind() == Var::Kind::Module) && base->obj())
    if (const AttrStore* st = logged_attr(base->obj(), name)) {
      if (!st->value) unsupported("read of attribute " + name + " deleted during capture: AttributeError");
      return st->value;
    }
  if (base->is_const() && base->as<ConstV>().super_self && PyObject_TypeCheck(base->obj(), &PySuper_Type)) return super_attr(base, name);
  if (base->is_array()) return array_attr(base, name);
  if (base->is_tensor()) {
    const ir::TensorMeta& m = base->node()->meta;
    if (name == "shape") return shape_tuple(m);
    if (name == "dtype") return Var::constant(torch_dtype_object(m.dtype));
    if (name == "device") return Var::constant(torch_device_object(m.device));
    if (name == "ndim") return Var::steal_constant(PyLong_FromLongLong(m.dim()));
    if (name == "is_cuda") return Var::constant(m.device.type == DeviceType::CUDA ? Py_True : Py_False);
    // (kiln's dtypes are real: the conjugate transposes H and mH are T and mT; H of more than
    // two dims is torch's error, which the call raises running in Python)
    if (name == "H" && m.dim() > 2) unsupported("Tensor.H of a tensor of more than 2 dims: RuntimeError");
    if (name == "T" || name == "mT" || name == "H" || name == "mH") {
      std::vector<int64_t> perm;
      if (name == "T" || name == "H") for (int64_t i = m.dim(); i-- > 0;) perm.push_back(i);
      else {
        for (int64_t i = 0; i < m.dim(); ++i) perm.push_back(i);
        if (m.dim() < 2) unsupported("mT of a tensor with fewer than 2 dims");
        std::swap(perm[m.dim() - 1], perm[m.dim() - 2]);
      }
      ir::Attrs a;
      a.set("dims", perm);
      return Var::tensor(add_node("permute", {base->node()}, a));
    }
    // x.data: the same memory outside autograd, as x.detach() gives it
    if (name == "data") {
      VarPtr d = call_tensor_method(base, "detach", {}, {});
      if (d->is_tensor() && d->node() != base->node()) d->node()->attrs.set("tensor_data", true);  // (mutate refuses updates through it)
      return d;
    }
    if (name == "requires_grad") return Var::constant(root()->needs_grad_.count(base->node()) ? Py_True : Py_False);
    if (name == "grad_fn" || name == "is_leaf") {
      // A tensor autograd does not track has no grad_fn and is a leaf; one it tracks has
      // autograd's own node (or is a leaf input), which capture does not model.
      if (root()->needs_grad_.count(base->node())) unsupported("Tensor." + name + " of a tensor that requires grad");
      return Var::constant(name == "grad_fn" ? Py_None : Py_True);
    }
    if (name == "grad" && base->source) {
      // an input's .grad (a parameter's, for clipping or logging): the caller's gradient, read
      // through its source like any input; None, or the value a zero_grad earlier set, as logged
      Interpreter* r = root();
      const auto& ins = g_->inputs();
      for (size_t i = 0; i < r->input_vars_.size() && i < ins.size(); ++i) {
        if (r->input_vars_[i] != base) continue;
        PyObject* obj = r->input_objects_[i];
        if (const AttrStore* st = logged_attr(obj, "grad")) return st->value;
        PyObject* g = PyObject_GetAttrString(obj, "grad");
        if (!g) return real(nullptr);
        keep_.push_back(g);
        return wrap(g, Source::attr(base->source, "grad"));
      }
    }
    // kiln's tensors are dense, strided, plain: the layout flags models test
    if (name == "is_nested" || name == "is_sparse" || name == "is_quantized" || name == "is_meta" ||
        name == "is_mkldnn" || name == "is_complex_" )
      return Var::constant(Py_False);
    if (name == "layout") return Var::constant(resolve_torch("strided"));
    // x.__class__ is type(x): an input's class (its tensor guard checks it), else torch.Tensor
    if (name == "__class__") {
      if (base->node()->op_name() == "placeholder")
        if (PyObject* t = input_type(base->node())) return Var::constant(t);
      return Var::constant(resolve_torch("Tensor"));
    }
    static PyObject* tensor_type = resolve_torch("Tensor");
    if (PyObject_HasAttrString(tensor_type, name.c_str()) != 1) {
      // Not torch.Tensor's: an attribute the caller set on an input tensor (guarded by value),
      // else AttributeError, as eager raises it (a handler in the function may take it).
      PyObject* key = PyUnicode_FromString(name.c_str());
      keep_.push_back(key);
      Interpreter* r = root();
      for (size_t i = 0; base->source && i < r->input_vars_.size(); ++i) {
        if (r->input_vars_[i] != base) continue;
        PyObject* v = PyObject_GetAttr(r->input_objects_[i], key);
        if (v) {
          keep_.push_back(v);
          return wrap(v, Source::attr(base->source, name));
        }
        clear_error();
        guard_hasattr(base, key, false);
      }
      raise_new(PyExc_AttributeError, "'Tensor' object has no attribute '" + name + "'");
    }
    return Var::method(base, name);
  }
  if (base->kind() == Var::Kind::Module) return module_attr(base, name.c_str());
  if (auto* r = base->get_if<RecordV>()) return r->plain ? object_attr(base, name) : record_attr(base, name);
  if (base->is_const() && PyDict_CheckExact(base->obj()) &&
      (name == "items" || name == "keys" || name == "values" || name == "get" || name == "copy"))
    return Var::method(base, name);  // entries read through dict_entries, guarded
  // The same on a dict subclass of the caller's whose class leaves them, and iteration, to dict
  // or OrderedDict (Hugging Face's ModelOutput handed back into a model: `encoder_outputs[0]`
  // reads its keys()).
  if (base->is_const() && base->source && PyDict_Check(base->obj()) &&
      (name == "items" || name == "keys" || name == "values" || name == "get") && dict_storage_reads(Py_TYPE(base->obj()), name))
    return Var::method(base, name);
  // f.__get__ of a Python function: made afresh at every read (an identity guard on it never
  // holds); its call binds f (call(), below), as an LR scheduler's step wrapper does.
  if (base->is_const() && name == "__get__" && PyFunction_Check(base->obj())) return Var::method(base, name);
  // A property of a caller's object, once the function changed the caller's state (a list it
  // appended to, an attribute it set): its getter inlined, to read that state as the function
  // left it (run for real, it read the caller's objects as they were before the call).
  if (base->is_const() && base->source && PyType_HasFeature(Py_TYPE(base->obj()), Py_TPFLAGS_HEAPTYPE) &&
      !PyType_Check(base->obj()) && !PyModule_Check(base->obj()) &&
      (!root()->mutated_.empty() || !root()->attr_stores_.empty())) {
    PyObject* key = PyUnicode_FromString(name.c_str());
    PyObject* a = key ? _PyType_Lookup(Py_TYPE(base->obj()), key) : nullptr;
    Py_XDECREF(key);
    if (a && PyObject_TypeCheck(a, &PyProperty_Type)) {
      PyObject* fget = PyObject_GetAttrString(a, "fget");
      if (!fget) clear_error();
      else keep_.push_back(fget);
      if (fget && PyFunction_Check(fget) && !is_torch_internal(fget)) return inline_call(fget, nullptr, {base}, {});
    }
  }
  if (base->is_const()) {
    if (name == "__dict__")  // the object's attributes as the function left them: the logged stores are not in it yet
      for (const AttrStore& st : root()->attr_stores_)
        if (st.obj == base->obj()) unsupported("__dict__ of an object whose attributes the function set or deleted");
    PyObject* v = PyObject_GetAttrString(base->obj(), name.c_str());
    if (!v && base->source && PyErr_ExceptionMatches(PyExc_AttributeError) && !PyModule_Check(base->obj())) {
      // Absent, and a handler in the function may take the AttributeError: guarded absent (the
      // caller may add the attribute before the next call), as hasattr's answer is.
      PyObject *type, *value, *tb;
      PyErr_Fetch(&type, &value, &tb);
      PyObject* key = PyUnicode_FromString(name.c_str());
      guard_hasattr(base, key, false);
      Py_DECREF(key);
      PyErr_Restore(type, value, tb);
    }
    if (!v) return real(nullptr);
    // Attributes of torch's and the standard library's modules (torch.sin, math.pi) are taken
    // as stable; other objects' are guarded, and so are other modules' (a user module's
    // function or constant rebound between calls: `m.fn = torch.cos`) and any module's mutable
    // containers (a registry list someone may append to).
    bool container = PyList_Check(v) || PyDict_Check(v) || PyAnySet_Check(v);
    // What the module's dict does not hold (a module class's property: torch.backends.cudnn's
    // flags) and objects with state of their own (torch.backends.cuda.matmul) change without
    // the dict changing: guarded by value, and their attributes through them.
    const bool stateful = PyModule_Check(base->obj()) &&
                          (PyDict_GetItemString(PyModule_GetDict(base->obj()), name.c_str()) != v ||
                           (!PyModule_Check(v) && !PyType_Check(v) && !PyCallable_Check(v) &&
                            (Py_TYPE(v)->tp_dictoffset != 0 || Py_TYPE(v)->tp_getattro != PyObject_GenericGetAttr)));
    if (base->source && (!PyModule_Check(base->obj()) || container || stateful || !stable_module(base->obj()))) {
      VarPtr r = wrap(v, Source::attr(base->source, name));
      Py_DECREF(v);
      return r;
    }
    // (rebinding one, torch.sigmoid = f, changes the module's dict: one guard per module)
    if (!base->source) return Var::steal_constant(v);
    PyObject* key = PyUnicode_FromString(name.c_str());
    out_.guards.add_dict_version(base->source, base->obj(), key, v);
    Py_XDECREF(key);
    VarPtr r = Var::steal_constant(v);
    // A submodule keeps its path (the guard above holds it) for what is read from it in turn
    if (PyModule_Check(r->obj())) r->source = Source::attr(base->source, name);
    return r;
  }
  if (auto* t = base->get_if<TupleV>(); t && t->structseq) {  // a structseq: its fields by name
    PyObject* fields = PyObject_GetAttrString(t->structseq, "__match_args__");
    if (!fields) clear_error();
    for (Py_ssize_t i = 0; fields && PyTuple_Check(fields) && i < PyTuple_GET_SIZE(fields); ++i)
      if (PyUnicode_CompareWithASCIIString(PyTuple_GET_ITEM(fields, i), name.c_str()) == 0 &&
          static_cast<size_t>(i) < t->items.size()) {
        Py_DECREF(fields);
        return t->items[i];
      }
    Py_XDECREF(fields);
    if (is_namedtuple_class(t->structseq) && name != "_replace") {  // (_replace: call_sequence_method)
      // What the namedtuple's class defines beyond tuple's own methods: its Python methods
      // (_asdict, a typing.NamedTuple's own) and properties, run on this tuple; classmethods
      // and class data (_make, _fields) as the class gives them.
      PyObject* key = PyUnicode_FromString(name.c_str());
      PyObject* attr = key ? _PyType_Lookup(reinterpret_cast<PyTypeObject*>(t->structseq), key) : nullptr;  // borrowed
      const bool tuples_own = attr && _PyType_Lookup(&PyTuple_Type, key) == attr;
      Py_XDECREF(key);
      if (attr && !tuples_own) {
        if (PyFunction_Check(attr)) return Var::method(base, name, attr);
        if (PyObject_TypeCheck(attr, &PyProperty_Type)) {
          PyObject* fget = PyObject_GetAttrString(attr, "fget");
          keep_.push_back(fget);
          if (fget && PyFunction_Check(fget)) return inline_call(fget, nullptr, {base}, {});
          clear_error();
        }
        if (PyObject* v = PyObject_GetAttrString(t->structseq, name.c_str())) return real(v);
        clear_error();
      } else if (!attr && name.rfind("__", 0) != 0) {
        // neither a field nor on the class: the AttributeError eager raises (hasattr answers False)
        return real(PyObject_GetAttrString(t->structseq, name.c_str()));
      }
    }
  }
  if (auto* l = base->get_if<ListV>(); l && l->deque && name == "maxlen")
    return l->maxlen < 0 ? Var::constant(Py_None) : Var::steal_constant(PyLong_FromSsize_t(l->maxlen));
  if (base->kind() == Var::Kind::Tuple || base->kind() == Var::Kind::List || base->kind() == Var::Kind::Dict)
    return Var::method(base, name);
  unsupported("attribute " + name + " of a value");
}

VarPtr Interpreter::index_tensor(const VarPtr& base, const VarPtr& index) {
  std::vector<VarPtr> parts = index->kind() == Var::Kind::Tuple ? index->seq() : std::vector<VarPtr>{index};
  if (index->is_const() && PyTuple_Check(index->known())) {  // known(): a symbolic slice stays one
    parts.clear();
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(index->obj()); ++i) parts.push_back(Var::constant(PyTuple_GET_ITEM(index->obj(), i)));
  }
  int64_t consumed = 0;
  for (const VarPtr& p : parts) {
    if (!p->is_const() || PyList_Check(p->known())) {  // x[[3, 0, 2]]: a list of indices is advanced indexing too
      // advanced indexing (tensors, lists of tensors): torch's own __getitem__ as an extern
      static PyObject* getitem = PyObject_GetAttrString(resolve_torch("Tensor"), "__getitem__");
      return torch_extern(getitem, "Tensor.__getitem__", {base, index}, {});
    }
    PyObject* o = p->known();  // type checks only: a symbolic index keeps its symbols here
    if (o == Py_None || o == Py_Ellipsis) continue;
    if (PyBool_Check(o) || !(PyLong_Check(o) || PySlice_Check(o)))
      unsupported("indexing a tensor with a " + std::string(Py_TYPE(o)->tp_name) + " is not captured yet");
    ++consumed;
  }
  ir::Node* x = base->node();
  const int64_t rank = x->meta.dim();
  if (consumed > rank)
    unsupported("shape/dtype check of index failed: IndexError: too many indices for tensor of dimension " + std::to_string(rank));
  int64_t dim = 0;
  bool seen_ellipsis = false;
  for (const VarPtr& p : parts) {
    if (const std::vector<sym::Expr>* sl = p->symslice()) {  // x[:, :T]: bounds stay symbolic
      ir::Attrs a;
      a.set("dim", dim);
      const char* keys[] = {"start", "end", "step"};
      for (int k = 0; k < 3; ++k)
        if ((*sl)[k].valid()) {
          if (auto c = (*sl)[k].as_const()) a.set(keys[k], *c);
          else if (k < 2) a.set(keys[k], (*sl)[k]);
          else a.set(keys[k], static_cast<int64_t>(concrete_size((*sl)[k])));  // a step is specialized
        }
      x = add_node("slice", {x}, a);
      ++dim;
      continue;
    }
    PyObject* o = p->obj();
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
  if (x == base->node()) x = add_node("alias", {x});  // eager's x[:] is a view, not x itself
  return Var::tensor(x);
}

}  // namespace kiln::bind::detail
