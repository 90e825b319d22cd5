#include "bind/guards/source.h"
#include "bind/interrupts.h"

#include "bind/python_objects.h"

namespace kiln::bind {

SourcePtr Source::local_(int slot, const std::string& name) {
  auto s = std::make_shared<Source>(Source{Kind::Local});
  s->local = slot;
  s->name = name;
  return s;
}

SourcePtr Source::global(const std::string& name, PyObject* globals) {
  auto s = std::make_shared<Source>(Source{Kind::Global});
  s->name = name;
  s->key = PyUnicode_InternFromString(name.c_str());
  if (globals) {
    Py_INCREF(globals);
    s->globals = globals;
  }
  return s;
}

SourcePtr Source::attr(SourcePtr base, const std::string& name) {
  auto s = std::make_shared<Source>(Source{Kind::Attr});
  s->name = name;
  s->key = PyUnicode_InternFromString(name.c_str());
  s->base = std::move(base);
  return s;
}

SourcePtr Source::item(SourcePtr base, Py_ssize_t index) {
  auto s = std::make_shared<Source>(Source{Kind::Item});
  s->index = index;
  s->base = std::move(base);
  return s;
}

Source::~Source() {
  if (!Py_IsInitialized()) return;
  Py_XDECREF(key);
  Py_XDECREF(globals);
}

SourcePtr Source::key_of(SourcePtr base, PyObject* key) {
  auto s = std::make_shared<Source>(Source{Kind::Key});
  Py_INCREF(key);
  s->key = key;
  s->base = std::move(base);
  PyObject* r = PyObject_Repr(key);
  s->name = r ? PyUnicode_AsUTF8(r) : "?";
  Py_XDECREF(r);
  clear_error();
  return s;
}

SourcePtr Source::closure(Py_ssize_t index, const std::string& name) {
  auto s = std::make_shared<Source>(Source{Kind::Closure});
  s->index = index;
  s->name = name;
  return s;
}

std::string Source::module_name() const {
  PyObject* n = globals ? PyDict_GetItemString(globals, "__name__") : nullptr;
  return n && PyUnicode_Check(n) ? std::string("'") + PyUnicode_AsUTF8(n) + "'" : "?";
}

std::string Source::str() const {
  switch (kind) {
    case Kind::Local: return "L['" + name + "']";
    case Kind::Global: return globals ? "G[" + module_name() + "]['" + name + "']" : "G['" + name + "']";
    case Kind::Attr: return base->str() + "." + name;
    case Kind::Item: return base->str() + "[" + std::to_string(index) + "]";
    case Kind::Closure: return "C['" + name + "']";
    case Kind::Key: return base->str() + "[" + name + "]";
  }
  return "?";
}

size_t SourceMemo::slot_of(const Source* s) const {
  const size_t mask = slots_.size() - 1;
  // Sources are heap objects: the low bits of their addresses say little.
  size_t i = (reinterpret_cast<uintptr_t>(s) >> 4) * 0x9E3779B97F4A7C15ull >> 20 & mask;
  while (slots_[i].source && slots_[i].source != s) i = (i + 1) & mask;
  return i;
}

PyObject* SourceMemo::find(const Source* s) const {
  if (slots_.empty()) return nullptr;
  return slots_[slot_of(s)].value;
}

void SourceMemo::grow() {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(old.empty() ? 256 : old.size() * 2, Slot{});
  filled_.clear();
  for (const Slot& o : old)
    if (o.source) {
      const size_t i = slot_of(o.source);
      slots_[i] = o;
      filled_.push_back(i);
    }
}

void SourceMemo::put(const Source* s, PyObject* v) {
  if ((filled_.size() + 1) * 2 > slots_.size()) grow();  // at most half full: short probes
  const size_t i = slot_of(s);
  if (slots_[i].source) return;
  slots_[i] = {s, Py_NewRef(v)};
  filled_.push_back(i);
}

void SourceMemo::clear() {
  if (!Py_IsInitialized()) return;
  for (size_t i : filled_) {
    Py_DECREF(slots_[i].value);
    slots_[i] = Slot{};
  }
  filled_.clear();
}

namespace {

// torch.nn.Module keeps parameters, buffers and submodules in three dicts and finds them in
// a Python __getattr__, reached only after the generic lookup has failed and built an
// AttributeError. For a module whose class keeps Module's lookup, reading the dicts directly
// gives the same answer at a fraction of the cost; ModuleList's __getitem__ likewise.
struct ModuleLookups {
  PyObject* module_getattr = nullptr;     // torch.nn.Module.__getattr__
  PyObject* object_getattribute = nullptr;  // object.__getattribute__
  PyObject* modulelist_getitem = nullptr;  // torch.nn.ModuleList.__getitem__
  PyObject* names[3] = {nullptr, nullptr, nullptr};  // "_parameters", "_buffers", "_modules"
  PyObject* getattr_name = nullptr;
  PyObject* getattribute_name = nullptr;
  PyObject* getitem_name = nullptr;
};

const ModuleLookups* module_lookups() {
  static ModuleLookups* m = [] {
    auto* l = new ModuleLookups;
    PyObject* module_cls = object_at("torch.nn.modules.module.Module");
    PyObject* list_cls = object_at("torch.nn.modules.container.ModuleList");
    if (module_cls && list_cls && PyType_Check(module_cls) && PyType_Check(list_cls)) {
      l->getattr_name = PyUnicode_InternFromString("__getattr__");
      l->getattribute_name = PyUnicode_InternFromString("__getattribute__");
      l->getitem_name = PyUnicode_InternFromString("__getitem__");
      // _PyType_Lookup, not tp_dict: from 3.12 a static builtin type's tp_dict is NULL.
      l->module_getattr = _PyType_Lookup(reinterpret_cast<PyTypeObject*>(module_cls), l->getattr_name);
      l->modulelist_getitem = _PyType_Lookup(reinterpret_cast<PyTypeObject*>(list_cls), l->getitem_name);
      l->object_getattribute = _PyType_Lookup(&PyBaseObject_Type, l->getattribute_name);
      Py_XINCREF(l->module_getattr);
      Py_XINCREF(l->modulelist_getitem);
      Py_XINCREF(l->object_getattribute);
      const char* names[3] = {"_parameters", "_buffers", "_modules"};
      for (int i = 0; i < 3; ++i) l->names[i] = PyUnicode_InternFromString(names[i]);
    }
    Py_XDECREF(module_cls);
    Py_XDECREF(list_cls);
    clear_error();
    return l;
  }();
  return m->module_getattr && m->object_getattribute && m->modulelist_getitem ? m : nullptr;
}

// The instance dict of a module whose attribute lookup is Module's own, else nullptr. Borrowed.
PyObject* plain_module_dict(PyObject* obj, const ModuleLookups& l) {
  PyTypeObject* tp = Py_TYPE(obj);
  if (_PyType_Lookup(tp, l.getattr_name) != l.module_getattr) return nullptr;
  if (_PyType_Lookup(tp, l.getattribute_name) != l.object_getattribute) return nullptr;
  PyObject** dp = _PyObject_GetDictPtr(obj);
  return dp && *dp && PyDict_Check(*dp) ? *dp : nullptr;
}

// New reference to obj.name, or nullptr with no error when the fast path does not apply.
PyObject* module_attr(PyObject* obj, PyObject* name) {
  const ModuleLookups* l = module_lookups();
  PyObject* dict = l ? plain_module_dict(obj, *l) : nullptr;
  if (!dict || _PyType_Lookup(Py_TYPE(obj), name)) return nullptr;  // class attributes: generic path
  PyObject* v = PyDict_GetItem(dict, name);
  for (int i = 0; !v && i < 3; ++i) {
    PyObject* d = PyDict_GetItem(dict, l->names[i]);
    if (d && PyDict_Check(d)) v = PyDict_GetItem(d, name);
  }
  return Py_XNewRef(v);
}

PyObject* modulelist_item(PyObject* obj, Py_ssize_t index) {
  const ModuleLookups* l = module_lookups();
  PyObject* dict = l ? plain_module_dict(obj, *l) : nullptr;
  if (!dict || _PyType_Lookup(Py_TYPE(obj), l->getitem_name) != l->modulelist_getitem) return nullptr;
  PyObject* mods = PyDict_GetItem(dict, l->names[2]);
  if (!mods || !PyDict_Check(mods)) return nullptr;
  Py_ssize_t n = PyDict_Size(mods);
  if (index < 0) index += n;
  if (index < 0 || index >= n) return nullptr;  // the generic path raises IndexError
  PyObject* key = PyUnicode_FromFormat("%zd", index);
  PyObject* v = key ? PyDict_GetItem(mods, key) : nullptr;
  Py_XDECREF(key);
  return Py_XNewRef(v);
}

PyObject* eval_uncached(const Source& s, const FrameView& f);

// New reference; the memo, when there is one, keeps what was read for the sources after.
PyObject* eval_memo(const Source& s, const FrameView& f) {
  if (s.kind == Source::Kind::Local || !f.memo) return eval_uncached(s, f);
  if (PyObject* v = f.memo->find(&s)) return Py_NewRef(v);
  PyObject* v = eval_uncached(s, f);
  if (v) f.memo->put(&s, v);
  return v;
}

PyObject* eval_uncached(const Source& s, const FrameView& f) {
  switch (s.kind) {
    case Source::Kind::Local: {
      PyObject* v = f.locals[s.local];
      Py_XINCREF(v);
      return v;
    }
    case Source::Kind::Global: {
      PyObject* v = PyDict_GetItemWithError(s.globals ? s.globals : f.globals, s.key);
      if (!v && !PyErr_Occurred() && f.builtins) v = PyDict_GetItemWithError(f.builtins, s.key);
      if (!v) {
        clear_error();
        return nullptr;
      }
      Py_INCREF(v);
      return v;
    }
    case Source::Kind::Attr: {
      PyObject* base = eval_memo(*s.base, f);
      if (!base) return nullptr;
      PyObject* v = module_attr(base, s.key);
      if (!v) v = PyObject_GetAttr(base, s.key);
      Py_DECREF(base);
      if (!v) clear_error();
      return v;
    }
    case Source::Kind::Item: {
      PyObject* base = eval_memo(*s.base, f);
      if (!base) return nullptr;
      PyObject* v = modulelist_item(base, s.index);
      if (!v) v = PySequence_GetItem(base, s.index);
      Py_DECREF(base);
      if (!v) clear_error();
      return v;
    }
    case Source::Kind::Key: {
      PyObject* base = eval_memo(*s.base, f);
      if (!base) return nullptr;
      PyObject* v = PyObject_GetItem(base, s.key);
      Py_DECREF(base);
      if (!v) clear_error();
      return v;
    }
    case Source::Kind::Closure: {
      if (!f.closure || s.index >= PyTuple_GET_SIZE(f.closure)) return nullptr;
      PyObject* v = PyCell_GET(PyTuple_GET_ITEM(f.closure, s.index));
      Py_XINCREF(v);
      return v;
    }
  }
  return nullptr;
}

}  // namespace

PyObject* eval_source(const Source& s, const FrameView& f) { return eval_memo(s, f); }

}  // namespace kiln::bind
