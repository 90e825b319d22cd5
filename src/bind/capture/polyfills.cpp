#include "bind/capture/polyfills.h"

#include <unordered_map>

namespace kiln::bind {
namespace {

// original -> model, both held for the life of the process (registered once, at import).
std::unordered_map<PyObject*, PyObject*>& models() {
  static auto* m = new std::unordered_map<PyObject*, PyObject*>();
  return *m;
}

}  // namespace

void register_polyfill(PyObject* original, PyObject* model) {
  auto [it, fresh] = models().emplace(original, model);
  if (!fresh) {
    Py_DECREF(it->second);
    it->second = model;
  } else {
    Py_INCREF(original);
  }
  Py_INCREF(model);
}

PyObject* polyfill_of(PyObject* f) {
  auto it = models().find(f);
  return it == models().end() ? nullptr : it->second;
}

}  // namespace kiln::bind
