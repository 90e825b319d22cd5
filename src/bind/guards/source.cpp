#include "bind/guards/source.h"

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
  PyErr_Clear();
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

PyObject* eval_source(const Source& s, const FrameView& f) {
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
        PyErr_Clear();
        return nullptr;
      }
      Py_INCREF(v);
      return v;
    }
    case Source::Kind::Attr: {
      PyObject* base = eval_source(*s.base, f);
      if (!base) return nullptr;
      PyObject* v = PyObject_GetAttr(base, s.key);
      Py_DECREF(base);
      if (!v) PyErr_Clear();
      return v;
    }
    case Source::Kind::Item: {
      PyObject* base = eval_source(*s.base, f);
      if (!base) return nullptr;
      PyObject* v = PySequence_GetItem(base, s.index);
      Py_DECREF(base);
      if (!v) PyErr_Clear();
      return v;
    }
    case Source::Kind::Key: {
      PyObject* base = eval_source(*s.base, f);
      if (!base) return nullptr;
      PyObject* v = PyObject_GetItem(base, s.key);
      Py_DECREF(base);
      if (!v) PyErr_Clear();
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

}  // namespace kiln::bind
