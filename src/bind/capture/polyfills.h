// Python models of C library functions (kiln/_polyfills.py: itertools, functools.reduce,
// operator, sum/sorted with keywords) that capture inlines where it meets the original with
// tensor arguments, as TorchDynamo's polyfills: found by the original's identity.
#pragma once
#include <Python.h>

namespace kiln::bind {

// Registers `model` (a Python function) as what capture inlines for calls to `original`.
void register_polyfill(PyObject* original, PyObject* model);

// The model registered for `f`, or nullptr (borrowed).
PyObject* polyfill_of(PyObject* f);

}  // namespace kiln::bind
