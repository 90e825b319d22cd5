// Mode setters: the callables kiln hands a resume function in place of the __exit__ of a
// `with torch.no_grad()` / `torch.autocast(...)` block that a graph break fell inside.
//
// Calling one with any arguments (the resumed code calls it as __exit__(None, None, None), or
// with an exception) sets grad mode and autocast as its ModeChange says and returns False (an
// exception goes on). There is one setter per distinct ModeChange, made once and kept, so a
// resume function's guard on the object it is handed holds call after call.
#pragma once
#include <Python.h>

#include "bind/capture/variables.h"

namespace kiln::bind {

// The setter of `m` (borrowed; it lives as long as the process).
PyObject* mode_setter(const ModeChange& m);
// Whether `f` is a setter, and its modes.
bool mode_setter_modes(PyObject* f, ModeChange& out);
// Sets the modes `m` names for real (the rest stay as they are).
void apply_modes(const ModeChange& m);

}  // namespace kiln::bind
