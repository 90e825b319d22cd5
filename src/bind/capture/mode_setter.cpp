#include "bind/capture/mode_setter.h"

#include <map>
#include <string>

#include "bind/torch/tensor_bridge.h"

namespace kiln::bind {
namespace {

const char* kCapsule = "kiln.mode_setter";

PyObject* call_setter(PyObject* self, PyObject* /*args*/) {
  auto* m = static_cast<const ModeChange*>(PyCapsule_GetPointer(self, kCapsule));
  if (!m) return nullptr;
  apply_modes(*m);
  Py_RETURN_FALSE;
}

PyMethodDef setter_def = {"restore_modes", call_setter, METH_VARARGS,
                          "Sets grad mode and autocast as a with block of kiln's compiled code left them."};

std::string key_of(const ModeChange& m) {
  std::string k = m.grad ? (*m.grad ? "g1" : "g0") : "g-";
  if (m.autocast) k += " " + m.autocast->str();
  return k;
}

}  // namespace

void apply_modes(const ModeChange& m) {
  if (m.grad) set_grad_enabled(*m.grad);
  if (m.autocast) set_autocast_state(*m.autocast);
}

PyObject* mode_setter(const ModeChange& m) {
  static std::map<std::string, PyObject*> setters;
  PyObject*& f = setters[key_of(m)];
  if (!f) {
    PyObject* capsule = PyCapsule_New(new ModeChange(m), kCapsule, nullptr);  // kept with the setter
    f = capsule ? PyCFunction_New(&setter_def, capsule) : nullptr;
    Py_XDECREF(capsule);
  }
  return f;
}

bool mode_setter_modes(PyObject* f, ModeChange& out) {
  if (!PyCFunction_Check(f) || PyCFunction_GET_FUNCTION(f) != call_setter) return false;
  auto* m = static_cast<const ModeChange*>(PyCapsule_GetPointer(PyCFunction_GET_SELF(f), kCapsule));
  if (!m) {
    PyErr_Clear();
    return false;
  }
  out = *m;
  return true;
}

}  // namespace kiln::bind
