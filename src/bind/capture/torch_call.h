// Calls of torch operators kiln has no registry entry for, kept inside the graph as
// `torch_call` extern nodes (core/ops/torch_call_op.cpp). Capture records the callable and its
// arguments with the tensors taken out; the executor puts the run's tensors back and calls it.
#pragma once
#include <Python.h>

namespace kiln::bind {

struct TorchCall {
  PyObject* fn;      // the torch callable (owned)
  PyObject* args;    // tuple template (owned): tensor slots are tensor_slot(i) markers
  PyObject* kwargs;  // dict template or nullptr (owned)
  int output;        // -1: the result is the tensor; k: the result is a tuple, take item k
};

// Registers a call for the life of the process; its id goes into the node's `fn` attribute.
int register_torch_call(PyObject* fn, PyObject* args, PyObject* kwargs, int output);
const TorchCall& torch_call(int id);

// The same call as `id` (its argument templates, its result) through `inplace_fn`, the
// operator's in-place form (Tensor.index_copy_ for Tensor.index_copy): what the executor runs
// when the graph lets an input be updated where it lies (core/passes: reinplace_input_updates).
int register_inplace_variant(int id, PyObject* inplace_fn);

// setitem(base, index, value) -> a copy of base with base[index] = value: indexed assignment
// into a tensor, as a function the graph can call (borrowed; lives for the process).
PyObject* functional_setitem();
// setitem_(base, index, value) -> base, after base[index] = value: functional_setitem's
// in-place form (borrowed; lives for the process).
PyObject* inplace_setitem();
// view_scatter(base, src, size, stride, offset) -> a copy of base with src written through
// base.as_strided(size, stride, offset from base's first element): an in-place update through a
// view of a dense tensor, as a function the graph can call (borrowed; lives for the process).
PyObject* view_scatter();
// view_of(base=, size=, stride=, offset=) -> base.as_strided(size, stride, offset from base's
// first element): a view of the caller's tensor handed out after the graph updated it
// (borrowed; lives for the process).
PyObject* view_of();

// The marker standing for the i-th tensor input in a template (new reference).
PyObject* tensor_slot(int i);

// A symbolic int's marker (a torch_call node's `sym_args`: the i-th expression), evaluated per
// call: setitem's key at a position that is a size or a Python int of the entry's symbols
// (new reference).
PyObject* sym_slot(int i);

// `tmpl` with every marker replaced by tensors[i] or syms[i] (new reference; nullptr with an
// error for a symbolic int without `syms`); tuples, lists, dicts and slices are rebuilt,
// anything else is shared.
PyObject* substitute(PyObject* tmpl, PyObject* const* tensors, const int64_t* syms = nullptr);

}  // namespace kiln::bind
