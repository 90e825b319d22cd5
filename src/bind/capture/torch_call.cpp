#include "bind/capture/torch_call.h"

#include <deque>

namespace kiln::bind {
namespace {

std::deque<TorchCall>& calls() {
  static std::deque<TorchCall> c;  // never shrinks: graphs keep ids for as long as they live
  return c;
}

const char* const kSlot = "kiln.tensor_slot";
const char* const kSymSlot = "kiln.sym_slot";

}  // namespace

int register_torch_call(PyObject* fn, PyObject* args, PyObject* kwargs, int output) {
  Py_INCREF(fn);
  Py_INCREF(args);
  Py_XINCREF(kwargs);
  calls().push_back({fn, args, kwargs, output});
  return static_cast<int>(calls().size()) - 1;
}

const TorchCall& torch_call(int id) { return calls().at(static_cast<size_t>(id)); }

int register_inplace_variant(int id, PyObject* inplace_fn) {
  const TorchCall c = torch_call(id);  // a copy: registering may grow the table
  return register_torch_call(inplace_fn, c.args, c.kwargs, c.output);
}

namespace {

PyObject* setitem_impl(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "setitem(base, index, value)");
    return nullptr;
  }
  PyObject* copy = PyObject_CallMethod(args[0], "clone", nullptr);
  if (!copy) return nullptr;
  if (PyObject_SetItem(copy, args[1], args[2]) < 0) {
    Py_DECREF(copy);
    return nullptr;
  }
  return copy;
}

PyObject* setitem_inplace_impl(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "setitem_(base, index, value)");
    return nullptr;
  }
  if (PyObject_SetItem(args[0], args[1], args[2]) < 0) return nullptr;
  return Py_NewRef(args[0]);
}

PyMethodDef setitem_inplace_def = {"setitem_",
                                   reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(setitem_inplace_impl)),
                                   METH_FASTCALL, "base, after base[index] = value."};

PyMethodDef setitem_def = {"setitem", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(setitem_impl)),
                           METH_FASTCALL, "A copy of base with base[index] = value."};

// A copy of `base` with src written where base.as_strided(size, stride, offset) reads (offset
// counted from base's first element): an in-place update through a view of base, functional.
// base is dense, so its clone has its strides.
PyObject* view_scatter_impl(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5) {
    PyErr_SetString(PyExc_TypeError, "view_scatter(base, src, size, stride, offset)");
    return nullptr;
  }
  PyObject* copy = PyObject_CallMethod(args[0], "clone", nullptr);
  if (!copy) return nullptr;
  PyObject* start = PyObject_CallMethod(copy, "storage_offset", nullptr);
  PyObject* at = start ? PyNumber_Add(start, args[4]) : nullptr;
  PyObject* view = at ? PyObject_CallMethod(copy, "as_strided", "OOO", args[2], args[3], at) : nullptr;
  PyObject* done = view ? PyObject_CallMethod(view, "copy_", "O", args[1]) : nullptr;
  Py_XDECREF(start);
  Py_XDECREF(at);
  Py_XDECREF(view);
  if (!done) {
    Py_DECREF(copy);
    return nullptr;
  }
  Py_DECREF(done);
  return copy;
}

PyMethodDef view_scatter_def = {"view_scatter", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(view_scatter_impl)),
                                METH_FASTCALL, "A copy of base with src written through base.as_strided(size, stride, offset)."};

// base.as_strided(size, stride, offset), offset counted from base's first element; keywords
// only (an output spec's Construct calls it).
PyObject* view_of_impl(PyObject*, PyObject* args, PyObject* kwargs) {
  PyObject *base = nullptr, *size = nullptr, *stride = nullptr, *offset = nullptr;
  static const char* names[] = {"base", "size", "stride", "offset", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO:view_of", const_cast<char**>(names), &base, &size, &stride, &offset))
    return nullptr;
  PyObject* start = PyObject_CallMethod(base, "storage_offset", nullptr);
  PyObject* at = start ? PyNumber_Add(start, offset) : nullptr;
  PyObject* view = at ? PyObject_CallMethod(base, "as_strided", "OOO", size, stride, at) : nullptr;
  Py_XDECREF(start);
  Py_XDECREF(at);
  return view;
}

PyMethodDef view_of_def = {"view_of", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(view_of_impl)),
                           METH_VARARGS | METH_KEYWORDS, "base.as_strided(size, stride, offset from base's first element)."};

}  // namespace

PyObject* functional_setitem() {
  static PyObject* f = PyCFunction_New(&setitem_def, nullptr);
  return f;
}

PyObject* view_scatter() {
  static PyObject* f = PyCFunction_New(&view_scatter_def, nullptr);
  return f;
}

PyObject* view_of() {
  static PyObject* f = PyCFunction_New(&view_of_def, nullptr);
  return f;
}

PyObject* inplace_setitem() {
  static PyObject* f = PyCFunction_New(&setitem_inplace_def, nullptr);
  return f;
}

PyObject* tensor_slot(int i) {
  return PyCapsule_New(reinterpret_cast<void*>(static_cast<intptr_t>(i) + 1), kSlot, nullptr);
}

PyObject* sym_slot(int i) {
  return PyCapsule_New(reinterpret_cast<void*>(static_cast<intptr_t>(i) + 1), kSymSlot, nullptr);
}

PyObject* substitute(PyObject* tmpl, PyObject* const* tensors, const int64_t* syms) {
  if (PyCapsule_CheckExact(tmpl) && PyCapsule_IsValid(tmpl, kSlot)) {
    auto i = reinterpret_cast<intptr_t>(PyCapsule_GetPointer(tmpl, kSlot)) - 1;
    return Py_NewRef(tensors[i]);
  }
  if (PyCapsule_CheckExact(tmpl) && PyCapsule_IsValid(tmpl, kSymSlot)) {
    auto i = reinterpret_cast<intptr_t>(PyCapsule_GetPointer(tmpl, kSymSlot)) - 1;
    if (!syms) {
      PyErr_SetString(PyExc_RuntimeError, "kiln: a torch call's symbolic int without this call's sizes");
      return nullptr;
    }
    return PyLong_FromLongLong(syms[i]);
  }
  if (PySlice_Check(tmpl)) {  // x[a:b] with symbolic bounds: a slice rebuilt per call
    auto* sl = reinterpret_cast<PySliceObject*>(tmpl);
    PyObject* start = substitute(sl->start, tensors, syms);
    PyObject* stop = start ? substitute(sl->stop, tensors, syms) : nullptr;
    PyObject* step = stop ? substitute(sl->step, tensors, syms) : nullptr;
    PyObject* out = step ? PySlice_New(start, stop, step) : nullptr;
    Py_XDECREF(start);
    Py_XDECREF(stop);
    Py_XDECREF(step);
    return out;
  }
  if (PyTuple_CheckExact(tmpl) || PyList_CheckExact(tmpl)) {
    bool tuple = PyTuple_CheckExact(tmpl);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(tmpl);
    PyObject* out = tuple ? PyTuple_New(n) : PyList_New(n);
    for (Py_ssize_t k = 0; k < n; ++k) {
      PyObject* item = substitute(PySequence_Fast_GET_ITEM(tmpl, k), tensors, syms);
      if (!item) {
        Py_DECREF(out);
        return nullptr;
      }
      if (tuple) PyTuple_SET_ITEM(out, k, item);
      else PyList_SET_ITEM(out, k, item);
    }
    return out;
  }
  if (PyDict_CheckExact(tmpl)) {
    PyObject* out = PyDict_New();
    PyObject *k, *v;
    Py_ssize_t pos = 0;
    while (PyDict_Next(tmpl, &pos, &k, &v)) {
      PyObject* item = substitute(v, tensors, syms);
      if (!item) {
        Py_DECREF(out);
        return nullptr;
      }
      PyDict_SetItem(out, k, item);
      Py_DECREF(item);
    }
    return out;
  }
  return Py_NewRef(tmpl);
}

}  // namespace kiln::bind
