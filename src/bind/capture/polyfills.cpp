#include "bind/capture/polyfills.h"

#include <map>
#include <utility>

namespace kiln::bind {
namespace {

struct Model {
  PyObject* fn = nullptr;
  bool always = false;
};

// What identifies an original: the object, or for a C method bound to a type, its C function
// and that type.
using Key = std::pair<const void*, const void*>;

Key key_of(PyObject* f) {
  if (PyCFunction_Check(f)) {
    PyObject* self = PyCFunction_GET_SELF(f);
    if (self && PyType_Check(self)) return {reinterpret_cast<const void*>(PyCFunction_GET_FUNCTION(f)), self};
  }
  return {f, nullptr};
}

// original -> model, both held for the life of the process (registered once, at import).
std::map<Key, Model>& models() {
  static auto* m = new std::map<Key, Model>();
  return *m;
}

}  // namespace

void register_polyfill(PyObject* original, PyObject* model, bool always) {
  auto [it, fresh] = models().emplace(key_of(original), Model{model, always});
  if (!fresh) {
    Py_DECREF(it->second.fn);
    it->second = Model{model, always};
  } else {
    Py_INCREF(original);
  }
  Py_INCREF(model);
}

PyObject* polyfill_of(PyObject* f, bool tensor_arguments) {
  auto it = models().find(key_of(f));
  if (it == models().end() || !(tensor_arguments || it->second.always)) return nullptr;
  return it->second.fn;
}

}  // namespace kiln::bind
