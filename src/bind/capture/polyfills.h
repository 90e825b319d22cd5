// Python models of C library functions (kiln/_polyfills.py: itertools, functools.reduce,
// operator, sum/sorted/min/max with keywords, dict.fromkeys) that capture inlines where it meets
// the original, as TorchDynamo's polyfills: found by the original's identity.
#pragma once
#include <Python.h>

namespace kiln::bind {

// Registers `model` (a Python function) as what capture inlines for calls to `original`: where
// they have tensor arguments, or (`always`) every call, for a function whose result must be a
// container capture tracks (dict.fromkeys: its values are assigned tensors afterwards).
void register_polyfill(PyObject* original, PyObject* model, bool always);

// The model registered for `f` that applies to a call with (or without) tensor arguments, or
// nullptr (borrowed). A C method bound to a type (dict.fromkeys is a new object at every
// attribute read) is the same original when its C function and its type are.
PyObject* polyfill_of(PyObject* f, bool tensor_arguments);

}  // namespace kiln::bind
