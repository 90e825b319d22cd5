// Binds a call's arguments to a function's parameter slots, as CPython's own call does, so the
// interpreter and the guards see the same locals the real frame would.
#include "bind/capture/capture.h"

namespace kiln::bind {

bool bind_arguments(PyObject* fn, PyObject* const* args, size_t nargs, PyObject* kwnames, BoundArgs& out,
                    std::vector<PyObject*>& owned) {
  auto* f = reinterpret_cast<PyFunctionObject*>(fn);
  auto* code = reinterpret_cast<PyCodeObject*>(f->func_code);
  const int npos = code->co_argcount, nkwonly = code->co_kwonlyargcount;
  const bool varargs = code->co_flags & CO_VARARGS, varkw = code->co_flags & CO_VARKEYWORDS;
  const int nslots = npos + nkwonly + varargs + varkw;
  PyObject* varnames = PyCode_GetVarnames(code);
  if (!varnames) return false;
  out.names.clear();
  for (int i = 0; i < nslots; ++i) out.names.push_back(PyUnicode_AsUTF8(PyTuple_GET_ITEM(varnames, i)));
  out.locals.assign(nslots, nullptr);
  const char* fname = PyUnicode_AsUTF8(code->co_name);

  size_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
  size_t npositional = nargs;
  if (npositional > static_cast<size_t>(npos) && !varargs) {
    PyErr_Format(PyExc_TypeError, "%s() takes %d positional arguments but %zu were given", fname, npos, npositional);
    Py_DECREF(varnames);
    return false;
  }
  for (size_t i = 0; i < npositional && i < static_cast<size_t>(npos); ++i) out.locals[i] = args[i];
  if (varargs) {
    size_t extra = npositional > static_cast<size_t>(npos) ? npositional - npos : 0;
    PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(extra));
    for (size_t i = 0; i < extra; ++i) {
      Py_INCREF(args[npos + i]);
      PyTuple_SET_ITEM(t, i, args[npos + i]);
    }
    owned.push_back(t);
    out.locals[npos + nkwonly] = t;
  }
  PyObject* kwdict = nullptr;
  if (varkw) {
    kwdict = PyDict_New();
    owned.push_back(kwdict);
    out.locals[nslots - 1] = kwdict;
  }
  for (size_t k = 0; k < nkw; ++k) {
    PyObject* name = PyTuple_GET_ITEM(kwnames, k);
    PyObject* value = args[nargs + k];
    int slot = -1;
    for (int i = 0; i < npos + nkwonly; ++i) {
      int r = PyUnicode_Compare(name, PyTuple_GET_ITEM(varnames, i));
      if (r == 0) {
        slot = i;
        break;
      }
    }
    if (slot < 0) {
      if (!kwdict) {
        PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", fname, name);
        Py_DECREF(varnames);
        return false;
      }
      PyDict_SetItem(kwdict, name, value);
      continue;
    }
    if (out.locals[slot]) {
      PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%U'", fname, name);
      Py_DECREF(varnames);
      return false;
    }
    out.locals[slot] = value;
  }
  // Defaults for the trailing positional parameters, then keyword-only defaults.
  PyObject* defaults = f->func_defaults;
  Py_ssize_t ndef = defaults ? PyTuple_GET_SIZE(defaults) : 0;
  for (int i = 0; i < npos; ++i) {
    if (out.locals[i]) continue;
    Py_ssize_t d = i - (npos - ndef);
    if (d >= 0) {
      out.locals[i] = PyTuple_GET_ITEM(defaults, d);
    } else {
      PyErr_Format(PyExc_TypeError, "%s() missing 1 required positional argument: '%U'", fname,
                   PyTuple_GET_ITEM(varnames, i));
      Py_DECREF(varnames);
      return false;
    }
  }
  for (int i = npos; i < npos + nkwonly; ++i) {
    if (out.locals[i]) continue;
    PyObject* v = f->func_kwdefaults ? PyDict_GetItem(f->func_kwdefaults, PyTuple_GET_ITEM(varnames, i)) : nullptr;
    if (!v) {
      PyErr_Format(PyExc_TypeError, "%s() missing 1 required keyword-only argument: '%U'", fname,
                   PyTuple_GET_ITEM(varnames, i));
      Py_DECREF(varnames);
      return false;
    }
    out.locals[i] = v;
  }
  Py_DECREF(varnames);
  return true;
}

}  // namespace kiln::bind
