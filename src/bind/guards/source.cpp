#include "bind/guards/source.h"

#include <cstdio>
#include "bind/interrupts.h"

#include "bind/python_objects.h"
#include "bind/torch/tensor_bridge.h"

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

SourcePtr Source::pinned_object(PyObject* obj, const std::string& name) {
  auto s = std::make_shared<Source>(Source{Kind::Pinned});
  s->pinned = Py_NewRef(obj);
  char addr[32];
  snprintf(addr, sizeof addr, "%p", static_cast<void*>(obj));
  s->name = name + " at " + addr;  // unique per object: guards are told apart by their text
  return s;
}

SourcePtr Source::globals_dict(PyObject* globals) {
  auto s = std::make_shared<Source>(Source{Kind::Globals});
  s->globals = Py_XNewRef(globals);
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
  // ModuleList keys its modules by str(index). Interned, as attribute names are: the string
  // then lives in the interpreter's table, whichever thread drops the last source holding it.
  if (index >= 0) s->key = PyUnicode_InternFromString(std::to_string(index).c_str());
  s->base = std::move(base);
  return s;
}

Source::~Source() {
  if (!Py_IsInitialized()) return;
  Py_XDECREF(key);
  Py_XDECREF(globals);
  Py_XDECREF(maker);
  Py_XDECREF(pinned);
}

SourcePtr Source::key_of(SourcePtr base, PyObject* key) {
  auto s = std::make_shared<Source>(Source{Kind::Key});
  Py_INCREF(key);
  s->key = key;
  s->base = std::move(base);
  if (PyUnicode_Check(key) || PyLong_Check(key) || PyFloat_Check(key) || key == Py_None || PyTuple_Check(key)) {
    PyObject* r = PyObject_Repr(key);
    s->name = r ? PyUnicode_AsUTF8(r) : "?";
    Py_XDECREF(r);
    clear_error();
  } else {
    // An object keyed by identity (a parameter in an optimizer's state): its repr may be long,
    // slow (a tensor's values) and equal for distinct keys; the source holds the key, so its
    // address names it.
    char addr[32];
    std::snprintf(addr, sizeof addr, "%p", static_cast<void*>(key));
    s->name = std::string("<") + Py_TYPE(key)->tp_name + " at " + addr + ">";
  }
  return s;
}

SourcePtr Source::dict_item(SourcePtr base, PyObject* key) {
  auto s = std::const_pointer_cast<Source>(key_of(std::move(base), key));
  s->kind = Kind::DictItem;
  return s;
}

SourcePtr Source::seed() { return std::make_shared<Source>(Source{Kind::Seed}); }

SourcePtr Source::made(PyObject* obj) {
  static int count = 0;  // distinct objects, distinct sources
  auto s = std::make_shared<Source>(Source{Kind::Made});
  s->name = std::string(Py_TYPE(obj)->tp_name) + " #" + std::to_string(++count);
  return s;
}

SourcePtr Source::built(PyObject* obj, PyObject* maker) {
  auto s = std::const_pointer_cast<Source>(made(obj));
  s->maker = Py_NewRef(maker);
  return s;
}

SourcePtr Source::deref(SourcePtr base) {
  auto s = std::make_shared<Source>(Source{Kind::Deref});
  s->base = std::move(base);
  return s;
}

SourcePtr Source::array(SourcePtr base) {
  auto s = std::make_shared<Source>(Source{Kind::Array});
  s->base = std::move(base);
  return s;
}

bool Source::per_call() const {
  for (const Source* s = this; s; s = s->base.get())
    if (s->kind == Kind::Seed || (s->kind == Kind::Made && s->maker)) return true;
  return false;
}

bool Source::made_in_frame() const {
  for (const Source* s = this; s; s = s->base.get())
    if (s->kind == Kind::Made) return true;
  return false;
}

SourcePtr Source::closure(Py_ssize_t index, const std::string& name) {
  auto s = std::make_shared<Source>(Source{Kind::Closure});
  s->index = index;
  s->name = name;
  return s;
}

SourcePtr Source::closure_cell(Py_ssize_t index, const std::string& name) {
  auto s = std::make_shared<Source>(Source{Kind::ClosureCell});
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
    case Kind::Globals: return globals ? "G[" + module_name() + "]" : "G";
    case Kind::Pinned: return "<" + name + ">";
    case Kind::Attr: return base->str() + "." + name;
    case Kind::Item: return base->str() + "[" + std::to_string(index) + "]";
    case Kind::Closure: return "C['" + name + "']";
    case Kind::ClosureCell: return "<the cell of C['" + name + "']>";
    case Kind::Key: return base->str() + "[" + name + "]";
    case Kind::DictItem: return "dict.__getitem__(" + base->str() + ", " + name + ")";
    case Kind::Seed: return "<a fresh seed from torch's default generator>";
    case Kind::Made: return "<a " + name + " made in the frame>";
    case Kind::Array: return "torch.from_numpy(" + base->str() + ")";
    case Kind::Deref: return base->str() + "()";
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

// Does a type look attributes up as Module does (its __getattr__ and object's __getattribute__)?
// Remembered per type and type version: CPython gives a type a new version tag whenever it or a
// base changes, so an answer for (type, tag) never goes stale. A model's walk asks this of a few
// dozen types about a thousand times a call.
bool plain_module_type(PyTypeObject* tp, const ModuleLookups& l) {
  struct Seen {
    PyTypeObject* type = nullptr;
    unsigned int version = 0;
    bool plain = false;
  };
  static Seen seen[64];
  const bool tagged = PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG);
  Seen& slot = seen[(reinterpret_cast<uintptr_t>(tp) >> 4) & 63];
  if (tagged && slot.type == tp && slot.version == tp->tp_version_tag) return slot.plain;
  const bool plain = _PyType_Lookup(tp, l.getattr_name) == l.module_getattr &&
                     _PyType_Lookup(tp, l.getattribute_name) == l.object_getattribute;
  // _PyType_Lookup gives the type a tag when it has none
  if (PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG)) slot = {tp, tp->tp_version_tag, plain};
  return plain;
}

// The instance dict of a module whose attribute lookup is Module's own, else nullptr. Borrowed.
PyObject* plain_module_dict(PyObject* obj, const ModuleLookups& l) {
  if (!plain_module_type(Py_TYPE(obj), l)) return nullptr;
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

PyObject* modulelist_item(PyObject* obj, Py_ssize_t index, PyObject* index_key) {
  const ModuleLookups* l = module_lookups();
  PyObject* dict = l ? plain_module_dict(obj, *l) : nullptr;
  if (!dict || _PyType_Lookup(Py_TYPE(obj), l->getitem_name) != l->modulelist_getitem) return nullptr;
  PyObject* mods = PyDict_GetItem(dict, l->names[2]);
  if (!mods || !PyDict_Check(mods)) return nullptr;
  Py_ssize_t n = PyDict_Size(mods);
  const Py_ssize_t given = index;
  if (index < 0) index += n;
  if (index < 0 || index >= n) return nullptr;  // the generic path raises IndexError
  if (index_key && index == given) return Py_XNewRef(PyDict_GetItem(mods, index_key));
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
  if (!s.base) return read_root(s, f);
  PyObject* base = eval_memo(*s.base, f);
  if (!base) return nullptr;
  PyObject* v = read_from_base(s, base);
  Py_DECREF(base);
  return v;
}

}  // namespace

PyObject* eval_source(const Source& s, const FrameView& f) { return eval_memo(s, f); }

int module_has_attr(PyObject* obj, PyObject* name) {
  const ModuleLookups* l = module_lookups();
  PyObject* dict = l ? plain_module_dict(obj, *l) : nullptr;
  // On the class (a method, a property that may raise): the generic lookup answers.
  if (!dict || _PyType_Lookup(Py_TYPE(obj), name)) return -1;
  if (PyDict_GetItem(dict, name)) return 1;
  for (int i = 0; i < 3; ++i) {
    PyObject* d = PyDict_GetItem(dict, l->names[i]);
    if (!d || !PyDict_Check(d)) return -1;
    if (PyDict_GetItem(d, name)) return 1;
  }
  return 0;  // Module.__getattr__ raises AttributeError
}

PyObject* read_root(const Source& s, const FrameView& f) {
  switch (s.kind) {
    case Source::Kind::Local: return Py_XNewRef(f.locals[s.local]);
    case Source::Kind::Global: {
      PyObject* v = PyDict_GetItemWithError(s.globals ? s.globals : f.globals, s.key);
      if (!v && !PyErr_Occurred() && f.builtins) v = PyDict_GetItemWithError(f.builtins, s.key);
      if (!v) clear_error();
      return Py_XNewRef(v);
    }
    case Source::Kind::Globals: return Py_XNewRef(s.globals ? s.globals : f.globals);
    case Source::Kind::Pinned: return Py_NewRef(s.pinned);
    case Source::Kind::Seed: return fresh_seed();
    case Source::Kind::Made: {
      if (!s.maker) return nullptr;
      PyObject* v = PyObject_CallNoArgs(s.maker);
      if (!v) clear_error();  // eager raised nothing when capture built it: the call reruns eagerly
      return v;
    }
    case Source::Kind::Closure:
      if (!f.closure || s.index >= PyTuple_GET_SIZE(f.closure)) return nullptr;
      return Py_XNewRef(PyCell_GET(PyTuple_GET_ITEM(f.closure, s.index)));
    case Source::Kind::ClosureCell:
      if (!f.closure || s.index >= PyTuple_GET_SIZE(f.closure)) return nullptr;
      return Py_NewRef(PyTuple_GET_ITEM(f.closure, s.index));
    default: return nullptr;
  }
}

PyObject* read_from_base(const Source& s, PyObject* base) {
  PyObject* v = nullptr;
  switch (s.kind) {
    case Source::Kind::Attr:
      v = module_attr(base, s.key);
      if (!v) v = PyObject_GetAttr(base, s.key);
      break;
    case Source::Kind::Item:
      // (a tuple's stored item, also a namedtuple's whose class defines its own __getitem__)
      if (s.index >= 0 && PyTuple_Check(base)) return s.index < PyTuple_GET_SIZE(base) ? Py_NewRef(PyTuple_GET_ITEM(base, s.index)) : nullptr;
      if (s.index >= 0 && PyList_CheckExact(base)) return s.index < PyList_GET_SIZE(base) ? Py_NewRef(PyList_GET_ITEM(base, s.index)) : nullptr;
      v = modulelist_item(base, s.index, s.key);
      if (!v) v = PySequence_GetItem(base, s.index);
      break;
    case Source::Kind::DictItem:
      v = PyDict_Check(base) ? PyDict_GetItemWithError(base, s.key) : nullptr;
      if (!v) clear_error();
      return Py_XNewRef(v);
    case Source::Kind::Key:
      // A dict, or a subclass that keeps dict's own item lookup (defaultdict, Counter): the
      // stored item, never __missing__, which would insert a defaultdict's default.
      if (PyDict_CheckExact(base) ||
          (PyDict_Check(base) && Py_TYPE(base)->tp_as_mapping->mp_subscript == PyDict_Type.tp_as_mapping->mp_subscript)) {
        v = PyDict_GetItemWithError(base, s.key);
        if (!v) clear_error();
        return Py_XNewRef(v);
      }
      v = PyObject_GetItem(base, s.key);
      break;
    case Source::Kind::Array:
      // A new tensor per call over the caller's array (torch.from_numpy): its guards (type of
      // the base, then dtype, shape and strides) say whether the graph still reads it right.
      return is_ndarray(base) ? tensor_from_ndarray(base) : nullptr;
    case Source::Kind::Deref:
      // A weakref's referent (None once it died), read without running Python code
      return PyWeakref_CheckRef(base) ? Py_NewRef(PyWeakref_GetObject(base)) : nullptr;
    default: return nullptr;
  }
  if (!v) clear_error();
  return v;
}

}  // namespace kiln::bind
